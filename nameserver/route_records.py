"""What the nameserver's route table keeps and answers: a broker's registration, the
notices and outcomes it returns, and its records of each live broker and each broker
group (plain data; the table owns the rules, :mod:`nameserver.route_table`).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Final

from ha_controller.dataversion import DataVersion
from ha_controller.routing import BrokerData, TopicConfig

__all__ = [
    "MASTER_ID",
    "BrokerRegistration",
    "ExpiredBroker",
    "GroupRecord",
    "HeartbeatOutcome",
    "LiveInfo",
    "MinIdChange",
    "RegisterOutcome",
    "Removal",
]

MASTER_ID: Final = 0


@dataclass
class BrokerRegistration:
    """One REGISTER_BROKER request (``None`` fields = sent by an old broker)."""

    cluster: str
    broker_addr: str
    broker_name: str
    broker_id: int
    ha_addr: str | None = None
    heartbeat_timeout_ms: int | None = None
    enable_acting_master: bool | None = None
    topic_configs: dict[str, TopicConfig] = field(default_factory=dict)
    data_version: DataVersion = field(default_factory=DataVersion)
    #: the broker completed pre-online before this registration (see register_broker)
    pre_online_done: bool = True
    #: the end of its commit log (replication position); None from an old broker
    max_offset: int | None = None
    #: whether its store takes appends; None from an old broker (taken as True)
    store_writable: bool | None = None
    #: controller mode: its configured id and its log's last epoch (None: no support)
    member_id: int | None = None
    epoch: int | None = None


@dataclass(frozen=True)
class MinIdChange:
    """A group's lowest broker id changed; ``targets`` are the addresses to notify."""

    cluster: str
    broker_name: str
    min_broker_id: int
    min_broker_addr: str
    offline_broker_addr: str | None
    ha_broker_addr: str | None
    targets: list[str]


@dataclass(frozen=True)
class HeartbeatOutcome:
    """Answer to a heartbeat: whether the broker is registered, and the notifications
    due when its report made the table choose another acting slave."""

    known: bool
    notifications: list[MinIdChange] = field(default_factory=list)


@dataclass(frozen=True)
class RegisterOutcome:
    """Answer to a registration: the master's addresses for a slave, notifications."""

    master_addr: str | None = None
    master_ha_addr: str | None = None
    rejected: bool = False
    notifications: list[MinIdChange] = field(default_factory=list)
    #: rejected because a master must complete pre-online first
    needs_pre_online: bool = False


@dataclass(frozen=True)
class ExpiredBroker:
    """A broker the scan found silent; ``conn_id`` is the connection to close."""

    cluster: str
    broker_addr: str
    broker_name: str | None
    broker_id: int | None
    conn_id: Hashable | None
    last_update_ms: float
    heartbeat_timeout_ms: int


@dataclass
class LiveInfo:
    """What the table knows of one live broker: when it was last heard and what it
    last reported."""

    last_update_ms: float
    heartbeat_timeout_ms: int
    data_version: DataVersion
    conn_id: Hashable | None
    ha_addr: str | None
    broker_name: str | None = None
    max_offset: int | None = None
    store_writable: bool = True
    #: when its position was last reported (registration or heartbeat)
    reported_ms: float = 0.0
    #: when it was last heard from (registration or heartbeat); unlike
    #: ``last_update_ms`` never moved by a stall's fresh grace period
    heard_ms: float = 0.0
    #: controller mode (see BrokerRegistration)
    member_id: int | None = None
    epoch: int | None = None


@dataclass
class GroupRecord:
    """One broker group as the table knows it: its members, and whether and since when
    it has been without a master, settling or acted for."""

    cluster: str
    broker_name: str
    addrs: dict[int, str] = field(default_factory=dict)
    enable_acting_master: bool = False
    #: the slave chosen to act while the group has no master (``RouteTable._rechoose``)
    acting_id: int | None = None
    #: since when the group has had no master (None while it has one)
    masterless_since: float | None = None
    #: no slave chosen yet: waiting for positions reported after the master left
    settling: bool = False
    #: the master that left, while settling (the notice at the choice names it)
    lost_master: tuple[int, str] | None = None
    #: this nameserver has seen the group's master register since it started
    master_seen: bool = False
    #: when this nameserver first heard of the group (its first member registered)
    first_seen_ms: float = 0.0
    #: since when no member has been registered as id 0 (the controller's clock)
    no_master_since: float | None = None
    #: a master expired for silence: when it was last heard (its absence began then)
    master_silent_since: float | None = None

    def min_member(self) -> tuple[int, str] | None:
        if not self.addrs:
            return None
        broker_id = min(self.addrs)
        return broker_id, self.addrs[broker_id]

    def lead(self) -> tuple[int, str] | None:
        """The member routes show as id 0 and notifications name: the master, else
        the chosen acting slave, else the lowest member."""
        if MASTER_ID in self.addrs:
            return MASTER_ID, self.addrs[MASTER_ID]
        if self.settling:
            return None
        if self.acting_id is not None and self.acting_id in self.addrs:
            return self.acting_id, self.addrs[self.acting_id]
        return self.min_member()

    def has_master(self) -> bool:
        return MASTER_ID in self.addrs

    def sorted_addrs(self) -> dict[int, str]:
        return {broker_id: self.addrs[broker_id] for broker_id in sorted(self.addrs)}

    def to_broker_data(self) -> BrokerData:
        return BrokerData(
            self.cluster, self.broker_name, self.sorted_addrs(), self.enable_acting_master
        )


@dataclass(frozen=True)
class Removal:
    """A broker to take out of the table (an unregistration, an expiry)."""

    cluster: str
    broker_addr: str
    broker_name: str
    broker_id: int
