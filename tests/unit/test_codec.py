"""The sans-IO codec fed raw bytes: frames split anywhere, garbage rejected with typed errors."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ha_controller.protocol import envelope
from ha_controller.protocol.errors import (
    BadEnvelope,
    BadToken,
    FrameTooLarge,
    NotMaster,
    ProtocolError,
    RemoteError,
    error_table,
    from_wire,
)
from ha_controller.protocol.framing import TOKEN, FrameDecoder, encode_frame


def decode_all(data: bytes, cuts: list[int]) -> list[envelope.Request | envelope.Response]:
    dec = FrameDecoder()
    out: list[envelope.Request | envelope.Response] = []
    prev = 0
    for cut in [*sorted(cuts), len(data)]:
        for frame in dec.feed(data[prev:cut]):
            out.append(envelope.decode(frame.serial_no, frame.payload))
        prev = cut
    assert dec.buffered == 0
    return out


def test_frame_layout_is_tubemq() -> None:
    data = encode_frame(7, b"abc")
    assert data[:4] == b"\xff\x7f\xf4\xfe"
    assert struct.unpack(">III", data[:12]) == (TOKEN, 7, 1)
    assert struct.unpack(">I", data[12:16]) == (3,)
    assert data[16:] == b"abc"


def test_blocks_are_at_most_8192_bytes() -> None:
    payload = bytes(range(256)) * 100  # 25600 bytes -> 4 blocks
    data = encode_frame(1, payload)
    assert struct.unpack(">I", data[8:12])[0] == 4
    pos, sizes = 12, []
    for _ in range(4):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        sizes.append(n)
        pos += 4 + n
    assert sizes == [8192, 8192, 8192, 1024]
    assert FrameDecoder().feed(data)[0].payload == payload


def test_decoder_accepts_blocks_larger_than_8192() -> None:
    payload = b"x" * 20000
    frame = encode_frame(3, payload, max_block_bytes=65536)
    assert FrameDecoder().feed(frame)[0].payload == payload


@settings(max_examples=200, deadline=None)
@given(
    body=st.binary(max_size=20000),
    method=st.integers(min_value=0, max_value=2**31 - 1),
    serial=st.integers(min_value=0, max_value=2**32 - 1),
    cuts=st.lists(st.integers(min_value=0, max_value=40000), max_size=12),
)
def test_any_split_decodes_to_the_same_messages(
    body: bytes, method: int, serial: int, cuts: list[int]
) -> None:
    data = envelope.encode_request(
        serial, method, body, timeout_ms=1234
    ) + envelope.encode_response(serial ^ 1, method, body[::-1])
    cuts = [c % (len(data) + 1) for c in cuts]
    msgs = decode_all(data, cuts)
    assert msgs == [
        envelope.Request(serial, method, body, 1234, False),
        envelope.Response(serial ^ 1, envelope.STATUS_SUCCESS, method, body[::-1]),
    ]


def test_every_single_byte_split() -> None:
    data = envelope.encode_request(9, 105, b"q" * 9000, oneway=True)
    for cut in range(len(data) + 1):
        (msg,) = decode_all(data, [cut])
        assert msg == envelope.Request(9, 105, b"q" * 9000, 0, True)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=4096))
def test_random_bytes_only_raise_typed_errors(data: bytes) -> None:
    dec = FrameDecoder(max_frame_bytes=1 << 20)
    try:
        for frame in dec.feed(data):
            envelope.decode(frame.serial_no, frame.payload)
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_random_payload_in_a_valid_frame_raises_bad_envelope_or_decodes(payload: bytes) -> None:
    (frame,) = FrameDecoder().feed(encode_frame(1, payload))
    try:
        envelope.decode(frame.serial_no, frame.payload)
    except BadEnvelope:
        pass


def test_bad_token_is_rejected_at_once() -> None:
    with pytest.raises(BadToken):
        FrameDecoder().feed(b"GET / HTTP/1.1\r\n")
    dec = FrameDecoder()
    with pytest.raises(BadToken):
        dec.feed(b"\x00\x00\x00\x01")
    with pytest.raises(BadToken):  # poisoned afterwards
        dec.feed(encode_frame(1, b"ok"))


def test_limits_are_enforced() -> None:
    with pytest.raises(FrameTooLarge):
        FrameDecoder(max_list_size=4).feed(struct.pack(">III", TOKEN, 1, 5))
    huge = struct.pack(">III", TOKEN, 1, 1) + struct.pack(">I", 2**31)
    with pytest.raises(FrameTooLarge):
        FrameDecoder(max_frame_bytes=1 << 20).feed(huge)


def test_truncated_envelope_is_bad_envelope() -> None:
    data = envelope.encode_request(1, 105, b"hello")
    (frame,) = FrameDecoder().feed(data)
    with pytest.raises(BadEnvelope):
        envelope.decode(1, frame.payload[:-2])
    with pytest.raises(BadEnvelope):
        envelope.decode(1, frame.payload + b"\x00")


def test_errors_round_trip_by_code() -> None:
    data = envelope.encode_error(5, NotMaster("broker-a:1 is a slave"))
    (frame,) = FrameDecoder().feed(data)
    resp = envelope.decode(5, frame.payload)
    assert isinstance(resp, envelope.Response)
    err = resp.error()
    assert isinstance(err, NotMaster)
    assert err.retriable
    assert str(err) == "broker-a:1 is a slave"
    assert isinstance(from_wire("java.io.IOException", "boom"), RemoteError)


def test_error_codes_are_unique() -> None:
    table = error_table()
    assert table[NotMaster.code] is NotMaster
    assert len({cls.code for cls in table.values()}) == len(table)
