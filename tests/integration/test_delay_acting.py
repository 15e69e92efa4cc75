"""Delayed and timer messages keep flowing while a slave acts for its lost master,
and a returning master does not deliver them again (RocketMQ's
ScheduleSlaveActingMasterIT, GetMetadataReverseIT), with real processes.

Delay level 4 is 5 s here (RocketMQ's ITs use 30 s; same logic).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path

import pytest
from special_helpers import messages_on

from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import (
    FAST_ENV,
    ContainerHandle,
    ProcessHandle,
    eventually,
    run_broker,
    run_container,
    run_nameserver,
)

TOPIC = "DelayTopic"
LEVEL = 4
LEVEL_DELAY_MS = 5000
TIMER_DELAY_MS = 7000
COUNT = 32
QUEUES = 4
BASE_ENV = {**FAST_ENV, "HAC_DELAY_LEVELS": "1s 2s 3s 5s 10s"}
GROUP_B = {"total_replicas": 3, "in_sync_replicas": 2}
ALONE = {"total_replicas": 1, "in_sync_replicas": 1}


@pytest.fixture
async def pool() -> AsyncIterator[ConnectionPool]:
    async with ConnectionPool(connect_timeout_ms=1000) as p:
        yield p


class Procs:
    def __init__(self) -> None:
        self.handles: list[ProcessHandle] = []

    def add(self, handle: ProcessHandle) -> ProcessHandle:
        self.handles.append(handle)
        return handle

    def stop(self) -> None:
        for h in reversed(self.handles):
            h.kill()


@pytest.fixture
def procs() -> Iterator[Procs]:
    p = Procs()
    try:
        yield p
    finally:
        p.stop()


async def status(pool: ConnectionPool, addr: str) -> dict[str, object]:
    resp = await pool.call_pb(
        addr, RequestCode.GET_BROKER_STATUS, common_pb2.Empty(), broker_pb2.BrokerStatus, 2000
    )
    data: dict[str, object] = json.loads(resp.json)
    return data


async def create_topic(pool: ConnectionPool, master: str) -> None:
    config = common_pb2.TopicConfig(
        topic_name=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES, perm=6
    )
    await pool.call_pb(
        master,
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        broker_pb2.CreateTopicRequest(topic=config),
        common_pb2.Empty,
        3000,
    )


async def send(pool: ConnectionPool, master: str, props: dict[str, str], queue_id: int) -> None:
    await pool.call_pb(
        master,
        RequestCode.SEND_MESSAGE,
        broker_pb2.SendMessageRequest(
            producer_group="PG",
            topic=TOPIC,
            queue_id=queue_id,
            entries=[broker_pb2.SendEntry(body=b"delayed", properties=props)],
        ),
        broker_pb2.SendMessageResponse,
        5000,
    )


async def send_batch(
    pool: ConnectionPool, master: str, prefix: str, *, timer: bool = False
) -> dict[str, int]:
    """COUNT delayed messages; returns each one's due time (ms) by UNIQ_KEY."""
    due: dict[str, int] = {}
    for i in range(COUNT):
        key = f"{prefix}-{i}"
        now = int(time.time() * 1000)
        if timer:
            props = {"UNIQ_KEY": key, "TIMER_DELIVER_MS": str(now + TIMER_DELAY_MS)}
            due[key] = now + TIMER_DELAY_MS
        else:
            props = {"UNIQ_KEY": key, "DELAY": str(LEVEL)}
            due[key] = now + LEVEL_DELAY_MS
        await send(pool, master, props, i % QUEUES)
    return due


async def messages(pool: ConnectionPool, addrs: Iterable[str]) -> list[broker_pb2.Message]:
    """Every message of TOPIC on these brokers (each one a group's id-0 or a replica)."""
    return await messages_on(pool, addrs, TOPIC, QUEUES)


def on_time(msgs: list[broker_pb2.Message], due: dict[str, int], tolerance_ms: int) -> float:
    late = [m for m in msgs if abs(m.store_ts_ms - due[m.properties["UNIQ_KEY"]]) > tolerance_ms]
    return 1 - len(late) / len(due)


def scrape(http: str) -> str:
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def escaped(metrics: str, kind: str, target: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("hac_escape_messages_total{") and (
            f'kind="{kind}"' in line and f'target="{target}"' in line and 'result="ok"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def delay_offsets(pool: ConnectionPool, addr: str) -> dict[int, int]:
    table = await pool.call_pb(
        addr,
        RequestCode.GET_ALL_DELAY_OFFSET,
        common_pb2.Empty(),
        broker_pb2.DelayOffsetTable,
        2000,
    )
    return dict(table.offsets)


async def timer_offset(pool: ConnectionPool, addr: str) -> int:
    cp = await pool.call_pb(
        addr,
        RequestCode.GET_TIMER_CHECK_POINT,
        common_pb2.Empty(),
        broker_pb2.TimerCheckpoint,
        2000,
    )
    return int(cp.master_timer_queue_offset)


async def online_master(pool: ConnectionPool, addr: str) -> None:
    """Wait until ``addr`` is online and a send with its required copies succeeds."""

    async def probe() -> bool:
        await send(pool, addr, {"UNIQ_KEY": f"probe-{time.monotonic_ns()}"}, 0)
        return True

    await eventually(probe, timeout=20, interval=0.2)


@pytest.mark.parametrize("skip_pre_online", [False, True], ids=["pre-online", "skip-pre-online"])
async def test_local_escape_and_no_replay_after_the_master_returns(
    tmp_path: Path, pool: ConnectionPool, procs: Procs, skip_pre_online: bool
) -> None:
    ns = procs.add(run_nameserver(tmp_path, env=BASE_ENV))
    # one process holds master A and slave B1 of group B; B0 and B2 run elsewhere
    container = procs.add(
        run_container(
            ns.rpc,
            [("A", 0), ("B", 1)],
            tmp_path,
            env=BASE_ENV,
            per_broker={("A", 0): ALONE, ("B", 1): GROUP_B},
        )
    )
    assert isinstance(container, ContainerHandle)
    a0, b1 = container.rpc_of("A", 0), container.rpc_of("B", 1)
    b_env = {**BASE_ENV, "HAC_TOTAL_REPLICAS": "3", "HAC_IN_SYNC_REPLICAS": "2"}
    procs.add(run_broker(ns.rpc, "B", 2, tmp_path, env=b_env))
    b0 = procs.add(run_broker(ns.rpc, "B", 0, tmp_path, env=b_env))
    await online_master(pool, b0.rpc)
    await create_topic(pool, b0.rpc)

    due_level = await send_batch(pool, b0.rpc, "level")
    due_timer = await send_batch(pool, b0.rpc, "timer", timer=True)
    await asyncio.sleep(1.0)  # let B0 flush what it acknowledged before it dies
    b0.kill()

    # B1 acts for B0 and escapes due messages into master A next to it
    async def all_on_a() -> list[broker_pb2.Message] | None:
        msgs = await messages(pool, [a0])
        keys = {m.properties.get("UNIQ_KEY") for m in msgs}
        return msgs if keys >= set(due_level) | set(due_timer) else None

    msgs = await eventually(all_on_a, timeout=25, interval=0.2)
    level = [m for m in msgs if m.properties["UNIQ_KEY"] in due_level]
    timer = [m for m in msgs if m.properties["UNIQ_KEY"] in due_timer]
    assert len(level) == len(timer) == COUNT
    assert all(m.broker_name == "A" for m in msgs)
    assert all("DELAY" not in m.properties and "REAL_TOPIC" not in m.properties for m in msgs)
    assert on_time(level, due_level, 4000) >= 0.95
    assert on_time(timer, due_timer, 1000) >= 0.95
    assert (await delay_offsets(pool, b1)).get(LEVEL, 0) >= COUNT
    assert await timer_offset(pool, b1) >= COUNT
    # through the master in the same process, not over the network
    metrics = await asyncio.to_thread(scrape, str(container.member("B", 1)["http"]))
    assert escaped(metrics, "delay", "local") >= COUNT
    assert escaped(metrics, "timer", "local") >= COUNT
    assert escaped(metrics, "delay", "A") == escaped(metrics, "timer", "A") == 0

    # B0 returns: with pre-online it adopts B1's progress; without, it replays
    env = {**b_env, "HAC_SKIP_PRE_ONLINE": "true"} if skip_pre_online else b_env
    b0 = procs.add(run_broker(ns.rpc, "B", 0, tmp_path, env=env))
    await eventually(lambda: status(pool, b0.rpc), timeout=10)

    async def is_online() -> bool:
        return not (await status(pool, b0.rpc))["isolated"]

    await eventually(is_online, timeout=25, interval=0.2)
    if not skip_pre_online:
        assert (await delay_offsets(pool, b0.rpc)).get(LEVEL, 0) >= COUNT
        assert await timer_offset(pool, b0.rpc) >= COUNT
    await asyncio.sleep(3.0)  # a replay would be due at once
    every = await messages(pool, [a0, b0.rpc])
    counts = Counter(m.properties.get("UNIQ_KEY") for m in every)
    replayed = [k for k in (*due_level, *due_timer) if counts[k] > 1]
    if skip_pre_online:
        assert replayed, "skipping pre-online should roll the delay progress back"
    else:
        assert replayed == []


async def test_remote_escape_goes_to_the_surviving_group(
    tmp_path: Path, pool: ConnectionPool, procs: Procs
) -> None:
    env = {**BASE_ENV, "HAC_TOTAL_REPLICAS": "2", "HAC_IN_SYNC_REPLICAS": "2"}
    ns = procs.add(run_nameserver(tmp_path, env=BASE_ENV))
    masters: dict[str, ProcessHandle] = {}
    for group in ("G1", "G2", "G3"):
        procs.add(run_broker(ns.rpc, group, 1, tmp_path, env=env))
        masters[group] = procs.add(run_broker(ns.rpc, group, 0, tmp_path, env=env))
    for m in masters.values():
        await online_master(pool, m.rpc)
        await create_topic(pool, m.rpc)
    before = {m.properties.get("UNIQ_KEY") for m in await messages(pool, [masters["G3"].rpc])}

    due = await send_batch(pool, masters["G1"].rpc, "g1")
    due |= await send_batch(pool, masters["G2"].rpc, "g2")
    await asyncio.sleep(1.0)
    masters["G1"].kill()
    masters["G2"].kill()

    async def all_on_g3() -> list[broker_pb2.Message] | None:
        msgs = [
            m
            for m in await messages(pool, [masters["G3"].rpc])
            if m.properties.get("UNIQ_KEY") not in before
        ]
        return msgs if {m.properties["UNIQ_KEY"] for m in msgs} >= set(due) else None

    msgs = await eventually(all_on_g3, timeout=30, interval=0.2)
    assert all(m.broker_name == "G3" for m in msgs)
    assert len(msgs) == 2 * COUNT
    assert on_time(msgs, due, 4000) >= 0.95
