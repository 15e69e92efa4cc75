"""The index of message keys and unique keys (RocketMQ's ``IndexService``, simpler).

Every record that carries ``KEYS`` (space-separated, as RocketMQ splits them) or
``UNIQ_KEY`` (the message id the client sees) gets one entry per key: a 32-bit hash of
``topic#key`` (a unique key is hashed without its topic, ``#uniq#id``, so that an id is
found without knowing the topic), the record's commit-log offset and its store time.

Why not RocketMQ's file layout (hash slots + linked entries in memory-mapped files): its
point is to look keys up without holding them in memory, at 20 bytes a slot.  In Python
a lookup through mmapped linked lists costs a struct unpack per hop; a dict of hash ->
offsets is the idiom that is cheap on the write path (one dict update and 28 bytes
appended per key) and answers a lookup at once.  The price is memory, about 100 bytes
per entry, which ``max_entries`` bounds.  The files are append-only and exist only so
that a restart does not re-read the whole commit log:

    index/<20 digits>   the entries of the commit-log segment starting there
                        (hash u32 | offset u64 | store time u64 | crc32 u32, big-endian)
    index/point         the commit-log offset indexed up to when the files were synced,
                        and how many entries the files held then (a missing file shows)

Lookups hash: the caller (the store) reads each candidate record and keeps only those
that really carry the key (collisions, deleted or cut-back records).

Bounds: retention deletes the files of deleted segments and drops their entries from
the dict (:meth:`drop_below`); a cut back drops the entries from its offset on
(:meth:`truncate`).  Past ``max_entries`` new keys are not indexed and counted in
:attr:`overflow` (logged once): the oldest entries go only with their segments, so what
is indexed is always a contiguous stretch of the log.

Recovery (:meth:`load`, then :meth:`add` from :meth:`resume_offset` on): the files are
read back; a torn last entry is cut off; any entry failing its CRC, out of order, or a
file that cannot be read makes the whole index start again from the commit log's start
(one log line).  The entries of the last indexed record are dropped and that record is
indexed again, so a record is never half-indexed.  Not thread-safe: the store's lock is
the caller's.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

__all__ = ["ENTRY", "KeyIndex", "key_hash", "uniq_hash"]

log = logging.getLogger(__name__)

#: hash u32 | commit-log offset u64 | store time u64 | crc32 of the first 20 bytes u32
ENTRY = struct.Struct(">IQQI")
_BODY = struct.Struct(">IQQ")
_TAIL = struct.Struct(">QQ")
_crc32 = zlib.crc32
_POINT = struct.Struct(">QQI")  # offset, entries in the files then, crc32 of both
_NAME_DIGITS = 20
#: what :meth:`KeyIndex.commit_some` gathers before it writes (about 13,000 entries)
WRITE_BYTES = 256 * 1024


def key_hash(topic: str, key: str) -> int:
    """The hash a message key is indexed under (RocketMQ's ``topic#key``)."""
    return zlib.crc32(f"{topic}#{key}".encode())


def uniq_hash(uniq_key: str) -> int:
    """The hash a unique key (message id) is indexed under, whatever its topic."""
    return zlib.crc32(f"#uniq#{uniq_key}".encode())


def _entry(h: int, offset: int, store_ts: int) -> bytes:
    body = _BODY.pack(h, offset, store_ts)
    return body + zlib.crc32(body).to_bytes(4, "big")


class KeyIndex:
    """Hash -> commit-log offsets of the records carrying it, with its files."""

    def __init__(self, root: Path, segment_size: int, max_entries: int) -> None:
        self.root = root
        self.segment_size = segment_size
        self.max_entries = max_entries
        #: hash -> offset, or a list of offsets (ascending) when several records share it
        self._map: dict[int, int | list[int]] = {}
        #: file start -> entries in it (oldest file first)
        self._files: dict[int, int] = {}
        self.entries = 0
        #: keys not indexed because the index held ``max_entries``
        self.overflow = 0
        #: the commit-log offset indexed up to (the end of the last record seen)
        self.indexed_to = 0
        self._buf = bytearray()
        self._buf_file = -1
        self._fd: int | None = None
        self._fd_file = -1
        self._failed: str | None = None
        self._point = 0

    # --- writing ------------------------------------------------------------------------

    def add(
        self,
        topic: str,
        keys: str | None,
        uniq_key: str | None,
        offset: int,
        size: int,
        store_ts: int,
    ) -> int:
        """Index one record (skipped when it lies below :attr:`indexed_to`: recovery
        and a reput may see it again); returns the entries added.  Call :meth:`commit`
        to write them."""
        if offset < self.indexed_to:
            return 0
        self.indexed_to = offset + size
        if self._failed is not None or not (keys or uniq_key):
            return 0
        if keys:
            prefix = topic + "#"
            hashes = [_crc32((prefix + k).encode()) for k in keys.split()]
        else:
            hashes = []
        if uniq_key:
            hashes.append(_crc32(("#uniq#" + uniq_key).encode()))
        if self.entries + len(hashes) > self.max_entries:
            if not self.overflow:
                log.warning(
                    "key index %s holds %d entries (key_index_max_entries); newer keys are "
                    "not indexed until retention deletes old segments",
                    self.root,
                    self.entries,
                )
            self.overflow += len(hashes)
            return 0
        start = offset - offset % self.segment_size
        if start != self._buf_file:
            self.commit()
            self._buf_file = start
        m = self._map
        buf = self._buf
        tail = _TAIL.pack(offset, store_ts)
        for h in hashes:
            old = m.get(h)
            if old is None:
                m[h] = offset
            elif isinstance(old, int):
                if old != offset:
                    m[h] = [old, offset]
            elif old[-1] != offset:
                old.append(offset)
            body = h.to_bytes(4, "big") + tail
            buf += body
            buf += _crc32(body).to_bytes(4, "big")
        self._files[start] = self._files.get(start, 0) + len(hashes)
        self.entries += len(hashes)
        return len(hashes)

    def commit_some(self) -> None:
        """:meth:`commit` once :meth:`add` gathered :data:`WRITE_BYTES`: a put does not
        pay a write of its own.  What waits is written by the store's next flush
        (:meth:`sync_handle`), a cut-back or a close, and lookups never read the files;
        a crash loses only entries past the durable point, which recovery indexes
        again from the log."""
        if len(self._buf) >= WRITE_BYTES:
            self.commit()

    def commit(self) -> None:
        """Write what :meth:`add` gathered (one write); an I/O error stops the index
        (logged, the messages are stored all the same; a restart rebuilds it)."""
        if not self._buf or self._failed is not None:
            self._buf.clear()
            return
        try:
            fd = self._open(self._buf_file)
            os.write(fd, self._buf)
        except OSError as exc:
            self._failed = str(exc)
            log.error("key index %s: write failed, no more keys indexed: %s", self.root, exc)
        self._buf.clear()

    def _path(self, start: int) -> Path:
        return self.root / f"{start:0{_NAME_DIGITS}d}"

    def _open(self, start: int) -> int:
        if self._fd is not None and self._fd_file == start:
            return self._fd
        if self._fd is not None:
            os.fdatasync(self._fd)  # a file left behind is durable before the point moves
            os.close(self._fd)
            self._fd = None
        self.root.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(
            self._path(start), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644
        )
        self._fd_file = start
        return self._fd

    def sync_handle(self) -> tuple[int | None, int]:
        """(a duplicate descriptor of the file being written, or None; the point it
        covers), for the store's flush to fdatasync outside its lock."""
        self.commit()
        if self._fd is None:
            return None, self.indexed_to
        try:
            return os.dup(self._fd), self.indexed_to
        except OSError as exc:
            log.warning("key index %s: cannot sync: %s", self.root, exc)
            return None, 0

    def write_point(self, offset: int) -> None:
        """Record that the files hold every entry below ``offset`` durably."""
        if self._failed is not None:
            return
        self._point = offset
        body = _POINT.pack(offset, sum(self._files.values()), 0)[:16]
        tmp = self.root / "point.tmp"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(body + zlib.crc32(body).to_bytes(4, "big"))
            tmp.replace(self.root / "point")
        except OSError as exc:
            log.warning("key index %s: cannot write its point: %s", self.root, exc)

    def close(self) -> None:
        """Sync, record the point and close; idempotent."""
        fd, point = self.sync_handle()
        try:
            if fd is not None:
                os.fdatasync(fd)
            self.write_point(point)
        except OSError as exc:
            log.warning("key index %s: final sync failed: %s", self.root, exc)
        finally:
            if fd is not None:
                os.close(fd)
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    # --- reading ------------------------------------------------------------------------

    def lookup(self, h: int) -> list[int]:
        """Commit-log offsets of the records indexed under ``h``, oldest first."""
        found = self._map.get(h)
        if found is None:
            return []
        return [found] if isinstance(found, int) else list(found)

    # --- retention, cut back ------------------------------------------------------------

    def drop_below(self, min_offset: int) -> int:
        """Forget the entries pointing below ``min_offset`` (retention deleted their
        records) and delete the files holding only such entries; returns entries
        dropped."""
        gone = [s for s in self._files if s + self.segment_size <= min_offset]
        if not gone and not any(s < min_offset for s in self._files):
            return 0
        dropped = self._sweep(lambda off: off >= min_offset)
        for start in gone:
            del self._files[start]
            self._unlink(start)
        if gone:
            self.write_point(self._point)  # the entry count it holds went down
        return dropped

    def truncate(self, offset: int) -> int:
        """Forget the entries at or after ``offset`` (the log was cut back there) and
        cut their files; returns entries dropped."""
        self.commit()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        dropped = self._sweep(lambda off: off < offset)
        for start in [s for s in self._files if s >= offset - offset % self.segment_size]:
            kept = self._cut_file(start, offset)
            if kept:
                self._files[start] = kept
            else:
                del self._files[start]
        self.indexed_to = min(self.indexed_to, offset)
        self.write_point(self.indexed_to)
        return dropped

    def _sweep(self, keep: Callable[[int], bool]) -> int:
        """Keep the offsets ``keep`` says; returns how many entries went."""
        before = self.entries
        m = self._map
        count = 0
        for h in list(m):
            v = m[h]
            if isinstance(v, int):
                if keep(v):
                    count += 1
                else:
                    del m[h]
            else:
                kept = [o for o in v if keep(o)]
                if not kept:
                    del m[h]
                elif len(kept) == 1:
                    m[h] = kept[0]
                else:
                    m[h] = kept
                count += len(kept)
        self.entries = count
        return max(0, before - count)

    def _unlink(self, start: int) -> None:
        if self._fd is not None and self._fd_file == start:
            os.close(self._fd)
            self._fd = None
        try:
            self._path(start).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("key index %s: cannot delete %s: %s", self.root, self._path(start), exc)

    def _cut_file(self, start: int, offset: int) -> int:
        """Cut the file at its first entry at or after ``offset``; entries kept."""
        path = self._path(start)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return 0
        n = len(data) // ENTRY.size
        keep = 0
        while keep < n and ENTRY.unpack_from(data, keep * ENTRY.size)[1] < offset:
            keep += 1
        try:
            if keep:
                os.truncate(path, keep * ENTRY.size)
            else:
                path.unlink()
        except OSError as exc:
            log.warning("key index %s: cannot cut %s: %s", self.root, path, exc)
        return keep

    # --- recovery -----------------------------------------------------------------------

    def load(self, log_min: int, log_max: int) -> int:
        """Read the files back; returns the commit-log offset to index again from (a
        record boundary).  Never raises for what it finds: a bad index is rebuilt."""
        try:
            resume = self._load(log_min, log_max)
        except (OSError, ValueError) as exc:
            log.warning(
                "key index %s: %s; rebuilding it from the commit log at %d",
                self.root,
                exc,
                log_min,
            )
            self._reset()
            resume = log_min
        self.indexed_to = resume
        # an older point could lie past a log that recovery truncated and that grows again
        self.write_point(resume)
        return resume

    def _reset(self) -> None:
        self._map.clear()
        self._files.clear()
        self.entries = 0
        try:
            for p in self.root.iterdir():
                p.unlink()
        except FileNotFoundError:
            pass

    def _load(self, log_min: int, log_max: int) -> int:
        if not self.root.exists():
            if log_max > log_min:
                log.info("key index %s: missing; building it from the commit log", self.root)
            return log_min
        names = sorted(p.name for p in self.root.iterdir() if p.name.isdigit())
        starts = [int(n) for n in names]
        saved = self._read_point()
        on_disk = 0
        last = -1
        last_at: tuple[int, int] | None = None  # (file start, byte position) of last record
        for i, start in enumerate(starts):
            path = self._path(start)
            data = path.read_bytes()
            whole = len(data) - len(data) % ENTRY.size
            if whole != len(data):
                if i != len(starts) - 1:
                    raise ValueError(f"{path.name} ends in a torn entry and is not the last file")
                log.warning("key index %s: cutting a torn entry off %s", self.root, path.name)
                os.truncate(path, whole)
            on_disk += whole // ENTRY.size
            count = 0
            for pos in range(0, whole, ENTRY.size):
                h, off, _ts, crc = ENTRY.unpack_from(data, pos)
                if zlib.crc32(data[pos : pos + _BODY.size]) != crc:
                    raise ValueError(f"entry {pos // ENTRY.size} of {path.name} fails its CRC")
                if off < last or not start <= off < start + self.segment_size:
                    raise ValueError(f"entry {pos // ENTRY.size} of {path.name} is out of order")
                if off >= log_max:
                    break  # the log was truncated below it
                if off != last:
                    last_at = (start, pos)
                last = off
                if off >= log_min:
                    old = self._map.get(h)
                    if old is None:
                        self._map[h] = off
                    elif isinstance(old, int):
                        if old != off:
                            self._map[h] = [old, off]
                    elif old[-1] != off:
                        old.append(off)
                count += 1
            if count * ENTRY.size != whole:
                os.truncate(path, count * ENTRY.size)
            if count:
                self._files[start] = count
            else:
                path.unlink()
        point = None
        if saved is not None:
            if on_disk < saved[1]:
                raise ValueError(f"its files hold {on_disk} entries, {saved[1]} when last synced")
            point = saved[0]
        if point is not None and last < point <= log_max:
            resume = point  # every entry below it was synced: the last record's too
        elif last_at is None:
            resume = log_min
        else:
            # the last record's entries go and it is indexed again: never half-indexed
            start, pos = last_at
            dropped = self._files[start] - pos // ENTRY.size
            self._sweep(lambda off: off < last)
            os.truncate(self._path(start), pos)
            self._files[start] -= dropped
            if not self._files[start]:
                del self._files[start]
                self._path(start).unlink()
            resume = last
        resume = max(resume, log_min)
        self.drop_below(log_min)
        self.entries = sum(self._files.values())
        return resume

    def _read_point(self) -> tuple[int, int] | None:
        try:
            raw = (self.root / "point").read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) != _POINT.size:
            return None
        offset, entries, crc = _POINT.unpack(raw)
        return (offset, entries) if zlib.crc32(raw[:16]) == crc else None

    def stats(self) -> dict[str, int]:
        return {"entries": self.entries, "overflow": self.overflow, "files": len(self._files)}
