"""The schedule service: delay levels, with the timer loop and recall beside it
(RocketMQ's ScheduleMessageService, TimerMessageStore and RECALL_MESSAGE).

It runs only on the master and on the acting slave
(``BrokerCore.add_special_service``).  Each level's queue is in due order, so one
task per level waits for its head and delivers it when due, moving the level's delay
offset (:mod:`.delay_offsets`); the timer loop (:mod:`.timer`) runs beside them.  The
progress tables are persisted, served, forward-synced to slaves while the master is
online and reverse-synced by a returning master in pre-online (:meth:`tables`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Final

from broker_agent.metadata.json_table import JsonTable
from broker_agent.metadata.versioned import VersionedTable
from broker_agent.special.clock import SYSTEM_CLOCK, Clock
from broker_agent.special.ports import CorePort, EscapePort, WritePort
from broker_agent.special.schedule.delay_offsets import (
    DelayOffsetTable,
    delay_offset_sync,
    delay_record,
)
from broker_agent.special.schedule.delivery import IDLE_WAIT_S, OVERDUE_LOG_MS, POLL_S, Delivery
from broker_agent.special.schedule.recall import FetchMembers, RecallService
from broker_agent.special.schedule.recall_table import RecallTable, recall_sync
from broker_agent.special.schedule.target import TIMER_QUEUE_ID, due_ms
from broker_agent.special.schedule.timer import (
    TimerCheckpointFile,
    TimerLoop,
    timer_checkpoint_sync,
)
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import RecordUnderRepair
from ha_controller.protocol.properties import (
    DELAY_OFFSET_GROUP,
    SCHEDULE_TOPIC,
    TIMER_CHECKPOINT_GROUP,
    TIMER_TOPIC,
)
from ha_controller.rpc import RequestContext

__all__ = ["ScheduleService"]

log = logging.getLogger(__name__)

PERSIST_INTERVAL_S: Final = 1.0


class ScheduleService:
    """Delivers due delayed and timer messages while this broker is master or acting."""

    def __init__(
        self,
        core: CorePort,
        write_path: WritePort,
        escape: EscapePort,
        clock: Clock = SYSTEM_CLOCK,
        fetch_members: FetchMembers | None = None,
    ) -> None:
        """``fetch_members`` asks the nameservers for this broker's member group (the
        members an acting slave hands its recalls to); without it, the last view."""
        self.core = core
        self.cfg = core.cfg
        self.write_path = write_path
        self.clock = clock
        self.delay_offsets = DelayOffsetTable(
            core.store_dir / "delay_offsets.json", self.cfg.delay_offset_update_version_step
        )
        self.timer = TimerCheckpointFile(core.store_dir / "timer_checkpoint.json")
        self.recalls = RecallTable(
            core.store_dir / "recalls.json", self.cfg.file_reserved_time_ms, clock.now_ms
        )
        rebuilt: tuple[DelayOffsetTable | TimerCheckpointFile, ...] = (
            self.delay_offsets,
            self.timer,
        )
        for table in rebuilt:
            table.load()
            if table.lost:
                found = table.rebuild_from_log(core.store)
                log.info("%s rebuilt from %d record(s) of the commit log", table.what, found)
            elif core.store.recovered_unclean:
                found = table.catch_up_with_log(core.store)
                log.info(
                    "%s: unclean stop: %d record(s) since its file was written read",
                    table.what,
                    found,
                )
        self.recalls.load()  # a lost one: the timer loop reads the markers again
        self.delivery = Delivery(core, escape, self.recalls, clock)
        self.timer_loop = TimerLoop(core, write_path, self.timer, self.recalls, self.delivery)
        self.recall = RecallService(
            core, write_path, self.recalls, self.timer_loop, clock, fetch_members
        )
        self._want_run = asyncio.Event()
        self._want_stop = asyncio.Event()
        self.running = False
        core.add_special_service(self.set_running)
        add = core.dispatcher.add
        add(RequestCode.GET_ALL_DELAY_OFFSET, common_pb2.Empty, self._get_delay_offsets)
        add(RequestCode.GET_TIMER_CHECK_POINT, common_pb2.Empty, self._get_timer_checkpoint)
        add(RequestCode.RECALL_MESSAGE, broker_pb2.RecallMessageRequest, self.recall.handle)
        add(RequestCode.GET_RECALL_TABLE, common_pb2.Empty, self.recall.get_table)
        add(RequestCode.PUT_RECALLS, broker_pb2.RecallTable, self.recall.put_recalls)

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
            self.delivery.start_session()
            self.running = True
            try:
                async with asyncio.TaskGroup() as tg:
                    tasks = [
                        tg.create_task(self._level_loop(level), name=f"schedule-level-{level}")
                        for level in range(1, self.cfg.max_delay_level + 1)
                    ]
                    tasks.append(tg.create_task(self.timer_loop.run(), name="schedule-timer"))
                    await self._want_stop.wait()
                    # a delivery under way finishes with its progress
                    # (broker_agent.special_steps); the loops start none after it (a
                    # fenced master may serve again before the wait ends, and its old
                    # timer index is stale then)
                    self.delivery.stopping = True
                    await self.core.special_steps.idle()
                    for task in tasks:
                        task.cancel()
            finally:
                self.running = False
                self.persist()
            log.info("schedule service stopped")

    @property
    def _files(self) -> tuple[JsonTable, ...]:
        return (self.delay_offsets, self.timer, self.recalls)

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(PERSIST_INTERVAL_S)
            for table in self._files:
                try:
                    await table.persist_async()
                except OSError as exc:
                    self._persist_failed(table, exc)

    def persist(self) -> None:
        for table in self._files:
            try:
                table.persist()
            except OSError as exc:
                self._persist_failed(table, exc)

    @staticmethod
    def _persist_failed(table: JsonTable, exc: OSError) -> None:
        # a full disk (a master then escapes its deliveries, see EscapeBridge): the
        # table stays dirty and is written once there is room again
        log.warning("cannot persist the %s: %s; retrying", table.what, exc)

    # ---- delay levels -------------------------------------------------------------

    async def _level_loop(self, level: int) -> None:
        store = self.core.store
        delivery = self.delivery
        queue_id = level - 1
        while not delivery.stopping:
            offset = self.delay_offsets.get(level)
            low = store.min_offset(SCHEDULE_TOPIC, queue_id)
            if offset < low:
                log.warning("delay level %d: offset %d below queue min %d", level, offset, low)
                self.delay_offsets.update(level, low)
                continue
            if offset >= store.max_offset(SCHEDULE_TOPIC, queue_id):
                await delivery.arrival(SCHEDULE_TOPIC, queue_id, IDLE_WAIT_S)
                continue
            try:
                msg = store.get_message_at(SCHEDULE_TOPIC, queue_id, offset)
            except RecordUnderRepair:
                # damaged: held at the record until a replica's copy is back (store.repair)
                await self.clock.sleep(POLL_S)
                continue
            if msg is None:
                log.warning("delay level %d: entry at %d outside the log skipped", level, offset)
                self.delay_offsets.update(level, offset + 1)
                continue
            wait_ms = due_ms(self.cfg, msg) - self.clock.now_ms()
            if wait_ms > 0:
                # the messages behind it in this level are due later
                await self.clock.sleep(min(wait_ms / 1000, IDLE_WAIT_S))
                continue
            if -wait_ms > OVERDUE_LOG_MS:
                delivery.log_overdue(f"delay level {level}", msg, offset, -wait_ms)
            # the slave that may act next learns the new offset in the same transfer
            # as the delivered message (on a master; an acting slave's is its own)
            progress = delay_record(level, offset + 1)
            if delivery.recalled(msg):
                self.delay_offsets.update(level, offset + 1)
                self.write_path.replicate_record(progress)
                continue
            with self.core.special_steps.step():
                delivered = await delivery.deliver(msg, "delay", progress)
                if delivered:
                    self.delay_offsets.update(level, offset + 1)
            if not delivered:
                await self.clock.sleep(POLL_S)
                continue
            await self.write_path.progress_durable(self.delay_offsets)

    # ---- metadata RPCs and sync ------------------------------------------------

    async def _get_delay_offsets(
        self, ctx: RequestContext, req: common_pb2.Empty
    ) -> broker_pb2.DelayOffsetTable:
        return self.delay_offsets.to_pb()

    async def _get_timer_checkpoint(
        self, ctx: RequestContext, req: common_pb2.Empty
    ) -> broker_pb2.TimerCheckpoint:
        return self.timer.to_pb()

    def tables(self) -> list[VersionedTable]:
        """Delay offsets, the timer checkpoint and the recalls, for forward and reverse
        sync (the first two never assigned while this broker delivers)."""
        busy = lambda: self.running  # noqa: E731
        return [
            delay_offset_sync(self.delay_offsets, busy, self._level_ends),
            timer_checkpoint_sync(
                self.timer,
                busy,
                lambda: self.core.store.max_offset(TIMER_TOPIC, TIMER_QUEUE_ID),
            ),
            recall_sync(self.recalls),
        ]

    def _level_ends(self) -> dict[int, int]:
        """Delay level -> its schedule queue's end in this store."""
        store = self.core.store
        return {
            level: store.max_offset(SCHEDULE_TOPIC, level - 1)
            for level in range(1, self.cfg.max_delay_level + 1)
        }

    def progress_records(self) -> Mapping[str, Callable[[Mapping[str, str]], None]]:
        """How a slave applies the progress records a delivery replicates through the
        commit log (by their group ``G``): the delay offset of a level, the timer
        checkpoint."""
        return {
            DELAY_OFFSET_GROUP: self.delay_offsets.apply_record,
            TIMER_CHECKPOINT_GROUP: self.timer.apply_record,
        }
