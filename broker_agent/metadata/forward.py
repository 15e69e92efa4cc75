"""Forward metadata sync on a slave: the topics and every versioned table from the
master, and the progress records that arrive in the replicated commit log
(``.progress``)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from broker_agent.metadata.offsets import ConsumerOffsetManager, consumer_offset_sync
from broker_agent.metadata.progress import PROGRESS_GROUPS, ProgressApplier, ProgressRecords
from broker_agent.metadata.topics import TopicConfigManager
from broker_agent.metadata.versioned import VersionedTable, fetch_table, forward_sync
from broker_agent.store.message_store import Dispatched
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import HaError, RecordUnderRepair
from ha_controller.protocol.properties import OFFSET_TOPIC
from ha_controller.protocol.record import StoredMessage
from ha_controller.rpc import ConnectionPool
from ha_controller.wire import data_version_from_pb, topic_config_from_pb

__all__ = ["SLAVE_SYNC_INTERVAL_S", "ForwardSync"]

log = logging.getLogger(__name__)

SLAVE_SYNC_INTERVAL_S = 2.0


class MasterView(Protocol):
    """What a slave knows of its master (``membership.acting.ActingState``)."""

    @property
    def chosen(self) -> bool: ...

    @property
    def master_online(self) -> bool: ...

    @property
    def master_addr(self) -> str | None: ...


class ReplicaStore(Protocol):
    def get_message_at(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None: ...

    def max_offset(self, topic: str, queue_id: int) -> int: ...


class PullWaker(Protocol):
    def notify(
        self, topic: str, queue_id: int, max_offset: int, tag_hash: int | None = ...
    ) -> int: ...


class SlaveCore(Protocol):
    """What the forward sync reads of its broker (``BrokerCore``)."""

    @property
    def acting(self) -> MasterView: ...

    @property
    def pool(self) -> ConnectionPool: ...

    @property
    def topics(self) -> TopicConfigManager: ...

    @property
    def offsets(self) -> ConsumerOffsetManager: ...

    @property
    def store(self) -> ReplicaStore: ...

    @property
    def holds(self) -> PullWaker: ...


class ForwardSync:
    """Keeps a plain slave's metadata in step with its master."""

    def __init__(
        self,
        core: SlaveCore,
        tables: Sequence[VersionedTable],
        progress: Mapping[str, ProgressApplier],
        register: Callable[[], Awaitable[None]],
    ) -> None:
        """``progress``: how to apply the special services' progress records in the
        offset topic, by their group ``G`` (the others are consumer offsets)."""
        self.core = core
        #: consumer offsets first, then the special services' tables
        self.tables: list[VersionedTable] = [
            consumer_offset_sync(core.offsets, core.store.max_offset),
            *tables,
        ]
        self._records = ProgressRecords(core.offsets.apply_record, progress)
        self._register = register

    async def loop(self) -> None:
        """Every 2 s while the master is online and this slave does not act."""
        acting = self.core.acting
        while True:
            await asyncio.sleep(SLAVE_SYNC_INTERVAL_S)
            master = acting.master_addr
            if acting.chosen or not acting.master_online or master is None:
                continue
            await self.pull(master, functools.partial(self._still_wanted, master))

    async def pull(
        self, master: str, still_wanted: Callable[[], bool], *, register: bool = True
    ) -> None:
        """One round: the master's topics (re-registering when they changed, unless
        ``register`` is off), then every table; what fails waits for the next round.
        ``still_wanted`` is asked before anything fetched is taken (see forward_sync)."""
        core = self.core
        try:
            topics = await fetch_table(
                core.pool, master, RequestCode.GET_ALL_TOPIC_CONFIG, broker_pb2.TopicConfigTable
            )
        except HaError as exc:
            log.debug("slave sync from %s failed: %s", master, exc)
            return
        if not still_wanted():
            return  # acting now, or the master left, while the fetch was in flight
        changed = core.topics.take_from_master(
            [topic_config_from_pb(pb) for pb in topics.topics],
            data_version_from_pb(topics.data_version),
        )
        core.topics.taken_from_replica()
        if changed and register:
            await self._register()
        await forward_sync(self.tables, core.pool, master, still_wanted=still_wanted)

    def _still_wanted(self, master: str) -> bool:
        """Whether what ``master`` answered may still be taken: this slave does not act,
        and ``master`` is still its online master."""
        acting = self.core.acting
        return not acting.chosen and acting.master_online and acting.master_addr == master

    def awaiting_replica(self) -> list[str]:
        """The tables that were lost and are only to be had from a replica."""
        waiting = [t.name for t in self.tables if t.awaiting_replica()]
        return ["topics", *waiting] if self.core.topics.awaiting_replica else waiting

    # ---- offsets carried by the commit log ---------------------------------------------

    def on_dispatched(self, dispatched: list[Dispatched]) -> None:
        """Replicated records reached the consume queues: wake held pulls, apply offsets."""
        core = self.core
        for d in dispatched:
            if d.topic == OFFSET_TOPIC:
                self._apply_replicated_offset(d.queue_offset)
                continue
            core.holds.notify(d.topic, d.queue_id, d.queue_offset + 1, d.tag_hash)

    def _apply_replicated_offset(self, queue_offset: int) -> None:
        core = self.core
        try:
            m = core.store.get_message_at(OFFSET_TOPIC, 0, queue_offset)
        except RecordUnderRepair as exc:
            # a progress record: the next one of its group carries the newer offset
            log.warning("replicated offset record at %d passed over: %s", queue_offset, exc)
            return
        if m is None:
            return
        try:
            if not core.acting.chosen:
                self._records.apply(m.properties)
            elif m.properties["G"] not in PROGRESS_GROUPS:
                # acting, or held by the master that contacted us: our table is the
                # newest, but a commit that master takes once online moves it on
                core.offsets.apply_replicated_forward(m.properties)
            # (the special services' progress is this acting slave's own)
        except (KeyError, ValueError):
            log.warning("malformed replicated offset record at %d: %s", queue_offset, m.properties)
