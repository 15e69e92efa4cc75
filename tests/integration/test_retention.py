"""Retention over real processes and files.

A: under load, with consumers reading, expired segments are deleted while every
acknowledged message stored within the retention window stays readable; a kill -9 in
the middle recovers; a pull consumer that falls behind and a push consumer group whose
committed offsets were deleted are moved to the queues' minimum and carry on.

B: a master never deletes what its (SIGSTOPped) slave has not received; once the slave
catches up it does, and the slave deletes on its own clock.

C: open files stay bounded: a broker on 2,000 queues of 5 consume-queue files each
(10,000 files) keeps about ``max_open_files`` descriptors while it serves every queue.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

from broker_agent.store import MessageStore, StoreConfig
from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message, MessageQueue, ReceivedMessage
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer, PullStatus
from ha_controller.client.push_consumer import PushConsumer
from ha_controller.client.tools import body_for
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import HaError
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import ProcessHandle, eventually, run_cluster

TOPIC = "Retained"
SEG = 64 * 1024
BODY = 1024
ALL_HOURS = ";".join(f"{h:02d}" for h in range(24))


def retention_env(reserved_ms: int, **extra: str) -> dict[str, str]:
    return {
        "HAC_SEGMENT_SIZE_BYTES": str(SEG),
        "HAC_MAX_MESSAGE_BYTES": str(16 * 1024),
        "HAC_FILE_RESERVED_TIME_MS": str(reserved_ms),
        "HAC_DELETE_WHEN": ALL_HOURS,  # whatever the hour the test runs at
        "HAC_DISK_MAX_USED_SPACE_RATIO": "1.0",  # the host's disk use plays no part
        "HAC_CLEAN_RESOURCE_INTERVAL_MS": "200",
        "HAC_CONSUME_QUEUE_FILE_ENTRIES": "64",
        "HAC_MAX_OPEN_FILES": "32",
        **extra,
    }


def store_of(workdir: Path, name: str, broker_id: int) -> Path:
    """Where ``run_cluster`` puts a broker's store (see ha_controller.testing)."""
    return workdir / "store" / f"{name}-{broker_id}"


def first_segment(store: Path) -> int:
    """Start offset of the oldest commit-log segment on disk."""
    while True:
        names = sorted(p.name for p in (store / "commitlog").iterdir())
        if names:
            return int(names[0])


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def scrape(handle: ProcessHandle) -> str:
    with urllib.request.urlopen(f"http://{handle.http}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{labels} not exported")


async def status_of(handle: ProcessHandle) -> dict[str, Any]:
    def get() -> dict[str, Any]:
        import json

        with urllib.request.urlopen(f"http://{handle.http}/api/v1/status", timeout=5) as resp:
            return dict(json.loads(resp.read()))

    return await asyncio.to_thread(get)


async def caught_up(master: ProcessHandle) -> int | None:
    """The master's end once its (one) slave acknowledged all of it, else None."""
    st = await status_of(master)
    slaves = st["slaves"]
    if slaves and slaves[0]["ackedOffset"] == st["commitLogMaxOffset"]:
        return int(st["commitLogMaxOffset"])
    return None


async def slave_past(master: ProcessHandle, target: int) -> bool:
    """Whether the master's (one) slave acknowledged ``target``."""
    slaves = (await status_of(master))["slaves"]
    return bool(slaves) and int(slaves[0]["ackedOffset"]) >= target


class Load:
    """Sends keyed messages at a steady pace; remembers when each acked send began."""

    def __init__(self, producer: Producer, prefix: str) -> None:
        self.producer = producer
        self.prefix = prefix
        self.acked: dict[str, float] = {}  # key -> wall-clock time the send began
        self.failed = 0
        self._n = 0

    async def send(self, count: int) -> None:
        for _ in range(count):
            await self.one()

    async def one(self) -> None:
        key = f"{self.prefix}-{self._n:06d}"
        self._n += 1
        began = time.time()
        try:
            await self.producer.send(Message(TOPIC, body_for(key, BODY), keys=(key,)))
        except (HaError, OSError):
            self.failed += 1
            return
        self.acked[key] = began

    async def run(self, stop: asyncio.Event, per_second: int, workers: int = 4) -> None:
        async def worker() -> None:
            while not stop.is_set():
                started = time.monotonic()
                await self.one()
                await asyncio.sleep(max(0.0, workers / per_second - (time.monotonic() - started)))

        await asyncio.gather(*(worker() for _ in range(workers)))


async def read_queues(pull: PullConsumer, queues: list[MessageQueue]) -> dict[str, ReceivedMessage]:
    """Everything readable now, each queue from its minimum (followed like a consumer)."""
    out: dict[str, ReceivedMessage] = {}
    for mq in queues:
        offset = 0
        while True:
            res = await pull.pull(mq, offset, max_msgs=256, suspend_timeout_ms=0)
            if res.status is PullStatus.OFFSET_ILLEGAL:
                assert res.next_begin_offset == res.min_offset > offset
                offset = res.next_begin_offset
                continue
            if res.status is not PullStatus.FOUND:
                break
            for m in res.messages:
                assert m.body == body_for(m.key, BODY), m.key
                out[m.key] = m
            offset = res.next_begin_offset
    return out


class SlowReader:
    """A pull consumer that reads slower than messages expire: it is moved on."""

    def __init__(self, pull: PullConsumer, queues: list[MessageQueue]) -> None:
        self.pull = pull
        self.queues = queues
        self.moves: list[tuple[int, int]] = []  # (asked, moved to)
        self.offsets = dict.fromkeys(queues, 0)
        self.gaps = 0  # offsets skipped without being told

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for mq in self.queues:
                offset = self.offsets[mq]
                try:
                    res = await self.pull.pull(mq, offset, max_msgs=2, suspend_timeout_ms=0)
                except (HaError, OSError):
                    await asyncio.sleep(0.2)
                    continue
                if res.status is PullStatus.OFFSET_ILLEGAL:
                    self.moves.append((offset, res.next_begin_offset))
                elif res.messages and res.messages[0].queue_offset != offset:
                    self.gaps += 1
                self.offsets[mq] = res.next_begin_offset
            await asyncio.sleep(0.2)  # about 10 messages a second per queue: too slow


# ---------------------------------------------------------------------------- A


async def test_retention_under_load_keeps_the_window_and_moves_consumers_on(
    tmp_path: Path,
) -> None:
    reserved_s = 6.0
    cluster = run_cluster(replicas=1, workdir=tmp_path, env=retention_env(int(reserved_s * 1000)))
    broker = cluster.broker("broker-a", 0)
    store = store_of(tmp_path, "broker-a", 0)
    live: dict[str, int] = {}

    async def consume(m: ReceivedMessage) -> bool:
        assert m.body == body_for(m.key, BODY)
        live[m.key] = live.get(m.key, 0) + 1
        return True

    try:
        async with (
            Producer(cluster.namesrv, group="ret-p") as producer,
            PullConsumer(cluster.namesrv, "ret-reader") as pull,
        ):
            load = Load(producer, "m")
            await load.send(50)  # creates the topic
            queues = await pull.queues(TOPIC)
            assert len(queues) == 4
            for mq in queues:  # a group that consumed one message long ago
                await pull.commit(mq, 1)
            stop = asyncio.Event()
            reader = SlowReader(pull, queues)
            async with PushConsumer(
                cluster.namesrv, "ret-live", TOPIC, consume, commit_interval_s=0.5
            ):
                tasks = [
                    asyncio.create_task(load.run(stop, per_second=250)),
                    asyncio.create_task(reader.run(stop)),
                ]
                try:
                    # deletion starts once the first segments are reserved_s old
                    await eventually(lambda: first_segment(store) > 0, timeout=reserved_s + 10)
                    await asyncio.sleep(2)
                    # kill -9 while sends, pulls and deletions go on; restart on the files
                    broker = cluster.restart("broker-a", 0)
                    await asyncio.sleep(reserved_s)
                finally:
                    stop.set()
                    await asyncio.gather(*tasks)
                deleted_to = first_segment(store)
                assert deleted_to > 4 * SEG, "retention deleted little or nothing"
                # every acked message within the window is still there, after the crash too
                got = await read_queues(pull, queues)
                read_end = time.time()
                window = {k for k, began in load.acked.items() if began >= read_end - reserved_s}
                assert len(window) > 500
                missing = window - set(got)
                assert not missing, f"{len(missing)} acked messages in the window were lost"
                # nothing outside the window is readable either, beyond the live segment's
                assert len(got) < len(load.acked)
                # the push consumer that keeps up got every message that is still there
                await eventually(lambda: set(live) >= set(got), timeout=20)
            # the slow pull consumer was moved to the minimum and went on without gaps
            assert reader.moves, "the slow reader was never behind the minimum"
            assert all(to > asked for asked, to in reader.moves)
            assert reader.gaps == 0

            # the reader's group had committed offset 1; moving the reader on, the master
            # moved the group's committed offsets to the minimum as well
            for mq in queues:
                assert await pull.committed_offset(mq) > 1
            # a group whose committed offsets point at deleted messages (as it was): a
            # push consumer of it is moved to the minimum and continues
            lagging: dict[str, int] = {}

            async def lag(m: ReceivedMessage) -> bool:
                lagging[m.key] = lagging.get(m.key, 0) + 1
                return True

            for mq in queues:
                await pull.commit(mq, 1)
            async with PushConsumer(
                cluster.namesrv, "ret-reader", TOPIC, lag, commit_interval_s=0.5
            ):
                fresh = Load(producer, "after")
                await fresh.send(40)
                await eventually(lambda: set(lagging) >= set(fresh.acked), timeout=20)
            for mq in queues:
                assert await pull.committed_offset(mq) > 1
            text = await asyncio.to_thread(scrape, broker)
            assert metric(text, "hac_store_deleted_segments_total", file="commitlog") > 0
            assert metric(text, "hac_store_deleted_bytes_total", file="commitlog") >= SEG
            kept = metric(text, "hac_store_bytes", file="commitlog")
            assert 0 < kept < len(load.acked) * BODY
        assert "unreadable record" not in broker.log_tail(10_000)
    finally:
        cluster.stop()


# ---------------------------------------------------------------------------- B


async def test_master_never_deletes_what_a_stopped_slave_lacks(tmp_path: Path) -> None:
    reserved_ms = 1500
    env = retention_env(reserved_ms, HAC_REPLICATION_MODE="async", HAC_IN_SYNC_REPLICAS="1")
    cluster = run_cluster(replicas=2, workdir=tmp_path, env=env)
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    master_store, slave_store = store_of(tmp_path, "broker-a", 0), store_of(tmp_path, "broker-a", 1)
    try:
        async with NameserverClient([cluster.namesrv]) as ns:

            async def online() -> bool:
                return any(g.master_online for g in await ns.groups())

            await eventually(online, timeout=30)
        async with Producer(cluster.namesrv, group="hold-p") as producer:
            load = Load(producer, "h")
            await load.send(200)

            await eventually(lambda: caught_up(master), timeout=20)
            slave.pause()  # SIGSTOP: attached, silent
            acked = int((await status_of(master))["slaves"][0]["ackedOffset"])
            bound = acked - acked % SEG  # segments ending at or below it may go
            stop = asyncio.Event()
            sender = asyncio.create_task(load.run(stop, per_second=400))
            try:
                deadline = time.monotonic() + reserved_ms / 1000 + 6
                while time.monotonic() < deadline:
                    assert first_segment(master_store) <= acked, "deleted past the slave"
                    await asyncio.sleep(0.05)
                # retention did run, right up to what the slave holds
                assert first_segment(master_store) == bound
                assert (await status_of(master))["commitLogMaxOffset"] > acked + 8 * SEG
                target = int((await status_of(master))["commitLogMaxOffset"])
                slave.resume()
                # not caught_up(): while the sender goes on, an async slave's ack trails
                # the moving end, and equality may not be seen on a busy box
                await eventually(lambda: slave_past(master, target), timeout=30)
                # the slave has it all now: the master deletes past the old bound
                await eventually(lambda: first_segment(master_store) > acked, timeout=10)
            finally:
                stop.set()
                await sender
            # and the slave deletes by time on its own
            await eventually(lambda: first_segment(slave_store) > 0, timeout=10)
            # a slave that lost its volume starts over from the master's start, not 0
            slave.kill()
            shutil.rmtree(slave_store)
            start = first_segment(master_store)
            slave = cluster.restart("broker-a", 1)
            await load.send(50)
            top = await eventually(lambda: caught_up(master), timeout=30)
            # the master's start when the slave came back (its retention goes on deleting
            # by time meanwhile, while the slave's fresh copies are not old yet: a loaded
            # fresh-clone run saw the master two segments further by the time of this check)
            assert first_segment(slave_store) >= start - SEG > 0
            assert top > acked
    finally:
        slave.resume()
        cluster.stop()


async def test_a_slave_killed_and_restarted_within_the_hold_continues(tmp_path: Path) -> None:
    """Its link closes; retention rounds run while it is away, and the master is killed
    and restarted meanwhile; they must not delete what it lacks (without
    ``detached_slave_hold_ms`` one round did, and the restarted slave asked for deleted
    bytes for ever: a fresh-clone run caught the same gap when a resumed slave
    redialled its silent link)."""
    reserved_ms = 1500
    env = retention_env(reserved_ms, HAC_REPLICATION_MODE="async", HAC_IN_SYNC_REPLICAS="1")
    cluster = run_cluster(replicas=2, workdir=tmp_path, env=env)
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    master_store = store_of(tmp_path, "broker-a", 0)
    try:
        async with Producer(cluster.namesrv, group="hold-k") as producer:
            load = Load(producer, "k")
            await load.send(200)

            acked = int(await eventually(lambda: caught_up(master), timeout=30))
            slave.kill()
            bound = acked - acked % SEG
            stop = asyncio.Event()
            sender = asyncio.create_task(load.run(stop, per_second=400))
            try:
                deadline = time.monotonic() + reserved_ms / 1000 + 4
                restarted = False
                while time.monotonic() < deadline:
                    assert first_segment(master_store) <= acked, "deleted what the slave lacks"
                    if not restarted and time.monotonic() > deadline - 3:
                        # the hold outlives the master (slave_holds.json)
                        master.kill()
                        master = cluster.restart("broker-a", 0)
                        restarted = True
                    await asyncio.sleep(0.05)
                assert first_segment(master_store) == bound  # retention ran up to it
                assert (await status_of(master))["commitLogMaxOffset"] > acked + 8 * SEG
                slave = cluster.restart("broker-a", 1)
                target = int((await status_of(master))["commitLogMaxOffset"])
                await eventually(lambda: slave_past(master, target), timeout=30)
                await eventually(lambda: first_segment(master_store) > acked, timeout=10)
            finally:
                stop.set()
                await sender
    finally:
        cluster.stop()


# ---------------------------------------------------------------------------- C

TOPICS = 20
QUEUES = 100  # 2,000 queues
PER_QUEUE = 10  # 5 consume-queue files of 2 entries each: 10,000 files
MAX_OPEN = 64


def populate(store: Path) -> None:
    config = StoreConfig(
        segment_size_bytes=SEG, max_message_size_bytes=16 * 1024, consume_queue_file_entries=2
    )
    with MessageStore.open(store, config) as s:
        for i in range(PER_QUEUE):
            for t in range(TOPICS):
                for q in range(QUEUES):
                    s.put(f"Many{t}", q, b"%d-%d-%d" % (t, q, i))


async def test_open_files_stay_bounded_with_thousands_of_queues(tmp_path: Path) -> None:
    store = store_of(tmp_path, "broker-a", 0)
    await asyncio.to_thread(populate, store)
    files = sum(len(fs) for _, _, fs in os.walk(store / "consumequeue"))
    assert files == TOPICS * QUEUES * PER_QUEUE // 2
    env = retention_env(
        3_600_000,
        HAC_CONSUME_QUEUE_FILE_ENTRIES="2",
        HAC_MAX_OPEN_FILES=str(MAX_OPEN),
        HAC_DEFAULT_TOPIC_QUEUE_NUMS=str(QUEUES),
    )
    cluster = run_cluster(replicas=1, workdir=tmp_path, env=env)
    broker = cluster.broker("broker-a", 0)
    peak = fd_count(broker.pid)
    # descriptors that are not store files: sockets, the event loop, pipes, the log
    bound = MAX_OPEN + 64

    async def pull_all(pool: ConnectionPool, addr: str, expect: int) -> None:
        nonlocal peak
        sem = asyncio.Semaphore(32)

        async def one(t: int, q: int) -> None:
            nonlocal peak
            async with sem:
                req = broker_pb2.PullMessageRequest(
                    consumer_group="fd",
                    topic=f"Many{t}",
                    queue_id=q,
                    queue_offset=0,
                    max_msg_nums=32,
                    commit_offset=-1,
                )
                resp = await pool.call_pb(
                    addr, RequestCode.PULL_MESSAGE, req, broker_pb2.PullMessageResponse
                )
                assert resp.status == broker_pb2.FOUND
                assert len(resp.messages) == expect
                peak = max(peak, fd_count(broker.pid))

        await asyncio.gather(*(one(t, q) for t in range(TOPICS) for q in range(QUEUES)))

    try:
        async with ConnectionPool() as pool:
            await pull_all(pool, broker.rpc, PER_QUEUE)
            # a send to every queue: each appends to its last consume-queue file
            for t in range(TOPICS):
                for q in range(QUEUES):
                    await pool.call_pb(
                        broker.rpc,
                        RequestCode.SEND_MESSAGE,
                        broker_pb2.SendMessageRequest(
                            producer_group="fd",
                            topic=f"Many{t}",
                            queue_id=q,
                            entries=[broker_pb2.SendEntry(body=b"one more")],
                        ),
                        broker_pb2.SendMessageResponse,
                    )
                peak = max(peak, fd_count(broker.pid))
            served = fd_count(broker.pid)
            # crash recovery on 10,000 queue files keeps the bound too
            broker = cluster.restart("broker-a", 0)
            restarted = fd_count(broker.pid)
            await pull_all(pool, broker.rpc, PER_QUEUE + 1)
        log_line = (
            f"files: {files} consume-queue files; fds: peak {peak}, after serving {served}, "
            f"after restart {restarted}, after reading again {fd_count(broker.pid)}"
        )
        print(log_line)
        assert peak <= bound, log_line
        assert fd_count(broker.pid) <= bound, log_line
        assert re.search(r"unreadable record", broker.log_tail(10_000)) is None
    finally:
        cluster.stop()
