"""A damaged metadata file is never a traceback and a crash loop (issue 34, item 3).

Every table a broker keeps beside its store is written atomically with a checksum and
checked when read.  A file that cannot be read — a flipped bit, a truncated write,
not JSON, the wrong shape — is, table by table:

- rebuilt, when its truth is elsewhere too: consumer offsets, delay offsets and the
  timer checkpoint from the progress records in the commit log; transaction progress
  from the op queue; POP acks and recalls start empty (a master's are records in its
  log); the ACL copy starts from the users file.  One ERROR line names the file and
  where it was set aside, and the broker serves with the rebuilt table;
- taken from a replica, when only a replica has it (topics, subscription groups): a
  master with slaves takes the slave's in pre-online before it serves;
- refused, when there is no replica to take it from: exit status 1 and one line
  naming the file and the repair.

Real broker processes over real files; each test fails on a broker that took the
damaged file as it was (or died of it).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from special_helpers import create_topic_on, messages_on, send_raw

from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.properties import (
    PROPERTY_DELAY,
    PROPERTY_POP_CK,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRAN_MSG,
    PROPERTY_UNIQ_KEY,
)
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import (
    FAST_ENV,
    ProcessHandle,
    eventually,
    run_broker,
    run_cluster,
    run_nameserver,
)

pytestmark = pytest.mark.timeout(180)

GROUP = "meta"
ALONE = {
    **FAST_ENV,
    "HAC_TOTAL_REPLICAS": "1",
    "HAC_IN_SYNC_REPLICAS": "1",
    "HAC_DELAY_LEVELS": "1s 2s",
    "HAC_TRANSACTION_CHECK_INTERVAL_MS": "300",
}
OFFSETS, DELAYED, TIMED, RECALLED, TX, POPPED = (
    "CorruptOffsets",
    "CorruptDelayed",
    "CorruptTimed",
    "CorruptRecalled",
    "CorruptTx",
    "CorruptPopped",
)
CG = "corrupt-cg"


# ---- damage -------------------------------------------------------------------------


def flip_a_bit(path: Path) -> None:
    """The lowest bit of the file's first digit: still JSON of the same shape."""
    data = bytearray(path.read_bytes())
    i = next(i for i, b in enumerate(data) if chr(b).isdigit())
    data[i] ^= 1
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def not_json(path: Path) -> None:
    path.write_bytes(b"\x00\xff\x13 not json at all")


def shaped(text: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_text(text)

    return write


# ---- what the broker says -------------------------------------------------------------


def set_aside_lines(handle: ProcessHandle, name: str) -> list[str]:
    log = handle.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    return [line for line in log.splitlines() if f"/{name} cannot be read (" in line]


def assert_set_aside(handle: ProcessHandle, name: str, then: str) -> None:
    [line] = set_aside_lines(handle, name)
    assert f"set aside as {name}.corrupt; {then}" in line, line


def refusal(handle: ProcessHandle) -> str:
    """Start ``handle`` expecting it to refuse: its last log line (exit status 1)."""
    try:
        with pytest.raises(RuntimeError, match="exited with 1 before it was ready"):
            handle.start()
    finally:
        handle.kill()  # one that took the file and serves must not outlive the test
    log = handle.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    return log.strip().splitlines()[-1]


# ---- one broker, six damaged tables ----------------------------------------------------


async def commit(pool: ConnectionPool, addr: str, queue_id: int, offset: int) -> None:
    req = broker_pb2.ConsumerOffsetRequest(
        consumer_group=CG, topic=OFFSETS, queue_id=queue_id, offset=offset
    )
    await pool.call_pb(addr, RequestCode.UPDATE_CONSUMER_OFFSET, req, common_pb2.Empty, 5000)


async def committed(pool: ConnectionPool, addr: str, queue_id: int) -> int:
    req = broker_pb2.ConsumerOffsetRequest(consumer_group=CG, topic=OFFSETS, queue_id=queue_id)
    resp = await pool.call_pb(
        addr, RequestCode.QUERY_CONSUMER_OFFSET, req, broker_pb2.OffsetResponse, 5000
    )
    return int(resp.offset)


async def keys(pool: ConnectionPool, addr: str, topic: str) -> Counter[str]:
    msgs = await messages_on(pool, [addr], topic, 1)
    return Counter(m.properties.get(PROPERTY_UNIQ_KEY, "") for m in msgs)


async def delivered(pool: ConnectionPool, addr: str, topic: str, key: str) -> None:
    async def there() -> bool:
        return (await keys(pool, addr, topic))[key] >= 1

    await eventually(there, timeout=30, interval=0.1)


async def after_one_more(broker: ProcessHandle, topic: str, props: dict[str, str]) -> Counter[str]:
    """Send one more scheduled message (``props``) and wait until it is delivered: the
    ones due before it were delivered by then, again too if they were going to be.
    What ``topic`` holds then, by UNIQ_KEY."""
    async with ConnectionPool() as pool:
        await send_raw(pool, broker.rpc, topic, 0, props)
        await delivered(pool, broker.rpc, topic, props[PROPERTY_UNIQ_KEY])
        return await keys(pool, broker.rpc, topic)


def now_ms() -> int:
    return int(time.time() * 1000)


async def pop(pool: ConnectionPool, addr: str) -> list[broker_pb2.Message]:
    resp = await pool.call_pb(
        addr,
        RequestCode.POP_MESSAGE,
        broker_pb2.PopMessageRequest(
            consumer_group=CG, topic=POPPED, queue_id=0, max_msg_nums=8, invisible_time_ms=60_000
        ),
        broker_pb2.PopMessageResponse,
        5000,
    )
    return list(resp.messages)


async def ack(pool: ConnectionPool, addr: str, m: broker_pb2.Message) -> None:
    req = broker_pb2.AckMessageRequest(
        consumer_group=CG, topic=POPPED, receipt_handle=m.properties[PROPERTY_POP_CK]
    )
    await pool.call_pb(addr, RequestCode.ACK_MESSAGE, req, broker_pb2.AckMessageResponse, 5000)


@dataclass
class Restarted:
    """The broker restarted over its damaged tables, and what was true before."""

    broker: ProcessHandle
    recall_due_ms: int


async def _before(addr: str) -> int:
    """Progress in every table; the due time of the recalled timer message."""
    async with ConnectionPool() as pool:
        for topic in (OFFSETS, DELAYED, TIMED, RECALLED, TX, POPPED):
            await create_topic_on(addr, topic, queues=2)
        await commit(pool, addr, 0, 57)
        await commit(pool, addr, 1, 3)
        await send_raw(pool, addr, DELAYED, 0, {PROPERTY_UNIQ_KEY: "d1", PROPERTY_DELAY: "1"})
        timer = {PROPERTY_UNIQ_KEY: "t1", PROPERTY_TIMER_DELIVER_MS: str(now_ms() + 500)}
        await send_raw(pool, addr, TIMED, 0, timer)
        due = now_ms() + 4000
        recall = {PROPERTY_UNIQ_KEY: "r1", PROPERTY_TIMER_DELIVER_MS: str(due)}
        await send_raw(pool, addr, RECALLED, 0, recall)
        await pool.call_pb(
            addr,
            RequestCode.RECALL_MESSAGE,
            broker_pb2.RecallMessageRequest(
                producer_group="PG", topic=RECALLED, broker_name=GROUP, deliver_ms=due,
                uniq_key="r1",
            ),
            broker_pb2.RecallMessageResponse,
            5000,
        )  # fmt: skip
        half = await send_raw(
            pool,
            addr,
            TX,
            0,
            {PROPERTY_UNIQ_KEY: "x1", PROPERTY_TRAN_MSG: "true", PROPERTY_PRODUCER_GROUP: "PG"},
        )
        await pool.call_pb(
            addr,
            RequestCode.END_TRANSACTION,
            broker_pb2.EndTransactionRequest(
                producer_group="PG", topic=TX, transaction_id="x1", commit=True,
                broker_name=GROUP, half_queue_offset=half.queue_offset,
            ),
            common_pb2.Empty,
            5000,
        )  # fmt: skip
        await send_raw(pool, addr, POPPED, 0, {PROPERTY_UNIQ_KEY: "p1"})
        [m] = await pop(pool, addr)
        await ack(pool, addr, m)
        for topic, key in ((DELAYED, "d1"), (TIMED, "t1"), (TX, "x1")):
            await delivered(pool, addr, topic, key)
    return due


DAMAGE = {
    "consumer_offsets.json": flip_a_bit,
    "delay_offsets.json": truncate,
    "timer_checkpoint.json": not_json,
    "transaction_offsets.json": shaped("[]"),
    "pop_acks.json": shaped('{"entries": 5, "reviveOffsets": {}, "dataVersion": {}}'),
    "recalls.json": truncate,
}


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Restarted]:
    workdir = tmp_path_factory.mktemp("corrupt")
    ns = run_nameserver(workdir, env=ALONE)
    broker: ProcessHandle | None = None
    try:
        broker = run_broker(ns.rpc, GROUP, 0, workdir, env=ALONE)
        due = asyncio.run(_before(broker.rpc))
        assert broker.stop() == 0  # graceful: every table written
        store = workdir / "store" / f"{GROUP}-0"
        for name, damage in DAMAGE.items():
            assert (store / name).exists() or name == "pop_acks.json", name
            damage(store / name)
        broker = run_broker(ns.rpc, GROUP, 0, workdir, env=ALONE)
        yield Restarted(broker, due)
    finally:
        if broker is not None:
            broker.stop()
        ns.stop()


async def test_consumer_offsets_are_rebuilt_from_the_commit_log(restarted: Restarted) -> None:
    broker = restarted.broker
    assert_set_aside(broker, "consumer_offsets.json", "rebuilt from the offset records")
    async with ConnectionPool() as pool:
        assert [await committed(pool, broker.rpc, q) for q in (0, 1)] == [57, 3]


async def test_delay_offsets_are_rebuilt_and_nothing_is_delivered_twice(
    restarted: Restarted,
) -> None:
    broker = restarted.broker
    assert_set_aside(broker, "delay_offsets.json", "rebuilt from the delay offset records")
    later = {PROPERTY_UNIQ_KEY: "d2", PROPERTY_DELAY: "1"}  # the level's queue is in order
    assert await after_one_more(broker, DELAYED, later) == {"d1": 1, "d2": 1}


async def test_timer_checkpoint_is_rebuilt_and_nothing_is_delivered_twice(
    restarted: Restarted,
) -> None:
    """Before: a traceback, and the broker stayed down until the file was deleted."""
    broker = restarted.broker
    assert_set_aside(broker, "timer_checkpoint.json", "rebuilt from the timer checkpoint records")
    later = {PROPERTY_UNIQ_KEY: "t2", PROPERTY_TIMER_DELIVER_MS: str(now_ms() + 300)}
    assert await after_one_more(broker, TIMED, later) == {"t1": 1, "t2": 1}


async def test_recalls_come_back_from_the_markers_in_the_timer_queue(
    restarted: Restarted,
) -> None:
    broker = restarted.broker
    assert_set_aside(broker, "recalls.json", "starting empty: the timer loop reads the recall")
    due = max(restarted.recall_due_ms, now_ms()) + 300  # after the recalled one
    later = {PROPERTY_UNIQ_KEY: "r2", PROPERTY_TIMER_DELIVER_MS: str(due)}
    assert await after_one_more(broker, RECALLED, later) == {"r2": 1}


async def test_transaction_progress_is_rebuilt_from_the_op_queue(restarted: Restarted) -> None:
    broker = restarted.broker
    assert_set_aside(broker, "transaction_offsets.json", "starting over: the check service")
    async with ConnectionPool() as pool:

        async def past_the_committed_half() -> bool:
            progress = await pool.call_pb(
                broker.rpc,
                RequestCode.GET_TRANSACTION_OFFSETS,
                common_pb2.Empty(),
                broker_pb2.TransactionOffsets,
                5000,
            )
            return progress.half_offset == 1 and progress.op_offset == 1

        await eventually(past_the_committed_half, timeout=20, interval=0.1)
        assert await keys(pool, broker.rpc, TX) == {"x1": 1}


async def test_pop_acks_start_empty_and_pop_serves(restarted: Restarted) -> None:
    broker = restarted.broker
    assert_set_aside(broker, "pop_acks.json", "starting empty: a master's acks are ACK records")
    async with ConnectionPool() as pool:
        await send_raw(pool, broker.rpc, POPPED, 0, {PROPERTY_UNIQ_KEY: "p2"})
        popped = await pop(pool, broker.rpc)
        assert [m.properties[PROPERTY_UNIQ_KEY] for m in popped] == ["p2"]  # p1 stays acked
        await ack(pool, broker.rpc, popped[0])


async def test_an_acl_copy_is_set_aside_for_the_users_file(
    tmp_path: Path, ns: ProcessHandle
) -> None:
    users = tmp_path / "acl.toml"
    users.write_text(
        '[[users]]\naccess_key = "admin"\nsecret_key = "admin-secret-key"\nadmin = true\n'
    )
    users.chmod(0o600)
    store = tmp_path / "store" / f"{GROUP}-0"
    store.mkdir(parents=True)
    (store / "acl.json").write_text('{"revision": 3, "users": 7}')
    env = {**ALONE, "HAC_ACL_ENABLED": "true", "HAC_ACL_ALLOW_ANONYMOUS": "true"}
    broker = run_broker(ns.rpc, GROUP, 0, tmp_path, env={**env, "HAC_ACL_FILE": str(users)})
    try:
        assert_set_aside(broker, "acl.json", "starting from the users file until a cluster member")
        async with ConnectionPool() as pool:
            await commit(pool, broker.rpc, 0, 1)  # serving (anonymous access is on)
    finally:
        broker.stop()


# ---- tables only a replica has ----------------------------------------------------------


def lone_broker(workdir: Path, ns: ProcessHandle) -> ProcessHandle:
    return run_broker(ns.rpc, GROUP, 0, workdir, env=ALONE, start=False)


@pytest.fixture
def ns(tmp_path: Path) -> Iterator[ProcessHandle]:
    handle = run_nameserver(tmp_path, env=ALONE)
    try:
        yield handle
    finally:
        handle.stop()


async def test_a_topic_table_without_a_replica_is_refused(
    tmp_path: Path, ns: ProcessHandle
) -> None:
    broker = lone_broker(tmp_path, ns).start()
    try:
        await create_topic_on(broker.rpc, OFFSETS, queues=8)
    finally:
        assert broker.stop() == 0
    path = tmp_path / "store" / f"{GROUP}-0" / "topics.json"
    flip_a_bit(path)
    damaged = path.read_bytes()
    line = refusal(lone_broker(tmp_path, ns))
    assert line.startswith(f"hactl broker: StoreError: corrupt topic table {path} (checksum")
    assert "move it away to start with an empty table" in line
    assert path.read_bytes() == damaged  # left for the operator


async def test_a_subscription_table_without_a_replica_is_refused(
    tmp_path: Path, ns: ProcessHandle
) -> None:
    path = tmp_path / "store" / f"{GROUP}-0" / "subscriptions.json"
    path.parent.mkdir(parents=True)
    not_json(path)
    line = refusal(lone_broker(tmp_path, ns))
    assert re.match(
        rf"hactl broker: StoreError: corrupt subscription group table {path} \(not JSON", line
    ), line
    assert "hactl group update GROUP --orderly" in line


async def test_lost_topics_and_groups_come_from_a_replica(tmp_path: Path) -> None:
    cluster = run_cluster(("lost-meta",), 2, workdir=tmp_path)
    try:
        await cluster.wait_ready()
        master, slave = cluster.broker("lost-meta", 0), cluster.broker("lost-meta", 1)
        await create_topic_on(master.rpc, OFFSETS, queues=8)
        async with ConnectionPool() as pool:
            await pool.call_pb(
                master.rpc,
                RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                broker_pb2.UpdateSubscriptionGroupRequest(
                    config=broker_pb2.SubscriptionGroupConfig(group_name=CG, consume_orderly=True)
                ),
                common_pb2.Empty,
                5000,
            )

            async def tables(addr: str) -> tuple[dict[str, int], dict[str, bool]]:
                topics = await pool.call_pb(
                    addr,
                    RequestCode.GET_ALL_TOPIC_CONFIG,
                    common_pb2.Empty(),
                    broker_pb2.TopicConfigTable,
                    5000,
                )
                groups = await pool.call_pb(
                    addr,
                    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
                    common_pb2.Empty(),
                    broker_pb2.SubscriptionGroupTable,
                    5000,
                )
                return (
                    {t.topic_name: t.write_queue_nums for t in topics.topics},
                    {g.group_name: g.consume_orderly for g in groups.groups},
                )

            async def slave_has_them() -> bool:
                topics, groups = await tables(slave.rpc)
                return topics.get(OFFSETS) == 8 and groups.get(CG) is True

            await eventually(slave_has_them, timeout=20, interval=0.2)
            master.stop()
            store = tmp_path / "store" / "lost-meta-0"
            truncate(store / "topics.json")
            flip_a_bit(store / "subscriptions.json")
            master = await asyncio.to_thread(cluster.restart, "lost-meta", 0)
            await cluster.wait_ready()
            topics, groups = await tables(master.rpc)
            assert topics.get(OFFSETS) == 8 and groups.get(CG) is True
            for name in ("topics.json", "subscriptions.json"):
                assert_set_aside(master, name, "taking the group's table from a replica")
                assert not (store / f"{name}.awaiting-replica").exists()

            # a slave takes them from its master before it serves
            slave.stop()
            store = tmp_path / "store" / "lost-meta-1"
            not_json(store / "topics.json")
            shaped('{"groups": {}}')(store / "subscriptions.json")
            slave = await asyncio.to_thread(cluster.restart, "lost-meta", 1)

            async def slave_online() -> bool:
                status = await pool.call_pb(
                    slave.rpc,
                    RequestCode.GET_BROKER_STATUS,
                    common_pb2.Empty(),
                    broker_pb2.BrokerStatus,
                    5000,
                )
                return not json.loads(status.json)["isolated"]

            await eventually(slave_online, timeout=30, interval=0.2)
            assert await slave_has_them()
            for name in ("topics.json", "subscriptions.json"):
                assert_set_aside(slave, name, "taking the group's table from a replica")
                assert not (store / f"{name}.awaiting-replica").exists()
    finally:
        cluster.stop()
