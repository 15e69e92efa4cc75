"""The commit-log record codec, fed raw bytes."""

from __future__ import annotations

import struct
import zlib
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ha_controller.protocol.errors import CorruptRecord
from ha_controller.protocol.record import (
    BLANK,
    BLANK_MIN_SIZE,
    HEADER_SIZE,
    MESSAGE_MAGIC,
    MIN_RECORD_SIZE,
    DispatchHead,
    StoredMessage,
    decode_dispatch,
    decode_header,
    decode_properties,
    decode_record,
    encode_blank,
    encode_properties,
    encode_record,
    encoded_size,
    iter_records,
    make_msg_id,
    parse_msg_id,
    tag_hash,
)

_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]),
    max_size=30,
)
_u32 = st.integers(0, 2**32 - 1)
_u64 = st.integers(0, 2**64 - 1)

messages = st.builds(
    StoredMessage,
    topic=_text,
    queue_id=_u32,
    body=st.binary(max_size=300),
    properties=st.dictionaries(_text, _text, max_size=5),
    flags=_u32,
    born_ts_ms=_u64,
    born_host=_text,
    store_host=_text,
    queue_offset=_u64,
    physical_offset=_u64,
    store_ts_ms=_u64,
)


def flipped(msg: StoredMessage, data: st.DataObject) -> bytes:
    """``msg`` encoded, with one byte changed at a drawn position."""
    raw = bytearray(encode_record(msg))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    return bytes(raw)


def sample(**kw: object) -> StoredMessage:
    base: dict[str, Any] = {
        "topic": "TopicA",
        "queue_id": 3,
        "body": b"hello world",
        "properties": {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "ABCDEF"},
        "flags": 7,
        "born_ts_ms": 1_700_000_000_000,
        "born_host": "10.0.0.1:5000",
        "store_host": "10.0.0.2:10911",
        "queue_offset": 42,
        "physical_offset": 4096,
        "store_ts_ms": 1_700_000_000_123,
    }
    base.update(kw)
    return StoredMessage(**base)


@given(messages)
def test_round_trip(msg: StoredMessage) -> None:
    data = encode_record(msg)
    assert len(data) == encoded_size(msg)
    decoded, size = decode_record(data)
    assert size == len(data)
    assert decoded == msg


@given(messages, st.binary(max_size=20), st.binary(max_size=20))
def test_round_trip_inside_a_larger_buffer(msg: StoredMessage, pre: bytes, post: bytes) -> None:
    data = encode_record(msg)
    decoded, size = decode_record(memoryview(pre + data + post), len(pre))
    assert decoded == msg and size == len(data)
    head = decode_header(pre + data + post, len(pre))
    assert (head.size, head.blank, head.queue_offset, head.physical_offset) == (
        len(data),
        False,
        msg.queue_offset,
        msg.physical_offset,
    )


_with_tags = st.builds(
    lambda msg, tags, before: replace(
        msg,
        properties=(
            {**msg.properties, "TAGS": tags}
            if before
            else {"TAGS": tags, **{k: v for k, v in msg.properties.items() if k != "TAGS"}}
        ),
    ),
    messages,
    _text,
    st.booleans(),
)


@given(st.one_of(messages, _with_tags), st.binary(max_size=20), st.binary(max_size=20))
def test_dispatch_head_agrees_with_the_full_decode(
    msg: StoredMessage, pre: bytes, post: bytes
) -> None:
    data = encode_record(msg)
    head, size = decode_dispatch(memoryview(pre + data + post), len(pre))
    assert size == len(data)
    assert head == DispatchHead(
        msg.topic, msg.queue_id, msg.queue_offset, msg.physical_offset, msg.store_ts_ms, msg.tags
    )


@pytest.mark.parametrize(
    ("properties", "tags"),
    [
        ({}, None),
        ({"XTAGS": "no"}, None),
        ({"XTAGS": "no", "TAGS": "yes"}, "yes"),
        ({"TAGS": "yes", "XTAGS": "no"}, "yes"),
        ({"KEYS": "TAGS", "TAGS": "t1||t2"}, "t1||t2"),
        ({"TAGS": ""}, ""),
        ({"A": "TAGS"}, None),
    ],
)
def test_dispatch_head_finds_the_tags_pair_only(
    properties: dict[str, str], tags: str | None
) -> None:
    head, _ = decode_dispatch(encode_record(sample(properties=properties)))
    assert isinstance(head, DispatchHead) and head.tags == tags
    assert tag_hash(head.tags) == tag_hash(sample(properties=properties).tags)


def test_dispatch_head_detects_every_truncation_and_bad_inner_lengths() -> None:
    data = encode_record(sample())
    for cut in range(len(data)):
        with pytest.raises(CorruptRecord):
            decode_dispatch(data[:cut])
    assert decode_dispatch(encode_blank(100)) == (BLANK, 100)


@given(messages, st.data())
def test_dispatch_head_of_a_corrupt_record_raises_only_corrupt_record(
    msg: StoredMessage, data: st.DataObject
) -> None:
    """It checks no CRC: a flipped byte may decode, but never raises anything else."""
    try:
        decode_dispatch(flipped(msg, data))
    except CorruptRecord:
        pass


def test_layout_is_big_endian_and_crc_covers_after_crc_field() -> None:
    msg = sample()
    data = encode_record(msg)
    total, magic, crc, flags, qid, qoff, phys, born, store = struct.unpack_from(">IIIIIQQQQ", data)
    assert total == len(data)
    assert (flags, qid, qoff, phys, born, store) == (
        7,
        3,
        42,
        4096,
        msg.born_ts_ms,
        msg.store_ts_ms,
    )
    assert crc == zlib.crc32(data[12:])
    # born_host follows the fixed header with a u16 length
    (n,) = struct.unpack_from(">H", data, HEADER_SIZE)
    assert data[HEADER_SIZE + 2 : HEADER_SIZE + 2 + n] == b"10.0.0.1:5000"
    assert data.endswith(struct.pack(">I", len(msg.body)) + msg.body)
    assert magic != 0


def test_every_single_byte_flip_is_detected() -> None:
    data = encode_record(sample())
    for i in range(len(data)):
        for bit in (0x01, 0x80):
            broken = bytearray(data)
            broken[i] ^= bit
            with pytest.raises(CorruptRecord):
                decode_record(bytes(broken))


def test_every_truncation_is_detected() -> None:
    data = encode_record(sample())
    for cut in range(len(data)):
        with pytest.raises(CorruptRecord):
            decode_record(data[:cut])
        with pytest.raises(CorruptRecord):
            decode_record(data, 0, cut)


@given(messages, st.data())
def test_random_corruption_never_decodes_to_something_else(
    msg: StoredMessage, data: st.DataObject
) -> None:
    with pytest.raises(CorruptRecord):
        decode_record(flipped(msg, data))


def test_blank_record() -> None:
    blank = encode_blank(100)
    assert len(blank) == 100
    record, size = decode_record(blank)
    assert record is BLANK and size == 100
    assert decode_header(blank).blank
    with pytest.raises(ValueError, match="blank"):
        encode_blank(BLANK_MIN_SIZE - 1)
    with pytest.raises(CorruptRecord):
        decode_record(blank[:50])


def test_zero_length_and_bad_magic() -> None:
    with pytest.raises(CorruptRecord, match="zero"):
        decode_record(bytes(200))
    with pytest.raises(CorruptRecord, match="magic"):
        decode_record(struct.pack(">II", 100, 0x12345678) + bytes(92))
    with pytest.raises(CorruptRecord, match="minimum"):
        decode_record(struct.pack(">II", 20, MESSAGE_MAGIC) + bytes(12))


def test_inner_length_mismatch_with_valid_crc_is_corrupt() -> None:
    data = bytearray(encode_record(sample(body=b"abc")))
    # grow the topic length by one and fix up the CRC: lengths no longer add up
    pos = HEADER_SIZE + 2 + len(b"10.0.0.1:5000") + 2 + len(b"10.0.0.2:10911")
    struct.pack_into(">H", data, pos, len("TopicA") + 1)
    struct.pack_into(">I", data, 8, zlib.crc32(bytes(data[12:])))
    with pytest.raises(CorruptRecord):
        decode_record(bytes(data))


def test_iter_records_stops_at_zero_tail_and_reports_corruption() -> None:
    a = encode_record(sample(physical_offset=0))
    b = encode_record(sample(physical_offset=len(a), body=b"second"))
    buf = a + b + encode_blank(64) + bytes(100)
    got = list(iter_records(buf))
    assert [pos for pos, _, _ in got] == [0, len(a), len(a) + len(b)]
    assert got[2][1] is BLANK
    with pytest.raises(CorruptRecord):
        list(iter_records(a + b[:-1]))


def test_properties_format() -> None:
    props = {"TAGS": "a", "KEYS": "k1 k2"}
    text = encode_properties(props)
    assert text == "TAGS\x01a\x02KEYS\x01k1 k2\x02"
    assert decode_properties(text) == props
    assert decode_properties("TAGS\x01a") == {"TAGS": "a"}
    with pytest.raises(ValueError, match="separator"):
        encode_properties({"A\x01": "x"})
    with pytest.raises(ValueError, match="separator"):
        encode_record(sample(properties={"A": "x\x02y"}))


def test_property_helpers() -> None:
    msg = sample()
    assert msg.tags == "TagA"
    assert msg.keys == ["k1", "k2"]
    assert msg.uniq_key == "ABCDEF"
    bare = sample(properties={})
    assert (bare.tags, bare.keys, bare.uniq_key) == (None, [], None)


def test_tag_hash_is_stable() -> None:
    assert tag_hash("TagA") == zlib.crc32(b"TagA")
    assert tag_hash("") == tag_hash(None) == 0
    assert tag_hash("TagA") != tag_hash("TagB")


def test_out_of_range_fields_raise_value_error() -> None:
    with pytest.raises(ValueError, match="range"):
        encode_record(sample(queue_id=2**32))
    with pytest.raises(ValueError, match="topic"):
        encode_record(sample(topic="x" * 70000))


def test_msg_id_round_trip() -> None:
    mid = make_msg_id("127.0.0.1:10911", 123456)
    assert mid == "7F00000100002A9F000000000001E240"
    assert parse_msg_id(mid) == ("127.0.0.1:10911", 123456)
    mid6 = make_msg_id("[::1]:10911", 7)
    assert len(mid6) == 56
    assert parse_msg_id(mid6) == ("[::1]:10911", 7)
    assert parse_msg_id(make_msg_id("broker-a:10911", 9)) == ("0.0.0.0:10911", 9)
    assert sample().msg_id == make_msg_id("10.0.0.2:10911", 4096)
    with pytest.raises(ValueError, match="bytes"):
        parse_msg_id("ABCD")


def test_minimum_record_size() -> None:
    empty = StoredMessage(topic="", queue_id=0, body=b"")
    assert len(encode_record(empty)) == MIN_RECORD_SIZE
