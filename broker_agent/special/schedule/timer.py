"""The timer store: timer messages (``TIMER_DELIVER_MS``) and how far their delivery got.

The timer queue ``rmq_sys_wheel_timer`` queue 0 is in store order, so the timer loop
keeps the undelivered entries in a due-time heap (:class:`TimerIndex`), rebuilt from the
queue at the start of each session, and delivers the head when it is due.

Progress is the timer checkpoint (:class:`TimerCheckpoint`):
``master_timer_queue_offset`` (how far the timer queue has been read into the heap) and
``last_read_time_ms`` (every read entry due at or before it has been delivered), with a
DataVersion that moves on every change.  It is persisted (JSON, atomic), served
(GET_TIMER_CHECK_POINT), forward-synced to slaves while the master is online, and
reverse-synced by a returning master in pre-online when a slave's version is >= its
own; each delivery also carries the checkpoint that holds after it to the slaves as a
progress record in the commit log (:meth:`TimerMark.record`).

A recall marker in the timer queue (``TIMER_DEL_UNIQKEY``) is never delivered itself:
it adds its message to the recall table (:mod:`.recall_table`).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_agent.metadata.json_table import JsonTable, oldest
from broker_agent.metadata.progress import ProgressLog, catch_up, replay
from broker_agent.metadata.versioned import TableSync
from broker_agent.special.ports import CorePort, WritePort
from broker_agent.special.schedule.delivery import IDLE_WAIT_S, OVERDUE_LOG_MS, POLL_S, Delivery
from broker_agent.special.schedule.recall_table import RecallTable
from broker_agent.special.schedule.target import TIMER_QUEUE_ID, due_ms
from ha_controller.dataversion import DataVersion
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import RecordUnderRepair
from ha_controller.protocol.properties import (
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_UNIQ_KEY,
    TIMER_CHECKPOINT_GROUP,
    TIMER_TOPIC,
)
from ha_controller.wire import data_version_from_pb, data_version_to_pb

__all__ = [
    "TimerCheckpoint",
    "TimerCheckpointFile",
    "TimerIndex",
    "TimerLoop",
    "TimerMark",
    "timer_checkpoint_sync",
    "timer_from_pb",
]

log = logging.getLogger(__name__)


# ---- the checkpoint and the index (plain objects) ---------------------------------------


@dataclass
class TimerCheckpoint:
    """How far timer delivery got: entries of the timer queue below
    ``master_timer_queue_offset`` that are due at or before ``last_read_time_ms``
    have been delivered, and so have those due in the millisecond after it whose queue
    offset is below ``next_ms_delivered_below`` (0: none).  Entries due in the same
    millisecond are delivered in queue order, so that one number says which of them
    are done when a failover or a return comes between two of them."""

    last_read_time_ms: int = 0
    master_timer_queue_offset: int = 0
    data_version: DataVersion | None = None
    next_ms_delivered_below: int = 0

    def __post_init__(self) -> None:
        if self.data_version is None:
            self.data_version = DataVersion()

    @property
    def version(self) -> DataVersion:
        assert self.data_version is not None
        return self.data_version

    def to_dict(self) -> dict[str, object]:
        return {
            "lastReadTimeMs": self.last_read_time_ms,
            "masterTimerQueueOffset": self.master_timer_queue_offset,
            "nextMsDeliveredBelow": self.next_ms_delivered_below,
            "dataVersion": self.version.to_dict(),
        }

    @property
    def mark(self) -> TimerMark:
        return TimerMark(
            self.last_read_time_ms, self.master_timer_queue_offset, self.next_ms_delivered_below
        )

    def delivered(self, due: int, offset: int) -> bool:
        """Whether the entry at ``offset`` of the timer queue, due at ``due``, is done."""
        if offset >= self.master_timer_queue_offset:
            return False
        return due <= self.last_read_time_ms or (
            due == self.last_read_time_ms + 1 and offset < self.next_ms_delivered_below
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TimerCheckpoint:
        """What :meth:`to_dict` wrote (KeyError, ValueError, TypeError, AttributeError for
        another shape; ``nextMsDeliveredBelow`` came later and may be missing)."""
        return cls(
            int(data["lastReadTimeMs"]),
            int(data["masterTimerQueueOffset"]),
            DataVersion.from_dict(data["dataVersion"]),
            int(data.get("nextMsDeliveredBelow", 0)),
        )


@dataclass(frozen=True, slots=True)
class TimerMark:
    """A timer checkpoint without its version (see :class:`TimerCheckpoint`)."""

    last_read_time_ms: int
    queue_offset: int
    next_ms_delivered_below: int = 0

    def order(self) -> tuple[int, int, int]:
        """Where this mark stands among one master's marks, which only move on: the
        timer queue is read further (``queue_offset`` grows, ``last_read_time_ms`` may
        drop to an earlier due time of what was read), or, with the queue read as far,
        deliveries move ``last_read_time_ms`` (and ``next_ms_delivered_below``) on."""
        return (self.queue_offset, self.last_read_time_ms, self.next_ms_delivered_below)

    def record(self) -> dict[str, str]:
        """As a progress record (replicated through the commit log)."""
        return {
            "G": TIMER_CHECKPOINT_GROUP,
            "L": str(self.last_read_time_ms),
            "O": str(self.queue_offset),
            "B": str(self.next_ms_delivered_below),
        }

    @classmethod
    def from_record(cls, record: Mapping[str, str]) -> TimerMark:
        """The mark of a :meth:`record` (KeyError, ValueError)."""
        return cls(int(record["L"]), int(record["O"]), int(record.get("B", "0")))


class TimerCheckpointFile(JsonTable):
    """The timer checkpoint, persisted; its version moves on every change."""

    what = "timer checkpoint"
    rebuilt_from = (
        "rebuilt from the timer checkpoint records in the commit log (a replica's "
        "checkpoint, newer, is adopted in pre-online and by the forward sync)"
    )
    persist_when_missing = True

    def __init__(self, path: Path | None) -> None:
        super().__init__(path)
        self.cp = TimerCheckpoint()
        #: slave: the mark of the last progress record replicated to this broker since
        #: it started (what its own commit log says was delivered)
        self.replicated: TimerMark | None = None

    @property
    def data_version(self) -> DataVersion:
        return self.cp.version

    def restore(self, data: Any) -> None:
        self.cp = TimerCheckpoint.from_dict(data)

    def start_over(self) -> None:
        self.cp = TimerCheckpoint(data_version=oldest())

    def rebuild_from_log(self, store: ProgressLog) -> int:
        """Take the newest timer checkpoint record still in the commit log (after
        :meth:`start_over`); how many there were."""
        return replay(store, TIMER_CHECKPOINT_GROUP, self.apply_record)

    def catch_up_with_log(self, store: ProgressLog) -> int:
        """After an unclean stop: take the timer checkpoint records stored since the
        file was written, each only where it is ahead of the checkpoint (an acting
        slave's own progress has no record); how many there were."""
        return catch_up(store, TIMER_CHECKPOINT_GROUP, self._apply_forward, self.written_ms())

    def _apply_forward(self, record: Mapping[str, str]) -> None:
        mark, cp = TimerMark.from_record(record), self.cp
        ahead = (mark.last_read_time_ms, mark.next_ms_delivered_below, mark.queue_offset) > (
            cp.last_read_time_ms,
            cp.next_ms_delivered_below,
            cp.master_timer_queue_offset,
        )
        if ahead:
            self._set(mark)

    def payload(self) -> dict[str, Any]:
        return self.cp.to_dict()

    def _set(self, mark: TimerMark) -> bool:
        cp = self.cp
        if mark == cp.mark:
            return False
        cp.last_read_time_ms = mark.last_read_time_ms
        cp.master_timer_queue_offset = mark.queue_offset
        cp.next_ms_delivered_below = mark.next_ms_delivered_below
        self._dirty = True
        return True

    def advance(self, mark: TimerMark) -> bool:
        if not self._set(mark):
            return False
        self.cp.version.next_version()
        return True

    def bump(self) -> None:
        self.cp.version.take_over()
        self._dirty = True

    def apply_replicated(self, mark: TimerMark) -> None:
        """A checkpoint the master reached, replicated through the commit log (slave
        side; records arrive in log order, so the newest wins)."""
        self.replicated = mark
        self._set(mark)

    def take_from_master(self, other: TimerCheckpoint) -> bool:
        """Forward sync on a slave: the master's checkpoint and version, but not a mark
        behind the last progress record replicated here.  A master appends a
        delivery's record with the message and moves its own checkpoint only once its
        replicas confirm both, so its table may be behind its log for as long as it
        waits (``controller-slave-behind``, seed 3305: a 2.5 s wait for a frozen
        slave; the 2 s sync took the older checkpoint, and the slave that acted next
        delivered that message again)."""
        ahead = self.replicated
        if ahead is None or ahead.order() <= other.mark.order():
            return self.assign(other)
        taken = TimerCheckpoint(
            ahead.last_read_time_ms,
            ahead.queue_offset,
            other.version.copy(),
            ahead.next_ms_delivered_below,
        )
        return self.assign(taken)

    def apply_record(self, record: Mapping[str, str]) -> None:
        """:meth:`apply_replicated` of a :meth:`TimerMark.record` (KeyError, ValueError)."""
        self.apply_replicated(TimerMark.from_record(record))

    def to_pb(self) -> broker_pb2.TimerCheckpoint:
        cp = self.cp
        return broker_pb2.TimerCheckpoint(
            last_read_time_ms=cp.last_read_time_ms,
            master_timer_queue_offset=cp.master_timer_queue_offset,
            data_version=data_version_to_pb(cp.version),
            next_ms_delivered_below=cp.next_ms_delivered_below,
        )

    def assign(self, other: TimerCheckpoint) -> bool:
        if other.to_dict() == self.cp.to_dict():
            return False
        self.cp = TimerCheckpoint(
            other.last_read_time_ms,
            other.master_timer_queue_offset,
            other.version.copy(),
            other.next_ms_delivered_below,
        )
        self._dirty = True
        return True

    def adopt_on_promotion(self, other: TimerCheckpoint, queue_end: int) -> bool:
        """Pre-online of a member just elected master: take a member's checkpoint whose
        mark is ahead of ours, whatever the versions (each slave that acted moved the
        version on when it took over, so they tell nothing about which delivered more:
        ``controller-slave-behind``, seed 3305, two slaves acted one after the other,
        the second delivered a due message, and the member elected, the first, kept its
        own checkpoint by its version and delivered that message again).  Not one that
        read the timer queue beyond ``queue_end``, ours: that member holds a tail this
        log lacks (unacknowledged; it is cut when it follows us), and its mark would
        count what this master stores at those queue offsets as delivered."""
        if (
            other.mark.order() <= self.cp.mark.order()
            or other.master_timer_queue_offset > queue_end
        ):
            return False
        newer = other.version if other.version.compare(self.cp.version) > 0 else self.cp.version
        self.assign(
            TimerCheckpoint(
                other.last_read_time_ms,
                other.master_timer_queue_offset,
                newer.copy(),
                other.next_ms_delivered_below,
            )
        )
        self.persist()
        return True

    def adopt_if_newer(self, other: TimerCheckpoint) -> bool:
        if self.cp.version.compare(other.version) > 0:
            return False
        self.assign(other)
        self._dirty = True
        self.persist()
        return True


class TimerIndex:
    """The undelivered timer entries read so far, by due time (a heap)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int]] = []  # (due ms, queue offset)
        self.read_offset = 0
        self.max_delivered_due = 0
        #: UNIQ_KEY -> (due ms, real topic) of the entries in the heap (what a recall
        #: may name)
        self.due_of: dict[str, tuple[int, str]] = {}
        self._uniq_at: dict[int, str] = {}
        #: (due, queue offset) of the entry popped last
        self._popped: tuple[int, int] | None = None
        #: the read stopped at a damaged entry (store.repair): below it nothing is
        #: known, so no checkpoint may be taken (it would move back to it)
        self.held = False

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, due: int, offset: int, uniq_key: str = "", topic: str = "") -> None:
        heapq.heappush(self._heap, (due, offset))
        if uniq_key:
            self.due_of[uniq_key] = (due, topic)
            self._uniq_at[offset] = uniq_key

    def peek(self) -> tuple[int, int] | None:
        return self._heap[0] if self._heap else None

    def pop(self) -> None:
        due, offset = heapq.heappop(self._heap)
        self.max_delivered_due = max(self.max_delivered_due, due)
        self._popped = (due, offset)
        uniq = self._uniq_at.pop(offset, None)
        entry = self.due_of.get(uniq) if uniq is not None else None
        if uniq is not None and entry is not None and entry[0] == due:
            del self.due_of[uniq]

    def _mark(self, next_due: int | None, popped: tuple[int, int] | None, top: int) -> TimerMark:
        if next_due is None:
            return TimerMark(top, self.read_offset)
        last = next_due - 1
        # the heap pops by (due, offset), and entries are read in offset order: the
        # delivered entries due at next_due are those below the last one popped
        below = popped[1] + 1 if popped is not None and popped[0] == next_due else 0
        return TimerMark(last, self.read_offset, below)

    def checkpoint_after_head(self) -> TimerMark:
        """:meth:`checkpoint` as it will be once the head entry is popped."""
        head = self._heap[0]
        after = [self._heap[i][0] for i in (1, 2) if i < len(self._heap)]
        top = max(self.max_delivered_due, head[0])
        return self._mark(min(after) if after else None, head, top)

    def checkpoint(self) -> TimerMark:
        """The checkpoint that holds now: every entry below the read offset that is
        due at or before the time is delivered, and those of the next millisecond
        below ``next_ms_delivered_below`` (the heap holds exactly the undelivered ones)."""
        head = self.peek()
        return self._mark(None if head is None else head[0], self._popped, self.max_delivered_due)


def timer_from_pb(pb: broker_pb2.TimerCheckpoint) -> TimerCheckpoint:
    return TimerCheckpoint(
        pb.last_read_time_ms,
        pb.master_timer_queue_offset,
        data_version_from_pb(pb.data_version),
        pb.next_ms_delivered_below,
    )


def _describe(snapshot: TimerCheckpoint) -> str:
    below = snapshot.next_ms_delivered_below
    return (
        f"offset {snapshot.master_timer_queue_offset}, last read {snapshot.last_read_time_ms}"
        + (f" (and the next ms below offset {below})" if below else "")
    )


def timer_checkpoint_sync(
    timer: TimerCheckpointFile, busy: Callable[[], bool], queue_end: Callable[[], int]
) -> TableSync[broker_pb2.TimerCheckpoint, TimerCheckpoint]:
    """The checkpoint for forward sync (never behind the progress records this slave
    holds), reverse sync, and the cut's replace (as it is)."""
    return TableSync(
        "timer checkpoint",
        RequestCode.GET_TIMER_CHECK_POINT,
        broker_pb2.TimerCheckpoint,
        decode=timer_from_pb,
        take=timer.take_from_master,
        adopt=timer.adopt_if_newer,
        take_as_is=timer.assign,
        promote=lambda other: timer.adopt_on_promotion(other, queue_end()),
        describe=_describe,
        busy=busy,
        file=timer,
    )


# ---- the timer loop -------------------------------------------------------------------


class TimerLoop:
    """Delivers due timer messages in due order, one session at a time."""

    def __init__(
        self,
        core: CorePort,
        write_path: WritePort,
        timer: TimerCheckpointFile,
        recalls: RecallTable,
        delivery: Delivery,
    ) -> None:
        self.core = core
        self.cfg = core.cfg
        self.write_path = write_path
        self.timer = timer
        self.recalls = recalls
        self.delivery = delivery
        #: the timer entries read and not delivered yet, while a session runs
        self.index: TimerIndex | None = None

    def read_queue(self, index: TimerIndex) -> None:
        """Add what was stored in the timer queue since it was last read."""
        store = self.core.store
        cp = self.timer.cp
        top = store.max_offset(TIMER_TOPIC, TIMER_QUEUE_ID)
        index.held = False
        while index.read_offset < top:
            offset = index.read_offset
            try:
                msg = store.get_message_at(TIMER_TOPIC, TIMER_QUEUE_ID, offset)
            except RecordUnderRepair:
                index.held = True  # damaged: read from here once it is repaired
                return
            index.read_offset += 1
            if msg is None:
                continue
            due = due_ms(self.cfg, msg)
            recalled = msg.properties.get(PROPERTY_TIMER_DEL_UNIQKEY)
            if recalled:  # a recall marker: never delivered itself
                if self.recalls.add(recalled, due, msg.properties.get(PROPERTY_REAL_TOPIC, "")):
                    log.info("timer message %s recalled (marker at %d)", recalled, offset)
                continue
            if cp.delivered(due, offset):
                continue  # delivered before the checkpoint was taken
            index.add(
                due,
                offset,
                msg.properties.get(PROPERTY_UNIQ_KEY, ""),
                msg.properties.get(PROPERTY_REAL_TOPIC, ""),
            )

    async def run(self) -> None:
        """One session: from the timer queue's start, until the session stops."""
        index = TimerIndex()
        self.index = index
        try:
            await self._deliveries(index)
        finally:
            self.index = None
            self.core.metrics.timer_pending.labels(**self.core.metrics.ident).set(0)

    async def _deliveries(self, index: TimerIndex) -> None:
        store = self.core.store
        index.read_offset = store.min_offset(TIMER_TOPIC, TIMER_QUEUE_ID)
        index.max_delivered_due = self.timer.cp.last_read_time_ms
        cp = self.timer.cp
        self.read_queue(index)
        head = index.peek()
        # what a session starts from: after a failover or a return, the line to read
        # when a message comes twice or late
        log.info(
            "timer: checkpoint queue offset %d, delivered up to %d; queue read to %d, "
            "%d to deliver%s",
            cp.master_timer_queue_offset,
            cp.last_read_time_ms,
            index.read_offset,
            len(index),
            "" if head is None else f", next due {head[0]} (queue offset {head[1]})",
        )
        pending = self.core.metrics.timer_pending.labels(**self.core.metrics.ident)
        delivery = self.delivery
        while not delivery.stopping:
            self.read_queue(index)
            pending.set(len(index))
            if index.held:
                # nothing is delivered or checkpointed until the damaged entry is back:
                # a checkpoint now would name its offset, below the one it had (the
                # entries between would come again), and it may be due first
                await delivery.clock.sleep(POLL_S)
                continue
            head = index.peek()
            now = delivery.clock.now_ms()
            if head is None or head[0] > now:
                self._checkpoint(index)
                wait = IDLE_WAIT_S if head is None else min((head[0] - now) / 1000, IDLE_WAIT_S)
                # a message that arrives meanwhile may be due before the head
                await delivery.arrival(TIMER_TOPIC, TIMER_QUEUE_ID, wait)
                continue
            offset = head[1]
            try:
                msg = store.get_message_at(TIMER_TOPIC, TIMER_QUEUE_ID, offset)
            except RecordUnderRepair:
                await delivery.clock.sleep(POLL_S)  # held until it is repaired
                continue
            if msg is None:
                index.pop()
                self._checkpoint(index)
                continue
            if delivery.recalled(msg):
                index.pop()
                self._checkpoint(index)
                continue
            if now - head[0] > OVERDUE_LOG_MS:
                delivery.log_overdue("timer", msg, offset, now - head[0])
            # the checkpoint that holds once this head is delivered travels with it
            mark = index.checkpoint_after_head()
            progress = mark.record()
            with self.core.special_steps.step():
                delivered = await delivery.deliver(msg, "timer", progress)
                if delivered:
                    index.pop()
                    self.timer.advance(mark)
            if not delivered:
                await delivery.clock.sleep(POLL_S)
                continue
            await self.write_path.progress_durable(self.timer)

    def _checkpoint(self, index: TimerIndex) -> None:
        mark = index.checkpoint()
        if self.timer.advance(mark):
            # the slave that may act next learns it with the durability of a message,
            # not by the 2 s forward sync (a delivery in that window came twice)
            self.write_path.replicate_record(mark.record())
