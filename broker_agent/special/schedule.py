"""Delayed (level) and timer messages (reference/rip32.md §3.2, §5; DESIGN.md §5).

A send whose properties carry ``DELAY`` (level 1..N of ``delay_levels``) or
``TIMER_DELIVER_MS`` (absolute ms) is stored not in its topic but in a system
topic: ``SCHEDULE_TOPIC_XXXX`` queue ``level - 1``, or the timer topic
``rmq_sys_wheel_timer`` queue 0, with the real topic and queue in
``REAL_TOPIC`` / ``REAL_QID`` and the due time in ``DUE_MS``.

The schedule service runs only on the master and on the acting slave
(``BrokerCore.add_special_service``).  Each level's queue is in due
order, so one task per level waits for its head; the timer queue is in store
order, so its task keeps a due-time heap rebuilt from the queue at start.  Due
messages go through the escape bridge (a local put on a master; local-in-
container or remote escape on an acting slave) and progress moves only after a
successful escape:

- delay offsets: level -> next queue offset, with a DataVersion that moves
  every ``delay_offset_update_version_step`` updates;
- timer checkpoint: ``master_timer_queue_offset`` (how far the timer queue has
  been read into the heap) and ``last_read_time_ms`` (every read entry due at
  or before it has been delivered), with a DataVersion that moves on every
  change.

Both are persisted (JSON, atomic), served (GET_ALL_DELAY_OFFSET,
GET_TIMER_CHECK_POINT), forward-synced to slaves while the master is online,
and reverse-synced by a returning master in pre-online when a slave's version
is >= its own, so it delivers nothing again (issue #7601 is that bug).

Recall (RocketMQ 5.3 RECALL_MESSAGE): a timer message still waiting for its
delivery time can be recalled by its UNIQ_KEY; the schedule service skips a
recalled message when it comes due.  The recall is kept in :class:`RecallTable`
(persisted, forward-synced to slaves, reverse-synced in pre-online) and, on a
master, also written as a marker record into the timer queue itself
(``TIMER_DEL_UNIQKEY``, RocketMQ's way) through the write path and confirmed by
the replicas before the recall is acknowledged: a slave that takes over reads
the marker from its replicated timer queue, so a failover right after a recall
cannot deliver the message.  An acting slave cannot write its store: it keeps
the recall in its table, which the returning master adopts in pre-online.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from broker_agent.metadata.offsets import write_json_atomic
from broker_agent.metadata.versioned import VersionedTable, fetch_table
from broker_agent.special.escape_ids import escape_id
from broker_agent.special.ports import CorePort, EscapePort, WritePort
from ha_controller.config import BrokerConfig
from ha_controller.dataversion import DataVersion, SteppedVersion
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    BadRequest,
    EscapeFailed,
    NotMaster,
    NotRecallable,
    NotWritable,
)
from ha_controller.protocol.properties import (
    DELAY_OFFSET_GROUP,
    PROPERTY_DELAY,
    PROPERTY_DUE_MS,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_UNIQ_KEY,
    SCHEDULE_TOPIC,
    TIMER_CHECKPOINT_GROUP,
    TIMER_TOPIC,
    now_ms,
)
from ha_controller.protocol.record import StoredMessage
from ha_controller.rpc import ConnectionPool, RequestContext
from ha_controller.wire import data_version_from_pb, data_version_to_pb

log = logging.getLogger(__name__)

# delay offsets replicate through the commit log as offset records of this pseudo
# group (queue id = delay level), like consumer offsets
TIMER_QUEUE_ID: Final = 0
#: Properties that only mean something while a message waits; dropped on delivery.
SCHEDULE_PROPERTIES: Final = frozenset(
    {
        PROPERTY_DELAY,
        PROPERTY_TIMER_DELIVER_MS,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QID,
        PROPERTY_DUE_MS,
    }
)
#: the pause before a delivery that failed is tried again (RocketMQ DELAY_FOR_A_WHILE)
POLL_S: Final = 0.1
#: the longest the delay-level and timer loops sleep with nothing due: they wake when a
#: message arrives in their queue (PullHoldService.arrival) or falls due; this is the
#: backstop (a wall clock that jumps).  Polling every POLL_S, the 19 loops woke the
#: event loop 190 times a second on an idle broker: 5 % of a busy master's samples.
IDLE_WAIT_S: Final = 1.0
#: a delivery this late (ms) is logged: the catch-up after a failover or a return
OVERDUE_LOG_MS: Final = 1_000
#: at most this many such lines per session (a long outage can leave thousands due)
OVERDUE_LOG_LINES: Final = 20
PERSIST_INTERVAL_S: Final = 1.0
#: Recalled ids kept at most; the ones due earliest are forgotten first.
MAX_RECALLS: Final = 100_000


# ---- send side ---------------------------------------------------------------


def delayed_target(
    cfg: BrokerConfig,
    topic: str,
    queue_id: int,
    props: dict[str, str],
    now: int | None = None,
) -> tuple[str, int]:
    """Where a sent message is stored: its own (topic, queue) or, for a delayed
    one, the schedule/timer queue; ``props`` is rewritten in place for the latter.

    Raises BadRequest for a malformed DELAY / TIMER_DELIVER_MS.
    """
    level_text = props.get(PROPERTY_DELAY)
    deliver_text = props.get(PROPERTY_TIMER_DELIVER_MS)
    if level_text is None and deliver_text is None:
        return topic, queue_id
    now = now_ms() if now is None else now
    if level_text is not None:
        try:
            level = int(level_text)
        except ValueError:
            raise BadRequest(f"{PROPERTY_DELAY}={level_text!r} is not a delay level") from None
        if level <= 0:
            props.pop(PROPERTY_DELAY)
            return topic, queue_id
        level = min(level, cfg.max_delay_level)
        props[PROPERTY_DELAY] = str(level)
        due = now + cfg.delay_level_ms(level)
        target = (SCHEDULE_TOPIC, level - 1)
    else:
        assert deliver_text is not None
        try:
            deliver = int(deliver_text)
        except ValueError:
            raise BadRequest(
                f"{PROPERTY_TIMER_DELIVER_MS}={deliver_text!r} is not a timestamp"
            ) from None
        if deliver <= now:
            props.pop(PROPERTY_TIMER_DELIVER_MS)  # already due: a normal message
            return topic, queue_id
        if deliver - now > cfg.timer_max_delay_ms:
            raise BadRequest(
                f"{PROPERTY_TIMER_DELIVER_MS}={deliver} is {deliver - now} ms ahead, more "
                f"than timer_max_delay_ms={cfg.timer_max_delay_ms}"
            )
        due = deliver
        target = (TIMER_TOPIC, TIMER_QUEUE_ID)
    props[PROPERTY_REAL_TOPIC] = topic
    props[PROPERTY_REAL_QID] = str(queue_id)
    props[PROPERTY_DUE_MS] = str(due)
    return target


def due_ms(cfg: BrokerConfig, msg: StoredMessage) -> int:
    text = msg.properties.get(PROPERTY_DUE_MS)
    if text is not None:
        try:
            return int(text)
        except ValueError:
            pass
    if msg.topic == SCHEDULE_TOPIC:
        return msg.store_ts_ms + cfg.delay_level_ms(msg.queue_id + 1)
    return int(msg.properties.get(PROPERTY_TIMER_DELIVER_MS, msg.store_ts_ms))


def restored(msg: StoredMessage) -> tuple[str, int | None, dict[str, str]] | None:
    """(real topic, real queue id, properties without the schedule ones), or None
    for a message that does not say where it belongs."""
    topic = msg.properties.get(PROPERTY_REAL_TOPIC)
    if not topic:
        return None
    try:
        qid: int | None = int(msg.properties.get(PROPERTY_REAL_QID, ""))
    except ValueError:
        qid = None
    props = {k: v for k, v in msg.properties.items() if k not in SCHEDULE_PROPERTIES}
    return topic, qid, props


# ---- metadata tables (plain objects) ---------------------------------------------------


class DelayOffsetTable:
    """level -> next schedule-queue offset to deliver, with a stepped DataVersion."""

    def __init__(self, path: Path | None, version_step: int = 200) -> None:
        self.path = path
        self.offsets: dict[int, int] = {}
        self._version = SteppedVersion(version_step)
        self._dirty = False

    @property
    def data_version(self) -> DataVersion:
        return self._version.version

    def load(self) -> None:
        if self.path is None:
            return
        if not self.path.exists():
            # Persist the initial version now: a master restarted before its first
            # update must not invent a newer timestamp than its slaves hold.
            self._dirty = True
            self.persist()
            return
        data = json.loads(self.path.read_text())
        self.offsets = {int(k): int(v) for k, v in data["offsets"].items()}
        self.data_version.assign(DataVersion.from_dict(data["dataVersion"]))

    def persist(self) -> None:
        if self.path is None or not self._dirty:
            return
        self._dirty = False
        write_json_atomic(
            self.path,
            {
                "offsets": {str(k): v for k, v in sorted(self.offsets.items())},
                "dataVersion": self.data_version.to_dict(),
            },
        )

    def get(self, level: int) -> int:
        return self.offsets.get(level, 0)

    def update(self, level: int, offset: int) -> None:
        self.offsets[level] = offset
        self._version.touch()
        self._dirty = True

    def bump(self) -> None:
        """Move the version on (an acting slave taking over: its table is now the truth)."""
        self.data_version.take_over()
        self._dirty = True

    def assign(self, offsets: Mapping[int, int], version: DataVersion) -> bool:
        """Forward sync on a slave: take the master's version, and its offsets where
        they are ahead (replicated records may already have moved a level further)."""
        new = {lvl: max(off, self.offsets.get(lvl, 0)) for lvl, off in offsets.items()}
        new.update({lvl: off for lvl, off in self.offsets.items() if lvl not in new})
        if new == self.offsets and version.key() == self.data_version.key():
            return False
        self.offsets = new
        self.data_version.assign(version)
        self._dirty = True
        return True

    def replace(self, offsets: Mapping[int, int], version: DataVersion) -> None:
        """Take another broker's table as it is, levels ahead of it included (see
        VersionedTable.replace: long-campaign seeds 1013 and 1027 lost the messages
        stored after a cut at the offsets this table had counted before it)."""
        self.offsets = dict(offsets)
        self.data_version.assign(version)
        self._dirty = True

    def apply_replicated(self, level: int, offset: int) -> None:
        """A delivery the master made, replicated through the commit log (slave side)."""
        if offset > self.offsets.get(level, 0):
            self.offsets[level] = offset
            self._dirty = True

    def adopt_if_newer(self, offsets: Mapping[int, int], version: DataVersion) -> bool:
        """Reverse sync in pre-online: adopt a slave's table whose version is >= ours
        (ties adopt, as RocketMQ does).  Offsets only move forward, so each level
        keeps the larger of the two: adopting never rolls a level back."""
        if self.data_version.compare(version) > 0:
            return False
        for level, offset in offsets.items():
            self.offsets[level] = max(offset, self.offsets.get(level, 0))
        self.data_version.assign(version)
        self._dirty = True
        self.persist()
        return True


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
    def from_dict(cls, data: Mapping[str, object]) -> TimerCheckpoint:
        version = data.get("dataVersion")
        return cls(
            int(str(data.get("lastReadTimeMs", 0))),
            int(str(data.get("masterTimerQueueOffset", 0))),
            DataVersion.from_dict(version) if isinstance(version, dict) else DataVersion(),
            int(str(data.get("nextMsDeliveredBelow", 0))),
        )


@dataclass(frozen=True, slots=True)
class TimerMark:
    """A timer checkpoint without its version (see :class:`TimerCheckpoint`)."""

    last_read_time_ms: int
    queue_offset: int
    next_ms_delivered_below: int = 0

    def record(self) -> dict[str, str]:
        """As a progress record (replicated through the commit log)."""
        return {
            "G": TIMER_CHECKPOINT_GROUP,
            "L": str(self.last_read_time_ms),
            "O": str(self.queue_offset),
            "B": str(self.next_ms_delivered_below),
        }


class TimerCheckpointFile:
    """The timer checkpoint, persisted; its version moves on every change."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.cp = TimerCheckpoint()
        self._dirty = False

    def load(self) -> None:
        if self.path is None:
            return
        if not self.path.exists():
            self._dirty = True
            self.persist()
            return
        self.cp = TimerCheckpoint.from_dict(json.loads(self.path.read_text()))

    def persist(self) -> None:
        if self.path is None or not self._dirty:
            return
        self._dirty = False
        write_json_atomic(self.path, self.cp.to_dict())

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
        self._set(mark)

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

    def adopt_if_newer(self, other: TimerCheckpoint) -> bool:
        if self.cp.version.compare(other.version) > 0:
            return False
        self.assign(other)
        self._dirty = True
        self.persist()
        return True


class RecallTable:
    """Recalled scheduled messages: UNIQ_KEY -> (due ms, topic), with a DataVersion
    that moves on every change.  Only grows (a recall is never undone); entries
    whose due time is older than the store's retention are forgotten, and at most
    :data:`MAX_RECALLS` are kept."""

    def __init__(self, path: Path | None, retention_ms: int = 72 * 3600 * 1000) -> None:
        self.path = path
        self.retention_ms = retention_ms
        self.entries: dict[str, tuple[int, str]] = {}
        self.data_version = DataVersion()
        self._dirty = False

    def __contains__(self, uniq_key: object) -> bool:
        return uniq_key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        data = json.loads(self.path.read_text())
        self.entries = {
            str(k): (int(v["due"]), str(v.get("topic", ""))) for k, v in data["recalls"].items()
        }
        self.data_version.assign(DataVersion.from_dict(data["dataVersion"]))

    def persist(self) -> None:
        if self.path is None or not self._dirty:
            return
        self._dirty = False
        write_json_atomic(
            self.path,
            {
                "recalls": {k: {"due": d, "topic": t} for k, (d, t) in self.entries.items()},
                "dataVersion": self.data_version.to_dict(),
            },
        )

    def add(self, uniq_key: str, due: int, topic: str = "") -> bool:
        """Record one recall; False when it was known already."""
        if uniq_key in self.entries:
            return False
        self.entries[uniq_key] = (due, topic)
        self._prune()
        self.data_version.next_version()
        self._dirty = True
        return True

    def _prune(self, now: int | None = None) -> None:
        now = now_ms() if now is None else now
        old = [k for k, (d, _) in self.entries.items() if d < now - self.retention_ms]
        for k in old:
            del self.entries[k]
        if len(self.entries) > MAX_RECALLS:
            by_due = sorted(self.entries, key=lambda k: self.entries[k][0])
            for k in by_due[: len(self.entries) - MAX_RECALLS]:
                del self.entries[k]

    def merge(self, entries: Mapping[str, tuple[int, str]], version: DataVersion) -> bool:
        """Take another broker's recalls (a union: a recall anywhere holds
        everywhere) and the newer of the two versions.  True when anything changed."""
        new = {k: v for k, v in entries.items() if k not in self.entries}
        newer = self.data_version.compare(version) < 0
        if not new and not newer:
            return False
        self.entries.update(new)
        self._prune()
        if newer:
            self.data_version.assign(version)
        self._dirty = True
        return True

    def bump(self) -> None:
        """An acting slave taking over: its table is the group's truth from now on."""
        self.data_version.take_over()
        self._dirty = True


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


# ---- the service -----------------------------------------------------------------


class ScheduleService:
    """Delivers due delayed and timer messages while this broker is master or acting."""

    def __init__(self, core: CorePort, write_path: WritePort, escape: EscapePort) -> None:
        self.core = core
        self.cfg = core.cfg
        self.write_path = write_path
        self.escape = escape
        self.delay_offsets = DelayOffsetTable(
            core.store_dir / "delay_offsets.json", self.cfg.delay_offset_update_version_step
        )
        self.delay_offsets.load()
        self.timer = TimerCheckpointFile(core.store_dir / "timer_checkpoint.json")
        self.timer.load()
        self.recalls = RecallTable(core.store_dir / "recalls.json", self.cfg.file_reserved_time_ms)
        self.recalls.load()
        #: the timer entries read and not delivered yet, while the timer loop runs
        self._index: TimerIndex | None = None
        self.recalled_skipped = 0
        self._overdue_logged = 0  # late deliveries logged this session
        self._want_run = asyncio.Event()
        self._want_stop = asyncio.Event()
        self.running = False
        #: the delivery session is stopping: its loops start no new delivery (their
        #: state, the timer index above all, is stale once the broker serves again)
        self._stopping = False
        core.add_special_service(self.set_running)
        add = core.dispatcher.add
        add(RequestCode.GET_ALL_DELAY_OFFSET, common_pb2.Empty, self._get_delay_offsets)
        add(RequestCode.GET_TIMER_CHECK_POINT, common_pb2.Empty, self._get_timer_checkpoint)
        add(RequestCode.RECALL_MESSAGE, broker_pb2.RecallMessageRequest, self._recall)
        add(RequestCode.GET_RECALL_TABLE, common_pb2.Empty, self._get_recall_table)

    # ---- control ----------------------------------------------------------

    def set_running(self, should_run: bool) -> None:
        """A special-service hook: start or stop delivering (idempotent)."""
        if should_run:
            self._want_stop.clear()
            self._want_run.set()
        else:
            self._want_run.clear()
            self._want_stop.set()

    async def run(self) -> None:
        """Owned by the broker's TaskGroup: persists, and runs a delivery session
        whenever the special services are on."""
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._persist_loop(), name="schedule-persist")
                tg.create_task(self._supervise(), name="schedule-supervisor")
        finally:
            self.persist()

    async def _supervise(self) -> None:
        while True:
            await self._want_run.wait()
            if not self.core.acting.is_master:
                # an acting slave: its tables are the group's truth from now on
                self.delay_offsets.bump()
                self.timer.bump()
                self.recalls.bump()
            log.info("schedule service started (%s)", self.core.acting.role)
            self._overdue_logged = 0
            self._stopping = False
            self.running = True
            try:
                async with asyncio.TaskGroup() as tg:
                    tasks = [
                        tg.create_task(self._level_loop(level), name=f"schedule-level-{level}")
                        for level in range(1, self.cfg.max_delay_level + 1)
                    ]
                    tasks.append(tg.create_task(self._timer_loop(), name="schedule-timer"))
                    await self._want_stop.wait()
                    # a delivery under way finishes with its progress (special.steps);
                    # the loops start none after it (a fenced master may serve again
                    # before the wait ends, and its old timer index is stale then)
                    self._stopping = True
                    await self.core.special_steps.idle()
                    for task in tasks:
                        task.cancel()
            finally:
                self.running = False
                self.persist()
            log.info("schedule service stopped")

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(PERSIST_INTERVAL_S)
            await asyncio.to_thread(self.persist)

    def persist(self) -> None:
        for table in (self.delay_offsets, self.timer, self.recalls):
            try:
                table.persist()
            except OSError as exc:
                # a full disk (a master then escapes its deliveries, see EscapeBridge):
                # the table stays dirty and is written once there is room again
                table._dirty = True
                log.warning("cannot persist %s: %s; retrying", type(table).__name__, exc)

    # ---- delivery -----------------------------------------------------------

    async def _deliver(self, msg: StoredMessage, kind: str, progress: dict[str, str]) -> bool:
        """Escape one due message to where it belongs; False to try again later."""
        target = restored(msg)
        if target is None:
            log.warning(
                "%s message at %s/%d offset %d has no %s: skipped",
                kind,
                msg.topic,
                msg.queue_id,
                msg.queue_offset,
                PROPERTY_REAL_TOPIC,
            )
            return True
        topic, qid, props = target
        try:
            await self.escape.put_message(
                topic,
                msg.body,
                props,
                kind=kind,
                queue_id=qid,
                flags=msg.flags,
                born_ts_ms=msg.born_ts_ms,
                progress=progress,
                escape_id=escape_id(self.cfg.broker_name, kind, msg),
            )
        except EscapeFailed as exc:
            log.warning("delivering a %s message for %s failed, will retry: %s", kind, topic, exc)
            return False
        return True

    async def _level_loop(self, level: int) -> None:
        store = self.core.store
        queue_id = level - 1
        while not self._stopping:
            offset = self.delay_offsets.get(level)
            low = store.min_offset(SCHEDULE_TOPIC, queue_id)
            if offset < low:
                log.warning("delay level %d: offset %d below queue min %d", level, offset, low)
                self.delay_offsets.update(level, low)
                continue
            if offset >= store.max_offset(SCHEDULE_TOPIC, queue_id):
                await self.core.holds.arrival(SCHEDULE_TOPIC, queue_id, IDLE_WAIT_S)
                continue
            msg = store.get_message_at(SCHEDULE_TOPIC, queue_id, offset)
            if msg is None:
                log.warning("delay level %d: unreadable entry at %d skipped", level, offset)
                self.delay_offsets.update(level, offset + 1)
                continue
            wait_ms = due_ms(self.cfg, msg) - now_ms()
            if wait_ms > 0:
                # the messages behind it in this level are due later
                await asyncio.sleep(min(wait_ms / 1000, IDLE_WAIT_S))
                continue
            if -wait_ms > OVERDUE_LOG_MS:
                self._log_overdue(f"delay level {level}", msg, offset, -wait_ms)
            # the slave that may act next learns the new offset in the same transfer
            # as the delivered message (on a master; an acting slave's is its own)
            progress = {
                "G": DELAY_OFFSET_GROUP,
                "T": SCHEDULE_TOPIC,
                "Q": str(level),
                "O": str(offset + 1),
            }
            if self._is_recalled(msg):
                self.delay_offsets.update(level, offset + 1)
                self.write_path.replicate_record(progress)
                continue
            with self.core.special_steps.step():
                delivered = await self._deliver(msg, "delay", progress)
                if delivered:
                    self.delay_offsets.update(level, offset + 1)
            if not delivered:
                await asyncio.sleep(POLL_S)

    def _read_timer_queue(self, index: TimerIndex) -> None:
        store = self.core.store
        cp = self.timer.cp
        top = store.max_offset(TIMER_TOPIC, TIMER_QUEUE_ID)
        while index.read_offset < top:
            offset = index.read_offset
            msg = store.get_message_at(TIMER_TOPIC, TIMER_QUEUE_ID, offset)
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

    async def _timer_loop(self) -> None:
        index = TimerIndex()
        self._index = index
        try:
            await self._timer_deliveries(index)
        finally:
            self._index = None
            self.core.metrics.timer_pending.labels(**self.core.metrics.ident).set(0)

    async def _timer_deliveries(self, index: TimerIndex) -> None:
        store = self.core.store
        index.read_offset = store.min_offset(TIMER_TOPIC, TIMER_QUEUE_ID)
        index.max_delivered_due = self.timer.cp.last_read_time_ms
        cp = self.timer.cp
        self._read_timer_queue(index)
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
        while not self._stopping:
            self._read_timer_queue(index)
            pending.set(len(index))
            head = index.peek()
            now = now_ms()
            if head is None or head[0] > now:
                self._checkpoint(index)
                wait = IDLE_WAIT_S if head is None else min((head[0] - now) / 1000, IDLE_WAIT_S)
                # a message that arrives meanwhile may be due before the head
                await self.core.holds.arrival(TIMER_TOPIC, TIMER_QUEUE_ID, wait)
                continue
            offset = head[1]
            msg = store.get_message_at(TIMER_TOPIC, TIMER_QUEUE_ID, offset)
            if msg is None:
                index.pop()
                self._checkpoint(index)
                continue
            if self._is_recalled(msg):
                index.pop()
                self._checkpoint(index)
                continue
            if now - head[0] > OVERDUE_LOG_MS:
                self._log_overdue("timer", msg, offset, now - head[0])
            # the checkpoint that holds once this head is delivered travels with it
            mark = index.checkpoint_after_head()
            progress = mark.record()
            with self.core.special_steps.step():
                delivered = await self._deliver(msg, "timer", progress)
                if delivered:
                    index.pop()
                    self.timer.advance(mark)
            if not delivered:
                await asyncio.sleep(POLL_S)

    def _log_overdue(self, what: str, msg: StoredMessage, offset: int, late_ms: int) -> None:
        """The catch-up after a failover or a return, message by message (what to read
        when one comes twice or late), up to :data:`OVERDUE_LOG_LINES` per session."""
        self._overdue_logged += 1
        if self._overdue_logged > OVERDUE_LOG_LINES:
            return
        log.info(
            "%s: delivering %s (queue offset %d) %d ms after it was due%s",
            what,
            msg.properties.get(PROPERTY_UNIQ_KEY, "?"),
            offset,
            late_ms,
            "; further late deliveries of this session are not logged"
            if self._overdue_logged == OVERDUE_LOG_LINES
            else "",
        )

    def _checkpoint(self, index: TimerIndex) -> None:
        mark = index.checkpoint()
        if self.timer.advance(mark):
            # the slave that may act next learns it with the durability of a message,
            # not by the 2 s forward sync (a delivery in that window came twice)
            self.write_path.replicate_record(mark.record())

    # ---- recall ---------------------------------------------------------------------

    def _is_recalled(self, msg: StoredMessage) -> bool:
        uniq = msg.properties.get(PROPERTY_UNIQ_KEY)
        if not uniq or uniq not in self.recalls:
            return False
        self.recalled_skipped += 1
        log.info(
            "recalled message %s for %s not delivered",
            uniq,
            msg.properties.get(PROPERTY_REAL_TOPIC, "?"),
        )
        return True

    async def _recall(
        self, ctx: RequestContext, req: broker_pb2.RecallMessageRequest
    ) -> broker_pb2.RecallMessageResponse:
        """RECALL_MESSAGE: the timer message ``uniq_key`` of ``topic`` is never delivered.

        Answered only while it still waits (known to the timer index, due later than
        now); a repeated recall of the same id succeeds again.  On a master the recall
        is a marker record in the timer queue, confirmed by the replicas first."""
        core = self.core
        core.check_master_only("RECALL_MESSAGE")
        if not req.topic or not req.uniq_key or req.deliver_ms <= 0:
            raise BadRequest("RECALL_MESSAGE needs a topic, a message id and a delivery time")
        if req.broker_name and req.broker_name != core.cfg.broker_name:
            raise BadRequest(f"recall of a message of {req.broker_name} sent to {core.name}")
        known = self.recalls.entries.get(req.uniq_key)
        if known is not None and known[1] in ("", req.topic):
            return broker_pb2.RecallMessageResponse(msg_id=req.uniq_key)
        index = self._index
        if index is None:
            raise NotMaster(f"RECALL_MESSAGE: the schedule service of {core.name} is not running")
        self._read_timer_queue(index)  # what was stored since the loop last looked
        entry = index.due_of.get(req.uniq_key)
        now = now_ms()
        if entry is None or entry[1] != req.topic:
            if req.deliver_ms <= now:
                raise NotRecallable(
                    f"message {req.uniq_key} was due at {req.deliver_ms}: already delivered"
                )
            raise NotRecallable(f"no scheduled message {req.uniq_key} of {req.topic} here")
        due = entry[0]
        if due <= now:
            raise NotRecallable(f"message {req.uniq_key} is due now: being delivered")
        # before the first await: a delivery that starts from now on skips it
        self.recalls.add(req.uniq_key, due, req.topic)
        if core.acting.is_master:
            await self._write_recall_marker(req, due)
        await asyncio.to_thread(self.recalls.persist)
        log.info("recalled timer message %s of %s (due %d)", req.uniq_key, req.topic, due)
        return broker_pb2.RecallMessageResponse(msg_id=req.uniq_key)

    async def _write_recall_marker(self, req: broker_pb2.RecallMessageRequest, due: int) -> None:
        props = {
            PROPERTY_TIMER_DEL_UNIQKEY: req.uniq_key,
            PROPERTY_REAL_TOPIC: req.topic,
            PROPERTY_DUE_MS: str(due),
        }
        try:
            result = self.write_path.append_local(TIMER_TOPIC, TIMER_QUEUE_ID, b"0", props)
        except NotWritable:
            del self.recalls.entries[req.uniq_key]  # nothing stored: not recalled
            raise
        if not await self.write_path.confirm(result.physical_offset + result.size):
            # stored here, so recalled here; a slave may not have it yet (the forward
            # sync of the recall table catches up), as a send's SlaveAckTimeout
            log.warning("recall marker of %s not confirmed by the slaves in time", req.uniq_key)

    def recall_table_pb(self) -> broker_pb2.RecallTable:
        return broker_pb2.RecallTable(
            entries=[
                broker_pb2.RecallEntry(uniq_key=k, due_ms=d, topic=t)
                for k, (d, t) in self.recalls.entries.items()
            ],
            data_version=data_version_to_pb(self.recalls.data_version),
        )

    async def _get_recall_table(
        self, ctx: RequestContext, req: common_pb2.Empty
    ) -> broker_pb2.RecallTable:
        return self.recall_table_pb()

    # ---- metadata RPCs and sync ------------------------------------------------

    def delay_table_pb(self) -> broker_pb2.DelayOffsetTable:
        return broker_pb2.DelayOffsetTable(
            offsets=self.delay_offsets.offsets,
            data_version=data_version_to_pb(self.delay_offsets.data_version),
        )

    def timer_checkpoint_pb(self) -> broker_pb2.TimerCheckpoint:
        cp = self.timer.cp
        return broker_pb2.TimerCheckpoint(
            last_read_time_ms=cp.last_read_time_ms,
            master_timer_queue_offset=cp.master_timer_queue_offset,
            data_version=data_version_to_pb(cp.version),
            next_ms_delivered_below=cp.next_ms_delivered_below,
        )

    async def _get_delay_offsets(
        self, ctx: RequestContext, req: common_pb2.Empty
    ) -> broker_pb2.DelayOffsetTable:
        return self.delay_table_pb()

    async def _get_timer_checkpoint(
        self, ctx: RequestContext, req: common_pb2.Empty
    ) -> broker_pb2.TimerCheckpoint:
        return self.timer_checkpoint_pb()

    def tables(self) -> list[VersionedTable]:
        """Delay offsets and the timer checkpoint, for forward and reverse sync."""
        return [DelayOffsetSync(self), TimerCheckpointSync(self), RecallSync(self)]


def timer_from_pb(pb: broker_pb2.TimerCheckpoint) -> TimerCheckpoint:
    return TimerCheckpoint(
        pb.last_read_time_ms,
        pb.master_timer_queue_offset,
        data_version_from_pb(pb.data_version),
        pb.next_ms_delivered_below,
    )


class DelayOffsetSync:
    """Delay offsets as a versioned table (GET_ALL_DELAY_OFFSET); never assigned while
    this broker delivers (RocketMQ #7601)."""

    name = "delay offsets"

    def __init__(self, service: ScheduleService) -> None:
        self.service = service

    async def fetch(self, pool: ConnectionPool, addr: str) -> broker_pb2.DelayOffsetTable:
        return await fetch_table(
            pool, addr, RequestCode.GET_ALL_DELAY_OFFSET, broker_pb2.DelayOffsetTable
        )

    def assign(self, snapshot: broker_pb2.DelayOffsetTable) -> None:
        self.service.delay_offsets.assign(
            dict(snapshot.offsets), data_version_from_pb(snapshot.data_version)
        )

    def replace(self, snapshot: broker_pb2.DelayOffsetTable) -> None:
        self.service.delay_offsets.replace(
            dict(snapshot.offsets), data_version_from_pb(snapshot.data_version)
        )

    def adopt_if_newer(self, snapshot: broker_pb2.DelayOffsetTable) -> bool:
        return self.service.delay_offsets.adopt_if_newer(
            dict(snapshot.offsets), data_version_from_pb(snapshot.data_version)
        )

    def describe(self, snapshot: broker_pb2.DelayOffsetTable) -> str:
        return str(dict(snapshot.offsets))

    def busy(self) -> bool:
        return self.service.running


class TimerCheckpointSync:
    """The timer checkpoint as a versioned table (GET_TIMER_CHECK_POINT)."""

    name = "timer checkpoint"

    def __init__(self, service: ScheduleService) -> None:
        self.service = service

    async def fetch(self, pool: ConnectionPool, addr: str) -> TimerCheckpoint:
        pb = await fetch_table(
            pool, addr, RequestCode.GET_TIMER_CHECK_POINT, broker_pb2.TimerCheckpoint
        )
        return timer_from_pb(pb)

    def assign(self, snapshot: TimerCheckpoint) -> None:
        self.service.timer.assign(snapshot)

    def replace(self, snapshot: TimerCheckpoint) -> None:
        self.assign(snapshot)  # assign already takes the checkpoint as it is

    def adopt_if_newer(self, snapshot: TimerCheckpoint) -> bool:
        return self.service.timer.adopt_if_newer(snapshot)

    def describe(self, snapshot: TimerCheckpoint) -> str:
        below = snapshot.next_ms_delivered_below
        return (
            f"offset {snapshot.master_timer_queue_offset}, last read {snapshot.last_read_time_ms}"
            + (f" (and the next ms below offset {below})" if below else "")
        )

    def busy(self) -> bool:
        return self.service.running


class RecallSync:
    """The recall table as a versioned table (GET_RECALL_TABLE).  Both directions
    merge (a union), so a recall made anywhere in the group holds everywhere."""

    name = "recalls"

    def __init__(self, service: ScheduleService) -> None:
        self.service = service

    async def fetch(self, pool: ConnectionPool, addr: str) -> broker_pb2.RecallTable:
        return await fetch_table(pool, addr, RequestCode.GET_RECALL_TABLE, broker_pb2.RecallTable)

    @staticmethod
    def _entries(snapshot: broker_pb2.RecallTable) -> dict[str, tuple[int, str]]:
        return {e.uniq_key: (e.due_ms, e.topic) for e in snapshot.entries if e.uniq_key}

    def assign(self, snapshot: broker_pb2.RecallTable) -> None:
        self.service.recalls.merge(
            self._entries(snapshot), data_version_from_pb(snapshot.data_version)
        )

    def replace(self, snapshot: broker_pb2.RecallTable) -> None:
        self.assign(snapshot)  # a recall is never undone: the union

    def adopt_if_newer(self, snapshot: broker_pb2.RecallTable) -> bool:
        changed = self.service.recalls.merge(
            self._entries(snapshot), data_version_from_pb(snapshot.data_version)
        )
        self.service.recalls.persist()
        return changed

    def describe(self, snapshot: broker_pb2.RecallTable) -> str:
        return f"{len(snapshot.entries)} recalled"

    def busy(self) -> bool:
        return False  # a merge never loses a recall, so it may run at any time
