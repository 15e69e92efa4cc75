"""SipHash-2-4 in pure Python and the FIFO message-group -> queue rule.

The official Java RocketMQ 5 client picks the queue of a FIFO message with
``LongMath.mod(Hashing.sipHash24().hashBytes(group.getBytes(UTF_8)).asLong(), n)``
(``PublishingLoadBalancer.java``).  Guava's ``sipHash24()`` is SipHash-2-4
keyed with the 16 bytes ``00 01 .. 0f`` (k0 = 0x0706050403020100,
k1 = 0x0f0e0d0c0b0a0908); ``asLong()`` is the standard 64-bit output read as a
signed Java long, and ``LongMath.mod`` is a floor modulus (never negative).
:func:`queue_for_message_group` reproduces that exactly, so a group maps to
the same queue whichever of our client or the Java/Go clients sends it.

This runs once per FIFO send, so the round function is inlined and the state
for the fixed key is precomputed.
"""

from __future__ import annotations

import struct

__all__ = [
    "MESSAGE_GROUP_KEY",
    "message_group_hash",
    "queue_for_message_group",
    "siphash24",
    "to_signed64",
]

_MASK64 = 0xFFFFFFFFFFFFFFFF
_SIGN64 = 0x8000000000000000
_KEY = struct.Struct("<QQ")
_WORD = struct.Struct("<Q")

# "somepseudorandomlygeneratedbytes", the SipHash initialisation constants.
_C0 = 0x736F6D6570736575
_C1 = 0x646F72616E646F6D
_C2 = 0x6C7967656E657261
_C3 = 0x7465646279746573

MESSAGE_GROUP_KEY = bytes(range(16))
"""The key of Guava's ``Hashing.sipHash24()``: bytes 00..0f."""


def _initial_state(key: bytes) -> tuple[int, int, int, int]:
    if len(key) != 16:
        raise ValueError(f"SipHash key must be 16 bytes, got {len(key)}")
    k0, k1 = _KEY.unpack(key)
    return k0 ^ _C0, k1 ^ _C1, k0 ^ _C2, k1 ^ _C3


def _siphash24(state: tuple[int, int, int, int], data: bytes) -> int:
    v0, v1, v2, v3 = state
    m = _MASK64
    size = len(data)
    end = size & ~7
    for (w,) in _WORD.iter_unpack(data[:end]):
        v3 ^= w
        for _ in range(2):  # c = 2 compression rounds
            v0 = (v0 + v1) & m
            v1 = ((v1 << 13) & m) | (v1 >> 51)
            v1 ^= v0
            v0 = ((v0 << 32) & m) | (v0 >> 32)
            v2 = (v2 + v3) & m
            v3 = ((v3 << 16) & m) | (v3 >> 48)
            v3 ^= v2
            v0 = (v0 + v3) & m
            v3 = ((v3 << 21) & m) | (v3 >> 43)
            v3 ^= v0
            v2 = (v2 + v1) & m
            v1 = ((v1 << 17) & m) | (v1 >> 47)
            v1 ^= v2
            v2 = ((v2 << 32) & m) | (v2 >> 32)
        v0 ^= w
    # Last block: the remaining 0..7 bytes, little-endian, length mod 256 on top.
    w = ((size & 0xFF) << 56) | int.from_bytes(data[end:], "little")
    v3 ^= w
    # Pass 1 compresses the last block like the others (c = 2 rounds, then v0 ^= w);
    # pass 2 is the finalization: v2 ^= 0xff, d = 4 rounds (w is 0 by then).
    for rounds, before in ((2, 0), (4, 0xFF)):
        v2 ^= before
        for _ in range(rounds):
            v0 = (v0 + v1) & m
            v1 = ((v1 << 13) & m) | (v1 >> 51)
            v1 ^= v0
            v0 = ((v0 << 32) & m) | (v0 >> 32)
            v2 = (v2 + v3) & m
            v3 = ((v3 << 16) & m) | (v3 >> 48)
            v3 ^= v2
            v0 = (v0 + v3) & m
            v3 = ((v3 << 21) & m) | (v3 >> 43)
            v3 ^= v0
            v2 = (v2 + v1) & m
            v1 = ((v1 << 17) & m) | (v1 >> 47)
            v1 ^= v2
            v2 = ((v2 << 32) & m) | (v2 >> 32)
        v0 ^= w
        w = 0
    return v0 ^ v1 ^ v2 ^ v3


_GROUP_STATE = _initial_state(MESSAGE_GROUP_KEY)


def siphash24(key: bytes, data: bytes) -> int:
    """SipHash-2-4 of ``data`` under the 16-byte ``key``, as an unsigned 64-bit int.

    The reference implementation writes this value as 8 little-endian bytes.
    """
    return _siphash24(_initial_state(key), data)


def to_signed64(value: int) -> int:
    """Read an unsigned 64-bit value as a two's-complement int64 (Java ``long``)."""
    return value - (1 << 64) if value & _SIGN64 else value


def message_group_hash(group: str) -> int:
    """Java's ``Hashing.sipHash24().hashBytes(group UTF-8).asLong()`` (signed)."""
    return to_signed64(_siphash24(_GROUP_STATE, group.encode("utf-8")))


def queue_for_message_group(group: str, queue_count: int) -> int:
    """Index (0 <= i < queue_count) of the queue that carries ``group``'s messages."""
    if queue_count < 1:
        raise ValueError(f"queue_count must be >= 1, got {queue_count}")
    # Python's % on ints is a floor modulus, like Guava's LongMath.mod.
    return message_group_hash(group) % queue_count
