"""Admin client for the nameserver (routes, cluster info, member groups) and for the
topics on the brokers it lists (create, update, delete, tables, queue offsets, messages
by key or id)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import ssl
from dataclasses import dataclass, field
from typing import Final

from google.protobuf.message import Message

from ha_controller.acl import Credentials
from ha_controller.client.lifecycle import AsyncLifecycle
from ha_controller.proto import broker_pb2, common_pb2, nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    BrokerUnavailable,
    HaError,
    RequestTimeout,
    TopicNotFound,
    UnknownMethod,
)
from ha_controller.protocol.topics import TopicMessageType
from ha_controller.routing import BrokerMemberGroup, TopicConfig, TopicRouteData
from ha_controller.rpc import ConnectionPool
from ha_controller.rpc.connection import M
from ha_controller.wire import (
    member_group_from_pb,
    route_from_pb,
    topic_config_from_pb,
    topic_config_to_pb,
)

__all__ = [
    "ConsumerLag",
    "GroupInfo",
    "GroupLag",
    "MessageQuery",
    "NameserverClient",
    "NameserverUnavailable",
    "QueueOffsets",
    "TopicDeletion",
    "TopicExists",
]

#: Timeout of one admin request to a broker.
BROKER_ADMIN_TIMEOUT_MS = 5000


class NameserverUnavailable(BrokerUnavailable):
    """No nameserver of the list answered; the message names each address and why.

    Local only: on the wire it would travel as BrokerUnavailable."""


class TopicExists(HaError, ValueError):
    """``create_topic(exist_ok=False)`` found the topic on a master (local only)."""

    def __init__(self, topic: str, configs: dict[str, TopicConfig]) -> None:
        where = ", ".join(
            f"{group} ({c.read_queue_nums}/{c.write_queue_nums} queues, perm {c.perm})"
            for group, c in sorted(configs.items())
        )
        super().__init__(f"topic {topic} already exists on {where}")
        self.topic = topic
        self.configs = configs


@dataclass(frozen=True)
class QueueOffsets:
    """One queue of a topic as its group's id-0 broker holds it."""

    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int

    @property
    def messages(self) -> int:
        return max(0, self.max_offset - self.min_offset)


@dataclass(frozen=True)
class ConsumerLag:
    """One queue as a consumer group has consumed it (GET_CONSUME_STATS)."""

    topic: str
    broker_name: str
    queue_id: int
    #: the queue's max offset (the next offset to be written)
    max_offset: int
    #: the group's committed offset; -1 when it committed none for this queue
    consumer_offset: int
    lag: int
    #: how long the oldest unconsumed message has waited, by the broker's clock;
    #: None when none waits
    oldest_age_ms: int | None


@dataclass
class GroupLag:
    """``consumer_lag``: the queues of every broker group that answered, which member
    answered for each (its broker id: 0, or the acting slave's), and why the others
    could not be asked."""

    group: str
    queues: list[ConsumerLag] = field(default_factory=list)
    answered_by: dict[str, int] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def lag(self) -> int:
        return sum(q.lag for q in self.queues)


@dataclass
class TopicDeletion:
    """What ``delete_topic`` did: the brokers that dropped the topic (``group/id``), the
    ones that failed (with the reason), and what each nameserver said."""

    topic: str
    deleted: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    #: nameservers that forgot the topic's route
    nameservers_forgot: list[str] = field(default_factory=list)
    #: nameservers that do not serve DELETE_TOPIC_IN_NAMESRV (or failed), with why
    nameservers_kept: dict[str, str] = field(default_factory=dict)


def _reason(exc: BaseException) -> str:
    """``connection refused``, ``timed out``, else the error's text."""
    e: BaseException | None = exc
    while e is not None:
        if isinstance(e, TimeoutError):
            return "timed out"
        if isinstance(e, OSError) and e.errno:
            return os.strerror(e.errno).lower()
        e = e.__cause__
    return str(exc) or type(exc).__name__


@dataclass(frozen=True)
class MessageQuery:
    """What ``hactl message query`` found: (broker that answered, message) pairs, and
    the groups that could not be asked, with why."""

    found: list[tuple[str, broker_pb2.QueriedMessage]]
    failed: dict[str, str]


@dataclass(frozen=True)
class GroupInfo:
    cluster: str
    broker_name: str
    enable_acting_master: bool
    members: dict[int, str]
    #: the slave the nameserver chose to act (None: the lowest id, as RIP-32 says)
    chosen_acting_id: int | None = None
    #: controller mode: the epoch, the master's member id and the sync-state set
    epoch: int | None = None
    master_member: int | None = None
    sync_state_set: tuple[int, ...] = ()

    @property
    def master_online(self) -> bool:
        return 0 in self.members

    @property
    def acting_broker_id(self) -> int | None:
        if self.master_online or not self.members or not self.enable_acting_master:
            return None
        if self.chosen_acting_id is not None and self.chosen_acting_id in self.members:
            return self.chosen_acting_id
        return min(self.members)


#: A nameserver read not answered within this long is asked of the next nameserver too
#: (a route is answered in about a millisecond; a frozen nameserver answers nothing).
HEDGE_AFTER_MS: Final = 300


class NameserverClient(AsyncLifecycle):
    """Talks to one of several nameservers, moving on when one fails.

    Its connections (to nameservers, and to brokers for the topic commands) come from
    ``pool``, else from its own pool with ``tls`` (an ``ssl.SSLContext``; None =
    plaintext) whose requests are signed with ``credentials`` (an ACL user; None =
    anonymous).  A :class:`~ha_controller.client.routes.RouteCache` uses the
    nameserver client it is given, and so its TLS."""

    def __init__(
        self,
        addrs: list[str],
        pool: ConnectionPool | None = None,
        *,
        tls: ssl.SSLContext | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        if not addrs:
            raise ValueError("at least one nameserver address is needed")
        if pool is not None and (tls is not None or credentials is not None):
            raise ValueError(
                "give tls and credentials to the ConnectionPool passed as pool, not to both"
            )
        self.addrs = list(addrs)
        self._own_pool = pool is None
        self.pool = pool or ConnectionPool(
            ssl_context=tls, signer=credentials.sign if credentials is not None else None
        )
        self._next = 0

    async def _call(
        self,
        method: int,
        req: Message,
        resp_type: type[M],
        timeout_ms: int = 3000,
        *,
        hedge_ms: int | None = HEDGE_AFTER_MS,
    ) -> M:
        """Ask the nameserver that answered last; when it fails, or (``hedge_ms``) has
        not answered within that time, ask the next one too, and take the first answer.
        A frozen nameserver then costs a read ``hedge_ms``, not the whole timeout (a
        long poll passes ``hedge_ms=None``: waiting is its answer)."""
        n = len(self.addrs)
        order = [(self._next + i) % n for i in range(n)]
        failures: list[tuple[str, BaseException]] = []
        pending: dict[asyncio.Future[M], int] = {}
        started = 0
        try:
            while started < n or pending:
                if started < n and (not pending or hedge_ms is not None):
                    k = order[started]
                    call = self.pool.call_pb(self.addrs[k], method, req, resp_type, timeout_ms)
                    pending[asyncio.ensure_future(call)] = k
                    started += 1
                hedge = hedge_ms / 1000 if hedge_ms is not None and started < n else None
                done, _ = await asyncio.wait(
                    pending, timeout=hedge, return_when=asyncio.FIRST_COMPLETED
                )
                for fut in done:
                    k = pending.pop(fut)
                    exc = fut.exception()
                    if exc is None:
                        self._next = k
                        return fut.result()
                    if not isinstance(exc, BrokerUnavailable | RequestTimeout | ConnectionError):
                        raise exc
                    failures.append((self.addrs[k], exc))
                    await self.pool.discard(self.addrs[k])
        finally:
            for fut in pending:
                fut.cancel()
        where = ", ".join(f"{addr} ({_reason(exc)})" for addr, exc in failures)
        noun = "the nameserver at" if len(failures) == 1 else "any nameserver:"
        raise NameserverUnavailable(f"cannot reach {noun} {where}") from failures[-1][1]

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
            hedge_ms=None,
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
        out: list[GroupInfo] = []
        for b in pb.brokers:
            state = pb.controller.get(b.broker_name)
            out.append(
                GroupInfo(
                    b.cluster,
                    b.broker_name,
                    b.enable_acting_master,
                    dict(b.broker_addrs),
                    b.acting_broker_id if b.HasField("acting_broker_id") else None,
                    epoch=None if state is None else state.epoch,
                    master_member=None if state is None else state.master_member,
                    sync_state_set=() if state is None else tuple(sorted(state.sync_state_set)),
                )
            )
        return out

    async def switch_master(
        self, cluster: str, group: str, target: int, *, timeout_ms: int = 3000
    ) -> nameserver_pb2.ElectMasterResponse:
        """``hactl group switch``: make member ``target`` the group's master (controller
        mode; the master pauses its writes until the target holds them all)."""
        return await self._call(
            RequestCode.CONTROLLER_ELECT_MASTER,
            nameserver_pb2.ElectMasterRequest(
                cluster=cluster, broker_name=group, target_member=target, timeout_ms=timeout_ms
            ),
            nameserver_pb2.ElectMasterResponse,
            timeout_ms=timeout_ms + 5000,
            hedge_ms=None,  # one nameserver decides; asking two would race them
        )

    # ---- topics on the brokers --------------------------------------------------------

    async def _masters(self, cluster: str | None) -> list[tuple[str, str]]:
        """(group name, master address) of every group of ``cluster`` whose master is
        online."""
        return [
            (g.broker_name, g.members[0])
            for g in await self.groups()
            if (not cluster or g.cluster == cluster) and g.master_online
        ]

    async def broker_topics(self, addr: str) -> dict[str, TopicConfig]:
        """The topic table of the broker at ``addr`` (GET_ALL_TOPIC_CONFIG)."""
        pb = await self.pool.call_pb(
            addr,
            RequestCode.GET_ALL_TOPIC_CONFIG,
            common_pb2.Empty(),
            broker_pb2.TopicConfigTable,
            BROKER_ADMIN_TIMEOUT_MS,
        )
        return {t.topic_name: topic_config_from_pb(t) for t in pb.topics}

    async def topic_tables(self, cluster: str | None = None) -> dict[str, dict[str, TopicConfig]]:
        """Group name -> its topic table, read from the lowest id of each group (the
        master, else the slave that acts for it)."""
        groups = [
            g for g in await self.groups() if g.members and (not cluster or g.cluster == cluster)
        ]
        tables = await asyncio.gather(
            *(self.broker_topics(g.members[min(g.members)]) for g in groups)
        )
        return {g.broker_name: t for g, t in zip(groups, tables, strict=True)}

    async def _upsert(self, addr: str, config: TopicConfig) -> None:
        await self.pool.call_pb(
            addr,
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            broker_pb2.CreateTopicRequest(topic=topic_config_to_pb(config)),
            common_pb2.Empty,
            BROKER_ADMIN_TIMEOUT_MS,
        )

    async def create_topic(
        self,
        topic: str,
        *,
        cluster: str | None = None,
        queues: int = 4,
        perm: int = 6,
        exist_ok: bool = True,
        message_type: TopicMessageType = TopicMessageType.MIXED,
    ) -> list[str]:
        """Create a topic on every master (of ``cluster``); returns their group names.

        With ``exist_ok`` (the default, RocketMQ's UPDATE_AND_CREATE_TOPIC) an existing
        topic is replaced by the new settings; without it TopicExists is raised, before
        anything changes, when a master already has the topic.  ``message_type``: the
        kind of messages it takes (MIXED: all; ``hactl topic create`` makes NORMAL
        topics unless told otherwise, as RocketMQ)."""
        masters = await self._masters(cluster)
        if not exist_ok:
            tables = await asyncio.gather(*(self.broker_topics(addr) for _, addr in masters))
            found = {
                group: table[topic]
                for (group, _), table in zip(masters, tables, strict=True)
                if topic in table
            }
            if found:
                raise TopicExists(topic, found)
        config = TopicConfig(topic, queues, queues, perm, message_type=message_type)
        for _, addr in masters:
            await self._upsert(addr, config)
        return [group for group, _ in masters]

    async def subscription_groups(self, addr: str) -> dict[str, bool]:
        """Consumer group -> consume orderly, of the broker at ``addr``
        (GET_ALL_SUBSCRIPTIONGROUP_CONFIG)."""
        pb = await self.pool.call_pb(
            addr,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
            common_pb2.Empty(),
            broker_pb2.SubscriptionGroupTable,
            BROKER_ADMIN_TIMEOUT_MS,
        )
        return {g.group_name: g.consume_orderly for g in pb.groups}

    async def subscription_group(
        self, group: str, cluster: str | None = None
    ) -> dict[str, bool | None]:
        """Broker group name -> whether consumer group ``group`` consumes orderly there
        (None: not configured), from every online master (of ``cluster``)."""
        masters = await self._masters(cluster)
        tables = await asyncio.gather(*(self.subscription_groups(addr) for _, addr in masters))
        return {name: table.get(group) for (name, _), table in zip(masters, tables, strict=True)}

    async def consumer_lag(
        self, group: str, *, topic: str | None = None, cluster: str | None = None
    ) -> GroupLag:
        """Consumer group ``group``'s lag on every queue of every broker group (of
        ``cluster``), asked of each group's master, or of the slave acting for it
        (GET_CONSUME_STATS, RocketMQ 208): what ``hactl group lag`` shows, from the
        brokers that export ``rocketmq_consumer_lag_messages``."""
        result = GroupLag(group)
        groups = [g for g in await self.groups() if not cluster or g.cluster == cluster]
        request = broker_pb2.ConsumeStatsRequest(consumer_group=group, topic=topic or "")

        async def ask(g: GroupInfo) -> broker_pb2.ConsumeStats | None:
            lead = 0 if g.master_online else g.acting_broker_id
            if lead is None:
                result.failed[g.broker_name] = "no master online and no slave acting for it"
                return None
            try:
                return await self.pool.call_pb(
                    g.members[lead],
                    RequestCode.GET_CONSUME_STATS,
                    request,
                    broker_pb2.ConsumeStats,
                    BROKER_ADMIN_TIMEOUT_MS,
                )
            except (HaError, OSError) as exc:
                result.failed[g.broker_name] = f"{type(exc).__name__}: {exc}"
                return None

        for g, pb in zip(groups, await asyncio.gather(*(ask(g) for g in groups)), strict=True):
            if pb is None:
                continue
            result.answered_by[g.broker_name] = int(pb.broker_id)
            result.queues += [
                ConsumerLag(
                    q.topic,
                    g.broker_name,
                    q.queue_id,
                    q.broker_offset,
                    q.consumer_offset,
                    q.lag,
                    max(0, pb.now_ms - q.oldest_store_ts_ms) if q.oldest_store_ts_ms else None,
                )
                for q in pb.queues
            ]
        result.queues.sort(key=lambda q: (q.topic, q.broker_name, q.queue_id))
        return result

    async def update_subscription_group(
        self, group: str, *, orderly: bool, cluster: str | None = None
    ) -> list[str]:
        """Set consumer group ``group``'s config (RocketMQ's consumeMessageOrderly) on
        every online master (of ``cluster``); returns their group names."""
        masters = await self._masters(cluster)
        config = broker_pb2.SubscriptionGroupConfig(group_name=group, consume_orderly=orderly)
        for _, addr in masters:
            await self.pool.call_pb(
                addr,
                RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                broker_pb2.UpdateSubscriptionGroupRequest(config=config),
                common_pb2.Empty,
                BROKER_ADMIN_TIMEOUT_MS,
            )
        return [name for name, _ in masters]

    async def update_topic(
        self,
        topic: str,
        *,
        cluster: str | None = None,
        read_queues: int | None = None,
        write_queues: int | None = None,
        perm: int | None = None,
        message_type: TopicMessageType | None = None,
    ) -> dict[str, tuple[TopicConfig, TopicConfig]]:
        """Change only the given settings of ``topic`` on every master (of ``cluster``)
        that has it; group name -> (before, after).  TopicNotFound when none has it."""
        masters = await self._masters(cluster)
        tables = await asyncio.gather(*(self.broker_topics(addr) for _, addr in masters))
        changes: dict[str, tuple[TopicConfig, TopicConfig]] = {}
        for (group, addr), table in zip(masters, tables, strict=True):
            before = table.get(topic)
            if before is None:
                continue
            after = dataclasses.replace(
                before,
                read_queue_nums=before.read_queue_nums if read_queues is None else read_queues,
                write_queue_nums=before.write_queue_nums if write_queues is None else write_queues,
                perm=before.perm if perm is None else perm,
                message_type=before.message_type if message_type is None else message_type,
            )
            if after != before:
                await self._upsert(addr, after)
            changes[group] = (before, after)
        if not changes:
            where = f"cluster {cluster}" if cluster else "the cluster"
            raise TopicNotFound(f"topic {topic} is on no master of {where}")
        return changes

    async def delete_topic(self, topic: str, *, cluster: str | None = None) -> TopicDeletion:
        """Delete ``topic`` on every broker (of ``cluster``) that has it, masters first
        (each re-registers without it), then ask every nameserver to forget its route
        (DELETE_TOPIC_IN_NAMESRV, RocketMQ 216).  A broker that cannot be asked is in
        ``failed``; ``deleted`` is empty when no broker had the topic."""
        result = TopicDeletion(topic)
        groups = [g for g in await self.groups() if not cluster or g.cluster == cluster]
        members = sorted(
            ((broker_id != 0, g.broker_name, broker_id), addr)
            for g in groups
            for broker_id, addr in g.members.items()
        )  # masters first
        request = broker_pb2.CreateTopicRequest(topic=common_pb2.TopicConfig(topic_name=topic))

        async def holds(addr: str) -> bool:
            return topic in await self.broker_topics(addr)

        for (_, group, broker_id), addr in members:
            name = f"{group}/{broker_id}"
            try:
                if not await holds(addr):
                    continue
                await self.pool.call_pb(
                    addr,
                    RequestCode.DELETE_TOPIC_IN_BROKER,
                    request,
                    common_pb2.Empty,
                    BROKER_ADMIN_TIMEOUT_MS,
                )
            except (HaError, OSError) as exc:
                result.failed[name] = f"{type(exc).__name__}: {exc}"
            else:
                result.deleted.append(name)
        forget = nameserver_pb2.GetRouteInfoRequest(topic=topic)
        for addr in self.addrs:
            try:
                await self.pool.call_pb(
                    addr, RequestCode.DELETE_TOPIC_IN_NAMESRV, forget, common_pb2.Empty, 3000
                )
            except UnknownMethod:
                try:  # nothing to forget is not a failure
                    await self.pool.call_pb(
                        addr,
                        RequestCode.GET_ROUTEINFO_BY_TOPIC,
                        forget,
                        common_pb2.TopicRoute,
                        3000,
                    )
                except TopicNotFound:
                    result.nameservers_forgot.append(addr)
                except (HaError, OSError) as exc:
                    result.nameservers_kept[addr] = f"{type(exc).__name__}: {exc}"
                else:
                    result.nameservers_kept[addr] = (
                        "it does not serve DELETE_TOPIC_IN_NAMESRV (216)"
                    )
            except (HaError, OSError) as exc:
                result.nameservers_kept[addr] = f"{type(exc).__name__}: {exc}"
            else:
                result.nameservers_forgot.append(addr)
        return result

    async def queue_offsets(self, route: TopicRouteData) -> list[QueueOffsets]:
        """Min and max offset of every readable queue of ``route``, from the id-0 broker
        of each group (the lowest id when the route shows no id 0)."""

        async def offset(addr: str, method: int, topic: str, queue_id: int) -> int:
            pb = await self.pool.call_pb(
                addr,
                method,
                broker_pb2.QueueOffsetRequest(topic=topic, queue_id=queue_id),
                broker_pb2.OffsetResponse,
                BROKER_ADMIN_TIMEOUT_MS,
            )
            return int(pb.offset)

        async def one(broker_name: str, addr: str, queue_id: int) -> QueueOffsets:
            lo, hi = await asyncio.gather(
                offset(addr, RequestCode.GET_MIN_OFFSET, route.topic, queue_id),
                offset(addr, RequestCode.GET_MAX_OFFSET, route.topic, queue_id),
            )
            return QueueOffsets(broker_name, queue_id, lo, hi)

        jobs = []
        for b in route.broker_datas:
            q = route.queue(b.broker_name)
            if q is None or not b.broker_addrs:
                continue
            addr = b.broker_addrs.get(0) or b.broker_addrs[min(b.broker_addrs)]
            jobs += [one(b.broker_name, addr, i) for i in range(q.read_queue_nums)]
        return list(await asyncio.gather(*jobs))

    async def query_messages(
        self,
        *,
        topic: str | None = None,
        key: str | None = None,
        msg_id: str | None = None,
        begin_ms: int = 0,
        end_ms: int = 0,
        max_num: int = 0,
        cluster: str | None = None,
    ) -> MessageQuery:
        """Messages of ``topic`` by message ``key`` (QUERY_MESSAGE), or by ``msg_id``
        (VIEW_MESSAGE_BY_ID), asked of every broker group (of the topic's route, or of
        ``cluster``) at its master, or at its acting slave when the master is away;
        merged newest first."""
        if (key is None) == (msg_id is None):
            raise ValueError("give a key or a message id")
        groups = await self.groups()
        if key is not None:
            if not topic:
                raise ValueError("a key query needs a topic")
            route = await self.route(topic)
            names = {b.broker_name for b in route.broker_datas}
            groups = [g for g in groups if g.broker_name in names]
        elif cluster:
            groups = [g for g in groups if g.cluster == cluster]
        req: Message
        if key is not None:
            method = RequestCode.QUERY_MESSAGE
            req = broker_pb2.QueryMessageRequest(
                topic=topic, key=key, begin_ms=begin_ms, end_ms=end_ms, max_num=max_num
            )
        else:
            method = RequestCode.VIEW_MESSAGE_BY_ID
            req = broker_pb2.ViewMessageRequest(msg_id=msg_id, max_num=max_num)
        failed: dict[str, str] = {}

        async def ask(g: GroupInfo) -> list[tuple[str, broker_pb2.QueriedMessage]]:
            serving = 0 if g.master_online else g.acting_broker_id
            if serving is None:
                failed[g.broker_name] = "no master or acting slave online"
                return []
            try:
                pb = await self.pool.call_pb(
                    g.members[serving],
                    method,
                    req,
                    broker_pb2.QueryMessageResponse,
                    BROKER_ADMIN_TIMEOUT_MS,
                )
            except (HaError, OSError) as exc:
                failed[g.broker_name] = _reason(exc)
                return []
            return [(pb.broker_name, m) for m in pb.messages]

        per_group = await asyncio.gather(*(ask(g) for g in groups))
        found = [pair for answer in per_group for pair in answer]
        found.sort(key=lambda p: (-p[1].store_ts_ms, p[0], p[1].queue_id, p[1].queue_offset))
        return MessageQuery(found, failed)

    async def aclose(self) -> None:
        if self._own_pool:
            await self.pool.aclose()
