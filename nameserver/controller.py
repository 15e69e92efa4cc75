"""The nameserver's side of controller mode: the controller it runs (with
``etcd_endpoints``), the requests brokers and ``hactl`` make of it, the checks its
registrations and heartbeats get, and its metrics (docs/failover.md).

A member registers and heartbeats with its member id and its log's last epoch; the
nameserver refuses (``StaleEpoch``) a member that registers under another id than the
group's current state gives it (a master replaced while it was away, a member whose
id swapped), so that no client is ever routed to a master of an older epoch by this
nameserver, and its answers carry the member's view of the state, which a master
whose writes nothing else fences needs to renew its lease.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ha_controller.config import NameserverConfig
from ha_controller.controller.ports import View
from ha_controller.controller.runtime import Controller, ControllerSettings
from ha_controller.controller.state import GroupState
from ha_controller.controller.wire import state_to_pb, view_to_pb
from ha_controller.proto import broker_pb2, common_pb2, nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BadRequest, StaleEpoch
from ha_controller.rpc import ConnectionPool, Dispatcher, RequestContext
from nameserver.route_table import RouteTable

__all__ = ["ControllerMetrics", "NameserverController"]

log = logging.getLogger(__name__)


class ControllerMetrics:
    """``hac_controller_*`` (docs/http-and-metrics.md)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.epoch = Gauge(
            "hac_controller_epoch",
            "The group's current epoch (moves on at every change of master)",
            ["cluster", "broker_name"],
            registry=registry,
        )
        self.master = Gauge(
            "hac_controller_master_member",
            "Member id (configured broker_id) of the group's master in the current epoch",
            ["cluster", "broker_name"],
            registry=registry,
        )
        self.sync_set = Gauge(
            "hac_controller_sync_state_set_size",
            "Members in the group's sync-state set, the master included",
            ["cluster", "broker_name"],
            registry=registry,
        )
        self.switches = Counter(
            "hac_controller_switches_total",
            "Changes of master decided by this nameserver (kind: auto, planned, unclean)",
            ["cluster", "broker_name", "kind"],
            registry=registry,
        )
        self.unclean = Counter(
            "hac_controller_unclean_elections_total",
            "Elections of a member outside the sync-state set (acknowledged writes may be lost)",
            ["cluster", "broker_name"],
            registry=registry,
        )
        self.election_seconds = Histogram(
            "hac_controller_election_duration_seconds",
            "From the master's loss (or a planned switch's start) to the new epoch written",
            ["kind"],
            buckets=(0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 60),
            registry=registry,
        )
        self.leader = Gauge(
            "hac_controller_leader",
            "1 while this nameserver holds the controller's etcd lease (it takes elections)",
            registry=registry,
        )
        self.etcd = Gauge(
            "hac_controller_etcd_up",
            "1 when this nameserver's last request to etcd succeeded",
            registry=registry,
        )

    def switched(self, state: GroupState, kind: str, duration_s: float) -> None:
        self.switches.labels(state.cluster, state.group, kind).inc()
        if kind == "unclean":
            self.unclean.labels(state.cluster, state.group).inc()
        self.election_seconds.labels(kind).observe(duration_s)

    def states(self, states: Iterable[GroupState]) -> None:
        for s in states:
            self.epoch.labels(s.cluster, s.group).set(s.epoch)
            self.master.labels(s.cluster, s.group).set(s.master)
            self.sync_set.labels(s.cluster, s.group).set(len(s.sync_set))
            for kind in ("auto", "planned", "unclean"):
                self.switches.labels(s.cluster, s.group, kind)
            self.unclean.labels(s.cluster, s.group)

    def leading(self, leading: bool) -> None:
        self.leader.set(1 if leading else 0)

    def etcd_up(self, up: bool) -> None:
        self.etcd.set(1 if up else 0)


class _Calls:
    """The controller's requests to brokers, through the nameserver's pool."""

    def __init__(self, pool: ConnectionPool, timeout_ms: int) -> None:
        self.pool = pool
        self.timeout_ms = timeout_ms

    async def notify_role(
        self, addr: str, state: GroupState, route_id: int, fence_wait_ms: int
    ) -> None:
        await self.pool.call_pb(
            addr,
            RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
            nameserver_pb2.NotifyBrokerRoleChangedRequest(
                cluster=state.cluster,
                broker_name=state.group,
                state=state_to_pb(state),
                route_id=route_id,
                fence_wait_ms=fence_wait_ms,
            ),
            common_pb2.Empty,
            timeout_ms=self.timeout_ms,
        )

    async def prepare_switch(
        self, addr: str, target: int, epoch: int, timeout_ms: int
    ) -> tuple[bool, int, str]:
        resp = await self.pool.call_pb(
            addr,
            RequestCode.PREPARE_SWITCH,
            broker_pb2.PrepareSwitchRequest(
                target_member=target, epoch=epoch, timeout_ms=timeout_ms
            ),
            broker_pb2.PrepareSwitchResponse,
            timeout_ms=timeout_ms + 2000,
        )
        return resp.caught_up, resp.end_offset, resp.detail


def _node_id(cfg: NameserverConfig) -> str:
    return f"{socket.gethostname()}:{cfg.listen.rsplit(':', 1)[-1]}/{os.getpid()}"


class NameserverController:
    """Controller mode on one nameserver (None of it without ``etcd_endpoints``)."""

    def __init__(
        self,
        cfg: NameserverConfig,
        table: RouteTable,
        pool: ConnectionPool,
        registry: CollectorRegistry,
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
    ) -> None:
        self.table = table
        self.metrics = ControllerMetrics(registry)
        self.controller = Controller(
            ControllerSettings(
                endpoints=cfg.etcd_endpoints,
                prefix=cfg.etcd_prefix,
                auto_switch_after_ms=cfg.auto_switch_after_ms,
                allow_unclean_election=cfg.allow_unclean_election,
                min_switch_interval_ms=cfg.min_switch_interval_ms,
                poll_interval_ms=cfg.controller_poll_interval_ms,
                lease_ttl_s=cfg.controller_lease_ttl_s,
            ),
            table,
            _Calls(pool, cfg.notify_timeout_ms),
            node_id=_node_id(cfg),
            metrics=self.metrics,
            spawn=spawn,
        )

    def register(self, d: Dispatcher) -> None:
        d.add(
            RequestCode.CONTROLLER_GET_REPLICA_INFO,
            nameserver_pb2.GetReplicaInfoRequest,
            self._replica_info,
        )
        d.add(
            RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
            nameserver_pb2.AlterSyncStateSetRequest,
            self._alter,
        )
        d.add(RequestCode.CONTROLLER_ELECT_MASTER, nameserver_pb2.ElectMasterRequest, self._elect)

    async def run(self) -> None:
        await self.controller.run()

    # ---- checks of registrations and heartbeats ------------------------------------------

    async def check_member(
        self, cluster: str, group: str, member: int, route_id: int, epoch: int | None
    ) -> View:
        """The member's view; StaleEpoch when it registers (or heartbeats) under another
        id than the group's state gives it."""
        state = self.controller.state(cluster, group)
        if state is not None and epoch is not None and epoch > state.epoch:
            state = await self.controller.ensure_epoch(cluster, group, epoch)
        if state is not None and state.route_id(member) != route_id:
            raise StaleEpoch(
                f"{group}: member {member} shows as id {route_id}, but epoch {state.epoch} "
                f"(master: member {state.master}) gives it id {state.route_id(member)}"
            )
        return self.controller.view(cluster, group, member)

    def view_pb(self, view: View) -> nameserver_pb2.ControllerView:
        return view_to_pb(view)

    def groups_view(self, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``GET /api/v1/groups`` with each group's epoch, master and sync-state set."""
        for g in groups:
            state = self.controller.state(g["cluster"], g["brokerName"])
            if state is not None:
                g.update(state.view())
        return groups

    # ---- handlers ------------------------------------------------------------------------

    async def _replica_info(
        self, ctx: RequestContext, req: nameserver_pb2.GetReplicaInfoRequest
    ) -> nameserver_pb2.ControllerView:
        view = await self.controller.replica_info(
            req.cluster, req.broker_name, req.member_id, req.broker_addr
        )
        return view_to_pb(view)

    async def _alter(
        self, ctx: RequestContext, req: nameserver_pb2.AlterSyncStateSetRequest
    ) -> nameserver_pb2.ControllerView:
        view = await self.controller.alter(
            req.cluster,
            req.broker_name,
            master=req.master_member,
            epoch=req.epoch,
            new_set=req.sync_state_set,
        )
        return view_to_pb(view)

    async def _elect(
        self, ctx: RequestContext, req: nameserver_pb2.ElectMasterRequest
    ) -> nameserver_pb2.ElectMasterResponse:
        if not req.cluster or not req.broker_name:
            raise BadRequest("a switch names the cluster and the group")
        outcome = await self.controller.switch(
            req.cluster,
            req.broker_name,
            req.target_member,
            timeout_ms=req.timeout_ms or 3000,
        )
        return nameserver_pb2.ElectMasterResponse(
            controller=view_to_pb(outcome.view),
            paused_ms=outcome.paused_ms,
            detail=outcome.detail,
        )
