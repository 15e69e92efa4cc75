"""Sans-IO codec for one commit-log record (RocketMQ ``CommitLog`` message format, our layout).

No file or socket I/O here: the broker's store and the PySpark commit-log audit both
parse segments with this module.

Record layout, all integers big-endian::

    offset  size  field
    0       4     total_length     whole record, this field included
    4       4     magic            MESSAGE_MAGIC (or BLANK_MAGIC, see below)
    8       4     crc              CRC-32 (zlib) of bytes [12, total_length)
    12      4     flags
    16      4     queue_id
    20      8     queue_offset     logical offset in (topic, queue_id)
    28      8     physical_offset  commit-log offset of this record
    36      8     born_ts_ms
    44      8     store_ts_ms
    52      2+n   born_host        u16 length + UTF-8
    ..      2+n   store_host       u16 length + UTF-8
    ..      2+n   topic            u16 length + UTF-8
    ..      4+n   properties       u32 length + UTF-8, RocketMQ style (below)
    ..      4+n   body             u32 length + bytes

Properties use RocketMQ's string form: every pair is written as
``name \\x01 value \\x02`` (``"TAGS\\x01a\\x02KEYS\\x01k1 k2\\x02"``); names and values must not
contain ``\\x01`` or ``\\x02``.  An empty map is the empty string.

Blank (end-of-segment) record: ``total_length u32 | BLANK_MAGIC u32`` followed by zero
bytes up to ``total_length``; it fills the rest of a segment when the next record does not
fit.  A writer keeps at least ``BLANK_MIN_SIZE`` bytes free after each message record so
that a blank always fits, so every full segment ends with exactly one blank record.

A ``total_length`` of zero means "no more data" (a zero-filled or pre-allocated tail);
:func:`iter_records` stops there, :func:`decode_record` reports it as corrupt.

Message ids follow RocketMQ's *offset message id*: upper-case hex of
``store ip (4 or 16 bytes) | store port u32 | physical offset u64`` (32 hex digits for
IPv4, 56 for IPv6).  A store host that is not an IP literal is encoded as ``0.0.0.0``.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import mmap
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, NamedTuple, TypeAlias

from ha_controller.protocol.errors import CorruptRecord
from ha_controller.protocol.properties import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY

__all__ = [
    "BLANK",
    "BLANK_MAGIC",
    "BLANK_MIN_SIZE",
    "HEADER_SIZE",
    "MAX_RECORD_SIZE",
    "MESSAGE_MAGIC",
    "MIN_RECORD_SIZE",
    "Blank",
    "BufferLike",
    "DispatchHead",
    "RecordHeader",
    "StoredMessage",
    "decode_dispatch",
    "decode_header",
    "decode_properties",
    "decode_record",
    "encode_blank",
    "encode_blank_header",
    "encode_properties",
    "encode_record",
    "encoded_size",
    "encoded_size_bound",
    "iter_records",
    "make_msg_id",
    "parse_msg_id",
    "tag_hash",
]

MESSAGE_MAGIC: Final = 0x48414331  # "HAC1"
BLANK_MAGIC: Final = 0x48414342  # "HACB"

_PREFIX: Final = struct.Struct(">II")  # total_length, magic
_HEAD: Final = struct.Struct(">IIIIIQQQQ")
_LEAD: Final = struct.Struct(">III")  # total_length, magic, crc
_CRC_HEAD: Final = struct.Struct(">IIQQQQ")  # flags .. store_ts_ms, covered by the CRC
HEADER_SIZE: Final = _HEAD.size  # 52
_CRC_START: Final = 12
_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
MIN_RECORD_SIZE: Final = HEADER_SIZE + 2 + 2 + 2 + 4 + 4
BLANK_MIN_SIZE: Final = _PREFIX.size
MAX_RECORD_SIZE: Final = 0xFFFFFFFF

NAME_VALUE_SEPARATOR: Final = "\x01"
PROPERTY_SEPARATOR: Final = "\x02"

BufferLike: TypeAlias = bytes | bytearray | memoryview | mmap.mmap


class Blank(enum.Enum):
    """Type of the :data:`BLANK` sentinel returned for an end-of-segment record."""

    BLANK = "BLANK"


BLANK: Final = Blank.BLANK


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One message as stored in the commit log."""

    topic: str
    queue_id: int
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    flags: int = 0
    born_ts_ms: int = 0
    born_host: str = ""
    store_host: str = ""
    queue_offset: int = 0
    physical_offset: int = 0
    store_ts_ms: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        """Message keys; RocketMQ separates several keys with spaces."""
        return self.properties.get(PROPERTY_KEYS, "").split()

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def msg_id(self) -> str:
        """Offset message id (store host + physical offset), see :func:`make_msg_id`."""
        return make_msg_id(self.store_host, self.physical_offset)


class RecordHeader(NamedTuple):
    """The fixed part of a record, enough to walk a segment without decoding bodies."""

    size: int
    blank: bool
    queue_id: int
    queue_offset: int
    physical_offset: int
    store_ts_ms: int


# --- properties ----------------------------------------------------------------


def encode_properties(properties: Mapping[str, str]) -> str:
    """RocketMQ's ``messageProperties2String``: ``k\\x01v\\x02`` for every pair."""
    parts: list[str] = []
    for name, value in properties.items():
        for text in (name, value):
            if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
                raise ValueError(f"property {name!r} contains a reserved separator character")
        parts.append(f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}")
    return "".join(parts)


def decode_properties(text: str) -> dict[str, str]:
    """Inverse of :func:`encode_properties`; tolerates a missing final separator."""
    out: dict[str, str] = {}
    for pair in text.split(PROPERTY_SEPARATOR):
        if not pair:
            continue
        name, sep, value = pair.partition(NAME_VALUE_SEPARATOR)
        if not sep:
            raise CorruptRecord(f"property pair without separator: {pair[:40]!r}")
        out[name] = value
    return out


def tag_hash(tags: str | None) -> int:
    """Stable hash of a tag string for consume-queue entries (CRC-32 of UTF-8; 0 for none)."""
    if not tags:
        return 0
    return zlib.crc32(tags.encode("utf-8"))


# --- encode --------------------------------------------------------------------


def _utf8(value: str, what: str, limit: int) -> bytes:
    data = value.encode("utf-8")
    if len(data) > limit:
        raise ValueError(f"{what} is {len(data)} bytes, limit {limit}")
    return data


def _fields(msg: StoredMessage) -> tuple[bytes, bytes, bytes, bytes]:
    return (
        _utf8(msg.born_host, "born_host", 0xFFFF),
        _utf8(msg.store_host, "store_host", 0xFFFF),
        _utf8(msg.topic, "topic", 0xFFFF),
        _utf8(encode_properties(msg.properties), "properties", 0xFFFFFFFF),
    )


def encoded_size(msg: StoredMessage) -> int:
    """Size in bytes of ``encode_record(msg)`` (it does not depend on the offsets)."""
    born, store, topic, props = _fields(msg)
    return MIN_RECORD_SIZE + len(born) + len(store) + len(topic) + len(props) + len(msg.body)


def encoded_size_bound(
    topic: str, body: bytes, properties: Mapping[str, str], born_host: str, store_host: str
) -> int:
    """An upper bound of :func:`encoded_size` counted in characters (UTF-8 takes at most
    four bytes for one), without encoding anything."""
    chars = len(born_host) + len(store_host) + len(topic)
    chars += sum(len(k) + len(v) + 2 for k, v in properties.items())
    return MIN_RECORD_SIZE + len(body) + 4 * chars


def encode_record(msg: StoredMessage) -> bytes:
    """Encode one message record; raises ValueError for out-of-range fields."""
    born, store, topic, props = _fields(msg)
    body = msg.body
    total = MIN_RECORD_SIZE + len(born) + len(store) + len(topic) + len(props) + len(body)
    if total > MAX_RECORD_SIZE:
        raise ValueError(f"record of {total} bytes exceeds {MAX_RECORD_SIZE}")
    try:
        head = _CRC_HEAD.pack(
            msg.flags,
            msg.queue_id,
            msg.queue_offset,
            msg.physical_offset,
            msg.born_ts_ms,
            msg.store_ts_ms,
        )
    except struct.error as exc:
        raise ValueError(f"record header field out of range: {exc}") from exc
    # one join and one CRC pass over everything after the CRC field
    rest = b"".join(
        (
            head,
            _U16.pack(len(born)),
            born,
            _U16.pack(len(store)),
            store,
            _U16.pack(len(topic)),
            topic,
            _U32.pack(len(props)),
            props,
            _U32.pack(len(body)),
            body,
        )
    )
    return _LEAD.pack(total, MESSAGE_MAGIC, zlib.crc32(rest)) + rest


def encode_blank_header(size: int) -> bytes:
    """The 8-byte head of a blank record of ``size`` bytes (the rest is zeros)."""
    if size < BLANK_MIN_SIZE or size > MAX_RECORD_SIZE:
        raise ValueError(f"blank record size {size} out of range")
    return _PREFIX.pack(size, BLANK_MAGIC)


def encode_blank(size: int) -> bytes:
    """A whole blank record of ``size`` bytes."""
    return encode_blank_header(size) + bytes(size - BLANK_MIN_SIZE)


# --- decode --------------------------------------------------------------------


def _limit(view: memoryview, end: int | None) -> int:
    return len(view) if end is None else min(end, len(view))


def _check_prefix(view: memoryview, pos: int, limit: int) -> tuple[int, int]:
    if pos < 0 or pos + _PREFIX.size > limit:
        raise CorruptRecord(f"truncated record head at {pos}")
    total, magic = _PREFIX.unpack_from(view, pos)
    if total == 0:
        raise CorruptRecord(f"zero record length at {pos}")
    if magic == BLANK_MAGIC:
        if total < BLANK_MIN_SIZE:
            raise CorruptRecord(f"blank record of {total} bytes at {pos}")
    elif magic != MESSAGE_MAGIC:
        raise CorruptRecord(f"bad magic 0x{magic:08x} at {pos}")
    elif total < MIN_RECORD_SIZE:
        raise CorruptRecord(f"record length {total} below minimum at {pos}")
    if pos + total > limit:
        raise CorruptRecord(f"truncated record at {pos}: length {total}, {limit - pos} available")
    return total, magic


def _check_crc(view: memoryview, pos: int, total: int) -> None:
    (expected,) = _U32.unpack_from(view, pos + 8)
    actual = zlib.crc32(view[pos + _CRC_START : pos + total])
    if actual != expected:
        raise CorruptRecord(f"CRC mismatch at {pos}: stored 0x{expected:08x}, got 0x{actual:08x}")


def decode_header(
    buf: BufferLike, pos: int = 0, end: int | None = None, *, verify_crc: bool = True
) -> RecordHeader:
    """Validate the record at ``pos`` (length, magic and, by default, CRC) and return its head."""
    with memoryview(buf) as view:
        total, magic = _check_prefix(view, pos, _limit(view, end))
        if magic == BLANK_MAGIC:
            return RecordHeader(total, True, 0, 0, 0, 0)
        if verify_crc:
            _check_crc(view, pos, total)
        _, _, _, _, queue_id, queue_offset, physical, _, store_ts = _HEAD.unpack_from(view, pos)
        return RecordHeader(total, False, queue_id, queue_offset, physical, store_ts)


def _read_str(view: memoryview, pos: int, end: int, width: struct.Struct) -> tuple[str, int]:
    if pos + width.size > end:
        raise CorruptRecord("field length runs past the record end")
    (length,) = width.unpack_from(view, pos)
    pos += width.size
    if pos + length > end:
        raise CorruptRecord("field runs past the record end")
    try:
        return str(view[pos : pos + length], "utf-8"), pos + length
    except UnicodeDecodeError as exc:
        raise CorruptRecord(f"invalid UTF-8 in record field: {exc}") from exc


def decode_record(
    buf: BufferLike, pos: int = 0, end: int | None = None
) -> tuple[StoredMessage | Blank, int]:
    """Decode the record at ``pos``; returns ``(message or BLANK, record size)``.

    Raises :class:`CorruptRecord` for a truncated record, bad magic or length, CRC
    mismatch or inconsistent inner lengths.  ``end`` bounds the readable bytes.
    """
    with memoryview(buf) as view:
        total, magic = _check_prefix(view, pos, _limit(view, end))
        if magic == BLANK_MAGIC:
            return BLANK, total
        _check_crc(view, pos, total)
        (_, _, _, flags, queue_id, queue_offset, physical, born_ts, store_ts) = _HEAD.unpack_from(
            view, pos
        )
        rec_end = pos + total
        p = pos + HEADER_SIZE
        born_host, p = _read_str(view, p, rec_end, _U16)
        store_host, p = _read_str(view, p, rec_end, _U16)
        topic, p = _read_str(view, p, rec_end, _U16)
        props_text, p = _read_str(view, p, rec_end, _U32)
        if p + 4 > rec_end:
            raise CorruptRecord("body length runs past the record end")
        (body_len,) = _U32.unpack_from(view, p)
        p += 4
        if p + body_len != rec_end:
            raise CorruptRecord(f"body length {body_len} disagrees with record length {total}")
        body = bytes(view[p:rec_end])
    msg = StoredMessage(
        topic=topic,
        queue_id=queue_id,
        body=body,
        properties=decode_properties(props_text),
        flags=flags,
        born_ts_ms=born_ts,
        born_host=born_host,
        store_host=store_host,
        queue_offset=queue_offset,
        physical_offset=physical,
        store_ts_ms=store_ts,
    )
    return msg, total


class DispatchHead(NamedTuple):
    """What a consume-queue entry needs of a record (:func:`decode_dispatch`)."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    store_ts_ms: int
    tags: str | None
    #: the KEYS and UNIQ_KEY properties, for the key index (``store.keyindex``)
    keys: str | None = None
    uniq_key: str | None = None


_TAGS_PAIR: Final = (PROPERTY_TAGS + NAME_VALUE_SEPARATOR).encode()
_KEYS_PAIR: Final = (PROPERTY_KEYS + NAME_VALUE_SEPARATOR).encode()
_UNIQ_PAIR: Final = (PROPERTY_UNIQ_KEY + NAME_VALUE_SEPARATOR).encode()
_PAIR_END: Final = PROPERTY_SEPARATOR.encode()


def _prop_in(props: bytes, pair: bytes) -> str | None:
    """The value of one property of an encoded property string (``pair`` is its name
    and the name separator): the last pair of that name, as :func:`decode_properties`
    keeps it (a value cannot hold the name separator, so a match is a pair's name when
    it starts the string or follows a pair's end)."""
    i = props.rfind(pair)
    while i > 0 and props[i - 1 : i] != _PAIR_END:
        i = props.rfind(pair, 0, i)
    if i < 0:
        return None
    start = i + len(pair)
    stop = props.find(_PAIR_END, start)
    try:
        return str(props[start : len(props) if stop < 0 else stop], "utf-8")
    except UnicodeDecodeError as exc:
        name = pair[:-1].decode()
        raise CorruptRecord(f"invalid UTF-8 in the {name} property: {exc}") from exc


def decode_dispatch(
    buf: BufferLike, pos: int = 0, end: int | None = None
) -> tuple[DispatchHead | Blank, int]:
    """The record at ``pos`` as far as dispatching it to its consume queue needs; returns
    ``(head or BLANK, record size)``.

    For bytes whose CRC this store checked when it took them in (a slave's reput of
    what :meth:`~broker_agent.store.MessageStore.append_replicated` appended): lengths,
    magic and inner lengths are checked as :func:`decode_record` does, the CRC is not,
    and neither the body nor the properties are decoded (only the tags, keys and unique
    key are looked up).
    """
    with memoryview(buf) as view:
        total, magic = _check_prefix(view, pos, _limit(view, end))
        if magic == BLANK_MAGIC:
            return BLANK, total
        (_, _, _, _, queue_id, queue_offset, physical, _, store_ts) = _HEAD.unpack_from(view, pos)
        rec_end = pos + total
        p = pos + HEADER_SIZE
        for width in (_U16, _U16):  # born host, store host: skipped
            if p + width.size > rec_end:
                raise CorruptRecord("field length runs past the record end")
            (length,) = width.unpack_from(view, p)
            p += width.size + length
        topic, p = _read_str(view, p, rec_end, _U16)
        if p + 4 > rec_end:
            raise CorruptRecord("field length runs past the record end")
        (props_len,) = _U32.unpack_from(view, p)
        p += 4
        if p + props_len + 4 > rec_end:
            raise CorruptRecord("field runs past the record end")
        tags = keys = uniq = None
        if props_len:
            props = bytes(view[p : p + props_len])
            tags = _prop_in(props, _TAGS_PAIR)
            keys = _prop_in(props, _KEYS_PAIR)
            uniq = _prop_in(props, _UNIQ_PAIR)
        p += props_len
        (body_len,) = _U32.unpack_from(view, p)
        if p + 4 + body_len != rec_end:
            raise CorruptRecord(f"body length {body_len} disagrees with record length {total}")
    head = DispatchHead(topic, queue_id, queue_offset, physical, store_ts, tags, keys, uniq)
    return head, total


def iter_records(
    buf: BufferLike, pos: int = 0, end: int | None = None
) -> Iterator[tuple[int, StoredMessage | Blank, int]]:
    """Yield ``(position, record, size)`` for each record in ``buf[pos:end]``.

    Stops at the end of the buffer or at a zero length field (an unwritten tail);
    raises :class:`CorruptRecord` on anything else that does not decode.
    """
    limit = len(buf) if end is None else min(end, len(buf))
    while pos < limit:
        if pos + 4 <= limit and _U32.unpack_from(buf, pos)[0] == 0:
            return
        record, size = decode_record(buf, pos, limit)
        yield pos, record, size
        pos += size


# --- message ids ---------------------------------------------------------------


def _split_host(host: str) -> tuple[str, int]:
    if host.startswith("["):
        addr, _, rest = host[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif host.count(":") == 1:
        addr, _, port_text = host.partition(":")
    else:
        addr, port_text = host, ""
    try:
        port = int(port_text) if port_text else 0
    except ValueError:
        port = 0
    return addr, port


@functools.lru_cache(maxsize=256)
def _msg_id_host(store_host: str) -> tuple[bytes, int]:
    """``(ip bytes, port)`` of a store host, parsed once per host (a broker has one)."""
    addr, port = _split_host(store_host)
    try:
        ip_bytes = ipaddress.ip_address(addr).packed
    except ValueError:
        ip_bytes = bytes(4)
    return ip_bytes, port & 0xFFFFFFFF


def make_msg_id(store_host: str, physical_offset: int) -> str:
    """RocketMQ offset message id: hex of ``ip | port u32 | physical offset u64``."""
    ip_bytes, port = _msg_id_host(store_host)
    return (ip_bytes + struct.pack(">IQ", port, physical_offset)).hex().upper()


def parse_msg_id(msg_id: str) -> tuple[str, int]:
    """Inverse of :func:`make_msg_id`: ``("ip:port", physical_offset)``."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as exc:
        raise ValueError(f"message id is not hex: {msg_id!r}") from exc
    if len(raw) == 16:
        host = str(ipaddress.IPv4Address(raw[:4]))
    elif len(raw) == 28:
        host = f"[{ipaddress.IPv6Address(raw[:16])}]"
    else:
        raise ValueError(f"message id has {len(raw)} bytes, expected 16 or 28")
    port, offset = struct.unpack(">IQ", raw[-12:])
    return f"{host}:{port}", offset
