"""The consume queues of a store and the dispatch that builds them from the commit log
(RocketMQ's ``ReputMessageService``).

:class:`QueueIndex` holds every queue by (topic, queue id) and how far the commit log is
dispatched (``reput_offset``).  :meth:`QueueIndex.dispatch` writes one record's entry
idempotently (an entry already in place is skipped, one that disagrees is rewritten
from the log, an empty queue starts where its first record says); :meth:`QueueIndex.reput`
dispatches from the reput offset on, gathering the entries that continue a queue into
runs written with one ``pwrite`` per queue file, and indexes the records' keys
(``keyindex``) when the store keeps a key index.  Recovery (``recovery``) dispatches
the walked log through the same :meth:`QueueIndex.dispatch`.  The store's lock is the
caller's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from ha_controller.protocol.errors import CorruptRecord, StoreError
from ha_controller.protocol.record import BLANK, DispatchHead, StoredMessage, tag_hash

from .commitlog import CommitLog, store_error
from .consumequeue import ConsumeQueue
from .files import FileCache
from .keyindex import KeyIndex, Record
from .types import TOPIC_RE, Dispatched

__all__ = ["QueueIndex"]

log = logging.getLogger(__name__)


class QueueIndex:
    """The consume queues and the dispatch of commit-log records into them."""

    def __init__(self, store_dir: Path, files: FileCache, file_entries: int) -> None:
        self.store_dir = store_dir
        self.root = store_dir / "consumequeue"
        self._files = files
        self._file_entries = file_entries
        self.cqs: dict[tuple[str, int], ConsumeQueue] = {}
        #: the commit-log offset dispatched up to
        self.reput_offset = 0
        #: entries a put dispatched on the reput loop's behalf, for its next reput
        self.pending: list[Dispatched] = []
        #: queues recovery rebased (entries before it may be lost)
        self.rebased: set[tuple[str, int]] = set()
        #: replicated records skipped because their queue offset left a gap
        self.gaps = 0
        #: the key index the reput feeds too (None: keys are not indexed)
        self.keys: KeyIndex | None = None

    def load(self) -> None:
        """The consume queues on disk."""
        try:
            for topic_dir in sorted(self.root.iterdir()):
                if not topic_dir.is_dir() or not TOPIC_RE.match(topic_dir.name):
                    continue
                for queue_dir in sorted(topic_dir.iterdir()):
                    if queue_dir.is_dir() and queue_dir.name.isdigit():
                        cq = ConsumeQueue.load(
                            self.root,
                            topic_dir.name,
                            int(queue_dir.name),
                            self._files,
                            self._file_entries,
                        )
                        self.cqs[(cq.topic, cq.queue_id)] = cq
        except OSError as exc:
            raise store_error(exc, f"cannot load consume queues in {self.root}") from exc

    def entries_total(self) -> int:
        """Sum of every consume queue's max offset (the checkpoint's ``queue_entries``)."""
        return sum(cq.max_offset for cq in self.cqs.values())

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self.cqs.get(key)
        if cq is None:
            cq = self.cqs[key] = ConsumeQueue(
                self.root,
                topic,
                queue_id,
                self._files,
                self._file_entries,
            )
        return cq

    def dispatch(
        self,
        msg: StoredMessage | DispatchHead,
        size: int,
        *,
        recovering: bool = False,
        write: bool = True,
    ) -> tuple[Dispatched | None, bool]:
        """Write the consume-queue entry of ``msg`` idempotently; returns (entry, gap).

        ``write=False``: the queue is made ready for the entry (rebased, or cut back where
        it disagrees) but the caller appends it, as the next of a run (see reput)."""
        if not TOPIC_RE.match(msg.topic):
            log.error("record at %d has an invalid topic %r", msg.physical_offset, msg.topic)
            return None, False
        cq = self.queue(msg.topic, msg.queue_id)
        th = tag_hash(msg.tags)
        qoff = msg.queue_offset
        gap = False
        if not len(cq) and qoff != cq.max_offset:
            # An empty queue starts wherever its first record says (a slave that began
            # replicating mid-log).  During recovery that may also mean lost entries.
            gap = recovering and qoff != 0
            if gap:
                self.rebased.add((msg.topic, msg.queue_id))
            cq.rebase(qoff)
        elif qoff < cq.max_offset:
            if qoff < cq.min_offset:
                log.warning(
                    "record at %d: queue offset %d of %s/%d is below the queue start %d",
                    msg.physical_offset,
                    qoff,
                    msg.topic,
                    msg.queue_id,
                    cq.min_offset,
                )
                return None, True
            if cq.entry(qoff) == (msg.physical_offset, size, th):
                return None, False
            log.warning(
                "consume queue %s/%d: entry %d disagrees with the commit log; rewriting from it",
                msg.topic,
                msg.queue_id,
                qoff,
            )
            cq.truncate(qoff)
        elif qoff > cq.max_offset:
            log.error(
                "consume queue %s/%d: record at %d has queue offset %d, expected %d; skipped",
                msg.topic,
                msg.queue_id,
                msg.physical_offset,
                qoff,
                cq.max_offset,
            )
            self.gaps += 1
            return None, True
        if write:
            cq.append(msg.physical_offset, size, th)
        return (
            Dispatched(
                msg.topic, msg.queue_id, qoff, th, msg.physical_offset, size, msg.store_ts_ms
            ),
            gap,
        )

    def reput(self, cl: CommitLog, max_bytes: int | None) -> list[Dispatched]:
        """Dispatch from the reput offset on.  The entries that continue a queue are
        gathered into runs and each run written with one ``pwrite`` per queue file, as
        ``MessageStore.put_batch`` does (a slave's reput wrote one per entry: 16 % of its
        CPU in the produce profile); any other case goes through :meth:`dispatch` first."""
        out: list[Dispatched] = []
        start = max(self.reput_offset, cl.min_offset)
        self.reput_offset = start
        if start >= cl.max_offset:
            return out
        runs: dict[tuple[str, int], tuple[ConsumeQueue, list[tuple[int, int, int]]]] = {}
        keys = self.keys
        keyed: list[Record] = []  # indexed at once when the reput ends
        try:
            for offset, record, size in cl.scan(start, heads=True):
                if record is not BLANK:
                    if keys is not None and (record.keys or record.uniq_key):
                        keyed.append((record.topic, record.keys, record.uniq_key, offset, size))
                    key = (record.topic, record.queue_id)
                    run = runs.get(key)
                    if run is not None and record.queue_offset == run[0].max_offset + len(run[1]):
                        th = tag_hash(record.tags)
                        run[1].append((offset, size, th))
                        out.append(
                            Dispatched(
                                record.topic,
                                record.queue_id,
                                record.queue_offset,
                                th,
                                offset,
                                size,
                                record.store_ts_ms,
                            )
                        )
                    else:
                        if run is not None:
                            # dispatch must see this queue as written; all runs go now,
                            # so that a failed write rewinds past every unwritten one
                            self._write_runs(runs)
                            runs.clear()
                        dispatched, _ = self.dispatch(record, size, write=False)
                        if dispatched is not None:
                            entry = (offset, size, dispatched.tag_hash)
                            runs[key] = (self.cqs[key], [entry])
                            out.append(dispatched)
                self.reput_offset = offset + size
                if max_bytes is not None and self.reput_offset - start >= max_bytes:
                    break
        except CorruptRecord:
            log.exception("store %s: reput found a corrupt record", self.store_dir)
            self._write_runs(runs)  # the whole records before it
            raise
        finally:
            if keys is not None:
                keys.add_many(keyed)
                keys.indexed_to = max(keys.indexed_to, self.reput_offset)
                keys.commit_some()
        self._write_runs(runs)
        return out

    def _write_runs(
        self, runs: Mapping[tuple[str, int], tuple[ConsumeQueue, list[tuple[int, int, int]]]]
    ) -> None:
        """Append each run to its queue.  When one fails, the reput goes back to the
        first record of the runs not written, so the next reput dispatches again from
        there (what was written is found in place and skipped)."""
        pending = list(runs.values())
        for i, (cq, entries) in enumerate(pending):
            try:
                cq.append_many(entries)
            except StoreError:
                first = min(run[0][0] for _, run in pending[i:])
                self.reput_offset = min(self.reput_offset, first)
                raise
