"""What an acting slave did, and what the last master took, survive an automatic
master switch (controller mode, against a real etcd; issue 33, the campaigns' open
defects; docs/failover.md, "Automatic master switch").

- **The acting slave's escapes.**  While the master is away the acting slave hands
  due timer messages on to another group's master.  When the controller elects it,
  its service is rebuilt as master: an escape still awaiting its answer used to be
  cancelled without its progress, the new master delivered the message again and the
  target stored the first one on resume (a duplicate).
- **The last master's consumer offsets.**  A commit the elected member lacks in its
  own table, or holds in a table another member outranks by its version, used to be
  lost: the new master took a member's table with the higher version whole, its older
  entries too (``consumer offsets of slave 1 older, kept ours`` in the campaign), and
  the consumers read those messages again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import Any

import pytest
from special_helpers import create_topic_on, messages_on, send_raw

from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import HaError
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import (
    Cluster,
    ProcessHandle,
    eventually,
    http_get,
    make_workdir,
    run_broker,
    run_cluster,
)
from ha_controller.testing.etcd import EtcdCluster, etcd_missing

pytestmark = pytest.mark.skipif(etcd_missing() is not None, reason=str(etcd_missing()))

TOPIC = "HandoverTopic"
QUEUES = 2


def controller_env(etcd: EtcdCluster) -> dict[str, str]:
    return {"HAC_ETCD_ENDPOINTS": etcd.endpoints, "HAC_AUTO_SWITCH_AFTER_MS": "500"}


def group(c: Cluster, name: str) -> dict[str, Any]:
    """The group as ``GET /api/v1/groups`` shows it (empty while no member is listed:
    every member may be re-registering under a new id after a switch)."""
    status, body = http_get(c.nameserver.http, "/api/v1/groups")
    assert status == 200, body
    return next((g for g in json.loads(body) if g["brokerName"] == name), {"members": []})


def master_addr(c: Cluster, name: str, epoch: int) -> str | None:
    """The address of ``name``'s id 0 once the group is at ``epoch`` (else None)."""
    g = group(c, name)
    if g.get("epoch") != epoch:
        return None
    row = next((m for m in g["members"] if m["brokerId"] == 0), None)
    return None if row is None else str(row["addr"])


async def at(start: float, offset_s: float) -> None:
    await asyncio.sleep(max(0.0, start + offset_s - time.monotonic()))


async def test_an_escape_in_flight_at_the_election_is_delivered_once(etcd: EtcdCluster) -> None:
    """g1's master is killed just before timer messages fall due, while g2's master
    (the only escape target) is frozen for less than its expiry: the acting slave's
    first escape waits for g2's answer when the controller elects that slave.  Its
    service must let the escape finish (g2 answers on resume) before it is rebuilt as
    master, and the new master must start from the slave's timer checkpoint."""
    count = 4
    due_after_s = 3.0
    c = run_cluster(("g1",), 3, workdir=make_workdir("handover-"), env=controller_env(etcd))
    g2: ProcessHandle = run_broker(
        c.namesrv,
        "g2",
        0,
        c.workdir,
        env={
            **c.env,
            "HAC_TOTAL_REPLICAS": "1",
            "HAC_IN_SYNC_REPLICAS": "1",
            # frozen below its expiry: its lease holds and it stores the escape on resume
            "HAC_BROKER_NOT_ACTIVE_TIMEOUT_MS": "8000",
        },
    )
    c.brokers[("g2", 0)] = g2
    try:
        await c.wait_ready(60)
        old = c.broker("g1", 0)
        await create_topic_on(old.rpc, TOPIC, QUEUES)
        await create_topic_on(g2.rpc, TOPIC, QUEUES)
        async with ConnectionPool() as pool:
            start = time.monotonic()
            due_ms = int(time.time() * 1000 + due_after_s * 1000)
            keys = [f"t-{i}" for i in range(count)]
            for i, key in enumerate(keys):
                props = {"UNIQ_KEY": key, "TIMER_DELIVER_MS": str(due_ms)}
                await send_raw(pool, old.rpc, TOPIC, i % QUEUES, props, body=b"timer")
            assert time.monotonic() - start < due_after_s - 0.5, "sending took too long"
            await at(start, due_after_s - 0.3)
            g2.pause()
            await at(start, due_after_s - 0.1)
            # the slave acts at once and escapes when the timers fall due, 0.1 s later;
            # the controller elects it about 0.5 s after the kill
            old.kill()
            await at(start, due_after_s + 1.4)
            g2.resume()

            def elected() -> str | None:
                return master_addr(c, "g1", 2)

            await eventually(lambda: elected() is not None, timeout=30)
            new = elected()
            assert new is not None

            async def all_there() -> bool:
                got = {
                    m.properties["UNIQ_KEY"]
                    for m in await messages_on(pool, [new, g2.rpc], TOPIC, QUEUES)
                }
                return set(keys) <= got

            await eventually(all_there, timeout=30, interval=0.2)
            await asyncio.sleep(1.5)  # time for a wrong second delivery
            seen = Counter(
                m.properties["UNIQ_KEY"]
                for m in await messages_on(pool, [new, g2.rpc], TOPIC, QUEUES)
            )
        member = group(c, "g1")["masterId"]
        promoted = c.broker("g1", member)
        twice = {k: n for k, n in seen.items() if n > 1}
        # nothing was handed on twice either (g2 answers a repeat of an escape with its
        # first store; another target, or one that forgot, would store a second copy):
        # the other slave did not act, from the old master's progress, while the
        # elected one was rebuilt
        repeats = [ln for ln in g2.log_tail(400).splitlines() if "not stored again" in ln]
        assert not repeats, f"{repeats}\n--- member 2\n{c.broker('g1', 2).log_tail(40)}"
        assert not twice, (
            f"delivered more than once: {twice}\n--- promoted member {member}\n"
            f"{promoted.log_tail(80)}\n--- g2\n{g2.log_tail(30)}"
        )
        # the race happened: the acting slave's escape was under way when it was
        # rebuilt (or, another member elected, when that member's pre-online held it)
        log = "".join(c.broker("g1", m).log_path.read_text() for m in (1, 2))
        raced = "under way finish first" in log or "awaiting its answer" in log
        assert raced, promoted.log_tail(80)
    finally:
        g2.resume()
        c.stop()


async def commit(pool: ConnectionPool, addr: str, queue_id: int, offset: int) -> None:
    await pool.call_pb(
        addr,
        RequestCode.UPDATE_CONSUMER_OFFSET,
        broker_pb2.ConsumerOffsetRequest(
            consumer_group="CG", topic=TOPIC, queue_id=queue_id, offset=offset
        ),
        common_pb2.Empty,
        5000,
    )


async def committed(pool: ConnectionPool, addr: str, queue_id: int) -> int:
    resp = await pool.call_pb(
        addr,
        RequestCode.QUERY_CONSUMER_OFFSET,
        broker_pb2.ConsumerOffsetRequest(consumer_group="CG", topic=TOPIC, queue_id=queue_id),
        broker_pb2.OffsetResponse,
        5000,
    )
    return int(resp.offset)


async def test_the_last_masters_commit_survives_the_next_election(etcd: EtcdCluster) -> None:
    """Member 0 (master of epoch 1) commits, moving its table's version past what its
    slaves last synced, and is killed; member 1, elected, takes one more commit and is
    killed too.  Member 0 comes back (a slave, its newer-versioned table without that
    commit) before the controller elects member 2 (the only member of epoch 2's
    sync-state set left).  Member 2 holds the commit in its table and must keep it."""
    env = {
        **controller_env(etcd),
        "HAC_FLUSH_MODE": "sync",  # an acknowledged commit is on disk
        "HAC_CONSUMER_OFFSET_UPDATE_VERSION_STEP": "1",  # every commit moves the version
        # time for member 0 to come back before the second switch
        "HAC_MIN_SWITCH_INTERVAL_MS": "8000",
    }
    c = run_cluster(("g1",), 3, workdir=make_workdir("handover-"), env=env)
    try:
        await c.wait_ready(60)
        await create_topic_on(c.broker("g1", 0).rpc, TOPIC, QUEUES)
        async with ConnectionPool() as pool:
            first = c.broker("g1", 0)
            await commit(pool, first.rpc, 0, 10)
            for i in range(1, 11):
                await commit(pool, first.rpc, 1, i)  # the version moves ten times
            first.kill()
            await eventually(lambda: master_addr(c, "g1", 2) is not None, timeout=30)
            elected = group(c, "g1")["masterId"]
            assert elected in (1, 2)
            second = c.broker("g1", elected)

            async def taken() -> bool:
                try:
                    await commit(pool, second.rpc, 0, 20)
                except HaError:
                    return False  # still in pre-online
                return True

            await eventually(taken, timeout=20, interval=0.1)
            second.kill()
            c.brokers[("g1", 0)] = run_broker(c.namesrv, "g1", 0, c.workdir, env=c.env)

            def back() -> bool:
                return any(m.get("memberId") == 0 for m in group(c, "g1")["members"])

            await eventually(back, timeout=20)
            # it is there for the elected member's pre-online to take its table
            assert group(c, "g1")["epoch"] == 2, "switched before member 0 was back"
            await eventually(lambda: master_addr(c, "g1", 3) is not None, timeout=40)
            third = master_addr(c, "g1", 3)
            assert third is not None

            async def online() -> bool:
                try:
                    await committed(pool, third, 0)
                except HaError:
                    return False
                return True

            await eventually(online, timeout=30, interval=0.1)
            got = (await committed(pool, third, 0), await committed(pool, third, 1))
        last = group(c, "g1")["masterId"]
        assert got == (20, 10), f"member {last}:\n{c.broker('g1', last).log_tail(60)}"
    finally:
        c.stop()
