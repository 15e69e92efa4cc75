"""Consume queues: per (topic, queue id) index of fixed 20-byte entries into the commit log.

Entry (big-endian): ``physical_offset u64 | size u32 | tag_hash u64``.  The entries of a
queue hold consecutive logical (queue) offsets.

A queue is a directory ``consumequeue/<topic>/<queue_id>/`` of files named by the
20-digit queue offset of their first entry, each holding up to ``file_entries`` entries
(RocketMQ's ``mappedFileSizeConsumeQueue`` / 20); only the last file is appended to, and
a new one starts when it is full.  Files are contiguous: each starts where the one
before it ends.  The first may start anywhere (a slave that started replicating in the
middle of the log: :meth:`ConsumeQueue.rebase`).  A store written before queues had
several files has one file of any length; it simply becomes the first file.

Retention (see ``retention``): once the commit log's oldest segments are deleted, the
entries pointing below its new start are dead.  :meth:`ConsumeQueue.correct_min` moves
the queue's *logical* minimum offset past them (RocketMQ's ``minLogicOffset``; kept in
memory, recomputed on open) and :meth:`ConsumeQueue.detach_expired` hands out the files
that hold only dead entries so they can be removed.  The last file is never removed.

Files are written with ``os.pwrite`` through the store's bounded file cache (no
descriptor is held per queue) and are derived data: recovery trims and rebuilds them
from the commit log, so they are fsynced only by a flush (:meth:`ConsumeQueue.take_dirty`)
or :meth:`ConsumeQueue.sync`, never per entry.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path

from ha_controller.protocol.errors import StoreError

from .commitlog import fsync_dir, pread_exact, pwrite_all, store_error
from .files import OPEN_FLAGS, FileCache

logger = logging.getLogger(__name__)

ENTRY = struct.Struct(">QIQ")
ENTRY_SIZE = ENTRY.size  # 20
_BASE_NAME = re.compile(r"^\d{20}$")
#: RocketMQ's mappedFileSizeConsumeQueue is 300,000 entries (6,000,000 bytes).
DEFAULT_FILE_ENTRIES = 300_000
#: descriptors of a queue that was given no shared cache (tests, tools)
DEFAULT_OPEN_FILES = 8

Entry = tuple[int, int, int]
"""(physical_offset, size, tag_hash)"""


class _File:
    """One file of a queue: entries ``[start, start + count)``."""

    __slots__ = ("count", "path", "start")

    def __init__(self, start: int, path: Path, count: int) -> None:
        self.start = start
        self.path = path
        self.count = count

    @property
    def end(self) -> int:
        return self.start + self.count


class ConsumeQueue:
    """The index of one (topic, queue id); not thread-safe (the store serialises access)."""

    def __init__(
        self,
        root: Path,
        topic: str,
        queue_id: int,
        files: FileCache | None = None,
        file_entries: int = DEFAULT_FILE_ENTRIES,
    ) -> None:
        if file_entries < 1:
            raise ValueError(f"file_entries must be >= 1, got {file_entries}")
        self.topic = topic
        self.queue_id = queue_id
        self._root = root
        self._dir = root / topic / str(queue_id)
        self._own_cache = files is None
        self._cache = files if files is not None else FileCache(DEFAULT_OPEN_FILES)
        self._file_entries = file_entries
        self._files: list[_File] = []
        self._base = 0  # start of the queue while it has no file
        self._min = 0  # logical minimum (see correct_min)
        self._checked_against = -1  # the commit-log start correct_min last saw
        self._dirty: set[Path] = set()

    @classmethod
    def load(
        cls,
        root: Path,
        topic: str,
        queue_id: int,
        files: FileCache | None = None,
        file_entries: int = DEFAULT_FILE_ENTRIES,
    ) -> ConsumeQueue:
        """Read an existing queue directory (sizes only: nothing stays open), dropping a
        torn partial entry at its end and files that are not contiguous with the last."""
        cq = cls(root, topic, queue_id, files, file_entries)
        try:
            found = sorted(
                (int(p.name), p, p.stat().st_size)
                for p in cq._dir.iterdir()
                if _BASE_NAME.match(p.name)
            )
            if not found:
                return cq
            start, path, size = found[-1]
            if size % ENTRY_SIZE:
                logger.warning(
                    "consume queue %s/%d: dropping %d bytes of a torn entry",
                    topic,
                    queue_id,
                    size % ENTRY_SIZE,
                )
                size -= size % ENTRY_SIZE
                os.truncate(path, size)
            kept = [_File(start, path, size // ENTRY_SIZE)]
            for start, path, size in reversed(found[:-1]):
                count, torn = divmod(size, ENTRY_SIZE)
                if torn or start + count != kept[0].start:
                    break
                kept.insert(0, _File(start, path, count))
            stale = found[: len(found) - len(kept)]
            if stale:
                logger.warning(
                    "consume queue %s/%d: %d file(s) before %s are not contiguous with it; "
                    "removing them",
                    topic,
                    queue_id,
                    len(stale),
                    kept[0].path.name,
                )
                for _, path, _ in stale:
                    path.unlink()
        except OSError as exc:
            raise store_error(exc, f"cannot open consume queue {cq._dir}") from exc
        cq._files = kept
        cq._base = cq._min = kept[0].start
        return cq

    # --- offsets -------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        """The first offset a reader may ask for (entries below point at deleted log)."""
        return self._min

    @property
    def max_offset(self) -> int:
        """The next queue offset to be written."""
        return self._files[-1].end if self._files else self._base

    @property
    def first_offset(self) -> int:
        """The first entry still on disk (at most :attr:`min_offset`)."""
        return self._files[0].start if self._files else self._base

    def __len__(self) -> int:
        """Entries on disk (dead ones below :attr:`min_offset` included)."""
        return self.max_offset - self.first_offset

    @property
    def file_count(self) -> int:
        return len(self._files)

    @property
    def disk_bytes(self) -> int:
        return len(self) * ENTRY_SIZE

    @property
    def dirty(self) -> bool:
        return bool(self._dirty)

    # --- writing --------------------------------------------------------------

    def _create_file(self, start: int) -> _File:
        created = not self._dir.exists()
        self._dir.mkdir(parents=True, exist_ok=True)
        path = self._dir / f"{start:020d}"
        fd = os.open(path, OPEN_FLAGS | os.O_CREAT | os.O_TRUNC, 0o644)
        self._cache.adopt(path, fd)
        # The checkpoint vouches for dispatched entries, so their files must not vanish.
        fsync_dir(self._dir)
        if created:
            fsync_dir(self._dir.parent)
            fsync_dir(self._root)
        f = _File(start, path, 0)
        self._files.append(f)
        return f

    def _file_for_append(self) -> _File:
        if not self._files:
            return self._create_file(self._base)
        last = self._files[-1]
        if last.count < self._file_entries:
            return last
        return self._create_file(last.end)

    def rebase(self, base: int) -> None:
        """Make an empty queue start at ``base`` (its first entry will be that offset)."""
        if len(self):
            raise StoreError(f"cannot rebase non-empty consume queue {self.topic}/{self.queue_id}")
        self._checked_against = -1
        if not self._files or base == self.first_offset:
            self._base = self._min = base
            if self._files:
                self._files[0].start = base
            return
        old = self._files
        self._files = []
        try:
            self._create_file(base)
            for f in old:
                self._cache.forget(f.path)
                self._dirty.discard(f.path)
                f.path.unlink(missing_ok=True)
        except OSError as exc:
            raise store_error(exc, f"cannot rebase consume queue {self._dir}") from exc
        self._base = self._min = base

    def append(self, physical_offset: int, size: int, tag_hash: int) -> None:
        """Write the entry for queue offset :attr:`max_offset`."""
        self.append_many(((physical_offset, size, tag_hash),))

    def append_many(self, entries: Sequence[Entry]) -> None:
        """Write ``entries`` from queue offset :attr:`max_offset` on, one write per file.

        On an error the file being written is cut back to its whole entries; entries that
        went to an earlier file stay (the caller truncates the queue to undo them)."""
        pos = 0
        while pos < len(entries):
            f: _File | None = None
            try:
                f = self._file_for_append()
                count = min(len(entries) - pos, self._file_entries - f.count)
                data = b"".join([ENTRY.pack(*entry) for entry in entries[pos : pos + count]])
                pwrite_all(self._cache.fd(f.path), data, f.count * ENTRY_SIZE)
            except OSError as exc:
                if f is not None:
                    self._undo_partial(f)
                raise store_error(
                    exc, f"cannot write consume queue {self.topic}/{self.queue_id}"
                ) from exc
            f.count += count
            self._dirty.add(f.path)
            pos += count

    def _undo_partial(self, f: _File) -> None:
        try:
            os.truncate(f.path, f.count * ENTRY_SIZE)
        except OSError:
            logger.exception("cannot undo a partial consume queue entry in %s", f.path)

    def truncate(self, queue_offset: int) -> None:
        """Keep only entries below ``queue_offset`` (the first file always stays)."""
        if not self._files or queue_offset >= self.max_offset:
            return
        target = max(queue_offset, self.first_offset)
        try:
            while len(self._files) > 1 and self._files[-1].start >= target:
                gone = self._files.pop()
                self._cache.forget(gone.path)
                self._dirty.discard(gone.path)
                gone.path.unlink(missing_ok=True)
            last = self._files[-1]
            keep = target - last.start
            if keep != last.count:
                os.ftruncate(self._cache.fd(last.path), keep * ENTRY_SIZE)
                last.count = keep
                self._dirty.add(last.path)
        except OSError as exc:
            raise store_error(exc, f"cannot truncate consume queue {self._dir}") from exc
        self._min = min(self._min, self.max_offset)

    # --- reading -----------------------------------------------------------------

    def _file_index(self, queue_offset: int) -> int:
        """Index of the file holding ``queue_offset`` (which must be on disk)."""
        lo, hi = 0, len(self._files) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._files[mid].start <= queue_offset:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _raw_entries(self, queue_offset: int, max_count: int) -> list[Entry]:
        """Up to ``max_count`` entries on disk from ``queue_offset`` (dead ones too)."""
        if not self._files or queue_offset < self.first_offset or max_count <= 0:
            return []
        out: list[Entry] = []
        idx = self._file_index(queue_offset)
        while len(out) < max_count and idx < len(self._files):
            f = self._files[idx]
            first = queue_offset - f.start
            n = min(max_count - len(out), f.count - first)
            if n > 0:
                try:
                    data = pread_exact(self._cache.fd(f.path), n * ENTRY_SIZE, first * ENTRY_SIZE)
                except OSError as exc:
                    raise store_error(exc, f"cannot read consume queue {f.path}") from exc
                out.extend(ENTRY.iter_unpack(data))
                queue_offset += n
            idx += 1
        return out

    def entries(self, queue_offset: int, max_count: int) -> list[Entry]:
        """Up to ``max_count`` entries from ``queue_offset`` (clamped to the queue)."""
        if queue_offset < self._min:
            return []
        return self._raw_entries(queue_offset, max_count)

    def entry(self, queue_offset: int) -> Entry | None:
        got = self.entries(queue_offset, 1)
        return got[0] if got else None

    def first_at_or_after(self, physical_offset: int) -> int:
        """Smallest queue offset from :attr:`min_offset` whose entry has a physical offset
        >= ``physical_offset``.

        Entries are in commit-log order, so this is a binary search; returns
        :attr:`max_offset` when there is none.
        """
        lo, hi = self._min, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            got = self._raw_entries(mid, 1)
            assert got
            if got[0][0] < physical_offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # --- retention -----------------------------------------------------------------

    def correct_min(self, commitlog_min: int) -> int:
        """Move :attr:`min_offset` past entries pointing below ``commitlog_min`` (the
        commit log's start); returns how many entries that skipped.  Cheap to call on
        every read: nothing is read unless the commit log's start moved."""
        if commitlog_min == self._checked_against:
            return 0
        self._checked_against = commitlog_min
        head = self._raw_entries(self._min, 1)
        if not head or head[0][0] >= commitlog_min:
            return 0
        before = self._min
        self._min = self.first_at_or_after(commitlog_min)
        return self._min - before

    def detach_expired(self) -> list[tuple[Path, int]]:
        """Drop the files holding only entries below :attr:`min_offset` (never the last)
        from the queue and close them; returns ``(path, bytes)`` of each for the caller
        to remove (see :func:`unlink_files`)."""
        gone: list[tuple[Path, int]] = []
        while len(self._files) > 1 and self._files[0].end <= self._min:
            f = self._files.pop(0)
            self._cache.forget(f.path)
            self._dirty.discard(f.path)
            gone.append((f.path, f.count * ENTRY_SIZE))
        return gone

    # --- durability ------------------------------------------------------------------

    def take_dirty(self) -> list[Path]:
        """The files written since the last call (or :meth:`sync`), for a flusher that
        opens and fdatasyncs each without the store lock."""
        out = sorted(self._dirty)
        self._dirty.clear()
        return out

    def sync(self) -> None:
        for path in sorted(self._dirty):
            try:
                os.fdatasync(self._cache.fd(path))
            except OSError as exc:
                raise store_error(exc, f"cannot sync consume queue {path}") from exc
        self._dirty.clear()

    def close(self) -> None:
        for f in self._files:
            self._cache.forget(f.path)
        if self._own_cache:
            self._cache.close()


def unlink_files(paths: list[Path]) -> None:
    """Remove detached consume-queue files and make that durable (no store lock)."""
    dirs: set[Path] = set()
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise store_error(exc, f"cannot remove consume queue file {path}") from exc
        dirs.add(path.parent)
    for d in sorted(dirs):
        try:
            fsync_dir(d)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise store_error(exc, f"cannot sync directory {d}") from exc
