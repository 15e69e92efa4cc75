"""The v2 MessagingService: the official RocketMQ 5 SDKs talk to this gateway,
which talks to our nameserver and brokers with our RPC.

- Routes come from the nameserver (``NameserverClient.route``), with its RIP-32
  rewrite: a group's id 0 is its master or the slave acting for it, and an acting
  group's queues are READ only.  Every v2 endpoint is the gateway itself; a v2
  queue (broker name, queue id) maps back to the group's id-0 address.
- SendMessage picks the group and queue (v2 requests name none): round robin
  over writable queues, a FIFO message group by SipHash over them; a retriable
  failure moves the message to another group (at most ``send_attempts`` tries).
- ReceiveMessage long-polls POP (the group's retry topic first), Ack /
  ChangeInvisibleDuration go to the group the receipt handle names.
- Transactions: a half message's v2 transaction id says where it is; the
  brokers' CHECK_TRANSACTION_STATE, which arrives on the gateway's own broker
  connection, becomes a RecoverOrphanedTransactionCommand on the producer's
  telemetry stream, and the SDK's EndTransaction goes back as END_TRANSACTION.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, TypeVar

import grpc
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as PbMessage

from ha_controller.acl.rules import PUB, topic_need
from ha_controller.acl.sync import fetch_newer
from ha_controller.client.admin import NameserverClient
from ha_controller.client.producer import EndpointIsolation
from ha_controller.config import ProxyConfig
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s
from ha_controller.proto.rocketmq.v2 import service_pb2_grpc
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    BadRequest,
    HaError,
    NotMaster,
    TopicNotFound,
)
from ha_controller.protocol.properties import (
    DELAY_LEVELS_MS,
    PROPERTY_POP_CK,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_UNIQ_KEY,
    dlq_topic,
    now_ms,
    retry_topic,
)
from ha_controller.proxy import convert
from ha_controller.proxy.auth import GatewayAuth
from ha_controller.proxy.handles import (
    GatewayHandle,
    InvalidHandle,
    RecallHandle,
    TransactionId,
)
from ha_controller.proxy.limits import CallBounds, ThrottledLog
from ha_controller.proxy.limits import client_id as _client_id
from ha_controller.proxy.metrics import ProxyMetrics
from ha_controller.proxy.renewal import CLIENT_GONE_S, Key, Renewal, RenewalTable, key_of
from ha_controller.proxy.sessions import CONSUMER, PRODUCER, BoundedMap, Sessions
from ha_controller.routing import TopicRouteData
from ha_controller.rpc import ConnectionPool, Dispatcher, RequestContext

log = logging.getLogger(__name__)

R = TypeVar("R", bound=PbMessage)

#: POP waits at most this long per call, so retry-topic messages and route
#: changes are seen at least this often during a long poll.
POLL_SLICE_MS: Final = 5000
#: How often the gateway looks for push-consumer messages to renew.
RENEW_SCAN_S: Final = 0.2
#: Renewals in flight at once at most.
MAX_CONCURRENT_RENEWALS: Final = 64
#: A broker that failed a send is avoided this long (or until a send succeeds).
ISOLATION_S: Final = 5.0
MAX_BATCH: Final = 32
MIN_INVISIBLE_MS: Final = 1000


def _retriable(exc: BaseException) -> bool:
    if isinstance(exc, HaError):
        return exc.retriable
    return isinstance(exc, OSError | TimeoutError)


def _not_offered(method: str) -> v2.Status:
    return convert.status(
        v2.NOT_IMPLEMENTED, f"{method} is not offered by the ha-controller gateway"
    )


def _not_offered_unary(
    method: str, response: Callable[..., R]
) -> Callable[[Any, Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[R]]:
    """The servicer method ``method`` that the gateway does not offer: it answers a
    ``response`` with status NOT_IMPLEMENTED."""

    async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> R:
        return response(status=_not_offered(method))

    handler.__name__ = method
    handler.__qualname__ = f"Gateway.{method}"
    return handler


class Gateway(service_pb2_grpc.MessagingServiceServicer):
    """The servicer; owns the broker connection pool and the client sessions."""

    def __init__(self, cfg: ProxyConfig, metrics: ProxyMetrics | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics or ProxyMetrics()
        # the per-call bounds; the server installs it as an interceptor (proxy/app.py)
        self.bounds = CallBounds(cfg, self.metrics)
        self._failures = ThrottledLog(log)  # failed receives: one line per kind per 10 s
        self.client_id = f"{socket.gethostname()}@{os.getpid()}@proxy@{uuid.uuid4().hex[:8]}"
        dispatcher = Dispatcher()
        dispatcher.add_raw(RequestCode.CHECK_TRANSACTION_STATE, self._on_check)
        # the gateway's brokers and nameservers are dialled with the gateway's [tls]
        tls = cfg.tls.client_context()
        # requests are signed as the gRPC call's ACL user (ha_controller.proxy.auth)
        self.auth = GatewayAuth.from_config(cfg)
        sign = self.auth.signer
        self.pool = ConnectionPool(
            dispatcher=dispatcher, connect_timeout_ms=2000, ssl_context=tls, signer=sign
        )
        self.ns = NameserverClient(
            list(cfg.namesrv_addrs),
            ConnectionPool(connect_timeout_ms=2000, ssl_context=tls, signer=sign),
        )
        self.sessions: Sessions[v2s.TelemetryCommand] = Sessions()
        self.advertised = ""  # host:port clients use; set once bound
        self._routes: dict[str, tuple[float, TopicRouteData]] = {}
        self._group_addr: dict[str, str] = {}  # broker name -> id-0 address, from any route
        self._isolation = EndpointIsolation(ISOLATION_S)
        self._rr = itertools.count()
        self._tx_owner = BoundedMap(100_000)
        self._heartbeat_seen: dict[str, tuple[int, frozenset[str]]] = {}
        self._orderly: dict[str, tuple[float, bool]] = {}  # group -> (until, orderly)
        self._heartbeat_wake = asyncio.Event()
        self.renewals = RenewalTable()
        self._renewing: dict[Key, asyncio.Future[None]] = {}

    # ---- life cycle ------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Background work until ``stop``: heartbeats to brokers, session expiry,
        invisible-time renewal."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._renew_loop(stop), name="proxy-renewal")
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
                if await fetch_newer(self.ns.pool, ns, holder):
                    break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.cfg.acl_sync_interval_ms / 1000):
                    await stop.wait()

    async def _housekeeping(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._heartbeat_brokers()
            except Exception:
                log.exception("broker heartbeat round failed")
            for cid in self.sessions.expire():
                log.info("client %s expired", cid)
                self.renewals.drop_client(cid)
            self.metrics.clients.labels(type=PRODUCER).set(self.sessions.count(PRODUCER))
            self.metrics.clients.labels(type=CONSUMER).set(self.sessions.count(CONSUMER))
            waits = [asyncio.ensure_future(e.wait()) for e in (stop, self._heartbeat_wake)]
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
            self._heartbeat_wake.clear()

    async def aclose(self) -> None:
        await self.pool.aclose()
        await self.ns.pool.aclose()

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
                self._group_addr[b.broker_name] = addr
            else:
                self._group_addr.pop(b.broker_name, None)
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
        addr = self._group_addr.get(broker_name)
        if addr is None:
            raise NotMaster(f"group {broker_name} has no master and nobody acting for it")
        return addr

    async def _call_group(
        self, topic: str, broker_name: str, method: int, request: PbMessage, resp_type: type[R]
    ) -> R:
        """One call to the id-0 address of group ``broker_name`` (see :meth:`group_addr`)."""
        addr = await self.group_addr(topic, broker_name)
        return await self.pool.call_pb(addr, method, request, resp_type, self.cfg.broker_timeout_ms)

    def _gateway_endpoints(self, given: v2.Endpoints | None = None) -> v2.Endpoints:
        if given is not None and given.addresses:
            return given
        return convert.endpoints_of(self.advertised)

    # ---- error funnel ------------------------------------------------------------

    async def _answer(self, method: str, resp_type: type[R], work: Callable[[], Awaitable[R]]) -> R:
        try:
            resp = await work()
        except (HaError, OSError, TimeoutError) as exc:
            code = convert.code_for(exc)
            log.info("%s failed: %s: %s", method, type(exc).__name__, exc)
            resp = resp_type()
            resp.status.CopyFrom(convert.status(code, f"{type(exc).__name__}: {exc}"))  # type: ignore[attr-defined]
        self.metrics.requests.labels(
            method=method,
            code=v2.Code.Name(resp.status.code),  # type: ignore[attr-defined]
        ).inc()
        return resp

    # ---- QueryRoute / QueryAssignment / Heartbeat / NotifyClientTermination ----------

    async def QueryRoute(
        self, request: v2s.QueryRouteRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> v2s.QueryRouteResponse:
        async def work() -> v2s.QueryRouteResponse:
            route = await self.route(request.topic.name, fresh=True)
            queues = convert.v2_queues(route, self._gateway_endpoints(request.endpoints))
            return v2s.QueryRouteResponse(status=convert.status(), message_queues=queues)

        return await self._answer("QueryRoute", v2s.QueryRouteResponse, work)

    async def QueryAssignment(
        self, request: v2s.QueryAssignmentRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> v2s.QueryAssignmentResponse:
        async def work() -> v2s.QueryAssignmentResponse:
            route = await self.route(request.topic.name)
            found = convert.assignments(route, self._gateway_endpoints(request.endpoints))
            return v2s.QueryAssignmentResponse(status=convert.status(), assignments=found)

        return await self._answer("QueryAssignment", v2s.QueryAssignmentResponse, work)

    async def Heartbeat(
        self, request: v2s.HeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> v2s.HeartbeatResponse:
        cid = _client_id(context)
        if cid:
            s = self.sessions.get(cid)
            if request.client_type in (v2.PUSH_CONSUMER, v2.SIMPLE_CONSUMER, v2.PULL_CONSUMER):
                s.kind = CONSUMER
                s.group = request.group.name or s.group
            elif request.client_type == v2.PRODUCER:
                s.kind = PRODUCER
        self.metrics.requests.labels(method="Heartbeat", code="OK").inc()
        return v2s.HeartbeatResponse(status=convert.status())

    async def NotifyClientTermination(
        self,
        request: v2s.NotifyClientTerminationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> v2s.NotifyClientTerminationResponse:
        cid = _client_id(context)
        if cid:
            self.sessions.remove(cid)
            dropped = self.renewals.drop_client(cid)
            log.info("client %s terminated (%d messages no longer renewed)", cid, dropped)
        self.metrics.requests.labels(method="NotifyClientTermination", code="OK").inc()
        return v2s.NotifyClientTerminationResponse(status=convert.status())

    # ---- SendMessage -------------------------------------------------------------

    async def SendMessage(
        self, request: v2s.SendMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> v2s.SendMessageResponse:
        cid = _client_id(context)
        deadline = time.monotonic() + (context.time_remaining() or 3.0)
        refused = self.bounds.send_refusal(len(request.messages), cid)
        if refused is not None:  # before anything is sent
            self.metrics.requests.labels(
                method="SendMessage", code=v2.Code.Name(refused.code)
            ).inc()
            return v2s.SendMessageResponse(status=refused)

        async def work() -> v2s.SendMessageResponse:
            if not request.messages:
                raise BadRequest("SendMessage with no messages")
            topics = {m.topic.name for m in request.messages}
            if len(topics) != 1 or "" in topics:
                raise BadRequest("the messages of one SendMessage need one topic")
            topic = topics.pop()
            plans = [convert.send_entry(m, topic) for m in request.messages]
            entries = [await self._send_one(topic, p, cid, deadline) for p in plans]
            failed = [e.status for e in entries if e.status.code != v2.OK]
            overall = failed[0] if failed else convert.status()
            return v2s.SendMessageResponse(status=overall, entries=entries)

        return await self._answer("SendMessage", v2s.SendMessageResponse, work)

    async def _send_one(
        self, topic: str, plan: convert.SendPlan, cid: str, deadline: float
    ) -> v2s.SendResultEntry:
        tried: set[str] = set()
        last: BaseException | None = None
        for attempt in range(self.cfg.send_attempts):
            queues = convert.writable_queues(await self.route(topic, fresh=attempt > 0))
            if not queues:
                raise NotMaster(f"no writable queue for {topic}: every group is down or acting")
            if plan.message_group is not None:
                q = convert.fifo_queue(queues, plan.message_group)
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
                    await self._ensure_heartbeat(q.addr, topic)
                resp = await self.pool.call_pb(
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
                    min(self.cfg.broker_timeout_ms, remaining_ms),
                )
            except (HaError, OSError, TimeoutError) as exc:
                if not _retriable(exc):
                    raise
                last = exc
                tried.add(q.broker_name)
                self._isolation.isolate(q.addr)
                self.metrics.send_retries.inc()
                log.info(
                    "send to %s (%s) failed, trying another group: %s", q.broker_name, q.addr, exc
                )
                continue
            self._isolation.release(q.addr)
            result = resp.results[0]
            entry = v2s.SendResultEntry(
                status=convert.status(),
                message_id=plan.message_id or result.uniq_key or result.msg_id,
                offset=result.queue_offset,
            )
            if plan.message_type == v2.TRANSACTION:
                uniq = result.uniq_key or plan.message_id
                entry.transaction_id = TransactionId(
                    resp.broker_name or q.broker_name,
                    result.queue_offset,
                    result.commit_log_offset,
                    uniq,
                ).encode()
                if cid:
                    self._tx_owner.put(uniq, cid)
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

    # ---- ReceiveMessage ----------------------------------------------------------

    async def ReceiveMessage(
        self, request: v2s.ReceiveMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[v2s.ReceiveMessageResponse]:
        messages: list[v2.Message] = []
        code: int = v2.OK
        text = "OK"
        cid = _client_id(context)
        if cid:
            self.sessions.get(cid)  # a push consumer's long polls keep it alive
        self.metrics.held_receives.inc()
        try:
            messages = await self._receive(request, context)
            if messages and request.auto_renew and cid:
                self._track_for_renewal(cid, request, messages)
            if not messages:
                code, text = v2.MESSAGE_NOT_FOUND, "no new message"
        except (HaError, OSError, TimeoutError) as exc:
            code, text = convert.code_for(exc), f"{type(exc).__name__}: {exc}"
            self._failures(type(exc).__name__, logging.INFO, "ReceiveMessage failed: %s", text)
        finally:
            self.metrics.held_receives.dec()
        self.metrics.requests.labels(method="ReceiveMessage", code=v2.Code.Name(code)).inc()
        yield v2s.ReceiveMessageResponse(status=convert.status(code, text))
        if messages:  # the SDKs measure delivery latency from it (Python's push consumer needs it)
            yield v2s.ReceiveMessageResponse(delivery_timestamp=convert.timestamp_of_ms(now_ms()))
        for m in messages:
            yield v2s.ReceiveMessageResponse(message=m)

    def _track_for_renewal(
        self, cid: str, request: v2s.ReceiveMessageRequest, messages: list[v2.Message]
    ) -> None:
        group = request.group.name
        for m in messages:
            sp = m.system_properties
            handle = GatewayHandle.decode(sp.receipt_handle)
            invisible_ms = convert.ms_of_duration(sp.invisible_duration)
            if not self.renewals.add(cid, group, m.topic.name, handle, invisible_ms):
                self.metrics.renewals.labels(result="dropped").inc()
        self.metrics.renewing.set(len(self.renewals))

    async def _receive(
        self, request: v2s.ReceiveMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> list[v2.Message]:
        group = request.group.name
        mq = request.message_queue
        topic, broker = mq.topic.name, mq.broker.name
        if not group or not topic or not broker:
            raise BadRequest("ReceiveMessage needs a group and a message queue")
        batch = max(1, min(request.batch_size or MAX_BATCH, MAX_BATCH))
        invisible_ms = (
            convert.ms_of_duration(request.invisible_duration)
            if request.HasField("invisible_duration")
            else self.cfg.default_invisible_ms
        )
        if invisible_ms < MIN_INVISIBLE_MS:
            raise BadRequest(f"invisible duration must be >= {MIN_INVISIBLE_MS} ms")
        poll_ms = (
            convert.ms_of_duration(request.long_polling_timeout)
            if request.HasField("long_polling_timeout")
            else self.cfg.long_polling_timeout_ms
        )
        remaining = context.time_remaining()
        if remaining is not None:  # answer before the client's deadline
            poll_ms = min(poll_ms, int(remaining * 1000) - 1000)
        tags = convert.tags_of(request.filter_expression)
        deadline = time.monotonic() + max(0, poll_ms) / 1000
        # an orderly (FIFO) group: the broker's order=true POP keeps each queue to one
        # batch at a time, whichever gateway pops (no lock here)
        orderly = await self.group_orderly(group, topic)
        while True:
            addr = await self.group_addr(topic, broker)
            got = await self._pop_retry(addr, group, topic, broker, batch, invisible_ms, tags)
            if got:
                return got
            left_ms = int((deadline - time.monotonic()) * 1000)
            got = await self._pop(
                addr,
                group,
                topic,
                topic,
                broker,
                -1,  # any queue of the group, as RocketMQ's proxy pops (the id is a hint)
                batch,
                invisible_ms,
                max(0, min(left_ms, POLL_SLICE_MS)),
                tags,
                order=orderly,
            )
            if got or time.monotonic() >= deadline:
                return got

    async def group_orderly(self, group: str, topic: str) -> bool:
        """Whether consumer group ``group`` consumes orderly: named in ``fifo_groups``,
        or its subscription group config (``hactl group update G --orderly``) on a
        group of ``topic``'s route says so.  Cached for the route TTL (at least 1 s)."""
        if group in self.cfg.fifo_groups:
            return True
        now = time.monotonic()
        cached = self._orderly.get(group)
        if cached is not None and now < cached[0]:
            return cached[1]
        orderly = cached[1] if cached is not None else False
        try:
            route = await self.route(topic)
            addrs = [a for b in route.broker_datas if (a := b.broker_addrs.get(0)) is not None]
            for addr in addrs:
                table = await self.pool.call_pb(
                    addr,
                    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
                    common_pb2.Empty(),
                    broker_pb2.SubscriptionGroupTable,
                    self.cfg.broker_timeout_ms,
                )
                orderly = any(g.consume_orderly for g in table.groups if g.group_name == group)
                break  # every master holds the same table (hactl sets it on all)
        except (HaError, OSError, TimeoutError) as exc:
            log.info("subscription group of %s not read (%s): orderly=%s kept", group, exc, orderly)
        self._orderly[group] = (now + max(1.0, self.cfg.route_ttl_ms / 1000), orderly)
        return orderly

    async def _pop_retry(
        self,
        addr: str,
        group: str,
        topic: str,
        broker: str,
        batch: int,
        invisible_ms: int,
        tags: list[str],
    ) -> list[v2.Message]:
        """Messages the revive service re-delivered (``%RETRY%group``), no wait."""
        try:
            return await self._pop(
                addr, group, retry_topic(group), topic, broker, -1, batch, invisible_ms, 0, tags
            )
        except TopicNotFound:
            return []

    async def _pop(
        self,
        addr: str,
        group: str,
        pop_topic: str,
        topic: str,
        broker: str,
        queue_id: int,
        batch: int,
        invisible_ms: int,
        poll_ms: int,
        tags: list[str],
        *,
        order: bool = False,
    ) -> list[v2.Message]:
        resp = await self.pool.call_pb(
            addr,
            RequestCode.POP_MESSAGE,
            broker_pb2.PopMessageRequest(
                consumer_group=group,
                topic=pop_topic,
                queue_id=queue_id,
                max_msg_nums=batch,
                invisible_time_ms=invisible_ms,
                poll_time_ms=poll_ms,
                tags=tags,
                order=order,
            ),
            broker_pb2.PopMessageResponse,
            poll_ms + self.cfg.broker_timeout_ms,
        )
        invisible = resp.invisible_time_ms or invisible_ms
        until = (resp.pop_time_ms or now_ms()) + invisible
        out = []
        for m in resp.messages:
            handle = GatewayHandle(
                broker_name=m.broker_name or broker,
                pop_topic=pop_topic,
                queue_id=m.queue_id,
                queue_offset=m.queue_offset,
                broker_handle=m.properties.get(PROPERTY_POP_CK, ""),
                invisible_until_ms=until,
            )
            out.append(
                convert.message_to_v2(
                    m, topic=topic, receipt_handle=handle.encode(), invisible_ms=invisible
                )
            )
        return out

    # ---- AckMessage / ChangeInvisibleDuration / DLQ -----------------------------------

    async def AckMessage(
        self, request: v2s.AckMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> v2s.AckMessageResponse:
        async def work() -> v2s.AckMessageResponse:
            group, topic = request.group.name, request.topic.name
            results = []
            for e in request.entries:
                try:
                    await self._ack(group, topic, GatewayHandle.decode(e.receipt_handle))
                    st = convert.status()
                except (HaError, OSError, TimeoutError) as exc:
                    st = convert.status(convert.code_for(exc), f"{type(exc).__name__}: {exc}")
                results.append(
                    v2s.AckMessageResultEntry(
                        message_id=e.message_id, receipt_handle=e.receipt_handle, status=st
                    )
                )
            codes = {r.status.code for r in results}
            if len(codes) <= 1:
                overall = results[0].status if results else convert.status()
            else:
                overall = convert.status(v2.MULTIPLE_RESULTS, "some entries failed")
            return v2s.AckMessageResponse(status=overall, entries=results)

        return await self._answer("AckMessage", v2s.AckMessageResponse, work)

    async def _ack(self, group: str, topic: str, h: GatewayHandle) -> None:
        h = await self._settle(group, h)
        await self._call_group(
            topic,
            h.broker_name,
            RequestCode.ACK_MESSAGE,
            broker_pb2.AckMessageRequest(
                consumer_group=group, topic=h.pop_topic, receipt_handle=h.broker_handle
            ),
            broker_pb2.AckMessageResponse,
        )

    async def ChangeInvisibleDuration(
        self,
        request: v2s.ChangeInvisibleDurationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> v2s.ChangeInvisibleDurationResponse:
        async def work() -> v2s.ChangeInvisibleDurationResponse:
            group, topic = request.group.name, request.topic.name
            h = GatewayHandle.decode(request.receipt_handle)
            invisible_ms = convert.ms_of_duration(request.invisible_duration)
            if invisible_ms < MIN_INVISIBLE_MS:
                raise BadRequest(f"invisible duration must be >= {MIN_INVISIBLE_MS} ms")
            h = await self._settle(group, h)  # a nack: no more renewals
            resp = await self._call_group(
                topic,
                h.broker_name,
                RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
                broker_pb2.AckMessageRequest(
                    consumer_group=group,
                    topic=h.pop_topic,
                    receipt_handle=h.broker_handle,
                    invisible_time_ms=invisible_ms,
                ),
                broker_pb2.AckMessageResponse,
            )
            until = now_ms() + invisible_ms
            new = GatewayHandle(
                h.broker_name,
                h.pop_topic,
                h.queue_id,
                h.queue_offset,
                resp.receipt_handle or h.broker_handle,
                until,
            )
            return v2s.ChangeInvisibleDurationResponse(
                status=convert.status(), receipt_handle=new.encode()
            )

        return await self._answer(
            "ChangeInvisibleDuration", v2s.ChangeInvisibleDurationResponse, work
        )

    async def ForwardMessageToDeadLetterQueue(
        self,
        request: v2s.ForwardMessageToDeadLetterQueueRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> v2s.ForwardMessageToDeadLetterQueueResponse:
        async def work() -> v2s.ForwardMessageToDeadLetterQueueResponse:
            group, topic = request.group.name, request.topic.name
            h = GatewayHandle.decode(request.receipt_handle)
            pulled = await self._call_group(
                topic,
                h.broker_name,
                RequestCode.PULL_MESSAGE,
                broker_pb2.PullMessageRequest(
                    topic=h.pop_topic,
                    queue_id=h.queue_id,
                    queue_offset=h.queue_offset,
                    max_msg_nums=1,
                    commit_offset=-1,
                ),
                broker_pb2.PullMessageResponse,
            )
            original = next((m for m in pulled.messages if m.queue_offset == h.queue_offset), None)
            if original is not None:
                await self._send_dlq(group, topic, original)
            else:
                log.warning(
                    "DLQ: %s@%s#%d offset %d is gone",
                    h.pop_topic,
                    h.broker_name,
                    h.queue_id,
                    h.queue_offset,
                )
            await self._ack(group, topic, h)
            return v2s.ForwardMessageToDeadLetterQueueResponse(status=convert.status())

        return await self._answer(
            "ForwardMessageToDeadLetterQueue", v2s.ForwardMessageToDeadLetterQueueResponse, work
        )

    async def _send_dlq(self, group: str, topic: str, m: broker_pb2.Message) -> None:
        props = {k: v for k, v in m.properties.items() if k != PROPERTY_POP_CK}
        props.setdefault(PROPERTY_RETRY_TOPIC, topic)
        queues = convert.writable_queues(await self.route(topic, fresh=True))
        last: BaseException | None = None
        for addr in dict.fromkeys(q.addr for q in queues):
            try:
                await self.pool.call_pb(
                    addr,
                    RequestCode.SEND_MESSAGE,
                    broker_pb2.SendMessageRequest(
                        producer_group=group,
                        topic=dlq_topic(group),
                        queue_id=0,
                        entries=[
                            broker_pb2.SendEntry(
                                body=m.body, properties=props, born_ts_ms=m.born_ts_ms
                            )
                        ],
                        born_host=m.born_host,
                    ),
                    broker_pb2.SendMessageResponse,
                    self.cfg.broker_timeout_ms,
                )
                return
            except (HaError, OSError, TimeoutError) as exc:
                if not _retriable(exc):
                    raise
                last = exc
        raise last or NotMaster(f"no writable group for {dlq_topic(group)}")

    # ---- invisible-time renewal (push consumers) -------------------------------------

    def _client_alive(self, cid: str) -> bool:
        s = self.sessions.find(cid)
        if s is None:
            return False
        return s.reachable or time.monotonic() - s.last_seen < CLIENT_GONE_S

    async def _settle(self, group: str, h: GatewayHandle) -> GatewayHandle:
        """A message is done (ack, nack, DLQ): after a renewal of it in flight, the
        newest broker handle, and no renewal any more."""
        key = key_of(group, h)
        pending = self._renewing.get(key)
        if pending is not None:
            await asyncio.shield(pending)
        newest = self.renewals.take(group, h)
        self.metrics.renewing.set(len(self.renewals))
        return newest

    async def _renew_loop(self, stop: asyncio.Event) -> None:
        limit = asyncio.Semaphore(MAX_CONCURRENT_RENEWALS)
        async with asyncio.TaskGroup() as tg:
            while not stop.is_set():
                for r in self.renewals.due(self._client_alive):
                    await limit.acquire()
                    tg.create_task(self._renew(r, limit), name="proxy-renew")
                self.metrics.renewing.set(len(self.renewals))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RENEW_SCAN_S):
                        await stop.wait()

    async def _renew(self, r: Renewal, limit: asyncio.Semaphore) -> None:
        key = r.key
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._renewing[key] = done
        h = r.handle
        new: GatewayHandle | None = None
        try:
            started = now_ms()
            resp = await self._call_group(
                r.topic,
                h.broker_name,
                RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
                broker_pb2.AckMessageRequest(
                    consumer_group=r.group,
                    topic=h.pop_topic,
                    receipt_handle=h.broker_handle,
                    invisible_time_ms=r.invisible_ms,
                ),
                broker_pb2.AckMessageResponse,
            )
            until = started + r.invisible_ms
            new = GatewayHandle(
                h.broker_name,
                h.pop_topic,
                h.queue_id,
                h.queue_offset,
                resp.receipt_handle or h.broker_handle,
                until,
            )
            self.metrics.renewals.labels(result="ok").inc()
        except (HaError, OSError, TimeoutError) as exc:
            self.metrics.renewals.labels(result="failed").inc()
            log.info(
                "renewal of %s#%d offset %d for %s failed: %s",
                h.pop_topic,
                h.queue_id,
                h.queue_offset,
                r.group,
                exc,
            )
        finally:
            self.renewals.renewed(r, new)
            if self._renewing.get(key) is done:
                del self._renewing[key]
            done.set_result(None)
            limit.release()

    # ---- RecallMessage ---------------------------------------------------------------

    async def RecallMessage(
        self, request: v2s.RecallMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> v2s.RecallMessageResponse:
        """RocketMQ 5.3 recall of a delayed (timer) message: RECALL_MESSAGE to the
        id-0 address of the group the handle names (the acting slave in a failover)."""

        async def work() -> v2s.RecallMessageResponse:
            topic = request.topic.name
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
            resp = await self._call_group(
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

        return await self._answer("RecallMessage", v2s.RecallMessageResponse, work)

    # ---- transactions -----------------------------------------------------------

    async def EndTransaction(
        self, request: v2s.EndTransactionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> v2s.EndTransactionResponse:
        async def work() -> v2s.EndTransactionResponse:
            topic = request.topic.name
            try:
                tx = TransactionId.decode(request.transaction_id)
            except InvalidHandle as exc:
                return v2s.EndTransactionResponse(
                    status=convert.status(v2.INVALID_TRANSACTION_ID, str(exc))
                )
            if request.resolution not in (v2.COMMIT, v2.ROLLBACK):
                return v2s.EndTransactionResponse(status=convert.status())  # unknown: check later
            await self._call_group(
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
            self._tx_owner.pop(tx.uniq_key, None)
            return v2s.EndTransactionResponse(status=convert.status())

        return await self._answer("EndTransaction", v2s.EndTransactionResponse, work)

    async def _on_check(self, ctx: RequestContext, body: bytes) -> bytes | None:
        """CHECK_TRANSACTION_STATE (one-way, broker -> us): ask a producer of the topic."""
        req = broker_pb2.CheckTransactionStateRequest()
        try:
            req.ParseFromString(body)
        except DecodeError as exc:
            raise BadRequest("undecodable CheckTransactionStateRequest") from exc
        topic = req.message.topic
        uniq = req.transaction_id or req.message.properties.get(PROPERTY_UNIQ_KEY, "")
        tx = TransactionId(
            req.broker_name or req.message.broker_name,
            req.message.queue_offset,
            req.commit_log_offset,
            uniq,
        )
        command = convert.recover_command(req, tx.encode())
        # only a producer whose user may publish to the topic is asked (and sees the body)
        need = topic_need(topic, PUB)
        for session in self.sessions.producers_for(topic, prefer=self._tx_owner.get(uniq)):
            cid = session.client_id
            if not self.auth.allows(
                self.auth.client_ids.owner(cid), need, self.auth.client_ips.get(cid)
            ):
                continue
            if self.sessions.push(session, command):
                self.metrics.transaction_checks.labels(result="forwarded").inc()
                log.info("transaction %s of %s: asking producer %s", uniq, topic, session.client_id)
                return None
        self.metrics.transaction_checks.labels(result="no_producer").inc()
        log.info("transaction %s of %s: no producer connected to ask", uniq, topic)
        return None

    async def _ensure_heartbeat(self, addr: str, topic: str) -> None:
        """The broker checks a half message on the connection a HEART_BEAT named
        its producer group on: make sure this connection did, before sending."""
        conn = await self.pool.get(addr)
        seen = self._heartbeat_seen.get(addr)
        if seen is not None and seen[0] == id(conn) and topic in seen[1]:
            return
        await self._heartbeat_one(addr, extra={topic})

    async def _heartbeat_one(self, addr: str, extra: set[str] | None = None) -> None:
        producers = frozenset(self.sessions.producer_topics() | (extra or set()))
        consumers = sorted(self.sessions.consumer_groups())
        conn = await self.pool.get(addr)
        await conn.call_pb(
            RequestCode.HEART_BEAT,
            broker_pb2.ClientHeartbeat(
                client_id=self.client_id,
                producer_groups=sorted(producers),
                consumer_groups=consumers,
            ),
            common_pb2.Empty,
            self.cfg.broker_timeout_ms,
        )
        self._heartbeat_seen[addr] = (id(conn), producers)

    async def _heartbeat_brokers(self) -> None:
        if not self.sessions.producer_topics() and not self.sessions.consumer_groups():
            return
        for addr in sorted(set(self._group_addr.values())):
            try:
                await self._heartbeat_one(addr)
            except (HaError, OSError, TimeoutError) as exc:
                log.debug("heartbeat to %s failed: %s", addr, exc)

    # ---- Telemetry ----------------------------------------------------------------

    async def Telemetry(
        self,
        request_iterator: AsyncIterator[v2s.TelemetryCommand],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        cid = _client_id(context)
        if not cid:
            await context.write(
                v2s.TelemetryCommand(
                    status=convert.status(v2.CLIENT_ID_REQUIRED, "x-mq-client-id is required")
                )
            )
            return
        session = self.sessions.get(cid)
        session.streams += 1
        wake = asyncio.Event()
        self.sessions.wakers[cid] = wake.set
        done = asyncio.Event()

        async def reader() -> None:
            try:
                async for cmd in request_iterator:
                    reply = await self._on_telemetry(cid, cmd)
                    if reply is not None:
                        self.sessions.push(self.sessions.get(cid), reply)
            finally:
                done.set()
                wake.set()

        async def writer() -> None:
            while True:
                s = self.sessions.find(cid)
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
            if self.sessions.wakers.get(cid) == wake.set:
                self.sessions.wakers.pop(cid, None)
            log.info("telemetry stream of %s closed", cid)

    async def _on_telemetry(
        self, cid: str, cmd: v2s.TelemetryCommand
    ) -> v2s.TelemetryCommand | None:
        which = cmd.WhichOneof("command")
        if which != "settings":
            return None  # thread stack traces, verify results: nothing to do here
        settings = cmd.settings
        why = self.auth.settings_refusal(settings)
        if why is not None:
            log.info("client %s: settings refused: %s", cid, why)
            return v2s.TelemetryCommand(status=convert.status(v2.FORBIDDEN, why))
        s = self.sessions.get(cid)
        out = v2.Settings()
        out.CopyFrom(settings)
        if settings.client_type == v2.PRODUCER:
            s.kind = PRODUCER
            s.topics = frozenset(convert.topics_of(settings.publishing.topics))
            out.publishing.max_body_size = convert.MAX_BODY_BYTES
            out.publishing.validate_message_type = False
            out.backoff_policy.CopyFrom(
                v2.RetryPolicy(
                    max_attempts=self.cfg.send_attempts,
                    exponential_backoff=v2.ExponentialBackoff(
                        initial=convert.duration_of_ms(10),
                        max=convert.duration_of_ms(1000),
                        multiplier=2.0,
                    ),
                )
            )
            self._heartbeat_wake.set()
        elif settings.client_type in (v2.PUSH_CONSUMER, v2.SIMPLE_CONSUMER, v2.PULL_CONSUMER):
            s.kind = CONSUMER
            s.group = settings.subscription.group.name
            sub = out.subscription
            topics = [e.topic.name for e in settings.subscription.subscriptions if e.topic.name]
            orderly = s.group in self.cfg.fifo_groups
            if not orderly and topics:
                orderly = await self.group_orderly(s.group, topics[0])
            sub.fifo = orderly
            sub.receive_batch_size = MAX_BATCH
            sub.long_polling_timeout.CopyFrom(
                convert.duration_of_ms(self.cfg.long_polling_timeout_ms)
            )
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

    # ---- not offered ---------------------------------------------------------------

    async def PullMessage(
        self, request: v2s.PullMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[v2s.PullMessageResponse]:
        yield v2s.PullMessageResponse(status=_not_offered("PullMessage"))

    UpdateOffset = _not_offered_unary("UpdateOffset", v2s.UpdateOffsetResponse)
    GetOffset = _not_offered_unary("GetOffset", v2s.GetOffsetResponse)
    QueryOffset = _not_offered_unary("QueryOffset", v2s.QueryOffsetResponse)
    SyncLiteSubscription = _not_offered_unary(
        "SyncLiteSubscription", v2s.SyncLiteSubscriptionResponse
    )


#: Push-consumer redelivery back-off sent in settings: RocketMQ's first 16 delay levels
#: (1s 5s 10s 30s 1m ... 20m 30m).
CONSUMER_BACKOFF_S: Final = tuple(ms // 1000 for ms in DELAY_LEVELS_MS[:16])
