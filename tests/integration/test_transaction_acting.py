"""Transactions while a group's master is away (RocketMQ TransactionMessageIT),
over real processes.

The acting slave escapes unresolved half messages to a live master, which checks
them with the producer; the committed messages are consumed once, and after the
master returns (pre-online adopts the slave's half/op offsets) nothing is
committed again.  An END_TRANSACTION sent to the acting slave takes effect.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from special_helpers import acting, create_topic_on, masters_online

from ha_controller.client.message import Message, ReceivedMessage
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer, PullStatus
from ha_controller.client.transaction import TransactionResolution
from ha_controller.testing import Cluster, eventually, run_broker, run_cluster, run_container

TOPIC = "TX"
ENV = {
    "HAC_TRANSACTION_CHECK_INTERVAL_MS": "300",
    "HAC_TRANSACTION_TIMEOUT_MS": "1000",
    "HAC_TRANSACTION_CHECK_MAX": "1000",
    "HAC_POP_REVIVE_INTERVAL_MS": "200",
}


class Checker:
    """The producer's checker; the test flips its answer."""

    def __init__(self) -> None:
        self.resolution = TransactionResolution.UNKNOWN
        self.asked: Counter[str] = Counter()

    async def __call__(self, message: ReceivedMessage) -> TransactionResolution:
        self.asked[message.uniq_key] += 1
        return self.resolution


async def consume_all(namesrv: str, group: str) -> Counter[str]:
    """Every message of TOPIC in every group, counted by client message id."""
    seen: Counter[str] = Counter()
    async with PullConsumer(namesrv, group, route_watch=False) as pull:
        await pull.routes.refresh(TOPIC)
        for mq in await pull.queues(TOPIC):
            offset = 0
            while True:
                res = await pull.pull(mq, offset, max_msgs=64, suspend_timeout_ms=0)
                if res.status is not PullStatus.FOUND:
                    break
                seen.update(m.uniq_key for m in res.messages)
                offset = res.next_begin_offset
    return seen


async def send_open(producer: Producer, n: int) -> list[str]:
    ids = []
    for i in range(n):
        tx = producer.begin_transaction()
        receipt = await producer.send(Message(TOPIC, f"tx-{i}".encode()), transaction=tx)
        ids.append(receipt.uniq_key)
    return ids


def start(tmp_path: Path) -> Cluster:
    return run_cluster(("txa", "txb"), 2, workdir=tmp_path, env=ENV)


async def test_commit_rollback_and_check_on_master(tmp_path: Path) -> None:
    cluster = run_cluster(("txm",), 2, workdir=tmp_path, env=ENV)
    try:
        await masters_online(cluster.namesrv, ["txm"])
        await create_topic_on(cluster.broker("txm", 0).rpc, TOPIC)
        checker = Checker()
        async with Producer(
            cluster.namesrv, "tx-m", checker=checker, heartbeat_interval_s=0.5, topics=[TOPIC]
        ) as producer:
            async with producer.begin_transaction() as tx:
                committed = await producer.send(Message(TOPIC, b"c"), transaction=tx)
                await tx.commit()
            async with producer.begin_transaction() as tx:
                rolled = await producer.send(Message(TOPIC, b"r"), transaction=tx)
                await tx.rollback()
            [checked] = await send_open(producer, 1)
            assert await consume_all(cluster.namesrv, "g1") == Counter({committed.uniq_key: 1})
            checker.resolution = TransactionResolution.COMMIT
            await eventually(lambda: _has(cluster.namesrv, "g2", checked), timeout=10, interval=0.2)
            await asyncio.sleep(1.5)  # more check rounds: nothing is committed twice
            seen = await consume_all(cluster.namesrv, "g3")
        assert seen == Counter({committed.uniq_key: 1, checked: 1})
        assert rolled.uniq_key not in seen
        assert checker.asked[committed.uniq_key] == 0
    finally:
        cluster.stop()


async def _has(namesrv: str, group: str, uniq_key: str) -> bool:
    return uniq_key in await consume_all(namesrv, group)


async def _escape_scenario(
    cluster: Cluster, *, acting_addr: str, master_of_b: str, groups: list[str]
) -> None:
    """16 open transactions on txa; txa's master dies; the acting slave escapes them
    to txb's master, which checks them; then txa's master returns."""
    await masters_online(cluster.namesrv, groups)
    await create_topic_on(cluster.broker("txa", 0).rpc, TOPIC)
    # before the kill: created after it, the topic could shrink to 2 queues under
    # escaped messages the other master auto-created it for (4 queues), hiding those
    # in queues 2 and 3 from consumers
    await create_topic_on(master_of_b, TOPIC)
    checker = Checker()
    async with Producer(
        cluster.namesrv, "tx-escape", checker=checker, heartbeat_interval_s=0.5, topics=[TOPIC]
    ) as producer:
        ids = await send_open(producer, 16)
        cluster.broker("txa", 0).kill()
        await acting(cluster.namesrv, "txa", acting_addr)
        checker.resolution = TransactionResolution.COMMIT

        async def all_committed() -> bool:
            seen = await consume_all(cluster.namesrv, "escape-check")
            return all(seen[i] >= 1 for i in ids)

        await eventually(all_committed, timeout=30, interval=0.3)
        seen = await consume_all(cluster.namesrv, "escape-once")
        assert {i: seen[i] for i in ids} == dict.fromkeys(ids, 1)

        await asyncio.to_thread(cluster.restart, "txa", 0)
        await masters_online(cluster.namesrv, groups)
        await asyncio.sleep(2.0)  # several check rounds of the returned master
        seen = await consume_all(cluster.namesrv, "after-return")
    assert {i: seen[i] for i in ids} == dict.fromkeys(ids, 1), "committed twice after return"
    assert "transaction offsets of slave 1 adopted" in cluster.broker("txa", 0).log_tail(4000)


async def test_remote_escape_of_half_messages(tmp_path: Path) -> None:
    cluster = start(tmp_path)
    try:
        await _escape_scenario(
            cluster,
            acting_addr=cluster.broker("txa", 1).rpc,
            master_of_b=cluster.broker("txb", 0).rpc,
            groups=["txa", "txb"],
        )
        assert "escaped to txb" in cluster.broker("txa", 1).log_tail(4000)
    finally:
        cluster.stop()


async def test_end_transaction_on_acting_slave(tmp_path: Path) -> None:
    cluster = start(tmp_path)
    try:
        await masters_online(cluster.namesrv, ["txa", "txb"])
        await create_topic_on(cluster.broker("txa", 0).rpc, TOPIC)
        checker = Checker()  # always UNKNOWN: only END_TRANSACTION decides
        async with Producer(
            cluster.namesrv, "tx-end", checker=checker, heartbeat_interval_s=0.5, topics=[TOPIC]
        ) as producer:
            txs = []
            for i in range(4):
                tx = producer.begin_transaction()
                await producer.send(Message(TOPIC, f"e{i}".encode()), transaction=tx)
                txs.append(tx)
            cluster.broker("txa", 0).kill()
            await acting(cluster.namesrv, "txa", cluster.broker("txa", 1).rpc)
            await create_topic_on(cluster.broker("txb", 0).rpc, TOPIC)
            await txs[0].commit()
            await txs[1].commit()
            await txs[2].rollback()
            await txs[3].rollback()
            ids = [tx.message_id for tx in txs]
            await eventually(
                lambda: _has(cluster.namesrv, "end-1", str(ids[1])), timeout=15, interval=0.2
            )
            await asyncio.sleep(1.5)
            seen = await consume_all(cluster.namesrv, "end-2")
        assert {i: seen[i] for i in ids if i} == {ids[0]: 1, ids[1]: 1, ids[2]: 0, ids[3]: 0}
    finally:
        cluster.stop()


async def test_local_escape_of_half_messages(tmp_path: Path) -> None:
    """txa's slave shares a process (broker container) with txb's master, so it
    escapes there locally (RocketMQ consumeTransactionMsgLocalEscape)."""
    cluster = run_cluster((), 2, workdir=tmp_path, env=ENV)
    container = None
    try:
        container = run_container(
            cluster.namesrv, [("txb", 0), ("txa", 1)], tmp_path / "c1", env=cluster.env
        )
        for name, bid in (("txb", 1), ("txa", 0)):
            cluster.brokers[(name, bid)] = run_broker(
                cluster.namesrv, name, bid, tmp_path, env=cluster.env
            )
        await _escape_scenario(
            cluster,
            acting_addr=container.rpc_of("txa", 1),
            master_of_b=container.rpc_of("txb", 0),
            groups=["txa", "txb"],
        )
        assert "escaped to txb" in container.log_tail(2000)
    finally:
        if container is not None:
            container.kill()
        cluster.stop()
