"""Cutting a live store's log back to an earlier record boundary.

A master that comes back after a slave acted for it may hold a tail no slave holds:
records written in its last seconds before it lost its lease (due delayed messages,
POP retries, their progress records) or sends whose outcome its clients never learnt.
Pre-online cuts that tail away before the slaves re-attach (see
``broker_agent.membership.truncation`` for when).  This module is the store's half: the
same cut crash recovery makes at a torn record, done on an open store.

Steps, each durable before the next, so that a crash anywhere leaves a store that
recovery opens consistently and that :func:`pending_cut` finishes:

1. write the intent file :data:`MARKER` (the target offset) and sync the directory;
2. cut the commit log at the target (dropping later segments) and sync it;
3. drop every consume-queue entry that points at or past the target, sync the queues;
4. write a checkpoint at the target (``queue_entries`` counts what is left);
5. remove the intent file.

A crash before step 2 leaves the tail in place and the intent file: the broker's
pre-online finds it and cuts again.  A crash after step 2 leaves a checkpoint past the
end of the log, which recovery does not trust: it walks the whole log and trims the
consume queues itself.

The caller must keep writers and readers away (pre-online runs while the broker is
isolated); the store's lock covers the cut itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ha_controller.protocol.errors import CorruptRecord, OffsetOutOfRange, StoreError
from ha_controller.protocol.record import BLANK, decode_record

from .checkpoint import CheckpointFile
from .commitlog import CommitLog, fsync_dir, store_error
from .consumequeue import ConsumeQueue

logger = logging.getLogger(__name__)

#: In the store directory while a cut is under way: the target offset, in decimal.
MARKER = "truncate.pending"


@dataclass(frozen=True, slots=True)
class CutResult:
    """What one cut removed."""

    offset: int
    dropped_bytes: int
    dropped_entries: int
    queues: int  # consume queues that lost entries

    def __str__(self) -> str:
        return (
            f"commit log cut at {self.offset}: {self.dropped_bytes} bytes and "
            f"{self.dropped_entries} consume-queue entries in {self.queues} queue(s) dropped"
        )


def check_boundary(cl: CommitLog, offset: int) -> None:
    """OffsetOutOfRange unless ``offset`` is the end of the log or the start of a record
    that verifies and says it lives at ``offset`` (every record carries its physical
    offset, so a cut in the middle of a record cannot pass).  Reads one record."""
    if offset == cl.max_offset:
        return
    if not cl.min_offset <= offset < cl.max_offset:
        raise OffsetOutOfRange(
            f"cannot cut the commit log at {offset}: it holds [{cl.min_offset}, {cl.max_offset})"
        )
    if offset == cl.segment_start(offset):
        return  # a segment starts with a record
    try:
        size = cl.record_size_at(offset)
        record, got = decode_record(cl.read_at(offset, size), 0)
    except (CorruptRecord, OffsetOutOfRange) as exc:
        raise OffsetOutOfRange(
            f"cannot cut the commit log at {offset}: no record starts there ({exc})"
        ) from exc
    if record is not BLANK and record.physical_offset != offset:
        raise OffsetOutOfRange(
            f"cannot cut the commit log at {offset}: the record there says it lives at "
            f"{record.physical_offset}"
        )
    del got


def pending_cut(directory: Path) -> int | None:
    """The target of a cut a crash interrupted, or None.  An unreadable intent file is
    a StoreError (the broker must not serve a tail it meant to drop)."""
    path = directory / MARKER
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreError(f"cannot read {path}: {exc}") from exc
    if not text.isdigit():
        raise StoreError(f"{path} holds {text[:40]!r}, not an offset; remove it to start")
    return int(text)


def _write_marker(directory: Path, offset: int) -> None:
    path = directory / MARKER
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, b"%d\n" % offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(directory)
    except OSError as exc:
        raise store_error(exc, f"cannot write {path}") from exc


def _remove_marker(directory: Path) -> None:
    path = directory / MARKER
    try:
        path.unlink(missing_ok=True)
        fsync_dir(directory)
    except OSError as exc:
        raise store_error(exc, f"cannot remove {path}") from exc


def cut_back(
    directory: Path,
    cl: CommitLog,
    cqs: Mapping[tuple[str, int], ConsumeQueue],
    checkpoint: CheckpointFile,
    offset: int,
    *,
    damaged: bool = False,
) -> CutResult:
    """Cut the store in ``directory`` back to ``offset`` (steps in the module text).

    Bad input (not a record boundary inside the log) raises OffsetOutOfRange and changes
    nothing; an I/O error raises StoreError with the intent file left behind.
    ``damaged``: a damaged range starts at ``offset`` (its record cannot be read to
    check the boundary; the store found it by the length fields before it)."""
    if not damaged:
        check_boundary(cl, offset)
    dropped_bytes = cl.max_offset - offset
    _write_marker(directory, offset)
    cl.truncate(offset)
    cl.sync()
    dropped_entries = queues = 0
    for cq in cqs.values():
        keep = cq.first_at_or_after(offset)
        if keep < cq.max_offset:
            dropped_entries += cq.max_offset - keep
            queues += 1
            cq.truncate(keep)
        cq.sync()
    checkpoint.write(offset, offset, sum(cq.max_offset for cq in cqs.values()), clean=False)
    _remove_marker(directory)
    result = CutResult(offset, dropped_bytes, dropped_entries, queues)
    logger.warning("store %s: %s", directory, result)
    return result
