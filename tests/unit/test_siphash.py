"""SipHash-2-4 and the FIFO message-group -> queue rule of the Java RocketMQ 5 client."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ha_controller.client.siphash import (
    MESSAGE_GROUP_KEY,
    message_group_hash,
    queue_for_message_group,
    siphash24,
    to_signed64,
)

KEY = bytes(range(16))

# vectors_sip64 from the SipHash reference implementation, veorq/SipHash `vectors.h`
# (commit 1a7d041abc95055170c996d9af80887d4046aa5a), i.e. the paper's appendix test values:
# key = 00 01 .. 0f, message i = bytes 00 01 .. (i-1), output written as 8 little-endian bytes.
VECTORS_SIP64 = [
    "310e0edd47db6f72",
    "fd67dc93c539f874",
    "5a4fa9d909806c0d",
    "2d7efbd796666785",  # 0..3
    "b7877127e09427cf",
    "8da699cd64557618",
    "cee3fe586e46c9cb",
    "37d1018bf50002ab",  # 4..7
    "6224939a79f5f593",
    "b0e4a90bdf82009e",
    "f3b9dd94c5bb5d7a",
    "a7ad6b22462fb3f4",  # 8..11
    "fbe50e86bc8f1e75",
    "903d84c02756ea14",
    "eef27a8e90ca23f7",
    "e545be4961ca29a1",  # 12..15
    "db9bc2577fcc2a3f",
    "9447be2cf5e99a69",
    "9cd38d96f0b3c14b",
    "bd6179a71dc96dbb",  # 16..19
    "98eea21af25cd6be",
    "c7673b2eb0cbf2d0",
    "883ea3e395675393",
    "c8ce5ccd8c030ca8",  # 20..23
    "94af49f6c650adb8",
    "eab8858ade92e1bc",
    "f315bb5bb835d817",
    "adcf6b0763612e2f",  # 24..27
    "a5c91da7acaa4dde",
    "716595876650a2a6",
    "28ef495c53a387ad",
    "42c341d8fa92d832",  # 28..31
    "ce7cf2722f512771",
    "e37859f94623f3a7",
    "381205bb1ab0e012",
    "ae97a10fd434e015",  # 32..35
    "b4a31508beff4d31",
    "81396229f0907902",
    "4d0cf49ee5d4dcca",
    "5c73336a76d8bf9a",  # 36..39
    "d0a704536ba93e0e",
    "925958fcd6420cad",
    "a915c29bc8067318",
    "952b79f3bc0aa6d4",  # 40..43
    "f21df2e41d4535f9",
    "87577519048f53a9",
    "10a56cf5dfcd9adb",
    "eb75095ccd986cd0",  # 44..47
    "51a9cb9ecba312e6",
    "96afadfc2ce666c7",
    "72fe52975a4364ee",
    "5a1645b276d592a1",  # 48..51
    "b274cb8ebf87870a",
    "6f9bb4203de7b381",
    "eaecb2a30b22a87f",
    "9924a43cc1315724",  # 52..55
    "bd838d3aafbf8db7",
    "0b1a2a3265d51aea",
    "135079a3231ce660",
    "932b2846e4d70666",  # 56..59
    "e1915f5cb1eca46c",
    "f325965ca16d629f",
    "575ff28e60381be5",
    "724506eb4c328a95",  # 60..63
]


def _vector(i: int) -> int:
    return int.from_bytes(bytes.fromhex(VECTORS_SIP64[i]), "little")


def test_there_are_64_vectors() -> None:
    assert len(VECTORS_SIP64) == 64
    assert MESSAGE_GROUP_KEY == KEY


@pytest.mark.parametrize("i", range(64))
def test_reference_vectors(i: int) -> None:
    assert siphash24(KEY, bytes(range(i))) == _vector(i)


def test_paper_worked_example() -> None:
    # "SipHash: a fast short-input PRF", Appendix A: 15-byte message 00..0e.
    assert siphash24(KEY, bytes(range(15))) == 0xA129CA6149BE45E5


# Guava SipHashFunctionTest.testKnownValues (google/guava,
# guava-tests/test/com/google/common/hash/SipHashFunctionTest.java): the values of
# Hashing.sipHash24().hashString(input, UTF_8).asLong(), i.e. exactly what the Java client hashes.
@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0x726FDB47DD0E0E31),
        (b"a", 0x2BA3E8E9A71148CA),
        (bytes(1_000_000), 0x28205108397AA742),
        (b"12345678", 0x02130609CAEA37EB),
        (b"abcdef", 0x2A6E77E733C7C05D),
        (b"SipHash", 0x8325093242A96F60),
    ],
    ids=["empty", "a", "1M-zeros", "12345678", "abcdef", "SipHash"],
)
def test_guava_known_values(data: bytes, expected: int) -> None:
    assert siphash24(KEY, data) == expected
    if len(data) < 100:
        assert message_group_hash(data.decode()) == to_signed64(expected)


def test_sign_extension_pitfall() -> None:
    # Guava testCollisionsDueToIncorrectSignExtension: high-bit bytes must not collide.
    prefix = bytes(range(8))
    hashes = {siphash24(KEY, prefix + bytes([b])) for b in (0x80, 0x81, 0xFF)}
    assert len(hashes) == 3


def test_key_must_be_16_bytes() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        siphash24(bytes(15), b"")


def test_other_keys_change_the_result() -> None:
    assert siphash24(bytes(16), b"") != siphash24(KEY, b"")


def test_to_signed64() -> None:
    assert to_signed64(0) == 0
    assert to_signed64(0x7FFFFFFFFFFFFFFF) == 2**63 - 1
    assert to_signed64(0x8000000000000000) == -(2**63)
    assert to_signed64(0xFFFFFFFFFFFFFFFF) == -1


# group -> (queue for n = 1, 3, 8, 16), derived by hand from the vectors above, not from the
# code under test: signed = u - 2**64 when bit 63 is set; n = 8 and 16 are the low 3 / 4 bits of
# u (2**64 is a multiple of both); for n = 3, 2**64 = 1 (mod 3), so a negative hash gives
# (u - 1) mod 3.  Groups made of code points < 0x80 have UTF-8 bytes equal to the vector input.
GROUP_TABLE = [
    ("", 0x726FDB47DD0E0E31, (0, 0, 1, 1)),
    ("\x00", 0x74F839C593DC67FD, (0, 0, 5, 13)),
    ("\x00\x01", 0x0D6C8009D9A94F5A, (0, 0, 2, 10)),
    ("\x00\x01\x02", 0x85676696D7FB7E2D, (0, 2, 5, 13)),  # negative long
    ("".join(map(chr, range(7))), 0xAB0200F58B01D137, (0, 2, 7, 7)),  # negative long
    ("".join(map(chr, range(8))), 0x93F5F5799A932462, (0, 1, 2, 2)),  # negative long
    ("".join(map(chr, range(15))), 0xA129CA6149BE45E5, (0, 2, 5, 5)),  # negative long
    ("12345678", 0x02130609CAEA37EB, (0, 0, 3, 11)),
    ("abcdef", 0x2A6E77E733C7C05D, (0, 2, 5, 13)),
    ("SipHash", 0x8325093242A96F60, (0, 2, 0, 0)),  # negative long
]


@pytest.mark.parametrize(("group", "unsigned", "expected"), GROUP_TABLE)
def test_message_group_queue_table(group: str, unsigned: int, expected: tuple[int, ...]) -> None:
    assert siphash24(KEY, group.encode()) == unsigned
    got = tuple(queue_for_message_group(group, n) for n in (1, 3, 8, 16))
    assert got == expected


def test_signed_modulus_differs_from_unsigned() -> None:
    # "\x00\x01\x02" hashes to a negative long: Java's LongMath.mod gives 2 for n = 3, while
    # the unsigned value mod 3 is 0.  A client that skipped the sign would pick another queue.
    u = 0x85676696D7FB7E2D
    assert u % 3 == 0
    assert queue_for_message_group("\x00\x01\x02", 3) == 2


def test_group_is_hashed_as_utf8() -> None:
    group = "订单-42"
    assert message_group_hash(group) == to_signed64(siphash24(KEY, group.encode("utf-8")))


@given(st.text(max_size=80), st.integers(min_value=1, max_value=1024))
def test_queue_is_signed_hash_floor_mod_n(group: str, n: int) -> None:
    signed = to_signed64(siphash24(KEY, group.encode("utf-8")))
    q = queue_for_message_group(group, n)
    assert q == signed % n
    assert 0 <= q < n


@pytest.mark.parametrize("n", [0, -3])
def test_queue_count_must_be_positive(n: int) -> None:
    with pytest.raises(ValueError, match="queue_count"):
        queue_for_message_group("g", n)
