"""ACK_MESSAGE (200051): RocketMQ's AckMessageProcessor.

An ack writes an ACK record next to its CK (:mod:`.revive_log`).  It is taken only
before the handle's invisible time is over, and marks the CK in memory before anything
awaits; once the time is over it is refused with ``ReceiptHandleExpired`` (RocketMQ's
"receipt handle is expired") because the revive loop may already be putting the
message back.  So an ack answered ok is never followed by the same message again, and
a late one tells its consumer that the message will come again.  (A handle whose CK
escaped to another group is checked here too, but that group's revive loop sees the
ack only once its record arrives there.)  With ``flush_mode = "sync"`` the ACK record is
synced with the commit log before the answer; an acting slave's ack (the ack table) and
an orderly ack (the group's offset) are written durably first (``WritePath.durable``).
"""

from __future__ import annotations

from collections.abc import Callable

from broker_agent.special.pop.receive import PopMessageProcessor
from broker_agent.special.pop.records import TAG_ACK, ReceiptHandle, ack_body
from broker_agent.special.pop.revive import PopReviveService
from broker_agent.special.pop.revive_log import ReviveLog
from broker_agent.special.ports import CorePort, WritePort
from ha_controller.proto import broker_pb2
from ha_controller.protocol.errors import BadRequest, ReceiptHandleExpired
from ha_controller.rpc import RequestContext

__all__ = ["AckMessageProcessor"]


class AckMessageProcessor:
    """ACK_MESSAGE, and the ack half of a change of invisible time."""

    def __init__(
        self,
        core: CorePort,
        write_path: WritePort,
        revive_log: ReviveLog,
        revive: PopReviveService,
        receive: PopMessageProcessor,
        clock: Callable[[], int],
    ) -> None:
        self.core = core
        self.write_path = write_path
        self.revive_log = revive_log
        self.revive = revive
        self.receive = receive
        self._clock = clock

    def handle_of(self, req: broker_pb2.AckMessageRequest) -> ReceiptHandle:
        """The request's receipt handle, which must be one of this broker's."""
        if not req.consumer_group or not req.topic:
            raise BadRequest("an ack needs a consumer group and a topic")
        handle = ReceiptHandle.decode(req.receipt_handle)
        own = self.core.cfg.broker_name
        if handle.broker_name != own:
            raise BadRequest(f"receipt handle of {handle.broker_name} sent to {own}")
        return handle

    def check_not_expired(self, handle: ReceiptHandle, what: str) -> None:
        """Refuse an ack or change of invisible time once the handle's invisible time
        is over: the revive loop may already be putting the message back (an ack
        answered ok must never be followed by the same message again)."""
        due = handle.pop_time_ms + handle.invisible_ms
        late = self._clock() - due
        if late >= 0:
            raise ReceiptHandleExpired(
                f"{what} of a receipt handle whose invisible time ended {late} ms ago: "
                "the message comes again"
            )

    async def write_ack(self, handle: ReceiptHandle, key: str) -> None:
        # a master appends the ACK record before anything awaits, so a revive pass
        # that starts from now on reads it; a pass already running revives only CKs
        # that were due when it started, and their handles are refused as expired
        if handle.ck_local and not self.core.acting.is_master:
            # the CK sits in our replicated revive queue: our revive loop owns it
            self.revive.ack_local(key, handle.offset)
            await self.write_path.durable(self.revive.acks)
            return
        # an escaped CK's ACK goes to the group that holds the CK, whoever serves the
        # ack (the returning master too: long campaign seed 1003 on 8fbf299)
        named = bool(handle.ck_group)
        await self.revive_log.write(
            ack_body(key, handle.offset),
            TAG_ACK,
            key,
            "pop_ack",
            to_group=handle.ck_group,
            to_queue=handle.revive_qid if named else None,
            confirm=True,
        )

    async def handle(
        self, ctx: RequestContext, req: broker_pb2.AckMessageRequest
    ) -> broker_pb2.AckMessageResponse:
        self.core.check_master_only("ACK_MESSAGE")
        handle = self.handle_of(req)
        if handle.orderly:
            self.receive.order_done(req.consumer_group, req.topic, handle)
            await self.write_path.durable(self.core.offsets)
            return broker_pb2.AckMessageResponse()
        self.check_not_expired(handle, "ack")
        await self.write_ack(handle, handle.ck_key(req.consumer_group, req.topic))
        return broker_pb2.AckMessageResponse()
