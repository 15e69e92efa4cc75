"""The store checkpoint: how far the commit log and the consume queues are known durable.

A small file with two fixed slots rewritten in place, alternately, with ``pwrite`` and
``fdatasync`` (no new file per write, so it still works on a full disk).  Each slot is::

    magic u32 | version u16 | flags u16 | sequence u64 | commitlog_offset u64 |
    dispatched_offset u64 | written_ts_ms u64 | queue_entries u64 |
    crc32 u32 (of the preceding bytes)

Loading picks the valid slot with the highest sequence, so a torn write of one slot
falls back to the other.  ``commitlog_offset``: every commit-log byte below it was
fsynced; ``dispatched_offset``: every record below it has its consume-queue entry
fsynced; ``queue_entries``: the sum of every consume queue's max offset at that point
(how many entries lie below ``dispatched_offset``), which lets recovery notice a consume
queue that lost entries there without reading it.  Recovery verifies only the commit
log past these offsets (see ``message_store``).  Version 1 slots (no ``queue_entries``)
still load, with ``queue_entries`` None.
"""

from __future__ import annotations

import logging
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from .commitlog import pwrite_all, store_error

logger = logging.getLogger(__name__)

_MAGIC = 0x4841434B  # "HACK"
_VERSION = 2
_BODY_V1 = struct.Struct(">IHHQQQQ")
_BODY = struct.Struct(">IHHQQQQQ")
_CRC = struct.Struct(">I")
_SLOT_STRIDE = 512
_FLAG_CLEAN = 1


@dataclass(frozen=True, slots=True)
class Checkpoint:
    commitlog_offset: int
    dispatched_offset: int
    clean_shutdown: bool = False
    written_ts_ms: int = 0
    sequence: int = 0
    #: sum of the consume queues' max offsets at ``dispatched_offset`` (None: version 1)
    queue_entries: int | None = None


class CheckpointFile:
    """Reads and writes the two-slot checkpoint file; not thread-safe."""

    def __init__(self, path: Path) -> None:
        self._path = path
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise store_error(exc, f"cannot open checkpoint {path}") from exc
        self._last: Checkpoint | None = None

    def load(self) -> Checkpoint | None:
        best: Checkpoint | None = None
        for slot in range(2):
            try:
                raw = os.pread(self._fd, _BODY.size + _CRC.size, slot * _SLOT_STRIDE)
            except OSError as exc:
                raise store_error(exc, f"cannot read checkpoint {self._path}") from exc
            cp = _parse(raw)
            if cp is not None and (best is None or cp.sequence > best.sequence):
                best = cp
        if best is None and os.fstat(self._fd).st_size:
            logger.warning("checkpoint %s has no valid slot; recovering without it", self._path)
        self._last = best
        return best

    def write(
        self, commitlog_offset: int, dispatched_offset: int, queue_entries: int, *, clean: bool
    ) -> Checkpoint:
        seq = self._last.sequence + 1 if self._last is not None else 1
        cp = Checkpoint(
            commitlog_offset=commitlog_offset,
            dispatched_offset=dispatched_offset,
            clean_shutdown=clean,
            written_ts_ms=int(time.time() * 1000),
            sequence=seq,
            queue_entries=queue_entries,
        )
        body = _BODY.pack(
            _MAGIC,
            _VERSION,
            _FLAG_CLEAN if clean else 0,
            seq,
            commitlog_offset,
            dispatched_offset,
            cp.written_ts_ms,
            queue_entries,
        )
        try:
            pwrite_all(self._fd, body + _CRC.pack(zlib.crc32(body)), (seq % 2) * _SLOT_STRIDE)
            os.fdatasync(self._fd)
        except OSError as exc:
            raise store_error(exc, f"cannot write checkpoint {self._path}") from exc
        self._last = cp
        return cp

    @property
    def last(self) -> Checkpoint | None:
        return self._last

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            logger.warning("closing checkpoint %s failed", self._path, exc_info=True)


def _parse(raw: bytes) -> Checkpoint | None:
    for layout in (_BODY, _BODY_V1):
        if len(raw) < layout.size + _CRC.size:
            continue
        body = raw[: layout.size]
        (crc,) = _CRC.unpack_from(raw, layout.size)
        if zlib.crc32(body) != crc:
            continue
        magic, version, flags, seq, cl_off, disp_off, ts, *rest = layout.unpack(body)
        if magic != _MAGIC or version != (_VERSION if layout is _BODY else 1):
            continue
        entries = rest[0] if rest else None
        return Checkpoint(cl_off, disp_off, bool(flags & _FLAG_CLEAN), ts, seq, entries)
    return None
