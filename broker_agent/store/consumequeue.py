"""Consume queues: per (topic, queue id) index of fixed 20-byte entries into the commit log.

Entry (big-endian): ``physical_offset u64 | size u32 | tag_hash u64``.  Entry ``i`` of a
queue holds logical (queue) offset ``base + i``.

Each queue is one file ``consumequeue/<topic>/<queue_id>/<20-digit base offset>``; the
base is the queue offset of the first entry (non-zero when a slave started replicating
in the middle of the log).  Files are written with ``os.pwrite`` and are derived data:
recovery trims and rebuilds them from the commit log, so they are fsynced only by
:meth:`ConsumeQueue.sync` (flush and close), never per entry.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from pathlib import Path

from ha_controller.protocol.errors import StoreError

from .commitlog import fsync_dir, pread_exact, pwrite_all, store_error

logger = logging.getLogger(__name__)

ENTRY = struct.Struct(">QIQ")
ENTRY_SIZE = ENTRY.size  # 20
_BASE_NAME = re.compile(r"^\d{20}$")

Entry = tuple[int, int, int]
"""(physical_offset, size, tag_hash)"""


class ConsumeQueue:
    """The index of one (topic, queue id); not thread-safe (the store serialises access)."""

    def __init__(self, root: Path, topic: str, queue_id: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self._root = root
        self._dir = root / topic / str(queue_id)
        self._path: Path | None = None
        self._fd: int | None = None
        self._base = 0
        self._count = 0
        self.dirty = False

    @classmethod
    def load(cls, root: Path, topic: str, queue_id: int) -> ConsumeQueue:
        """Open an existing queue directory, dropping a torn partial entry at its end."""
        cq = cls(root, topic, queue_id)
        names = sorted(p.name for p in cq._dir.iterdir() if _BASE_NAME.match(p.name))
        if not names:
            return cq
        if len(names) > 1:
            logger.warning(
                "consume queue %s/%d has %d files; using %s", topic, queue_id, len(names), names[-1]
            )
            for stale in names[:-1]:
                (cq._dir / stale).unlink()
        cq._path = cq._dir / names[-1]
        cq._base = int(names[-1])
        try:
            cq._fd = os.open(cq._path, os.O_RDWR | os.O_CLOEXEC)
            size = os.fstat(cq._fd).st_size
            if size % ENTRY_SIZE:
                logger.warning(
                    "consume queue %s/%d: dropping %d bytes of a torn entry",
                    topic,
                    queue_id,
                    size % ENTRY_SIZE,
                )
                size -= size % ENTRY_SIZE
                os.ftruncate(cq._fd, size)
        except OSError as exc:
            cq.close()
            raise store_error(exc, f"cannot open consume queue {cq._path}") from exc
        cq._count = size // ENTRY_SIZE
        return cq

    # --- offsets -------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        return self._base

    @property
    def max_offset(self) -> int:
        """The next queue offset to be written."""
        return self._base + self._count

    def __len__(self) -> int:
        return self._count

    # --- writing --------------------------------------------------------------

    def _open_file(self, base: int) -> int:
        created = not self._dir.exists()
        self._dir.mkdir(parents=True, exist_ok=True)
        path = self._dir / f"{base:020d}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        # The checkpoint vouches for dispatched entries, so their files must not vanish.
        fsync_dir(self._dir)
        if created:
            fsync_dir(self._dir.parent)
            fsync_dir(self._root)
        self._path, self._fd, self._base, self._count = path, fd, base, 0
        return fd

    def rebase(self, base: int) -> None:
        """Make an empty queue start at ``base`` (its first entry will be that offset)."""
        if self._count:
            raise StoreError(f"cannot rebase non-empty consume queue {self.topic}/{self.queue_id}")
        if self._fd is None or base == self._base:
            self._base = base
            return
        old = self._path
        self.close()
        try:
            self._open_file(base)
            if old is not None:
                old.unlink(missing_ok=True)
        except OSError as exc:
            raise store_error(exc, f"cannot rebase consume queue {self._dir}") from exc

    def append(self, physical_offset: int, size: int, tag_hash: int) -> None:
        """Write the entry for queue offset :attr:`max_offset`."""
        data = ENTRY.pack(physical_offset, size, tag_hash)
        try:
            fd = self._fd if self._fd is not None else self._open_file(self._base)
            pwrite_all(fd, data, self._count * ENTRY_SIZE)
        except OSError as exc:
            self._undo_partial()
            raise store_error(
                exc, f"cannot write consume queue {self.topic}/{self.queue_id}"
            ) from exc
        self._count += 1
        self.dirty = True

    def _undo_partial(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, self._count * ENTRY_SIZE)
        except OSError:
            logger.exception("cannot undo a partial consume queue entry in %s", self._path)

    def truncate(self, queue_offset: int) -> None:
        """Keep only entries below ``queue_offset``."""
        keep = max(0, min(queue_offset - self._base, self._count))
        if keep == self._count or self._fd is None:
            return
        try:
            os.ftruncate(self._fd, keep * ENTRY_SIZE)
        except OSError as exc:
            raise store_error(exc, f"cannot truncate consume queue {self._path}") from exc
        self._count = keep
        self.dirty = True

    # --- reading -----------------------------------------------------------------

    def entries(self, queue_offset: int, max_count: int) -> list[Entry]:
        """Up to ``max_count`` entries from ``queue_offset`` (clamped to the queue)."""
        first = queue_offset - self._base
        n = min(max_count, self._count - first)
        if first < 0 or n <= 0 or self._fd is None:
            return []
        try:
            data = pread_exact(self._fd, n * ENTRY_SIZE, first * ENTRY_SIZE)
        except OSError as exc:
            raise store_error(exc, f"cannot read consume queue {self._path}") from exc
        return list(ENTRY.iter_unpack(data))

    def entry(self, queue_offset: int) -> Entry | None:
        got = self.entries(queue_offset, 1)
        return got[0] if got else None

    def first_at_or_after(self, physical_offset: int) -> int:
        """Smallest queue offset whose entry has a physical offset >= ``physical_offset``.

        Entries are in commit-log order, so this is a binary search; returns
        :attr:`max_offset` when there is none.
        """
        lo, hi = self._base, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            got = self.entry(mid)
            assert got is not None
            if got[0] < physical_offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # --- durability ------------------------------------------------------------------

    def dup_fd(self) -> int | None:
        return None if self._fd is None else os.dup(self._fd)

    def sync(self) -> None:
        if self._fd is not None and self.dirty:
            try:
                os.fdatasync(self._fd)
            except OSError as exc:
                raise store_error(exc, f"cannot sync consume queue {self._path}") from exc
        self.dirty = False

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                logger.warning("closing consume queue %s failed", self._path, exc_info=True)
            self._fd = None
