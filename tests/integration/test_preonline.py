"""Issue 6 over real processes: a returning master reverse-syncs the newer
consumer offsets of its acting slave before it serves (GetMetadataReverseIT),
stays invisible while it does, and the check can fail without it."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message, MessageQueue
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer, PullStatus
from ha_controller.testing import Cluster, ProcessHandle, eventually, run_cluster

TOPIC = "OneQueue"
GROUP = "reverse-g"


def http(h: ProcessHandle, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://{h.http}{path}", timeout=3) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


async def master_online(ns: NameserverClient, cluster: Cluster) -> bool:
    group = await ns.member_group("DefaultCluster", "g1")
    return group.broker_addrs.get(0) == cluster.broker("g1", 0).rpc


async def consume_all_from_acting(cluster: Cluster, n: int) -> int:
    """Consume everything through the route's id 0 (the acting slave), committing."""
    async with PullConsumer(cluster.namesrv, GROUP) as pull:
        mq = MessageQueue(TOPIC, "g1", 0)
        offset = max(0, await pull.committed_offset(mq))
        got = 0
        while got < n:
            res = await pull.pull(mq, offset, max_msgs=8, suspend_timeout_ms=0)
            assert res.status is PullStatus.FOUND, res.status
            got += len(res.messages)
            offset = res.next_begin_offset
            await pull.commit(mq, offset)
        return offset


async def scenario(cluster: Cluster) -> tuple[int, int]:
    """32 messages; kill master; consume all from the acting slave; restart master.
    Returns (the returning master's committed offset, messages a fresh consumer gets)."""
    await cluster.wait_ready()  # its slaves attached too: the sends need two copies
    async with NameserverClient([cluster.namesrv]) as ns:
        await ns.create_topic(TOPIC, queues=1)
        async with Producer(cluster.namesrv, group="rev-p") as p:
            for i in range(32):
                await p.send(Message(TOPIC, f"m{i}".encode(), keys=(f"k{i}",)))
        cluster.broker("g1", 0).kill()

        async def acting() -> bool:
            r = await ns.route(TOPIC)
            b = r.broker("g1")
            return b is not None and b.broker_addrs.get(0) == cluster.broker("g1", 1).rpc

        await eventually(acting, timeout=10)
        assert await consume_all_from_acting(cluster, 32) == 32
        await asyncio.to_thread(cluster.restart, "g1", 0)
        await eventually(lambda: master_online(ns, cluster), timeout=30)
    async with PullConsumer(cluster.namesrv, GROUP) as pull:
        mq = MessageQueue(TOPIC, "g1", 0)
        committed = await pull.committed_offset(mq)
        start = max(0, committed)
        res = await pull.pull(mq, start, max_msgs=64, suspend_timeout_ms=0)
        again = len(res.messages) if res.status is PullStatus.FOUND else 0
    return committed, again


async def test_returning_master_adopts_acting_slave_offsets(tmp_path: Path) -> None:
    cluster = run_cluster(("g1",), 3, workdir=tmp_path)
    try:
        committed, again = await scenario(cluster)
        assert committed >= 32
        assert again == 0, f"a fresh consumer received {again} of the 32 again"
        log = cluster.broker("g1", 0).log_tail(200)
        assert "pre-online: consumer offsets of slave 1 adopted" in log
    finally:
        cluster.stop()


async def test_skip_pre_online_shows_the_rollback(tmp_path: Path) -> None:
    cluster = run_cluster(("g1",), 3, workdir=tmp_path, env={"HAC_SKIP_PRE_ONLINE": "true"})
    try:
        committed, again = await scenario(cluster)
        assert committed < 32, "without pre-online the master's offsets roll back"
        assert again > 0, "and a fresh consumer receives messages again"
    finally:
        cluster.stop()


async def test_master_stays_isolated_while_slaves_are_unreachable(tmp_path: Path) -> None:
    # slaves stay registered while paused: a long heartbeat timeout
    cluster = run_cluster(
        ("g1",), 3, workdir=tmp_path, env={"HAC_BROKER_NOT_ACTIVE_TIMEOUT_MS": "60000"}
    )
    try:
        async with NameserverClient([cluster.namesrv]) as ns:
            await eventually(lambda: master_online(ns, cluster), timeout=30)
            s1, s2 = cluster.broker("g1", 1), cluster.broker("g1", 2)
            cluster.broker("g1", 0).kill()
            await eventually(lambda: _not_listed(ns, cluster.broker("g1", 0).rpc), timeout=10)
            s1.pause()
            s2.pause()
            try:
                master = await asyncio.to_thread(cluster.restart, "g1", 0)

                def isolated() -> bool:
                    code, status = http(master, "/api/v1/status")
                    return (
                        code == 200 and status["isolated"] and "waiting" in status["preOnlineStep"]
                    )

                await eventually(isolated, timeout=15)
                assert http(master, "/readyz")[0] == 503
                assert await _not_listed(ns, master.rpc)
                await asyncio.sleep(2.5)
                cycles = master.log_tail(400).count("staying isolated")
                assert 1 <= cycles <= 12, f"{cycles} log lines for ~3 s of 1 s retries"
            finally:
                s1.resume()
                s2.resume()
            await eventually(lambda: master_online(ns, cluster), timeout=30)
            assert http(master, "/readyz")[0] == 200
            assert http(master, "/api/v1/status")[1]["isolated"] is False
    finally:
        cluster.stop()


async def _not_listed(ns: NameserverClient, addr: str) -> bool:
    group = await ns.member_group("DefaultCluster", "g1")
    return addr not in group.broker_addrs.values()


async def test_a_restarted_slave_serves_only_after_its_ha_link(tmp_path: Path) -> None:
    cluster = run_cluster(("g1",), 3, workdir=tmp_path)
    try:
        async with NameserverClient([cluster.namesrv]) as ns:
            await eventually(lambda: master_online(ns, cluster), timeout=30)
            cluster.broker("g1", 1).kill()
            await eventually(lambda: _not_listed(ns, cluster.broker("g1", 1).rpc), timeout=10)
            # written while slave 1 is down (slave 2 holds the second copy)
            async with Producer(cluster.namesrv, group="s-p") as p:
                for i in range(10):
                    await p.send(Message(TOPIC, f"m{i}".encode()))
            master_end = http(cluster.broker("g1", 0), "/api/v1/status")[1]["commitLogMaxOffset"]
            slave = await asyncio.to_thread(cluster.restart, "g1", 1)

            async def listed() -> bool:
                return not await _not_listed(ns, slave.rpc)

            await eventually(listed, timeout=20)
            code, status = http(slave, "/api/v1/status")
            assert code == 200 and status["isolated"] is False and status["role"] == "slave"
            assert "pre-online done: registering as slave" in slave.log_tail(200)
            # it registered only after its HA link delivered what it had missed
            assert status["commitLogMaxOffset"] >= master_end > 0
    finally:
        cluster.stop()
