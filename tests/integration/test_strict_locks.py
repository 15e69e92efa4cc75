"""Quorum queue locks and orderly consumption across a failover, over real processes.

After RocketMQ's RebalanceLockOnSlaveIT: one group
of three brokers (master, two slaves) with acting master on; orderly consumers
lock their queues at the id-0 address.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from ha_controller.client import Message, MessageQueue, Producer, PullConsumer, ReceivedMessage
from ha_controller.client.admin import NameserverClient
from ha_controller.client.orderly import (
    LockOutcome,
    OrderlyPushConsumer,
    QueueLocker,
    dlq_topic,
)
from ha_controller.client.push_consumer import MessageListener
from ha_controller.client.routes import RouteCache
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import Cluster, eventually, run_cluster

BROKER = "broker-a"
TOPIC = "OrderTopic"
GROUP = "CID_order"
QUEUES = {MessageQueue(TOPIC, BROKER, i) for i in range(4)}
STRICT = {"HAC_LOCK_IN_STRICT_MODE": "true"}
LENIENT = {"HAC_LOCK_IN_STRICT_MODE": "false"}


@contextlib.contextmanager
def cluster_of(env: dict[str, str]) -> Iterator[Cluster]:
    cluster = run_cluster([BROKER], 3, env=env)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def strict_cluster() -> Iterator[Cluster]:
    with cluster_of(STRICT) as cluster:
        yield cluster


@pytest.fixture
async def pool() -> AsyncIterator[ConnectionPool]:
    async with ConnectionPool() as p:
        yield p


async def create_topics(cluster: Cluster, pool: ConnectionPool) -> None:
    """The topic on the master, then wait until both slaves synced it (so the
    route keeps it when the master is gone)."""
    async with NameserverClient([cluster.namesrv]) as ns:
        # the master registers after its pre-online
        await eventually(lambda: ns.create_topic(TOPIC, queues=len(QUEUES)), timeout=15)
        assert await ns.create_topic(dlq_topic(GROUP), queues=1) == [BROKER]

    async def slaves_have_it() -> bool:
        for bid in (1, 2):
            table = await pool.call_pb(
                cluster.broker(BROKER, bid).rpc,
                RequestCode.GET_ALL_TOPIC_CONFIG,
                common_pb2.Empty(),
                broker_pb2.TopicConfigTable,
                2000,
            )
            if TOPIC not in {t.topic_name for t in table.topics}:
                return False
        return True

    await eventually(slaves_have_it, timeout=15)


#: the slaves, either of which may act for a dead master: the nameserver takes the most
#: advanced (the lowest id of those), and on a loaded machine slave 2 may be ahead
SLAVES = (1, 2)


async def wait_id0(
    cluster: Cluster, pool: ConnectionPool, broker_ids: int | tuple[int, ...]
) -> None:
    """Until the route shows the address of ``broker_ids`` (one of them) as id 0."""
    ids = (broker_ids,) if isinstance(broker_ids, int) else broker_ids
    addrs = {cluster.broker(BROKER, i).rpc for i in ids}
    async with NameserverClient([cluster.namesrv], pool) as ns:

        async def id0() -> bool:
            route = await ns.route(TOPIC)
            return route.broker_datas[0].broker_addrs.get(0) in addrs

        await eventually(id0, timeout=20, interval=0.1)


async def noop(message: ReceivedMessage) -> bool:
    return True


def orderly(
    cluster: Cluster, listener: MessageListener = noop, **options: Any
) -> OrderlyPushConsumer:
    defaults: dict[str, Any] = {
        "rebalance_interval_s": 1.0,
        "heartbeat_interval_s": 1.0,
        "suspend_timeout_ms": 1000,
        "commit_interval_s": 1.0,
    }
    return OrderlyPushConsumer(
        cluster.namesrv,
        GROUP,
        TOPIC,
        listener,
        **{**defaults, **options},
    )


async def test_rebalance_lock_on_slave(strict_cluster: Cluster, pool: ConnectionPool) -> None:
    """RebalanceLockOnSlaveIT.lockFromSlave: 2 of 3 members still grant, 1 of 3 does not."""
    cluster = strict_cluster
    await create_topics(cluster, pool)
    async with orderly(cluster) as consumer:
        await eventually(lambda: consumer.held_queues() == QUEUES, timeout=15)

        cluster.broker(BROKER, 0).kill()
        await wait_id0(cluster, pool, SLAVES)

        async def acting_slave_grants() -> bool:
            outcome = await consumer.lock_all()
            return outcome.granted == QUEUES

        await eventually(acting_slave_grants, timeout=15, interval=0.2)
        assert consumer.held_queues() == QUEUES

        cluster.broker(BROKER, 2).kill()

        async def refused() -> bool:
            outcome = await consumer.lock_all()
            return outcome.refused == QUEUES

        await eventually(refused, timeout=15, interval=0.2)
        assert consumer.held_queues() == set(), "a refused lock must stop consumption at once"


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
async def test_acting_slave_grants_a_held_queue_only_without_strict_mode(
    strict: bool, pool: ConnectionPool
) -> None:
    """Documents the risk strict mode removes.

    Consumer A locks every queue at the master.  The master dies; the slave
    that acts for it has never seen A's locks unless it voted for them (strict
    mode).  Client B asks it for A's queue before A renews (renewals are 25 s
    apart, A trusts a lock for 30 s): without strict mode it is granted while A
    still believes it holds the queue — a double grant.
    """
    with cluster_of(STRICT if strict else LENIENT) as cluster:
        await create_topics(cluster, pool)
        async with orderly(cluster, lock_renew_interval_s=25.0, lock_max_live_s=30.0) as a:
            await eventually(lambda: a.held_queues() == QUEUES, timeout=15)
            won = time.monotonic()
            cluster.broker(BROKER, 0).kill()
            await wait_id0(cluster, pool, SLAVES)
            victim = min(QUEUES)
            locker_b = QueueLocker(a.routes, pool, GROUP, "10.9.9.9@B")

            async def answered() -> LockOutcome | None:
                outcome = await locker_b.lock([victim])
                return None if outcome.unknown else outcome

            to_b: LockOutcome = await eventually(answered, timeout=15, interval=0.2)
            assert time.monotonic() - won < 25.0, "A renewed meanwhile: the test proves nothing"
            assert victim in a.held_queues(), "A still trusts its lock"
            if strict:
                assert to_b.granted == frozenset(), "strict mode: the acting slave voted for A"
            else:
                assert to_b.granted == {victim}, "without strict mode: a double grant"


@dataclasses.dataclass
class Ledger:
    """What the listeners saw: order, concurrency and double grants."""

    poison: str
    done: dict[str, set[int]] = dataclasses.field(default_factory=lambda: defaultdict(set))
    active: dict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    calls: int = 0
    duplicates: int = 0
    order_violations: list[str] = dataclasses.field(default_factory=list)
    concurrent: list[str] = dataclasses.field(default_factory=list)
    double_grants: list[str] = dataclasses.field(default_factory=list)

    def listener(self, name: str) -> MessageListener:
        async def consume(message: ReceivedMessage) -> bool:
            group = message.message_group or "-"
            if group == self.poison:
                return False
            seq = int(message.body)
            self.calls += 1
            if any(m not in self.done[group] for m in range(seq)):
                self.order_violations.append(f"{name}: {group}#{seq} before its predecessor")
            if self.active[group]:
                self.concurrent.append(f"{name}: {group}#{seq} while another ran")
            self.active[group] += 1
            try:
                await asyncio.sleep(0.002)
            finally:
                self.active[group] -= 1
            if seq in self.done[group]:
                self.duplicates += 1
            self.done[group].add(seq)
            return True

        return consume

    def consumed(self, groups: list[str], count: int) -> bool:
        return all(self.done[g] >= set(range(count)) for g in groups)


async def watch_grants(
    ledger: Ledger, consumers: list[OrderlyPushConsumer], stop: asyncio.Event
) -> None:
    while not stop.is_set():
        seen: dict[MessageQueue, str] = {}
        for c in consumers:
            for mq in c.held_queues():
                if mq in seen:
                    ledger.double_grants.append(f"{mq}: {seen[mq]} and {c.client_id}")
                seen[mq] = c.client_id
        await asyncio.sleep(0.01)


async def send_batch(producer: Producer, groups: list[str], seqs: range) -> None:
    for seq in seqs:
        for group in groups:
            msg = Message(topic=TOPIC, body=str(seq).encode(), message_group=group)
            await producer.send(msg)


async def test_two_orderly_consumers_over_master_failover(
    strict_cluster: Cluster, pool: ConnectionPool
) -> None:
    """Strict mode: no queue is ever believed held by two consumers, and every
    message group is consumed in order, while the master dies and returns and
    the two consumers rebalance around it; a poison message goes to the DLQ."""
    cluster = strict_cluster
    await create_topics(cluster, pool)
    groups = [f"order-{i}" for i in range(8)]
    ledger = Ledger(poison="poison")
    stop = asyncio.Event()
    a = orderly(cluster, ledger.listener("A"), max_consume_attempts=2, consume_retry_backoff_s=0.05)
    b = orderly(cluster, ledger.listener("B"), max_consume_attempts=2, consume_retry_backoff_s=0.05)
    async with Producer(cluster.namesrv, topics=[TOPIC]) as producer, a:
        watcher = asyncio.create_task(watch_grants(ledger, [a, b], stop))
        try:
            await eventually(lambda: a.held_queues() == QUEUES, timeout=15)
            await send_batch(producer, groups, range(10))
            await eventually(lambda: ledger.consumed(groups, 10), timeout=15)

            # the master dies; B joins while the slave acts, so the queues move
            # between consumers through locks on the acting slave
            cluster.broker(BROKER, 0).kill()
            await wait_id0(cluster, pool, SLAVES)
            await b.start()
            await eventually(
                lambda: len(a.held_queues()) == 2 and len(b.held_queues()) == 2, timeout=20
            )

            # the master returns with an empty lock table; renewals go to it
            cluster.restart(BROKER, 0)
            await wait_id0(cluster, pool, 0)
            for c in (a, b):

                async def renewed(c: OrderlyPushConsumer = c) -> bool:
                    outcome = await c.lock_all()
                    return len(outcome.granted) == 2 and outcome.granted == c.held_queues()

                await eventually(renewed, timeout=15, interval=0.2)
            await producer.send(Message(topic=TOPIC, body=b"x", message_group="poison"))
            await send_batch(producer, groups, range(10, 20))
            await eventually(lambda: ledger.consumed(groups, 20), timeout=20)
            await eventually(lambda: a.dead_lettered + b.dead_lettered == 1, timeout=10)

            # A leaves: B takes every queue after A unlocked them
            await a.aclose()
            await eventually(lambda: b.held_queues() == QUEUES, timeout=20)
            await send_batch(producer, groups, range(20, 30))
            await eventually(lambda: ledger.consumed(groups, 30), timeout=20)
        finally:
            stop.set()
            await watcher
            await b.aclose()

    assert ledger.double_grants == []
    assert ledger.order_violations == []
    assert ledger.concurrent == []
    async with PullConsumer(cluster.namesrv, "dlq-reader") as reader:
        (dlq,) = await reader.queues(dlq_topic(GROUP))
        result = await reader.pull(dlq, 0, 32, 0)
        assert [m.properties["ORIGIN_MESSAGE_GROUP"] for m in result.messages] == ["poison"]


async def test_no_lock_is_granted_twice_after_every_member_restarted(
    strict_cluster: Cluster, pool: ConnectionPool
) -> None:
    """kill -9 of every member of the group (a power loss of it) forgets every lock while
    consumer A still trusts its own for 30 s: the restarted group grants none of A's
    queues to B within that time.  A fresh group grants at once (no marker yet)."""
    cluster = strict_cluster
    await create_topics(cluster, pool)
    async with RouteCache(NameserverClient([cluster.namesrv], pool), watch=False) as routes:
        await routes.refresh_quietly(TOPIC)
        a = QueueLocker(routes, pool, GROUP, "10.1.1.1@A")
        b = QueueLocker(routes, pool, GROUP, "10.2.2.2@B")
        locked_at = time.monotonic()
        assert (await a.lock(QUEUES)).granted == QUEUES
        for bid in (0, 1, 2):
            cluster.broker(BROKER, bid).kill()
        for bid in (1, 2, 0):
            cluster.restart(BROKER, bid)
        await cluster.wait_ready()

        async def answered() -> LockOutcome | None:
            await routes.refresh_quietly(TOPIC)
            outcome = await b.lock(QUEUES)
            return None if outcome.unknown else outcome

        to_b: LockOutcome = await eventually(answered, timeout=20, interval=0.2)
        assert time.monotonic() - locked_at < 30.0, "A no longer trusts its lock: proves nothing"
        assert to_b.granted == frozenset(), "B was granted queues A still trusts"
