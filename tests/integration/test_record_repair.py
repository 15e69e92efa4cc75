"""A damaged record of a running master is repaired from its slaves, never skipped
(issue 34: "a corrupt replica never delivers corrupt data and never becomes the
source of truth"; the corruption drills lost acknowledged delay, POP and orderly
messages this way).

A group of a master and two slaves (SYNC: a message is acknowledged once the in-sync
slaves hold it) stores normal, POP and delayed messages; then, while the master runs,
its commit-log segment is truncated inside the first of them (or a few bits of one
stored record are flipped).  Every acknowledged message must still be delivered
exactly once with its body intact — pulled, popped, and the delayed ones delivered
to their topic — and the master's ``hac_store_records_repaired_total{result=
"repaired"}`` counts the records it copied back.  A broker that skips an unreadable
record (the group's offset moves past it) loses them.

Real processes over real TCP and files.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest
from special_helpers import create_topic_on, masters_online, send_raw

from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.properties import PROPERTY_DELAY, PROPERTY_POP_CK, PROPERTY_UNIQ_KEY
from ha_controller.protocol.record import parse_msg_id
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import eventually, run_cluster
from ha_controller.testing.processes import ProcessHandle, http_get

pytestmark = pytest.mark.timeout(90)

GROUP = "repair"
SEGMENT = 16 << 20
ENV = {
    "HAC_DELAY_LEVELS": "2s",
    "HAC_IN_SYNC_REPLICAS": "3",
    "HAC_SEGMENT_SIZE_BYTES": str(SEGMENT),
}
NORMAL, POPPED, DELAYED = "RepairNormal", "RepairPopped", "RepairDelayed"
N = 12
CG = "repair-cg"


def body(kind: str, i: int) -> bytes:
    return f"{kind}-{i:03d}-".encode() * 20


def segment_of(workdir: Path, offset: int) -> Path:
    store = workdir / "store" / f"{GROUP}-0" / "commitlog"
    return store / f"{offset - offset % SEGMENT:020d}"


def repaired_records(handle: ProcessHandle) -> float:
    _, text = http_get(handle.http, "/metrics")
    found = re.search(
        r'^hac_store_records_repaired_total\{[^}]*result="repaired"[^}]*\} (\S+)$',
        text.decode(),
        re.MULTILINE,
    )
    return float(found.group(1)) if found else 0.0


async def pull_all(pool: ConnectionPool, addr: str, topic: str) -> list[bytes]:
    """Every message of queue 0 from offset 0, as a consumer that retries would read
    it (an answer without messages ends the read)."""
    out: list[bytes] = []
    offset = 0
    while True:
        resp = await pool.call_pb(
            addr,
            RequestCode.PULL_MESSAGE,
            broker_pb2.PullMessageRequest(
                consumer_group=CG,
                topic=topic,
                queue_id=0,
                queue_offset=offset,
                max_msg_nums=64,
                commit_offset=-1,
            ),
            broker_pb2.PullMessageResponse,
            3000,
        )
        if resp.status != broker_pb2.FOUND:
            return out
        out.extend(m.body for m in resp.messages)
        offset = resp.next_begin_offset


async def pop_and_ack(pool: ConnectionPool, addr: str) -> list[bytes]:
    resp = await pool.call_pb(
        addr,
        RequestCode.POP_MESSAGE,
        broker_pb2.PopMessageRequest(
            consumer_group=CG,
            topic=POPPED,
            queue_id=0,
            max_msg_nums=32,
            invisible_time_ms=60_000,
        ),
        broker_pb2.PopMessageResponse,
    )
    for m in resp.messages:
        await pool.call_pb(
            addr,
            RequestCode.ACK_MESSAGE,
            broker_pb2.AckMessageRequest(
                consumer_group=CG, topic=POPPED, receipt_handle=m.properties[PROPERTY_POP_CK]
            ),
            broker_pb2.AckMessageResponse,
        )
    return [m.body for m in resp.messages]


def damage(path: Path, offset: int, size: int, fault: str) -> None:
    """Under the running master: cut its segment inside the record at ``offset``, or
    flip a few bits in the middle of it."""
    at = offset % SEGMENT
    if fault == "truncate":
        os.truncate(path, at + 17)
        return
    with path.open("r+b") as f:
        f.seek(at + size // 2)
        chunk = bytearray(f.read(4))
        chunk[0] ^= 0x21
        chunk[3] ^= 0x80
        f.seek(at + size // 2)
        f.write(chunk)


@pytest.mark.parametrize("fault", ["truncate", "flip"])
async def test_a_damaged_record_on_a_running_master_is_repaired_from_its_slaves(
    tmp_path: Path, fault: str
) -> None:
    cluster = run_cluster((GROUP,), 3, workdir=tmp_path, env=ENV)
    try:
        await masters_online(cluster.namesrv, [GROUP])
        master = cluster.broker(GROUP, 0)
        for topic in (NORMAL, POPPED, DELAYED):
            await create_topic_on(master.rpc, topic, queues=1)
        async with ConnectionPool() as pool:
            # the first record of the test is the one damaged: every later one lies in
            # the truncated tail (a flip damages that one record)
            sent: list[broker_pb2.SendResult] = []
            for i in range(N):
                for topic, props in (
                    (NORMAL, {}),
                    (POPPED, {}),
                    (DELAYED, {PROPERTY_DELAY: "1"}),
                ):
                    kind = topic.removeprefix("Repair").lower()
                    result = await send_raw(
                        pool,
                        master.rpc,
                        topic,
                        0,
                        {PROPERTY_UNIQ_KEY: f"{kind}-{i}", **props},
                        body=body(kind, i),
                    )
                    sent.append(result)
            first = sent[0]
            _, offset = parse_msg_id(first.msg_id)
            path = segment_of(tmp_path, offset)
            size = len(body("normal", 0)) + 100  # within the record: body + head
            before = repaired_records(master)
            damage(path, offset, size, fault)
            expected = {
                kind: sorted(body(kind, i) for i in range(N))
                for kind in ("normal", "popped", "delayed")
            }
            popped: list[bytes] = []

            async def all_delivered() -> bool:
                popped.extend(await pop_and_ack(pool, master.rpc))
                normal = await pull_all(pool, master.rpc, NORMAL)
                delayed = await pull_all(pool, master.rpc, DELAYED)
                return (
                    sorted(normal) == expected["normal"]
                    and sorted(delayed) == expected["delayed"]
                    and sorted(popped) == expected["popped"]
                )

            try:
                await eventually(all_delivered, timeout=20, interval=0.2)
            finally:
                log = master.log_path.read_text(errors="replace")
                assert "Traceback" not in log, log[-3000:]
            # exactly once: nothing more comes, from any of the three
            assert await pop_and_ack(pool, master.rpc) == []
            assert sorted(await pull_all(pool, master.rpc, NORMAL)) == expected["normal"]
            assert sorted(await pull_all(pool, master.rpc, DELAYED)) == expected["delayed"]
            assert repaired_records(master) > before
            assert "repaired from a replica" in log
    finally:
        cluster.stop()


async def test_a_lost_tail_no_slave_received_is_cut_and_the_master_serves_again(
    tmp_path: Path,
) -> None:
    """The master's segment is truncated inside a record no slave received (stored
    while both slaves were frozen, not acknowledged): no replica can give it back, so
    once the slaves answer (they are restarted) the master cuts its log back there and
    rebuilds its service, instead of refusing appends until someone restarts it.  What
    was acknowledged before stays, intact; the unreplicated record is never served."""
    cluster = run_cluster((GROUP,), 3, workdir=tmp_path, env=ENV)
    try:
        await masters_online(cluster.namesrv, [GROUP])
        master = cluster.broker(GROUP, 0)
        await create_topic_on(master.rpc, NORMAL, queues=1)
        async with ConnectionPool() as pool:
            for i in range(N):
                await send_raw(pool, master.rpc, NORMAL, 0, {}, body=body("normal", i))
            slaves = [cluster.broker(GROUP, 1), cluster.broker(GROUP, 2)]
            for slave in slaves:
                slave.pause()
            # the links were caught up, so this one passes the replica check and is
            # stored; it does not wait for a copy (none comes: the slaves are frozen)
            lost = await send_raw(
                pool, master.rpc, NORMAL, 0, {}, body=b"never replicated", no_replica_wait=True
            )
            _, offset = parse_msg_id(lost.msg_id)
            damage(segment_of(tmp_path, offset), offset, 0, "truncate")
            for slave in slaves:
                slave.kill()
            for broker_id in (1, 2):
                await asyncio.to_thread(cluster.restart, GROUP, broker_id)

            async def cut_and_online() -> bool:
                log = master.log_path.read_text(errors="replace")
                assert "Traceback" not in log, log[-3000:]
                assert f"cutting the commit log back to {offset}" in log
                await send_raw(pool, master.rpc, NORMAL, 0, {}, body=body("normal", N))
                return True

            await eventually(cut_and_online, timeout=20, interval=0.3)
            got = await pull_all(pool, master.rpc, NORMAL)
            assert got == [body("normal", i) for i in range(N + 1)]
    finally:
        cluster.stop()
