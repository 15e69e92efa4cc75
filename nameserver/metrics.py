"""Nameserver metrics (docs/http-and-metrics.md), read from the route table at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ha_controller.auth import OPEN_MODE_REASONS, RPC_REASONS
from ha_controller.rpc.metrics import RpcCollector
from ha_controller.rpc.server import RpcServer


class GroupCollector(Collector):
    """Group membership as the route table sees it, computed per scrape so
    that a vanished member disappears instead of lingering as a stale series."""

    def __init__(
        self,
        groups: Callable[[], list[dict[str, Any]]],
        acting_since: Callable[[], dict[tuple[str, str], float]] | None = None,
    ) -> None:
        self._groups = groups
        self._acting_since = acting_since

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "hac_group_member_up",
            "1 for each broker registered and heartbeating in its group",
            labels=["cluster", "broker_name", "broker_id"],
        )
        acting = GaugeMetricFamily(
            "hac_group_acting_master",
            "Raw broker id shown to clients as id 0 while the master is away; -1 when none",
            labels=["cluster", "broker_name"],
        )
        master = GaugeMetricFamily(
            "hac_group_master_online",
            "1 when the group's id 0 (master) is registered",
            labels=["cluster", "broker_name"],
        )
        age = GaugeMetricFamily(
            "hac_broker_heartbeat_age_seconds",
            "Seconds since the broker's last heartbeat reached this nameserver",
            labels=["cluster", "broker_name", "broker_id"],
        )
        since = GaugeMetricFamily(
            "hac_group_acting_master_since_seconds",
            "Unix time at which the group's current acting master took over (only while one acts)",
            labels=["cluster", "broker_name"],
        )
        for (cluster, name), ts in (self._acting_since() if self._acting_since else {}).items():
            since.add_metric([cluster, name], ts)
        for g in self._groups():
            labels = [g["cluster"], g["brokerName"]]
            acting_id = g.get("actingBrokerId")
            acting.add_metric(labels, -1 if acting_id is None else acting_id)
            master.add_metric(labels, 1 if g.get("masterOnline") else 0)
            for m in g["members"]:
                member = [*labels, str(m["brokerId"])]
                up.add_metric(member, 1)
                age.add_metric(member, m["lastHeartbeatAgeMs"] / 1000)
        yield up
        yield acting
        yield master
        yield age
        yield since


class NameserverMetrics:
    def __init__(
        self,
        groups: Callable[[], list[dict[str, Any]]],
        acting_since: Callable[[], dict[tuple[str, str], float]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(GroupCollector(groups, acting_since))
        self.min_broker_id_changes = Counter(
            "hac_min_broker_id_changes_total",
            "Changes of a group's lowest live broker id (master lost or back)",
            ["cluster", "broker_name"],
            registry=self.registry,
        )
        self.notifications = Counter(
            "hac_min_broker_id_notifications_total",
            "NOTIFY_MIN_BROKER_ID_CHANGE deliveries to brokers",
            ["result"],
            registry=self.registry,
        )
        self.expired = Counter(
            "hac_broker_expired_total",
            "Brokers expired by the scanner or by a dropped connection",
            ["reason"],
            registry=self.registry,
        )
        self.registrations = Counter(
            "hac_broker_registrations_total",
            "REGISTER_BROKER requests",
            ["result"],
            registry=self.registry,
        )
        # Series exist at 0 from the start: the first event of a counter that only
        # appears on its first increment is invisible to rate() and increase().
        for reason in ("connection_closed", "heartbeat_timeout"):
            self.expired.labels(reason)
        for result in ("ok", "failed"):
            self.notifications.labels(result)
        for result in ("ok", "stale", "unauthorized", "needs_pre_online"):
            self.registrations.labels(result)
        self.auth_refused = Counter(
            "hac_auth_refused_total",
            "Control-plane requests refused by cluster authentication (reason: unsigned, "
            "bad_signature, stale, replayed, replay_cache_full; without a secret: "
            "registration_conflict, addr_mismatch)",
            ["reason"],
            registry=self.registry,
        )
        for reason in (*RPC_REASONS, *OPEN_MODE_REASONS):
            self.auth_refused.labels(reason)
        self.acl_denied = Counter(
            "hac_acl_denied_total",
            "Client requests refused by the ACL, by request code and reason (anonymous, "
            "unknown_user, bad_signature, stale, no_permission)",
            ["code", "reason"],
            registry=self.registry,
        )
        self.route_watchers = Gauge(
            "hac_route_watchers", "Route watches currently held", registry=self.registry
        )

    def export_rpc(self, servers: Callable[[], Iterable[RpcServer]]) -> None:
        """``hac_rpc_*``: the connection bounds of the nameserver's RPC listener."""
        self.registry.register(RpcCollector(servers))
