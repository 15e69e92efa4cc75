"""Routing domain types shared by the nameserver, the brokers and the client.

Mirrors RocketMQ's ``PermName``, ``TopicConfig``, ``QueueData``, ``BrokerData``,
``TopicRouteData`` and ``BrokerMemberGroup``.  The JSON shape of a route is the one
``GET /api/v1/routes/{topic}`` answers (docs/http-and-metrics.md).  Collections are
kept sorted so that every output is deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ha_controller.dataversion import DataVersion
from ha_controller.protocol.properties import SYNC_BROKER_MEMBER_GROUP_PREFIX
from ha_controller.protocol.topics import TopicMessageType

__all__ = [
    "SYNC_BROKER_MEMBER_GROUP_PREFIX",
    "BrokerData",
    "BrokerMemberGroup",
    "Perm",
    "QueueData",
    "TopicConfig",
    "TopicConfigWrapper",
    "TopicRouteData",
    "sync_member_group_topic",
]

MASTER_ID: Final = 0
#: ``acting_broker_id`` of a masterless group whose acting slave is not chosen yet
#: (the nameserver waits for every slave's position reported after the loss)
SETTLING: Final = -1


def sync_member_group_topic(broker_name: str) -> str:
    """The compatibility member-group topic of ``broker_name``."""
    return SYNC_BROKER_MEMBER_GROUP_PREFIX + broker_name


class Perm:
    """Queue permission bits (RocketMQ ``PermName``)."""

    PRIORITY: Final = 8
    READ: Final = 4
    WRITE: Final = 2
    INHERIT: Final = 1

    @staticmethod
    def is_readable(perm: int) -> bool:
        return perm & Perm.READ == Perm.READ

    @staticmethod
    def is_writeable(perm: int) -> bool:
        return perm & Perm.WRITE == Perm.WRITE

    @staticmethod
    def is_inherited(perm: int) -> bool:
        return perm & Perm.INHERIT == Perm.INHERIT

    @staticmethod
    def without_write(perm: int) -> int:
        return perm & ~Perm.WRITE

    @staticmethod
    def to_string(perm: int) -> str:
        """``RWX`` style, ``-`` for a missing bit (X = inherit)."""
        return "".join(
            ch if perm & bit else "-"
            for ch, bit in (("R", Perm.READ), ("W", Perm.WRITE), ("X", Perm.INHERIT))
        )


def _sorted_addrs(addrs: Mapping[int, str]) -> dict[int, str]:
    return {broker_id: addrs[broker_id] for broker_id in sorted(addrs)}


def _members_to_json(cluster: str, broker_name: str, addrs: Mapping[int, str]) -> dict[str, Any]:
    """A group and its members by id, as :class:`BrokerData` and
    :class:`BrokerMemberGroup` both write them."""
    return {
        "cluster": cluster,
        "brokerName": broker_name,
        "brokerAddrs": {str(broker_id): addr for broker_id, addr in _sorted_addrs(addrs).items()},
    }


def _addrs_from_json(data: Mapping[str, Any]) -> dict[int, str]:
    """``brokerAddrs`` (string ids) back to ids -> addresses, sorted by id."""
    return _sorted_addrs({int(k): str(v) for k, v in dict(data.get("brokerAddrs", {})).items()})


@dataclass(frozen=True)
class TopicConfig:
    """A topic as one broker holds it."""

    topic_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = Perm.READ | Perm.WRITE
    topic_sys_flag: int = 0
    order: bool = False
    #: the kind of messages it takes (RocketMQ's ``message.type``); a topic from before
    #: types, or one a broker made on a first send, takes every kind
    message_type: TopicMessageType = TopicMessageType.MIXED

    def to_json(self) -> dict[str, Any]:
        return {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicSysFlag": self.topic_sys_flag,
            "order": self.order,
            "messageType": self.message_type.value,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TopicConfig:
        return cls(
            topic_name=str(data["topicName"]),
            read_queue_nums=int(data["readQueueNums"]),
            write_queue_nums=int(data["writeQueueNums"]),
            perm=int(data["perm"]),
            topic_sys_flag=int(data.get("topicSysFlag", 0)),
            order=bool(data.get("order", False)),
            message_type=TopicMessageType.from_wire(str(data.get("messageType", ""))),
        )


@dataclass
class TopicConfigWrapper:
    """A broker's topic configs with their DataVersion (the REGISTER_BROKER body)."""

    topic_configs: dict[str, TopicConfig] = field(default_factory=dict)
    data_version: DataVersion = field(default_factory=DataVersion)

    def to_json(self) -> dict[str, Any]:
        return {
            "topicConfigTable": {
                name: self.topic_configs[name].to_json() for name in sorted(self.topic_configs)
            },
            "dataVersion": self.data_version.to_dict(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TopicConfigWrapper:
        table = dict(data.get("topicConfigTable", {}))
        return cls(
            {str(name): TopicConfig.from_json(tc) for name, tc in table.items()},
            DataVersion.from_dict(dict(data.get("dataVersion", {}))),
        )


@dataclass(frozen=True)
class QueueData:
    """The queues one broker group serves for a topic."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    @classmethod
    def from_topic_config(cls, broker_name: str, config: TopicConfig) -> QueueData:
        return cls(
            broker_name,
            config.read_queue_nums,
            config.write_queue_nums,
            config.perm,
            config.topic_sys_flag,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QueueData:
        return cls(
            broker_name=str(data["brokerName"]),
            read_queue_nums=int(data["readQueueNums"]),
            write_queue_nums=int(data["writeQueueNums"]),
            perm=int(data["perm"]),
        )


@dataclass(frozen=True)
class BrokerData:
    """One broker group as a route shows it: ``broker_addrs`` maps id to address."""

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)
    enable_acting_master: bool = False
    #: controller mode: the epoch of the master shown as id 0 (None: not controlled)
    epoch: int | None = None

    @property
    def master_addr(self) -> str | None:
        """The address shown as id 0 (master or acting master), if any."""
        return self.broker_addrs.get(MASTER_ID)

    def clone(self) -> BrokerData:
        return BrokerData(
            self.cluster,
            self.broker_name,
            dict(self.broker_addrs),
            self.enable_acting_master,
            self.epoch,
        )

    def to_json(self) -> dict[str, Any]:
        out = _members_to_json(self.cluster, self.broker_name, self.broker_addrs)
        if self.epoch is not None:
            out["epoch"] = self.epoch
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BrokerData:
        addrs = _addrs_from_json(data)
        return cls(
            cluster=str(data["cluster"]),
            broker_name=str(data["brokerName"]),
            broker_addrs=addrs,
            enable_acting_master=bool(data.get("enableActingMaster", False)),
            epoch=int(data["epoch"]) if data.get("epoch") is not None else None,
        )


@dataclass(frozen=True)
class TopicRouteData:
    """A topic's route: groups sorted by name, queue data sorted by group name."""

    topic: str
    broker_datas: list[BrokerData] = field(default_factory=list)
    queue_datas: list[QueueData] = field(default_factory=list)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "broker_datas", sorted(self.broker_datas, key=lambda b: b.broker_name)
        )
        object.__setattr__(
            self, "queue_datas", sorted(self.queue_datas, key=lambda q: q.broker_name)
        )

    def broker(self, broker_name: str) -> BrokerData | None:
        for broker_data in self.broker_datas:
            if broker_data.broker_name == broker_name:
                return broker_data
        return None

    def queue(self, broker_name: str) -> QueueData | None:
        for queue_data in self.queue_datas:
            if queue_data.broker_name == broker_name:
                return queue_data
        return None

    def to_json(self) -> dict[str, Any]:
        """The ``GET /api/v1/routes/{topic}`` shape: ``{"topic", "brokers", "queues"}``."""
        return {
            "topic": self.topic,
            "brokers": [b.to_json() for b in self.broker_datas],
            "queues": [q.to_json() for q in self.queue_datas],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TopicRouteData:
        return cls(
            topic=str(data["topic"]),
            broker_datas=[BrokerData.from_json(b) for b in data.get("brokers", [])],
            queue_datas=[QueueData.from_json(q) for q in data.get("queues", [])],
        )


@dataclass(frozen=True)
class BrokerMemberGroup:
    """A group's members with their raw ids (never rewritten), and, while it has no
    master, the id of the slave the nameserver chose to act for it."""

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)
    acting_broker_id: int | None = None
    #: while a master is listed: ms since the nameserver last heard from it (None: the
    #: nameserver did not say)
    master_heard_ms_ago: int | None = None
    #: the highest commit-log end a member of the group reported to that nameserver
    #: since it started, members gone or not (None: not said)
    max_offset_seen: int | None = None

    def minimum_broker_id(self) -> int:
        """0 when the group is empty, else the lowest member id."""
        return min(self.broker_addrs) if self.broker_addrs else MASTER_ID

    def lead_broker_id(self) -> int:
        """Who leads the group: the master (0) when it is a member, else the chosen
        acting slave, else (a nameserver that does not choose) the lowest member id;
        :data:`SETTLING` while the nameserver has not chosen yet (nobody acts)."""
        if MASTER_ID in self.broker_addrs:
            return MASTER_ID
        if self.acting_broker_id == SETTLING:
            return SETTLING
        if self.acting_broker_id is not None and self.acting_broker_id in self.broker_addrs:
            return self.acting_broker_id
        return self.minimum_broker_id()

    def to_json(self) -> dict[str, Any]:
        data = _members_to_json(self.cluster, self.broker_name, self.broker_addrs)
        if self.acting_broker_id is not None:
            data["actingBrokerId"] = self.acting_broker_id
        if self.master_heard_ms_ago is not None:
            data["masterHeardMsAgo"] = self.master_heard_ms_ago
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BrokerMemberGroup:
        addrs = _addrs_from_json(data)
        acting = data.get("actingBrokerId")
        heard = data.get("masterHeardMsAgo")
        return cls(
            str(data["cluster"]),
            str(data["brokerName"]),
            addrs,
            None if acting is None else int(acting),
            None if heard is None else int(heard),
        )
