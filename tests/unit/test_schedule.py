"""Delayed and timer messages: the send-side rewrite, the versioned progress
tables, and the schedule service over small fakes of its ports (``tests/fakes.py``:
an in-memory store, a fake core and write path, a real escape bridge over them).

The service runs on a ``FakeClock``: a test moves time by hand and waits until every
delivery loop waits on the clock again (:func:`idle`), so nothing sleeps for a due
time and "not delivered yet" is checked at a known moment."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeBroker, FakeClock, FakeCore, FakeStore

from broker_agent.metadata.versioned import forward_sync, reverse_sync
from broker_agent.special import schedule as schedule_module
from broker_agent.special.schedule import (
    DelayOffsetTable,
    RecallTable,
    ScheduleService,
    TimerCheckpoint,
    TimerCheckpointFile,
    TimerIndex,
    TimerMark,
    delayed_target,
    restored,
)
from broker_agent.special.schedule.delivery import OVERDUE_LOG_LINES
from broker_agent.special.schedule.recall import FetchMembers
from ha_controller.config import BrokerConfig
from ha_controller.dataversion import DataVersion
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BadRequest, InSyncReplicasNotEnough, NotRecallable
from ha_controller.protocol.properties import (
    DELAY_OFFSET_GROUP,
    PROPERTY_DUE_MS,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DEL_UNIQKEY,
    SCHEDULE_TOPIC,
    TIMER_CHECKPOINT_GROUP,
    TIMER_TOPIC,
)
from ha_controller.protocol.record import StoredMessage
from ha_controller.routing import BrokerMemberGroup
from ha_controller.rpc import RpcServer
from ha_controller.testing import eventually

TOPIC = "T"
#: the fake clock's start (ms)
T0 = 1_700_000_000_000


def config(store: Path, broker_id: int = 0, **kw: Any) -> BrokerConfig:
    args: dict[str, Any] = {
        "broker_name": "broker-a",
        "broker_id": broker_id,
        "namesrv_addrs": ("127.0.0.1:9",),
        "store_dir": str(store),
        "total_replicas": 1,
        "in_sync_replicas": 1,
        "delay_levels": "1s 2s 500ms",
        "delay_offset_update_version_step": 3,
    }
    args.update(kw)
    return BrokerConfig(**args)


# ---- send side -------------------------------------------------------------------------


def test_delay_level_goes_to_the_schedule_queue(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    props = {"DELAY": "2", "KEYS": "k"}
    assert delayed_target(cfg, TOPIC, 3, props, now=1000) == (SCHEDULE_TOPIC, 1)
    assert props[PROPERTY_REAL_TOPIC] == TOPIC
    assert props[PROPERTY_REAL_QID] == "3"
    assert props[PROPERTY_DUE_MS] == "3000"


def test_delay_level_above_the_highest_is_clamped(tmp_path: Path) -> None:
    props = {"DELAY": "18"}
    assert delayed_target(config(tmp_path), TOPIC, 0, props, now=0) == (SCHEDULE_TOPIC, 2)
    assert props["DELAY"] == "3" and props[PROPERTY_DUE_MS] == "500"


def test_level_zero_and_plain_messages_stay_in_their_topic(tmp_path: Path) -> None:
    props = {"DELAY": "0"}
    assert delayed_target(config(tmp_path), TOPIC, 1, props) == (TOPIC, 1)
    assert props == {}
    props = {"KEYS": "k"}
    assert delayed_target(config(tmp_path), TOPIC, 1, props) == (TOPIC, 1)
    assert props == {"KEYS": "k"}


def test_timer_message_goes_to_the_timer_queue_unless_already_due(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    props = {"TIMER_DELIVER_MS": "5000"}
    assert delayed_target(cfg, TOPIC, 2, props, now=1000) == (TIMER_TOPIC, 0)
    assert props[PROPERTY_DUE_MS] == "5000"
    past = {"TIMER_DELIVER_MS": "500"}
    assert delayed_target(cfg, TOPIC, 2, past, now=1000) == (TOPIC, 2)
    assert "TIMER_DELIVER_MS" not in past


def test_a_timer_message_due_beyond_the_max_delay_is_refused(tmp_path: Path) -> None:
    """The timer holds every undelivered timer message in memory: how far ahead one may
    be due is bounded, as RocketMQ's timerMaxDelaySec bounds it."""
    cfg = config(tmp_path)
    limit = cfg.timer_max_delay_ms
    assert limit == 3 * 24 * 3_600_000
    at_limit = {"TIMER_DELIVER_MS": str(1000 + limit)}
    assert delayed_target(cfg, TOPIC, 0, at_limit, now=1000) == (TIMER_TOPIC, 0)
    with pytest.raises(BadRequest, match="more than timer_max_delay_ms"):
        delayed_target(cfg, TOPIC, 0, {"TIMER_DELIVER_MS": str(1001 + limit)}, now=1000)


@pytest.mark.parametrize("props", [{"DELAY": "x"}, {"TIMER_DELIVER_MS": "soon"}])
def test_malformed_delay_is_refused(tmp_path: Path, props: dict[str, str]) -> None:
    with pytest.raises(BadRequest):
        delayed_target(config(tmp_path), TOPIC, 0, props)


def test_restored_drops_the_schedule_properties() -> None:
    msg = StoredMessage(
        SCHEDULE_TOPIC,
        0,
        b"x",
        {"DELAY": "1", PROPERTY_REAL_TOPIC: TOPIC, PROPERTY_REAL_QID: "2", PROPERTY_DUE_MS: "9"}
        | {"UNIQ_KEY": "u"},
    )
    assert restored(msg) == (TOPIC, 2, {"UNIQ_KEY": "u"})
    assert restored(StoredMessage(SCHEDULE_TOPIC, 0, b"x", {})) is None


# ---- progress tables -------------------------------------------------------------------


def test_delay_offset_version_moves_every_step_and_survives_restart(tmp_path: Path) -> None:
    path = tmp_path / "delay.json"
    table = DelayOffsetTable(path, version_step=3)
    table.load()
    assert path.exists()  # the initial version is persisted at once
    first = table.data_version.copy()
    for i in range(1, 3):
        table.update(4, i)
    assert table.data_version.counter == first.counter
    table.update(4, 3)
    assert table.data_version.counter == first.counter + 1
    table.persist()
    again = DelayOffsetTable(path, version_step=3)
    again.load()
    assert again.offsets == {4: 3}
    assert again.data_version.key() == table.data_version.key()


def test_restarted_table_without_updates_keeps_its_version(tmp_path: Path) -> None:
    path = tmp_path / "delay.json"
    table = DelayOffsetTable(path)
    table.load()
    time.sleep(0.005)
    again = DelayOffsetTable(path)
    again.load()
    assert again.data_version.key() == table.data_version.key()


def test_reverse_sync_adopts_ties_and_newer_and_never_rolls_back(tmp_path: Path) -> None:
    master = DelayOffsetTable(tmp_path / "m.json")
    master.offsets = {1: 10, 4: 5}
    slave_version = master.data_version.copy()
    assert master.adopt_if_newer({4: 32, 1: 7}, slave_version)  # tie adopts
    assert master.offsets == {1: 10, 4: 32}  # per level the larger
    older = DataVersion(0, master.data_version.counter - 1, 0)
    assert not master.adopt_if_newer({4: 100}, older)
    assert master.offsets[4] == 32


def test_a_cut_replaces_the_delay_offsets_where_a_sync_only_moves_them_forward() -> None:
    """Long-campaign seeds 1013 and 1027: a master cut off delivered due messages in its
    lease (the deliveries were cut away on its return), took its acting slave's delay
    offsets with the forward-only merge, kept its own higher level, and skipped the
    messages stored next at those queue offsets: they were never delivered."""
    master = DelayOffsetTable(None)
    master.update(1, 4)  # delivered offset 3 while cut off; the cut removed it
    slave_version = DataVersion(0, 9, 1)
    assert master.assign({1: 3}, slave_version)  # a forward sync never moves back
    assert master.get(1) == 4
    master.replace({1: 3, 2: 5}, slave_version)  # what pre-online's cut does now
    assert (master.get(1), master.get(2)) == (3, 5)
    assert master.data_version.key() == slave_version.key()


def test_timer_checkpoint_version_moves_on_every_change(tmp_path: Path) -> None:
    cp = TimerCheckpointFile(tmp_path / "timer.json")
    cp.load()
    before = cp.cp.version.counter
    assert cp.advance(TimerMark(1000, 3))
    assert not cp.advance(TimerMark(1000, 3))
    assert cp.cp.version.counter == before + 1
    newer = TimerCheckpoint(2000, 32, DataVersion(0, before + 5, 1))
    assert cp.adopt_if_newer(newer)
    assert (cp.cp.last_read_time_ms, cp.cp.master_timer_queue_offset) == (2000, 32)
    assert not cp.adopt_if_newer(TimerCheckpoint(1, 1, DataVersion(0, 0, 0)))


def test_timer_index_checkpoint_covers_only_delivered_entries() -> None:
    index = TimerIndex()
    index.max_delivered_due = 100
    for offset, due in enumerate([500, 300, 400]):
        index.add(due, offset)
    index.read_offset = 3
    assert index.checkpoint() == TimerMark(299, 3)
    index.pop()  # 300
    assert index.checkpoint() == TimerMark(399, 3)
    index.pop()
    index.pop()
    assert index.checkpoint() == TimerMark(500, 3)


def test_timer_checkpoint_tells_apart_entries_due_in_the_same_millisecond() -> None:
    """Three entries due in one millisecond: after the first is delivered the checkpoint
    must say so (a slave taking over, or a master taking the acting slave's table back,
    delivered it a second time when it could only say "up to the millisecond before")."""
    index = TimerIndex()
    for offset in range(3):
        index.add(700, offset)
    index.add(800, 3)
    index.read_offset = 4
    assert index.checkpoint_after_head() == TimerMark(699, 4, 1)
    index.pop()
    assert index.checkpoint() == TimerMark(699, 4, 1)
    assert index.checkpoint_after_head() == TimerMark(699, 4, 2)
    index.pop()
    index.pop()
    assert index.checkpoint() == TimerMark(799, 4)  # the whole millisecond is done
    # what a broker reading the timer queue with that checkpoint skips
    cp = TimerCheckpoint(699, 4, None, 2)
    assert [cp.delivered(700, o) for o in range(3)] == [True, True, False]
    assert not cp.delivered(800, 3)
    assert not cp.delivered(700, 5)  # not read when the checkpoint was taken
    assert TimerCheckpoint.from_dict(cp.to_dict()).mark == TimerMark(699, 4, 2)


def test_a_forward_sync_never_takes_a_timer_mark_behind_a_replicated_record() -> None:
    """Campaign ``controller-slave-behind``, seed 3305: the master appended a delivery
    and its progress record (O 157, L ...999) and waited for its replicas, its own
    checkpoint still at L ...581; the slave applied the record, then the 2 s forward
    sync took the master's older checkpoint, and the slave that acted next delivered
    that message a second time."""
    slave = TimerCheckpointFile(None)
    slave.apply_record(TimerMark(292999, 157).record())
    master = TimerCheckpoint(292581, 157, DataVersion(0, 40, 1))
    slave.take_from_master(master)
    assert slave.cp.mark == TimerMark(292999, 157)
    assert slave.cp.version.key() == master.version.key()  # the master's version
    # the queue read further: an earlier due time of a new entry is still ahead
    slave.apply_record(TimerMark(300000, 158).record())
    slave.take_from_master(TimerCheckpoint(299000, 159, DataVersion(0, 41, 1)))
    assert slave.cp.mark == TimerMark(299000, 159)
    # a master ahead is taken as it is; a cut's replace takes an older one too
    slave.take_from_master(TimerCheckpoint(310000, 160, DataVersion(0, 42, 1), 3))
    assert slave.cp.mark == TimerMark(310000, 160, 3)
    slave.assign(TimerCheckpoint(100, 2, DataVersion(0, 43, 1)))
    assert slave.cp.mark == TimerMark(100, 2)
    # a broker started again knows no replicated record: the master's is taken
    fresh = TimerCheckpointFile(None)
    fresh.cp = TimerCheckpoint(292999, 157, DataVersion(0, 39, 1))
    fresh.take_from_master(master)
    assert fresh.cp.mark == TimerMark(292581, 157)


def test_a_member_elected_takes_a_timer_mark_ahead_of_its_own_whatever_the_versions() -> None:
    """Seed 3305: member 2 acted, then member 1 (just resumed) acted instead and
    delivered the message due next; the controller elected member 2, whose version was
    newer (it took over first and moved on), and which kept its own checkpoint."""
    elected = TimerCheckpointFile(None)
    elected.cp = TimerCheckpoint(174294, 10, DataVersion(2, 9, 5))
    held = TimerCheckpoint(174659, 10, DataVersion(2, 8, 7))  # offset 9 delivered
    assert elected.adopt_on_promotion(held, queue_end=10)
    assert elected.cp.mark == TimerMark(174659, 10)
    assert elected.cp.version.key() == (2, 9, 5)  # the newer version stays
    assert not elected.adopt_on_promotion(TimerCheckpoint(174000, 10, DataVersion(3, 0, 0)), 10)
    assert elected.cp.mark == TimerMark(174659, 10)
    # a member that read a timer queue this log does not hold is not taken
    assert not elected.adopt_on_promotion(TimerCheckpoint(180000, 12, DataVersion(2, 9, 9)), 10)
    assert elected.cp.mark == TimerMark(174659, 10)


def test_a_member_elected_takes_each_delay_level_further_whatever_the_versions() -> None:
    """``controller-flap``, seed 3307: the member elected kept its own delay offsets by
    their version, below what the slave that acted last had delivered."""
    elected = DelayOffsetTable(None)
    elected.update(6, 5)
    elected.update(2, 9)
    assert elected.adopt_on_promotion({6: 7, 2: 8, 3: 12}, ends={6: 7, 2: 9, 3: 4})
    assert (elected.get(6), elected.get(2), elected.get(3)) == (7, 9, 4)  # 3: capped
    assert not elected.adopt_on_promotion({6: 6}, ends={6: 7})


# ---- the service over fakes of its ports -----------------------------------------------


@dataclass
class Node:
    """One broker as the schedule service sees it: fake core and write path, a real
    escape bridge over them, and the service under test on the test's clock."""

    broker: FakeBroker
    schedule: ScheduleService
    clock: FakeClock

    @property
    def core(self) -> FakeCore:
        return self.broker.core


NodeFactory = Callable[..., Node]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
async def nodes(tmp_path: Path, clock: FakeClock) -> AsyncIterator[NodeFactory]:
    made: list[Node] = []
    # one in-memory store per store name: a node made again on the same store is a
    # restart (the messages stay; the progress files under store_dir are reloaded)
    stores: dict[str, FakeStore] = {}

    def make(
        broker_id: int = 0,
        store: str = "a",
        fetch_members: FetchMembers | None = None,
        **kw: object,
    ) -> Node:
        broker = FakeBroker(
            config(tmp_path / store, broker_id, **kw),
            addr=f"127.0.0.1:{10911 + len(made)}",
            store=stores.setdefault(store, FakeStore(clock)),
        )
        core, write_path, escape = broker.core, broker.write_path, broker.escape
        service = ScheduleService(core, write_path, escape, clock, fetch_members)
        node = Node(broker, service, clock)
        made.append(node)
        return node

    yield make
    for node in made:
        await node.broker.aclose()


def put_delayed(node: Node, props: dict[str, str], queue_id: int = 0) -> None:
    """A send of a delayed message, as the write path stores it (waking the loops)."""
    topic, qid = delayed_target(node.core.cfg, TOPIC, queue_id, props, now=node.clock.now_ms())
    result = node.core.store.put(topic, qid, b"body", props, store_host=node.core.addr)
    node.core.holds.notify(topic, qid, result.queue_offset + 1, None)


@contextlib.asynccontextmanager
async def running(node: Node) -> AsyncIterator[None]:
    node.schedule.set_running(True)
    task = asyncio.create_task(node.schedule.run())
    try:
        await idle(node)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def idle(node: Node) -> None:
    """Until the session's loops (one per delay level, and the timer's) all wait on the
    clock: whatever the clock and the stored messages let them do is done."""
    loops = node.core.cfg.max_delay_level + 1
    await eventually(lambda: node.schedule.running and node.clock.waiting == loops, 5)


async def advance(node: Node, ms: int) -> None:
    """Move the clock on and let the loops act on it."""
    node.clock.advance(ms)
    await idle(node)


def delivered(node: Node, queue_id: int = 0) -> list[StoredMessage]:
    store = node.core.store
    return [
        m
        for o in range(store.max_offset(TOPIC, queue_id))
        if (m := store.get_message_at(TOPIC, queue_id, o)) is not None
    ]


def uniq_keys(node: Node) -> list[str]:
    return [m.properties["UNIQ_KEY"] for m in delivered(node)]


async def test_master_delivers_a_level_message_when_due(nodes: NodeFactory) -> None:
    master = nodes()
    put_delayed(master, {"DELAY": "3", "UNIQ_KEY": "u1"}, queue_id=1)  # 500 ms
    async with running(master):
        await advance(master, 499)
        assert delivered(master, 1) == []
        await advance(master, 1)
        [msg] = delivered(master, 1)
    assert msg.store_ts_ms == T0 + 500
    assert msg.properties == {"UNIQ_KEY": "u1"}
    assert msg.body == b"body"
    assert master.schedule.delay_offsets.get(3) == 1


def timer_pending(node: Node) -> float | None:
    metrics = node.core.metrics
    return metrics.registry.get_sample_value("hac_timer_messages_pending", metrics.ident)


async def test_master_delivers_timer_messages_in_due_order(nodes: NodeFactory) -> None:
    master = nodes()
    for i, after in enumerate([900, 300, 600]):
        put_delayed(master, {"TIMER_DELIVER_MS": str(T0 + after), "UNIQ_KEY": f"t{i}"})
    async with running(master):
        for count, until in enumerate([300, 600, 900], 1):
            await advance(master, until - 1 - (master.clock.now_ms() - T0))
            assert len(delivered(master)) == count - 1
            await advance(master, 1)
            assert len(delivered(master)) == count
        assert timer_pending(master) == 0
    assert uniq_keys(master) == ["t1", "t2", "t0"]
    assert [m.store_ts_ms for m in delivered(master)] == [T0 + 300, T0 + 600, T0 + 900]
    assert master.schedule.timer.cp.master_timer_queue_offset == 3


async def test_a_damaged_timer_entry_holds_the_timer_and_moves_no_checkpoint_back(
    nodes: NodeFactory,
) -> None:
    """Corruption drill-000's replays: a session (an acting slave's, a restarted
    master's) reads the timer queue from its start and stops at a damaged entry below
    the checkpoint until it is repaired.  A checkpoint taken meanwhile named the read
    offset, below the one it had, and the entries between came a second time (70
    duplicates); now the timer waits, and nothing comes twice."""
    master = nodes()
    for i, after in enumerate([300, 600, 900]):
        put_delayed(master, {"TIMER_DELIVER_MS": str(T0 + after), "UNIQ_KEY": f"t{i}"})
    async with running(master):
        await advance(master, 900)
    assert uniq_keys(master) == ["t0", "t1", "t2"]
    cp = master.schedule.timer.cp
    assert cp.master_timer_queue_offset == 3
    store = master.core.store
    store.make_unreadable(TIMER_TOPIC, 0, 1)
    put_delayed(master, {"TIMER_DELIVER_MS": str(T0 + 1000), "UNIQ_KEY": "t3"})
    async with running(master):
        await advance(master, 200)  # t3 is due, behind the damaged entry
        assert uniq_keys(master) == ["t0", "t1", "t2"]
        assert cp.master_timer_queue_offset == 3
        store.repaired(TIMER_TOPIC, 0, 1)
        await advance(master, 200)
    assert uniq_keys(master) == ["t0", "t1", "t2", "t3"]
    assert cp.master_timer_queue_offset == 4


async def test_the_pending_timer_messages_are_a_gauge(nodes: NodeFactory) -> None:
    master = nodes()
    for i in range(3):
        put_delayed(master, {"TIMER_DELIVER_MS": str(T0 + 60_000), "UNIQ_KEY": f"t{i}"})
    async with running(master):
        assert timer_pending(master) == 3
    assert timer_pending(master) == 0  # no timer runs any more


async def test_a_catch_up_names_its_late_deliveries_up_to_a_budget(
    nodes: NodeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """After a failover the acting slave (or a returning master) delivers what fell due
    meanwhile: the log says where the timer starts and names the late messages, but a
    long outage's thousands do not flood it."""
    master = nodes()
    count = OVERDUE_LOG_LINES + 5
    for i in range(count):
        put_delayed(master, {"TIMER_DELIVER_MS": str(T0 + 50), "UNIQ_KEY": f"t{i}"})
    master.clock.advance(1200)  # all of them more than a second late
    with caplog.at_level(logging.INFO, logger=schedule_module.__name__):
        async with running(master):
            assert len(delivered(master)) == count
    lines = [r.getMessage() for r in caplog.records if r.name.startswith(schedule_module.__name__)]
    [start] = [m for m in lines if m.startswith("timer: checkpoint")]
    assert f"{count} to deliver, next due {T0 + 50} (queue offset 0)" in start
    late = [m for m in lines if "ms after it was due" in m]
    assert len(late) == OVERDUE_LOG_LINES
    assert late[0].startswith("timer: delivering t0 (queue offset 0) ")
    assert late[-1].endswith("further late deliveries of this session are not logged")


async def test_nothing_is_delivered_while_stopped(nodes: NodeFactory) -> None:
    slave = nodes(broker_id=1)
    put_delayed(slave, {"DELAY": "3"})
    slave.clock.advance(10_000)  # long due
    task = asyncio.create_task(slave.schedule.run())
    try:
        for _ in range(10):  # the supervisor's turns: it starts no session
            await asyncio.sleep(0)
        assert not slave.schedule.running
        assert slave.clock.waiting == 0  # no delivery loop waits for anything
        assert slave.schedule.delay_offsets.get(3) == 0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_stopping_session_delivers_nothing_more_while_a_step_finishes(
    nodes: NodeFactory,
) -> None:
    """Check campaign seed 10002: a master fenced while another special service's step
    was under way (a POP revive awaiting its replicas) waited for that step before
    cancelling its timer loop; meanwhile it finished pre-online, took the acting
    slave's timer checkpoint and served again, and the old loop, with the timer index
    read before the fence, delivered two messages the acting slave had delivered."""
    master = nodes()
    core = master.core
    for i, after in enumerate([300, 700, 900]):
        put_delayed(master, {"TIMER_DELIVER_MS": str(T0 + after), "UNIQ_KEY": f"t{i}"})
    other_step = asyncio.Event()

    async def pop_revive_awaiting_replicas() -> None:
        with core.special_steps.step():
            await other_step.wait()

    async with running(master):
        await advance(master, 300)
        assert uniq_keys(master) == ["t0"]
        step = asyncio.create_task(pop_revive_awaiting_replicas())
        await asyncio.sleep(0)
        core.isolated = True  # fenced
        master.schedule.set_running(False)
        await eventually(lambda: master.schedule.delivery.stopping, 5)
        # pre-online: the acting slave delivered t1 and t2; the master takes its table
        taken = TimerCheckpoint(T0 + 900, 3, master.schedule.timer.cp.version.copy())
        taken.version.next_version()
        assert master.schedule.timer.adopt_if_newer(taken)
        core.isolated = False  # online again, while the other step is still under way
        master.schedule.set_running(True)
        master.clock.advance(700)  # t1 and t2 fall due
        await eventually(lambda: master.clock.waiting == 0, 5)  # the old loops ended
        other_step.set()
        await step
        await idle(master)  # the new session starts from the checkpoint taken
    assert uniq_keys(master) == ["t0"]


async def test_restarted_master_does_not_deliver_again(nodes: NodeFactory) -> None:
    master = nodes()
    put_delayed(master, {"DELAY": "3"})
    put_delayed(master, {"TIMER_DELIVER_MS": str(T0 + 200)})
    async with running(master):
        await advance(master, 500)
        assert len(delivered(master)) == 2
    await master.broker.aclose()  # the first master is gone; its store stays
    again = nodes()
    async with running(again):
        await advance(again, 10_000)
    assert len(delivered(again)) == 2


async def test_pre_online_adopts_a_newer_slave_table_over_rpc(nodes: NodeFactory) -> None:
    master = nodes(store="m")
    slave = nodes(broker_id=1, store="s")
    slave.schedule.delay_offsets.assign({}, master.schedule.delay_offsets.data_version)
    slave.schedule.timer.assign(master.schedule.timer.cp)
    # acting: the slave takes over (version bump) and delivers 32 of level 1
    slave.schedule.delay_offsets.bump()
    slave.schedule.timer.bump()
    for i in range(1, 33):
        slave.schedule.delay_offsets.update(1, i)
    slave.schedule.timer.advance(TimerMark(12345, 32))
    server = RpcServer(slave.core.dispatcher, name="slave")
    host, port = await server.start("127.0.0.1", 0)
    try:
        await reverse_sync(master.schedule.tables(), master.core.pool, 1, f"{host}:{port}")
    finally:
        await server.aclose(grace_s=0.5)
    assert master.schedule.delay_offsets.get(1) == 32
    assert master.schedule.timer.cp.master_timer_queue_offset == 32


async def test_forward_sync_is_skipped_while_delivering(nodes: NodeFactory) -> None:
    master = nodes(store="m")
    slave = nodes(broker_id=1, store="s")
    master.schedule.delay_offsets.update(2, 7)
    server = RpcServer(master.core.dispatcher, name="master")
    host, port = await server.start("127.0.0.1", 0)
    try:
        async with running(slave):
            await forward_sync(slave.schedule.tables(), slave.core.pool, f"{host}:{port}")
            assert slave.schedule.delay_offsets.get(2) == 0
        await forward_sync(slave.schedule.tables(), slave.core.pool, f"{host}:{port}")
        assert slave.schedule.delay_offsets.get(2) == 7
    finally:
        await server.aclose(grace_s=0.5)


async def test_a_slaves_timer_progress_survives_the_masters_older_table(
    nodes: NodeFactory,
) -> None:
    """The forward sync (GET_TIMER_CHECK_POINT, as the slave's 2 s loop runs it) does not
    set the slave's timer checkpoint back behind a progress record it holds."""
    master = nodes(store="m")
    slave = nodes(broker_id=1, store="s")
    master.schedule.timer.advance(TimerMark(T0 + 100, 3))
    record = TimerMark(T0 + 500, 3).record()  # appended by the master, not yet its own
    slave.schedule.progress_records()[TIMER_CHECKPOINT_GROUP](record)
    async with serving(master) as addr:
        await forward_sync(slave.schedule.tables(), slave.core.pool, addr)
    assert slave.schedule.timer.cp.mark == TimerMark(T0 + 500, 3)
    assert slave.schedule.timer.cp.version.key() == master.schedule.timer.cp.version.key()


async def test_each_delivery_carries_its_progress_to_the_slaves(nodes: NodeFactory) -> None:
    """The new delay offset / timer checkpoint is appended right behind the delivered
    message (same replication transfer), so a slave that takes over never holds a
    delivered message without knowing it was delivered; and a slave applies it."""
    master = nodes()
    put_delayed(master, {"DELAY": "1"})
    put_delayed(master, {"TIMER_DELIVER_MS": str(T0 + 200)})
    async with running(master):
        await advance(master, 1000)
        assert len(delivered(master)) == 2
    records = master.broker.core.store.progress_records()
    delay = [r for r in records if r["G"] == DELAY_OFFSET_GROUP]
    timer = [r for r in records if r["G"] == TIMER_CHECKPOINT_GROUP]
    assert delay and delay[-1] == {"G": DELAY_OFFSET_GROUP, "T": SCHEDULE_TOPIC, "Q": "1", "O": "1"}
    assert timer and int(timer[-1]["O"]) == 1
    assert int(timer[-1]["L"]) >= T0 + 200 - 1
    # a slave applying the replicated records knows the master's progress
    slave = nodes(broker_id=1, store="b")
    progress = slave.schedule.progress_records()
    progress[DELAY_OFFSET_GROUP](delay[-1])
    progress[TIMER_CHECKPOINT_GROUP](timer[-1])
    assert slave.schedule.delay_offsets.get(1) == 1
    cp = slave.schedule.timer.cp
    assert (cp.last_read_time_ms, cp.master_timer_queue_offset) == (
        master.schedule.timer.cp.last_read_time_ms,
        master.schedule.timer.cp.master_timer_queue_offset,
    )


# ---- recall (RocketMQ 5.3 RECALL_MESSAGE) ----------------------------------------------


@contextlib.asynccontextmanager
async def serving(node: Node) -> AsyncIterator[str]:
    server = RpcServer(node.core.dispatcher, name=node.core.name)
    host, port = await server.start("127.0.0.1", 0)
    try:
        yield f"{host}:{port}"
    finally:
        await server.aclose(grace_s=0.5)


async def recall(node: Node, addr: str, uniq: str, deliver_ms: int, topic: str = TOPIC) -> str:
    resp = await node.core.pool.call_pb(
        addr,
        RequestCode.RECALL_MESSAGE,
        broker_pb2.RecallMessageRequest(
            topic=topic, broker_name="broker-a", deliver_ms=deliver_ms, uniq_key=uniq
        ),
        broker_pb2.RecallMessageResponse,
        3000,
    )
    return resp.msg_id


async def test_a_recalled_timer_message_is_never_delivered(nodes: NodeFactory) -> None:
    master = nodes()
    for uniq in ("keep", "drop"):
        put_delayed(master, {"TIMER_DELIVER_MS": str(T0 + 700), "UNIQ_KEY": uniq})
    async with serving(master) as addr, running(master):
        assert await recall(master, addr, "drop", T0 + 700) == "drop"
        assert await recall(master, addr, "drop", T0 + 700) == "drop"  # again: same answer
        await advance(master, 10_000)
    assert uniq_keys(master) == ["keep"]
    # the marker went into the timer queue through the write path, once
    markers = [a for a in master.broker.core.store.appended if a.topic == TIMER_TOPIC]
    assert [a.properties[PROPERTY_TIMER_DEL_UNIQKEY] for a in markers] == ["drop"]
    assert master.schedule.delivery.recalled_skipped == 1


async def test_recall_of_an_unknown_or_delivered_message_is_refused(nodes: NodeFactory) -> None:
    master = nodes()
    put_delayed(master, {"TIMER_DELIVER_MS": str(T0 + 200), "UNIQ_KEY": "soon"})
    async with serving(master) as addr, running(master):
        await advance(master, 200)
        assert uniq_keys(master) == ["soon"]
        with pytest.raises(NotRecallable, match="already delivered"):
            await recall(master, addr, "soon", T0 + 200)
        with pytest.raises(NotRecallable, match="no scheduled message"):
            await recall(master, addr, "never-sent", T0 + 60_000)
        with pytest.raises(BadRequest):
            await recall(master, addr, "", T0 + 60_000)
        put_delayed(master, {"TIMER_DELIVER_MS": str(T0 + 60_000), "UNIQ_KEY": "later"})
        with pytest.raises(NotRecallable, match="no scheduled message"):  # another topic's
            await recall(master, addr, "later", T0 + 60_000, topic="other")
    assert len(master.schedule.recalls) == 0
    assert not [a for a in master.broker.core.store.appended if a.topic == TIMER_TOPIC]


async def test_the_recall_marker_in_the_timer_queue_alone_keeps_it_undelivered(
    nodes: NodeFactory, tmp_path: Path
) -> None:
    """What a slave taking over has: the replicated timer queue (here: the same store,
    read by a new broker) without the recall table; the marker is enough."""
    master = nodes()
    put_delayed(master, {"TIMER_DELIVER_MS": str(T0 + 800), "UNIQ_KEY": "gone"})
    put_delayed(master, {"TIMER_DELIVER_MS": str(T0 + 800), "UNIQ_KEY": "stays"})
    async with serving(master) as addr, running(master):
        await recall(master, addr, "gone", T0 + 800)
    await master.broker.aclose()
    (tmp_path / "a" / "recalls.json").unlink()
    again = nodes()
    assert "gone" not in again.schedule.recalls
    async with running(again):
        await advance(again, 10_000)
    assert uniq_keys(again) == ["stays"]
    assert "gone" in again.schedule.recalls


async def test_an_acting_slaves_recall_survives_restart_and_reaches_the_master(
    nodes: NodeFactory,
) -> None:
    slave = nodes(broker_id=1, store="s")
    slave.core.acting.on_min_broker_change(1, slave.core.addr)
    slave.core.member_group = BrokerMemberGroup("c", "broker-a", {1: slave.core.addr})
    put_delayed(slave, {"TIMER_DELIVER_MS": str(T0 + 60_000), "UNIQ_KEY": "late"})
    async with serving(slave) as addr, running(slave):
        await recall(slave, addr, "late", T0 + 60_000)
    assert slave.broker.core.store.appended == []  # a slave never appends to its own store
    await slave.broker.aclose()
    again = nodes(broker_id=1, store="s")  # restart: the table is on disk
    assert "late" in again.schedule.recalls
    master = nodes(store="m")
    async with serving(again) as addr:
        await reverse_sync(master.schedule.tables(), master.core.pool, 1, addr)
    assert "late" in master.schedule.recalls


async def test_an_acting_slave_hands_its_recall_to_members_it_has_not_read_yet(
    nodes: NodeFactory,
) -> None:
    """A slave that acts right after its start has not read its group yet (its view is
    read every second): it asks the nameservers, and hands the recall on to every other
    slave there; knowing no member at all, it refuses the recall as retriable.  (Before,
    it answered the recall and kept it alone: the slave acting after its death
    delivered the message.)"""
    other = nodes(broker_id=2, store="s2")
    async with serving(other) as other_addr:
        listed: list[BrokerMemberGroup | None] = [None]

        async def fetch() -> BrokerMemberGroup | None:
            return listed[0]

        slave = nodes(broker_id=1, store="s1", fetch_members=fetch)
        slave.core.acting.on_min_broker_change(1, slave.core.addr)
        put_delayed(slave, {"TIMER_DELIVER_MS": str(T0 + 60_000), "UNIQ_KEY": "late"})
        async with serving(slave) as addr, running(slave):
            assert slave.core.member_group is None
            with pytest.raises(InSyncReplicasNotEnough, match="not known yet"):
                await recall(slave, addr, "late", T0 + 60_000)
            assert "late" not in other.schedule.recalls
            listed[0] = BrokerMemberGroup(
                "c", "broker-a", {0: "127.0.0.1:9", 1: slave.core.addr, 2: other_addr}
            )
            await recall(slave, addr, "late", T0 + 60_000)  # the retry
        assert "late" in other.schedule.recalls


def test_recall_table_merges_as_a_union_and_forgets_past_retention(tmp_path: Path) -> None:
    table = RecallTable(tmp_path / "r.json", retention_ms=1000)
    now = int(time.time() * 1000)
    assert table.add("a", now + 5000)
    assert not table.add("a", now + 5000)
    other = DataVersion()
    other.next_version()
    assert table.merge({"b": (now + 1, "T")}, other)
    assert not table.merge({"a": (now, "T")}, DataVersion())
    table.add("old", now - 10_000)  # due long before the retention: dropped at once
    assert set(table.entries) == {"a", "b"}
    table.persist()
    loaded = RecallTable(tmp_path / "r.json")
    loaded.load()
    assert set(loaded.entries) == {"a", "b"}
