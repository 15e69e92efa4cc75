"""A bounded cache of open store files: descriptors on demand, least recently used closed.

A store of many segments and consume queues cannot keep one descriptor per file: a
broker with thousands of queues would run into its ``ulimit -n``.  The commit log keeps
only its active segment open for good (see ``commitlog``); every other file (older
segments being read, consume-queue files being written or read) is opened on demand
through one :class:`FileCache` shared by the store and closed, least recently used
first, once more than ``capacity`` are open.

Closing a descriptor loses nothing: written bytes are in the page cache and a later
``fdatasync`` through a fresh descriptor writes them back (an unreported writeback error
is reported to the next descriptor opened, Linux >= 4.13).  The cache is not
thread-safe; the store serialises access, and a caller never keeps a descriptor across
another call into the cache (it may be closed by then): it ``os.dup``s one it must keep.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from pathlib import Path

logger = logging.getLogger(__name__)

#: What a file of the store is opened with.
OPEN_FLAGS = os.O_RDWR | os.O_CLOEXEC


class FileCache:
    """At most ``capacity`` open descriptors of store files, by path (LRU)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._fds: OrderedDict[Path, int] = OrderedDict()
        self.opens = 0
        """Files opened on a miss, for tests and the measurements in the docs."""

    def __len__(self) -> int:
        return len(self._fds)

    def __contains__(self, path: Path) -> bool:
        return path in self._fds

    def fd(self, path: Path) -> int:
        """An open descriptor of ``path`` (``O_RDWR``), valid until the next call.

        Raises OSError when the file cannot be opened (the caller maps it)."""
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            return fd
        fd = os.open(path, OPEN_FLAGS)
        self.opens += 1
        self._put(path, fd)
        return fd

    def adopt(self, path: Path, fd: int) -> None:
        """Take ownership of ``fd`` (an open descriptor of ``path``) as most recent."""
        old = self._fds.pop(path, None)
        if old is not None and old != fd:
            self._close(path, old)
        self._put(path, fd)

    def take(self, path: Path) -> int | None:
        """Remove ``path``'s descriptor from the cache and hand it over (None if closed)."""
        return self._fds.pop(path, None)

    def forget(self, path: Path) -> None:
        """Close ``path``'s descriptor if it is open (before the file is removed)."""
        fd = self._fds.pop(path, None)
        if fd is not None:
            self._close(path, fd)

    def close(self) -> None:
        """Close every descriptor; the cache stays usable."""
        while self._fds:
            path, fd = self._fds.popitem(last=False)
            self._close(path, fd)

    def _put(self, path: Path, fd: int) -> None:
        self._fds[path] = fd
        while len(self._fds) > self.capacity:
            old_path, old_fd = self._fds.popitem(last=False)
            self._close(old_path, old_fd)

    @staticmethod
    def _close(path: Path, fd: int) -> None:
        try:
            os.close(fd)
        except OSError:
            logger.warning("closing %s failed", path, exc_info=True)
