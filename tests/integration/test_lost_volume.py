"""A master that lost its volume (issue "A master that lost its volume"): kill -9 the
master of a group of 3, delete its store directory, restart it.  It used to refuse
its slaves every second for ever ("slave reports offset beyond our max"); now its
pre-online copies the commit log and the metadata of its most advanced slave, then it
goes online as id 0 with every acknowledged message readable from it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import time
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message
from ha_controller.client.producer import Producer
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import Cluster, ProcessHandle, eventually, run_cluster

TOPIC = "LostVolume"
QUEUES = 4
SENT = 3000
BODY_BYTES = 8 * 1024  # ~24 MiB of commit log: the catch-up takes long enough to be seen
GROUP = "lost-volume-check"
#: how long the restarted master may take to be id 0 again
ONLINE_WITHIN_S = 60.0


def status(h: ProcessHandle) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://{h.http}/api/v1/status", timeout=2) as r:
            return dict(json.loads(r.read()))
    except (urllib.error.URLError, OSError, ValueError):
        return None


async def master_is(ns: NameserverClient, addr: str | None) -> bool:
    group = await ns.member_group("DefaultCluster", "g1")
    return group.broker_addrs.get(0) == addr


def body(i: int) -> bytes:
    return (f"m{i:06d}-".encode() * (BODY_BYTES // 8 + 1))[:BODY_BYTES]


async def produce(cluster: Cluster) -> dict[tuple[int, int], str]:
    """SENT messages, 32 in flight; (queue id, queue offset) -> body digest of each ack."""
    acked: dict[tuple[int, int], str] = {}
    async with Producer(cluster.namesrv, group="lost-volume-p") as p:
        for start in range(0, SENT, 32):
            batch = range(start, min(SENT, start + 32))
            receipts = await asyncio.gather(*(p.send(Message(TOPIC, body(i))) for i in batch))
            for i, r in zip(batch, receipts, strict=True):
                assert r.broker_name == "g1"
                acked[(r.queue_id, r.queue_offset)] = hashlib.sha256(body(i)).hexdigest()
    return acked


async def read_queue(pool: ConnectionPool, addr: str, queue_id: int) -> dict[int, str]:
    """Every message of one queue, pulled from ``addr`` directly (no route, no commit)."""
    out: dict[int, str] = {}
    offset = 0
    while True:
        res = await pool.call_pb(
            addr,
            RequestCode.PULL_MESSAGE,
            broker_pb2.PullMessageRequest(
                consumer_group=GROUP,
                topic=TOPIC,
                queue_id=queue_id,
                queue_offset=offset,
                max_msg_nums=32,
                commit_offset=-1,
            ),
            broker_pb2.PullMessageResponse,
            timeout_ms=5000,
        )
        if res.status != broker_pb2.FOUND:
            return out
        for m in res.messages:
            out[m.queue_offset] = hashlib.sha256(m.body).hexdigest()
        offset = res.next_begin_offset


async def slave_knows(pool: ConnectionPool, addr: str, committed: dict[int, int]) -> bool:
    """The slave at ``addr`` holds the topic and the group's committed offsets (its
    2 s forward sync from the master)."""
    topics = await pool.call_pb(
        addr, RequestCode.GET_ALL_TOPIC_CONFIG, common_pb2.Empty(), broker_pb2.TopicConfigTable
    )
    offsets = await pool.call_pb(
        addr,
        RequestCode.GET_ALL_CONSUMER_OFFSET,
        common_pb2.Empty(),
        broker_pb2.ConsumerOffsetTable,
    )
    theirs = {e.queue_id: e.offset for e in offsets.entries if e.consumer_group == GROUP}
    return TOPIC in {t.topic_name for t in topics.topics} and theirs == committed


async def commit(pool: ConnectionPool, addr: str, queue_id: int, offset: int) -> None:
    await pool.call_pb(
        addr,
        RequestCode.UPDATE_CONSUMER_OFFSET,
        broker_pb2.ConsumerOffsetRequest(
            consumer_group=GROUP, topic=TOPIC, queue_id=queue_id, offset=offset
        ),
        common_pb2.Empty,
    )


async def committed_offset(pool: ConnectionPool, addr: str, queue_id: int) -> int:
    res = await pool.call_pb(
        addr,
        RequestCode.QUERY_CONSUMER_OFFSET,
        broker_pb2.ConsumerOffsetRequest(consumer_group=GROUP, topic=TOPIC, queue_id=queue_id),
        broker_pb2.OffsetResponse,
    )
    return int(res.offset)


async def test_master_that_lost_its_volume_catches_up_and_rejoins(tmp_path: Path) -> None:
    cluster = run_cluster(("g1",), 3, workdir=tmp_path)
    committed = {qid: 10 + qid for qid in range(QUEUES)}
    try:
        async with NameserverClient([cluster.namesrv]) as ns, ConnectionPool() as pool:
            old = cluster.broker("g1", 0)
            await eventually(lambda: master_is(ns, old.rpc), timeout=30)
            await ns.create_topic(TOPIC, queues=QUEUES)
            acked = await produce(cluster)
            assert len(acked) == SENT
            for qid, offset in committed.items():
                await commit(pool, old.rpc, qid, offset)
            for bid in (1, 2):
                addr = cluster.broker("g1", bid).rpc
                await eventually(partial(slave_knows, pool, addr, committed), timeout=10)
            before = status(old)
            assert before is not None
            old.kill()
            shutil.rmtree(tmp_path / "store" / "g1-0")
            await eventually(lambda: master_is(ns, None), timeout=15)

            master = await asyncio.to_thread(cluster.restart, "g1", 0)
            started = time.monotonic()
            steps: list[str] = []

            async def watch() -> None:
                while True:
                    st = await asyncio.to_thread(status, master)
                    if st is not None and (not steps or steps[-1] != st["preOnlineStep"]):
                        steps.append(st["preOnlineStep"])
                    await asyncio.sleep(0.01)

            watcher = asyncio.create_task(watch())
            try:
                await eventually(lambda: master_is(ns, master.rpc), timeout=ONLINE_WITHIN_S)
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
            took = time.monotonic() - started
        log = master.log_path.read_text()
        assert any(s.startswith("catching up from slave") for s in steps), (steps, log[-4000:])
        assert "caught up from slave" in log, master.log_tail(80)
        assert "beyond our max" not in log, master.log_tail(80)
        after = status(master)
        assert after is not None and after["brokerId"] == 0 and after["isolated"] is False
        assert after["commitLogMaxOffset"] >= before["commitLogMaxOffset"]
        # every acknowledged message is readable from the returned master itself, and
        # the group's committed offsets are its own again
        async with ConnectionPool() as pool:
            stored: dict[tuple[int, int], str] = {}
            for qid in range(QUEUES):
                for qoff, digest in (await read_queue(pool, master.rpc, qid)).items():
                    stored[(qid, qoff)] = digest
                assert await committed_offset(pool, master.rpc, qid) == committed[qid]
        missing = [k for k, d in acked.items() if stored.get(k) != d]
        assert not missing, f"{len(missing)} of {SENT} acknowledged messages missing: {missing[:5]}"
        # the HA stream works again: SYNC sends need a slave's copy
        async with Producer(cluster.namesrv, group="lost-volume-p2") as p:
            for _ in range(10):
                r = await p.send(Message(TOPIC, b"after"))
                assert r.broker_name == "g1"
        await eventually(lambda: len((status(master) or {}).get("slaves", [])) == 2, timeout=10)
        print(f"lost volume: online as id 0 {took:.1f} s after the restart; steps: {steps}")
    finally:
        cluster.stop()
