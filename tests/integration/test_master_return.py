"""Every return of a master is safe (issue: a master frozen past its heartbeat timeout
and resumed used to re-register as id 0 without pre-online and roll its acting
slave's consumer offsets back, so everything consumed meanwhile came again).

The master keeps a lease on id 0 (no acknowledged heartbeat for longer than the
not-active timeout = it may have been expired); on resume it fences itself and goes
back through pre-online, and the nameserver will not hand id 0 back to a master
that did not say it completed pre-online while a slave acts for it.
"""

from __future__ import annotations

import asyncio
import signal
import tarfile
from pathlib import Path

import pytest

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message, MessageQueue
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer, PullStatus
from ha_controller.drills.cluster import ClusterSpec, DrillCluster
from ha_controller.drills.netns import netns_available
from ha_controller.proto import nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import PreOnlineRequired
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import Cluster, eventually, run_cluster

TOPIC = "Frozen"
GROUP = "frozen-consumers"
QUEUES = 2
SENT = 200


async def group_state(ns: NameserverClient) -> dict[int, str]:
    return dict((await ns.member_group("DefaultCluster", "g1")).broker_addrs)


async def consume_and_commit(cluster: Cluster | DrillCluster) -> dict[int, int]:
    """Read every queue of g1 to its end through the route's id 0, committing."""
    ends: dict[int, int] = {}
    async with PullConsumer(cluster.namesrv, GROUP) as pull:
        for qid in range(QUEUES):
            mq = MessageQueue(TOPIC, "g1", qid)
            offset = max(0, await pull.committed_offset(mq))
            while True:
                res = await pull.pull(mq, offset, max_msgs=32, suspend_timeout_ms=0)
                if res.status is not PullStatus.FOUND:
                    break
                offset = res.next_begin_offset
                await pull.commit(mq, offset)
            ends[qid] = offset
    return ends


async def delivered_again(cluster: Cluster | DrillCluster) -> int:
    """What a fresh consumer of the group gets from its committed offsets."""
    again = 0
    async with PullConsumer(cluster.namesrv, GROUP) as pull:
        for qid in range(QUEUES):
            mq = MessageQueue(TOPIC, "g1", qid)
            start = max(0, await pull.committed_offset(mq))
            res = await pull.pull(mq, start, max_msgs=256, suspend_timeout_ms=0)
            if res.status is PullStatus.FOUND:
                again += len(res.messages)
    return again


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return run_cluster(("g1",), 3, workdir=tmp_path)


async def test_frozen_master_resumed_after_expiry_delivers_nothing_again(
    cluster: Cluster,
) -> None:
    master = cluster.broker("g1", 0)
    try:
        async with NameserverClient([cluster.namesrv]) as ns:
            await eventually(lambda: _master_is(ns, master.rpc), timeout=30)
            await ns.create_topic(TOPIC, queues=QUEUES)
            async with Producer(cluster.namesrv, group="frozen-p") as p:
                for i in range(SENT):
                    await p.send(Message(TOPIC, f"m{i}".encode(), keys=(f"k{i}",)))
            master.pause()
            acting = cluster.broker("g1", 1).rpc
            # the nameserver expires the frozen master; slave 1 acts as id 0
            await eventually(lambda: _master_is(ns, None), timeout=15)
            await eventually(lambda: _route_id0_is(ns, acting), timeout=10)
            ends = await consume_and_commit(cluster)
            assert sum(ends.values()) == SENT
            master.resume()
            # the master comes back through pre-online (not by re-registering at once)
            await eventually(lambda: _master_is(ns, master.rpc), timeout=30)
        log = master.log_path.read_text()
        assert "fenced:" in log, master.log_tail(80)
        assert "pre-online: consumer offsets of slave 1 adopted" in log, master.log_tail(80)
        again = await delivered_again(cluster)
        assert again == 0, f"{again} of {SENT} consumed messages were delivered again"
        # and the group works again: new messages reach the same consumer group once
        async with Producer(cluster.namesrv, group="frozen-p2") as p:
            for i in range(20):
                await p.send(Message(TOPIC, f"n{i}".encode(), keys=(f"n{i}",)))
        assert await delivered_again(cluster) == 20
    finally:
        master.resume()
        cluster.stop()


async def _master_is(ns: NameserverClient, addr: str | None) -> bool:
    return (await group_state(ns)).get(0) == addr


async def _route_id0_is(ns: NameserverClient, addr: str) -> bool:
    route = await ns.route(TOPIC)
    b = route.broker("g1")
    return b is not None and b.broker_addrs.get(0) == addr


async def test_nameserver_refuses_id0_back_without_pre_online(cluster: Cluster) -> None:
    """A master that did not complete pre-online (an old broker, or one that simply
    re-registers) does not take id 0 back from an acting slave."""
    master = cluster.broker("g1", 0)
    try:
        async with NameserverClient([cluster.namesrv]) as ns:
            await eventually(lambda: _master_is(ns, master.rpc), timeout=30)
            await ns.create_topic(TOPIC, queues=QUEUES)
            master.signal(signal.SIGKILL)
            await eventually(lambda: _master_is(ns, None), timeout=15)
            req = nameserver_pb2.RegisterBrokerRequest(
                cluster="DefaultCluster",
                broker_addr=master.rpc,
                broker_name="g1",
                broker_id=0,
                ha_addr=master.ha,
                enable_acting_master=True,
                heartbeat_timeout_ms=2000,
            )
            async with ConnectionPool() as pool:
                with pytest.raises(PreOnlineRequired):
                    await pool.call_pb(
                        cluster.namesrv,
                        RequestCode.REGISTER_BROKER,
                        req,
                        nameserver_pb2.RegisterBrokerResponse,
                        timeout_ms=3000,
                    )
                assert await _master_is(ns, None)
                req.pre_online_done = True
                await pool.call_pb(
                    cluster.namesrv,
                    RequestCode.REGISTER_BROKER,
                    req,
                    nameserver_pb2.RegisterBrokerResponse,
                    timeout_ms=3000,
                )
                assert await _master_is(ns, master.rpc)
    finally:
        cluster.stop()


async def test_partitioned_master_healed_after_expiry_delivers_nothing_again(
    tmp_path: Path,
) -> None:
    """The same return through a healed network partition (network namespaces): the
    master is cut off from the nameserver and the clients, a consumer group commits
    through the acting slave, the link comes back."""
    reason = netns_available()
    if reason is not None:
        pytest.skip(f"network namespaces: {reason}")
    spec = ClusterSpec(groups=("g1",), replicas=3, netns=True)
    cluster = await asyncio.to_thread(DrillCluster(spec).start)
    master = "g1/0"
    try:
        master_addr = cluster.handle(master).rpc
        async with NameserverClient([cluster.namesrv]) as ns:
            await eventually(lambda: _master_is(ns, master_addr), timeout=30)
            await ns.create_topic(TOPIC, queues=QUEUES)
            async with Producer(cluster.namesrv, group="part-p") as p:
                for i in range(SENT):
                    await p.send(Message(TOPIC, f"m{i}".encode(), keys=(f"k{i}",)))
            await asyncio.to_thread(cluster.partition, master)
            await eventually(lambda: _master_is(ns, None), timeout=15)
            await eventually(lambda: _route_id0_is(ns, cluster.handle("g1/1").rpc), timeout=10)
            ends = await consume_and_commit(cluster)
            assert sum(ends.values()) == SENT
            await asyncio.to_thread(cluster.heal_partition, master)
            await eventually(lambda: _master_is(ns, master_addr), timeout=30)
        log = cluster.handle(master).log_path.read_text()
        assert "fenced:" in log
        again = await delivered_again(cluster)
        assert again == 0, f"{again} of {SENT} consumed messages were delivered again"
        # what a failing drill keeps: every broker's store, once the processes are gone
        kept = tmp_path / "stores.tar.gz"
        await asyncio.to_thread(cluster.close, kept)
        with tarfile.open(kept) as tar:
            names = tar.getnames()
        for member in ("g1-0", "g1-1", "g1-2"):
            assert any(n.startswith(f"store/{member}/commitlog") for n in names), names[:20]
    finally:
        await asyncio.to_thread(cluster.close)
