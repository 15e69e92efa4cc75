"""Crash recovery of a store (RocketMQ's recovery from its ``StoreCheckpoint``).

It starts from the checkpoint: it walks the commit log only past the checkpoint's
offsets (plus ``recovery_verify_segments`` segments before them), verifying every
record's CRC and re-dispatching it idempotently (``dispatch``), so a restart costs the
tail written since the last flush, not the size of the log.  It truncates at the first
record that does not verify (dropping every later segment), then trims consume-queue
entries that point at or past the truncation point.  The checkpoint is trusted only
when it is inside the log, on a record boundary, and the consume queues agree with it
(as many entries below it as it counts, each queue's last one pointing at its record);
otherwise, or without a valid checkpoint, recovery walks the whole log.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from pathlib import Path

from ha_controller.protocol.errors import CorruptRecord, OffsetOutOfRange, StoreError
from ha_controller.protocol.record import BLANK, decode_record

from .checkpoint import Checkpoint, CheckpointFile
from .commitlog import CommitLog
from .dispatch import QueueIndex

__all__ = ["Recovered", "recover"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Recovered:
    #: the commit-log offset the walk verified from (the checkpoint's, normally)
    walked_from: int
    #: the newest store time seen (a put's store time never goes back)
    last_store_ts: int
    #: the checkpoint said the last stop was clean (a kill or a power loss does not)
    clean: bool
    #: there was a checkpoint (none: a new store, or one that lost it)
    checkpointed: bool


def recover(
    store_dir: Path,
    cl: CommitLog,
    index: QueueIndex,
    checkpoint: CheckpointFile,
    verify_segments: int,
) -> Recovered:
    """Load and recover the commit log and the consume queues; the log then ends where
    it verified, every queue agrees with it, everything is dispatched and a checkpoint
    says so."""
    walk = _Recovery(store_dir, cl, index, checkpoint, verify_segments)
    walk.run()
    return Recovered(walk.walked_from, walk.last_store_ts, walk.clean, walk.checkpointed)


class _Recovery:
    def __init__(
        self,
        store_dir: Path,
        cl: CommitLog,
        index: QueueIndex,
        checkpoint: CheckpointFile,
        verify_segments: int,
    ) -> None:
        self.store_dir = store_dir
        self.cl = cl
        self.index = index
        self.checkpoint = checkpoint
        self.verify_segments = verify_segments
        self.walked_from = 0
        self.last_store_ts = 0
        self.clean = False
        self.checkpointed = False

    def run(self) -> None:
        cp = self.checkpoint.load()
        self.clean = cp is not None and cp.clean_shutdown
        self.checkpointed = cp is not None
        self.cl.load()
        self.index.load()
        cl = self.cl
        walk_from, why = self.walk_start(cp)
        starts = cl.segment_starts()
        extra = self.verify_segments
        if extra and starts and walk_from > starts[0]:
            idx = max(0, bisect.bisect_right(starts, walk_from) - 1 - extra)
            walk_from, why = starts[idx], f"{why}, and {extra} segment(s) before it"
        self.walked_from = walk_from
        log.info(
            "store %s: recovering from commit log offset %d (%s; checkpoint %s, log [%d, %d))",
            self.store_dir,
            walk_from,
            why,
            cp,
            cl.min_offset,
            cl.max_offset,
        )
        end, gap = self.recovery_pass(walk_from)
        if gap and walk_from > cl.min_offset:
            log.warning(
                "store %s: consume queues miss entries before %d; rebuilding from %d",
                self.store_dir,
                walk_from,
                cl.min_offset,
            )
            walk_from = self.walked_from = cl.min_offset
            for key in self.index.rebased:
                self.index.cqs[key].truncate(0)
            end, _ = self.recovery_pass(walk_from)
        if end < cl.max_offset:
            log.warning(
                "store %s: truncating commit log at %d (%d bytes dropped)",
                self.store_dir,
                end,
                cl.max_offset - end,
            )
            cl.truncate(end)
        self.index.reput_offset = end
        cl.sync()
        skipped = 0
        for cq in self.index.cqs.values():
            cq.sync()
            skipped += cq.correct_min(cl.min_offset)
        if skipped:
            log.info(
                "store %s: %d consume-queue entries point below the commit log start %d "
                "(deleted by retention); skipping them",
                self.store_dir,
                skipped,
                cl.min_offset,
            )
        self.checkpoint.write(end, end, self.index.entries_total(), clean=False)
        log.info(
            "store %s: recovered, commit log [%d, %d), %d consume queues",
            self.store_dir,
            cl.min_offset,
            end,
            len(self.index.cqs),
        )

    def walk_start(self, cp: Checkpoint | None) -> tuple[int, str]:
        """Where recovery starts verifying the commit log, and why (for the log).

        The checkpoint's offsets when it is usable: inside the log, on a record boundary
        (a segment start, or where the last record some consume queue indexes below it
        ends), and every consume queue holds exactly the entries it had below it (their
        count adds up to ``queue_entries`` and each queue's last such entry points at
        its record).  Otherwise the start of the log: a full walk.
        """
        cl = self.cl
        if cp is None:
            return cl.min_offset, "no valid checkpoint"
        start = min(cp.commitlog_offset, cp.dispatched_offset)
        if not cl.min_offset <= start <= cl.max_offset:
            return cl.min_offset, "checkpoint outside the log"
        if cp.queue_entries is None:
            # a version-1 checkpoint: queues cannot be checked; the last segments too
            starts = cl.segment_starts()
            window = starts[max(0, len(starts) - 3)] if starts else start
            return min(cl.segment_start(start), window), "version-1 checkpoint"
        entries = 0
        anchor = cl.min_offset
        for (topic, queue_id), cq in self.index.cqs.items():
            last = cq.entry(cq.max_offset - 1) if len(cq) else None
            # after a flush every entry lies below the checkpoint: no search needed
            below = cq.max_offset if last and last[0] < start else cq.first_at_or_after(start)
            entries += below
            if below > cq.first_offset:
                end = self.entry_end(topic, queue_id, below - 1)
                if end is None:
                    return cl.min_offset, f"consume queue {topic}/{queue_id} disagrees"
                anchor = max(anchor, end)
        if entries != cp.queue_entries:
            return cl.min_offset, (
                f"consume queues hold {entries} entries below it, checkpoint {cp.queue_entries}"
            )
        if start not in (anchor, cl.segment_start(start)):
            return cl.min_offset, "checkpoint not at a record boundary"
        return start, "checkpoint"

    def entry_end(self, topic: str, queue_id: int, queue_offset: int) -> int | None:
        """Where the record of a consume-queue entry ends, if the entry points at a
        verified record that says it is that entry; else None."""
        entry = self.index.cqs[(topic, queue_id)].entry(queue_offset)
        if entry is None:
            return None
        phys, size, _ = entry
        try:
            record, got = decode_record(self.cl.read_at(phys, size), 0)
        except (CorruptRecord, StoreError, OffsetOutOfRange):
            return None
        if record is BLANK or got != size:
            return None
        if (record.topic, record.queue_id, record.queue_offset, record.physical_offset) != (
            topic,
            queue_id,
            queue_offset,
            phys,
        ):
            return None
        return phys + size

    def recovery_pass(self, walk_from: int) -> tuple[int, bool]:
        """Verify and re-dispatch from ``walk_from``; returns (valid end, gap seen)."""
        end = walk_from
        gap = False
        last_seen: dict[tuple[str, int], int] = {}
        try:
            for offset, record, size in self.cl.scan(walk_from):
                end = offset + size
                if record is BLANK:
                    continue
                _, record_gap = self.index.dispatch(record, size, recovering=True)
                gap = gap or record_gap
                last_seen[(record.topic, record.queue_id)] = record.queue_offset
                self.last_store_ts = max(self.last_store_ts, record.store_ts_ms)
        except CorruptRecord as exc:
            log.warning("store %s: commit log ends at %d: %s", self.store_dir, end, exc)
        for key, cq in self.index.cqs.items():
            seen = last_seen.get(key)
            keep = seen + 1 if seen is not None else cq.first_at_or_after(walk_from)
            if keep < cq.max_offset:
                log.warning(
                    "store %s: consume queue %s/%d: dropping entries [%d, %d)",
                    self.store_dir,
                    key[0],
                    key[1],
                    keep,
                    cq.max_offset,
                )
                cq.truncate(keep)
        return end, gap
