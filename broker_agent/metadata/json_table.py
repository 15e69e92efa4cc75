"""A metadata table kept in one JSON file: read once at start, checked, written whole
when it changed.

- **Atomic write.**  :func:`write_json_atomic`: temp file, fsync, rename, fsync the
  directory, so a crash leaves the old file or the new one.  A write that fails (a full
  disk) leaves the table marked changed: the next :meth:`JsonTable.persist` tries again.
- **Checked read.**  The file's last key is a CRC-32 of the rest (``"checksum"``); a read
  checks the JSON, the checksum and the table's shape, so a torn, truncated, bit-flipped
  or foreign file is *unreadable*, never half taken.  A file without the key (written
  before it existed) is read unchecked.
- **Never a traceback.**  What a broker does with an unreadable file is the table's
  :class:`Recovery`; either way it is one line naming the file.

Every table's version starts at :func:`oldest` when it has to start over, so that the
table of any replica outranks it in a forward sync or pre-online (``.versioned``).
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import re
import threading
import zlib
from pathlib import Path
from typing import Any, ClassVar

from ha_controller.dataversion import DataVersion
from ha_controller.protocol.errors import StoreError

__all__ = [
    "JsonTable",
    "Recovery",
    "TableUnreadable",
    "oldest",
    "read_json_checked",
    "write_json_atomic",
]

log = logging.getLogger(__name__)

#: The checksum key ends the file: ``..., "checksum": "1a2b3c4d"}``.
_CHECKSUM = re.compile(r'(?:, )?"checksum": "([0-9a-f]{8})"\}\s*\Z')


def oldest() -> DataVersion:
    """The version of a table that has never moved: older than any replica's."""
    return DataVersion(0, 0, 0)


class TableUnreadable(ValueError):
    """A table file that is not what was written (its text says why)."""


def _dumps(data: dict[str, Any]) -> str:
    text = json.dumps(data)
    crc = zlib.crc32(text.encode())
    return f'{text[:-1]}{", " if data else ""}"checksum": "{crc:08x}"}}'


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` with its checksum durably: temp file, fsync, rename, fsync the
    directory."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.write(_dumps(data))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_json_checked(path: Path) -> dict[str, Any]:
    """The object :func:`write_json_atomic` wrote at ``path``, checksum removed.

    FileNotFoundError when there is none, another OSError when it cannot be read;
    TableUnreadable when it is not JSON, not an object, or its checksum does not match."""
    raw = path.read_bytes()  # OSError: not the file's fault (permissions, I/O)
    try:
        text = raw.decode()
        data = json.loads(text)
    except ValueError as exc:  # UnicodeDecodeError too
        raise TableUnreadable(f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise TableUnreadable(f"a JSON {type(data).__name__}, not an object")
    m = _CHECKSUM.search(text)
    if m is not None:
        body = text[: m.start()] + "}"
        if f"{zlib.crc32(body.encode()):08x}" != m[1]:
            raise TableUnreadable("checksum mismatch (the file was damaged)")
        del data["checksum"]
    return data


def _reason(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"KeyError: missing key {exc}"
    if isinstance(exc, TableUnreadable):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class Recovery(enum.Enum):
    """What a broker does with a table file it cannot read."""

    #: The truth is elsewhere too: the commit log's records (the owner rebuilds the
    #: table from them), or a replica whose table outranks ours.  The file is set aside
    #: (``<file>.corrupt``) and the table starts over at the :func:`oldest` version.
    REBUILD = "rebuild"
    #: Only a replica has it.  With replicas the file is set aside, the table starts
    #: empty at the oldest version and *awaits a replica* (a marker file beside it, so a
    #: restart still knows): the broker takes it from a slave (a master in pre-online)
    #: or from its master (a slave) before it serves.  Without replicas it is refused:
    #: StoreError, one line naming the file and the repair, nothing moved.
    REPLICA = "replica"


class JsonTable:
    """Base of the persisted tables: a subclass says what its file holds
    (:meth:`payload`), how to take it back (:meth:`restore`, which raises KeyError,
    ValueError, TypeError or AttributeError for a wrong shape) and how to start over
    (:meth:`start_over`), and marks itself changed (``_dirty``) when it is."""

    #: for the one line: "consumer offset table", ...
    what: ClassVar[str] = "table"
    recovery: ClassVar[Recovery] = Recovery.REBUILD
    #: REBUILD: where the table comes back from (the line that sets a file aside)
    rebuilt_from: ClassVar[str] = "starting over"
    #: REPLICA without replicas: how an operator repairs it (the refusal)
    repair: ClassVar[str] = ""
    #: Write the table at once when there is no file yet: its initial version then
    #: survives a restart before the first change (a master restarted before its
    #: first update must not invent a newer timestamp than its slaves hold).
    persist_when_missing: ClassVar[bool] = False

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._dirty = False
        #: the file could not be read at this start and was set aside
        self.lost = False
        #: (REPLICA) started over and not taken from a replica yet
        self.awaiting_replica = False
        # payloads taken and the last one written (a later write never loses to an
        # earlier one); one write of the file at a time
        self._taken = 0
        self._written = 0
        self._file_lock = threading.Lock()
        self._persisting = asyncio.Lock()
        # persist_durably: changes asked to be durable, those written, the write
        self._durable_asked = 0
        self._durable_done = 0
        self._durable_write: asyncio.Task[None] | None = None

    def payload(self) -> dict[str, Any]:
        """What the file holds (JSON-serialisable)."""
        raise NotImplementedError

    def restore(self, data: Any) -> None:
        """Take back what :meth:`payload` wrote."""
        raise NotImplementedError

    def start_over(self) -> None:
        """An empty table at the :func:`oldest` version (the file was unreadable)."""
        raise NotImplementedError

    # ---- read ------------------------------------------------------------------------

    @property
    def _marker(self) -> Path:
        assert self.path is not None
        return self.path.with_name(self.path.name + ".awaiting-replica")

    def load(self, *, replicas: bool = False) -> None:
        """Read the file (see :class:`Recovery`; ``replicas``: this broker has replicas
        it takes a REPLICA table from before it serves)."""
        if self.path is None:
            return
        if self.recovery is Recovery.REPLICA and self._marker.exists():
            if not replicas:
                self._refuse(
                    f"set aside as {self.path.name}.corrupt and not taken from a replica yet"
                )
            self.awaiting_replica = True
        try:
            self.restore(read_json_checked(self.path))
        except FileNotFoundError:
            if self.persist_when_missing:
                self._dirty = True
                self.persist()
        except (TableUnreadable, KeyError, ValueError, TypeError, AttributeError) as exc:
            self._unreadable(_reason(exc), replicas)
        except OSError as exc:  # the file may be fine: nothing is set aside
            raise StoreError(f"cannot read the {self.what} {self.path}: {exc}") from exc

    def written_ms(self) -> int | None:
        """When the file was last written (its mtime, ms), None without one."""
        if self.path is None:
            return None
        try:
            return int(self.path.stat().st_mtime * 1000)
        except OSError:
            return None

    def _refuse(self, why: str) -> None:
        raise StoreError(f"corrupt {self.what} {self.path} ({why}); {self.repair}")

    def _unreadable(self, why: str, replicas: bool) -> None:
        assert self.path is not None
        if self.recovery is Recovery.REPLICA and not replicas:
            self._refuse(why)
        aside = self.path.with_name(self.path.name + ".corrupt")
        try:
            os.replace(self.path, aside)
            if self.recovery is Recovery.REPLICA:
                self._marker.touch()
        except OSError as exc:
            raise StoreError(
                f"corrupt {self.what} {self.path} ({why}) cannot be set aside ({exc}); "
                "move it away by hand"
            ) from exc
        self.start_over()
        self.lost = True
        if self.recovery is Recovery.REPLICA:
            self.awaiting_replica = True
            then = "taking the group's table from a replica before serving"
        else:
            self._dirty = True
            then = self.rebuilt_from
        log.error(
            "%s %s cannot be read (%s): set aside as %s; %s",
            self.what,
            self.path,
            why,
            aside.name,
            then,
        )

    def taken_from_replica(self) -> None:
        """A replica's table was taken (or the replica was asked and has none newer):
        the table is the group's again; written, then the marker goes."""
        if not self.awaiting_replica:
            return
        self._dirty = True
        self.persist()
        self._marker.unlink(missing_ok=True)
        self.awaiting_replica = False
        log.info("%s %s taken from a replica", self.what, self.path)

    # ---- write -----------------------------------------------------------------------

    def mark_changed(self) -> None:
        """The owner changed the table: the next :meth:`persist` writes it."""
        self._dirty = True

    def take_payload(self) -> dict[str, Any] | None:
        """The file's content when the table changed since the last call (it counts as
        written from now on), else None.  Built on the caller's thread: the table keeps
        changing on the event loop, the write may run on another (:meth:`persist_async`)."""
        if self.path is None or not self._dirty:
            return None
        self._dirty = False
        self._taken += 1
        return self.payload()

    def _write(self, payload: dict[str, Any], taken: int) -> None:
        """Write the payload taken ``taken``-th, unless a later one is on disk already (a
        write on the event loop may overtake one on a worker thread)."""
        assert self.path is not None
        with self._file_lock:
            if taken < self._written:
                return
            try:
                write_json_atomic(self.path, payload)
            except OSError:
                self._dirty = True
                raise
            self._written = taken

    def persist(self) -> None:
        """Write the table when it changed since the last write."""
        payload = self.take_payload()
        if payload is not None:
            self._write(payload, self._taken)

    async def persist_async(self) -> None:
        """:meth:`persist`, the payload built here and written on a worker thread."""
        async with self._persisting:
            payload = self.take_payload()
            if payload is not None:
                await asyncio.to_thread(self._write, payload, self._taken)

    async def persist_durably(self) -> None:
        """Return once every change made to the table before the call is on disk: the
        acknowledgement of a change that ``flush_mode = "sync"`` promises survives a
        power loss.  Group commit: the callers that arrive while a write is on its way
        share the next one, so there is at most one write in flight and one waiting,
        however many changes are made meanwhile.  OSError when the write fails (the
        table stays changed and the next write tries again)."""
        if self.path is None:
            return
        self._durable_asked += 1
        ticket = self._durable_asked
        while self._durable_done < ticket:
            write = self._durable_write
            if write is None:
                write = asyncio.get_running_loop().create_task(self._write_durably())
                self._durable_write = write
            await asyncio.shield(write)

    async def _write_durably(self) -> None:
        try:
            covers = self._durable_asked  # every change asked for so far is in the payload
            await self.persist_async()
            self._durable_done = max(self._durable_done, covers)
        finally:
            self._durable_write = None
