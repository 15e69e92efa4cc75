"""Transactions through the gateway.

A v2 transaction id is the half message's message id (its UNIQ_KEY), as RocketMQ's
broker answers it.  The gateway keeps where each half message is (group, half-queue
offset, :class:`TransactionId`), from the send and from every check it relays, as
RocketMQ's proxy keeps its transaction data: the SDK's EndTransaction goes back to that
group as END_TRANSACTION, which its broker authorises against the half message's real
topic.  An id in the gateway's own older form (``t1.``, which says where the half is)
is still read.  The brokers' CHECK_TRANSACTION_STATE, which arrives on the gateway's own
broker connection, becomes a RecoverOrphanedTransactionCommand on the telemetry stream
of a producer of the topic whose user may publish to it (the one that sent the half
first).
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from ha_controller.acl.rules import PUB, topic_need
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BadRequest
from ha_controller.protocol.properties import PROPERTY_UNIQ_KEY
from ha_controller.proxy import convert
from ha_controller.proxy.core import GatewayCore
from ha_controller.proxy.handles import TX_PREFIX, InvalidHandle, TransactionId
from ha_controller.proxy.sessions import BoundedMap
from ha_controller.rpc import RequestContext

log = logging.getLogger(__name__)

__all__ = ["MAX_TRANSACTIONS", "Transactions"]

#: open transactions the gateway remembers (the oldest forgotten first)
MAX_TRANSACTIONS = 100_000


def _key(topic: str, transaction_id: str) -> str:
    return f"{topic}\0{transaction_id}"


class Transactions:
    """EndTransaction and the brokers' checks."""

    def __init__(self, core: GatewayCore) -> None:
        self.core = core
        #: transaction id -> the client that sent its half message (asked first)
        self.owner = BoundedMap(MAX_TRANSACTIONS)
        #: (topic, transaction id) -> where its half message is (TransactionId.encode())
        self.where = BoundedMap(MAX_TRANSACTIONS)

    def remember(self, topic: str, tx: TransactionId, transaction_id: str, client: str) -> None:
        """A half message ``tx`` of ``topic`` stored for ``client``, known to it as
        ``transaction_id``."""
        self.where.put(_key(topic, transaction_id), tx.encode())
        if client:
            self.owner.put(transaction_id, client)

    def locate(self, topic: str, transaction_id: str) -> TransactionId:
        """Where the half message of ``transaction_id`` (sent to ``topic``) is;
        InvalidHandle when the gateway does not know it."""
        known = self.where.get(_key(topic, transaction_id))
        if known is not None:
            return TransactionId.decode(known)
        if transaction_id.startswith(TX_PREFIX):
            return TransactionId.decode(transaction_id)  # the gateway's older form
        raise InvalidHandle(
            f"transaction {transaction_id[:64]!r} of {topic[:128]!r} is not known to this "
            "gateway (its half message was sent through another one, or before a restart): "
            "the broker's check will resolve it"
        )

    async def end(
        self, request: v2s.EndTransactionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> v2s.EndTransactionResponse:
        async def work() -> v2s.EndTransactionResponse:
            topic = request.topic.name
            if not request.transaction_id:
                return v2s.EndTransactionResponse(
                    status=convert.status(v2.INVALID_TRANSACTION_ID, "transaction id is empty")
                )
            try:
                tx = self.locate(topic, request.transaction_id)
            except InvalidHandle as exc:
                return v2s.EndTransactionResponse(
                    status=convert.status(v2.INVALID_TRANSACTION_ID, str(exc))
                )
            if request.resolution not in (v2.COMMIT, v2.ROLLBACK):
                return v2s.EndTransactionResponse(status=convert.status())  # unknown: check later
            await self.core.call_group(
                topic,
                tx.broker_name,
                RequestCode.END_TRANSACTION,
                broker_pb2.EndTransactionRequest(
                    producer_group=topic,
                    topic=topic,
                    commit_log_offset=tx.commit_log_offset,
                    msg_id=request.message_id,
                    transaction_id=tx.uniq_key,
                    commit=request.resolution == v2.COMMIT,
                    from_check=request.source == v2.SOURCE_SERVER_CHECK,
                    broker_name=tx.broker_name,
                    half_queue_offset=tx.half_offset,
                ),
                common_pb2.Empty,
            )
            if request.source != v2.SOURCE_SERVER_CHECK:
                # the producer's own decision is the last: a checker's answer may come
                # before it (the broker then still takes the producer's commit)
                self.owner.pop(request.transaction_id, None)
                self.where.pop(_key(topic, request.transaction_id), None)
            return v2s.EndTransactionResponse(status=convert.status())

        return await self.core.answer("EndTransaction", v2s.EndTransactionResponse, work)

    async def on_check(self, ctx: RequestContext, body: bytes) -> bytes | None:
        """CHECK_TRANSACTION_STATE (one-way, broker -> us): ask a producer of the topic."""
        req = broker_pb2.CheckTransactionStateRequest()
        try:
            req.ParseFromString(body)
        except DecodeError as exc:
            raise BadRequest("undecodable CheckTransactionStateRequest") from exc
        core = self.core
        topic = req.message.topic
        uniq = req.transaction_id or req.message.properties.get(PROPERTY_UNIQ_KEY, "")
        tx = TransactionId(
            req.broker_name or req.message.broker_name,
            req.message.queue_offset,
            req.commit_log_offset,
            uniq,
        )
        # the SDK's checker answers with this id: the gateway knows where it is now
        self.where.put(_key(topic, uniq), tx.encode())
        command = convert.recover_command(req, uniq)
        # only a producer whose user may publish to the topic is asked (and sees the body)
        need = topic_need(topic, PUB)
        auth = core.auth
        for session in core.sessions.producers_for(topic, prefer=self.owner.get(uniq)):
            cid = session.client_id
            if not auth.allows(auth.client_ids.owner(cid), need, auth.client_ips.get(cid)):
                continue
            if core.sessions.push(session, command):
                core.metrics.transaction_checks.labels(result="forwarded").inc()
                log.info("transaction %s of %s: asking producer %s", uniq, topic, cid)
                return None
        core.metrics.transaction_checks.labels(result="no_producer").inc()
        log.info("transaction %s of %s: no producer connected to ask", uniq, topic)
        return None
