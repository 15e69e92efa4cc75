"""The nameserver service: RPC handlers around the route table, the expiry
scanner, min-broker-id notifications and route watches."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from typing import Any

from ha_controller import auth
from ha_controller.config import NameserverConfig
from ha_controller.proto import common_pb2, nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    HaError,
    NotRegistered,
    Overloaded,
    PreOnlineRequired,
    StaleRegistration,
    TopicNotFound,
)
from ha_controller.routing import TopicRouteData
from ha_controller.rpc import ConnectionPool, Dispatcher, RequestContext, RpcConnection
from ha_controller.wire import (
    data_version_from_pb,
    data_version_to_pb,
    member_group_to_pb,
    route_to_pb,
    topic_config_from_pb,
)
from nameserver.metrics import NameserverMetrics
from nameserver.route_table import BrokerRegistration, MinIdChange, RouteTable

log = logging.getLogger(__name__)

ABSENT = "absent"


def route_version(route: TopicRouteData | None) -> str:
    """A short fingerprint of a route as clients see it (route watch)."""
    if route is None:
        return ABSENT
    data = route_to_pb(route).SerializeToString(deterministic=True)
    return hashlib.blake2b(data, digest_size=8).hexdigest()


class NameserverService:
    """Owns the route table and every background loop of the nameserver.

    ``run()`` holds a TaskGroup for the scanner and the notification tasks;
    handlers schedule notifications into it.
    """

    def __init__(self, cfg: NameserverConfig) -> None:
        self.cfg = cfg
        self.table = RouteTable(
            support_acting_master=cfg.support_acting_master,
            notify_min_broker_id_changed=cfg.notify_min_broker_id_changed,
        )
        # (cluster, group) -> (acting broker id, unix time it took over)
        self._acting: dict[tuple[str, str], tuple[int, float]] = {}
        self.metrics = NameserverMetrics(
            self.table.groups_view, lambda: {k: ts for k, (_, ts) in self._acting.items()}
        )
        self.pool = ConnectionPool(connect_timeout_ms=cfg.notify_timeout_ms)
        self.dispatcher = Dispatcher()
        self._changed = asyncio.Condition()
        self._watchers = 0
        self._tg: asyncio.TaskGroup | None = None
        self._pending_notify: list[MinIdChange] = []
        self._register_handlers()

    # ---- wiring -----------------------------------------------------------

    def _register_handlers(self) -> None:
        d = self.dispatcher
        d.add(RequestCode.REGISTER_BROKER, nameserver_pb2.RegisterBrokerRequest, self._register)
        d.add(
            RequestCode.UNREGISTER_BROKER, nameserver_pb2.UnregisterBrokerRequest, self._unregister
        )
        d.add(RequestCode.BROKER_HEARTBEAT, nameserver_pb2.BrokerHeartbeatRequest, self._heartbeat)
        d.add(
            RequestCode.QUERY_DATA_VERSION,
            nameserver_pb2.QueryDataVersionRequest,
            self._query_data_version,
        )
        d.add(RequestCode.GET_ROUTEINFO_BY_TOPIC, nameserver_pb2.GetRouteInfoRequest, self._route)
        d.add(RequestCode.GET_BROKER_CLUSTER_INFO, common_pb2.Empty, self._cluster_info)
        d.add(
            RequestCode.GET_BROKER_MEMBER_GROUP,
            nameserver_pb2.GetBrokerMemberGroupRequest,
            self._member_group,
        )
        d.add(RequestCode.WATCH_ROUTE, nameserver_pb2.WatchRouteRequest, self._watch_route)

    def on_connection_closed(self, conn: RpcConnection) -> None:
        changes = self.table.on_connection_closed(conn)
        if changes or conn.attrs.get("registered"):
            self.metrics.expired.labels("connection_closed").inc(
                1 if conn.attrs.get("registered") else 0
            )
        self._after_mutation(changes)

    # ---- background -------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run the scanner (and notifications) until ``stop`` is set."""
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                for change in self._pending_notify:
                    self._spawn_notifications(change)
                self._pending_notify.clear()
                scanner = tg.create_task(self._scan_loop(), name="ns-scan")
                await stop.wait()
                scanner.cancel()
        finally:
            self._tg = None
            await self.pool.aclose()

    async def _scan_loop(self) -> None:
        interval = self.cfg.scan_not_active_broker_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self.scan_once()

    def scan_once(self) -> None:
        expired, changes = self.table.scan_not_active()
        for broker in expired:
            self.metrics.expired.labels("heartbeat_timeout").inc()
            conn = broker.conn_id
            if isinstance(conn, RpcConnection) and not conn.closed:
                # RocketMQ closes the channel of an expired broker too (owned by the
                # service's TaskGroup; closing never raises)
                if self._tg is not None:
                    self._tg.create_task(conn.aclose(), name="ns-close-expired")
        self._after_mutation(changes)

    def _track_acting(self) -> None:
        """Remember when each group's current acting master took over (for metrics)."""
        now = time.time()
        current: dict[tuple[str, str], tuple[int, float]] = {}
        for g in self.table.groups_view():
            acting_id = g.get("actingBrokerId")
            if acting_id is None:
                continue
            key = (g["cluster"], g["brokerName"])
            prev = self._acting.get(key)
            current[key] = prev if prev is not None and prev[0] == acting_id else (acting_id, now)
        self._acting = current

    def _after_mutation(self, changes: list[MinIdChange]) -> None:
        self._track_acting()
        for change in changes:
            self.metrics.min_broker_id_changes.labels(change.cluster, change.broker_name).inc()
            if self._tg is None:
                self._pending_notify.append(change)
            else:
                self._spawn_notifications(change)
        self._wake_watchers()

    def _wake_watchers(self) -> None:
        async def notify() -> None:
            async with self._changed:
                self._changed.notify_all()

        if self._tg is not None:
            self._tg.create_task(notify())

    def _spawn_notifications(self, change: MinIdChange) -> None:
        assert self._tg is not None
        req = nameserver_pb2.NotifyMinBrokerIdChangeRequest(
            min_broker_id=change.min_broker_id,
            min_broker_addr=change.min_broker_addr or "",
            offline_broker_addr=change.offline_broker_addr or "",
            ha_broker_addr=change.ha_broker_addr or "",
            broker_name=change.broker_name,
            cluster=change.cluster,
        )
        for target in change.targets:
            self._tg.create_task(self._notify(target, req), name=f"notify-{target}")

    async def _notify(
        self, target: str, req: nameserver_pb2.NotifyMinBrokerIdChangeRequest
    ) -> None:
        attempts = max(1, self.cfg.notify_retries)
        for attempt in range(attempts):
            try:
                await self.pool.call_pb(
                    target,
                    RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE,
                    req,
                    common_pb2.Empty,
                    timeout_ms=self.cfg.notify_timeout_ms,
                )
            except HaError as exc:
                log.info(
                    "notify min broker id %d of %s to %s failed (attempt %d/%d): %s",
                    req.min_broker_id,
                    req.broker_name,
                    target,
                    attempt + 1,
                    attempts,
                    exc,
                )
                await self.pool.discard(target)
                if attempt + 1 < attempts:
                    await asyncio.sleep(min(0.2 * 2**attempt, 2.0))
                continue
            self.metrics.notifications.labels("ok").inc()
            return
        self.metrics.notifications.labels("failed").inc()

    # ---- handlers ---------------------------------------------------------

    def _verify(
        self, op: str, cluster: str, addr: str, name: str, bid: int, ts: int, sig: bytes
    ) -> None:
        secret = self.cfg.cluster_secret
        if secret:
            auth.verify(secret, auth.canonical(op, cluster, addr, name, bid, ts), sig, ts)

    async def _register(
        self, ctx: RequestContext, req: nameserver_pb2.RegisterBrokerRequest
    ) -> nameserver_pb2.RegisterBrokerResponse:
        try:
            self._verify(
                "register",
                req.cluster,
                req.broker_addr,
                req.broker_name,
                req.broker_id,
                req.timestamp_ms,
                req.signature,
            )
        except HaError:
            self.metrics.registrations.labels("unauthorized").inc()
            log.warning(
                "refused registration of %s (%s id %d) from %s: bad signature",
                req.broker_addr,
                req.broker_name,
                req.broker_id,
                ctx.peer,
            )
            raise
        reg = BrokerRegistration(
            cluster=req.cluster,
            broker_addr=req.broker_addr,
            broker_name=req.broker_name,
            broker_id=req.broker_id,
            ha_addr=req.ha_addr,
            heartbeat_timeout_ms=(
                req.heartbeat_timeout_ms if req.HasField("heartbeat_timeout_ms") else None
            ),
            enable_acting_master=(
                req.enable_acting_master if req.HasField("enable_acting_master") else None
            ),
            topic_configs={tc.topic_name: topic_config_from_pb(tc) for tc in req.topic_configs},
            data_version=data_version_from_pb(req.data_version),
            pre_online_done=req.pre_online_done,
            max_offset=req.max_offset if req.HasField("max_offset") else None,
            store_writable=req.store_writable if req.HasField("store_writable") else None,
        )
        outcome = self.table.register_broker(reg, ctx.conn)
        if outcome.needs_pre_online:
            self.metrics.registrations.labels("needs_pre_online").inc()
            raise PreOnlineRequired(
                f"{req.broker_name} is served by an acting slave: {req.broker_addr} must "
                "complete pre-online before it takes id 0 back"
            )
        if outcome.rejected:
            self.metrics.registrations.labels("stale").inc()
            raise StaleRegistration(
                f"{req.broker_addr} is older than the broker holding {req.broker_name} id "
                f"{req.broker_id}"
            )
        ctx.conn.attrs["registered"] = True
        self.metrics.registrations.labels("ok").inc()
        self.metrics.min_broker_id_changes.labels(req.cluster, req.broker_name)  # at 0
        self._after_mutation(outcome.notifications)
        return nameserver_pb2.RegisterBrokerResponse(
            master_addr=outcome.master_addr or "", master_ha_addr=outcome.master_ha_addr or ""
        )

    async def _unregister(
        self, ctx: RequestContext, req: nameserver_pb2.UnregisterBrokerRequest
    ) -> common_pb2.Empty:
        self._verify(
            "unregister",
            req.cluster,
            req.broker_addr,
            req.broker_name,
            req.broker_id,
            req.timestamp_ms,
            req.signature,
        )
        changes = self.table.unregister_broker(
            req.cluster, req.broker_addr, req.broker_name, req.broker_id
        )
        self._after_mutation(changes)
        return common_pb2.Empty()

    async def _heartbeat(
        self, ctx: RequestContext, req: nameserver_pb2.BrokerHeartbeatRequest
    ) -> common_pb2.Empty:
        generation = self.table.generation
        outcome = self.table.broker_heartbeat(
            req.cluster,
            req.broker_addr,
            max_offset=req.max_offset if req.HasField("max_offset") else None,
            store_writable=req.store_writable if req.HasField("store_writable") else None,
        )
        if not outcome.known:
            # expired (or never registered): the broker must register again, and a
            # master must first go through pre-online
            raise NotRegistered(f"{req.broker_addr} is not registered in {req.cluster}")
        if outcome.notifications or self.table.generation != generation:
            # its report made another slave the acting one of a masterless group
            self._after_mutation(outcome.notifications)
        return common_pb2.Empty()

    async def _query_data_version(
        self, ctx: RequestContext, req: nameserver_pb2.QueryDataVersionRequest
    ) -> nameserver_pb2.QueryDataVersionResponse:
        version = data_version_from_pb(req.data_version)
        changed = self.table.query_data_version(req.cluster, req.broker_addr, version)
        return nameserver_pb2.QueryDataVersionResponse(
            changed=changed, data_version=data_version_to_pb(version)
        )

    def route_or_raise(self, topic: str) -> TopicRouteData:
        route = self.table.pickup_route(topic)
        if route is None:
            raise TopicNotFound(f"no route for topic {topic!r}")
        return route

    async def _route(
        self, ctx: RequestContext, req: nameserver_pb2.GetRouteInfoRequest
    ) -> common_pb2.TopicRoute:
        return route_to_pb(self.route_or_raise(req.topic))

    async def _cluster_info(
        self, ctx: RequestContext, req: common_pb2.Empty
    ) -> nameserver_pb2.ClusterInfo:
        info: dict[str, Any] = self.table.cluster_info()
        out = nameserver_pb2.ClusterInfo()
        for cluster, names in sorted(info["clusterAddrTable"].items()):
            out.clusters.add(cluster=cluster, broker_names=sorted(names))
        for name, bd in sorted(info["brokerAddrTable"].items()):
            entry = out.brokers.add(
                cluster=bd["cluster"],
                broker_name=name,
                broker_addrs={int(k): v for k, v in bd["brokerAddrs"].items()},
                enable_acting_master=bool(bd.get("enableActingMaster", False)),
            )
            if bd.get("actingBrokerId") is not None:
                entry.acting_broker_id = bd["actingBrokerId"]
        return out

    async def _member_group(
        self, ctx: RequestContext, req: nameserver_pb2.GetBrokerMemberGroupRequest
    ) -> nameserver_pb2.BrokerMemberGroup:
        return member_group_to_pb(self.table.member_group(req.cluster, req.broker_name))

    async def _watch_route(
        self, ctx: RequestContext, req: nameserver_pb2.WatchRouteRequest
    ) -> nameserver_pb2.WatchRouteResponse:
        """Answer as soon as the topic's route differs from ``known_version``."""
        if self._watchers >= self.cfg.max_route_watchers:
            raise Overloaded(f"more than {self.cfg.max_route_watchers} route watches held")
        max_wait_ms = min(
            req.max_wait_ms or self.cfg.route_watch_max_wait_ms, self.cfg.route_watch_max_wait_ms
        )
        if ctx.timeout_ms:
            max_wait_ms = min(max_wait_ms, max(0, ctx.timeout_ms - 500))
        self._watchers += 1
        self.metrics.route_watchers.set(self._watchers)
        try:
            route = self.table.pickup_route(req.topic)
            version = route_version(route)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max_wait_ms / 1000):
                    async with self._changed:
                        while version == req.known_version:
                            await self._changed.wait()
                            route = self.table.pickup_route(req.topic)
                            version = route_version(route)
        finally:
            self._watchers -= 1
            self.metrics.route_watchers.set(self._watchers)
        resp = nameserver_pb2.WatchRouteResponse(found=route is not None, version=version)
        if route is not None:
            resp.route.CopyFrom(route_to_pb(route))
        return resp
