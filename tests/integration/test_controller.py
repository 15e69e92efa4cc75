"""Controller mode against a real etcd (docs/failover.md, "Automatic master switch").

A group whose master is killed takes writes again, on its own queues, from a member of
its sync-state set elected through etcd; the old master rejoins as a slave under the
id the new master had, and no acknowledged message is lost; a planned switch moves the
master back.  Without a controller the same kill leaves the group without writes (the
RIP-32 tests), so these fail on a build without one."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ha_controller.client import Message, Producer, PullConsumer
from ha_controller.client.message import MessageQueue
from ha_controller.rpc.limits import RpcLimits
from ha_controller.testing import (
    Cluster,
    eventually,
    hactl_argv,
    http_get,
    make_workdir,
    run_broker,
    run_cluster,
)
from ha_controller.testing.etcd import EtcdCluster, etcd_missing

pytestmark = pytest.mark.skipif(etcd_missing() is not None, reason=str(etcd_missing()))

GROUP = "broker-a"
TOPIC = "CtlTopic"
QUEUES = 4


@pytest.fixture
def cluster(etcd: EtcdCluster) -> Iterator[Cluster]:
    env = {"HAC_ETCD_ENDPOINTS": etcd.endpoints, "HAC_AUTO_SWITCH_AFTER_MS": "500"}
    c = run_cluster([GROUP], 3, workdir=make_workdir("ctl-"), env=env)
    try:
        yield c
    finally:
        c.stop()


def groups(c: Cluster) -> list[dict[str, Any]]:
    status, body = http_get(c.nameserver.http, "/api/v1/groups")
    assert status == 200, body
    return list(json.loads(body))


def group(c: Cluster) -> dict[str, Any]:
    return next(g for g in groups(c) if g["brokerName"] == GROUP)


async def read_all(c: Cluster) -> list[str]:
    bodies: list[str] = []
    async with PullConsumer(c.namesrv, "ctl-reader") as pc:
        for q in range(QUEUES):
            offset = 0
            while True:
                res = await pc.pull(MessageQueue(TOPIC, GROUP, q), offset, 64, 0)
                if not res.messages:
                    break
                bodies.extend(m.body.decode() for m in res.messages)
                offset = res.next_begin_offset
    return bodies


async def send_until_ok(p: Producer, body: str, within_s: float) -> float:
    """Seconds until a send of ``body`` succeeded (it must land in GROUP: the only one)."""
    started = time.monotonic()
    while True:
        try:
            receipt = await p.send(Message(TOPIC, body.encode()))
        except Exception:  # every failure means "not yet"
            if time.monotonic() - started > within_s:
                raise
            await asyncio.sleep(0.02)
            continue
        assert receipt.broker_name == GROUP
        return time.monotonic() - started


async def test_killed_master_is_replaced_and_rejoins_as_a_slave(cluster: Cluster) -> None:
    c = cluster
    await c.wait_ready(60)
    g = group(c)
    assert (g["epoch"], g["masterId"], g["syncStateSet"]) == (1, 0, [0, 1, 2])
    acked: list[str] = []
    async with Producer(c.namesrv) as p:
        for i in range(60):
            receipt = await p.send(Message(TOPIC, f"a{i}".encode()))
            acked.append(f"a{i}")
        # the answer names who acknowledged, under which epoch (the split-brain check)
        assert (receipt.epoch, receipt.member_id) == (1, 0)
        c.broker(GROUP, 0).kill()
        took = await send_until_ok(p, "first-after-kill", within_s=20)
        acked.append("first-after-kill")
        g = group(c)
        assert g["epoch"] == 2 and g["masterId"] in (1, 2), g
        assert 0 not in g["syncStateSet"] and g["masterId"] in g["syncStateSet"]
        new_master = g["masterId"]
        master_row = next(m for m in g["members"] if m["brokerId"] == 0)
        assert master_row["memberId"] == new_master
        # the route names the epoch of the master it shows as id 0 (clients keep the newest)
        route = p.routes.cached(TOPIC)
        assert route is not None and route.broker_datas[0].epoch == 2, route
        for i in range(60):
            receipt = await p.send(Message(TOPIC, f"b{i}".encode()))
            acked.append(f"b{i}")
        assert (receipt.epoch, receipt.member_id) == (2, new_master)

        # the old master comes back: a slave under the id the new master had
        c.brokers[(GROUP, 0)] = run_broker(c.namesrv, GROUP, 0, c.workdir, env=c.env)

        def rejoined() -> bool:
            g = group(c)
            rows = {m.get("memberId"): m["brokerId"] for m in g["members"]}
            return rows.get(0) == new_master and sorted(g["syncStateSet"]) == [0, 1, 2]

        await eventually(rejoined, timeout=60)
        for i in range(30):
            await p.send(Message(TOPIC, f"c{i}".encode()))
            acked.append(f"c{i}")
    got = await read_all(c)
    assert set(acked) <= set(got), sorted(set(acked) - set(got))[:10]
    assert len(got) == len(set(got)), "a message stored twice"
    # generous under a loaded CI machine; make bench measures it for real
    assert took < 10, took


async def test_a_send_in_flight_to_a_frozen_master_goes_to_the_new_one(cluster: Cluster) -> None:
    """The send in flight when the master freezes ends when the route shows the new
    epoch's master, and is stored there: not after its timeout (20 s here, and no
    liveness probe to end it sooner)."""
    c = cluster
    await c.wait_ready(60)
    limits = RpcLimits(liveness_probe_ms=0)
    async with Producer(c.namesrv, send_timeout_ms=20_000, rpc_limits=limits) as p:
        warm = await p.send(Message(TOPIC, b"before"))
        assert (warm.epoch, warm.member_id) == (1, 0)
        master = c.broker(GROUP, 0)
        master.pause()
        try:
            started = time.monotonic()
            receipt = await p.send(Message(TOPIC, b"in-flight"))
            took = time.monotonic() - started
        finally:
            master.resume()
    assert receipt.epoch == 2 and receipt.member_id in (1, 2), receipt
    # the not-active timeout (2 s), the switch (0.5 s), the route watch; generous for
    # a loaded CI machine, far below the send timeout
    assert took < 12, took
    got = await read_all(c)
    assert got.count("in-flight") == 1 and "before" in got, got


@pytest.mark.slow  # test_prometheus.py switches a group; make bench times it
async def test_planned_switch_moves_the_master_without_loss(cluster: Cluster) -> None:
    c = cluster
    await c.wait_ready(60)
    acked: list[str] = []
    stop = asyncio.Event()
    failures: list[float] = []

    async with Producer(c.namesrv) as p:

        async def write() -> None:
            i = 0
            while not stop.is_set():
                body = f"w{i}"
                try:
                    await p.send(Message(TOPIC, body.encode()))
                    acked.append(body)
                except Exception:  # counted as unavailability
                    failures.append(time.monotonic())
                    await asyncio.sleep(0.01)
                i += 1
                await asyncio.sleep(0.005)

        writer = asyncio.create_task(write())
        await asyncio.sleep(1.0)
        proc = await asyncio.to_thread(
            subprocess.run,
            hactl_argv("group", "switch", GROUP, "--to", "2", "--namesrv", c.namesrv, "--json"),
            capture_output=True,
            text=True,
            env=c.env,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["masterId"] == 2 and out["epoch"] == 2, out

        def switched() -> bool:
            g = group(c)
            rows = {m.get("memberId"): m["brokerId"] for m in g["members"]}
            return rows.get(2) == 0 and rows.get(0) == 2 and sorted(g["syncStateSet"]) == [0, 1, 2]

        await eventually(switched, timeout=60)
        await asyncio.sleep(1.0)
        stop.set()
        await writer
    got = await read_all(c)
    assert set(acked) <= set(got), sorted(set(acked) - set(got))[:10]
    assert len(got) == len(set(got)), "a message stored twice"
    assert acked, "nothing was written"
