"""POP while a group's master is away (RocketMQ PopSlaveActingMasterIT),
over real processes.

16 messages sit on ``popa``; its master dies and the simple consumer pops them
from the acting slave.  Acked messages never come back; un-acked ones are revived
into ``%RETRY%{group}`` by the master that received the slave's checkpoints
(in the same process: local; another group's process: remote), which reads the
bodies back from ``popa`` (from its own process when a ``popa`` replica lives
there, else remotely).
"""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import pytest
from special_helpers import acting, create_topic_on, masters_online

from ha_controller.client.message import Message, ReceivedMessage
from ha_controller.client.producer import Producer
from ha_controller.client.simple_consumer import SimpleConsumer
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.properties import PROPERTY_POP_CK
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import (
    Cluster,
    ContainerHandle,
    eventually,
    run_broker,
    run_cluster,
    run_container,
)

TOPIC = "POPT"
GROUP = "pop-group"
N = 16
ENV = {"HAC_POP_REVIVE_INTERVAL_MS": "200"}
INVISIBLE_S = 2.0


async def prepare(cluster: Cluster, groups: list[str]) -> set[bytes]:
    await masters_online(cluster.namesrv, groups)
    await create_topic_on(cluster.broker("popa", 0).rpc, TOPIC)
    bodies = {f"pop-{i}".encode() for i in range(N)}
    async with Producer(cluster.namesrv, "pop-producer", topics=[TOPIC]) as producer:
        for body in sorted(bodies):
            await producer.send(Message(TOPIC, body))
    return bodies


async def receive_all(consumer: SimpleConsumer, bodies: set[bytes], *, ack: bool) -> list[str]:
    """Receive until every body came once; ack them or not; returns their topics."""
    got: dict[bytes, str] = {}

    async def step() -> bool:
        for m in await consumer.receive(N, wait_s=0.5):
            assert m.body not in got, f"{m.body!r} received twice"
            got[m.body] = m.topic
            if ack:
                await consumer.ack(m)
        return set(got) == bodies

    await eventually(step, timeout=30, interval=0.05)
    return list(got.values())


async def nothing_more(consumer: SimpleConsumer, seconds: float) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        assert await consumer.receive(N, wait_s=0.3) == []


def local_ck_escapes(container: ContainerHandle) -> float:
    """CKs the container's popa slave escaped to its in-process master (metrics)."""
    http = container.member("popa", 1)["http"]
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("hac_escape_messages_total")
        and 'kind="pop_ck"' in line
        and 'target="local"' in line
        and 'result="ok"' in line
    )


async def scenario(cluster: Cluster, acting_addr: str, groups: list[str], *, ack: bool) -> None:
    bodies = await prepare(cluster, groups)
    cluster.broker("popa", 0).kill()
    await acting(cluster.namesrv, "popa", acting_addr, TOPIC)
    async with SimpleConsumer(
        cluster.namesrv, GROUP, [TOPIC], invisible_duration_s=INVISIBLE_S
    ) as consumer:
        topics = await receive_all(consumer, bodies, ack=ack)
        assert set(topics) == {TOPIC}
        if ack:
            await nothing_more(consumer, INVISIBLE_S + 2.0)
            await asyncio.to_thread(cluster.restart, "popa", 0)
            await masters_online(cluster.namesrv, groups)
            await nothing_more(consumer, 2.0)
        else:
            retried = await receive_all(consumer, bodies, ack=True)
            assert set(retried) == {f"%RETRY%{GROUP}"}
            await nothing_more(consumer, INVISIBLE_S + 1.0)


def two_groups(tmp_path: Path) -> Cluster:
    return run_cluster(("popa", "popb"), 2, workdir=tmp_path, env=ENV)


async def test_remote_acting_ack(tmp_path: Path) -> None:
    cluster = two_groups(tmp_path)
    try:
        await scenario(cluster, cluster.broker("popa", 1).rpc, ["popa", "popb"], ack=True)
    finally:
        cluster.stop()


async def test_remote_acting_no_ack_body_from_remote(tmp_path: Path) -> None:
    cluster = two_groups(tmp_path)
    try:
        await scenario(cluster, cluster.broker("popa", 1).rpc, ["popa", "popb"], ack=False)
    finally:
        cluster.stop()


async def with_container(
    tmp_path: Path, hosted: list[tuple[str, int]], others: list[tuple[str, int]]
) -> tuple[Cluster, ContainerHandle]:
    cluster = run_cluster((), 2, workdir=tmp_path, env=ENV)
    try:
        container = run_container(cluster.namesrv, hosted, tmp_path / "c1", env=cluster.env)
    except BaseException:
        cluster.stop()
        raise
    try:
        for name, bid in others:
            cluster.brokers[(name, bid)] = run_broker(
                cluster.namesrv, name, bid, tmp_path, env=cluster.env
            )
    except BaseException:
        container.kill()
        cluster.stop()
        raise
    return cluster, container


async def test_local_acting_ack(tmp_path: Path) -> None:
    cluster, container = await with_container(
        tmp_path, [("popb", 0), ("popa", 1)], [("popb", 1), ("popa", 0)]
    )
    try:
        await scenario(cluster, container.rpc_of("popa", 1), ["popa", "popb"], ack=True)
        assert local_ck_escapes(container) >= 1
    finally:
        container.kill()
        cluster.stop()


async def test_local_acting_no_ack(tmp_path: Path) -> None:
    cluster, container = await with_container(
        tmp_path, [("popb", 0), ("popa", 1)], [("popb", 1), ("popa", 0)]
    )
    try:
        await scenario(cluster, container.rpc_of("popa", 1), ["popa", "popb"], ack=False)
        assert local_ck_escapes(container) >= 1
    finally:
        container.kill()
        cluster.stop()


async def test_remote_acting_no_ack_body_from_local(tmp_path: Path) -> None:
    """popb's master shares a process with popa's id 2 (not the acting one): it reads
    the bodies from that local replica instead of pulling them."""
    cluster, container = await with_container(
        tmp_path,
        [("popb", 0), ("popa", 2)],
        [("popb", 1), ("popa", 1), ("popa", 0)],
    )
    try:
        await scenario(cluster, cluster.broker("popa", 1).rpc, ["popa", "popb"], ack=False)
    finally:
        container.kill()
        cluster.stop()


# ---- orderly POP across a failover ---------------------------------------------------


ORDERLY_GROUP = "orderly-group"


async def pop_orderly(pool: ConnectionPool, addr: str, invisible_ms: int) -> list[bytes]:
    resp = await pool.call_pb(
        addr,
        RequestCode.POP_MESSAGE,
        broker_pb2.PopMessageRequest(
            consumer_group=ORDERLY_GROUP,
            topic=TOPIC,
            queue_id=0,
            max_msg_nums=4,
            invisible_time_ms=invisible_ms,
        ),
        broker_pb2.PopMessageResponse,
    )
    return [m.body for m in resp.messages]


async def test_orderly_batch_in_flight_comes_again_from_the_acting_slave_in_order(
    tmp_path: Path,
) -> None:
    """An orderly group (its subscription group config, set on the master, synced to
    the slave): the master gives queue 0 to one batch; the master dies with the batch
    un-acked.  The acting slave knows no lock, so it gives the queue to nobody for one
    invisible time, then the same batch again, first — never a later message before."""
    cluster = run_cluster(("popa",), 2, workdir=tmp_path, env=ENV)
    try:
        await masters_online(cluster.namesrv, ["popa"])
        master = cluster.broker("popa", 0).rpc
        slave = cluster.broker("popa", 1).rpc
        await create_topic_on(master, TOPIC, queues=1)
        async with ConnectionPool() as pool:
            await pool.call_pb(
                master,
                RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                broker_pb2.UpdateSubscriptionGroupRequest(
                    config=broker_pb2.SubscriptionGroupConfig(
                        group_name=ORDERLY_GROUP, consume_orderly=True
                    )
                ),
                common_pb2.Empty,
            )
            async with Producer(cluster.namesrv, "pop-producer", topics=[TOPIC]) as producer:
                for i in range(6):
                    await producer.send(Message(TOPIC, f"o-{i}".encode()))

            async def slave_knows_orderly() -> bool:
                table = await pool.call_pb(
                    slave,
                    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
                    common_pb2.Empty(),
                    broker_pb2.SubscriptionGroupTable,
                )
                return any(g.consume_orderly for g in table.groups)

            await eventually(slave_knows_orderly, timeout=10, interval=0.2)
            invisible_ms = 3000
            first = await pop_orderly(pool, master, invisible_ms)
            assert first == [b"o-0", b"o-1", b"o-2", b"o-3"]
            assert await pop_orderly(pool, master, invisible_ms) == []  # held by the batch

            cluster.broker("popa", 0).kill()
            await acting(cluster.namesrv, "popa", slave, TOPIC)
            took_over = asyncio.get_running_loop().time()

            async def again() -> list[bytes]:
                return await pop_orderly(pool, slave, invisible_ms)

            got = await eventually(again, timeout=15, interval=0.2)
            waited = asyncio.get_running_loop().time() - took_over
            assert got == first, got  # the same batch, first
            assert waited >= invisible_ms / 1000 - 1.0, waited
    finally:
        cluster.stop()


# ---- acks taken by the acting slave reach the returning master -------------------------

#: Long enough that the master is back before any checkpoint of the test is due.
RETURN_INVISIBLE_S = 12.0


@pytest.mark.parametrize(
    "fault",
    # frozen: the same return path after an expiry (test_pause_isolation.py freezes one)
    ["killed", pytest.param("frozen", marks=pytest.mark.slow)],
)
async def test_acks_on_the_acting_slave_are_never_revived_by_the_returning_master(
    tmp_path: Path, fault: str
) -> None:
    """The master pops 16 messages (its checkpoints in its revive queue, replicated)
    and is killed (or frozen past expiry); the consumer acks 12 of them on the acting
    slave.  The master comes back (restarted, or resumed: it fences itself) before the
    checkpoints are due: it takes the slave's POP ack table in pre-online, so within
    two invisible times only the 4 un-acked messages come again."""
    cluster = two_groups(tmp_path)
    old_master = cluster.broker("popa", 0)
    try:
        bodies = await prepare(cluster, ["popa", "popb"])
        slave = cluster.broker("popa", 1).rpc
        async with (
            SimpleConsumer(
                cluster.namesrv, GROUP, [TOPIC], invisible_duration_s=RETURN_INVISIBLE_S
            ) as consumer,
            ConnectionPool() as pool,
        ):
            popped: list[ReceivedMessage] = []
            first_pop = asyncio.get_running_loop().time()

            async def all_popped() -> bool:
                popped.extend(await consumer.receive(N, wait_s=0.5))
                return len(popped) >= N

            await eventually(all_popped, timeout=20, interval=0.05)
            assert {m.body for m in popped} == bodies
            unacked = {m.body for m in popped[::4]}  # the first checkpoint keeps one
            acked = bodies - unacked

            if fault == "killed":
                old_master.kill()
            else:
                old_master.pause()
            await acting(cluster.namesrv, "popa", slave, TOPIC)
            for m in popped:
                if m.body in acked:
                    await pool.call_pb(
                        slave,
                        RequestCode.ACK_MESSAGE,
                        broker_pb2.AckMessageRequest(
                            consumer_group=GROUP,
                            topic=m.topic,
                            receipt_handle=m.properties[PROPERTY_POP_CK],
                        ),
                        broker_pb2.AckMessageResponse,
                    )

            if fault == "killed":
                await asyncio.to_thread(cluster.restart, "popa", 0)
            else:
                old_master.resume()
            master = cluster.broker("popa", 0).rpc
            await acting(cluster.namesrv, "popa", master, TOPIC)
            returned = asyncio.get_running_loop().time()
            assert returned - first_pop < RETURN_INVISIBLE_S, "master back too late"

            again: list[bytes] = []
            deadline = returned + 2 * RETURN_INVISIBLE_S
            while asyncio.get_running_loop().time() < deadline:
                for m in await consumer.receive(N, wait_s=0.5):
                    again.append(m.body)
                    await consumer.ack(m)
            assert not acked & set(again), sorted(acked & set(again))
            assert sorted(again) == sorted(unacked)
        log = cluster.broker("popa", 0).log_path.read_text()
        assert "pre-online: pop acks of slave 1 adopted" in log
    finally:
        old_master.resume()
        cluster.stop()
