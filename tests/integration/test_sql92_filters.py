"""SQL92 property filters (RocketMQ's ExpressionType.SQL92) over real processes: our
SDK's pull, push and simple (POP) consumers against a group (a master and a slave),
then against its acting slave once the master is killed (a second group takes the
acting slave's POP checkpoints).

The brokers evaluate the expression; our SDK filters nothing itself, so what a
consumer gets is what crossed the wire.  Offsets move past what is filtered out.  A
bad expression is refused when the consumer subscribes, and by a broker asked raw.
The official Python SDK's cases run through ``hactl proxy`` in test_grpc_proxy.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from special_helpers import acting, create_topic_on, masters_online

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message, MessageQueue, ReceivedMessage
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer
from ha_controller.client.push_consumer import PushConsumer
from ha_controller.client.simple_consumer import SimpleConsumer
from ha_controller.filter.sql92 import FilterSyntaxError
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import IllegalFilterExpression
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import Cluster, eventually, run_cluster

pytestmark = pytest.mark.timeout(120)

GROUP = "broker-a"
N = 24
#: selects n = 1, 5, 9, ... (region eu, tag A) with n >= 9: 9, 13, 17, 21
SQL = "region = 'eu' AND TAGS = 'A' AND n >= 9"
#: every message lacks vip: a comparison with NULL is not TRUE, IS NULL is
SQL_NULLS = "(vip = 'yes' OR vip <> 'yes' OR vip > 1) OR (n < 2 AND vip IS NULL)"


def properties(i: int) -> dict[str, str]:
    return {"n": str(i), "region": ("us", "eu")[i % 2]}


def tags(i: int) -> str:
    return ("A", "A", "B", "B")[i % 4]


def selected(expr: str) -> set[int]:
    if expr == SQL:
        return {i for i in range(N) if i % 2 == 1 and tags(i) == "A" and i >= 9}
    if expr == SQL_NULLS:
        return {0, 1}
    raise AssertionError(expr)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # broker-b: where broker-a's acting slave escapes its POP checkpoints to
    c = run_cluster((GROUP, "broker-b"), 2, workdir=tmp_path_factory.mktemp("sql92"))
    try:
        yield c
    finally:
        c.stop()


async def fill(c: Cluster, topic: str) -> None:
    """``topic`` on broker-a with 2 queues and N messages, properties n and region,
    tags A/B."""
    await masters_online(c.namesrv, [GROUP, "broker-b"])
    await create_topic_on(c.broker(GROUP, 0).rpc, topic)
    async with NameserverClient([c.namesrv]) as ns:
        await eventually(lambda: ns.route(topic), timeout=20)
    async with Producer(c.namesrv, f"p-{topic}", topics=[topic]) as producer:
        for i in range(N):
            await producer.send(Message(topic, b"%d" % i, tags=tags(i), properties=properties(i)))


def numbers(messages: list[ReceivedMessage]) -> list[int]:
    return sorted(int(m.properties["n"]) for m in messages)


async def pull_all(c: Cluster, topic: str, group: str, sql92: str) -> tuple[list[int], int]:
    """Pull every queue once from 0 with ``sql92``: the numbers and how far the
    answers moved the offsets (summed over the queues)."""
    got: list[ReceivedMessage] = []
    moved = 0
    async with PullConsumer(c.namesrv, group) as consumer:
        for mq in await consumer.queues(topic):
            offset = 0
            while True:
                r = await consumer.pull(mq, offset, 32, suspend_timeout_ms=0, sql92=sql92)
                got.extend(r.messages)
                if r.next_begin_offset == offset:
                    break
                offset = r.next_begin_offset
                if offset >= r.max_offset:
                    break
            moved += offset
    return numbers(got), moved


async def pop_all(c: Cluster, topic: str, group: str, sql92: str) -> list[ReceivedMessage]:
    """Pop and ack until the selection came, then make sure nothing more does."""
    got: list[ReceivedMessage] = []
    async with SimpleConsumer(
        c.namesrv, group, [topic], invisible_duration_s=30, sql92=sql92
    ) as consumer:

        async def step() -> bool:
            for m in await consumer.receive(32, wait_s=0.5):
                got.append(m)
                await consumer.ack(m)
            return len(got) >= len(selected(sql92))

        await eventually(step, timeout=20, interval=0.05)
        assert await consumer.receive(32, wait_s=0.5) == []
    return got


async def committed(c: Cluster, topic: str, group: str) -> int:
    total = 0
    async with PullConsumer(c.namesrv, group) as consumer:
        for mq in await consumer.queues(topic):
            total += max(0, await consumer.committed_offset(mq))
    return total


async def test_pull_gets_only_what_the_expression_selects(cluster: Cluster) -> None:
    await fill(cluster, "sql-pull")
    assert await pull_all(cluster, "sql-pull", "g-pull", SQL) == (sorted(selected(SQL)), N)
    # NULL semantics: a message without the property is never selected by a comparison
    got, _ = await pull_all(cluster, "sql-pull", "g-pull", SQL_NULLS)
    assert got == sorted(selected(SQL_NULLS))


async def test_push_consumer_receives_the_selection_and_commits_past_the_rest(
    cluster: Cluster,
) -> None:
    await fill(cluster, "sql-push")
    got: list[int] = []

    async def listener(m: ReceivedMessage) -> bool:
        got.append(int(m.properties["n"]))
        return True

    async with PushConsumer(
        cluster.namesrv,
        "g-push",
        "sql-push",
        listener,
        sql92=SQL,
        suspend_timeout_ms=1000,
        commit_interval_s=0.2,
    ):
        await eventually(lambda: sorted(got) == sorted(selected(SQL)), timeout=20)

        # the group's offsets move past the filtered-out messages, to the queues' ends
        async def all_committed() -> bool:
            return await committed(cluster, "sql-push", "g-push") == N

        await eventually(all_committed, timeout=20)
    assert sorted(got) == sorted(selected(SQL))  # each once


async def test_simple_consumer_pops_the_selection_and_moves_the_offsets(cluster: Cluster) -> None:
    await fill(cluster, "sql-pop")
    got = await pop_all(cluster, "sql-pop", "g-pop", SQL)
    assert numbers(got) == sorted(selected(SQL))
    assert await committed(cluster, "sql-pop", "g-pop") == N


async def test_a_bad_expression_is_refused_at_subscribe_time(cluster: Cluster) -> None:
    async def listener(m: ReceivedMessage) -> bool:
        return True

    for bad in ("n >", "region = 'eu", "n = NULL", ""):
        with pytest.raises(FilterSyntaxError):
            PushConsumer(cluster.namesrv, "g-bad", "sql-pull", listener, sql92=bad)
        with pytest.raises(FilterSyntaxError):
            SimpleConsumer(cluster.namesrv, "g-bad", ["sql-pull"], sql92=bad)
    with pytest.raises(IllegalFilterExpression, match="not both"):
        PushConsumer(cluster.namesrv, "g-bad", "sql-pull", listener, tags=["A"], sql92="n > 1")
    async with PullConsumer(cluster.namesrv, "g-bad") as consumer:
        with pytest.raises(FilterSyntaxError):
            await consumer.pull(MessageQueue("sql-pull", GROUP, 0), 0, sql92="n >")


async def test_a_broker_asked_raw_refuses_a_bad_expression(cluster: Cluster) -> None:
    """What another client would meet: the broker parses too (RocketMQ's broker
    answers SUBSCRIPTION_PARSE_FAILED); nothing is popped or committed."""
    await fill(cluster, "sql-raw")
    master = cluster.broker(GROUP, 0).rpc
    async with ConnectionPool() as pool:
        with pytest.raises(FilterSyntaxError, match="character"):
            await pool.call_pb(
                master,
                RequestCode.PULL_MESSAGE,
                broker_pb2.PullMessageRequest(
                    consumer_group="g-raw",
                    topic="sql-raw",
                    queue_id=0,
                    queue_offset=0,
                    commit_offset=5,
                    sql92="n > > 1",
                ),
                broker_pb2.PullMessageResponse,
            )
        with pytest.raises(IllegalFilterExpression):
            await pool.call_pb(
                master,
                RequestCode.POP_MESSAGE,
                broker_pb2.PopMessageRequest(
                    consumer_group="g-raw",
                    topic="sql-raw",
                    queue_id=-1,
                    invisible_time_ms=30_000,
                    tags=["A"],
                    sql92="n > 1",
                ),
                broker_pb2.PopMessageResponse,
            )
    assert await committed(cluster, "sql-raw", "g-raw") == 0


async def test_an_acting_slave_filters_the_same(cluster: Cluster) -> None:
    """Last in the module: the master is killed; pull and POP go to the acting slave."""
    await fill(cluster, "sql-acting")
    slave = cluster.broker(GROUP, 1).rpc
    async with ConnectionPool() as pool:

        async def replicated() -> bool:  # all N on the slave before the master goes
            total = 0
            for q in range(2):
                r = await pool.call_pb(
                    slave,
                    RequestCode.PULL_MESSAGE,
                    broker_pb2.PullMessageRequest(
                        consumer_group="g-probe", topic="sql-acting", queue_id=q, max_msg_nums=1
                    ),
                    broker_pb2.PullMessageResponse,
                )
                total += r.max_offset
            return total == N

        await eventually(replicated, timeout=20)
    cluster.broker(GROUP, 0).kill()
    await acting(cluster.namesrv, GROUP, slave, "sql-acting")
    assert await pull_all(cluster, "sql-acting", "g-acting-pull", SQL) == (
        sorted(selected(SQL)),
        N,
    )
    got = await pop_all(cluster, "sql-acting", "g-acting-pop", SQL)
    assert numbers(got) == sorted(selected(SQL))
    assert {m.broker_name for m in got} == {GROUP}
