"""The nameserver service: RPC handlers around the route table, the expiry
scanner, min-broker-id notifications and route watches.

Authentication (:mod:`ha_controller.auth`): with a cluster secret the dispatcher's
guard refuses every unsigned, wrongly signed, stale or replayed control request
before its handler runs, and min-id notices go out signed.  Without one (open mode)
the handlers refuse a registration change for an address, or a registration of an
id, that a live broker holds through another connection
(:meth:`RouteTable.registration_conflict`), and, with ``open_mode_check_peer_host``,
a registration of an address whose host is not the connection's peer host
(:func:`host_matches_peer`)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import logging
import socket
import time
from collections.abc import Coroutine
from typing import Any

from ha_controller.acl import Acl
from ha_controller.acl import guard as acl_guard
from ha_controller.acl.service import AclService
from ha_controller.acl.sync import AclSpread
from ha_controller.auth import ClusterAuth
from ha_controller.config import NameserverConfig
from ha_controller.controller.wire import state_to_pb
from ha_controller.proto import common_pb2, nameserver_pb2
from ha_controller.protocol.codes import RequestCode, method_name
from ha_controller.protocol.errors import (
    AddressMismatch,
    HaError,
    NotRegistered,
    Overloaded,
    PreOnlineRequired,
    RegistrationConflict,
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
from nameserver.controller import NameserverController
from nameserver.metrics import NameserverMetrics
from nameserver.route_table import BrokerRegistration, MinIdChange, RouteTable

log = logging.getLogger(__name__)

ABSENT = "absent"
#: How long resolving a broker's advertised host name may take (open mode host check).
RESOLVE_TIMEOUT_S = 2.0

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _ip(text: str) -> IpAddress | None:
    """An IP literal (brackets, zone and IPv4-mapped form undone), or None."""
    try:
        ip = ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _is_local(ip: IpAddress) -> bool:
    """Whether ``ip`` is an address of this machine (it can be bound)."""
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind((str(ip), 0))
        except OSError:
            return False
    return True


async def host_matches_peer(host: str, peer_host: str) -> bool:
    """Whether a broker that advertises ``host`` may be the process connected from
    ``peer_host``: the host (a name is resolved) is the peer's IP; a loopback peer
    (a process on this machine) may advertise any address of this machine.  Ports
    are not compared (NAT and Kubernetes services change them)."""
    peer = _ip(peer_host)
    if peer is None:
        return True  # not an IP connection: nothing to compare
    ip = _ip(host)
    if ip is not None:
        candidates = {ip}
    else:
        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, None, type=socket.SOCK_STREAM
                )
        except (OSError, TimeoutError):
            return False
        candidates = {c for c in (_ip(str(info[4][0])) for info in infos) if c is not None}
    if peer in candidates:
        return True
    return peer.is_loopback and any(c.is_loopback or _is_local(c) for c in candidates)


def _host(addr: str) -> str:
    return addr.rpartition(":")[0] or addr


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
            scan_interval_ms=cfg.scan_not_active_broker_interval_ms,
        )
        # (cluster, group) -> (acting broker id, unix time it took over)
        self._acting: dict[tuple[str, str], tuple[int, float]] = {}
        self.metrics = NameserverMetrics(
            self.groups_view, lambda: {k: ts for k, (_, ts) in self._acting.items()}
        )
        self.auth = ClusterAuth(cfg.cluster_secret, on_refused=self._auth_refused)
        self.acl = Acl.from_config(
            cfg.acl,
            on_denied=lambda m, why: self.metrics.acl_denied.labels(method_name(m), why).inc(),
        )
        self.pool = ConnectionPool(
            connect_timeout_ms=cfg.notify_timeout_ms,
            ssl_context=cfg.tls.client_context(),
            signer=self.auth.sign,
        )
        self.dispatcher = Dispatcher(guard=acl_guard(self.auth, self.acl))
        #: ACL 2.0 at runtime: tables between members, and their spread to brokers
        self.acl_service = AclService(
            self.acl, self.dispatcher, cluster_enabled=self.auth.enabled, changes=False
        )
        self.acl_spread = (
            AclSpread(self.acl.holder, self.pool, self._spawn, self._broker_addrs)
            if self.acl.holder is not None and self.auth.enabled
            else None
        )
        self._changed = asyncio.Condition()
        self._watchers = 0
        self._tg: asyncio.TaskGroup | None = None
        self._pending_notify: list[MinIdChange] = []
        #: controller mode (etcd_endpoints): automatic master switch
        self.controller = (
            NameserverController(cfg, self.table, self.pool, self.metrics.registry, self._spawn)
            if cfg.etcd_endpoints
            else None
        )
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
        if self.controller is not None:
            self.controller.register(d)
        else:
            d.add(
                RequestCode.CONTROLLER_GET_REPLICA_INFO,
                nameserver_pb2.GetReplicaInfoRequest,
                self._no_controller,
            )

    async def _no_controller(
        self, ctx: RequestContext, req: nameserver_pb2.GetReplicaInfoRequest
    ) -> nameserver_pb2.ControllerView:
        """Without etcd: no controller; a member takes the role it was configured with."""
        return nameserver_pb2.ControllerView(enabled=False, route_id=req.member_id)

    def groups_view(self) -> list[dict[str, Any]]:
        """``GET /api/v1/groups``: the route table's groups, with the controller's
        epoch, master and sync-state set in controller mode."""
        groups = self.table.groups_view()
        return groups if self.controller is None else self.controller.groups_view(groups)

    def on_connection_closed(self, conn: RpcConnection) -> None:
        changes = self.table.on_connection_closed(conn)
        if changes or conn.attrs.get("registered"):
            self.metrics.expired.labels("connection_closed").inc(
                1 if conn.attrs.get("registered") else 0
            )
        self._after_mutation(changes)

    # ---- background -------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Background work owned by the service's TaskGroup (closed when not running)."""
        if self._tg is None:
            coro.close()
        else:
            self._tg.create_task(coro, name=name)

    def _broker_addrs(self) -> list[str]:
        return [m["addr"] for g in self.table.groups_view() for m in g["members"]]

    def _acl_observed(self, addr: str, revision: int | None, digest: str) -> None:
        if self.acl_spread is not None:
            self.acl_spread.observed(addr, revision, digest)

    async def run(self, stop: asyncio.Event) -> None:
        """Run the scanner (and notifications) until ``stop`` is set."""
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                for change in self._pending_notify:
                    self._spawn_notifications(change)
                self._pending_notify.clear()
                tasks = [tg.create_task(self._scan_loop(), name="ns-scan")]
                if self.controller is not None:
                    tasks.append(tg.create_task(self.controller.run(), name="ns-controller"))
                await stop.wait()
                for task in tasks:
                    task.cancel()
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

    def _auth_refused(self, reason: str, method: int) -> None:
        self.metrics.auth_refused.labels(reason).inc()
        if method == RequestCode.REGISTER_BROKER:
            self.metrics.registrations.labels("unauthorized").inc()

    def _check_owner(
        self,
        ctx: RequestContext,
        cluster: str,
        broker_addr: str,
        *,
        broker_name: str | None = None,
        broker_id: int | None = None,
    ) -> None:
        """Open mode: a live broker's registration is changed only through the
        connection it registered on (see ``RouteTable.registration_conflict``)."""
        if self.auth.enabled:
            return  # the signature says who may: any holder of the secret
        why = self.table.registration_conflict(
            cluster, broker_addr, ctx.conn, broker_name=broker_name, broker_id=broker_id
        )
        if why is not None:
            raise self.auth.refuse(
                "registration_conflict",
                ctx.method,
                ctx.peer,
                RegistrationConflict(
                    f"{why}; without a cluster secret only that connection may change it "
                    "until the broker unregisters, disconnects or expires"
                ),
            )

    async def _check_peer_host(self, ctx: RequestContext, broker_addr: str) -> None:
        """Open mode: a broker registers an address on the host it connects from."""
        if self.auth.enabled or not self.cfg.open_mode_check_peer_host:
            return
        if not await host_matches_peer(_host(broker_addr), _host(ctx.peer)):
            raise self.auth.refuse(
                "addr_mismatch",
                ctx.method,
                ctx.peer,
                AddressMismatch(
                    f"registration of {broker_addr} from {ctx.peer}: the address is not on "
                    "the host the connection comes from (behind NAT, set "
                    "open_mode_check_peer_host = false on the nameservers, or better, a "
                    "cluster_secret)"
                ),
            )

    async def _register(
        self, ctx: RequestContext, req: nameserver_pb2.RegisterBrokerRequest
    ) -> nameserver_pb2.RegisterBrokerResponse:
        await self._check_peer_host(ctx, req.broker_addr)
        view = None
        if self.controller is not None and req.HasField("member_id"):
            view = await self.controller.check_member(
                req.cluster,
                req.broker_name,
                req.member_id,
                req.broker_id,
                req.epoch if req.HasField("epoch") else None,
            )
        # no await from here on: the owner check holds for the registration below
        self._check_owner(
            ctx, req.cluster, req.broker_addr, broker_name=req.broker_name, broker_id=req.broker_id
        )
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
            member_id=req.member_id if req.HasField("member_id") else None,
            epoch=req.epoch if req.HasField("epoch") else None,
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
        self._acl_observed(
            req.broker_addr,
            req.acl_revision if req.HasField("acl_revision") else None,
            req.acl_digest,
        )
        self.metrics.min_broker_id_changes.labels(req.cluster, req.broker_name)  # at 0
        self._after_mutation(outcome.notifications)
        resp = nameserver_pb2.RegisterBrokerResponse(
            master_addr=outcome.master_addr or "", master_ha_addr=outcome.master_ha_addr or ""
        )
        if view is not None and self.controller is not None:
            resp.controller.CopyFrom(self.controller.view_pb(view))
        return resp

    async def _unregister(
        self, ctx: RequestContext, req: nameserver_pb2.UnregisterBrokerRequest
    ) -> common_pb2.Empty:
        self._check_owner(ctx, req.cluster, req.broker_addr)
        changes = self.table.unregister_broker(
            req.cluster, req.broker_addr, req.broker_name, req.broker_id
        )
        self._after_mutation(changes)
        return common_pb2.Empty()

    async def _heartbeat(
        self, ctx: RequestContext, req: nameserver_pb2.BrokerHeartbeatRequest
    ) -> nameserver_pb2.BrokerHeartbeatResponse:
        resp = nameserver_pb2.BrokerHeartbeatResponse()
        if self.controller is not None and req.HasField("member_id"):
            registered = self.table.registered_id(req.cluster, req.broker_addr)
            if registered is not None:
                view = await self.controller.check_member(
                    req.cluster,
                    req.broker_name,
                    req.member_id,
                    registered,
                    req.epoch if req.HasField("epoch") else None,
                )
                resp.controller.CopyFrom(self.controller.view_pb(view))
        self._check_owner(ctx, req.cluster, req.broker_addr)
        generation = self.table.generation
        outcome = self.table.broker_heartbeat(
            req.cluster,
            req.broker_addr,
            max_offset=req.max_offset if req.HasField("max_offset") else None,
            store_writable=req.store_writable if req.HasField("store_writable") else None,
            epoch=req.epoch if req.HasField("epoch") else None,
        )
        if not outcome.known:
            # expired (or never registered): the broker must register again, and a
            # master must first go through pre-online
            raise NotRegistered(f"{req.broker_addr} is not registered in {req.cluster}")
        if outcome.notifications or self.table.generation != generation:
            # its report made another slave the acting one of a masterless group
            self._after_mutation(outcome.notifications)
        self._acl_observed(
            req.broker_addr,
            req.acl_revision if req.HasField("acl_revision") else None,
            req.acl_digest,
        )
        return resp

    async def _query_data_version(
        self, ctx: RequestContext, req: nameserver_pb2.QueryDataVersionRequest
    ) -> nameserver_pb2.QueryDataVersionResponse:
        self._check_owner(ctx, req.cluster, req.broker_addr)
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
            if self.controller is not None:
                state = self.controller.controller.state(bd["cluster"], name)
                if state is not None:
                    out.controller[name].CopyFrom(state_to_pb(state))
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
