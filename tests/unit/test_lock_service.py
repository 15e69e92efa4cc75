"""LOCK_BATCH_MQ / UNLOCK_BATCH_MQ with strict mode (quorum locks).

Each fake broker is a real ``LockService`` behind a real ``RpcServer`` on port 0,
around a small host object instead of a whole ``BrokerService``; the quorum
round goes over TCP.  Dead peers are closed ports, slow peers are servers
whose handler sleeps.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fakes import FakeClock

from broker_agent.locks.manager import MessageQueueKey
from broker_agent.locks.service import LockService, mq_from_pb, mq_to_pb
from broker_agent.membership.acting import ActingState
from broker_agent.metrics import BrokerMetrics
from ha_controller.config import BrokerConfig
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BrokerIsolated, NotMaster, QuorumNotReached
from ha_controller.routing import BrokerMemberGroup
from ha_controller.rpc import ConnectionPool, Dispatcher, RequestContext, RpcServer

GROUP = "CID_order"
C1 = "10.0.0.1@1"
C2 = "10.0.0.2@1"
MQS = [MessageQueueKey("T", "broker-a", i) for i in range(3)]
PEER_TIMEOUT_MS = 300


@dataclass
class FakeHost:
    """The parts of a ``BrokerCore`` the lock service uses, and the member-group fetch."""

    cfg: BrokerConfig
    acting: ActingState
    pool: ConnectionPool
    metrics: BrokerMetrics
    isolated: bool = False
    member_group: BrokerMemberGroup | None = None
    nameserver_group: BrokerMemberGroup | None = None
    fetches: int = 0

    async def fetch_member_group(self) -> BrokerMemberGroup | None:
        self.fetches += 1
        return self.nameserver_group


@dataclass
class Node:
    host: FakeHost
    service: LockService
    server: RpcServer
    addr: str = ""

    def held(self) -> dict[MessageQueueKey, str]:
        return self.service.held(GROUP)

    def count(self, mode: str, result: str) -> float:
        m = self.host.metrics
        value = m.registry.get_sample_value(
            "hac_lock_requests_total", {**m.ident, "mode": mode, "result": result}
        )
        return value or 0.0


@dataclass
class Group:
    nodes: dict[int, Node] = field(default_factory=dict)
    client: ConnectionPool = field(default_factory=ConnectionPool)
    extra: list[RpcServer] = field(default_factory=list)

    def publish(self, addrs: dict[int, str]) -> None:
        for node in self.nodes.values():
            node.host.member_group = BrokerMemberGroup("c1", "broker-a", dict(addrs))

    async def lock(
        self, broker_id: int, client_id: str, mqs: list[MessageQueueKey], *, vote: bool = False
    ) -> set[MessageQueueKey]:
        response = await self.client.call_pb(
            self.nodes[broker_id].addr,
            RequestCode.LOCK_BATCH_MQ,
            request(client_id, mqs, vote),
            broker_pb2.LockBatchResponse,
            5000,
        )
        return {mq_from_pb(pb) for pb in response.locked}

    async def unlock(
        self, broker_id: int, client_id: str, mqs: list[MessageQueueKey], *, vote: bool = False
    ) -> None:
        await self.client.call_pb(
            self.nodes[broker_id].addr,
            RequestCode.UNLOCK_BATCH_MQ,
            request(client_id, mqs, vote),
            common_pb2.Empty,
            5000,
        )


def request(client_id: str, mqs: list[MessageQueueKey], vote: bool) -> broker_pb2.LockBatchRequest:
    return broker_pb2.LockBatchRequest(
        consumer_group=GROUP,
        client_id=client_id,
        mqs=[mq_to_pb(mq) for mq in mqs],
        only_this_broker=vote,
    )


def config(broker_id: int, *, strict: bool = True, total: int = 3) -> BrokerConfig:
    return BrokerConfig(
        broker_name="broker-a",
        broker_id=broker_id,
        namesrv_addrs=("127.0.0.1:9876",),
        lock_in_strict_mode=strict,
        total_replicas=total,
        in_sync_replicas=1,
        lock_peer_timeout_ms=PEER_TIMEOUT_MS,
    )


async def start_node(
    cfg: BrokerConfig,
    *,
    acting: bool = False,
    marker: Path | None = None,
    clock: Callable[[], int] | None = None,
) -> Node:
    """``clock`` (ms) is both the lock clock and the wall clock of the vote marker."""
    state = ActingState(cfg.broker_id, True)
    if acting:
        state.on_min_broker_change(cfg.broker_id, "acting")
    host = FakeHost(
        cfg=cfg,
        acting=state,
        pool=ConnectionPool(connect_timeout_ms=1000),
        metrics=BrokerMetrics(cfg.cluster, cfg.broker_name, cfg.broker_id),
    )
    if clock is None:
        service = LockService(host, host.fetch_member_group, marker=marker)
    else:
        service = LockService(host, host.fetch_member_group, marker=marker, clock=clock, wall=clock)
    dispatcher = Dispatcher()
    service.register(dispatcher)
    server = RpcServer(dispatcher, name=f"lock-{cfg.broker_id}")
    host_, port = await server.start("127.0.0.1", 0)
    return Node(host, service, server, f"{host_}:{port}")


async def slow_server(delay_s: float) -> RpcServer:
    """A member that answers votes only after ``delay_s``."""

    async def vote(
        ctx: RequestContext, req: broker_pb2.LockBatchRequest
    ) -> broker_pb2.LockBatchResponse:
        await asyncio.sleep(delay_s)
        return broker_pb2.LockBatchResponse(locked=list(req.mqs))

    dispatcher = Dispatcher()
    dispatcher.add(RequestCode.LOCK_BATCH_MQ, broker_pb2.LockBatchRequest, vote)
    server = RpcServer(dispatcher, name="slow")
    await server.start("127.0.0.1", 0)
    return server


def dead_addr() -> str:
    """A local port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


GroupFactory = Callable[..., Awaitable[Group]]


@pytest.fixture
async def make_group() -> AsyncIterator[GroupFactory]:
    groups: list[Group] = []

    async def make(
        ids: tuple[int, ...] = (0, 1, 2), *, strict: bool = True, total: int = 3
    ) -> Group:
        group = Group()
        groups.append(group)
        for bid in ids:
            group.nodes[bid] = await start_node(config(bid, strict=strict, total=total))
        group.publish({bid: n.addr for bid, n in group.nodes.items()})
        return group

    yield make
    for group in groups:
        await group.client.aclose()
        for node in group.nodes.values():
            await node.server.aclose(grace_s=0.5)
            await node.host.pool.aclose()
        for server in group.extra:
            await server.aclose(grace_s=0.5)


async def test_non_strict_answers_from_the_local_lock_alone(make_group: GroupFactory) -> None:
    g = await make_group(strict=False)
    assert await g.lock(0, C1, MQS) == set(MQS)
    assert g.nodes[0].held() == dict.fromkeys(MQS, C1)
    assert g.nodes[1].held() == {} and g.nodes[2].held() == {}  # peers never asked
    assert g.nodes[0].count("local", "granted") == 1
    assert await g.lock(0, C2, MQS[:2]) == set()
    assert g.nodes[0].count("local", "refused") == 1


async def test_strict_grants_what_every_member_locked(make_group: GroupFactory) -> None:
    g = await make_group()
    assert await g.lock(0, C1, MQS) == set(MQS)
    for node in g.nodes.values():
        assert node.held() == dict.fromkeys(MQS, C1)
    assert g.nodes[0].count("strict", "granted") == 1
    assert g.nodes[1].count("peer", "granted") == 1
    assert g.nodes[2].count("peer", "granted") == 1
    # renewal by the holder is granted again; another client is refused everywhere
    assert await g.lock(0, C1, MQS) == set(MQS)
    assert await g.lock(0, C2, MQS) == set()
    assert g.nodes[1].count("peer", "granted") == 2  # the refused request never reached peers


async def test_strict_two_of_three_is_a_quorum(make_group: GroupFactory) -> None:
    g = await make_group()
    # slave 2 alone believes C2 holds MQS[0] (say it voted for C2 earlier)
    assert await g.lock(2, C2, MQS[:1], vote=True) == set(MQS[:1])
    assert await g.lock(0, C1, MQS) == set(MQS)  # MQS[0]: master + slave 1 = 2 of 3
    assert g.nodes[0].held() == dict.fromkeys(MQS, C1)
    assert g.nodes[2].held()[MQS[0]] == C2


async def test_strict_releases_locally_what_missed_quorum(make_group: GroupFactory) -> None:
    g = await make_group()
    # both slaves hold MQS[0] for C2: the master's own table is empty (it restarted)
    for bid in (1, 2):
        assert await g.lock(bid, C2, MQS[:1], vote=True) == set(MQS[:1])
    assert await g.lock(0, C1, MQS) == set(MQS[1:])
    held = g.nodes[0].held()
    assert MQS[0] not in held, "a queue that missed quorum must not stay locked locally"
    assert held == dict.fromkeys(MQS[1:], C1)
    assert g.nodes[0].count("strict", "partial") == 1
    # ... so once C2's copies are gone C1 may try again and win
    for bid in (1, 2):
        await g.unlock(bid, C2, MQS[:1], vote=True)
    assert await g.lock(0, C1, MQS[:1]) == set(MQS[:1])


async def test_acting_slave_with_one_dead_member_still_grants(make_group: GroupFactory) -> None:
    g = await make_group(ids=(1, 2))
    g.nodes[1].host.acting.on_min_broker_change(1, g.nodes[1].addr)
    assert g.nodes[1].host.acting.acting
    g.publish({0: dead_addr(), 1: g.nodes[1].addr, 2: g.nodes[2].addr})
    assert await g.lock(1, C1, MQS) == set(MQS)
    assert g.nodes[2].held() == dict.fromkeys(MQS, C1)


async def test_one_of_three_is_no_quorum(make_group: GroupFactory) -> None:
    g = await make_group(ids=(1,))
    g.nodes[1].host.acting.on_min_broker_change(1, g.nodes[1].addr)
    g.publish({0: dead_addr(), 1: g.nodes[1].addr, 2: dead_addr()})
    with pytest.raises(QuorumNotReached, match="1 of 3"):
        await g.lock(1, C1, MQS)
    assert g.nodes[1].held() == {}, "a lock that missed quorum must be released locally"
    assert g.nodes[1].count("strict", "no_quorum") == 1
    # the member group alone (dead ones already gone) gives the same answer
    g.publish({1: g.nodes[1].addr})
    with pytest.raises(QuorumNotReached):
        await g.lock(1, C1, MQS)


async def test_slow_peer_is_bounded_by_the_peer_timeout(make_group: GroupFactory) -> None:
    g = await make_group(ids=(0, 1))
    slow = await slow_server(5.0)
    g.extra.append(slow)
    g.publish({0: g.nodes[0].addr, 1: g.nodes[1].addr, 2: slow.bound})
    started = time.monotonic()
    assert await g.lock(0, C1, MQS) == set(MQS)
    elapsed = time.monotonic() - started
    assert PEER_TIMEOUT_MS / 1000 * 0.8 < elapsed < 2 * PEER_TIMEOUT_MS / 1000 + 0.5


async def test_slow_peers_cannot_make_a_quorum(make_group: GroupFactory) -> None:
    g = await make_group(ids=(0,))
    slow = [await slow_server(5.0) for _ in range(2)]
    g.extra.extend(slow)
    g.publish({0: g.nodes[0].addr, 1: slow[0].bound, 2: slow[1].bound})
    with pytest.raises(QuorumNotReached):
        await g.lock(0, C1, MQS)


async def test_plain_slave_refuses_requests_but_votes(make_group: GroupFactory) -> None:
    g = await make_group(strict=True)
    with pytest.raises(NotMaster):
        await g.lock(1, C1, MQS)
    with pytest.raises(NotMaster):
        await g.unlock(1, C1, MQS)
    assert await g.lock(1, C1, MQS, vote=True) == set(MQS)
    assert g.nodes[1].count("peer", "granted") == 1


async def test_isolated_master_refuses_requests_but_votes(make_group: GroupFactory) -> None:
    g = await make_group(strict=False)
    g.nodes[0].host.isolated = True
    with pytest.raises(BrokerIsolated):
        await g.lock(0, C1, MQS)
    assert await g.lock(0, C1, MQS, vote=True) == set(MQS)


async def test_strict_unlock_reaches_every_member(make_group: GroupFactory) -> None:
    g = await make_group()
    assert await g.lock(0, C1, MQS) == set(MQS)
    await g.unlock(0, C2, MQS)  # not the holder: nothing changes anywhere
    assert all(node.held() == dict.fromkeys(MQS, C1) for node in g.nodes.values())
    await g.unlock(0, C1, MQS[:2])
    for node in g.nodes.values():
        assert node.held() == {MQS[2]: C1}
    # now C2 gets the freed queues from a quorum
    assert await g.lock(0, C2, MQS) == set(MQS[:2])


async def test_non_strict_unlock_is_local(make_group: GroupFactory) -> None:
    g = await make_group(strict=False)
    for bid in (0, 1):
        await g.lock(bid, C1, MQS, vote=True)
    await g.unlock(0, C1, MQS)
    assert g.nodes[0].held() == {}
    assert g.nodes[1].held() == dict.fromkeys(MQS, C1)


async def test_quorum_of_one_is_local(make_group: GroupFactory) -> None:
    g = await make_group(ids=(0,), total=1)
    g.publish({0: g.nodes[0].addr, 1: dead_addr()})
    assert await g.lock(0, C1, MQS) == set(MQS)
    assert g.nodes[0].count("local", "granted") == 1


async def test_member_group_is_fetched_when_not_known_yet(make_group: GroupFactory) -> None:
    g = await make_group()
    node = g.nodes[0]
    node.host.nameserver_group, node.host.member_group = node.host.member_group, None
    assert await g.lock(0, C1, MQS) == set(MQS)
    assert node.host.fetches == 1
    node.host.nameserver_group = None  # no nameserver answers: no peers, 1 of 3
    with pytest.raises(QuorumNotReached):
        await g.lock(0, C2, [MessageQueueKey("T", "broker-a", 9)])
    assert node.held() == dict.fromkeys(MQS, C1)
    # a request whose queues are all held by others locally never starts a round
    assert await g.lock(0, C2, MQS) == set()


async def test_a_group_that_restarted_whole_grants_no_lock_for_one_lock_lifetime(
    make_group: GroupFactory, tmp_path: Path
) -> None:
    """Every member voted for C1's locks, then every member restarted (a power loss):
    none remembers, and C1 may still trust its locks.  Each started with its marker, so
    its own vote does not count until lock_max_live_time_ms after its last vote: C2 gets
    nothing until then.  One member restarted alone changes nothing: the others' votes
    make the quorum."""
    clock = FakeClock(1_000_000)
    g = await make_group()
    for bid, node in g.nodes.items():  # fresh members with markers: no marker yet
        await node.server.aclose(grace_s=0.5)
        g.nodes[bid] = await start_node(
            node.host.cfg, marker=tmp_path / f"votes-{bid}.json", clock=clock
        )
    g.publish({bid: n.addr for bid, n in g.nodes.items()})
    assert await g.lock(0, C1, MQS) == set(MQS)  # at once: nothing was forgotten
    assert all((tmp_path / f"votes-{bid}.json").exists() for bid in g.nodes)

    async def restart(*ids: int) -> None:
        for bid in ids:
            node = g.nodes[bid]
            await node.server.aclose(grace_s=0.5)
            g.nodes[bid] = await start_node(
                node.host.cfg, marker=tmp_path / f"votes-{bid}.json", clock=clock
            )
        g.publish({bid: n.addr for bid, n in g.nodes.items()})

    await restart(0)  # the master alone: the slaves remember C1
    assert g.nodes[0].service.forgets()
    assert await g.lock(0, C2, MQS) == set()
    assert await g.lock(0, C1, MQS) == set(MQS)  # C1 renews through the slaves' votes

    await restart(0, 1, 2)
    assert await g.lock(0, C2, MQS) == set()
    assert await g.lock(1, C2, MQS, vote=True) == set()  # a vote that does not count
    assert g.nodes[1].held() == {}
    lease = g.nodes[0].host.cfg.lock_max_live_time_ms
    clock.now += lease
    assert await g.lock(0, C2, MQS) == set(MQS)  # every lock C1 may have trusted is over

    clock.now += lease + 1000  # restarted a lease after the last vote: nothing to forget
    await restart(0, 1, 2)
    assert not any(node.service.forgets() for node in g.nodes.values())
    assert await g.lock(0, C1, MQS) == set(MQS)
