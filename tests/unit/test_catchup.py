"""Catch-up of a master behind its slaves (broker_agent.replication.catchup).

The plan and the topic merge are plain functions; the copy loop runs against fake
slaves at the socket seam: real RpcServers answering GET_COMMITLOG_RANGE from real
stores, with faults (corrupt bytes, a cut record, a slave that dies) injected into
their answers."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from fakes import request_context

from broker_agent.metadata.topics import TopicConfigManager
from broker_agent.replication.catchup import (
    LOST_VOLUME_MARKER,
    CatchUp,
    CatchUpError,
    CommitLogRangeService,
    SlaveLog,
    plan_catch_up,
)
from broker_agent.store import GetMessageStatus, MessageStore, StoreConfig
from ha_controller.dataversion import DataVersion
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import OffsetOutOfRange
from ha_controller.routing import Perm, TopicConfig
from ha_controller.rpc import ConnectionPool, Dispatcher, RequestContext, RpcServer

SEG = 64 * 1024
CFG = StoreConfig(segment_size_bytes=SEG, max_message_size_bytes=16 * 1024)
CHUNK = 8 * 1024

# ---- the plan -------------------------------------------------------------------------------


def slave(broker_id: int, max_offset: int, min_offset: int = 0) -> SlaveLog:
    return SlaveLog(broker_id, f"127.0.0.1:{1000 + broker_id}", min_offset, max_offset)


def test_no_slaves_nothing_to_do() -> None:
    plan = plan_catch_up(0, 100, [])
    assert plan.source is None and not plan.needed and plan.blocked is None


@pytest.mark.parametrize("own_max", [500, 400])
def test_a_master_ahead_of_or_level_with_its_slaves_copies_nothing(own_max: int) -> None:
    plan = plan_catch_up(0, own_max, [slave(1, 400), slave(2, 300)])
    assert not plan.needed and plan.blocked is None
    assert plan.source is not None and plan.source.broker_id == 1
    assert "not behind" in str(plan)


def test_behind_copies_from_the_most_advanced_slave_after_our_end() -> None:
    plan = plan_catch_up(0, 100, [slave(1, 300), slave(2, 900)])
    assert plan.needed and not plan.lost_volume
    assert plan.source is not None and plan.source.broker_id == 2
    assert (plan.start, plan.target) == (100, 900)
    assert "from slave 2" in str(plan)


def test_among_equals_the_highest_id_is_the_source_not_the_acting_one() -> None:
    plan = plan_catch_up(0, 0, [slave(1, 900), slave(2, 900), slave(3, 800)])
    assert plan.source is not None and plan.source.broker_id == 2


def test_an_empty_log_is_a_lost_volume_and_takes_all_from_the_slave_start() -> None:
    plan = plan_catch_up(0, 0, [slave(1, 3 * SEG, min_offset=2 * SEG)])
    assert plan.needed and plan.lost_volume
    assert (plan.start, plan.target) == (2 * SEG, 3 * SEG)
    assert "commit log empty" in str(plan)


def test_a_gap_between_our_end_and_the_slave_start_blocks() -> None:
    plan = plan_catch_up(0, 100, [slave(1, 3 * SEG, min_offset=2 * SEG)])
    assert not plan.needed
    assert plan.blocked is not None and "cannot fill the gap" in plan.blocked


# ---- topics -----------------------------------------------------------------------------------


def topic(name: str, queues: int = 4) -> TopicConfig:
    return TopicConfig(name, queues, queues, Perm.READ | Perm.WRITE)


def test_an_older_topic_table_adds_what_a_lost_table_lacks(tmp_path: Path) -> None:
    topics = TopicConfigManager(tmp_path / "topics.json")
    topics.upsert(topic("A", 8))
    old = DataVersion(0, 0, 1)
    assert topics.adopt([topic("A", 4), topic("B")], old, add_missing=True) == ["B"]
    a = topics.get("A")
    assert a is not None and a.write_queue_nums == 8
    assert (tmp_path / "topics.json").exists()


def test_an_older_topic_table_adds_nothing_to_a_kept_table(tmp_path: Path) -> None:
    """Slaves keep topics the master deleted: a master with its own table (only its
    log's tail lost) must not take them back."""
    topics = TopicConfigManager(tmp_path / "topics.json")
    topics.upsert(topic("A", 8))
    old = DataVersion(0, 0, 1)
    assert topics.adopt([topic("A", 4), topic("B")], old, add_missing=False) == []
    assert topics.get("B") is None


def test_a_newer_topic_table_wins_for_every_topic_it_holds(tmp_path: Path) -> None:
    topics = TopicConfigManager(tmp_path / "topics.json")
    topics.upsert(topic("A", 8))
    topics.upsert(topic("C"))
    newer = DataVersion(1, 0, 0)
    theirs = [topic("A", 4), topic("B")]
    assert sorted(topics.adopt(theirs, newer, add_missing=False)) == ["A", "B"]
    a = topics.get("A")
    assert a is not None and a.write_queue_nums == 4
    assert topics.get("C") is not None


# ---- the copy loop against fake slaves ---------------------------------------------------------


Fault = Callable[[int, broker_pb2.CommitLogRange], broker_pb2.CommitLogRange]


class FakeSlave:
    """A real store behind a real RpcServer answering GET_COMMITLOG_RANGE, with a hook
    that may rewrite the n-th data answer (0-based, probes not counted)."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.service = CommitLogRangeService(store)
        self.fault: Fault | None = None
        self.data_calls = 0
        d = Dispatcher()
        d.add(RequestCode.GET_COMMITLOG_RANGE, broker_pb2.CommitLogRangeRequest, self._range)
        self.server = RpcServer(d, name="fake-slave")
        self.addr = ""

    async def start(self) -> FakeSlave:
        host, port = await self.server.start("127.0.0.1", 0)
        self.addr = f"{host}:{port}"
        return self

    async def _range(
        self, ctx: RequestContext, req: broker_pb2.CommitLogRangeRequest
    ) -> broker_pb2.CommitLogRange:
        out = await self.service.get_range(ctx, req)
        if req.max_bytes:
            n = self.data_calls
            self.data_calls += 1
            if self.fault is not None:
                out = self.fault(n, out)
        return out

    async def aclose(self) -> None:
        await self.server.aclose(grace_s=0.1)


def fill(store: MessageStore, n: int) -> dict[tuple[int, int], bytes]:
    """``n`` messages over 3 queues of topic T (several segments); (queue, offset) -> body."""
    out = {}
    for i in range(n):
        body = f"message {i} ".encode() * (1 + i % 300)
        r = store.put("T", i % 3, body, {"TAGS": "t"})
        out[(i % 3, r.queue_offset)] = body
    return out


def same_messages(store: MessageStore, expected: dict[tuple[int, int], bytes]) -> None:
    for (qid, qoff), body in expected.items():
        m = store.get_message_at("T", qid, qoff)
        assert m is not None and m.body == body, (qid, qoff)
    res = store.get_messages("T", 0, 0, max_count=1000)
    assert res.status is GetMessageStatus.FOUND


@pytest.fixture
async def pool() -> AsyncIterator[ConnectionPool]:
    async with ConnectionPool() as p:
        yield p


@pytest.fixture
def slave_store(tmp_path: Path) -> MessageStore:
    return MessageStore.open(tmp_path / "slave", CFG)


@pytest.fixture
async def fake(slave_store: MessageStore) -> AsyncIterator[FakeSlave]:
    s = await FakeSlave(slave_store).start()
    try:
        yield s
    finally:
        await s.aclose()
        slave_store.close()


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MessageStore]:
    store = MessageStore.open(tmp_path / "master", CFG)
    yield store
    store.close()


async def plan_and_run(
    catchup: CatchUp, slaves: list[tuple[int, str]], steps: list[str] | None = None
) -> None:
    plan = catchup.plan(await catchup.probe(slaves))
    assert plan.needed, plan
    await catchup.run(plan, (steps if steps is not None else []).append)


async def test_an_empty_master_copies_everything_and_rebuilds_its_queues(
    fake: FakeSlave, master: MessageStore, pool: ConnectionPool
) -> None:
    expected = fill(fake.store, 400)
    catchup = CatchUp(master, pool, chunk_bytes=CHUNK)
    steps: list[str] = []
    await plan_and_run(catchup, [(2, fake.addr)], steps)
    assert master.commitlog_max_offset == fake.store.commitlog_max_offset
    assert master.read_commitlog(0, 1 << 30) == fake.store.read_commitlog(0, 1 << 30)
    assert master.dispatch_behind_bytes == 0
    assert master.flushed_offset == master.commitlog_max_offset
    same_messages(master, expected)
    total = fake.store.commitlog_max_offset / (1 << 20)
    assert steps[0] == f"catching up from slave 2: 0.0 of {total:.1f} MiB"
    assert any(s.startswith("caught up from slave 2") for s in steps)
    # an empty log is a lost volume: pre-online still has to take the slave's tables
    assert catchup.lost_volume_pending()
    assert (master.directory / LOST_VOLUME_MARKER).exists()
    catchup.lost_volume_done()
    assert not catchup.lost_volume_pending()
    # and the log is appendable as a master's again
    master.put("T", 0, b"after catch-up")
    assert master.commitlog_max_offset > fake.store.commitlog_max_offset


async def test_a_master_with_a_lost_tail_copies_only_the_tail(
    fake: FakeSlave, tmp_path: Path, pool: ConnectionPool
) -> None:
    expected = fill(fake.store, 200)
    head = fake.store.read_commitlog(0, 20_000)  # whole records
    with MessageStore.open(tmp_path / "master", CFG) as master:
        master.append_replicated(0, head)
        master.reput()
        catchup = CatchUp(master, pool, chunk_bytes=CHUNK)
        plan = catchup.plan(await catchup.probe([(1, fake.addr)]))
        assert (plan.start, plan.lost_volume) == (len(head), False)
        await catchup.run(plan, lambda step: None)
        assert master.commitlog_max_offset == fake.store.commitlog_max_offset
        same_messages(master, expected)
        assert not catchup.lost_volume_pending()


def corrupt_third(n: int, rng: broker_pb2.CommitLogRange) -> broker_pb2.CommitLogRange:
    if n == 2 and rng.data:
        data = bytearray(rng.data)
        data[len(data) // 2] ^= 0xFF
        rng.data = bytes(data)
    return rng


def cut_third(n: int, rng: broker_pb2.CommitLogRange) -> broker_pb2.CommitLogRange:
    if n == 2 and rng.data:
        rng.data = rng.data[: len(rng.data) - 7]
    return rng


def empty_third(n: int, rng: broker_pb2.CommitLogRange) -> broker_pb2.CommitLogRange:
    if n == 2:
        rng.data = b""
    return rng


def shifted_third(n: int, rng: broker_pb2.CommitLogRange) -> broker_pb2.CommitLogRange:
    if n == 2:
        rng.from_offset += 1
    return rng


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        (corrupt_third, "data from slave 2"),
        (cut_third, "data from slave 2"),
        (empty_third, "sent no data"),
        (shifted_third, "answered a range at"),
    ],
    ids=["corrupt", "cut-record", "short", "wrong-offset"],
)
async def test_bad_data_is_a_typed_error_and_a_retry_resumes(
    fake: FakeSlave, master: MessageStore, pool: ConnectionPool, fault: Fault, says: str
) -> None:
    expected = fill(fake.store, 300)
    fake.fault = fault
    catchup = CatchUp(master, pool, chunk_bytes=CHUNK)
    plan = catchup.plan(await catchup.probe([(2, fake.addr)]))
    with pytest.raises(CatchUpError, match=says):
        await catchup.run(plan, lambda step: None)
    # nothing of the bad answer was kept: the log ends after the two good chunks
    kept = master.commitlog_max_offset
    assert 0 < kept < fake.store.commitlog_max_offset
    assert master.read_commitlog(0, 1 << 30) == fake.store.read_commitlog(0, kept)
    fake.fault = None
    await plan_and_run(catchup, [(2, fake.addr)])  # the next pre-online cycle
    assert master.commitlog_max_offset == fake.store.commitlog_max_offset
    same_messages(master, expected)


async def test_a_slave_that_dies_mid_way_leaves_a_resumable_log(
    tmp_path: Path, master: MessageStore, pool: ConnectionPool
) -> None:
    s1_store = MessageStore.open(tmp_path / "s1", CFG)
    s2_store = MessageStore.open(tmp_path / "s2", CFG)
    expected = fill(s2_store, 300)
    s1_store.append_replicated(0, s2_store.read_commitlog(0, 1 << 30))  # same log
    s1_store.reput()
    s1, s2 = await FakeSlave(s1_store).start(), await FakeSlave(s2_store).start()
    try:

        def die_at_third(n: int, rng: broker_pb2.CommitLogRange) -> broker_pb2.CommitLogRange:
            if n == 2:
                raise OffsetOutOfRange("the slave's store went away")
            return rng

        s2.fault = die_at_third
        catchup = CatchUp(master, pool, chunk_bytes=CHUNK)
        plan = catchup.plan(await catchup.probe([(1, s1.addr), (2, s2.addr)]))
        assert plan.source is not None and plan.source.broker_id == 2
        with pytest.raises(CatchUpError, match="slave 2"):
            await catchup.run(plan, lambda step: None)
        await s2.aclose()
        middle = master.commitlog_max_offset
        assert middle > 0
        # slave 2 is gone: its probe fails and names it (pre-online waits a cycle) ...
        with pytest.raises(CatchUpError, match="slave 2"):
            await catchup.probe([(1, s1.addr), (2, s2.addr)])
        # ... until the member group drops it; then slave 1 finishes from our end
        plan = catchup.plan(await catchup.probe([(1, s1.addr)]))
        assert plan.source is not None and plan.source.broker_id == 1
        assert plan.start == middle
        await catchup.run(plan, lambda step: None)
        assert master.commitlog_max_offset == s2_store.commitlog_max_offset
        same_messages(master, expected)
    finally:
        await s1.aclose()
        await s2.aclose()
        s1_store.close()
        s2_store.close()


async def test_progress_is_logged_periodically_not_per_chunk(
    fake: FakeSlave, master: MessageStore, pool: ConnectionPool, caplog: pytest.LogCaptureFixture
) -> None:
    fill(fake.store, 400)
    catchup = CatchUp(master, pool, chunk_bytes=CHUNK, progress_log_s=3600)
    chunks = fake.store.commitlog_max_offset // CHUNK
    assert chunks > 10
    with caplog.at_level(logging.INFO, logger="broker_agent.replication.catchup"):
        await plan_and_run(catchup, [(2, fake.addr)])
    lines = [r.getMessage() for r in caplog.records if r.name.endswith("catchup")]
    assert len(lines) == 1 and lines[0].startswith("caught up from slave 2"), lines


async def test_the_range_service_bounds_its_answers(slave_store: MessageStore) -> None:
    fill(slave_store, 5000)
    assert slave_store.commitlog_max_offset > 4 << 20
    service = CommitLogRangeService(slave_store)
    ctx = request_context(RequestCode.GET_COMMITLOG_RANGE)
    probe = await service.get_range(ctx, broker_pb2.CommitLogRangeRequest(from_offset=0))
    assert probe.data == b"" and probe.max_offset == slave_store.commitlog_max_offset
    big = await service.get_range(
        ctx, broker_pb2.CommitLogRangeRequest(from_offset=0, max_bytes=1 << 30)
    )
    assert 0 < len(big.data) <= 4 << 20
    with pytest.raises(OffsetOutOfRange):
        await service.get_range(
            ctx,
            broker_pb2.CommitLogRangeRequest(
                from_offset=slave_store.commitlog_max_offset + 1, max_bytes=CHUNK
            ),
        )
