"""CHANGE_MESSAGE_INVISIBLETIME (200053): RocketMQ's ChangeInvisibleTimeProcessor.

A new CK for the one message from now, then an ACK of the old one, in one special
step (:mod:`broker_agent.special_steps`); the answer carries the new receipt handle.
An orderly message's batch keeps its queue until the new time instead (no CK).
"""

from __future__ import annotations

from collections.abc import Callable

from broker_agent.special.pop.ack import AckMessageProcessor
from broker_agent.special.pop.receive import PopMessageProcessor
from broker_agent.special.pop.records import MIN_INVISIBLE_MS, TAG_CK, Checkpoint, ReceiptHandle
from broker_agent.special.pop.revive_log import ReviveLog
from broker_agent.special.ports import CorePort
from ha_controller.proto import broker_pb2
from ha_controller.rpc import RequestContext

__all__ = ["ChangeInvisibleTimeProcessor"]


class ChangeInvisibleTimeProcessor:
    def __init__(
        self,
        core: CorePort,
        revive_log: ReviveLog,
        acks: AckMessageProcessor,
        receive: PopMessageProcessor,
        clock: Callable[[], int],
    ) -> None:
        self.core = core
        self.revive_log = revive_log
        self.acks = acks
        self.receive = receive
        self._clock = clock

    async def handle(
        self, ctx: RequestContext, req: broker_pb2.AckMessageRequest
    ) -> broker_pb2.AckMessageResponse:
        self.core.check_master_only("CHANGE_MESSAGE_INVISIBLETIME")
        handle = self.acks.handle_of(req)
        invisible = max(MIN_INVISIBLE_MS, req.invisible_time_ms)
        if handle.orderly:
            # the batch keeps its queue until then; the handle stays valid for the ack
            key = (req.consumer_group, req.topic, handle.queue_id)
            self.receive.order.extend(key, handle.pop_time_ms, self._clock() + invisible)
            return broker_pb2.AckMessageResponse(receipt_handle=handle.encode())
        self.acks.check_not_expired(handle, "change of invisible time")
        pop_ms = self.revive_log.pop_time()
        ck = Checkpoint(
            broker_name=handle.broker_name,
            group=req.consumer_group,
            topic=req.topic,
            queue_id=handle.queue_id,
            start_offset=handle.offset,
            offsets=(handle.offset,),
            pop_time_ms=pop_ms,
            invisible_ms=invisible,
            due_ms=pop_ms + invisible,
        )
        with self.core.special_steps.step():  # the new CK and the old one's ack, uncut
            revive_qid, local, holder = await self.revive_log.write(
                ck.to_json(), TAG_CK, ck.key, "pop_ck"
            )
            await self.acks.write_ack(handle, handle.ck_key(req.consumer_group, req.topic))
        new = ReceiptHandle(
            handle.offset,
            pop_ms,
            invisible,
            revive_qid,
            local,
            handle.broker_name,
            handle.queue_id,
            handle.offset,
            ck_group="" if local else holder,
        )
        return broker_pb2.AckMessageResponse(receipt_handle=new.encode())
