"""A table kept in one JSON file: read once at start, written whole when it changed.

The write is durable and atomic (:func:`write_json_atomic`), so a crash leaves the old
file or the new one.  A write that fails (a full disk) leaves the table marked
changed: the next :meth:`JsonTable.persist` tries again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar

__all__ = ["JsonTable", "write_json_atomic"]


def write_json_atomic(path: Path, data: object) -> None:
    """Write JSON durably: temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class JsonTable:
    """Base of the persisted tables: a subclass says what its file holds
    (:meth:`payload`) and how to take it back (:meth:`restore`), and marks itself
    changed (``_dirty``) when it is."""

    #: Write the table at once when there is no file yet: its initial version then
    #: survives a restart before the first change (a master restarted before its
    #: first update must not invent a newer timestamp than its slaves hold).
    persist_when_missing: ClassVar[bool] = False

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._dirty = False

    def payload(self) -> object:
        """What the file holds (JSON-serialisable)."""
        raise NotImplementedError

    def restore(self, data: Any) -> None:
        """Take back what :meth:`payload` wrote."""
        raise NotImplementedError

    def load(self) -> None:
        if self.path is None:
            return
        if not self.path.exists():
            if self.persist_when_missing:
                self._dirty = True
                self.persist()
            return
        self.restore(json.loads(self.path.read_text()))

    def persist(self) -> None:
        if self.path is None or not self._dirty:
            return
        self._dirty = False
        try:
            write_json_atomic(self.path, self.payload())
        except OSError:
            self._dirty = True
            raise
