"""The v2 MessagingService: the official RocketMQ 5 SDKs talk to this gateway,
which talks to our nameserver and brokers with our RPC.

The servicer is thin: each RPC goes to the part that owns its activity, as in
RocketMQ's proxy (its ``*Activity`` classes):

- routes and the error funnel: :mod:`ha_controller.proxy.core`;
- SendMessage, RecallMessage: :mod:`ha_controller.proxy.send`;
- ReceiveMessage: :mod:`ha_controller.proxy.receive`;
- AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue and the
  renewal of push consumers' invisible time: :mod:`ha_controller.proxy.ack`;
- Heartbeat, NotifyClientTermination, Telemetry and the gateway's heartbeats to the
  brokers: :mod:`ha_controller.proxy.clients`;
- EndTransaction and the brokers' transaction checks:
  :mod:`ha_controller.proxy.transactions`;
- SyncLiteSubscription (lite topics): :mod:`ha_controller.proxy.lite`.

Authentication and authorisation (:mod:`ha_controller.proxy.auth`) and the per-call
bounds (:mod:`ha_controller.proxy.limits`) run as interceptors before any of these.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message as PbMessage

from ha_controller.acl.sync import fetch_newer
from ha_controller.client.admin import NameserverClient
from ha_controller.config import ProxyConfig
from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s
from ha_controller.proto.rocketmq.v2 import service_pb2_grpc
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.validation import check_consumer_group, check_topic
from ha_controller.proxy import convert
from ha_controller.proxy.ack import Acker
from ha_controller.proxy.auth import GatewayAuth
from ha_controller.proxy.clients import CONSUMER_BACKOFF_S, Clients
from ha_controller.proxy.core import GatewayCore
from ha_controller.proxy.limits import CallBounds
from ha_controller.proxy.lite import LiteService
from ha_controller.proxy.metrics import ProxyMetrics
from ha_controller.proxy.receive import Receiver
from ha_controller.proxy.renewal import RenewalTable
from ha_controller.proxy.send import Sender
from ha_controller.proxy.sessions import CONSUMER, PRODUCER
from ha_controller.proxy.transactions import Transactions
from ha_controller.rpc import ConnectionPool, Dispatcher

log = logging.getLogger(__name__)

R = TypeVar("R", bound=PbMessage)

__all__ = ["CONSUMER_BACKOFF_S", "Gateway"]

Context = grpc.aio.ServicerContext[Any, Any]


def _not_offered(method: str) -> v2.Status:
    return convert.status(
        v2.NOT_IMPLEMENTED, f"{method} is not offered by the ha-controller gateway"
    )


def _not_offered_unary(
    method: str, response: Callable[..., R]
) -> Callable[[Any, Any, Context], Awaitable[R]]:
    """The servicer method ``method`` that the gateway does not offer: it answers a
    ``response`` with status NOT_IMPLEMENTED."""

    async def handler(self: Any, request: Any, context: Context) -> R:
        return response(status=_not_offered(method))

    handler.__name__ = method
    handler.__qualname__ = f"Gateway.{method}"
    return handler


class Gateway(service_pb2_grpc.MessagingServiceServicer):
    """The servicer: builds the gateway's parts and hands each RPC to its own."""

    def __init__(self, cfg: ProxyConfig, metrics: ProxyMetrics | None = None) -> None:
        metrics = metrics or ProxyMetrics()
        # the per-call bounds; the server installs it as an interceptor (proxy/app.py)
        self.bounds = CallBounds(cfg, metrics)
        # requests are signed as the gRPC call's ACL user (ha_controller.proxy.auth)
        self.auth = GatewayAuth.from_config(cfg)
        dispatcher = Dispatcher()  # the brokers' calls on the gateway's connections
        # the gateway's brokers and nameservers are dialled with the gateway's [tls]
        tls = cfg.tls.client_context()
        sign = self.auth.signer
        self.core = core = GatewayCore(
            cfg,
            metrics,
            self.auth,
            ConnectionPool(
                dispatcher=dispatcher, connect_timeout_ms=2000, ssl_context=tls, signer=sign
            ),
            NameserverClient(
                list(cfg.namesrv_addrs),
                ConnectionPool(connect_timeout_ms=2000, ssl_context=tls, signer=sign),
            ),
            self.bounds,
        )
        self.renewals = RenewalTable()
        self.lite = LiteService(core)
        self.receiver = Receiver(core, self.renewals, self.lite)
        self.acker = Acker(core, self.renewals)
        self.clients = Clients(core, self.renewals, self.receiver.group_orderly, self.lite)
        self.transactions = Transactions(core)
        self.sender = Sender(core, self.clients, self.transactions)
        dispatcher.add_raw(RequestCode.CHECK_TRANSACTION_STATE, self.transactions.on_check)

    # ---- what the server and the tests see ------------------------------------------

    @property
    def cfg(self) -> ProxyConfig:
        return self.core.cfg

    @property
    def metrics(self) -> ProxyMetrics:
        return self.core.metrics

    @property
    def advertised(self) -> str:
        return self.core.advertised

    @advertised.setter
    def advertised(self, addr: str) -> None:
        self.core.advertised = addr

    # ---- life cycle ----------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Background work until ``stop``: heartbeats to brokers, session expiry,
        invisible-time renewal, the cluster's ACL table."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.acker.renew_loop(stop), name="proxy-renewal")
            if self.auth.acl.holder is not None and self.auth.cluster.enabled:
                tg.create_task(self._acl_loop(stop), name="proxy-acl")
            await self._housekeeping(stop)

    async def _acl_loop(self, stop: asyncio.Event) -> None:
        """The cluster's ACL table from the nameservers, every ``acl_sync_interval_ms``
        (a change reaches the gateway within about that)."""
        holder = self.auth.acl.holder
        assert holder is not None
        while not stop.is_set():
            for ns in self.cfg.namesrv_addrs:
                if await fetch_newer(self.core.ns.pool, ns, holder):
                    break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.cfg.acl_sync_interval_ms / 1000):
                    await stop.wait()

    async def _housekeeping(self, stop: asyncio.Event) -> None:
        sessions, metrics, wake = self.core.sessions, self.metrics, self.clients.heartbeat_wake
        while not stop.is_set():
            try:
                await self.clients.heartbeat_brokers()
            except Exception:
                log.exception("broker heartbeat round failed")
            for cid in sessions.expire():
                log.info("client %s expired", cid)
                self.renewals.drop_client(cid)
                self.lite.drop_client(cid)
            metrics.clients.labels(type=PRODUCER).set(sessions.count(PRODUCER))
            metrics.clients.labels(type=CONSUMER).set(sessions.count(CONSUMER))
            waits = [asyncio.ensure_future(e.wait()) for e in (stop, wake)]
            try:
                await asyncio.wait(
                    waits,
                    timeout=self.cfg.heartbeat_broker_interval_ms / 1000,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                for w in waits:
                    w.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
            wake.clear()

    async def aclose(self) -> None:
        await self.receiver.aclose()
        await self.core.pool.aclose()
        await self.core.ns.pool.aclose()

    # ---- the RPCs ------------------------------------------------------------------

    async def QueryRoute(
        self, request: v2s.QueryRouteRequest, context: Context
    ) -> v2s.QueryRouteResponse:
        core = self.core

        async def work() -> v2s.QueryRouteResponse:
            check_topic(request.topic.name)
            route = await core.route(request.topic.name, fresh=True)
            kind = await core.topic_type(route.topic)
            queues = convert.v2_queues(route, core.endpoints(request.endpoints), kind)
            return v2s.QueryRouteResponse(status=convert.status(), message_queues=queues)

        return await core.answer("QueryRoute", v2s.QueryRouteResponse, work)

    async def QueryAssignment(
        self, request: v2s.QueryAssignmentRequest, context: Context
    ) -> v2s.QueryAssignmentResponse:
        core = self.core

        async def work() -> v2s.QueryAssignmentResponse:
            check_topic(request.topic.name)
            check_consumer_group(request.group.name)
            route = await core.route(request.topic.name)
            kind = await core.topic_type(route.topic)
            found = convert.assignments(route, core.endpoints(request.endpoints), kind)
            return v2s.QueryAssignmentResponse(status=convert.status(), assignments=found)

        return await core.answer("QueryAssignment", v2s.QueryAssignmentResponse, work)

    async def Heartbeat(
        self, request: v2s.HeartbeatRequest, context: Context
    ) -> v2s.HeartbeatResponse:
        return await self.clients.heartbeat(request, context)

    async def NotifyClientTermination(
        self, request: v2s.NotifyClientTerminationRequest, context: Context
    ) -> v2s.NotifyClientTerminationResponse:
        return await self.clients.notify_termination(request, context)

    async def Telemetry(
        self, request_iterator: AsyncIterator[v2s.TelemetryCommand], context: Context
    ) -> None:
        await self.clients.telemetry(request_iterator, context)

    async def SendMessage(
        self, request: v2s.SendMessageRequest, context: Context
    ) -> v2s.SendMessageResponse:
        return await self.sender.send(request, context)

    async def RecallMessage(
        self, request: v2s.RecallMessageRequest, context: Context
    ) -> v2s.RecallMessageResponse:
        return await self.sender.recall(request, context)

    async def ReceiveMessage(
        self, request: v2s.ReceiveMessageRequest, context: Context
    ) -> AsyncIterator[v2s.ReceiveMessageResponse]:
        async for response in self.receiver.receive(request, context):
            yield response

    async def AckMessage(
        self, request: v2s.AckMessageRequest, context: Context
    ) -> v2s.AckMessageResponse:
        return await self.acker.ack(request, context)

    async def ChangeInvisibleDuration(
        self, request: v2s.ChangeInvisibleDurationRequest, context: Context
    ) -> v2s.ChangeInvisibleDurationResponse:
        return await self.acker.change_invisible(request, context)

    async def ForwardMessageToDeadLetterQueue(
        self, request: v2s.ForwardMessageToDeadLetterQueueRequest, context: Context
    ) -> v2s.ForwardMessageToDeadLetterQueueResponse:
        return await self.acker.forward_to_dlq(request, context)

    async def SyncLiteSubscription(
        self, request: v2s.SyncLiteSubscriptionRequest, context: Context
    ) -> v2s.SyncLiteSubscriptionResponse:
        return await self.lite.sync(request, context)

    async def EndTransaction(
        self, request: v2s.EndTransactionRequest, context: Context
    ) -> v2s.EndTransactionResponse:
        return await self.transactions.end(request, context)

    # ---- not offered -----------------------------------------------------------------

    async def PullMessage(
        self, request: v2s.PullMessageRequest, context: Context
    ) -> AsyncIterator[v2s.PullMessageResponse]:
        yield v2s.PullMessageResponse(status=_not_offered("PullMessage"))

    UpdateOffset = _not_offered_unary("UpdateOffset", v2s.UpdateOffsetResponse)
    GetOffset = _not_offered_unary("GetOffset", v2s.GetOffsetResponse)
    QueryOffset = _not_offered_unary("QueryOffset", v2s.QueryOffsetResponse)
