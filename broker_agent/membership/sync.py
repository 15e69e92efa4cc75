"""Forward metadata sync on a slave: topics and every versioned table from the master,
and the offset records that arrive in the replicated commit log."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from broker_agent.core import BrokerCore
from broker_agent.metadata.offsets import ConsumerOffsetSync
from broker_agent.metadata.versioned import FETCH_TIMEOUT_MS, VersionedTable, forward_sync
from broker_agent.store.message_store import Dispatched
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import HaError
from ha_controller.protocol.properties import OFFSET_TOPIC
from ha_controller.wire import data_version_from_pb, topic_config_from_pb

log = logging.getLogger(__name__)

SLAVE_SYNC_INTERVAL_S = 2.0

#: Applies one progress record of a special service (its properties), replicated
#: through the commit log; KeyError or ValueError for a malformed one.
ProgressApplier = Callable[[Mapping[str, str]], None]


class MetadataSync:
    """Keeps a plain slave's metadata in step with its master."""

    def __init__(
        self,
        core: BrokerCore,
        tables: Sequence[VersionedTable],
        progress: Mapping[str, ProgressApplier],
        register: Callable[[], Awaitable[None]],
    ) -> None:
        """``progress``: how to apply the special services' progress records in the
        offset topic, by their group ``G`` (the others are consumer offsets)."""
        self.core = core
        #: consumer offsets first, then the special services' tables
        self.tables: list[VersionedTable] = [ConsumerOffsetSync(core.offsets), *tables]
        self._progress = dict(progress)
        self._register = register

    async def loop(self) -> None:
        """Every 2 s while the master is online and this slave does not act."""
        core = self.core
        while True:
            await asyncio.sleep(SLAVE_SYNC_INTERVAL_S)
            master = core.acting.master_addr
            if core.acting.chosen or not core.acting.master_online or master is None:
                continue
            try:
                topics = await core.pool.call_pb(
                    master,
                    RequestCode.GET_ALL_TOPIC_CONFIG,
                    common_pb2.Empty(),
                    broker_pb2.TopicConfigTable,
                    timeout_ms=FETCH_TIMEOUT_MS,
                )
            except HaError as exc:
                log.debug("slave sync from %s failed: %s", master, exc)
                continue
            if not self._still_wanted(master):
                continue  # acting now, or the master left, while the fetch was in flight
            changed = False
            for pb in topics.topics:
                changed |= core.topics.upsert(topic_config_from_pb(pb))
            if changed:
                core.topics.data_version.assign(data_version_from_pb(topics.data_version))
                core.topics.persist()
                await self._register()
            await forward_sync(
                self.tables,
                core.pool,
                master,
                still_wanted=functools.partial(self._still_wanted, master),
            )

    def _still_wanted(self, master: str) -> bool:
        """Whether what ``master`` answered may still be taken: this slave does not act,
        and ``master`` is still its online master."""
        acting = self.core.acting
        return not acting.chosen and acting.master_online and acting.master_addr == master

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
        if core.acting.chosen:
            return  # while acting (or held for the returning master) our table is the newest
        m = core.store.get_message_at(OFFSET_TOPIC, 0, queue_offset)
        if m is None:
            return
        p = m.properties
        try:
            apply = self._progress.get(p["G"])
            if apply is not None:
                apply(p)
                return
            core.offsets.apply_replicated(p["G"], p["T"], int(p["Q"]), int(p["O"]))
        except (KeyError, ValueError):
            log.warning("malformed replicated offset record at %d: %s", queue_offset, p)
