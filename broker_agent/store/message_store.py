"""MessageStore: the broker's durable store (commit log + consume queues + checkpoint),
the one object the broker holds: it owns the files and the lock, and appends, reads,
flushes, cuts back and deletes under it.  Its parts: the value types (``types``), the
consume queues and their dispatch (``dispatch``), recovery (``recovery``), the commit
log (``commitlog``), free space (``diskspace``) and retention (``retention``).

Layout under ``store_dir``::

    lock                      flock()ed while a process has the store open
    checkpoint                two-slot checkpoint (see ``checkpoint``)
    recovery_marks.json       the queue ends of the last unclean recovery (see ``marks``)
    commitlog/<20 digits>     segment files (see ``commitlog``)
    consumequeue/<topic>/<queue id>/<20 digits>   consume-queue files (see ``consumequeue``)
    index/<20 digits>, index/point                 the key index (see ``keyindex``)

Open files: the active commit-log segment keeps its descriptor; every other file is
opened on demand through one LRU :class:`~.files.FileCache` of ``max_open_files``
descriptors, so a store of thousands of segments and queues holds a bounded number.

Dispatch (consume-queue building, RocketMQ's ``ReputMessageService``, see
``dispatch``): :meth:`put` writes its own consume-queue entry before it returns, so a
message is readable as soon as it is acknowledged; wake held pulls from the
:class:`PutResult`.  Replicated bytes
(:meth:`append_replicated`) are dispatched by :meth:`reput`, which returns a
:class:`Dispatched` for each entry it wrote (plus any replicated records a later
:meth:`put` had to dispatch first).  The broker runs :meth:`reput` in its reput loop and
:meth:`flush` from a worker thread every ``flush_interval_ms`` in async flush mode.

Failure policy: an I/O error while appending truncates the partial record away.  For
``ENOSPC`` (:class:`StoreFull`) that is all: the store is *full* and refuses appends
until space returns (see ``diskspace``: a reserve of ``min_free_disk_ratio`` is kept, so
the store normally refuses before the file system says ENOSPC; a sample every second,
or :meth:`MessageStore.check_space`, clears the state).  Any other error (or a cut back
that failed) makes the store read-only: every later write raises
:class:`StoreReadOnly` until it is reopened.  A refused or failed append never leaves a
byte behind, so a caller may send the same record elsewhere.

Recovery (:meth:`MessageStore.open`, see ``recovery``) starts from the checkpoint,
verifies the commit log's tail record by record, truncates it at the first record that
fails and trims the consume queues to match.  Reads verify the CRC again, so a record
that fails it is never served.  After an unclean stop it records every queue's end as
its recovery mark (``marks``): a read past a queue's end answers
``OFFSET_OVERFLOW_BADLY`` with the mark as ``next_begin_offset``, so a consumer that had
read into a tail a power loss took comes back to where the messages stored since begin.

Damage under a running store (``repair``): a record below the log's end that a read
finds unreadable (CRC, length, a short read, not the record its consume-queue entry
names), bytes an HA or range read cannot verify, or an active segment whose file
shrank under the writer, is noted as a :class:`~.repair.Damage` and refused with
:class:`RecordUnderRepair` (retriable; ``get_messages`` stops before it) until
:meth:`MessageStore.repair` writes a replica's checked copy back in place.  While the
active segment is shorter than the write position nothing is appended (the writer
never appends past a hole it did not write).

Retention (:meth:`MessageStore.clean_expired_files`, run by the broker every
``clean_resource_interval_ms``): expired commit-log segments are deleted as ``retention``
decides; consume queues follow at once (their minimum offsets move past entries that
point below the new start of the log, checked lazily on every read as well) and their
files that hold only such entries are deleted after the segments are gone for good.  A
read below a queue's minimum offset answers ``OFFSET_TOO_SMALL`` with the minimum as
``next_begin_offset``, so a consumer that was behind moves on.  Deleting segments first
(and syncing the directory) means a crash in between leaves consume-queue entries that
recovery skips, never entries without their records.

Keys (``keyindex``): :meth:`put` and :meth:`reput` index every record's ``KEYS`` and
``UNIQ_KEY``; recovery indexes what the index files miss; retention and cut backs drop
entries with their records.  :meth:`query_by_key` and :meth:`query_by_id` read the
candidate records and keep those that really carry the key.

Message ids are RocketMQ offset message ids (store host + physical offset, hex), see
:func:`ha_controller.protocol.record.make_msg_id`.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Self

from ha_controller.protocol.errors import (
    BadRequest,
    CorruptRecord,
    OffsetOutOfRange,
    RecordUnderRepair,
    StoreError,
    StoreFull,
    StoreReadOnly,
)
from ha_controller.protocol.properties import PROPERTY_KEYS, PROPERTY_UNIQ_KEY
from ha_controller.protocol.record import (
    BLANK,
    BLANK_MAGIC,
    MESSAGE_MAGIC,
    MIN_RECORD_SIZE,
    StoredMessage,
    decode_header,
    decode_record,
    encode_record,
    make_msg_id,
    parse_msg_id,
    tag_hash,
)

from .checkpoint import CheckpointFile
from .commitlog import CommitLog, store_error, unlink_segments
from .consumequeue import ENTRY_SIZE, ConsumeQueue, unlink_files
from .diskspace import DiskSpace, SpaceLevel, statvfs_sampler
from .dispatch import QueueIndex
from .files import FileCache
from .keyindex import KeyIndex, Record, key_hash, uniq_hash
from .marks import RecoveryMarks
from .recovery import recover
from .repair import Damage, DamageTable, Expected, check_copy
from .retention import (
    DELETE_BATCH_MAX,
    CleanResult,
    decide,
)
from .truncate import CutResult, cut_back
from .types import (
    MAX_QUEUE_ID,
    TOPIC_RE,
    Dispatched,
    GetMessageStatus,
    GetResult,
    MiB,
    PutRequest,
    PutResult,
    StoreConfig,
)
from .types import (
    now_ms as _now_ms,
)

__all__ = [
    "Dispatched",
    "GetMessageStatus",
    "GetResult",
    "MessageStore",
    "PutRequest",
    "PutResult",
    "StoreConfig",
]

logger = logging.getLogger(__name__)

_CQ_READ_BATCH = 256
_MAX_FILTER_SCAN = 16000
#: messages read for a property (SQL92) filter in one get_messages: each is decoded and
#: evaluated under the store's lock, so far fewer than the tag hashes skipped unread
_MAX_PROPERTY_FILTER_SCAN = 2000
_STORE_TS = struct.Struct(">Q")
_STORE_TS_POS = 44
_PREFIX = struct.Struct(">II")  # a record's length and magic
_U64 = struct.Struct(">Q")
#: where a record head keeps its physical offset (see ha_controller.protocol.record)
_PHYSICAL_POS = 28
#: consume queues handled per hold of the store lock by a retention round
_CQ_CLEAN_CHUNK = 256


class MessageStore:
    """The broker's message store; create it with :meth:`open`.

    Thread-safety: every method takes one re-entrant lock, except that :meth:`flush`
    holds it only to snapshot what to sync, so a worker thread can fsync while the
    event-loop thread keeps appending and reading.
    """

    def __init__(self, store_dir: Path, config: StoreConfig, lock_fd: int) -> None:
        self._dir = store_dir
        self._config = config
        self._lock_fd = lock_fd
        self._lock = threading.RLock()
        self._flush_lock = threading.Lock()
        self._files = FileCache(config.max_open_files)
        self._cl = CommitLog(store_dir / "commitlog", config.segment_size_bytes, self._files)
        self._retention = config.retention
        self._index = QueueIndex(store_dir, self._files, config.consume_queue_file_entries)
        self._cqs = self._index.cqs
        self._keys = (
            KeyIndex(store_dir / "index", config.segment_size_bytes, config.key_index_max_entries)
            if config.key_index_max_entries
            else None
        )
        self._checkpoint: CheckpointFile | None = None
        self._marks = RecoveryMarks(store_dir / "recovery_marks.json")
        self._cuts: list[int] = []  # the offsets the log was cut back to (cut_back)
        self._last_store_ts = 0
        self._read_only_reason: str | None = None
        self._closed = False
        self._space = DiskSpace(
            statvfs_sampler(store_dir / "commitlog"),
            min_free_ratio=config.min_free_disk_ratio,
            warn_free_ratio=config.warn_ratio,
            check_interval_s=config.disk_check_interval_ms / 1000,
        )
        self.corrupt_reads = 0
        """Reads that found a record failing its CRC or disagreeing with its entry."""
        self._damage = DamageTable()
        #: (offset, size) of the last record put appended, checked after the next put
        self._last_put: tuple[int, int] | None = None
        self.recovered_from = 0
        """The commit-log offset recovery verified from (the checkpoint's, normally)."""
        self.recovered_unclean = False
        """This open found the last stop unclean (a kill, a crash, a power loss)."""

    # --- lifecycle ------------------------------------------------------------------

    @classmethod
    def open(cls, store_dir: Path, config: StoreConfig | None = None) -> MessageStore:
        """Open (creating if needed) the store in ``store_dir`` and recover it."""
        config = config if config is not None else StoreConfig()
        store_dir = Path(store_dir)
        try:
            store_dir.mkdir(parents=True, exist_ok=True)
            (store_dir / "commitlog").mkdir(exist_ok=True)
            (store_dir / "consumequeue").mkdir(exist_ok=True)
            lock_fd = os.open(store_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise store_error(exc, f"cannot open store directory {store_dir}") from exc
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(lock_fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StoreError(f"store {store_dir} is open in another process") from exc
            raise store_error(exc, f"cannot lock store {store_dir}") from exc
        store = cls(store_dir, config, lock_fd)
        try:
            store._recover()
        except BaseException:
            store._close_files()
            raise
        return store

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Flush everything, write a clean checkpoint and release the files; idempotent."""
        with self._flush_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._cl.sync()
                for cq in self._cqs.values():
                    cq.sync()
                if self._keys is not None:
                    self._keys.close()
                if self._checkpoint is not None:
                    self._checkpoint.write(
                        self._cl.max_offset,
                        self._index.reput_offset,
                        self._index.entries_total(),
                        clean=self._reput_done(),
                    )
            except StoreError:
                logger.exception("store %s: final flush failed; recovery will verify", self._dir)
            finally:
                self._close_files()
            logger.info("store %s closed at commit log offset %d", self._dir, self._cl.max_offset)

    def _close_files(self) -> None:
        self._closed = True
        self._cl.close()
        for cq in self._cqs.values():
            cq.close()
        self._files.close()
        if self._checkpoint is not None:
            self._checkpoint.close()
        try:
            os.close(self._lock_fd)  # also releases the flock
        except OSError:
            logger.warning("closing the store lock file failed", exc_info=True)

    # --- recovery ----------------------------------------------------------------------

    def _recover(self) -> None:
        self._checkpoint = CheckpointFile(self._dir / "checkpoint")
        recovered = recover(
            self._dir,
            self._cl,
            self._index,
            self._checkpoint,
            self._config.recovery_verify_segments,
        )
        self.recovered_from = recovered.walked_from
        self._last_store_ts = recovered.last_store_ts
        self._marks.load()
        # not a new store: it has a checkpoint (written as it first opened) or records
        data = recovered.checkpointed or self._cqs or self._cl.max_offset > self._cl.min_offset
        self.recovered_unclean = not recovered.clean and bool(data)
        if self.recovered_unclean:
            ends = {key: cq.max_offset for key, cq in self._cqs.items()}
            self._marks.record(ends, self._cl.max_offset)
            logger.warning(
                "store %s: unclean stop: %d queue end(s) recorded as recovery marks (a read "
                "past a queue's end moves there)",
                self._dir,
                len(ends),
            )
        self._space.refresh()
        if self._keys is not None:
            self._recover_keys(self._keys)

    def lift_recovery_marks(self) -> bool:
        """A master going online after its pre-online caught up from its slaves: the
        marks come up to the queue ends it holds now (see ``RecoveryMarks.lift``)."""
        with self._lock:
            ends = {key: cq.max_offset for key, cq in self._cqs.items()}
            return self._marks.lift(ends, self._cl.max_offset)

    def take_recovery_marks(self) -> dict[tuple[str, int], int]:
        """The queue ends this open's unclean recovery recorded as marks, once (empty
        after a clean stop, and on every later call): the broker corrects the offsets it
        holds past them."""
        with self._lock:
            marks, self._marks.recorded = self._marks.recorded, {}
            return marks

    def recovery_mark(self, topic: str, queue_id: int) -> int | None:
        """Where the queue ended at the last unclean recovery (lowered by cut backs; its
        start when every record it holds came after that recovery), if anywhere."""
        with self._lock:
            cq = self._cqs.get((topic, queue_id))
            return None if cq is None else self._mark(topic, queue_id, cq)

    def rewinds(self) -> tuple[int, int]:
        """(this store's id, how often its queues went back), see ``marks``."""
        with self._lock:
            return self._marks.store_id, self._marks.rewinds

    def _mark(self, topic: str, queue_id: int, cq: ConsumeQueue) -> int | None:
        mark = self._marks.get(topic, queue_id)
        since = self._marks.since
        if mark is not None or since is None:
            return mark
        first = cq.entry(cq.min_offset) if len(cq) else None
        return cq.min_offset if first is None or first[0] >= since else None

    def _recover_keys(self, keys: KeyIndex) -> None:
        """Load the key index and index the records its files miss (all of them when
        they are missing or corrupt, see ``keyindex``); a bad record ends the walk."""
        cl = self._cl
        resume = keys.load(cl.min_offset, cl.max_offset)
        added = 0
        try:
            for offset, record, size in cl.scan(resume, heads=True):
                if record is not BLANK and (record.keys or record.uniq_key):
                    added += keys.add(record.topic, record.keys, record.uniq_key, offset, size)
        except (CorruptRecord, OffsetOutOfRange, StoreError) as exc:
            logger.warning("store %s: indexing keys stopped: %s", self._dir, exc)
        keys.indexed_to = max(keys.indexed_to, cl.max_offset)
        keys.commit()
        self._index.keys = keys
        if resume < cl.max_offset:
            logger.info(
                "store %s: key index: %d entries, %d indexed from commit log offset %d",
                self._dir,
                keys.entries,
                added,
                resume,
            )

    # --- dispatch ----------------------------------------------------------------------

    def _cq_for_read(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue, its minimum moved past entries that retention left dangling."""
        cq = self._cqs.get((topic, queue_id))
        if cq is not None and not self._closed:
            cq.correct_min(self._cl.min_offset)
        return cq

    @property
    def dispatch_gaps(self) -> int:
        """Replicated records skipped because their queue offset left a gap."""
        return self._index.gaps

    def reput(self, max_bytes: int = 16 * MiB) -> list[Dispatched]:
        """Dispatch commit-log records not yet in consume queues (replicated bytes).

        Returns the entries written, oldest first, after any that :meth:`put` dispatched
        on the reput loop's behalf.  Dispatches about ``max_bytes`` of commit log per call;
        call again while :attr:`dispatch_behind_bytes` is positive.
        """
        with self._lock:
            self._check_open()
            index = self._index
            out, index.pending = index.pending, []
            out.extend(index.reput(self._cl, max_bytes))
            return out

    @property
    def dispatch_behind_bytes(self) -> int:
        with self._lock:
            return max(0, self._cl.max_offset - self._index.reput_offset)

    def _reput_done(self) -> bool:
        return self._index.reput_offset >= self._cl.max_offset

    # --- writing -------------------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        return self._read_only_reason is not None

    @property
    def space_level(self) -> SpaceLevel:
        """OK, LOW (stop advertising writes) or FULL (appends refused); see diskspace."""
        return self._space.level

    @property
    def disk_used_ratio(self) -> float | None:
        """The used share of the store's file system at the last sample (None: unknown)."""
        return self._space.used_ratio

    @property
    def free_disk_bytes(self) -> int:
        """Free bytes of the store's file system at the last sample."""
        return self._space.free_bytes

    @property
    def disk_samples(self) -> int:
        """How many times free space was sampled (statvfs) since the store opened."""
        return self._space.samples

    @property
    def writable(self) -> bool:
        """Whether an append may succeed now (open, not read-only, not full)."""
        return (
            not self._closed
            and self._read_only_reason is None
            and self._space.level is not SpaceLevel.FULL
        )

    def unwritable_reason(self) -> str | None:
        """Why appends are refused now, or None."""
        if self._closed:
            return "store closed"
        if self._read_only_reason is not None:
            return f"read-only: {self._read_only_reason}"
        if self._space.level is SpaceLevel.FULL:
            return self._full_message()
        return None

    def check_space(self) -> SpaceLevel:
        """Sample the free space now (the broker calls this every second; a FULL store
        takes appends again once a sample shows room)."""
        with self._lock:
            if self._closed:
                return self._space.level
            return self._space.refresh()

    def _full_message(self) -> str:
        space = self._space
        return (
            f"store {self._dir} is full: {space.free_bytes} bytes free of "
            f"{space.total_bytes}, {space.hard_reserve_bytes} kept in reserve "
            f"(min_free_disk_ratio={self._config.min_free_disk_ratio})"
        )

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"store {self._dir} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self._read_only_reason is not None:
            raise StoreReadOnly(f"store {self._dir} is read-only: {self._read_only_reason}")

    def _check_room(self, size: int) -> None:
        """StoreFull, before anything is written, unless ``size`` bytes fit above the
        reserve."""
        if not self._space.admit(size):
            raise StoreFull(self._full_message())

    @property
    def _cl_dir(self) -> Path:
        return self._dir / "commitlog"

    def _go_read_only(self, exc: StoreError) -> None:
        self._read_only_reason = str(exc)
        logger.error("store %s is now read-only: %s", self._dir, exc)

    def _after_failed_append(self, exc: StoreError, before: int, size: int) -> None:
        """Cut a failed append back to ``before``; a full disk leaves the store full (it
        recovers when space returns), anything else (or a failed cut) read-only."""
        cut = self._cl.rollback(before)
        if cut and isinstance(exc, StoreFull):
            logger.warning("store %s: %s; refusing appends until space returns", self._dir, exc)
            self._space.hit_enospc(size)
            return
        self._go_read_only(exc)

    def put(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: Mapping[str, str] | None = None,
        *,
        flags: int = 0,
        born_ts_ms: int | None = None,
        born_host: str = "",
        store_host: str = "",
    ) -> PutResult:
        """Append one message at the next queue offset of (topic, queue_id).

        Raises BadRequest for an invalid topic, queue id, property or a message over
        ``max_message_size_bytes``; StoreFull when the disk is full (nothing written; the
        store takes appends again once space returns); StoreError on another I/O failure
        (the store then turns read-only); StoreReadOnly after such a failure.  In sync
        flush mode the record is fdatasynced before this returns.
        """
        request = PutRequest(
            topic, queue_id, body, properties, flags, born_ts_ms, born_host, store_host
        )
        return self.put_batch((request,))[0]

    def put_batch(self, requests: Sequence[PutRequest]) -> list[PutResult]:
        """Append several messages, each at the next queue offset of its queue, as one
        unit: every record is encoded once, the records of one segment go out in one
        write, each queue's entries in one write, and in sync flush mode one fdatasync
        covers them all before this returns (group commit).

        All or nothing: the errors of :meth:`put`, raised for the whole batch, and a
        refused or failed batch leaves no byte of it behind (a batch that does not fit
        the free space is refused whole).  A crash in the middle of the write leaves a
        torn tail that recovery truncates like a torn record (the whole records before it
        stay; none of them was acknowledged).
        """
        for request in requests:
            if not TOPIC_RE.match(request.topic):
                raise BadRequest(f"invalid topic name {request.topic!r}")
            if not 0 <= request.queue_id <= MAX_QUEUE_ID:
                raise BadRequest(f"invalid queue id {request.queue_id}")
        if not requests:
            return []
        limit = self._config.max_message_size_bytes
        with self._lock:
            self._check_writable()
            self._check_tail()
            if self._index.reput_offset < self._cl.max_offset:
                self._index.pending.extend(self._index.reput(self._cl, None))
            cl = self._cl
            store_ts = max(_now_ms(), self._last_store_ts)
            before = end = cl.max_offset
            next_offsets: dict[tuple[str, int], int] = {}
            entries: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
            records: list[bytes] = []
            placed: list[tuple[int, int, int]] = []  # (physical offset, size, queue offset)
            keyed: list[Record] = []
            for request in requests:
                key = (request.topic, request.queue_id)
                queue_offset = next_offsets.get(key)
                if queue_offset is None:
                    existing = self._cqs.get(key)
                    queue_offset = existing.max_offset if existing is not None else 0
                next_offsets[key] = queue_offset + 1
                if MIN_RECORD_SIZE + len(request.body) > limit:
                    raise BadRequest(
                        f"message of at least {MIN_RECORD_SIZE + len(request.body)} bytes exceeds "
                        f"max_message_size_bytes={limit}"
                    )
                properties = request.properties
                msg = StoredMessage(
                    topic=request.topic,
                    queue_id=request.queue_id,
                    body=bytes(request.body),
                    # read, never kept: no copy of a dict
                    properties=properties
                    if isinstance(properties, dict)
                    else dict(properties or {}),
                    flags=request.flags,
                    born_ts_ms=store_ts if request.born_ts_ms is None else request.born_ts_ms,
                    born_host=request.born_host,
                    store_host=request.store_host,
                    queue_offset=queue_offset,
                    physical_offset=end,
                    store_ts_ms=store_ts,
                )
                try:
                    # encoded once for where it lands unless it opens the next segment
                    data = encode_record(msg)
                    size = len(data)
                    if size > limit:
                        raise BadRequest(
                            f"message of {size} bytes exceeds max_message_size_bytes={limit}"
                        )
                    offset = cl.place(end, size)
                    if offset != end:
                        data = encode_record(replace(msg, physical_offset=offset))
                except ValueError as exc:
                    raise BadRequest(str(exc)) from exc
                records.append(data)
                placed.append((offset, size, queue_offset))
                mkeys = msg.properties.get(PROPERTY_KEYS)
                muniq = msg.properties.get(PROPERTY_UNIQ_KEY)
                if mkeys or muniq:
                    keyed.append((request.topic, mkeys, muniq, offset, size))
                entries.setdefault(key, []).append((offset, size, tag_hash(msg.tags)))
                end = offset + size
            charged = sum(size for _, size, _ in placed) + ENTRY_SIZE * len(placed)
            self._check_room(charged)
            started: list[tuple[ConsumeQueue, int]] = []
            try:
                offsets = cl.append_batch(records)
                assert offsets == [p[0] for p in placed], (offsets, placed)
                for key, queue_entries in entries.items():
                    cq = self._index.queue(*key)
                    started.append((cq, cq.max_offset))
                    cq.append_many(queue_entries)
                if self._config.flush_mode == "sync":
                    cl.sync()
            except StoreError as exc:
                try:
                    for cq, queue_start in started:
                        cq.truncate(queue_start)
                except StoreError:
                    logger.exception(
                        "rolling back consume queue %s/%d failed", cq.topic, cq.queue_id
                    )
                    cl.rollback(before)
                    self._go_read_only(exc)
                    raise
                self._after_failed_append(exc, before, charged)
                raise
            self._space.charge(charged)  # a segment's blank fill is a hole
            self._check_written(self._last_put)
            self._last_put = placed[-1][:2]
            self._index.reput_offset = end
            keys = self._keys
            if keys is not None:
                keys.add_many(keyed)
                keys.indexed_to = max(keys.indexed_to, end)
                keys.commit_some()
            self._last_store_ts = store_ts
            return [
                PutResult(
                    physical_offset=offset,
                    queue_offset=queue_offset,
                    size=size,
                    store_ts_ms=store_ts,
                    msg_id=make_msg_id(request.store_host, offset),
                )
                for request, (offset, size, queue_offset) in zip(requests, placed, strict=True)
            ]

    def append_replicated(self, offset: int, data: bytes) -> None:
        """Append whole records streamed by the master at exactly ``offset`` (slave side).

        Raises OffsetOutOfRange if ``offset`` is not the end of the local commit log,
        CorruptRecord if ``data`` is not whole, CRC-valid records placed for ``offset``
        (nothing is written then), StoreFull when the disk is full (nothing written; the
        store takes appends again once space returns), StoreError on another I/O
        failure (read-only).  Dispatch happens in :meth:`reput`.
        """
        with self._lock:
            self._check_writable()
            self._check_tail()
            before = self._cl.max_offset
            refused = False

            def room(size: int) -> None:
                nonlocal refused
                refused = True  # raised by the check, before anything was written
                self._check_room(size)
                refused = False

            try:
                # the room check sees the records' bytes, not blank fills (holes)
                written = self._cl.append_raw(offset, data, room=room)
                if self._config.flush_mode == "sync":
                    self._cl.sync()
            except (CorruptRecord, OffsetOutOfRange):
                raise
            except StoreError as exc:
                if not refused:
                    self._after_failed_append(exc, before, len(data))
                raise
            self._space.charge(written)

    def can_start_replica_at(self, offset: int) -> bool:
        """Whether :meth:`append_replicated` may start at ``offset`` although the log ends
        elsewhere: the log is empty and ``offset`` is a later segment start (the master
        deleted what came before)."""
        with self._lock:
            cl = self._cl
            return (
                cl.max_offset == cl.min_offset
                and offset > cl.max_offset
                and offset % cl.segment_size == 0
            )

    def flush(self) -> int:
        """fdatasync the commit log and consume queues, write the checkpoint.

        Safe from a worker thread: the store lock is held only to snapshot.  Returns the
        commit-log offset below which every byte is durable.
        """
        with self._flush_lock:
            with self._lock:
                if self._closed:
                    return self._cl.flushed_offset
                target = self._cl.max_offset
                dispatched = self._index.reput_offset
                entries = self._index.entries_total()
                try:
                    fds = self._cl.sync_fds(target)
                except StoreError as open_failed:
                    self._go_read_only(open_failed)
                    raise
                cq_paths = [p for cq in self._cqs.values() if cq.dirty for p in cq.take_dirty()]
                key_fd, key_point = (
                    self._keys.sync_handle() if self._keys is not None else (None, 0)
                )
                if key_fd is not None:
                    fds.append(key_fd)
            try:
                for fd in fds:
                    os.fdatasync(fd)
                # one descriptor at a time, so a flush of thousands of queues stays within
                # the open-file bound; a file removed meanwhile (rebase, retention) is gone
                for path in cq_paths:
                    try:
                        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
                    except FileNotFoundError:
                        continue
                    try:
                        os.fdatasync(fd)
                    finally:
                        os.close(fd)
            except OSError as exc:
                err = store_error(exc, "fdatasync failed")
                with self._lock:
                    self._go_read_only(err)
                raise err from exc
            finally:
                for fd in fds:
                    os.close(fd)
            with self._lock:
                self._cl.mark_flushed(target)
                flushed = self._cl.flushed_offset
                if self._keys is not None and not self._closed:
                    self._keys.write_point(min(key_point, self._keys.indexed_to))
            cp = self._checkpoint
            if cp is not None:
                last = cp.last
                wanted = (flushed, min(dispatched, flushed), entries)
                if (
                    last is None
                    or (
                        last.commitlog_offset,
                        last.dispatched_offset,
                        last.queue_entries,
                    )
                    != wanted
                ):
                    cp.write(*wanted, clean=False)
            return flushed

    # --- HA -----------------------------------------------------------------------------------

    @property
    def commitlog_max_offset(self) -> int:
        with self._lock:
            return self._cl.max_offset

    @property
    def commitlog_min_offset(self) -> int:
        with self._lock:
            return self._cl.min_offset

    @property
    def flushed_offset(self) -> int:
        with self._lock:
            return self._cl.flushed_offset

    def read_commitlog(self, offset: int, max_bytes: int) -> bytes:
        """Whole records from ``offset`` for HA streaming and GET_COMMITLOG_RANGE (see
        ``CommitLog.read``), each checked (CRC, physical offset) before it is sent: the
        answer ends before the first record that fails, or a known damaged range; when
        that is the first record, RecordUnderRepair (a replica is never sent bytes this
        broker cannot verify)."""
        with self._lock:
            self._check_open()
            cl = self._cl
            try:
                data = cl.read(offset, max_bytes)
            except (CorruptRecord, StoreError) as exc:
                data, why = b"", f"unreadable: {exc}"
            else:
                why = "no whole record at a record boundary below the log's end"
            known = self._damage.overlapping(offset, offset + max(len(data), 1))
            if known is not None:
                data = data[: max(0, known.start - offset)]
            pos = 0
            while pos < len(data):
                try:
                    head = decode_header(data, pos)
                except CorruptRecord as exc:
                    why = f"unreadable record: {exc}"
                    break
                if not head.blank and head.physical_offset != offset + pos:
                    why = f"the record claims physical offset {head.physical_offset}"
                    break
                pos += head.size
            if pos == 0 and offset < cl.max_offset:
                if known is not None and known.start <= offset:
                    raise RecordUnderRepair(known.describe())
                try:
                    self._check_tail()
                except RecordUnderRepair:
                    pass
                damage = self._note_damage(Damage(offset, None, why))
                raise RecordUnderRepair(damage.describe())
            return data[:pos] if pos < len(data) else data

    def cut_back(self, offset: int) -> CutResult:
        """Drop the log from ``offset`` (a record boundary) on, with its consume-queue
        entries; crash-safe, see ``truncate``.  Only with no reader or writer about."""
        with self._flush_lock, self._lock:
            self._check_open()
            before = {key: cq.max_offset for key, cq in self._cqs.items()}
            known = self._damage.covering(offset)
            result = cut_back(
                self._dir,
                self._cl,
                self._cqs,
                self._checkpoint_file(),
                offset,
                damaged=known is not None and known.start == offset,
            )
            self._cuts.append(offset)
            self._marks.lower(
                {key: cq.max_offset for key, cq in self._cqs.items() if cq.max_offset < before[key]}
            )
            self._index.reput_offset = min(self._index.reput_offset, offset)
            if self._keys is not None:
                self._keys.truncate(offset)
            self._damage.drop_from(offset)
            self._last_put = None
            index = self._index
            index.pending = [d for d in index.pending if d.physical_offset < offset]
            return result

    @property
    def cuts(self) -> int:
        """How many times the log was cut back since the store opened."""
        return len(self._cuts)

    def cut_below(self, since: int, end: int) -> bool:
        """Whether a cut made after the first ``since`` cuts dropped bytes before
        ``end``: what a caller appended or read up to ``end`` before it awaited may not
        be in the log any more, even where the offsets exist again."""
        return any(offset < end for offset in self._cuts[since:])

    def _checkpoint_file(self) -> CheckpointFile:
        assert self._checkpoint is not None  # opened by recovery
        return self._checkpoint

    # --- reading --------------------------------------------------------------------------------

    def _read_message(
        self, physical_offset: int, size: int, topic: str, queue_id: int, queue_offset: int
    ) -> StoredMessage | None:
        """The record a consume-queue entry points at.  None for an entry outside the
        log (no record of it to repair); RecordUnderRepair for a damaged one."""
        cl = self._cl
        if not cl.min_offset <= physical_offset < cl.max_offset:
            self.corrupt_reads += 1
            logger.error(
                "%s/%d offset %d: entry points at %d, outside the commit log [%d, %d)",
                topic,
                queue_id,
                queue_offset,
                physical_offset,
                cl.min_offset,
                cl.max_offset,
            )
            return None
        known = self._damage.overlapping(physical_offset, physical_offset + max(size, 1))
        if known is not None:
            raise RecordUnderRepair(f"{topic}/{queue_id} offset {queue_offset}: {known.describe()}")
        why: str | None = None
        try:
            record, got = decode_record(cl.read_at(physical_offset, size))
        except (CorruptRecord, OffsetOutOfRange, StoreError) as exc:
            why = f"unreadable record: {exc}"
        else:
            if (
                record is BLANK
                or got != size
                or record.topic != topic
                or record.queue_id != queue_id
                or record.queue_offset != queue_offset
            ):
                why = "the record does not match its consume-queue entry"
            else:
                return record
        self.corrupt_reads += 1
        end = min(physical_offset + size, cl.max_offset)
        damage = self._note_damage(
            Damage(physical_offset, end, why, Expected(topic, queue_id, queue_offset, size))
        )
        raise RecordUnderRepair(f"{topic}/{queue_id} offset {queue_offset}: {damage.describe()}")

    # --- damage and repair (see ``repair``) ------------------------------------------------

    def _note_damage(self, damage: Damage) -> Damage:
        known = self._damage.add(damage)
        if known is damage:
            logger.error(
                "store %s: %s; refused until a replica's copy is written back",
                self._dir,
                damage.describe(),
            )
        return known

    def _check_tail(self) -> None:
        """RecordUnderRepair when the active segment's file is shorter than what was
        written to it: the records from the one the file now ends in to the write
        position are damaged, and nothing is appended past them until repaired."""
        cl = self._cl
        hole = cl.shrunk()
        if hole is None:
            return
        file_end, written = hole
        start = cl.boundary_before(file_end)
        damage = self._note_damage(
            Damage(
                start,
                written,
                f"segment truncated under the running broker at {file_end} "
                f"(records were written to {written})",
            )
        )
        raise RecordUnderRepair(f"appends wait: {damage.describe()}")

    def _claimed_offset(self, offset: int) -> int | None:
        """The physical offset the record head at ``offset`` claims (None: a blank, -1:
        no record head there)."""
        try:
            length, magic = _PREFIX.unpack(self._cl.read_at(offset, _PREFIX.size))
            if magic == BLANK_MAGIC:
                return None
            if magic != MESSAGE_MAGIC or length < MIN_RECORD_SIZE:
                return -1
            (claimed,) = _U64.unpack(self._cl.read_at(offset + _PHYSICAL_POS, 8))
        except (OffsetOutOfRange, StoreError):
            return -1
        return int(claimed)

    @property
    def damaged_count(self) -> int:
        """Ranges refused to readers until repaired (see ``repair``)."""
        with self._lock:
            return len(self._damage)

    def _check_written(self, last: tuple[int, int] | None) -> None:
        """After an append: the record the previous put ended with still verifies.  A
        segment truncated between :meth:`_check_tail` and the write was extended again
        by it, leaving zeros the size check cannot see; they are noted as damaged (the
        records just appended after them are whole and stay)."""
        if last is None:
            return
        offset, size = last
        cl = self._cl
        if offset < cl.min_offset:
            return
        try:
            head = decode_header(cl.read_at(offset, size))
            if head.physical_offset == offset:
                return
        except (CorruptRecord, OffsetOutOfRange, StoreError):
            pass
        end = offset + size
        start = min(offset, cl.boundary_before(end))
        self._note_damage(
            Damage(start, end, "segment truncated under the running broker while it appended")
        )

    def damaged(self) -> list[Damage]:
        """The damaged ranges, lowest first (checks the active segment's size first)."""
        with self._lock:
            if self._closed:
                return []
            try:
                self._check_tail()
            except RecordUnderRepair:
                pass
            return self._damage.pending()

    def repair(self, damage: Damage, data: bytes) -> tuple[int, int]:
        """Write ``data``, a replica's answer from ``damage.start``, back in place once
        :func:`~.repair.check_copy` accepts it; ``(bytes, records)`` written (the rest of
        the range, if the answer was short, stays damaged).  CorruptRecord (nothing
        written) when the copy is not acceptable; OffsetOutOfRange when the range is no
        longer in the log."""
        with self._lock:
            self._check_open()
            try:
                self._check_tail()  # a shrunk tail swallows the single records in it
            except RecordUnderRepair:
                pass
            if self._damage.covering(damage.start) is not damage:
                return 0, 0  # repaired, swallowed or cut away meanwhile
            cl = self._cl
            size, records = check_copy(damage, data, cl.segment_size)
            end = damage.start + size
            if damage.start < cl.min_offset or end > cl.max_offset:
                raise OffsetOutOfRange(
                    f"repair of [{damage.start}, {end}) outside the commit log "
                    f"[{cl.min_offset}, {cl.max_offset})"
                )
            if damage.end is None and end < cl.max_offset:
                # the local length could not be trusted: the next record must start
                # where the replica's ends
                claimed = self._claimed_offset(end)
                if claimed is not None and claimed != end:
                    raise CorruptRecord(
                        f"the replica's record at {damage.start} ends at {end}, where ours "
                        f"{'claims offset ' + str(claimed) if claimed >= 0 else 'is unreadable'}"
                    )
            start = damage.start
            cl.write_in_place(start, data[:size])
            self._damage.repaired(damage, end)
            logger.warning(
                "store %s: commit log [%d, %d) repaired from a replica (%d record(s))",
                self._dir,
                start,
                end,
                records,
            )
            return size, records

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        max_bytes: int = 4 * MiB,
        tag_filter: set[int] | None = None,
        message_filter: Callable[[Mapping[str, str]], bool] | None = None,
    ) -> GetResult:
        """Read up to ``max_count`` messages from queue ``offset`` (RocketMQ ``getMessage``).

        ``tag_filter`` holds tag hashes (:func:`tag_hash`); ``None`` matches everything.
        ``message_filter`` (an SQL92 filter's ``matches``) is asked about each message's
        properties after it is read; at most ``_MAX_PROPERTY_FILTER_SCAN`` are read for
        it per call, the offset moving past those filtered out either way.
        The first matching message is returned even if it is larger than ``max_bytes``.
        ``next_begin_offset`` is where the next pull should start.  A damaged record
        (see ``repair``) ends the answer before it; when it is the first one read the
        status is RECORD_UNDER_REPAIR with ``next_begin_offset`` at it.
        """
        with self._lock:
            self._check_open()
            cq = self._cq_for_read(topic, queue_id)
            if cq is None:
                return GetResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE)
            lo, hi = cq.min_offset, cq.max_offset

            def result(status: GetMessageStatus, nxt: int, msgs: list[StoredMessage]) -> GetResult:
                return GetResult(status, msgs, nxt, lo, hi)

            # before "empty": a queue whose every message was deleted by retention still
            # sends a consumer that was behind to its minimum
            if offset < lo:
                return result(GetMessageStatus.OFFSET_TOO_SMALL, lo, [])
            if offset > hi:
                # past the end (an empty queue too): back to the recovery mark, where
                # the messages stored since the last unclean stop begin
                mark = self._mark(topic, queue_id, cq)
                nxt = hi if mark is None else max(lo, min(mark, hi))
                return result(GetMessageStatus.OFFSET_OVERFLOW_BADLY, nxt, [])
            if lo == hi:
                return result(GetMessageStatus.NO_MESSAGE_IN_QUEUE, lo, [])
            if offset == hi:
                return result(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, [])
            messages: list[StoredMessage] = []
            total = 0
            filtered = 0
            cur = offset
            scan_limit = offset + max(max_count, _MAX_FILTER_SCAN)
            read_limit = _MAX_PROPERTY_FILTER_SCAN
            done = False
            while not done and cur < hi and cur < scan_limit and len(messages) < max_count:
                for phys, size, th in cq.entries(cur, min(_CQ_READ_BATCH, scan_limit - cur)):
                    if len(messages) >= max_count:
                        done = True
                        break
                    if tag_filter is not None and th not in tag_filter:
                        filtered += 1
                        cur += 1
                        continue
                    if messages and total + size > max_bytes:
                        done = True
                        break
                    if message_filter is not None:
                        if read_limit == 0:
                            done = True
                            break
                        read_limit -= 1
                    try:
                        msg = self._read_message(phys, size, topic, queue_id, cur)
                    except RecordUnderRepair:
                        # never past a damaged record: readers wait at it (see repair)
                        if messages:
                            return result(GetMessageStatus.FOUND, cur, messages)
                        if filtered:
                            return result(GetMessageStatus.NO_MATCHED_MESSAGE, cur, [])
                        return result(GetMessageStatus.RECORD_UNDER_REPAIR, cur, [])
                    cur += 1
                    if msg is None:
                        continue
                    if message_filter is not None and not message_filter(msg.properties):
                        filtered += 1
                        continue
                    messages.append(msg)
                    total += size
            if messages:
                return result(GetMessageStatus.FOUND, cur, messages)
            if filtered:
                return result(GetMessageStatus.NO_MATCHED_MESSAGE, cur, [])
            return result(GetMessageStatus.OFFSET_FOUND_NULL, cur, [])

    def recent_messages_with(self, prop: str, max_bytes: int) -> list[StoredMessage]:
        """The messages carrying property ``prop`` in about the last ``max_bytes`` of the
        commit log, oldest first: from the first record a consume queue points at, at or
        after ``max offset - max_bytes`` (a record boundary), to the end.  For rebuilding
        what a broker keeps in memory about its latest writes after a restart.  A record
        that does not verify ends the walk (recovery verified the tail already)."""
        with self._lock:
            self._check_open()
            end = self._cl.max_offset
            target = max(self._cl.min_offset, end - max_bytes)
            start = end
            for cq in self._cqs.values():
                q = cq.first_at_or_after(target)
                if q < cq.max_offset:
                    entry = cq.entry(q)
                    if entry is not None:
                        start = min(start, entry[0])
            found: list[StoredMessage] = []
            try:
                for _offset, record, _size in self._cl.scan(start, end):
                    if record is not BLANK and prop in record.properties:
                        found.append(record)
            except (CorruptRecord, StoreError, OffsetOutOfRange) as exc:
                logger.warning("store %s: reading the recent messages stopped: %s", self._dir, exc)
            return found

    # --- keys -----------------------------------------------------------------------

    def _record_at(self, offset: int) -> StoredMessage | None:
        """The verified record starting at commit-log ``offset``, or None."""
        if not self._cl.min_offset <= offset < self._cl.max_offset:
            return None
        try:
            (size,) = struct.unpack(">I", self._cl.read_at(offset, 4))
            # a record is never larger than this (an id from a user may point anywhere)
            bound = min(self._cl.segment_size, 2 * self._config.max_message_size_bytes)
            if not MIN_RECORD_SIZE <= size <= bound or offset + size > self._cl.max_offset:
                return None
            record, _ = decode_record(self._cl.read_at(offset, size))
        except (CorruptRecord, OffsetOutOfRange, StoreError):
            return None
        if record is BLANK or record.physical_offset != offset:
            return None
        return record

    def query_by_key(
        self,
        topic: str,
        key: str,
        *,
        begin_ms: int = 0,
        end_ms: int | None = None,
        max_num: int = 32,
    ) -> list[StoredMessage]:
        """The newest ``max_num`` messages of ``topic`` carrying message key ``key``
        stored in [begin_ms, end_ms], newest first (RocketMQ's QUERY_MESSAGE)."""
        with self._lock:
            self._check_open()
            if self._keys is None:
                return []
            found: list[StoredMessage] = []
            for offset in reversed(self._keys.lookup(key_hash(topic, key))):
                if len(found) >= max_num:
                    break
                record = self._record_at(offset)
                if (
                    record is not None
                    and record.topic == topic
                    and key in record.keys
                    and begin_ms <= record.store_ts_ms
                    and (end_ms is None or record.store_ts_ms <= end_ms)
                ):
                    found.append(record)
            return found

    def query_by_id(self, msg_id: str, *, max_num: int = 32) -> list[StoredMessage]:
        """The messages whose unique key (the id clients see) is ``msg_id``, newest
        first (several: a retried send is stored twice); and, when ``msg_id`` is an
        offset message id of this log's store host, the record it points at
        (RocketMQ's VIEW_MESSAGE_BY_ID)."""
        with self._lock:
            self._check_open()
            found: list[StoredMessage] = []
            if self._keys is not None:
                for offset in reversed(self._keys.lookup(uniq_hash(msg_id))):
                    if len(found) >= max_num:
                        break
                    record = self._record_at(offset)
                    if record is not None and record.uniq_key == msg_id:
                        found.append(record)
            try:
                _, offset = parse_msg_id(msg_id)
            except ValueError:
                return found
            record = self._record_at(offset)
            if (
                record is not None
                and make_msg_id(record.store_host, offset) == msg_id.upper()
                and all(m.physical_offset != offset for m in found)
            ):
                found.append(record)
            return found

    @property
    def key_index_stats(self) -> dict[str, int]:
        """entries, overflow (keys not indexed: the bound was reached), files."""
        with self._lock:
            return self._keys.stats() if self._keys is not None else {}

    def get_message_at(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        """The message at queue ``offset``, or None if there is none.  RecordUnderRepair
        (retriable) when the record is damaged: the caller holds its progress there."""
        with self._lock:
            self._check_open()
            cq = self._cq_for_read(topic, queue_id)
            entry = cq.entry(offset) if cq is not None else None
            if entry is None:
                return None
            return self._read_message(entry[0], entry[1], topic, queue_id, offset)

    def max_offset(self, topic: str, queue_id: int) -> int:
        """Next queue offset to be written (0 for an unknown queue)."""
        with self._lock:
            cq = self._cqs.get((topic, queue_id))
            return cq.max_offset if cq is not None else 0

    def min_offset(self, topic: str, queue_id: int) -> int:
        """First queue offset still readable (moves up as retention deletes)."""
        with self._lock:
            cq = self._cq_for_read(topic, queue_id)
            return cq.min_offset if cq is not None else 0

    def _store_ts_at(self, physical_offset: int) -> int:
        (ts,) = _STORE_TS.unpack(self._cl.read_at(physical_offset + _STORE_TS_POS, 8))
        return int(ts)

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset whose store time is >= ``timestamp_ms``.

        Returns the queue's max offset when every message is older, its min offset when
        every message is newer (RocketMQ's ``getOffsetInQueueByTime``, lower boundary).
        """
        with self._lock:
            self._check_open()
            cq = self._cq_for_read(topic, queue_id)
            if cq is None:
                return 0
            lo, hi = cq.min_offset, cq.max_offset
            while lo < hi:
                mid = (lo + hi) // 2
                entry = cq.entry(mid)
                assert entry is not None
                if self._store_ts_at(entry[0]) < timestamp_ms:
                    lo = mid + 1
                else:
                    hi = mid
            return lo

    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int | None:
        """Store time of the message at queue ``offset`` (RocketMQ's
        ``getMessageStoreTimeStamp``), None when the queue holds none there: at or past
        its end, or below what retention left.  Reads 8 bytes of the commit log, not the
        message."""
        with self._lock:
            self._check_open()
            cq = self._cq_for_read(topic, queue_id)
            if cq is None or not cq.min_offset <= offset < cq.max_offset:
                return None
            entry = cq.entry(offset)
            return None if entry is None else self._store_ts_at(entry[0])

    def earliest_msg_store_time(self, topic: str, queue_id: int) -> int | None:
        """Store time of the first message of the queue, None if it is empty."""
        with self._lock:
            self._check_open()
            cq = self._cq_for_read(topic, queue_id)
            entry = cq.entry(cq.min_offset) if cq is not None else None
            return None if entry is None else self._store_ts_at(entry[0])

    def topics_and_queues(self) -> dict[str, list[int]]:
        """Every known topic with its queue ids (sorted)."""
        with self._lock:
            out: dict[str, list[int]] = {}
            for topic, queue_id in sorted(self._cqs):
                out.setdefault(topic, []).append(queue_id)
            return out

    # --- retention and open files ---------------------------------------------------------

    def clean_expired_files(
        self,
        *,
        replica_limit: int | None = None,
        now_ms: int | None = None,
        hour: int | None = None,
    ) -> CleanResult:
        """One retention round (see ``retention``): delete the commit-log segments that
        are due, then the consume-queue files that only point below the new start.

        ``replica_limit``: delete nothing at or above this commit-log offset (a master's
        slowest live slave); ``now_ms``/``hour`` default to the clock (local hour).
        Safe from a worker thread: files are removed without the store lock.  Raises
        StoreError when a file cannot be removed (what was removed stays removed).
        """
        now = _now_ms() if now_ms is None else now_ms
        if hour is None:
            hour = time.localtime(now / 1000).tm_hour
        with self._lock:
            if self._closed:
                return CleanResult("store closed")
            self._space.refresh()
            decision = decide(
                self._retention,
                self._cl.closed_segments(),
                now_ms=now,
                hour=hour,
                used_ratio=self._space.used_ratio,
                replica_limit=replica_limit,
                max_segments=DELETE_BATCH_MAX,
            )
            gone = self._cl.detach_oldest(decision.segments)
            cl_min = self._cl.min_offset
            self._damage.drop_below(cl_min)
            keys = list(self._cqs)
            if gone and self._keys is not None:
                self._keys.drop_below(cl_min)
        if gone:
            unlink_segments(self._cl_dir, [seg.path for seg in gone])
        # the segments are gone for good (directory synced): consume queues follow
        queue_files: list[tuple[Path, int]] = []
        for start in range(0, len(keys), _CQ_CLEAN_CHUNK):
            with self._lock:
                if self._closed:
                    break
                for key in keys[start : start + _CQ_CLEAN_CHUNK]:
                    cq = self._cqs.get(key)
                    if cq is not None:
                        cq.correct_min(cl_min)
                        queue_files.extend(cq.detach_expired())
        if queue_files:
            unlink_files([path for path, _ in queue_files])
        if gone:
            with self._lock:
                if not self._closed:
                    self._space.refresh()  # the freed space may end a FULL state
        return CleanResult(
            decision.reason,
            segments=len(gone),
            segment_bytes=sum(seg.size for seg in gone),
            queue_files=len(queue_files),
            queue_bytes=sum(size for _, size in queue_files),
            more=decision.more,
            commitlog_min_offset=cl_min,
        )

    @property
    def commitlog_bytes(self) -> int:
        """Bytes the commit log spans (blank fills included; they are holes on disk)."""
        with self._lock:
            return self._cl.max_offset - self._cl.min_offset

    @property
    def consume_queue_bytes(self) -> int:
        """Bytes of the consume-queue files (entries not yet removed by retention)."""
        with self._lock:
            return sum(cq.disk_bytes for cq in self._cqs.values())

    @property
    def open_files(self) -> int:
        """Descriptors the store holds now: the active segment, the file cache, the
        checkpoint and the lock file."""
        with self._lock:
            if self._closed:
                return 0
            return len(self._files) + (1 if self._cl.segment_count else 0) + 2

    @property
    def config(self) -> StoreConfig:
        return self._config

    @property
    def directory(self) -> Path:
        return self._dir
