"""Issue 3 acceptance over real processes: crash safety, SYNC replication,
and the failover read path through the acting slave."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message, MessageQueue, ReceivedMessage
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer, PullStatus
from ha_controller.client.push_consumer import PushConsumer
from ha_controller.client.tools import body_for
from ha_controller.protocol.errors import HaError
from ha_controller.routing import Perm
from ha_controller.testing import Cluster, eventually, run_cluster, stored_messages

TOPIC = "T"


async def wait_masters(ns: NameserverClient, n: int) -> None:
    async def ok() -> bool:
        groups = await ns.groups()
        return len(groups) == n and all(g.master_online for g in groups)

    await eventually(ok, timeout=30)


async def read_all(pull: PullConsumer, queues: list[MessageQueue]) -> dict[str, bytes]:
    """Every message of the given queues, by key (asserting none twice)."""
    out: dict[str, bytes] = {}
    async for m in stored_messages(pull, queues):
        assert m.key not in out, f"{m.key} stored twice"
        out[m.key] = m.body
    return out


@pytest.fixture
def single_sync_flush(tmp_path: Path) -> Cluster:
    return run_cluster(
        ("crash",),
        1,
        workdir=tmp_path,
        env={"HAC_FLUSH_MODE": "sync", "HAC_IN_SYNC_REPLICAS": "1", "HAC_TOTAL_REPLICAS": "1"},
    )


async def test_kill_9_during_sync_flushed_sends_loses_nothing(single_sync_flush: Cluster) -> None:
    cluster = single_sync_flush
    rng = random.Random(20261122)
    acked: dict[str, bytes] = {}
    try:
        for run in range(20):
            async with NameserverClient([cluster.namesrv]) as ns:
                await wait_masters(ns, 1)
            producer = Producer(cluster.namesrv, group="crash-producer", max_attempts=1)
            await producer.start()
            kill_after = rng.uniform(0.05, 0.4)
            deadline = time.monotonic() + kill_after
            seq = 0

            async def stream(run: int = run, producer: Producer = producer) -> None:
                nonlocal seq
                while True:
                    key = f"r{run:02d}-{seq:05d}"
                    seq += 1
                    body = body_for(key, rng.randint(1, 3000))
                    try:
                        await producer.send(Message(TOPIC, body, keys=(key,)))
                    except HaError:
                        return
                    acked[key] = body

            task = asyncio.create_task(stream())
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            cluster.broker("crash", 0).kill()
            await asyncio.wait_for(task, 10)
            await producer.aclose()
            await asyncio.to_thread(cluster.restart, "crash", 0)
        async with NameserverClient([cluster.namesrv]) as ns:
            await wait_masters(ns, 1)
        async with PullConsumer(cluster.namesrv, "crash-check") as pull:
            stored = await read_all(pull, await pull.queues(TOPIC))
        missing = [k for k in acked if k not in stored]
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:3]}"
        assert all(stored[k] == body for k, body in acked.items()), "a body changed"
        assert len(acked) > 100
        status = cluster.broker("crash", 0).log_tail(400)
        assert "CorruptRecord" not in status
    finally:
        cluster.stop()


async def test_sync_replication_kill_right_after_acks_loses_nothing(tmp_path: Path) -> None:
    cluster = run_cluster(("sync",), 2, workdir=tmp_path)
    try:
        async with NameserverClient([cluster.namesrv]) as ns:
            await wait_masters(ns, 1)
            await ns.create_topic(TOPIC, queues=2)
        for run in range(20):
            async with NameserverClient([cluster.namesrv]) as ns:
                await wait_masters(ns, 1)
            async with Producer(cluster.namesrv, group="sync-producer", max_attempts=1) as p:
                keys = []
                for i in range(15):
                    key = f"s{run:02d}-{i:03d}"
                    await p.send(Message(TOPIC, body_for(key, 512), keys=(key,)))
                    keys.append(key)
                cluster.broker("sync", 0).kill()  # right after the last acknowledgement
            # the acting slave (id 0 in the route now) must hold every acknowledged message
            async with PullConsumer(cluster.namesrv, f"sync-check-{run}") as pull:

                async def slave_has_all(keys: list[str] = keys, run: int = run) -> bool:
                    stored = await read_all(pull, await pull.queues(TOPIC))
                    missing = [k for k in keys if k not in stored]
                    assert not missing, f"run {run}: lost {missing}"
                    return True

                await eventually(slave_has_all, timeout=10)
            await asyncio.to_thread(cluster.restart, "sync", 0)
    finally:
        cluster.stop()


async def test_failover_read_path(tmp_path: Path) -> None:
    cluster = run_cluster(("broker-a", "broker-b"), 3, workdir=tmp_path)
    try:
        async with NameserverClient([cluster.namesrv]) as ns:
            await wait_masters(ns, 2)
            await ns.create_topic(TOPIC, queues=4)
            await eventually(lambda: _groups_in_route(ns, 2), timeout=10)

            received: dict[str, int] = {}

            async def listener(m: ReceivedMessage) -> bool:
                received[m.key] = received.get(m.key, 0) + 1
                return True

            push = PushConsumer(cluster.namesrv, "push-g", TOPIC, listener, commit_interval_s=0.3)
            await push.start()
            pull = PullConsumer(cluster.namesrv, "pull-g")
            await pull.start()
            producer = Producer(cluster.namesrv, group="fo-producer")
            await producer.start()
            acked: dict[str, str] = {}

            async def produce(prefix: str, n: int) -> None:
                for i in range(n):
                    key = f"{prefix}-{i:04d}"
                    r = await producer.send(Message(TOPIC, body_for(key, 200), keys=(key,)))
                    acked[key] = r.broker_name

            await produce("before", 200)
            a_queues = [q for q in await pull.queues(TOPIC) if q.broker_name == "broker-a"]
            pulled: dict[str, int] = {}
            next_offset: dict[MessageQueue, int] = {}
            for mq in a_queues:
                res = await pull.pull(mq, 0, max_msgs=20, suspend_timeout_ms=0)
                for m in res.messages:
                    pulled[m.key] = pulled.get(m.key, 0) + 1
                next_offset[mq] = res.next_begin_offset
                await pull.commit(mq, res.next_begin_offset)
            master_max = {mq: await pull.max_offset(mq) for mq in a_queues}
            await eventually(lambda: len(received) >= len(acked), timeout=20)

            master = cluster.broker("broker-a", 0)
            slave1, slave2 = cluster.broker("broker-a", 1), cluster.broker("broker-a", 2)
            t_kill = time.monotonic()
            master.kill()

            async def rewritten() -> bool:
                r = await ns.route(TOPIC)
                b, q = r.broker("broker-a"), r.queue("broker-a")
                assert b is not None and q is not None
                return b.broker_addrs == {0: slave1.rpc, 2: slave2.rpc} and q.perm == Perm.READ

            await eventually(rewritten, timeout=1.0, interval=0.01)
            assert time.monotonic() - t_kill < 1.0

            # master-only queries are served by the acting slave, with the master's values
            async def acting_max_matches() -> bool:
                for mq in a_queues:
                    assert await pull.max_offset(mq) == master_max[mq]
                return True

            await eventually(acting_max_matches, timeout=10)
            # producers keep sending, to broker-b only
            await produce("during", 100)
            assert {acked[f"during-{i:04d}"] for i in range(100)} == {"broker-b"}
            # the pull consumer continues from its committed offsets on the acting slave
            for mq in a_queues:
                assert await pull.committed_offset(mq) == next_offset[mq]
                offset = next_offset[mq]
                while True:
                    res = await pull.pull(mq, offset, max_msgs=64, suspend_timeout_ms=0)
                    if res.status is not PullStatus.FOUND:
                        break
                    for m in res.messages:
                        pulled[m.key] = pulled.get(m.key, 0) + 1
                    offset = res.next_begin_offset
                await pull.commit(mq, offset)
                assert await pull.committed_offset(mq) == offset
            a_keys = {k for k, b in acked.items() if b == "broker-a"}
            assert set(pulled) == a_keys, "pull consumer lost broker-a messages"
            assert all(c == 1 for c in pulled.values()), "pull consumer got a message twice"
            # the push consumer received everything once
            await eventually(lambda: set(received) >= set(acked), timeout=20)
            assert all(c == 1 for c in received.values()), "push consumer got a message twice"
            await producer.aclose()
            await push.aclose()
            await pull.aclose()
    finally:
        cluster.stop()


async def _groups_in_route(ns: NameserverClient, n: int) -> bool:
    return len((await ns.route(TOPIC)).broker_datas) == n


async def test_slave_ack_timeout_is_not_retried_and_the_message_stays(tmp_path: Path) -> None:
    """A send stored on the master whose slave copy is late fails with the
    non-retriable SlaveAckTimeout: the producer must not store it again elsewhere."""
    from ha_controller.protocol.errors import SlaveAckTimeout

    cluster = run_cluster(
        ("ack-a", "ack-b"), 2, workdir=tmp_path, env={"HAC_SLAVE_ACK_TIMEOUT_MS": "500"}
    )
    try:
        async with NameserverClient([cluster.namesrv]) as ns:
            await wait_masters(ns, 2)
            await ns.create_topic(TOPIC, queues=1)
            await eventually(lambda: _groups_in_route(ns, 2), timeout=10)
        async with Producer(cluster.namesrv, group="ack-p") as producer:
            # warm up until a send has landed on ack-a, then freeze ack-a's slave
            while (await producer.send(Message(TOPIC, b"warm"))).broker_name != "ack-a":
                pass
            cluster.broker("ack-a", 1).pause()
            outcomes: dict[str, str] = {}
            for i in range(6):
                key = f"late-{i}"
                try:
                    r = await producer.send(Message(TOPIC, key.encode(), keys=(key,)))
                    outcomes[key] = r.broker_name
                except SlaveAckTimeout:
                    outcomes[key] = "unknown"
            cluster.broker("ack-a", 1).resume()
        unknown = [k for k, v in outcomes.items() if v == "unknown"]
        assert unknown, f"no send hit the frozen slave: {outcomes}"
        async with PullConsumer(cluster.namesrv, "ack-check") as pull:
            stored = await read_all(pull, await pull.queues(TOPIC))
        for key in unknown:
            assert key in stored, f"{key} (outcome unknown) was not stored on ack-a"
        # read_all asserts that nothing is stored twice
    finally:
        cluster.stop()


async def test_a_slave_never_sends_a_consumer_back(tmp_path: Path) -> None:
    """Asked past its end, a slave answers "no new message" at the same offset
    (it is behind), where the master corrects the offset."""
    from ha_controller.proto import broker_pb2
    from ha_controller.protocol.codes import RequestCode
    from ha_controller.rpc import ConnectionPool

    cluster = run_cluster(("behind",), 2, workdir=tmp_path)
    try:
        async with NameserverClient([cluster.namesrv]) as ns:
            await wait_masters(ns, 1)
        async with Producer(cluster.namesrv, group="b-p") as producer:
            for i in range(5):
                await producer.send(Message(TOPIC, f"m{i}".encode()))
        async with ConnectionPool() as pool:

            async def pull(addr: str, offset: int) -> broker_pb2.PullMessageResponse:
                req = broker_pb2.PullMessageRequest(
                    consumer_group="g",
                    topic=TOPIC,
                    queue_id=0,
                    queue_offset=offset,
                    max_msg_nums=8,
                    commit_offset=-1,
                )
                return await pool.call_pb(
                    addr, RequestCode.PULL_MESSAGE, req, broker_pb2.PullMessageResponse
                )

            master, slave = cluster.broker("behind", 0).rpc, cluster.broker("behind", 1).rpc
            on_master = await pull(master, 1000)
            assert on_master.status == broker_pb2.OFFSET_ILLEGAL
            assert on_master.next_begin_offset < 1000
            on_slave = await pull(slave, 1000)
            assert on_slave.status == broker_pb2.NO_NEW_MSG
            assert on_slave.next_begin_offset == 1000
    finally:
        cluster.stop()
