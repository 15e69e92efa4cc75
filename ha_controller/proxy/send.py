"""SendMessage and RecallMessage.

A v2 send names no queue: the gateway picks one, round robin over the writable
queues, a FIFO message group by SipHash over them; a retriable failure moves the
message to another group (at most ``send_attempts`` tries), and a group that failed
is avoided for a while.  Every message of a call is checked first
(``ha_controller.protocol.validation``, and the topic's message type), so that a refused
call stores nothing.  A transactional send first makes sure the broker knows where to
send its check (``Clients.ensure_heartbeat``); a delayed send's receipt carries the
recall handle.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any, Final

import grpc

from ha_controller.client.send_policy import EndpointIsolation
from ha_controller.proto import broker_pb2
from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BadRequest, HaError, MessageTypeConflict, NotMaster
from ha_controller.protocol.properties import PROPERTY_TIMER_DELIVER_MS
from ha_controller.protocol.topics import TopicMessageType, message_type_problem
from ha_controller.protocol.validation import check_topic
from ha_controller.proxy import convert
from ha_controller.proxy.clients import Clients
from ha_controller.proxy.core import GatewayCore, retriable
from ha_controller.proxy.handles import InvalidHandle, RecallHandle, TransactionId
from ha_controller.proxy.limits import client_id
from ha_controller.proxy.transactions import Transactions

log = logging.getLogger(__name__)

__all__ = ["ISOLATION_S", "Sender"]

#: A broker that failed a send is avoided this long (or until a send succeeds).
ISOLATION_S: Final = 5.0


class Sender:
    """SendMessage and RecallMessage."""

    def __init__(self, core: GatewayCore, clients: Clients, transactions: Transactions) -> None:
        self.core = core
        self.clients = clients
        self.transactions = transactions
        self._isolation = EndpointIsolation(ISOLATION_S)
        self._rr = itertools.count()

    async def send(
        self, request: v2s.SendMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> v2s.SendMessageResponse:
        core = self.core
        cid = client_id(context)
        deadline = time.monotonic() + (context.time_remaining() or 3.0)
        refused = core.bounds.send_refusal(len(request.messages), cid)
        if refused is not None:  # before anything is sent
            core.count("SendMessage", refused.code)
            return v2s.SendMessageResponse(status=refused)

        async def work() -> v2s.SendMessageResponse:
            if not request.messages:
                raise BadRequest("SendMessage with no messages")
            topics = {m.topic.name for m in request.messages}
            if len(topics) != 1 or "" in topics:
                raise BadRequest("the messages of one SendMessage need one topic")
            topic = topics.pop()
            check_topic(topic)
            # every message is checked, and the topic's type, before any is sent
            plans = [convert.send_entry(m, topic, limits=core.limits) for m in request.messages]
            topic_type = await core.topic_type(topic)
            for plan in plans:
                problem = message_type_problem(topic, topic_type, plan.topic_type)
                if problem is not None:
                    raise MessageTypeConflict(problem)
            entries = [await self._send_one(topic, p, cid, deadline) for p in plans]
            failed = [e.status for e in entries if e.status.code != v2.OK]
            overall = failed[0] if failed else convert.status()
            return v2s.SendMessageResponse(status=overall, entries=entries)

        return await core.answer("SendMessage", v2s.SendMessageResponse, work)

    async def _send_one(
        self, topic: str, plan: convert.SendPlan, cid: str, deadline: float
    ) -> v2s.SendResultEntry:
        core = self.core
        tried: set[str] = set()
        last: BaseException | None = None
        for attempt in range(core.cfg.send_attempts):
            queues = convert.writable_queues(await core.route(topic, fresh=attempt > 0))
            if not queues:
                raise NotMaster(f"no writable queue for {topic}: every group is down or acting")
            key = plan.message_group if plan.message_group is not None else plan.lite_topic
            if key is not None:  # a message group's or a lite topic's queue: its order
                q = convert.fifo_queue(queues, key)
            else:
                fresh = [
                    q
                    for q in queues
                    if q.broker_name not in tried and not self._isolation.is_isolated(q.addr)
                ]
                pick = fresh or [q for q in queues if q.broker_name not in tried] or queues
                q = pick[next(self._rr) % len(pick)]
            remaining_ms = int((deadline - time.monotonic()) * 1000) - 100
            if remaining_ms <= 0:
                break
            try:
                if plan.message_type == v2.TRANSACTION:
                    await self.clients.ensure_heartbeat(q.addr, topic)
                resp = await core.pool.call_pb(
                    q.addr,
                    RequestCode.SEND_MESSAGE,
                    broker_pb2.SendMessageRequest(
                        producer_group=topic,
                        topic=topic,
                        queue_id=q.queue_id,
                        entries=[plan.entry],
                        born_host=plan.born_host,
                    ),
                    broker_pb2.SendMessageResponse,
                    min(core.cfg.broker_timeout_ms, remaining_ms),
                )
            except (HaError, OSError, TimeoutError) as exc:
                if not retriable(exc):
                    raise
                last = exc
                tried.add(q.broker_name)
                self._isolation.isolate(q.addr)
                core.metrics.send_retries.inc()
                log.info(
                    "send to %s (%s) failed, trying another group: %s", q.broker_name, q.addr, exc
                )
                continue
            self._isolation.release(q.addr)
            result = resp.results[0]
            message_id = plan.message_id or result.uniq_key or result.msg_id
            # the transaction id is the message id for every send, as RocketMQ's broker
            # answers it (SDKs compare the two); for a half message the gateway keeps
            # where it is, for the EndTransaction to come
            entry = v2s.SendResultEntry(
                status=convert.status(),
                message_id=message_id,
                offset=result.queue_offset,
                transaction_id=message_id,
            )
            if plan.message_type == v2.TRANSACTION:
                self.transactions.remember(
                    topic,
                    TransactionId(
                        resp.broker_name or q.broker_name,
                        result.queue_offset,
                        result.commit_log_offset,
                        result.uniq_key or plan.message_id,
                    ),
                    message_id,
                    cid,
                )
            elif plan.message_type == v2.DELAY:
                entry.recall_handle = RecallHandle(
                    topic,
                    resp.broker_name or q.broker_name,
                    int(plan.entry.properties[PROPERTY_TIMER_DELIVER_MS]),
                    entry.message_id,
                ).encode()
            return entry
        if last is not None:
            raise last
        raise TimeoutError(f"send to {topic} ran out of time")

    async def recall(
        self, request: v2s.RecallMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> v2s.RecallMessageResponse:
        """RocketMQ 5.3 recall of a delayed (timer) message: RECALL_MESSAGE to the
        id-0 address of the group the handle names (the acting slave in a failover)."""

        async def work() -> v2s.RecallMessageResponse:
            topic = request.topic.name
            check_topic(topic)
            # only a topic that takes delayed messages has any to recall (RocketMQ's
            # ProducerProcessor checks the same)
            problem = message_type_problem(
                topic, await self.core.topic_type(topic), TopicMessageType.DELAY
            )
            if problem is not None:
                raise MessageTypeConflict(problem)
            try:
                handle = RecallHandle.decode(request.recall_handle)
            except InvalidHandle as exc:
                return v2s.RecallMessageResponse(
                    status=convert.status(v2.BAD_REQUEST, f"recall handle is invalid: {exc}")
                )
            if topic != handle.topic:
                return v2s.RecallMessageResponse(
                    status=convert.status(
                        v2.BAD_REQUEST, f"recall handle is for {handle.topic!r}, not {topic!r}"
                    )
                )
            resp = await self.core.call_group(
                topic,
                handle.broker_name,
                RequestCode.RECALL_MESSAGE,
                broker_pb2.RecallMessageRequest(
                    producer_group=topic,
                    topic=topic,
                    broker_name=handle.broker_name,
                    deliver_ms=handle.deliver_ms,
                    uniq_key=handle.message_id,
                ),
                broker_pb2.RecallMessageResponse,
            )
            return v2s.RecallMessageResponse(
                status=convert.status(), message_id=resp.msg_id or handle.message_id
            )

        return await self.core.answer("RecallMessage", v2s.RecallMessageResponse, work)
