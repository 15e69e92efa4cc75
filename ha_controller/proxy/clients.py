"""The SDK clients as the gateway knows them: Heartbeat, NotifyClientTermination and
the Telemetry stream (settings in, commands out), and the gateway's own HEART_BEAT to
the brokers, which names the producer topics and consumer groups of its clients (a
broker sends a transaction check on the connection a HEART_BEAT named its producer
group on, and lists consumers for rebalancing)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Final, Protocol

import grpc

from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import HaError
from ha_controller.protocol.properties import DELAY_LEVELS_MS
from ha_controller.proxy import convert
from ha_controller.proxy.core import MAX_BATCH, GatewayCore
from ha_controller.proxy.limits import client_id
from ha_controller.proxy.lite import LITE_CLIENT_TYPES, LiteService
from ha_controller.proxy.renewal import RenewalTable
from ha_controller.proxy.sessions import CONSUMER, PRODUCER

log = logging.getLogger(__name__)

__all__ = ["CONSUMER_BACKOFF_S", "Clients"]

#: Push-consumer redelivery back-off sent in settings: RocketMQ's first 16 delay levels
#: (1s 5s 10s 30s 1m ... 20m 30m).
CONSUMER_BACKOFF_S: Final = tuple(ms // 1000 for ms in DELAY_LEVELS_MS[:16])
#: the v2 consumer client types (lite ones included)
CONSUMER_TYPES: Final = frozenset(
    {v2.PUSH_CONSUMER, v2.SIMPLE_CONSUMER, v2.PULL_CONSUMER, *LITE_CLIENT_TYPES}
)


def _filter_refusal(subscription: v2.Subscription) -> str | None:
    """Why a consumer's declared subscriptions cannot be served (a bad SQL92
    expression), or None."""
    for entry in subscription.subscriptions:
        try:
            convert.filter_of(entry.expression)
        except HaError as exc:
            return f"topic {entry.topic.name}: {exc}"
    return None


class Orderly(Protocol):
    """Whether a consumer group consumes orderly (``Receiver.group_orderly``)."""

    def __call__(self, group: str, topic: str, *, fresh: bool = False) -> Awaitable[bool]: ...


class Clients:
    """Client sessions and the gateway's heartbeats to the brokers."""

    def __init__(
        self,
        core: GatewayCore,
        renewals: RenewalTable,
        orderly: Orderly,
        lite: LiteService | None = None,
    ) -> None:
        self.core = core
        self.renewals = renewals
        self._orderly = orderly
        self.lite = lite
        self.client_id = f"{socket.gethostname()}@{os.getpid()}@proxy@{uuid.uuid4().hex[:8]}"
        self._heartbeat_seen: dict[str, tuple[int, frozenset[str]]] = {}
        self.heartbeat_wake = asyncio.Event()

    # ---- Heartbeat / NotifyClientTermination ------------------------------------------

    async def heartbeat(
        self, request: v2s.HeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> v2s.HeartbeatResponse:
        cid = client_id(context)
        if cid:
            s = self.core.sessions.get(cid)
            if request.client_type in CONSUMER_TYPES:
                s.kind = CONSUMER
                s.group = request.group.name or s.group
                s.lite = request.client_type in LITE_CLIENT_TYPES
            elif request.client_type == v2.PRODUCER:
                s.kind = PRODUCER
        self.core.count("Heartbeat", v2.OK)
        return v2s.HeartbeatResponse(status=convert.status())

    async def notify_termination(
        self,
        request: v2s.NotifyClientTerminationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> v2s.NotifyClientTerminationResponse:
        cid = client_id(context)
        if cid:
            self.core.sessions.remove(cid)
            dropped = self.renewals.drop_client(cid)
            lite = self.lite.drop_client(cid) if self.lite is not None else 0
            log.info(
                "client %s terminated (%d messages no longer renewed, %d lite subscriptions "
                "dropped)",
                cid,
                dropped,
                lite,
            )
        self.core.count("NotifyClientTermination", v2.OK)
        return v2s.NotifyClientTerminationResponse(status=convert.status())

    # ---- Telemetry ----------------------------------------------------------------------

    async def telemetry(
        self,
        request_iterator: AsyncIterator[v2s.TelemetryCommand],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        sessions = self.core.sessions
        cid = client_id(context)
        if not cid:
            await context.write(
                v2s.TelemetryCommand(
                    status=convert.status(v2.CLIENT_ID_REQUIRED, "x-mq-client-id is required")
                )
            )
            return
        session = sessions.get(cid)
        session.streams += 1
        wake = asyncio.Event()
        sessions.wakers[cid] = wake.set
        done = asyncio.Event()

        async def reader() -> None:
            try:
                async for cmd in request_iterator:
                    reply = await self.on_command(cid, cmd)
                    if reply is not None:
                        sessions.push(sessions.get(cid), reply)
            finally:
                done.set()
                wake.set()

        async def writer() -> None:
            while True:
                s = sessions.find(cid)
                while s is not None and s.outbox:
                    await context.write(s.outbox.pop(0))
                if done.is_set():
                    return
                await wake.wait()
                wake.clear()

        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(reader(), name=f"telemetry-read-{cid}")
                tg.create_task(writer(), name=f"telemetry-write-{cid}")
        finally:
            session.streams -= 1
            if sessions.wakers.get(cid) == wake.set:
                sessions.wakers.pop(cid, None)
            log.info("telemetry stream of %s closed", cid)

    async def on_command(self, cid: str, cmd: v2s.TelemetryCommand) -> v2s.TelemetryCommand | None:
        """A command on a client's telemetry stream: its settings are answered with the
        gateway's (and authorised first: a producer may declare only topics it may
        publish to); thread stack traces and verify results need nothing."""
        if cmd.WhichOneof("command") != "settings":
            return None
        cfg = self.core.cfg
        settings = cmd.settings
        why = self.core.auth.settings_refusal(settings)
        if why is not None:
            log.info("client %s: settings refused: %s", cid, why)
            return v2s.TelemetryCommand(status=convert.status(v2.FORBIDDEN, why))
        s = self.core.sessions.get(cid)
        out = v2.Settings()
        out.CopyFrom(settings)
        if settings.client_type == v2.PRODUCER:
            s.kind = PRODUCER
            s.topics = frozenset(convert.topics_of(settings.publishing.topics))
            out.publishing.max_body_size = cfg.max_message_bytes
            # as RocketMQ's proxy (enableTopicMessageTypeCheck): an SDK that checks a
            # message's type against the queue's accepted types refuses it before sending
            out.publishing.validate_message_type = True
            out.backoff_policy.CopyFrom(
                v2.RetryPolicy(
                    max_attempts=cfg.send_attempts,
                    exponential_backoff=v2.ExponentialBackoff(
                        initial=convert.duration_of_ms(10),
                        max=convert.duration_of_ms(1000),
                        multiplier=2.0,
                    ),
                )
            )
            self.heartbeat_wake.set()
        elif settings.client_type in CONSUMER_TYPES:
            refusal = _filter_refusal(settings.subscription)
            if refusal is not None:
                # as RocketMQ's proxy answers a subscription it cannot build: a push
                # consumer with a bad SQL92 fails to start instead of receiving nothing
                log.info("client %s: subscription refused: %s", cid, refusal)
                return v2s.TelemetryCommand(
                    status=convert.status(v2.ILLEGAL_FILTER_EXPRESSION, refusal)
                )
            s.kind = CONSUMER
            s.group = settings.subscription.group.name
            s.lite = settings.client_type in LITE_CLIENT_TYPES
            sub = out.subscription
            topics = [e.topic.name for e in settings.subscription.subscriptions if e.topic.name]
            # a lite consumer consumes in order (per lite topic), as RocketMQ's do
            orderly = s.lite or s.group in cfg.fifo_groups
            if not orderly and topics:
                orderly = await self._orderly(s.group, topics[0], fresh=True)
            sub.fifo = orderly
            if s.lite:  # the SDKs check both before a SyncLiteSubscription
                sub.lite_subscription_quota = cfg.lite_subscription_quota
                sub.max_lite_topic_size = cfg.max_lite_topic_bytes
            sub.receive_batch_size = MAX_BATCH
            sub.long_polling_timeout.CopyFrom(convert.duration_of_ms(cfg.long_polling_timeout_ms))
            out.backoff_policy.CopyFrom(
                v2.RetryPolicy(
                    max_attempts=16,
                    customized_backoff=v2.CustomizedBackoff(
                        next=[convert.duration_of_ms(s * 1000) for s in CONSUMER_BACKOFF_S]
                    ),
                )
            )
        else:
            return v2s.TelemetryCommand(
                status=convert.status(v2.UNRECOGNIZED_CLIENT_TYPE, "unknown client type")
            )
        out.metric.CopyFrom(v2.Metric(on=False))
        log.info(
            "client %s: %s %s",
            cid,
            v2.ClientType.Name(settings.client_type),
            sorted(s.topics) if s.kind == PRODUCER else s.group,
        )
        return v2s.TelemetryCommand(status=convert.status(), settings=out)

    # ---- the gateway's heartbeats to the brokers ---------------------------------------

    async def ensure_heartbeat(self, addr: str, topic: str) -> None:
        """The broker checks a half message on the connection a HEART_BEAT named
        its producer group on: make sure this connection did, before sending."""
        conn = await self.core.pool.get(addr)
        seen = self._heartbeat_seen.get(addr)
        if seen is not None and seen[0] == id(conn) and topic in seen[1]:
            return
        await self._heartbeat_one(addr, extra={topic})

    async def _heartbeat_one(self, addr: str, extra: set[str] | None = None) -> None:
        sessions = self.core.sessions
        producers = frozenset(sessions.producer_topics() | (extra or set()))
        consumers = sorted(sessions.consumer_groups())
        conn = await self.core.pool.get(addr)
        await conn.call_pb(
            RequestCode.HEART_BEAT,
            broker_pb2.ClientHeartbeat(
                client_id=self.client_id,
                producer_groups=sorted(producers),
                consumer_groups=consumers,
            ),
            common_pb2.Empty,
            self.core.cfg.broker_timeout_ms,
        )
        self._heartbeat_seen[addr] = (id(conn), producers)

    async def heartbeat_brokers(self) -> None:
        sessions = self.core.sessions
        if not sessions.producer_topics() and not sessions.consumer_groups():
            return
        for addr in sorted(set(self.core.group_addrs.values())):
            try:
                await self._heartbeat_one(addr)
            except (HaError, OSError, TimeoutError) as exc:
                log.debug("heartbeat to %s failed: %s", addr, exc)
