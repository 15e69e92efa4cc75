"""The commit log: fixed-size segment files holding every record back to back.

Segments are named by their 20-digit start offset (``00000000000000065536``), like
RocketMQ's ``MappedFile``s.  Segments are not pre-allocated: a file grows as records are
appended, so the size of the last segment is the end of the log.  When the next record
would leave less than ``BLANK_MIN_SIZE`` bytes at the end of a segment, a blank record
(an 8-byte head, then a hole up to the segment size) closes the segment and the record
goes to the next one.  So every full segment ends with one blank record and the
segments are contiguous.

I/O is plain ``os.pwrite`` / ``os.pread``.  Only the active (last) segment keeps its
descriptor open until it is closed by a roll-over or :meth:`CommitLog.close`; older
segments are opened on demand through a bounded :class:`~.files.FileCache` (shared with
the consume queues), so the number of open files does not grow with the log.  The class
is not thread-safe; the message store serialises access, and :meth:`CommitLog.sync_fds`
hands out duplicated file descriptors so that a flusher can ``fdatasync`` without the
store lock.

Retention deletes whole segments from the front (:meth:`CommitLog.detach_oldest`, then
:func:`unlink_segments` outside the store lock); the active segment is never deleted,
so the log is never empty once it has been written.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import struct
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, overload

from ha_controller.protocol.errors import CorruptRecord, OffsetOutOfRange, StoreError, StoreFull
from ha_controller.protocol.record import (
    BLANK,
    BLANK_MAGIC,
    BLANK_MIN_SIZE,
    Blank,
    DispatchHead,
    StoredMessage,
    decode_dispatch,
    decode_header,
    decode_record,
    encode_blank_header,
)

from .files import OPEN_FLAGS, FileCache

logger = logging.getLogger(__name__)

_SEGMENT_NAME = re.compile(r"^\d{20}$")
_U32 = struct.Struct(">I")
_PREFIX = struct.Struct(">II")
_SCAN_CHUNK = 1 << 20
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
#: descriptors of a commit log that was given no shared cache (tests, tools)
DEFAULT_OPEN_FILES = 64


def store_error(exc: OSError, what: str) -> StoreError:
    """Map an OSError from file I/O to StoreFull (no space) or StoreError."""
    cls = StoreFull if exc.errno in _FULL_ERRNOS else StoreError
    return cls(f"{what}: {exc.strerror or exc}")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """``os.pwrite`` until every byte is written (a short write is retried, then fails)."""
    with memoryview(data) as view:
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], offset + done)


def pread_exact(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise StoreError(f"short read: wanted {size} bytes at {offset}, got {len(data)}")
    return data


class Segment:
    """One segment file; ``size`` is the number of bytes written (the file size).

    ``fd`` is the descriptor held by the active segment; None for the others (they are
    opened through the file cache)."""

    __slots__ = ("fd", "path", "size", "start")

    def __init__(self, start: int, path: Path, fd: int | None, size: int) -> None:
        self.start = start
        self.path = path
        self.fd = fd
        self.size = size

    @property
    def written_end(self) -> int:
        return self.start + self.size

    def __repr__(self) -> str:
        return f"Segment({self.path.name}, size={self.size})"


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What retention needs to know about one closed segment."""

    start: int
    end: int
    mtime_ms: int
    path: Path


def unlink_segments(directory: Path, paths: Iterable[Path]) -> None:
    """Remove detached segment files, then make the removal durable (no store lock)."""
    removed = False
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise store_error(exc, f"cannot remove segment {path}") from exc
        removed = True
    if removed:
        try:
            fsync_dir(directory)
        except OSError as exc:
            raise store_error(exc, f"cannot sync directory {directory}") from exc


class CommitLog:
    """Append-only, segmented record log (see module docstring)."""

    def __init__(self, directory: Path, segment_size: int, files: FileCache | None = None) -> None:
        self._dir = directory
        self._segment_size = segment_size
        self._own_files = files is None
        self._files = files if files is not None else FileCache(DEFAULT_OPEN_FILES)
        self._segments: list[Segment] = []
        self._base = 0  # start offset when there are no segments
        self._flushed = 0
        self._unclean_tail = False  # a failed write could not be cut back

    # --- opening ------------------------------------------------------------

    def load(self) -> None:
        """Open the existing segment files (no verification; see :meth:`scan`)."""
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            names = sorted(p.name for p in self._dir.iterdir() if _SEGMENT_NAME.match(p.name))
        except OSError as exc:
            raise store_error(exc, f"cannot open commit log directory {self._dir}") from exc
        expected: int | None = None
        for i, name in enumerate(names):
            start = int(name)
            if start % self._segment_size:
                raise StoreError(
                    f"segment {name} is not aligned to segment_size_bytes={self._segment_size}"
                )
            if expected is not None and start != expected:
                raise StoreError(
                    f"commit log segments are not contiguous: expected {expected:020d}"
                )
            path = self._dir / name
            fd: int | None = None
            try:
                if i == len(names) - 1:  # the active segment keeps its descriptor
                    fd = os.open(path, OPEN_FLAGS)
                    size = os.fstat(fd).st_size
                else:
                    size = path.stat().st_size
            except OSError as exc:
                raise store_error(exc, f"cannot open segment {path}") from exc
            self._segments.append(Segment(start, path, fd, size))
            if size > self._segment_size:
                raise StoreError(
                    f"segment {name} has {size} bytes, more than "
                    f"segment_size_bytes={self._segment_size}"
                )
            expected = start + self._segment_size
        if self._segments:
            self._base = self._segments[0].start
        # The last segment may hold bytes a crashed process never synced.
        self._flushed = self._segments[-1].start if self._segments else self._base

    # --- offsets --------------------------------------------------------------

    @property
    def segment_size(self) -> int:
        return self._segment_size

    @property
    def min_offset(self) -> int:
        return self._segments[0].start if self._segments else self._base

    @property
    def max_offset(self) -> int:
        return self._segments[-1].written_end if self._segments else self._base

    @property
    def flushed_offset(self) -> int:
        return self._flushed

    def segment_start(self, offset: int) -> int:
        return offset - offset % self._segment_size

    def segment_starts(self) -> list[int]:
        return [seg.start for seg in self._segments]

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def files(self) -> FileCache:
        return self._files

    def _fd(self, seg: Segment) -> int:
        """``seg``'s descriptor: its own when active, else from the cache (OSError)."""
        return seg.fd if seg.fd is not None else self._files.fd(seg.path)

    def _demote(self, seg: Segment) -> None:
        """``seg`` is no longer active: its descriptor goes to the cache."""
        if seg.fd is not None:
            self._files.adopt(seg.path, seg.fd)
            seg.fd = None

    def _activate(self, seg: Segment) -> None:
        """``seg`` is the last segment again (after a truncation): hold its descriptor."""
        if seg.fd is None:
            fd = self._files.take(seg.path)
            if fd is None:
                try:
                    fd = os.open(seg.path, OPEN_FLAGS)
                except OSError as exc:
                    raise store_error(exc, f"cannot open segment {seg.path}") from exc
            seg.fd = fd

    def _index(self, offset: int) -> int:
        """Index of the segment whose range ``[start, start + segment_size)`` holds offset."""
        if not self._segments:
            return -1
        idx = (offset - self._segments[0].start) // self._segment_size
        return idx if 0 <= idx < len(self._segments) else -1

    def next_record_offset(self, size: int) -> int:
        """Where a record of ``size`` bytes appended now would start (mirrors :meth:`append`)."""
        return self.place(self.max_offset, size)

    def place(self, end: int, size: int) -> int:
        """Where a record of ``size`` bytes starts when the log ends at ``end``: at ``end``
        if it leaves room for a blank in that segment, else at the next segment's start
        (mirrors :meth:`append_batch`, so a batch can be encoded before it is written)."""
        in_segment = end % self._segment_size
        if in_segment + size + BLANK_MIN_SIZE <= self._segment_size:
            return end
        return end - in_segment + self._segment_size

    # --- writing ---------------------------------------------------------------

    def _create_segment(self, start: int) -> Segment:
        path = self._dir / f"{start:020d}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise store_error(exc, f"cannot create segment {path}") from exc
        seg = Segment(start, path, fd, 0)
        if self._segments:
            self._demote(self._segments[-1])
        self._segments.append(seg)
        try:
            fsync_dir(self._dir)
        except OSError as exc:
            raise store_error(exc, f"cannot sync directory {self._dir}") from exc
        return seg

    def _segment_for_append(self, size: int) -> Segment:
        """The segment a record of ``size`` bytes goes to, closing the current one if needed."""
        if not self._segments:
            return self._create_segment(self._base)
        last = self._segments[-1]
        if last.size + size + BLANK_MIN_SIZE <= self._segment_size:
            return last
        if last.size < self._segment_size:
            self._write_blank(last)
        return self._create_segment(last.start + self._segment_size)

    def _write_at_end(self, seg: Segment, data: bytes | memoryview) -> None:
        """Append ``data`` to ``seg``; on failure cut the file back so no partial bytes stay."""
        try:
            pwrite_all(self._fd(seg), data, seg.size)
        except OSError as exc:
            self._cut_back(seg)
            raise store_error(exc, f"cannot write segment {seg.path.name}") from exc
        seg.size += len(data)

    def _cut_back(self, seg: Segment) -> None:
        try:
            os.ftruncate(self._fd(seg), seg.size)
        except OSError:
            self._unclean_tail = True
            logger.exception("cannot cut segment %s back to %d bytes", seg.path.name, seg.size)

    def _write_blank(self, seg: Segment) -> None:
        blank = self._segment_size - seg.size
        try:
            fd = self._fd(seg)
            pwrite_all(fd, encode_blank_header(blank), seg.size)
            os.ftruncate(fd, self._segment_size)
            os.fdatasync(fd)
        except OSError as exc:
            self._cut_back(seg)
            raise store_error(exc, f"cannot close segment {seg.path.name}") from exc
        seg.size = self._segment_size

    def append(self, data: bytes) -> int:
        """Append one encoded record; returns its physical offset (see :meth:`append_batch`)."""
        return self.append_batch((data,))[0]

    def append_batch(self, records: Sequence[bytes]) -> list[int]:
        """Append encoded records back to back; returns their physical offsets.

        Each record must have been encoded for the offset :meth:`place` gives it, starting
        from :attr:`max_offset`.  The records of one segment go out in one write; a record
        that does not fit closes the segment (blank) and opens the next.  On any error
        everything written by this call is truncated away before the typed error
        (:class:`StoreFull` / :class:`StoreError`) is raised.  Nothing is durable until
        :meth:`sync` (one fdatasync for the whole batch).
        """
        for data in records:
            if len(data) + BLANK_MIN_SIZE > self._segment_size:
                raise ValueError(
                    f"record of {len(data)} bytes cannot fit a {self._segment_size} segment"
                )
        offsets: list[int] = []
        before = self.max_offset
        try:
            seg: Segment | None = None
            group: list[bytes] = []
            end = 0
            for data in records:
                size = len(data)
                if seg is None or end - seg.start + size + BLANK_MIN_SIZE > self._segment_size:
                    if seg is not None:
                        self._write_group(seg, group)
                        group = []
                    seg = self._segment_for_append(size)
                    end = seg.written_end
                offsets.append(end)
                group.append(data)
                end += size
            if seg is not None:
                self._write_group(seg, group)
        except StoreError:
            self.rollback(before)
            raise
        return offsets

    def _write_group(self, seg: Segment, group: list[bytes]) -> None:
        self._write_at_end(seg, group[0] if len(group) == 1 else b"".join(group))

    def append_raw(
        self, offset: int, data: bytes, *, room: Callable[[int], None] | None = None
    ) -> int:
        """Append whole records streamed from a master so that they land at ``offset``.

        Every record is verified first (CRC, physical offset, segment fit); nothing is
        written unless all of ``data`` is valid.  ``offset`` must equal :attr:`max_offset`
        (or, for an empty log, be a segment start).  ``room`` is called, before anything
        is written, with the number of record bytes (blank fills are holes, not counted)
        and may raise to refuse.  Returns that number.
        """
        if not data:
            return 0
        if offset != self.max_offset:
            if self.max_offset != self.min_offset or offset % self._segment_size:
                raise OffsetOutOfRange(
                    f"replicated data at {offset}, commit log ends at {self.max_offset}"
                )
            pieces = self._validate_raw(offset, data)
            payload = sum(stop - start for start, stop, blank in pieces if not blank)
            if room is not None:
                room(payload)
            self._rebase_empty(offset)
        else:
            pieces = self._validate_raw(offset, data)
            payload = sum(stop - start for start, stop, blank in pieces if not blank)
            if room is not None:
                room(payload)
        before = self.max_offset
        try:
            with memoryview(data) as view:
                for start, stop, blank in pieces:
                    seg = self._segment_for_raw(offset + start)
                    if blank:
                        self._write_blank(seg)
                        continue
                    self._write_at_end(seg, view[start:stop])
        except StoreError:
            self.rollback(before)
            raise
        return payload

    def _rebase_empty(self, offset: int) -> None:
        for seg in self._segments:
            self._drop_segment(seg)
        self._segments.clear()
        self._base = offset
        self._flushed = offset

    def _segment_for_raw(self, offset: int) -> Segment:
        if self._segments and offset < self._segments[-1].start + self._segment_size:
            return self._segments[-1]
        return self._create_segment(offset)

    def _validate_raw(self, offset: int, data: bytes) -> list[tuple[int, int, bool]]:
        """Split ``data`` into runs ``(start, stop, is_blank)`` that each stay in one segment."""
        pieces: list[tuple[int, int, bool]] = []
        run_start = 0
        pos = 0
        seg_size = self._segment_size
        while pos < len(data):
            here = offset + pos
            head = decode_header(data, pos)
            in_seg = here % seg_size
            if head.blank:
                if in_seg + head.size != seg_size:
                    raise CorruptRecord(f"blank record at {here} does not end its segment")
                if pos > run_start:
                    pieces.append((run_start, pos, False))
                pieces.append((pos, pos + head.size, True))
                run_start = pos + head.size
            else:
                if head.physical_offset != here:
                    raise CorruptRecord(
                        f"record at {here} claims physical offset {head.physical_offset}"
                    )
                if in_seg + head.size + BLANK_MIN_SIZE > seg_size:
                    raise CorruptRecord(f"record at {here} overruns its segment")
            pos += head.size
        if pos > run_start:
            pieces.append((run_start, pos, False))
        return pieces

    # --- truncation --------------------------------------------------------------

    def _release(self, seg: Segment) -> None:
        """Close ``seg``'s descriptor, its own or the cache's."""
        if seg.fd is None:
            self._files.forget(seg.path)
            return
        try:
            os.close(seg.fd)
        except OSError:
            logger.warning("closing segment %s failed", seg.path.name, exc_info=True)
        seg.fd = None

    def _drop_segment(self, seg: Segment) -> None:
        self._release(seg)
        try:
            seg.path.unlink(missing_ok=True)
        except OSError as exc:
            raise store_error(exc, f"cannot remove segment {seg.path}") from exc

    def truncate(self, offset: int) -> None:
        """Drop every byte at or after ``offset`` (a record boundary)."""
        if offset >= self.max_offset:
            return
        if offset < self.min_offset:
            raise OffsetOutOfRange(f"cannot truncate to {offset} below {self.min_offset}")
        keep: list[Segment] = []
        for seg in self._segments:
            if seg.start < offset or (seg.start == offset and not keep):
                keep.append(seg)
            else:
                self._drop_segment(seg)
        self._segments = keep
        last = keep[-1]
        self._activate(last)
        new_size = min(offset - last.start, last.size)
        if new_size != last.size:
            try:
                os.ftruncate(self._fd(last), new_size)
            except OSError as exc:
                raise store_error(exc, f"cannot truncate segment {last.path.name}") from exc
            last.size = new_size
        self._flushed = min(self._flushed, offset)
        try:
            fsync_dir(self._dir)
        except OSError as exc:
            raise store_error(exc, f"cannot sync directory {self._dir}") from exc

    def rollback(self, offset: int) -> bool:
        """Best-effort :meth:`truncate` after a failed write; logs instead of raising.
        True when the files end exactly at ``offset`` again (no partial bytes left)."""
        try:
            self.truncate(offset)
        except (StoreError, OffsetOutOfRange):
            logger.exception("rolling the commit log back to %d failed", offset)
            return False
        return not self._unclean_tail and self.max_offset == offset

    # --- damage under a running broker (see ``repair``) --------------------------------

    def shrunk(self) -> tuple[int, int] | None:
        """``(file end, write position)`` when the active segment's file is shorter than
        what this log wrote to it (truncated under the running broker), else None."""
        if not self._segments:
            return None
        seg = self._segments[-1]
        try:
            size = os.fstat(self._fd(seg)).st_size
        except OSError as exc:
            raise store_error(exc, f"cannot stat segment {seg.path.name}") from exc
        if size >= seg.size:
            return None
        return seg.start + size, seg.written_end

    def boundary_before(self, offset: int) -> int:
        """The start of the record holding ``offset`` (or ``offset`` when a record starts
        there), found by walking the length fields from its segment's start; the walk
        stops at the first length that is zero or runs past ``offset``."""
        idx = self._index(offset)
        if idx < 0:
            raise OffsetOutOfRange(f"no segment holds commit log offset {offset}")
        seg = self._segments[idx]
        pos = seg.start
        try:
            fd = self._fd(seg)
            chunk, chunk_at = b"", pos
            while pos < offset:
                at = pos - chunk_at
                if at + 4 > len(chunk):
                    chunk, chunk_at = os.pread(fd, _SCAN_CHUNK, pos - seg.start), pos
                    at = 0
                    if len(chunk) < 4:
                        break
                (length,) = _U32.unpack_from(chunk, at)
                if length == 0 or pos + length > offset:
                    break
                pos += length
        except OSError as exc:
            raise store_error(exc, f"cannot read segment {seg.path.name}") from exc
        return pos

    def write_in_place(self, offset: int, data: bytes) -> None:
        """Write ``data`` (whole records a replica sent, checked by the caller) over the
        log's own bytes at ``offset``, below :attr:`max_offset`, in one segment, and
        fdatasync it.  The write position does not move."""
        idx = self._index(offset)
        if idx < 0 or offset + len(data) > self._segments[idx].written_end:
            raise OffsetOutOfRange(f"no {len(data)} bytes at commit log offset {offset}")
        seg = self._segments[idx]
        try:
            fd = self._fd(seg)
            file_end = seg.start + os.fstat(fd).st_size
            if offset > file_end:
                # the file shrank below it: writing there would leave a hole of zeros
                raise OffsetOutOfRange(
                    f"segment {seg.path.name} ends at {file_end}, before {offset}: "
                    "the range from its end is to be written first"
                )
            pwrite_all(fd, data, offset - seg.start)
            os.fdatasync(fd)
        except OSError as exc:
            raise store_error(exc, f"cannot write segment {seg.path.name}") from exc

    # --- reading ---------------------------------------------------------------------

    def read_at(self, offset: int, size: int) -> bytes:
        """Exactly ``size`` bytes at ``offset``, which must lie inside one segment."""
        idx = self._index(offset)
        if idx < 0 or offset + size > self._segments[idx].written_end:
            raise OffsetOutOfRange(f"no {size} bytes at commit log offset {offset}")
        seg = self._segments[idx]
        try:
            return pread_exact(self._fd(seg), size, offset - seg.start)
        except OSError as exc:
            raise store_error(exc, f"cannot read segment {seg.path.name}") from exc

    def record_size_at(self, offset: int) -> int:
        """The length field of the record at ``offset``."""
        (size,) = _U32.unpack(self.read_at(offset, 4))
        return int(size)

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Raw bytes of whole records from ``offset`` (a record boundary), for HA streaming.

        Returns at most ``max_bytes`` unless the first record alone is larger, in which
        case exactly that record is returned; may span segments (blank fills included).
        Returns ``b""`` at :attr:`max_offset`.
        """
        if offset < self.min_offset or offset > self.max_offset:
            raise OffsetOutOfRange(
                f"offset {offset} outside commit log [{self.min_offset}, {self.max_offset}]"
            )
        out: list[bytes] = []
        total = 0
        while offset < self.max_offset:
            seg = self._segments[self._index(offset)]
            want = min(max_bytes - total, seg.written_end - offset)
            first = self.record_size_at(offset)
            if first > want:
                if not out:
                    out.append(self.read_at(offset, first))
                break
            chunk = self.read_at(offset, want)
            cut = _whole_records(chunk)
            out.append(chunk[:cut])
            total += cut
            offset += cut
            if cut < len(chunk) or total >= max_bytes:
                break
        return b"".join(out)

    @overload
    def scan(
        self, start: int, end: int | None = None, *, heads: Literal[False] = False
    ) -> Iterator[tuple[int, StoredMessage | Blank, int]]: ...

    @overload
    def scan(
        self, start: int, end: int | None = None, *, heads: Literal[True]
    ) -> Iterator[tuple[int, DispatchHead | Blank, int]]: ...

    def scan(
        self, start: int, end: int | None = None, *, heads: bool = False
    ) -> Iterator[tuple[int, StoredMessage | DispatchHead | Blank, int]]:
        """Yield ``(offset, record, size)`` for every verified record from ``start``.

        ``start`` must be a record boundary.  Raises :class:`CorruptRecord` (the message
        names the offset) at the first record that fails to decode, a zero or torn tail,
        a record whose physical offset is wrong or a segment that is not the last one and
        does not end with a blank.  ``end`` defaults to :attr:`max_offset`.

        ``heads=True`` yields :class:`DispatchHead` instead of messages, and checks no CRC
        (:func:`decode_dispatch`): for bytes checked when they were appended (a slave's
        reput), not for recovery.
        """
        stop = self.max_offset if end is None else min(end, self.max_offset)
        offset = start
        while offset < stop:
            idx = self._index(offset)
            seg = self._segments[idx]
            is_last = idx == len(self._segments) - 1
            seg_stop = min(seg.written_end, stop)
            offset = yield from self._scan_segment(
                seg, offset, seg_stop, decode_dispatch if heads else decode_record
            )
            if offset >= stop:
                break
            if offset < seg.start + self._segment_size:
                if is_last:
                    break
                raise CorruptRecord(
                    f"segment {seg.path.name} ends at {offset} without a blank record"
                )

    def _scan_segment(
        self,
        seg: Segment,
        offset: int,
        seg_stop: int,
        decode: Callable[[bytes, int], tuple[StoredMessage | DispatchHead | Blank, int]],
    ) -> Generator[tuple[int, StoredMessage | DispatchHead | Blank, int], None, int]:
        """Yield records of one segment from ``offset`` to ``seg_stop``; return the end."""
        seg_size = self._segment_size
        while offset < seg_stop:
            if seg_stop - offset < BLANK_MIN_SIZE:
                raise CorruptRecord(f"torn record head at {offset}")
            first, magic = _PREFIX.unpack(self.read_at(offset, BLANK_MIN_SIZE))
            if first == 0:
                raise CorruptRecord(f"zero record length at {offset}")
            if magic == BLANK_MAGIC:
                # Do not read the fill: it is a hole of up to a few MiB of zeros.
                if first < BLANK_MIN_SIZE or offset - seg.start + first != seg_size:
                    raise CorruptRecord(f"blank record at {offset} does not end its segment")
                if offset + first > seg_stop:
                    raise CorruptRecord(f"torn blank record at {offset}")
                yield offset, BLANK, first
                offset += first
                continue
            if offset + first > seg_stop:
                raise CorruptRecord(
                    f"torn record at {offset}: length {first}, {seg_stop - offset} available"
                )
            chunk = self.read_at(offset, max(first, min(_SCAN_CHUNK, seg_stop - offset)))
            pos = 0
            while pos < len(chunk):
                here = offset + pos
                if len(chunk) - pos < BLANK_MIN_SIZE:
                    break
                length, magic = _PREFIX.unpack_from(chunk, pos)
                if magic == BLANK_MAGIC or (length and pos + length > len(chunk)):
                    break  # handled by the outer loop with a fresh read
                try:
                    record, size = decode(chunk, pos)
                except CorruptRecord as exc:
                    raise CorruptRecord(f"commit log offset {here}: {exc}") from exc
                assert record is not BLANK
                if record.physical_offset != here:
                    raise CorruptRecord(
                        f"record at {here} claims physical offset {record.physical_offset}"
                    )
                if here - seg.start + size + BLANK_MIN_SIZE > seg_size:
                    raise CorruptRecord(f"record at {here} overruns its segment")
                yield here, record, size
                pos += size
            if pos == 0:
                raise CorruptRecord(f"undecodable record at {offset}")
            offset += pos
        return offset

    # --- retention ---------------------------------------------------------------------

    def closed_segments(self) -> Iterator[SegmentInfo]:
        """Every segment but the active one, oldest first, with its modification time
        (stat()ed lazily: a caller that stops early stats no more)."""
        for seg in self._segments[:-1]:
            try:
                mtime_ns = seg.path.stat().st_mtime_ns
            except OSError as exc:
                raise store_error(exc, f"cannot stat segment {seg.path}") from exc
            yield SegmentInfo(seg.start, seg.written_end, mtime_ns // 1_000_000, seg.path)

    def detach_oldest(self, count: int) -> list[Segment]:
        """Drop the ``count`` oldest segments from the log (never the active one) and
        close their descriptors; the caller removes the files (:func:`unlink_segments`),
        which may happen without the store lock since nothing refers to them any more."""
        count = min(count, len(self._segments) - 1)
        if count <= 0:
            return []
        gone = self._segments[:count]
        del self._segments[:count]
        for seg in gone:
            self._release(seg)
        self._flushed = max(self._flushed, self.min_offset)
        return gone

    # --- durability ------------------------------------------------------------------

    def _unflushed(self, upto: int | None = None) -> list[Segment]:
        """Segments with bytes above the flushed offset (the last one or two), oldest first."""
        out: list[Segment] = []
        for seg in reversed(self._segments):
            if seg.written_end <= self._flushed:
                break
            if upto is None or seg.start < upto:
                out.append(seg)
        out.reverse()
        return out

    def sync_fds(self, upto: int) -> list[int]:
        """Duplicated fds of the segments holding unflushed bytes below ``upto``.

        The caller fdatasyncs and closes them, then calls :meth:`mark_flushed`; dups keep
        a concurrent rollback (or the file cache) from closing a descriptor under the
        flusher.  Raises StoreError when a segment cannot be opened.
        """
        fds: list[int] = []
        try:
            for seg in self._unflushed(upto):
                fds.append(os.dup(self._fd(seg)))  # noqa: PERF401 (closed on failure)
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            raise store_error(exc, "cannot open a segment to sync it") from exc
        return fds

    def mark_flushed(self, offset: int) -> None:
        self._flushed = max(self._flushed, min(offset, self.max_offset))

    def sync(self) -> None:
        """fdatasync every segment with unflushed bytes (caller holds the store lock)."""
        for seg in self._unflushed():
            try:
                os.fdatasync(self._fd(seg))
            except OSError as exc:
                raise store_error(exc, f"cannot sync segment {seg.path.name}") from exc
        self._flushed = self.max_offset

    def close(self) -> None:
        for seg in self._segments:
            self._release(seg)
        self._segments = []
        if self._own_files:
            self._files.close()


def _whole_records(chunk: bytes) -> int:
    """Length of the longest prefix of ``chunk`` made of whole records (by length fields)."""
    pos = 0
    n = len(chunk)
    while pos + 4 <= n:
        (length,) = _U32.unpack_from(chunk, pos)
        if length == 0 or pos + length > n:
            break
        pos += length
    return pos
