"""``hactl nameserver``'s settings."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from ha_controller.config import checks, common
from ha_controller.config.base import Problem, Validated
from ha_controller.config.checks import listener_clash
from ha_controller.config.schema import setting
from ha_controller.config.tables import AclConfig, RpcLimits, TlsConfig
from ha_controller.config.values import LogLevel

__all__ = ["NameserverConfig"]


@dataclass(frozen=True, kw_only=True)
class NameserverConfig(Validated):
    """``hactl nameserver`` (RocketMQ NamesrvConfig plus our route watch and auth)."""

    listen: str = setting(
        "0.0.0.0:9876",
        check=checks.LISTEN,
        doc="RPC listener (brokers, clients, `hactl`).",
    )
    http_listen: str = setting(
        "0.0.0.0:9877",
        check=checks.LISTEN,
        flag="http",
        doc=(
            "Admin HTTP listener: `/api/v1/*`, `/healthz`, `/readyz`, `/metrics`. Served over "
            "HTTPS when `tls.enabled`."
        ),
    )
    scan_not_active_broker_interval_ms: int = setting(
        5000,
        doc=(
            "How often the nameserver looks for brokers whose heartbeats stopped (RocketMQ "
            "`scanNotActiveBrokerInterval`), so a silent broker is expired within its "
            "`broker_not_active_timeout_ms` plus this. A broker whose connection drops is expired "
            "at once."
        ),
    )
    support_acting_master: bool = setting(
        True,
        doc=(
            "RIP-32 on the nameserver: when a group loses its master, show the chosen slave to "
            "clients as read-only `brokerId 0` (RocketMQ defaults this to false; this product "
            "exists for it). Only groups whose brokers register with `enable_slave_acting_master` "
            "get it."
        ),
    )
    notify_min_broker_id_changed: bool = setting(
        True,
        doc=(
            "Send `NOTIFY_MIN_BROKER_ID_CHANGE` to a group's members when its lead changes "
            "(master lost, slave chosen, master back), so a slave starts or stops acting at once "
            "instead of at its next member-group poll. RocketMQ defaults this to false."
        ),
    )
    notify_timeout_ms: int = setting(
        3000,
        le=60_000,
        doc="Timeout of one min-broker-id notification (connect and call).",
    )
    notify_retries: int = setting(
        3,
        ge=0,
        le=100,
        doc=(
            "Attempts per broker at delivering a min-broker-id notification (0 counts as 1), 0.2 "
            "s apart, doubling up to 2 s."
        ),
    )
    cluster_secret: str | None = setting(
        None,
        check=checks.NOT_EMPTY,
        secret=True,
        doc=(
            "HMAC-SHA256 key of the control plane, the same on every nameserver and broker: when "
            "set, every request between cluster members (register, unregister, heartbeat, min-id "
            "notices, ...) is signed over the whole request with a timestamp and a nonce; "
            "unsigned, wrongly signed, replayed ones or ones more than 30 s off this server's "
            "clock are refused (`SignatureInvalid`, `ReplayedRequest`) and change nothing. Unset "
            "= open mode (see [security](security.md))."
        ),
    )
    open_mode_check_peer_host: bool = setting(
        True,
        doc=(
            "Without a `cluster_secret`: refuse (`AddressMismatch`) a registration whose address "
            "is not on the host the broker's connection comes from (host only: ports are not "
            "compared; a name is resolved; a broker on this machine may advertise any of its "
            "addresses). Turn off when brokers reach the nameservers through NAT. Ignored with a "
            "secret."
        ),
    )
    admin_token: str | None = common.admin_token()
    route_watch_max_wait_ms: int = setting(
        30_000,
        le=600_000,
        doc=(
            "The longest a `WATCH_ROUTE` is held before it is answered unchanged (a client may "
            "ask for less; the request's own timeout minus 0.5 s also caps it)."
        ),
    )
    max_route_watchers: int = setting(
        10_000,
        ge=1,
        doc="Route watches held at once; one more is answered `Overloaded`.",
    )
    etcd_endpoints: tuple[str, ...] = setting(
        (),
        check=checks.OPTIONAL_TARGETS,
        section="Controller mode (automatic master switch)",
        doc=(
            "etcd endpoints (`HOST:PORT`, comma-separated), the same on every nameserver. Set, "
            "the nameservers run the controller: a group whose master stays away for "
            "`auto_switch_after_ms` gets a new, writable master from its sync-state set, with a "
            "new epoch, decided by compare-and-swap in etcd. Empty: RIP-32 acting only, as "
            "before."
        ),
    )
    etcd_prefix: str = setting(
        "/hac",
        check=checks.NOT_EMPTY,
        doc="Key prefix of the controller's keys in etcd (one per cluster sharing an etcd).",
    )
    auto_switch_after_ms: int = setting(
        500,
        ge=0,
        doc=(
            "How long a group may have no master before the controller elects one (RIP-32 "
            "acting serves its reads meanwhile). 0 keeps RIP-32 acting only, with the controller "
            "still keeping the groups' states."
        ),
    )
    allow_unclean_election: bool = setting(
        False,
        doc=(
            "Let a member outside the sync-state set become master when no member of it is "
            "alive. Writes the old master acknowledged and that member lacks are then LOST; "
            "each such election logs an error and counts `hac_controller_unclean_elections_total`."
        ),
    )
    min_switch_interval_ms: int = setting(
        5000,
        ge=0,
        doc=(
            "A group switches master at most once in this long (a flapping master, or a new "
            "master that never came up, does not make the group switch again and again)."
        ),
    )
    controller_poll_interval_ms: int = setting(
        200,
        le=10_000,
        doc="How often each nameserver reads the groups' states from etcd.",
    )
    controller_lease_ttl_s: int = setting(
        3,
        ge=2,
        le=60,
        doc=(
            "TTL of the etcd lease by which one nameserver leads the controller (elections). "
            "When the leader dies another takes over within it."
        ),
    )
    tls: TlsConfig = field(default_factory=TlsConfig)
    acl: AclConfig = field(default_factory=AclConfig)
    limits: RpcLimits = field(default_factory=RpcLimits)
    log_level: LogLevel = common.log_level()

    def _rules(self) -> Iterator[Problem]:
        clash = listener_clash({"listen": self.listen, "http_listen": self.http_listen})
        if clash is not None:
            yield clash
        if self.acl.enabled and not self.acl.allow_anonymous and self.cluster_secret is None:
            yield (
                ("acl.allow_anonymous", "cluster_secret"),
                "acl.allow_anonymous = false needs a cluster_secret: the cluster's own "
                "requests are told from clients' by its signature",
            )
