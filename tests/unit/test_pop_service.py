"""PopService through its handlers and its revive pass, on small fakes of its ports.

The broker is a ``FakeCore`` (``tests/fakes.py``: an in-memory store recording what is
appended, the real plain ActingState / TopicConfigManager / ConsumerOffsetManager)
under the real ``WritePath``, and a ``RecordingEscape`` recording what the service escapes and
reads back.  Requests go through the handlers the service registered on its
dispatcher.  The service takes a ``FakeClock`` the tests set instead of sleeping out
invisible times.  No BrokerService, no MessageStore, no sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fakes import (
    EscapePut,
    FakeClock,
    FakeCore,
    FakeReplicas,
    RecordingEscape,
    call_handler,
)

from broker_agent.metadata import pop_acks as pop_acks_module
from broker_agent.metadata.pop_acks import PopAckSnapshot, PopAckTable
from broker_agent.special.clock import SYSTEM_CLOCK, Clock
from broker_agent.special.escape import EscapeResult
from broker_agent.special.pop import Checkpoint, PopService, ReceiptHandle, revive_topic
from broker_agent.special.pop.records import MIN_INVISIBLE_MS
from broker_agent.special.pop.revive import CK_REWRITE_INTERVALS_S
from broker_agent.write_path import WritePath
from ha_controller.config import BrokerConfig
from ha_controller.filter.sql92 import FilterSyntaxError
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    BadRequest,
    BrokerIsolated,
    IllegalFilterExpression,
    NotMaster,
    ReceiptHandleExpired,
    SlaveAckTimeout,
    TopicNotFound,
)
from ha_controller.protocol.properties import (
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_POP_CK,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TAGS,
    REVIVE_GROUP,
    retry_topic,
)
from ha_controller.protocol.record import StoredMessage, make_msg_id
from ha_controller.routing import Perm, TopicConfig
from ha_controller.testing import eventually

TOPIC = "T"
GROUP = "CID_pop"
T0 = 1_700_000_000_000
REVIVE = revive_topic("DefaultCluster")
ESCAPED_REVIVE_QID = 5


# ---- the broker under test (its fakes: tests/fakes.py) ----------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@dataclass
class Broker:
    core: FakeCore
    write_path: WritePath
    escape: RecordingEscape
    service: PopService

    def records(self, tag: str) -> list[StoredMessage]:
        """CK or ACK records in this broker's own revive queue 0."""
        return [
            m for m in self.core.store.messages(REVIVE, 0) if m.properties[PROPERTY_TAGS] == tag
        ]

    def checkpoints(self) -> list[Checkpoint]:
        return [Checkpoint.from_json(m.body) for m in self.records("ck")]

    def revive_appends(self) -> list[StoredMessage]:
        return [a for a in self.core.store.appended if a.topic == REVIVE]

    def retried(self) -> list[EscapePut]:
        return [p for p in self.escape.puts if p.kind == "pop_retry"]


def config(broker_id: int = 0, **kw: Any) -> BrokerConfig:
    args: dict[str, Any] = {
        "broker_name": "broker-a",
        "broker_id": broker_id,
        "namesrv_addrs": ("127.0.0.1:9",),
        "total_replicas": 1,
        "in_sync_replicas": 1,
    }
    args.update(kw)
    return BrokerConfig(**args)


def make_broker(
    store_dir: Path, cfg: BrokerConfig, *, acting: bool = False, clock: Clock = SYSTEM_CLOCK
) -> Broker:
    addr = f"10.0.0.{cfg.broker_id + 1}:10911"
    core = FakeCore(cfg, addr=addr, store_dir=store_dir)
    core.topics.upsert(TopicConfig(TOPIC, 2, 2, Perm.READ | Perm.WRITE))
    if acting:
        core.acting.on_min_broker_change(cfg.broker_id, addr)
        assert core.acting.acting
    write_path = WritePath(core)
    # records escaped to the revive queue of a remote master, retry messages, and
    # original messages read back from the stores of the groups it knows
    escape = RecordingEscape()
    escape.stores[cfg.broker_name] = core.store
    escape.specific_queue = ESCAPED_REVIVE_QID
    service = PopService(core, write_path, escape, clock)
    return Broker(core, write_path, escape, service)


@pytest.fixture
def master(tmp_path: Path, clock: FakeClock) -> Broker:
    return make_broker(tmp_path, config(0), clock=clock)


@pytest.fixture
def slave(tmp_path: Path, clock: FakeClock) -> Broker:
    return make_broker(tmp_path, config(1), clock=clock)


@pytest.fixture
def acting(tmp_path: Path, clock: FakeClock) -> Broker:
    return make_broker(tmp_path, config(1), acting=True, clock=clock)


def produce(broker: Broker, *bodies: bytes, queue_id: int = 0, tags: str = "a") -> None:
    """Messages as a send (or, on a slave, replication) stored them."""
    for body in bodies:
        broker.core.store.put(
            TOPIC, queue_id, body, {PROPERTY_TAGS: tags}, flags=2, store_host=broker.core.addr
        )


async def pop(
    broker: Broker,
    *,
    max_msgs: int = 32,
    invisible_ms: int = 30_000,
    queue_id: int = 0,
    tags: tuple[str, ...] = (),
    sql92: str = "",
    topic: str = TOPIC,
    order: bool = False,
) -> broker_pb2.PopMessageResponse:
    request = broker_pb2.PopMessageRequest(
        consumer_group=GROUP,
        topic=topic,
        queue_id=queue_id,
        max_msg_nums=max_msgs,
        invisible_time_ms=invisible_ms,
        tags=list(tags),
        sql92=sql92,
        order=order,
    )
    return await call_handler(
        broker.core.dispatcher, RequestCode.POP_MESSAGE, request, broker_pb2.PopMessageResponse
    )


async def ack(broker: Broker, handle: str) -> None:
    request = broker_pb2.AckMessageRequest(consumer_group=GROUP, topic=TOPIC, receipt_handle=handle)
    await call_handler(
        broker.core.dispatcher, RequestCode.ACK_MESSAGE, request, broker_pb2.AckMessageResponse
    )


async def change_invisible(broker: Broker, handle: str, invisible_ms: int) -> str:
    request = broker_pb2.AckMessageRequest(
        consumer_group=GROUP, topic=TOPIC, receipt_handle=handle, invisible_time_ms=invisible_ms
    )
    response = await call_handler(
        broker.core.dispatcher,
        RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
        request,
        broker_pb2.AckMessageResponse,
    )
    return response.receipt_handle


def handle_of(message: broker_pb2.Message) -> ReceiptHandle:
    return ReceiptHandle.decode(message.properties[PROPERTY_POP_CK])


def messages_out(broker: Broker) -> float:
    m = broker.core.metrics
    value = m.registry.get_sample_value(
        "hac_messages_out_total", {**m.ident, "topic": TOPIC, "group": GROUP}
    )
    return value or 0.0


# ---- POP_MESSAGE ---------------------------------------------------------------------


def test_master_creates_the_revive_topic_and_registers_handlers(master: Broker) -> None:
    config_ = master.core.topics.get(REVIVE)
    assert config_ is not None and config_.write_queue_nums >= 1
    for code in (
        RequestCode.POP_MESSAGE,
        RequestCode.ACK_MESSAGE,
        RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
    ):
        assert master.core.dispatcher.get(code) is not None
    assert master.core.special_hooks == [master.service.set_active]


async def test_pop_returns_messages_with_receipt_handles_and_commits_the_offset(
    master: Broker, clock: FakeClock
) -> None:
    produce(master, b"m0", b"m1", b"m2")

    resp = await pop(master, max_msgs=2)

    assert [m.body for m in resp.messages] == [b"m0", b"m1"]
    assert (resp.pop_time_ms, resp.invisible_time_ms) == (T0, 30_000)
    handles = [handle_of(m) for m in resp.messages]
    assert handles == [
        ReceiptHandle(0, T0, 30_000, 0, True, "broker-a", 0, offset) for offset in (0, 1)
    ]
    [ck] = master.checkpoints()
    assert (ck.broker_name, ck.group, ck.topic, ck.queue_id) == ("broker-a", GROUP, TOPIC, 0)
    assert (ck.start_offset, ck.offsets) == (0, (0, 1))
    assert (ck.pop_time_ms, ck.due_ms) == (T0, T0 + 30_000)
    [ck_record] = master.records("ck")
    assert ck_record.properties["POP_KEY"] == ck.key == handles[0].ck_key(GROUP, TOPIC)
    [ck_append] = master.revive_appends()
    assert ck_append.store_host == master.core.addr  # its own write path, not an escape
    # the pop offset is the group's consumer offset, committed through the write path
    assert master.core.offsets.query(GROUP, TOPIC, 0) == 2
    assert (GROUP, TOPIC, 0, 2) in master.core.store.offset_records()
    assert master.core.topics.get(retry_topic(GROUP)) is not None
    assert master.core.topics_changed_calls == 1
    assert messages_out(master) == 2

    again = await pop(master, max_msgs=2)
    assert [m.body for m in again.messages] == [b"m2"]
    assert handle_of(again.messages[0]).ck_offset == 2
    assert (await pop(master)).messages == []
    assert master.core.offsets.query(GROUP, TOPIC, 0) == 3


async def test_pop_any_queue_takes_from_every_queue(master: Broker) -> None:
    produce(master, b"q0", queue_id=0)
    produce(master, b"q1", queue_id=1)

    resp = await pop(master, queue_id=-1)

    assert sorted(m.body for m in resp.messages) == [b"q0", b"q1"]
    assert sorted(ck.queue_id for ck in master.checkpoints()) == [0, 1]


async def test_pop_filters_tags_and_clamps_the_invisible_time(master: Broker) -> None:
    produce(master, b"a0", tags="a")
    produce(master, b"b1", tags="b")
    produce(master, b"a2", tags="a")

    resp = await pop(master, tags=("a",), invisible_ms=10)

    assert [m.body for m in resp.messages] == [b"a0", b"a2"]
    assert resp.invisible_time_ms == MIN_INVISIBLE_MS
    [ck] = master.checkpoints()
    assert ck.offsets == (0, 2)
    assert master.core.offsets.query(GROUP, TOPIC, 0) == 3


async def test_pop_filters_by_sql92_and_moves_the_offset_past_the_rest(master: Broker) -> None:
    produce(master, b"a0", tags="a")
    produce(master, b"b1", tags="b")
    produce(master, b"a2", tags="a")
    produce(master, b"b3", tags="b")

    resp = await pop(master, sql92="TAGS = 'b' AND missing IS NULL")

    assert [m.body for m in resp.messages] == [b"b1", b"b3"]
    [ck] = master.checkpoints()
    assert ck.offsets == (1, 3)
    assert master.core.offsets.query(GROUP, TOPIC, 0) == 4
    # nothing selected: no checkpoint, the offset still moves past what was filtered out
    produce(master, b"a4", tags="a")
    assert (await pop(master, sql92="TAGS = 'b'")).messages == []
    assert len(master.checkpoints()) == 1
    assert master.core.offsets.query(GROUP, TOPIC, 0) == 5


async def test_pop_with_a_bad_sql92_is_refused_before_anything_is_popped(master: Broker) -> None:
    produce(master, b"a0")
    with pytest.raises(FilterSyntaxError, match="character 4"):
        await pop(master, sql92="a = ")
    with pytest.raises(IllegalFilterExpression, match="not both"):
        await pop(master, tags=("a",), sql92="a = 1")
    assert master.checkpoints() == []
    assert master.core.offsets.query(GROUP, TOPIC, 0) == -1


async def test_pop_on_a_plain_slave_or_isolated_broker_is_refused(
    master: Broker, slave: Broker
) -> None:
    for broker in (master, slave):
        produce(broker, b"m0")
    master.core.isolated = True

    with pytest.raises(NotMaster):
        await pop(slave)
    with pytest.raises(BrokerIsolated):
        await pop(master)

    for broker in (master, slave):
        assert broker.core.store.appended == []
        assert broker.escape.puts == []
        assert broker.core.offsets.query(GROUP, TOPIC, 0) == -1


async def test_pop_of_an_unknown_topic_is_refused(master: Broker) -> None:
    with pytest.raises(TopicNotFound):
        await pop(master, topic="NoSuchTopic")


# ---- ACK_MESSAGE ---------------------------------------------------------------------


async def test_ack_on_master_writes_an_ack_record_to_the_revive_queue(master: Broker) -> None:
    produce(master, b"m0", b"m1")
    resp = await pop(master)
    handle = resp.messages[1].properties[PROPERTY_POP_CK]

    await ack(master, handle)

    [ack_record] = master.records("ack")
    [ck] = master.checkpoints()
    assert ack_record.properties["POP_KEY"] == ck.key
    assert json.loads(ack_record.body) == {"k": ck.key, "o": 1}
    assert [a.properties[PROPERTY_TAGS] for a in master.revive_appends()] == ["ck", "ack"]
    assert master.escape.puts == []


async def test_ack_with_a_bad_or_foreign_handle_is_refused(master: Broker) -> None:
    produce(master, b"m0")
    handle = handle_of((await pop(master)).messages[0])
    foreign = ReceiptHandle(
        handle.ck_offset, handle.pop_time_ms, handle.invisible_ms, 0, True, "broker-x", 0, 0
    )

    with pytest.raises(BadRequest, match="broker-x"):
        await ack(master, foreign.encode())
    with pytest.raises(BadRequest, match="invalid receipt handle"):
        await ack(master, "not a handle")
    assert master.records("ack") == []


async def test_ack_on_a_plain_slave_is_refused(slave: Broker) -> None:
    handle = ReceiptHandle(0, T0, 30_000, 0, True, "broker-a", 0, 0)

    with pytest.raises(NotMaster):
        await ack(slave, handle.encode())
    assert slave.escape.puts == []


async def test_pop_and_ack_on_acting_slave_escape_their_records(acting: Broker) -> None:
    produce(acting, b"m0", b"m1")

    resp = await pop(acting)

    assert acting.core.store.appended == []  # a slave never appends to its own store
    [ck_put] = acting.escape.puts
    assert (ck_put.kind, ck_put.topic, ck_put.properties[PROPERTY_TAGS]) == ("pop_ck", REVIVE, "ck")
    ck = Checkpoint.from_json(ck_put.body)
    assert ck.offsets == (0, 1)
    handles = [handle_of(m) for m in resp.messages]
    assert all(h.revive_qid == ESCAPED_REVIVE_QID and not h.ck_local for h in handles)
    assert acting.core.offsets.query(GROUP, TOPIC, 0) == 2
    assert acting.core.topics.get(retry_topic(GROUP)) is None  # only a master creates it

    await ack(acting, resp.messages[0].properties[PROPERTY_POP_CK])

    ck_put, ack_put = acting.escape.puts
    assert (ack_put.kind, ack_put.topic) == ("pop_ack", REVIVE)
    assert ack_put.properties == {PROPERTY_TAGS: "ack", "POP_KEY": ck.key}
    assert json.loads(ack_put.body) == {"k": ck.key, "o": 0}
    assert acting.core.store.appended == []


async def test_an_acting_slaves_pop_is_a_step_its_returning_master_waits_for(
    acting: Broker,
) -> None:
    """Long campaign seed 1032: the acting slave popped a message, and its CK took 420 ms
    to escape; meanwhile its master returned, held it and took its consumer offsets, and
    only then did the pop move the group's offset.  The master popped the message again:
    two CKs, two revives, a message delivered again after its ack.  Now the CK and the
    offset are one step, which the hold waits for, and a pop that finds the slave held
    is refused before it writes anything."""
    produce(acting, b"m0", b"m1")
    escaped = asyncio.Event()
    put = acting.escape.put_message_to_specific_queue

    async def slow_put(*args: Any, **kwargs: Any) -> EscapeResult:
        await escaped.wait()
        return await put(*args, **kwargs)

    acting.escape.put_message_to_specific_queue = slow_put  # type: ignore[method-assign]
    steps = acting.core.special_steps
    first = asyncio.create_task(pop(acting, max_msgs=1))
    await eventually(lambda: steps.under_way == 1, 5)
    second = asyncio.create_task(pop(acting, max_msgs=1))  # waits for the queue
    await asyncio.sleep(0.05)
    acting.core.acting.hold(20)  # the returning master's contact
    quiet = asyncio.create_task(steps.idle())
    await asyncio.sleep(0.05)
    assert not quiet.done()  # the slave does not answer its master yet
    assert acting.core.offsets.query(GROUP, TOPIC, 0) < 1
    escaped.set()
    assert bodies(await first) == [b"m0"]
    await quiet
    assert acting.core.offsets.query(GROUP, TOPIC, 0) == 1  # what the master will take
    with pytest.raises(NotMaster):
        await second  # it got the queue once the slave was held
    assert len(acting.escape.puts) == 1  # no CK for the refused pop
    assert acting.core.offsets.query(GROUP, TOPIC, 0) == 1


async def test_an_ack_served_by_the_returning_master_goes_where_the_escaped_ck_is(
    tmp_path: Path,
) -> None:
    """Long campaign seed 1003 on 8fbf299: the acting slave escaped a CK to broker-b;
    its master came back within 120 ms and the consumer's ack reached the master, which
    wrote the ACK to its own revive queue.  broker-b never saw it and revived the
    message.  The handle names the group that holds the CK, and the ACK goes there."""
    acting = make_broker(tmp_path / "s", config(1), acting=True)
    produce(acting, b"m0")
    resp = await pop(acting)
    handle = resp.messages[0].properties[PROPERTY_POP_CK]
    assert handle_of(resp.messages[0]).ck_group == "broker-b"
    master = make_broker(tmp_path / "m", config(0))
    produce(master, b"m0")

    await ack(master, handle)

    [ack_put] = master.escape.puts
    # to the queue the CK is in: an ACK in another revive queue of the group is lost
    # when its revive state is read again (a restart, a failover) before the CK is done
    assert (ack_put.kind, ack_put.to_group) == ("pop_ack", "broker-b")
    assert ack_put.to_queue == handle_of(resp.messages[0]).revive_qid == ESCAPED_REVIVE_QID
    assert master.records("ack") == []  # not into its own revive queue
    # a handle from before the holder was named still works as before
    old = handle.replace("R:broker-b", "R")
    assert ReceiptHandle.decode(old).ck_group == "" and not ReceiptHandle.decode(old).ck_local


async def test_a_ck_a_master_in_the_same_process_took_names_its_group(tmp_path: Path) -> None:
    """A broker container: the acting slave's CK went to a neighbour master of
    broker-c in the same process ("local"); the handle still names broker-c, so the
    returning master's ack goes there too."""
    acting = make_broker(tmp_path / "s", config(1), acting=True)
    acting.escape.neighbour = "broker-c"
    produce(acting, b"m0")
    resp = await pop(acting)
    assert handle_of(resp.messages[0]).ck_group == "broker-c"
    master = make_broker(tmp_path / "m", config(0))
    produce(master, b"m0")
    await ack(master, resp.messages[0].properties[PROPERTY_POP_CK])
    [ack_put] = master.escape.puts
    assert ack_put.to_group == "broker-c"


# ---- CHANGE_MESSAGE_INVISIBLETIME ------------------------------------------------------


async def test_change_invisible_time_writes_a_new_ck_and_acks_the_old_one(
    master: Broker, clock: FakeClock
) -> None:
    produce(master, b"m0")
    old = (await pop(master)).messages[0].properties[PROPERTY_POP_CK]
    clock.now = T0 + 5

    new = ReceiptHandle.decode(await change_invisible(master, old, 60_000))

    assert new == ReceiptHandle(0, T0 + 5, 60_000, 0, True, "broker-a", 0, 0)
    first, second = master.checkpoints()
    assert (second.offsets, second.pop_time_ms, second.due_ms) == ((0,), T0 + 5, T0 + 60_005)
    assert second.key == new.ck_key(GROUP, TOPIC) != first.key
    [ack_record] = master.records("ack")
    assert json.loads(ack_record.body) == {"k": first.key, "o": 0}

    clock.now = T0 + 30_000  # the first CK is due, but acked
    await master.service.revive.revive_once()
    assert master.retried() == []
    clock.now = T0 + 60_005  # the new CK is due
    await master.service.revive.revive_once()
    assert [p.body for p in master.retried()] == [b"m0"]


async def test_change_invisible_time_in_the_pop_millisecond_gets_a_new_ck_key(
    master: Broker, clock: FakeClock
) -> None:
    """Regression: a new CK for one message of a batch, written in the millisecond of
    the pop, has the batch CK's queue and start offset.  Its pop time must still
    differ, or both CKs share a key, and the ack of the old CK (written by the
    change) would also mark the message done in the new one, which never revives."""
    produce(master, b"m0", b"m1")
    resp = await pop(master, invisible_ms=10_000)
    old = handle_of(resp.messages[0])

    new = ReceiptHandle.decode(
        await change_invisible(master, resp.messages[0].properties[PROPERTY_POP_CK], 20_000)
    )  # the clock has not moved

    first, second = master.checkpoints()
    assert (first.start_offset, second.start_offset) == (0, 0)
    assert second.pop_time_ms > first.pop_time_ms == old.pop_time_ms == T0
    assert second.key == new.ck_key(GROUP, TOPIC) != first.key == old.ck_key(GROUP, TOPIC)
    [ack_record] = master.records("ack")
    assert json.loads(ack_record.body) == {"k": first.key, "o": 0}

    clock.now = T0 + 60_000  # both CKs are due; neither message was acked
    await master.service.revive.revive_once()

    assert sorted(p.body for p in master.retried()) == [b"m0", b"m1"]
    assert master.service.revive.revived == 2


# ---- revive ----------------------------------------------------------------------------


async def test_revive_redelivers_an_unacked_message_once_it_is_due(
    master: Broker, clock: FakeClock
) -> None:
    produce(master, b"m0", b"m1")
    resp = await pop(master, invisible_ms=10_000)
    await ack(master, resp.messages[0].properties[PROPERTY_POP_CK])

    clock.now = T0 + 9_999
    await master.service.revive.revive_once()
    assert master.escape.puts == []

    clock.now = T0 + 10_000
    await master.service.revive.revive_once()

    [retry] = master.escape.puts
    assert (retry.kind, retry.topic, retry.body, retry.flags) == (
        "pop_retry",
        retry_topic(GROUP),
        b"m1",
        2,
    )
    original = master.core.store.messages(TOPIC, 0)[1]
    assert retry.properties[PROPERTY_RETRY_TOPIC] == TOPIC
    assert retry.properties[PROPERTY_RECONSUME_TIME] == "1"
    assert retry.properties[PROPERTY_ORIGIN_MESSAGE_ID] == make_msg_id(
        original.store_host, original.physical_offset
    )
    assert PROPERTY_POP_CK not in retry.properties
    assert master.escape.gets == [(TOPIC, "broker-a", 0, 1)]
    assert master.service.revive.revived == 1
    # CK and ACK consumed: the revive group's offset is past both
    assert master.core.offsets.query(REVIVE_GROUP, REVIVE, 0) == 2

    clock.now = T0 + 100_000
    await master.service.revive.revive_once()
    assert len(master.escape.puts) == 1


async def test_an_ack_after_the_invisible_time_is_refused_and_the_message_comes_again(
    master: Broker, clock: FakeClock
) -> None:
    """Campaign seed 3000: an ack answered ok while the revive pass was putting the
    message back; the consumer got it again after a successful ack."""
    produce(master, b"m0", b"m1")
    resp = await pop(master, invisible_ms=10_000)
    first, second = (m.properties[PROPERTY_POP_CK] for m in resp.messages)

    clock.now = T0 + 9_999
    await ack(master, first)  # one millisecond before the end: taken
    clock.now = T0 + 10_000
    with pytest.raises(ReceiptHandleExpired, match="ended 0 ms ago"):
        await ack(master, second)
    with pytest.raises(ReceiptHandleExpired):
        await change_invisible(master, second, 30_000)
    assert len(master.records("ack")) == 1
    assert len(master.checkpoints()) == 1

    await master.service.revive.revive_once()
    assert [p.body for p in master.retried()] == [b"m1"]  # the refused one, only


async def test_an_acting_slave_refuses_a_late_ack_of_the_lost_masters_ck(
    acting: Broker, clock: FakeClock
) -> None:
    handle = ReceiptHandle(0, T0, 10_000, 0, True, "broker-a", 0, 0)
    clock.now = T0 + 10_001
    with pytest.raises(ReceiptHandleExpired):
        await ack(acting, handle.encode())
    assert acting.service.revive.acks.entries == {}


async def test_revive_leaves_a_fully_acked_ck_alone(master: Broker, clock: FakeClock) -> None:
    produce(master, b"m0")
    resp = await pop(master, invisible_ms=10_000)
    await ack(master, resp.messages[0].properties[PROPERTY_POP_CK])

    clock.now = T0 + 60_000
    await master.service.revive.revive_once()

    assert master.escape.puts == []
    assert master.escape.gets == []
    assert master.core.offsets.query(REVIVE_GROUP, REVIVE, 0) == 2


async def test_failed_revive_re_puts_the_ck_with_back_off(master: Broker, clock: FakeClock) -> None:
    produce(master, b"m0", b"m1")
    await pop(master, invisible_ms=10_000)
    master.escape.get_failures_left = 1  # reading m0 back fails once

    clock.now = T0 + 10_000
    await master.service.revive.revive_once()

    assert [p.body for p in master.retried()] == [b"m1"]
    first, again = master.checkpoints()
    assert again.key == first.key
    assert (again.offsets, again.reput_times) == ((0,), 1)
    back_off_ms = CK_REWRITE_INTERVALS_S[0] * 1000
    assert again.due_ms == T0 + 10_000 + back_off_ms

    clock.now = T0 + 10_000 + back_off_ms - 1
    await master.service.revive.revive_once()
    assert len(master.retried()) == 1
    clock.now = T0 + 10_000 + back_off_ms
    await master.service.revive.revive_once()
    assert [p.body for p in master.retried()] == [b"m1", b"m0"]
    assert master.retried()[1].properties[PROPERTY_RECONSUME_TIME] == "1"


async def test_acting_slave_revives_the_lost_masters_ck_minus_local_acks(
    acting: Broker, clock: FakeClock
) -> None:
    """A CK the master wrote before it died sits in the slave's replicated revive
    queue; an ack of such a message (``ck_local``) is applied in memory."""
    produce(acting, b"m0", b"m1")
    ck = Checkpoint("broker-a", GROUP, TOPIC, 0, 0, (0, 1), T0, 10_000, T0 + 10_000)
    acting.core.store.put(REVIVE, 0, ck.to_json(), {PROPERTY_TAGS: "ck", "POP_KEY": ck.key})
    handle = ReceiptHandle(0, T0, 10_000, 0, True, "broker-a", 0, 0)

    await ack(acting, handle.encode())
    assert acting.escape.puts == []  # nothing escaped for this ack
    assert acting.core.store.appended == []

    clock.now = T0 + 10_000
    await acting.service.revive.revive_once()

    [retry] = acting.escape.puts
    assert (retry.kind, retry.topic, retry.body) == ("pop_retry", retry_topic(GROUP), b"m1")
    assert acting.core.offsets.query(REVIVE_GROUP, REVIVE, 0) == 1


async def test_a_masters_revive_carries_its_ack_so_a_slave_that_acts_does_not_revive_again(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Long campaign, seed 1020: a master cut off mid-revive (a one-way partition: its
    slaves got its writes, it got no acknowledgement) stored the retry message; the
    slave that acted read the CK without any sign of that revive and revived the
    message a second time.  The revive's ACK now goes right behind the retry message."""
    master = make_broker(tmp_path / "m", config(0), clock=clock)
    slave = make_broker(tmp_path / "s", config(1), acting=True, clock=clock)
    for b in (master, slave):
        produce(b, b"m0")
    await pop(master, invisible_ms=10_000)
    await master.service.revive.revive_once()
    clock.now = T0 + 10_000
    await master.service.revive.revive_once()
    [retry] = master.escape.puts
    assert retry.then is not None
    topic, qid, body, props = retry.then
    assert topic == REVIVE and props[PROPERTY_TAGS] == "ack"
    master.core.store.put(topic, qid, body, dict(props))  # as WritePath.put appends it
    replicate_revive_queue(master, slave)

    await slave.service.revive.revive_once()
    assert slave.escape.puts == []


# ---- the POP ack table (an acting slave's acks reach the returning master) ----------


def replicate_revive_queue(master: Broker, slave: Broker) -> None:
    """The slave's copy of the master's revive queue 0, as replication stores it."""
    have = len(slave.core.store.messages(REVIVE, 0))
    for m in master.core.store.messages(REVIVE, 0)[have:]:
        slave.core.store.put(REVIVE, 0, m.body, dict(m.properties))


async def pop_on_master_then_ack_on_acting(
    tmp_path: Path, clock: FakeClock, *, interval_ms: int = 20
) -> tuple[Broker, Broker, list[broker_pb2.Message]]:
    """The master pops m0..m2 (one CK in its revive queue, replicated) and dies; the
    consumer acks m0 and m1 on the acting slave, which read the CK already."""
    master = make_broker(tmp_path / "m", config(0, pop_revive_interval_ms=interval_ms), clock=clock)
    acting = make_broker(
        tmp_path / "s", config(1, pop_revive_interval_ms=interval_ms), acting=True, clock=clock
    )
    for b in (master, acting):
        produce(b, b"m0", b"m1", b"m2")
    resp = await pop(master, invisible_ms=10_000)
    assert bodies(resp) == [b"m0", b"m1", b"m2"]
    await master.service.revive.revive_once()  # the master's revive loop knows the CK
    replicate_revive_queue(master, acting)

    await acting.service.revive.revive_once()
    for m in resp.messages[:2]:
        await ack(acting, m.properties[PROPERTY_POP_CK])
    assert acting.escape.puts == []  # no record escaped for these acks
    return master, acting, list(resp.messages)


async def run_for(broker: Broker, predicate: Any, *, timeout: float = 5) -> None:
    """The service's revive loop, until ``predicate()`` holds and two passes later."""
    task = asyncio.create_task(broker.service.run())
    try:
        await eventually(predicate, timeout=timeout)
        await asyncio.sleep(0.1)  # more passes: nothing else may be revived
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_returning_master_adopts_the_acting_slaves_acks_and_never_revives_them(
    tmp_path: Path, clock: FakeClock
) -> None:
    master, acting, _ = await pop_on_master_then_ack_on_acting(tmp_path, clock)

    # pre-online of the returning master: the ack table over the wire, then merged
    [sync] = [t for t in master.service.tables() if t.name == "pop acks"]
    table = await call_handler(
        acting.core.dispatcher,
        RequestCode.GET_POP_ACK_TABLE,
        common_pb2.Empty(),
        broker_pb2.PopAckTable,
    )
    assert sync.adopt_if_newer(PopAckSnapshot.from_pb(table))
    assert (master.core.store_dir / "pop_acks.json").exists()

    clock.now = T0 + 10_000
    master.service.set_active(True)
    await run_for(master, lambda: master.retried() != [])
    assert [p.body for p in master.retried()] == [b"m2"]

    clock.now = T0 + 100_000
    await master.service.revive.revive_once()
    assert [p.body for p in master.retried()] == [b"m2"]


async def test_acting_slaves_acks_survive_its_restart(tmp_path: Path, clock: FakeClock) -> None:
    _, acting, _ = await pop_on_master_then_ack_on_acting(tmp_path, clock)
    acting.service.set_active(True)
    path = acting.core.store_dir / "pop_acks.json"
    await run_for(acting, path.exists)  # the loop writes the table

    restarted = make_broker(tmp_path / "s", config(1), acting=True, clock=clock)
    for m in acting.core.store.messages(TOPIC, 0):
        restarted.core.store.put(TOPIC, 0, m.body, dict(m.properties), flags=m.flags)
    replicate_revive_queue(acting, restarted)
    clock.now = T0 + 10_000
    await restarted.service.revive.revive_once()
    assert [p.body for p in restarted.retried()] == [b"m2"]


async def test_ack_table_entries_go_once_the_revive_offset_passed_their_ck(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Bound: the CK finished (acked, the rest revived), the revive queue's offset
    moves past it and its entry is dropped; the offset travels in the table."""
    _, acting, _ = await pop_on_master_then_ack_on_acting(tmp_path, clock)
    assert list(acting.service.revive.acks.entries) != []

    clock.now = T0 + 10_000
    await acting.service.revive.revive_once()
    assert [p.body for p in acting.retried()] == [b"m2"]
    assert acting.service.revive.acks.entries == {}
    assert acting.service.revive.acks.to_pb().revive_offsets == {0: 1}
    version = acting.service.revive.acks.data_version.copy()

    clock.now = T0 + 100_000
    await acting.service.revive.revive_once()
    assert [p.body for p in acting.retried()] == [b"m2"]
    assert acting.service.revive.acks.data_version.compare(version) == 0


async def test_a_returning_master_starts_reading_past_what_the_table_finished(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The consumer offsets can be synced before the slave finished a CK and dropped
    its entry: the table's own revive offset keeps the master from reading it."""
    master, acting, _ = await pop_on_master_then_ack_on_acting(tmp_path, clock)
    clock.now = T0 + 10_000
    await acting.service.revive.revive_once()  # m2 revived, the CK finished and dropped
    table = acting.service.revive.acks.to_pb()
    assert list(table.entries) == []

    [sync] = [t for t in master.service.tables() if t.name == "pop acks"]
    sync.adopt_if_newer(PopAckSnapshot.from_pb(table))  # master's REVIVE_GROUP offset: 0
    master.service.revive.restart_state()
    await master.service.revive.revive_once()
    assert master.retried() == []


async def test_a_plain_slave_takes_the_masters_ack_table(tmp_path: Path, clock: FakeClock) -> None:
    master, acting, _ = await pop_on_master_then_ack_on_acting(tmp_path, clock)
    [sync] = [t for t in master.service.tables() if t.name == "pop acks"]
    snapshot = PopAckSnapshot.from_pb(acting.service.revive.acks.to_pb())
    sync.adopt_if_newer(snapshot)
    slave = make_broker(tmp_path / "p", config(2), clock=clock)
    [slave_sync] = [t for t in slave.service.tables() if t.name == "pop acks"]
    assert not slave_sync.busy()
    slave_sync.assign(PopAckSnapshot.from_pb(master.service.revive.acks.to_pb()))
    assert slave.service.revive.acks.entries == master.service.revive.acks.entries
    assert (
        slave.service.revive.acks.data_version.compare(master.service.revive.acks.data_version) == 0
    )
    master.service.set_active(True)
    assert sync.busy()  # the master's table is its own


async def test_a_cut_revive_queue_is_read_from_its_end_not_from_the_tables_offset(
    master: Broker, clock: FakeClock
) -> None:
    """A table finished further than the revive queue now reaches (its log was cut
    back): new checkpoints are still read and revived."""
    master.service.revive.acks.finished(0, 50)
    master.service.set_active(True)
    produce(master, b"m0")
    await pop(master, invisible_ms=10_000)
    clock.now = T0 + 10_000
    await master.service.revive.revive_once()
    assert [p.body for p in master.retried()] == [b"m0"]


def test_the_ack_table_stays_bounded_and_round_trips_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pop_acks_module, "MAX_ENTRIES", 2)
    table = PopAckTable(tmp_path / "pop_acks.json")
    hostile = broker_pb2.PopAckTable(
        entries=[
            broker_pb2.PopAckEntry(ck_key=f"k{i}", revive_offset=-1, offsets=[i]) for i in range(5)
        ],
        revive_offsets={0: 3},
    )
    assert table.merge(PopAckSnapshot.from_pb(hostile))
    assert list(table.entries) == ["k3", "k4"]
    table.record("k5", {7}, (0, 9))
    assert list(table.entries) == ["k4", "k5"]
    table.finished(0, 10)  # k5's checkpoint passed; k4's place is not known
    assert list(table.entries) == ["k4"]
    table.persist()

    again = PopAckTable(tmp_path / "pop_acks.json")
    again.load()
    assert again.entries == table.entries
    assert again.revive_offsets == {0: 10}
    assert again.data_version.compare(table.data_version) == 0


async def test_run_revives_while_active(tmp_path: Path, clock: FakeClock) -> None:
    broker = make_broker(tmp_path, config(0, pop_revive_interval_ms=20), clock=clock)
    produce(broker, b"m0")
    await pop(broker, invisible_ms=10_000)
    clock.now = T0 + 10_000
    broker.service.set_active(True)

    task = asyncio.create_task(broker.service.run())
    try:
        await eventually(lambda: [p.body for p in broker.retried()] == [b"m0"], timeout=5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert broker.service.revive.revived == 1


async def test_run_does_not_revive_while_inactive(tmp_path: Path, clock: FakeClock) -> None:
    broker = make_broker(tmp_path, config(0, pop_revive_interval_ms=20), clock=clock)
    produce(broker, b"m0")
    await pop(broker, invisible_ms=10_000)
    clock.now = T0 + 10_000
    broker.service.set_active(False)

    task = asyncio.create_task(broker.service.run())
    try:
        await asyncio.sleep(0.2)  # several passes of the loop: none may revive
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert broker.escape.puts == []


# ---- orderly POP (order=true) -----------------------------------------------------------


def bodies(resp: broker_pb2.PopMessageResponse) -> list[bytes]:
    return [m.body for m in resp.messages]


async def test_orderly_pop_holds_the_queue_until_the_batch_is_acked(master: Broker) -> None:
    produce(master, b"m0", b"m1", b"m2")
    first = await pop(master, max_msgs=2, order=True)
    assert bodies(first) == [b"m0", b"m1"]
    assert bodies(await pop(master, order=True)) == []  # the queue is held
    await ack(master, first.messages[0].properties[PROPERTY_POP_CK])
    assert bodies(await pop(master, order=True)) == []  # half the batch is not enough
    await ack(master, first.messages[1].properties[PROPERTY_POP_CK])
    assert master.core.offsets.query(GROUP, TOPIC, 0) == 2
    assert bodies(await pop(master, order=True)) == [b"m2"]
    assert master.checkpoints() == []  # no CK: the lock is the broker's own state


async def test_an_expired_orderly_batch_comes_again_before_anything_later(
    master: Broker, clock: FakeClock
) -> None:
    produce(master, b"m0", b"m1", b"m2")
    first = await pop(master, max_msgs=2, invisible_ms=5000, order=True)
    await ack(master, first.messages[0].properties[PROPERTY_POP_CK])
    clock.now += 5001
    again = await pop(master, max_msgs=2, invisible_ms=5000, order=True)
    # m0 was acked: not handed out twice; m1 comes again (one more attempt), m2 not yet
    assert bodies(again) == [b"m1"]
    assert again.messages[0].reconsume_times == 1
    # the first pop's handle is stale: acking it with it changes nothing
    await ack(master, first.messages[1].properties[PROPERTY_POP_CK])
    assert bodies(await pop(master, order=True)) == []
    await ack(master, again.messages[0].properties[PROPERTY_POP_CK])
    assert bodies(await pop(master, order=True)) == [b"m2"]


async def test_change_invisible_keeps_an_orderly_batch_locked(
    master: Broker, clock: FakeClock
) -> None:
    produce(master, b"m0", b"m1")
    first = await pop(master, max_msgs=1, invisible_ms=2000, order=True)
    handle = first.messages[0].properties[PROPERTY_POP_CK]
    assert await change_invisible(master, handle, 10_000) == handle
    clock.now += 5000
    assert bodies(await pop(master, order=True)) == []
    await ack(master, handle)
    assert bodies(await pop(master, order=True)) == [b"m1"]


async def test_a_groups_consume_orderly_setting_makes_its_pop_orderly(
    master: Broker, tmp_path: Path
) -> None:
    await call_handler(
        master.core.dispatcher,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        broker_pb2.UpdateSubscriptionGroupRequest(
            config=broker_pb2.SubscriptionGroupConfig(group_name=GROUP, consume_orderly=True)
        ),
        common_pb2.Empty,
    )
    produce(master, b"m0", b"m1")
    assert bodies(await pop(master, max_msgs=1)) == [b"m0"]  # no order flag needed
    assert bodies(await pop(master)) == []
    table = await call_handler(
        master.core.dispatcher,
        RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
        common_pb2.Empty(),
        broker_pb2.SubscriptionGroupTable,
    )
    assert [(g.group_name, g.consume_orderly) for g in table.groups] == [(GROUP, True)]
    restarted = make_broker(tmp_path, config(0))
    assert restarted.service.subscriptions.orderly(GROUP)


@pytest.mark.parametrize("name", ["", "bad/name", "x" * 300, "CID_RMQ_SYS_X"])
async def test_a_bad_subscription_group_is_refused(master: Broker, name: str) -> None:
    with pytest.raises(BadRequest):
        await call_handler(
            master.core.dispatcher,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            broker_pb2.UpdateSubscriptionGroupRequest(
                config=broker_pb2.SubscriptionGroupConfig(group_name=name, consume_orderly=True)
            ),
            common_pb2.Empty,
        )
    assert master.service.subscriptions.groups == {}


async def test_a_broker_taking_over_waits_one_invisible_time_for_orderly_queues(
    acting: Broker, clock: FakeClock
) -> None:
    """The lost master's batch may still be in a consumer's hands: the acting slave
    gives the queue to nobody for one invisible time, then the same messages again."""
    produce(acting, b"m0", b"m1")
    acting.service.set_active(True)
    assert bodies(await pop(acting, invisible_ms=5000, order=True)) == []
    clock.now += 5001
    got = await pop(acting, invisible_ms=5000, order=True)
    assert bodies(got) == [b"m0", b"m1"]
    for m in got.messages:
        await ack(acting, m.properties[PROPERTY_POP_CK])
    assert acting.core.offsets.query(GROUP, TOPIC, 0) == 2
    assert acting.core.store.appended == []  # an acting slave never appends


async def test_a_starting_master_hands_out_orderly_batches_at_once(master: Broker) -> None:
    produce(master, b"m0")
    master.service.set_active(True)
    assert bodies(await pop(master, order=True)) == [b"m0"]


async def test_controller_mode_answers_an_ack_only_once_the_sync_state_set_holds_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    """``controller-isolate``, seed 3308: the master cut off with an etcd member kept
    its lease for a moment and the consumers still reached it; the acks it answered ok
    reached no member and were cut away on its return, and the member elected served
    those messages again."""
    cfg = config(0, total_replicas=3, in_sync_replicas=2)
    broker = make_broker(tmp_path, cfg, clock=clock)
    replicas = FakeReplicas(2)
    broker.core.ha_master = replicas
    broker.core.sync = object()  # controller mode
    produce(broker, b"one", b"two")
    got = await pop(broker)
    first, second = (m.properties[PROPERTY_POP_CK] for m in got.messages)
    await ack(broker, first)  # confirmed
    replicas.confirmed = False  # cut off: no member confirms
    with pytest.raises(SlaveAckTimeout):
        await ack(broker, second)
    broker.core.sync = None  # RIP-32 acting: as before, answered once stored
    await ack(broker, second)
