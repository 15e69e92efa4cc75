"""RECALL_MESSAGE (RocketMQ 5.3): a timer message still waiting for its delivery time
can be recalled by its UNIQ_KEY, and is then never delivered.

The recall is kept in the recall table (:mod:`.recall_table`) and, on a master, also
written as a marker record into the timer queue itself (``TIMER_DEL_UNIQKEY``,
RocketMQ's way) through the write path and confirmed by the replicas before the recall
is acknowledged: a slave that takes over reads the marker from its replicated timer
queue, so a failover right after a recall cannot deliver the message.  An acting slave
cannot write its store: it keeps the recall in its table, which the returning master
adopts in pre-online, and hands it to every other member of its group (PUT_RECALLS)
before it answers, so that the slave acting next, should this one die too, knows it
(a recall answered by an acting slave was delivered on time after that slave's death).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from broker_agent.special.clock import Clock
from broker_agent.special.ports import CorePort, WritePort
from broker_agent.special.schedule.recall_table import RecallTable
from broker_agent.special.schedule.target import TIMER_QUEUE_ID
from broker_agent.special.schedule.timer import TimerLoop
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    BadRequest,
    HaError,
    InSyncReplicasNotEnough,
    NotMaster,
    NotRecallable,
    NotWritable,
)
from ha_controller.protocol.properties import (
    PROPERTY_DUE_MS,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DEL_UNIQKEY,
    TIMER_TOPIC,
)
from ha_controller.routing import BrokerMemberGroup
from ha_controller.rpc import RequestContext
from ha_controller.wire import data_version_from_pb, data_version_to_pb

__all__ = ["FetchMembers", "RecallService"]

#: asks the nameservers for this broker's member group now
FetchMembers = Callable[[], Awaitable[BrokerMemberGroup | None]]

log = logging.getLogger(__name__)

#: how long an acting slave waits for each member to keep its recall
HAND_ON_MS = 3000


class RecallService:
    """RECALL_MESSAGE and GET_RECALL_TABLE."""

    def __init__(
        self,
        core: CorePort,
        write_path: WritePort,
        recalls: RecallTable,
        timer_loop: TimerLoop,
        clock: Clock,
        fetch_members: FetchMembers | None = None,
    ) -> None:
        self.core = core
        self.fetch_members = fetch_members
        self.write_path = write_path
        self.recalls = recalls
        self.timer_loop = timer_loop
        self.clock = clock

    async def handle(
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
            if not core.acting.is_master:
                await self._hand_on(req.uniq_key, known[0], req.topic)
            return broker_pb2.RecallMessageResponse(msg_id=req.uniq_key)
        index = self.timer_loop.index
        if index is None:
            raise NotMaster(f"RECALL_MESSAGE: the schedule service of {core.name} is not running")
        self.timer_loop.read_queue(index)  # what was stored since the loop last looked
        entry = index.due_of.get(req.uniq_key)
        now = self.clock.now_ms()
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
            await self._write_marker(req, due)
        await asyncio.to_thread(self.recalls.persist)
        if not core.acting.is_master:
            await self._hand_on(req.uniq_key, due, req.topic)
        log.info("recalled timer message %s of %s (due %d)", req.uniq_key, req.topic, due)
        return broker_pb2.RecallMessageResponse(msg_id=req.uniq_key)

    async def _write_marker(self, req: broker_pb2.RecallMessageRequest, due: int) -> None:
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

    async def _hand_on(self, uniq_key: str, due: int, topic: str) -> None:
        """An acting slave's recall to every other member of its group, confirmed; one
        that does not confirm makes the recall refused as retriable (it is recalled
        here already: the retry hands it on again)."""
        core = self.core
        # the group as the nameservers see it now, and as this broker last saw it: a
        # slave that began to act right after its start may not have read the group yet
        # (its view is read every second), or read it before a member registered, and
        # a recall answered without that member is lost should this slave die next
        views = [core.member_group]
        if self.fetch_members is not None:
            try:
                views.append(await self.fetch_members())
            except (HaError, OSError) as exc:
                log.info("recall: member group not read from the nameservers: %s", exc)
        known = [v for v in views if v is not None and v.broker_addrs]
        if not known:
            raise InSyncReplicasNotEnough(
                f"recall of {uniq_key} kept here, but the members of {core.cfg.broker_name} "
                "are not known yet to hand it on; retry"
            )
        others = {
            bid: addr
            for view in known
            for bid, addr in view.broker_addrs.items()
            # not the master: an acting slave acts because it is gone, and a returning
            # master takes the recall table in its pre-online
            if bid not in (0, core.cfg.broker_id) and addr != core.addr
        }
        if not others:
            return
        table = broker_pb2.RecallTable(
            entries=[broker_pb2.RecallEntry(uniq_key=uniq_key, due_ms=due, topic=topic)],
            data_version=data_version_to_pb(self.recalls.data_version),
        )

        async def put(addr: str) -> None:
            await core.pool.call_pb(
                addr, RequestCode.PUT_RECALLS, table, common_pb2.Empty, timeout_ms=HAND_ON_MS
            )

        results = await asyncio.gather(*(put(a) for a in others.values()), return_exceptions=True)
        failed = [
            f"{bid} ({res})"
            for bid, res in zip(others, results, strict=True)
            if isinstance(res, BaseException)
        ]
        for res in results:
            if isinstance(res, BaseException) and not isinstance(res, HaError | OSError):
                raise res
        if failed:
            raise InSyncReplicasNotEnough(
                f"recall of {uniq_key} kept here but not confirmed by member(s) "
                f"{', '.join(failed)} of {core.cfg.broker_name}; retry"
            )

    async def put_recalls(
        self, ctx: RequestContext, req: broker_pb2.RecallTable
    ) -> common_pb2.Empty:
        """PUT_RECALLS: the acting slave's recall, kept here too (merged; with a cluster
        secret the guard lets only members send it)."""
        entries = {e.uniq_key: (e.due_ms, e.topic) for e in req.entries if e.uniq_key}
        if self.recalls.merge(entries, data_version_from_pb(req.data_version)):
            await asyncio.to_thread(self.recalls.persist)
            log.info("recall(s) of the acting slave kept: %s", ", ".join(sorted(entries)))
        return common_pb2.Empty()

    async def get_table(self, ctx: RequestContext, req: common_pb2.Empty) -> broker_pb2.RecallTable:
        return self.recalls.to_pb()
