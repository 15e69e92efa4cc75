"""Subscription group configs: a consumer group's own settings (RocketMQ's
SubscriptionGroupConfig), today whether the group consumes orderly
(``consumeMessageOrderly``: its POP is RocketMQ's order=true POP).

Set on every master with UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (``hactl group update``),
read by anyone with GET_ALL_SUBSCRIPTIONGROUP_CONFIG (the gRPC gateway, slaves).  The
table is persisted (``subscriptions.json``), forward-synced to slaves like the other
versioned tables (an acting slave knows which groups are orderly) and reverse-synced
in pre-online.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_agent.metadata.json_table import JsonTable, Recovery, oldest
from broker_agent.metadata.versioned import TableSync
from ha_controller.dataversion import DataVersion
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BadRequest
from ha_controller.protocol.topics import group_name_problem
from ha_controller.wire import data_version_from_pb, data_version_to_pb

__all__ = ["SubscriptionGroupConfig", "SubscriptionGroupManager", "subscription_group_sync"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SubscriptionGroupConfig:
    group_name: str
    consume_orderly: bool = False

    def to_pb(self) -> broker_pb2.SubscriptionGroupConfig:
        return broker_pb2.SubscriptionGroupConfig(
            group_name=self.group_name, consume_orderly=self.consume_orderly
        )

    @classmethod
    def from_pb(cls, pb: broker_pb2.SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        problem = group_name_problem(pb.group_name)
        if problem is not None:
            raise BadRequest(problem)
        return cls(pb.group_name, pb.consume_orderly)


class SubscriptionGroupManager(JsonTable):
    """group name -> config, with a DataVersion that moves on every change.

    A table that has never moved is the oldest of all, so a master that lost its file
    takes its slaves' in pre-online instead of handing them its empty one."""

    what = "subscription group table"
    recovery = Recovery.REPLICA
    repair = (
        "repair it, or move it away to start with an empty table and set the orderly "
        "groups again (hactl group update GROUP --orderly); a broker with replicas takes "
        "them from one"
    )

    def __init__(self, path: Path | None) -> None:
        super().__init__(path)
        self.groups: dict[str, SubscriptionGroupConfig] = {}
        self.data_version = oldest()

    def restore(self, data: Any) -> None:
        groups = {
            str(g["groupName"]): SubscriptionGroupConfig(
                str(g["groupName"]), bool(g.get("consumeOrderly", False))
            )
            for g in data["groups"]
        }
        self.data_version.assign(DataVersion.from_dict(data["dataVersion"]))
        self.groups = groups

    def start_over(self) -> None:
        self.groups = {}
        self.data_version.assign(oldest())

    def payload(self) -> dict[str, Any]:
        return {
            "groups": [
                {"groupName": g.group_name, "consumeOrderly": g.consume_orderly}
                for g in sorted(self.groups.values(), key=lambda g: g.group_name)
            ],
            "dataVersion": self.data_version.to_dict(),
        }

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        return self.groups.get(group)

    def orderly(self, group: str) -> bool:
        config = self.groups.get(group)
        return config is not None and config.consume_orderly

    def upsert(self, config: SubscriptionGroupConfig) -> bool:
        """Create or replace one group's config; True (and persisted) when it changed."""
        if self.groups.get(config.group_name) == config:
            return False
        self.groups[config.group_name] = config
        self.data_version.next_version()
        self._dirty = True
        self.persist()
        log.info(
            "subscription group %s: consume_orderly=%s", config.group_name, config.consume_orderly
        )
        return True

    def table_pb(self) -> broker_pb2.SubscriptionGroupTable:
        return broker_pb2.SubscriptionGroupTable(
            groups=[g.to_pb() for g in self.groups.values()],
            data_version=data_version_to_pb(self.data_version),
        )

    def assign(self, groups: Iterable[SubscriptionGroupConfig], version: DataVersion) -> bool:
        new = {g.group_name: g for g in groups}
        if new == self.groups and version.key() == self.data_version.key():
            return False
        self.groups = new
        self.data_version.assign(version)
        self._dirty = True
        self.persist()
        return True

    def adopt_if_newer(
        self, groups: Iterable[SubscriptionGroupConfig], version: DataVersion
    ) -> bool:
        """Reverse sync: a slave's table whose version is >= ours (ties adopt)."""
        if self.data_version.compare(version) > 0:
            return False
        return self.assign(groups, version)


SubscriptionSnapshot = tuple[list[SubscriptionGroupConfig], DataVersion]


def _snapshot(pb: broker_pb2.SubscriptionGroupTable) -> SubscriptionSnapshot:
    groups = [
        SubscriptionGroupConfig(g.group_name, g.consume_orderly) for g in pb.groups if g.group_name
    ]
    return groups, data_version_from_pb(pb.data_version)


def subscription_group_sync(
    manager: SubscriptionGroupManager,
) -> TableSync[broker_pb2.SubscriptionGroupTable, SubscriptionSnapshot]:
    """The subscription group table for forward and reverse sync; a cut takes it as a
    forward sync does (groups only grow in a cut: a group made on the master stays)."""
    return TableSync(
        "subscription groups",
        RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
        broker_pb2.SubscriptionGroupTable,
        decode=_snapshot,
        take=lambda s: manager.assign(*s),
        adopt=lambda s: manager.adopt_if_newer(*s),
        describe=lambda s: f"{len(s[0])} groups",
        busy=lambda: False,
        file=manager,
    )
