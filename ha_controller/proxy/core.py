"""What every activity of the gateway shares: its settings, metrics and credentials,
the connections to the brokers and nameservers, the client sessions, the routes, and
the funnel that turns a failure into a v2 status.

Routes come from the nameserver (``NameserverClient.route``), with its RIP-32
rewrite: a group's id 0 is its master or the slave acting for it, and an acting
group's queues are READ only.  Every v2 endpoint is the gateway itself; a v2 queue
(broker name, queue id) maps back to the group's id-0 address.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from google.protobuf.message import Message as PbMessage

from ha_controller.client.admin import NameserverClient
from ha_controller.config import ProxyConfig
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import HaError, NotMaster, TopicNotFound
from ha_controller.protocol.topics import TopicMessageType
from ha_controller.protocol.validation import MessageLimits
from ha_controller.proxy import convert
from ha_controller.proxy.auth import GatewayAuth
from ha_controller.proxy.limits import CallBounds
from ha_controller.proxy.metrics import ProxyMetrics
from ha_controller.proxy.sessions import Sessions
from ha_controller.routing import TopicRouteData
from ha_controller.rpc import ConnectionPool

log = logging.getLogger(__name__)

R = TypeVar("R", bound=PbMessage)

__all__ = ["MAX_BATCH", "GatewayCore", "retriable"]

MAX_BATCH: Final = 32


def retriable(exc: BaseException) -> bool:
    if isinstance(exc, HaError):
        return exc.retriable
    return isinstance(exc, OSError | TimeoutError)


class GatewayCore:
    """The gateway's shared state (no behaviour beyond routes and the error funnel)."""

    def __init__(
        self,
        cfg: ProxyConfig,
        metrics: ProxyMetrics,
        auth: GatewayAuth,
        pool: ConnectionPool,
        ns: NameserverClient,
        bounds: CallBounds,
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.auth = auth
        #: to the brokers (the gateway's own dispatcher answers their checks)
        self.pool = pool
        self.ns = ns
        #: the per-call bounds (an interceptor; the send path asks it too)
        self.bounds = bounds
        self.sessions: Sessions[v2s.TelemetryCommand] = Sessions()
        self.advertised = ""  # host:port clients use; set once bound
        self._routes: dict[str, tuple[float, TopicRouteData]] = {}
        #: broker name -> id-0 address, from any route
        self.group_addrs: dict[str, str] = {}
        #: topic -> (until, message type), from a master's topic table
        self._topic_types: dict[str, tuple[float, TopicMessageType]] = {}
        #: what a message may carry (the gateway's settings, RocketMQ's other defaults)
        self.limits = MessageLimits(
            max_body_bytes=cfg.max_message_bytes,
            max_delay_ms=cfg.max_delay_ms,
            max_lite_topic_bytes=cfg.max_lite_topic_bytes,
        )

    # ---- routes ----------------------------------------------------------------

    async def route(self, topic: str, *, fresh: bool = False) -> TopicRouteData:
        now = time.monotonic()
        cached = self._routes.get(topic)
        if cached is not None and not fresh and now < cached[0]:
            return cached[1]
        route = await self.ns.route(topic)
        self._routes[topic] = (now + self.cfg.route_ttl_ms / 1000, route)
        for b in route.broker_datas:
            addr = b.broker_addrs.get(0)
            if addr is not None:
                self.group_addrs[b.broker_name] = addr
            else:
                self.group_addrs.pop(b.broker_name, None)
        return route

    async def group_addr(self, topic: str, broker_name: str, *, fresh: bool = False) -> str:
        """The id-0 address (master or acting slave) of a group, via ``topic``'s route."""
        try:
            route = await self.route(topic, fresh=fresh)
        except TopicNotFound:
            route = None
        if route is not None:
            broker = route.broker(broker_name)
            addr = broker.broker_addrs.get(0) if broker is not None else None
            if addr is not None:
                return addr
        addr = self.group_addrs.get(broker_name)
        if addr is None:
            raise NotMaster(f"group {broker_name} has no master and nobody acting for it")
        return addr

    async def call_group(
        self, topic: str, broker_name: str, method: int, request: PbMessage, resp_type: type[R]
    ) -> R:
        """One call to the id-0 address of group ``broker_name`` (see :meth:`group_addr`)."""
        addr = await self.group_addr(topic, broker_name)
        return await self.pool.call_pb(addr, method, request, resp_type, self.cfg.broker_timeout_ms)

    async def topic_type(self, topic: str) -> TopicMessageType:
        """``topic``'s message type, as a master of its route holds it
        (GET_ALL_TOPIC_CONFIG: the whole table, every topic of it cached for the route
        TTL, at least 1 s; RocketMQ's proxy caches topic configs the same way).  MIXED
        when no master can tell: the brokers check a send's type themselves."""
        now = time.monotonic()
        cached = self._topic_types.get(topic)
        if cached is not None and now < cached[0]:
            return cached[1]
        kind = cached[1] if cached is not None else TopicMessageType.MIXED
        try:
            route = await self.route(topic)
            addrs = [a for b in route.broker_datas if (a := b.broker_addrs.get(0)) is not None]
            if addrs:
                table = await self.pool.call_pb(
                    addrs[0],
                    RequestCode.GET_ALL_TOPIC_CONFIG,
                    common_pb2.Empty(),
                    broker_pb2.TopicConfigTable,
                    self.cfg.broker_timeout_ms,
                )
                until = now + max(1.0, self.cfg.route_ttl_ms / 1000)
                for tc in table.topics:
                    self._topic_types[tc.topic_name] = (
                        until,
                        TopicMessageType.from_wire(tc.message_type),
                    )
                kind = self._topic_types.setdefault(topic, (until, TopicMessageType.MIXED))[1]
        except (HaError, OSError, TimeoutError) as exc:
            log.info("topic table for %s not read (%s): %s kept", topic, exc, kind.value)
        return kind

    def endpoints(self, given: v2.Endpoints | None = None) -> v2.Endpoints:
        if given is not None and given.addresses:
            return given
        return convert.endpoints_of(self.advertised)

    # ---- the error funnel ----------------------------------------------------------

    async def answer(self, method: str, resp_type: type[R], work: Callable[[], Awaitable[R]]) -> R:
        """``work()``'s response, or ``resp_type`` with the status of what it raised;
        counted by method and status."""
        try:
            resp = await work()
        except (HaError, OSError, TimeoutError) as exc:
            code = convert.code_for(exc)
            log.info("%s failed: %s: %s", method, type(exc).__name__, exc)
            resp = resp_type()
            resp.status.CopyFrom(convert.status(code, f"{type(exc).__name__}: {exc}"))  # type: ignore[attr-defined]
        self.count(method, resp.status.code)  # type: ignore[attr-defined]
        return resp

    def count(self, method: str, code: int) -> None:
        self.metrics.requests.labels(method=method, code=v2.Code.Name(code)).inc()
