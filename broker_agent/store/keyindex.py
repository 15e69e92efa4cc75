"""The index of message keys and unique keys (RocketMQ's ``IndexService``, simpler).

Every record that carries ``KEYS`` (space-separated, as RocketMQ splits them) or
``UNIQ_KEY`` (the message id the client sees) gets one entry per key: a 32-bit hash of
``topic#key`` (a unique key is hashed without its topic, ``#uniq#id``, so that an id is
found without knowing the topic) and the record's commit-log offset.

In memory the entries are two arrays in log order, the hashes (4 bytes each) and the
offsets (8 bytes each): indexing a record is two ``array.extend`` calls after its
hashes, and 12 bytes an entry.  A lookup scans the hashes (``bytes.find`` of the 4-byte
hash, in C: about 2 ms per million entries); lookups are admin requests
(QUERY_MESSAGE, VIEW_MESSAGE_BY_ID), the write path is every message.  Until
2026-12-08 the entries were a dict of hash -> offsets: about 100 bytes an entry, and
its update plus a CRC'd 28-byte record per entry made indexing a message with three
keys cost 2.4 us, 11-14 % of produce on two cores (CHANGELOG.md, "Query by key").
Why not RocketMQ's file layout (hash slots + linked entries in memory-mapped files):
its point is to look keys up without holding them in memory; in Python each hop costs
a struct unpack, and 12 bytes an entry in memory is cheap.

The files are append-only and exist only so that a restart does not re-read the whole
commit log:

    index/<20 digits>   chunks holding the entries of the commit-log segment starting
                        there, one chunk per :meth:`commit` (the store's flush, or
                        :data:`WRITE_BYTES` gathered); a chunk is, little-endian:
                        mark u32 | entries n u32 | covered u64 | crc32 u32,
                        then n hashes u32, then n offsets u64.  The CRC covers the
                        first 16 bytes and the entries; ``covered``: every record below
                        it has its entries in this chunk or an earlier one (a chunk
                        holds whole records: it is written between two records)
    index/point         the commit-log offset indexed up to when the files were synced,
                        and how many entries the files held then (a missing file shows)

Lookups hash: the caller (the store) reads each candidate record and keeps only those
that really carry the key (collisions, deleted or cut-back records).

Bounds: retention deletes the files of deleted segments and drops their entries
(:meth:`drop_below`, the arrays' head); a cut back drops the entries from its offset on
(:meth:`truncate`, their tail).  Past ``max_entries`` new keys are not indexed and
counted in :attr:`overflow` (logged once): the oldest entries go only with their
segments, so what is indexed is always a contiguous stretch of the log.

Recovery (:meth:`load`, then :meth:`add` from :meth:`resume_offset` on): the files are
read back; a torn last chunk is cut off and indexing resumes where the chunks before it
cover; a chunk failing its CRC, out of order, or a file that cannot be read makes the
whole index start again from the commit log's start (one log line; so do the files of
the earlier layout).  When the log was cut back inside what a chunk covers, the entries
of the last record kept go and that record is indexed again, so a record is never
half-indexed.  Not thread-safe: the store's lock is the caller's.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = ["CHUNK_HEAD", "ENTRY_SIZE", "KeyIndex", "Record", "key_hash", "uniq_hash"]

log = logging.getLogger(__name__)

_crc32 = zlib.crc32
#: mark | entries | covered (the commit-log offset the chunk indexes up to) | crc32
CHUNK_HEAD = struct.Struct("<IIQI")
_HEAD_BODY = struct.Struct("<IIQ")
_MARK = 0x3158444B  # b"KDX1"
#: bytes an entry takes in a file (and in memory): hash u32 + offset u64
ENTRY_SIZE = 12
_U32 = "I" if array("I").itemsize == 4 else "L"
_SWAP = sys.byteorder != "little"  # the files are little-endian, the arrays native
_POINT = struct.Struct(">QQI")  # offset, entries in the files then, crc32 of both
_NAME_DIGITS = 20
#: what :meth:`KeyIndex.commit_some` gathers before it writes (about 21,800 entries)
WRITE_BYTES = 256 * 1024
_WRITE_ENTRIES = WRITE_BYTES // ENTRY_SIZE
_UNIQ_SEED = _crc32(b"#uniq#")
#: topics whose hash prefix is kept (then the cache starts again)
_SEEDS_MAX = 4096
#: what :meth:`KeyIndex.add_many` takes of a record: topic, KEYS, UNIQ_KEY, offset, size
Record = tuple[str, str | None, str | None, int, int]


def key_hash(topic: str, key: str) -> int:
    """The hash a message key is indexed under (RocketMQ's ``topic#key``)."""
    return zlib.crc32(f"{topic}#{key}".encode())


def uniq_hash(uniq_key: str) -> int:
    """The hash a unique key (message id) is indexed under, whatever its topic."""
    return zlib.crc32(f"#uniq#{uniq_key}".encode())


def _chunk(hashes: array[int], offsets: array[int], covered: int) -> bytes:
    """One chunk of the files (``hashes`` and ``offsets`` are copies: swapped here on a
    big-endian host)."""
    if _SWAP:
        hashes.byteswap()
        offsets.byteswap()
    body = hashes.tobytes() + offsets.tobytes()
    head = _HEAD_BODY.pack(_MARK, len(hashes), covered)
    return head + _crc32(body, _crc32(head)).to_bytes(4, "little") + body


class KeyIndex:
    """Hashes and commit-log offsets of the records carrying them, with their files."""

    def __init__(self, root: Path, segment_size: int, max_entries: int) -> None:
        self.root = root
        self.segment_size = segment_size
        self.max_entries = max_entries
        #: the entries in log order: the hash of each and its record's offset
        self._hashes: array[int] = array(_U32)
        self._offsets: array[int] = array("Q")
        #: entries at the arrays' start that are in the files (or given up on)
        self._written = 0
        #: file start -> entries in that file (oldest file first)
        self._files: dict[int, int] = {}
        #: keys not indexed because the index held ``max_entries``
        self.overflow = 0
        #: the commit-log offset indexed up to (the end of the last record seen)
        self.indexed_to = 0
        #: the segment the entries not written yet belong to: [start, end)
        self._file = -1
        self._file_end = -1
        self._fd: int | None = None
        self._fd_file = -1
        self._failed: str | None = None
        self._point = 0
        #: topic -> crc32 of ``topic#``, which each of its keys' hash continues
        self._seeds: dict[str, int] = {}

    @property
    def entries(self) -> int:
        """Keys and unique keys indexed now."""
        return len(self._hashes)

    # --- writing ------------------------------------------------------------------------

    def add(
        self, topic: str, keys: str | None, uniq_key: str | None, offset: int, size: int
    ) -> int:
        """Index one record (skipped when it lies below :attr:`indexed_to`: recovery
        and a reput may see it again); returns the entries added.  Call :meth:`commit`
        to write them."""
        return self.add_many(((topic, keys, uniq_key, offset, size),))

    def add_many(self, records: Iterable[Record]) -> int:
        """:meth:`add` of each (topic, keys, unique key, offset, size), in log order:
        what a put batch or a reput indexes, in one call.  The hot path of the index:
        a key costs one encode and one ``crc32`` (continuing that of ``topic#``, so no
        string is built) and two list appends; the batch goes into the arrays at once."""
        indexed_to = self.indexed_to
        if self._failed is not None:
            for _, _, _, offset, size in records:
                indexed_to = max(indexed_to, offset + size)
            self.indexed_to = indexed_to
            return 0
        seeds = self._seeds
        room = self.max_entries - len(self._hashes)
        added = 0
        hashes: list[int] = []
        offsets: list[int] = []
        put_hash = hashes.append
        put_offset = offsets.append
        seg = self.segment_size
        file, file_end = self._file, self._file_end
        for topic, keys, uniq_key, offset, size in records:
            if offset < indexed_to:
                continue
            if not (keys or uniq_key):
                indexed_to = offset + size
                continue
            if not file <= offset < file_end:
                # what waits is of the segment before, covered up to this record
                self._hashes.fromlist(hashes)
                self._offsets.fromlist(offsets)
                hashes.clear()
                offsets.clear()
                self.indexed_to = indexed_to
                self.commit()
                file = self._file = offset - offset % seg
                file_end = self._file_end = file + seg
            before = len(hashes)
            if keys:
                seed = seeds.get(topic)
                if seed is None:
                    if len(seeds) >= _SEEDS_MAX:
                        seeds.clear()
                    seed = seeds[topic] = _crc32(f"{topic}#".encode())
                for key in keys.split():
                    put_hash(_crc32(key.encode(), seed))
                    put_offset(offset)
            if uniq_key:
                put_hash(_crc32(uniq_key.encode(), _UNIQ_SEED))
                put_offset(offset)
            n = len(hashes) - before
            if n > room:
                del hashes[before:]
                del offsets[before:]
                self._overflowed(n)
            else:
                room -= n
                added += n
            indexed_to = offset + size
        self._hashes.fromlist(hashes)
        self._offsets.fromlist(offsets)
        self.indexed_to = indexed_to
        return added

    def _overflowed(self, n: int) -> None:
        if not self.overflow:
            log.warning(
                "key index %s holds %d entries (key_index_max_entries); newer keys are "
                "not indexed until retention deletes old segments",
                self.root,
                self.max_entries,
            )
        self.overflow += n

    def commit_some(self) -> None:
        """:meth:`commit` once :meth:`add` gathered :data:`WRITE_BYTES`: a put does not
        pay a write of its own.  What waits is written by the store's next flush
        (:meth:`sync_handle`), a cut-back or a close, and lookups never read the files;
        a crash loses only entries past the durable point, which recovery indexes
        again from the log."""
        if len(self._hashes) - self._written >= _WRITE_ENTRIES:
            self.commit()

    def commit(self) -> None:
        """Write what :meth:`add` gathered as one chunk (one write); an I/O error stops
        the index (logged, the messages are stored all the same; a restart rebuilds
        it)."""
        start = self._written
        n = len(self._hashes) - start
        if n <= 0:
            return
        self._written = len(self._hashes)
        if self._failed is not None:
            return
        data = memoryview(_chunk(self._hashes[start:], self._offsets[start:], self.indexed_to))
        try:
            fd = self._open(self._file)
            while data:
                data = data[os.write(fd, data) :]
        except OSError as exc:
            self._failed = str(exc)
            log.error("key index %s: write failed, no more keys indexed: %s", self.root, exc)
            return
        self._files[self._file] = self._files.get(self._file, 0) + n

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
            self._close_fd()

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # --- reading ------------------------------------------------------------------------

    def lookup(self, h: int) -> list[int]:
        """Commit-log offsets of the records indexed under ``h``, oldest first."""
        found: list[int] = []
        if not self._hashes:
            return found
        hay = self._hashes.tobytes()
        needle = array(_U32, [h & 0xFFFFFFFF]).tobytes()
        offsets = self._offsets
        i = hay.find(needle)
        while i >= 0:
            if i % 4:  # the bytes of two neighbouring hashes
                i = hay.find(needle, i + 1)
                continue
            off = offsets[i >> 2]
            if not found or found[-1] != off:  # a key given twice in one record
                found.append(off)
            i = hay.find(needle, i + 4)
        return found

    # --- retention, cut back ------------------------------------------------------------

    def drop_below(self, min_offset: int) -> int:
        """Forget the entries pointing below ``min_offset`` (retention deleted their
        records) and delete the files holding only such entries; returns entries
        dropped."""
        k = bisect_left(self._offsets, min_offset)
        if k:
            del self._hashes[:k]
            del self._offsets[:k]
            self._written = max(0, self._written - k)
        gone = [s for s in self._files if s + self.segment_size <= min_offset]
        for start in gone:
            del self._files[start]
            self._unlink(start)
        if gone:
            self.write_point(self._point)  # the entry count it holds went down
        return k

    def truncate(self, offset: int) -> int:
        """Forget the entries at or after ``offset`` (the log was cut back there) and
        cut their files; returns entries dropped."""
        self.commit()
        self._close_fd()
        k = bisect_left(self._offsets, offset)
        dropped = len(self._hashes) - k
        del self._hashes[k:]
        del self._offsets[k:]
        self._written = k
        self.indexed_to = min(self.indexed_to, offset)
        cut = offset - offset % self.segment_size
        for start in sorted(s for s in self._files if s >= cut):
            if start == cut:
                self._rewrite(start)
            else:
                del self._files[start]
                self._unlink(start)
        self._file = self._file_end = -1
        self.write_point(self.indexed_to)
        return dropped

    def _rewrite(self, start: int) -> None:
        """Write the file of the segment at ``start`` again from memory, as one chunk."""
        lo = bisect_left(self._offsets, start)
        hi = bisect_left(self._offsets, start + self.segment_size)
        if lo == hi:
            del self._files[start]
            self._unlink(start)
            return
        path = self._path(start)
        tmp = path.with_name(path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, _chunk(self._hashes[lo:hi], self._offsets[lo:hi], self.indexed_to))
                os.fdatasync(fd)
            finally:
                os.close(fd)
            tmp.replace(path)
        except OSError as exc:
            log.warning("key index %s: cannot cut %s: %s", self.root, path, exc)
            return
        self._files[start] = hi - lo

    def _unlink(self, start: int) -> None:
        if self._fd is not None and self._fd_file == start:
            self._close_fd()
        try:
            self._path(start).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("key index %s: cannot delete %s: %s", self.root, self._path(start), exc)

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
        del self._hashes[:]
        del self._offsets[:]
        self._written = 0
        self._files.clear()
        try:
            for p in self.root.iterdir():
                p.unlink()
        except FileNotFoundError:
            pass

    def _chunks(
        self, path: Path, data: bytes, last_file: bool
    ) -> Iterator[tuple[int, int, array[int], array[int], int]]:
        """(position, end, hashes, offsets, covered) of each whole chunk of a file; a
        torn chunk ends the file (it is cut by the caller) when it is the last file."""
        pos = 0
        while pos < len(data):
            end = pos + CHUNK_HEAD.size
            if end <= len(data):
                mark, n, covered, crc = CHUNK_HEAD.unpack_from(data, pos)
                if mark != _MARK:
                    raise ValueError(f"byte {pos} of {path.name} does not start a chunk")
                end += n * ENTRY_SIZE
            if end > len(data):
                if not last_file:
                    raise ValueError(f"{path.name} ends in a torn chunk and is not the last file")
                log.warning("key index %s: cutting a torn chunk off %s", self.root, path.name)
                return
            body = data[pos + CHUNK_HEAD.size : end]
            if _crc32(body, _crc32(data[pos : pos + _HEAD_BODY.size])) != crc:
                raise ValueError(f"the chunk at byte {pos} of {path.name} fails its CRC")
            hashes = array(_U32, body[: 4 * n])
            offsets = array("Q", body[4 * n :])
            if _SWAP:
                hashes.byteswap()
                offsets.byteswap()
            yield pos, end, hashes, offsets, covered
            pos = end

    def _load(self, log_min: int, log_max: int) -> int:
        if not self.root.exists():
            if log_max > log_min:
                log.info("key index %s: missing; building it from the commit log", self.root)
            return log_min
        starts = sorted(int(p.name) for p in self.root.iterdir() if p.name.isdigit())
        saved = self._read_point()
        on_disk = 0  # entries in whole chunks
        covered = log_min  # the offset the chunks kept index the log up to
        checked = 0  # the previous chunk's ``covered``, for the order check
        last = -1  # the offset of the last entry read
        cut = False  # the log ends inside what a chunk covered: the rest goes
        for i, start in enumerate(starts):
            path = self._path(start)
            data = path.read_bytes()
            kept = keep_bytes = 0
            rewrite = b""
            for pos, end, hashes, offsets, chunk_covered in self._chunks(
                path, data, i == len(starts) - 1
            ):
                on_disk += len(hashes)
                if (
                    not hashes
                    or offsets[0] < max(last, checked, start)
                    or offsets[-1] >= min(start + self.segment_size, chunk_covered)
                    or offsets.tolist() != sorted(offsets)
                ):
                    raise ValueError(f"the chunk at byte {pos} of {path.name} is out of order")
                last, checked = offsets[-1], chunk_covered
                if cut:
                    continue
                if chunk_covered > log_max:
                    # the log was cut back inside what this chunk covers: keep the
                    # entries below its end but those of the last record kept, which
                    # is indexed again
                    cut = True
                    k = bisect_left(offsets, log_max)
                    if k:
                        covered = offsets[k - 1]
                        k = bisect_left(offsets, covered)
                    if k:
                        rewrite = _chunk(hashes[:k], offsets[:k], covered)
                        self._take(hashes[:k], offsets[:k], log_min)
                        kept += k
                    continue
                self._take(hashes, offsets, log_min)
                kept += len(hashes)
                covered = chunk_covered
                keep_bytes = end
            if keep_bytes != len(data) or rewrite:
                with path.open("r+b") as f:
                    f.truncate(keep_bytes)
                    f.seek(keep_bytes)
                    f.write(rewrite)
            if kept:
                self._files[start] = kept
            else:
                path.unlink()
        resume = max(covered, log_min)
        if saved is not None:
            if on_disk < saved[1]:
                raise ValueError(f"its files hold {on_disk} entries, {saved[1]} when last synced")
            if covered < saved[0] <= log_max:
                resume = max(resume, saved[0])  # synced: what lies between has no keys
        self._written = len(self._hashes)
        self.drop_below(log_min)
        return resume

    def _take(self, hashes: array[int], offsets: array[int], log_min: int) -> None:
        """Hold the entries read back that still point into the log."""
        k = bisect_left(offsets, log_min)
        self._hashes.extend(hashes[k:])
        self._offsets.extend(offsets[k:])

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
        return {"entries": len(self._hashes), "overflow": self.overflow, "files": len(self._files)}
