"""Admin client for the nameserver: routes, cluster info, member groups."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import Message

from ha_controller.proto import common_pb2, nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BrokerUnavailable, HaError, RequestTimeout
from ha_controller.routing import BrokerMemberGroup, TopicRouteData
from ha_controller.rpc import ConnectionPool
from ha_controller.rpc.connection import M
from ha_controller.wire import member_group_from_pb, route_from_pb


@dataclass(frozen=True)
class GroupInfo:
    cluster: str
    broker_name: str
    enable_acting_master: bool
    members: dict[int, str]

    @property
    def master_online(self) -> bool:
        return 0 in self.members

    @property
    def acting_broker_id(self) -> int | None:
        if self.master_online or not self.members or not self.enable_acting_master:
            return None
        return min(self.members)


class NameserverClient:
    """Talks to one of several nameservers, moving on when one fails."""

    def __init__(self, addrs: list[str], pool: ConnectionPool | None = None) -> None:
        if not addrs:
            raise ValueError("at least one nameserver address is needed")
        self.addrs = list(addrs)
        self._own_pool = pool is None
        self.pool = pool or ConnectionPool()
        self._next = 0

    async def _call(
        self, method: int, req: Message, resp_type: type[M], timeout_ms: int = 3000
    ) -> M:
        last: HaError | None = None
        for i in range(len(self.addrs)):
            addr = self.addrs[(self._next + i) % len(self.addrs)]
            try:
                out = await self.pool.call_pb(addr, method, req, resp_type, timeout_ms)
            except (BrokerUnavailable, RequestTimeout, ConnectionError) as exc:
                last = exc if isinstance(exc, HaError) else BrokerUnavailable(str(exc))
                await self.pool.discard(addr)
                continue
            self._next = (self._next + i) % len(self.addrs)
            return out
        assert last is not None
        raise last

    async def route(self, topic: str) -> TopicRouteData:
        pb = await self._call(
            RequestCode.GET_ROUTEINFO_BY_TOPIC,
            nameserver_pb2.GetRouteInfoRequest(topic=topic),
            common_pb2.TopicRoute,
        )
        return route_from_pb(pb)

    async def watch_route(
        self, topic: str, known_version: str, max_wait_ms: int = 30000
    ) -> tuple[str, TopicRouteData | None]:
        pb = await self._call(
            RequestCode.WATCH_ROUTE,
            nameserver_pb2.WatchRouteRequest(
                topic=topic, known_version=known_version, max_wait_ms=max_wait_ms
            ),
            nameserver_pb2.WatchRouteResponse,
            timeout_ms=max_wait_ms + 2000,
        )
        return pb.version, route_from_pb(pb.route) if pb.found else None

    async def member_group(self, cluster: str, broker_name: str) -> BrokerMemberGroup:
        pb = await self._call(
            RequestCode.GET_BROKER_MEMBER_GROUP,
            nameserver_pb2.GetBrokerMemberGroupRequest(cluster=cluster, broker_name=broker_name),
            nameserver_pb2.BrokerMemberGroup,
        )
        return member_group_from_pb(pb)

    async def groups(self) -> list[GroupInfo]:
        pb = await self._call(
            RequestCode.GET_BROKER_CLUSTER_INFO, common_pb2.Empty(), nameserver_pb2.ClusterInfo
        )
        return [
            GroupInfo(b.cluster, b.broker_name, b.enable_acting_master, dict(b.broker_addrs))
            for b in pb.brokers
        ]

    async def create_topic(
        self, topic: str, *, cluster: str | None = None, queues: int = 4, perm: int = 6
    ) -> list[str]:
        """Create or update a topic on every master (of ``cluster``); returns their names."""
        from ha_controller.proto import broker_pb2

        config = common_pb2.TopicConfig(
            topic_name=topic, read_queue_nums=queues, write_queue_nums=queues, perm=perm
        )
        done = []
        for group in await self.groups():
            if cluster and group.cluster != cluster:
                continue
            master = group.members.get(0)
            if master is None or not group.master_online:
                continue
            await self.pool.call_pb(
                master,
                RequestCode.UPDATE_AND_CREATE_TOPIC,
                broker_pb2.CreateTopicRequest(topic=config),
                common_pb2.Empty,
            )
            done.append(group.broker_name)
        return done

    async def aclose(self) -> None:
        if self._own_pool:
            await self.pool.aclose()

    async def __aenter__(self) -> NameserverClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
