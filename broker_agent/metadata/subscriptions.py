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

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from broker_agent.metadata.offsets import write_json_atomic
from broker_agent.metadata.versioned import fetch_table
from ha_controller.dataversion import DataVersion
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BadRequest
from ha_controller.protocol.topics import group_name_problem
from ha_controller.rpc import ConnectionPool
from ha_controller.wire import data_version_from_pb, data_version_to_pb

__all__ = ["SubscriptionGroupConfig", "SubscriptionGroupManager", "SubscriptionGroupSync"]

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


class SubscriptionGroupManager:
    """group name -> config, with a DataVersion that moves on every change."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.groups: dict[str, SubscriptionGroupConfig] = {}
        self.data_version = DataVersion()

    def load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        data = json.loads(self.path.read_text())
        self.groups = {
            str(g["groupName"]): SubscriptionGroupConfig(
                str(g["groupName"]), bool(g.get("consumeOrderly", False))
            )
            for g in data["groups"]
        }
        self.data_version.assign(DataVersion.from_dict(data["dataVersion"]))

    def persist(self) -> None:
        if self.path is None:
            return
        write_json_atomic(
            self.path,
            {
                "groups": [
                    {"groupName": g.group_name, "consumeOrderly": g.consume_orderly}
                    for g in sorted(self.groups.values(), key=lambda g: g.group_name)
                ],
                "dataVersion": self.data_version.to_dict(),
            },
        )

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
        self.persist()
        return True


def configs_of(snapshot: broker_pb2.SubscriptionGroupTable) -> list[SubscriptionGroupConfig]:
    return [
        SubscriptionGroupConfig(g.group_name, g.consume_orderly)
        for g in snapshot.groups
        if g.group_name
    ]


class SubscriptionGroupSync:
    """The subscription group table as a versioned table."""

    name = "subscription groups"

    def __init__(self, manager: SubscriptionGroupManager) -> None:
        self.manager = manager

    async def fetch(self, pool: ConnectionPool, addr: str) -> broker_pb2.SubscriptionGroupTable:
        return await fetch_table(
            pool,
            addr,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
            broker_pb2.SubscriptionGroupTable,
        )

    def assign(self, snapshot: broker_pb2.SubscriptionGroupTable) -> None:
        self.manager.assign(configs_of(snapshot), data_version_from_pb(snapshot.data_version))

    def replace(self, snapshot: broker_pb2.SubscriptionGroupTable) -> None:
        self.assign(
            snapshot
        )  # subscription groups only grow in a cut (a group made on the master stays)

    def adopt_if_newer(self, snapshot: broker_pb2.SubscriptionGroupTable) -> bool:
        version = data_version_from_pb(snapshot.data_version)
        if self.manager.data_version.compare(version) > 0:
            return False
        return self.manager.assign(configs_of(snapshot), version)

    def describe(self, snapshot: broker_pb2.SubscriptionGroupTable) -> str:
        return f"{len(snapshot.groups)} groups"

    def busy(self) -> bool:
        return False
