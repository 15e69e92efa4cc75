"""Where an escape may go: the writable masters of other groups, from a route at most
:data:`ROUTE_MAX_AGE_S` old (and a group's members, for reading a message back), and the
stable hash that pins every POP checkpoint and ack of a slave for a topic to one remote
queue.  Used by the escape bridge (:mod:`broker_agent.special.escape`).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ha_controller.client.admin import NameserverClient
from ha_controller.client.routes import DEFAULT_TOPIC_QUEUE_NUMS, publish_queues_of
from ha_controller.protocol.errors import TopicNotFound
from ha_controller.routing import TopicRouteData

__all__ = ["ROUTE_MAX_AGE_S", "EscapeRoutes", "RemoteQueue", "remote_queues", "stable_hash"]


#: How old a cached route may be before a remote escape fetches it again.
#: RocketMQ's broker-side cache refreshes every 30 s
#: (``loadBalancePollNameServerInterval``); a stale route is exactly how it
#: escaped to dead masters (issue #7923), so ours is at most a second old.
ROUTE_MAX_AGE_S: Final = 1.0


@dataclass(frozen=True, order=True)
class RemoteQueue:
    """A write queue of a master of another group, with that master's address."""

    broker_name: str
    queue_id: int
    addr: str


def stable_hash(text: str) -> int:
    """A hash that is the same in every process and run (unlike ``hash()``)."""
    return zlib.crc32(text.encode())


def remote_queues(route: TopicRouteData, own_group: str) -> list[RemoteQueue]:
    """Writable queues of groups that show a master (id 0), excluding ``own_group``.

    The nameserver shows a group's acting slave as a read-only id 0, so an
    acting group never appears here (publish rules of
    ``topicRouteData2TopicPublishInfo``).
    """
    out: list[RemoteQueue] = []
    for mq in publish_queues_of(route):
        if mq.broker_name == own_group:
            continue
        broker = route.broker(mq.broker_name)
        addr = None if broker is None else broker.broker_addrs.get(0)
        if addr:
            out.append(RemoteQueue(mq.broker_name, mq.queue_id, addr))
    return sorted(out)


class EscapeRoutes:
    """Broker-side route lookups for remote escape: fresh (at most ``max_age_s``
    old), refreshed on a miss, dropped after a failed send."""

    def __init__(
        self,
        nameserver: NameserverClient,
        cluster: str,
        *,
        max_age_s: float = ROUTE_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nameserver = nameserver
        self.cluster = cluster
        self.max_age_s = max_age_s
        self._clock = clock
        self._routes: dict[str, tuple[float, TopicRouteData | None]] = {}
        self._fallback: tuple[float, list[tuple[str, str]]] | None = None

    def invalidate(self, topic: str | None = None) -> None:
        if topic is None:
            self._routes.clear()
        else:
            self._routes.pop(topic, None)
        self._fallback = None

    async def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData | None:
        """The topic's route (None when the nameserver does not know it)."""
        now = self._clock()
        cached = self._routes.get(topic)
        if not refresh and cached is not None and now - cached[0] < self.max_age_s:
            return cached[1]
        try:
            route: TopicRouteData | None = await self.nameserver.route(topic)
        except TopicNotFound:
            route = None
        self._routes[topic] = (now, route)
        return route

    async def _masters_of_cluster(self, *, refresh: bool) -> list[tuple[str, str]]:
        """(group, master address) of every group of our cluster whose master is online."""
        now = self._clock()
        if not refresh and self._fallback is not None and now - self._fallback[0] < self.max_age_s:
            return self._fallback[1]
        groups = await self.nameserver.groups()
        masters = sorted(
            (g.broker_name, g.members[0])
            for g in groups
            if g.master_online and (not self.cluster or g.cluster == self.cluster)
        )
        self._fallback = (now, masters)
        return masters

    async def queues(
        self, topic: str, own_group: str, *, refresh: bool = False
    ) -> list[RemoteQueue]:
        """Write queues of other groups' masters for ``topic``.

        A topic that no other master serves yet falls back to every online
        master of the cluster with the default queue count: the target
        auto-creates the topic, as a producer's first send would.
        """
        route = await self.route(topic, refresh=refresh)
        found = [] if route is None else remote_queues(route, own_group)
        if not found and not refresh:
            route = await self.route(topic, refresh=True)  # refresh on a miss
            found = [] if route is None else remote_queues(route, own_group)
        if found:
            return found
        masters = await self._masters_of_cluster(refresh=refresh)
        return [
            RemoteQueue(name, qid, addr)
            for name, addr in masters
            if name != own_group
            for qid in range(DEFAULT_TOPIC_QUEUE_NUMS)
        ]

    async def group_addrs(self, topic: str, group: str) -> dict[int, str]:
        """Addresses of ``group`` by broker id: from the topic's route, else its member group."""
        for refresh in (False, True):
            route = await self.route(topic, refresh=refresh)
            broker = None if route is None else route.broker(group)
            if broker is not None and broker.broker_addrs:
                return dict(broker.broker_addrs)
        try:
            members = await self.nameserver.member_group(self.cluster, group)
        except TopicNotFound:
            return {}
        return dict(members.broker_addrs)
