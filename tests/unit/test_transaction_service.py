"""TransactionService through its handlers and its check loop, on small fakes of
its ports.

The broker is a ``FakeCore`` (``tests/fakes.py``: an in-memory store recording what is
appended, the real plain ActingState / TopicConfigManager / ConsumerOffsetManager)
under the real ``WritePath``, and a ``RecordingEscape`` that records what the service
hands on.
Requests go through the handlers the service registered on its dispatcher; a
``FakePool`` routes RPCs to another fake broker's dispatcher in the same process.
No BrokerService, no MessageStore, no sockets: a producer connection is a fake
with what ``RpcConnection.oneway`` offers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
from fakes import (
    FakeConn,
    FakeCore,
    RecordingEscape,
    call_handler,
    request_context,
)
from google.protobuf.message import Message

from broker_agent.special import transaction as transaction_module
from broker_agent.special.escape import EscapeResult
from broker_agent.special.transaction import (
    HalfProgress,
    TransactionService,
    half_to_prepared,
    half_to_real,
    store_target,
)
from broker_agent.write_path import WritePath
from ha_controller.config import BrokerConfig
from ha_controller.dataversion import DataVersion
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    BadRequest,
    BrokerIsolated,
    ConnectionClosed,
    EscapeFailed,
    NotMaster,
    RequestTimeout,
)
from ha_controller.protocol.properties import (
    HALF_TOPIC,
    OP_TOPIC,
    PROPERTY_OP_RESULT,
    PROPERTY_OP_TRANSACTION_ID,
    PROPERTY_PREPARED_QUEUE_OFFSET,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRAN_MSG,
    PROPERTY_UNIQ_KEY,
    now_ms,
)
from ha_controller.protocol.record import StoredMessage
from ha_controller.routing import Perm, TopicConfig
from ha_controller.rpc import ConnectionPool, Dispatcher
from ha_controller.testing import eventually

M = TypeVar("M", bound=Message)

TOPIC = "T"
QID = 2
GROUP = "PG_order"
TID = "TX-1"
OLD_MS = 1_000  # born long before any transaction timeout


# ---- fakes: pool, escape (the rest: tests/fakes.py) ---------------------------------


class FakePool:
    """``ConnectionPool.call_pb`` to the brokers of this process, by address."""

    def __init__(self) -> None:
        self.peers: dict[str, Dispatcher] = {}
        self.calls: list[tuple[str, int]] = []

    async def call_pb(
        self,
        addr: str,
        method: int,
        request: Message,
        response_type: type[M],
        timeout_ms: int | None = None,
    ) -> M:
        self.calls.append((addr, method))
        if addr not in self.peers:
            raise ConnectionClosed(f"nothing listens at {addr}")
        return await call_handler(self.peers[addr], method, request, response_type)


class GatedEscape(RecordingEscape):
    """A ``RecordingEscape`` whose puts of one ``kind`` wait at a gate: ``entered`` is set
    once such a put is pending, ``release()`` lets it go on (or fail with EscapeFailed,
    with ``fail``).  Puts of other kinds, and those after ``gate_kind = None``, pass."""

    def __init__(self, gate_kind: str, *, fail: bool = False) -> None:
        super().__init__()
        self.gate_kind: str | None = gate_kind
        self.fail = fail
        self.entered = asyncio.Event()
        self._gate = asyncio.Event()

    def release(self) -> None:
        self._gate.set()

    async def put_message(
        self,
        topic: str,
        body: bytes,
        properties: dict[str, str],
        *,
        kind: str,
        queue_id: int | None = None,
        flags: int = 0,
        born_ts_ms: int | None = None,
        progress: Mapping[str, str] | None = None,
        escape_id: str = "",
    ) -> EscapeResult:
        if kind == self.gate_kind:
            self.entered.set()
            await self._gate.wait()
            if self.fail:
                raise EscapeFailed("the master went away")
        return await super().put_message(
            topic,
            body,
            properties,
            kind=kind,
            queue_id=queue_id,
            flags=flags,
            born_ts_ms=born_ts_ms,
            progress=progress,
            escape_id=escape_id,
        )


@dataclass
class Broker:
    core: FakeCore
    write_path: WritePath
    escape: RecordingEscape
    pool: FakePool
    service: TransactionService

    @property
    def ops(self) -> list[StoredMessage]:
        return [a for a in self.core.store.appended if a.topic == OP_TOPIC]

    @property
    def committed(self) -> list[StoredMessage]:
        return [a for a in self.core.store.appended if a.topic != OP_TOPIC]

    def stored(self, appended: StoredMessage) -> StoredMessage:
        msg = self.core.store.get_message_at(
            appended.topic, appended.queue_id, appended.queue_offset
        )
        assert msg is not None
        return msg


def config(broker_id: int = 0, broker_name: str = "broker-a", **kw: Any) -> BrokerConfig:
    args: dict[str, Any] = {
        "broker_name": broker_name,
        "broker_id": broker_id,
        "namesrv_addrs": ("127.0.0.1:9",),
        "total_replicas": 1,
        "in_sync_replicas": 1,
        "transaction_timeout_ms": 6000,
        "transaction_check_max": 3,
        "escape_max_attempts": 3,
    }
    args.update(kw)
    return BrokerConfig(**args)


def make_broker(
    store_dir: Path,
    cfg: BrokerConfig,
    *,
    acting: bool = False,
    escape: RecordingEscape | None = None,
) -> Broker:
    addr = f"10.0.0.{cfg.broker_id + 1}:10911"
    core = FakeCore(cfg, addr=addr, store_dir=store_dir)
    core.topics.upsert(TopicConfig(TOPIC, 4, 4, Perm.READ | Perm.WRITE))
    if acting:
        core.acting.on_min_broker_change(cfg.broker_id, addr)
        assert core.acting.acting
    pool = FakePool()
    core.pool = cast(ConnectionPool, pool)
    write_path = WritePath(core)
    escape = RecordingEscape() if escape is None else escape
    service = TransactionService(core, write_path, escape)
    return Broker(core, write_path, escape, pool, service)


@pytest.fixture
def master(tmp_path: Path) -> Broker:
    return make_broker(tmp_path / "master", config(0))


@pytest.fixture
def slave(tmp_path: Path) -> Broker:
    return make_broker(tmp_path / "slave", config(1))


@pytest.fixture
def acting(tmp_path: Path) -> Broker:
    return make_broker(tmp_path / "acting", config(1), acting=True)


def send_half(
    broker: Broker, *, tid: str = TID, born_ts_ms: int = OLD_MS, body: bytes = b"order-1"
) -> int:
    """A prepared send as SEND_MESSAGE stores it (on a slave: as replicated)."""
    props = {PROPERTY_TRAN_MSG: "true", PROPERTY_UNIQ_KEY: tid, PROPERTY_PRODUCER_GROUP: GROUP}
    topic, qid = store_target(TOPIC, QID, props)
    put = broker.core.store.put(
        topic, qid, body, props, flags=4, born_ts_ms=born_ts_ms, store_host=broker.core.addr
    )
    return put.queue_offset


def write_op(broker: Broker, half_offset: int, tid: str = TID) -> None:
    """An op record the (lost) master wrote, as replicated to this broker."""
    props = {PROPERTY_TAGS: "d", PROPERTY_OP_RESULT: "commit", PROPERTY_OP_TRANSACTION_ID: tid}
    broker.core.store.put(OP_TOPIC, 0, str(half_offset).encode(), props)


async def end(broker: Broker, offset: int, *, commit: bool = True, tid: str = TID) -> None:
    request = broker_pb2.EndTransactionRequest(
        producer_group=GROUP,
        topic=TOPIC,
        transaction_id=tid,
        commit=commit,
        broker_name=broker.core.cfg.broker_name,
        half_queue_offset=offset,
    )
    await call_handler(
        broker.core.dispatcher, RequestCode.END_TRANSACTION, request, common_pb2.Empty
    )


async def offsets_of(broker: Broker) -> broker_pb2.TransactionOffsets:
    return await call_handler(
        broker.core.dispatcher,
        RequestCode.GET_TRANSACTION_OFFSETS,
        common_pb2.Empty(),
        broker_pb2.TransactionOffsets,
    )


# ---- the send side -------------------------------------------------------------------


def test_half_send_goes_to_the_half_queue_with_its_real_target() -> None:
    props = {PROPERTY_TRAN_MSG: "true", PROPERTY_UNIQ_KEY: TID}
    assert store_target(TOPIC, 3, props) == (HALF_TOPIC, 0)
    assert props[PROPERTY_REAL_TOPIC] == TOPIC
    assert props[PROPERTY_REAL_QID] == "3"
    plain = {PROPERTY_UNIQ_KEY: TID}
    assert store_target(TOPIC, 3, plain) == (TOPIC, 3)
    assert plain == {PROPERTY_UNIQ_KEY: TID}


def test_service_registers_its_handlers_and_special_hook(master: Broker) -> None:
    assert master.core.dispatcher.get(RequestCode.END_TRANSACTION) is not None
    assert master.core.dispatcher.get(RequestCode.GET_TRANSACTION_OFFSETS) is not None
    assert master.core.special_hooks == [master.service.set_active]


# ---- END_TRANSACTION -----------------------------------------------------------------


async def test_commit_on_master_appends_real_message_and_op_and_resolves(master: Broker) -> None:
    half = send_half(master)
    version_before = master.service.progress.version.copy()

    await end(master, half, commit=True)

    real, op = master.core.store.appended
    assert (real.topic, real.queue_id, real.store_host) == (TOPIC, QID, master.core.addr)
    assert real.properties[PROPERTY_UNIQ_KEY] == TID
    assert real.properties[PROPERTY_PREPARED_QUEUE_OFFSET] == str(half)
    assert PROPERTY_TRAN_MSG not in real.properties
    assert PROPERTY_REAL_TOPIC not in real.properties
    assert PROPERTY_REAL_QID not in real.properties
    stored = master.stored(real)
    assert (stored.body, stored.flags, stored.born_ts_ms) == (b"order-1", 4, OLD_MS)
    assert (op.topic, op.queue_id) == (OP_TOPIC, 0)
    assert master.stored(op).body == str(half).encode()
    assert op.properties == {
        PROPERTY_TAGS: "d",
        PROPERTY_OP_RESULT: "commit",
        PROPERTY_OP_TRANSACTION_ID: TID,
    }
    # the committed message is readable from its real queue
    assert [m.body for m in master.core.store.messages(TOPIC, QID)] == [b"order-1"]
    progress = master.service.progress
    assert progress.half_offset == half + 1
    assert progress.version.compare(version_before) > 0
    served = await offsets_of(master)
    assert served.half_offset == half + 1


async def test_rollback_on_master_records_only_the_op(master: Broker) -> None:
    half = send_half(master)

    await end(master, half, commit=False)

    assert master.committed == []
    assert master.core.store.messages(TOPIC, QID) == []
    [op] = master.ops
    assert master.stored(op).body == str(half).encode()
    assert op.properties[PROPERTY_OP_RESULT] == "rollback"
    assert master.service.progress.is_resolved(half, TID)
    assert master.service.progress.half_offset == half + 1


async def test_duplicate_end_transaction_is_ignored(master: Broker) -> None:
    half = send_half(master)
    await end(master, half, commit=True)
    appends = list(master.core.store.appended)

    await end(master, half, commit=True)
    await end(master, half, commit=False)

    assert master.core.store.appended == appends
    assert len(master.core.store.messages(TOPIC, QID)) == 1


async def test_a_retried_half_of_a_committed_transaction_is_not_committed_twice(
    master: Broker,
) -> None:
    first = send_half(master)
    second = send_half(master)  # the producer retried the prepared send
    await end(master, first, commit=True)

    await end(master, second, commit=True)

    assert len(master.committed) == 1
    assert len(master.ops) == 1


async def test_end_transaction_for_a_missing_or_foreign_half_is_refused(master: Broker) -> None:
    half = send_half(master)

    with pytest.raises(BadRequest, match="no half message"):
        await end(master, half + 5)
    with pytest.raises(BadRequest, match="not TX-other"):
        await end(master, half, tid="TX-other")

    assert master.core.store.appended == []
    assert not master.service.progress.is_resolved(half, TID)


async def test_end_transaction_on_a_plain_slave_is_refused(slave: Broker) -> None:
    half = send_half(slave)

    with pytest.raises(NotMaster):
        await end(slave, half, commit=True)

    assert slave.escape.puts == []
    assert not slave.service.progress.is_resolved(half, TID)


async def test_end_transaction_on_an_isolated_broker_is_refused(master: Broker) -> None:
    half = send_half(master)
    master.core.isolated = True

    with pytest.raises(BrokerIsolated):
        await end(master, half, commit=True)

    assert master.core.store.appended == []
    assert master.service.progress.half_offset == 0


async def test_commit_on_acting_slave_goes_through_the_escape_bridge(acting: Broker) -> None:
    half = send_half(acting)

    await end(acting, half, commit=True)

    assert acting.core.store.appended == []  # a slave never appends to its own store
    [put] = acting.escape.puts
    assert (put.kind, put.topic, put.body) == ("transaction", TOPIC, b"order-1")
    assert put.properties[PROPERTY_UNIQ_KEY] == TID
    assert put.properties[PROPERTY_PREPARED_QUEUE_OFFSET] == str(half)
    assert PROPERTY_TRAN_MSG not in put.properties
    assert (put.flags, put.born_ts_ms) == (4, OLD_MS)
    assert acting.service.progress.half_offset == half + 1

    await end(acting, half, commit=True)
    assert len(acting.escape.puts) == 1


async def test_rollback_on_acting_slave_only_moves_the_progress(acting: Broker) -> None:
    half = send_half(acting)

    await end(acting, half, commit=False)

    assert acting.escape.puts == []
    assert acting.core.store.appended == []
    assert acting.service.progress.half_offset == half + 1


# ---- the check loop: acting slave --------------------------------------------------


async def test_check_on_acting_slave_escapes_unresolved_halves(acting: Broker) -> None:
    resolved = send_half(acting, tid="TX-0")
    write_op(acting, resolved, "TX-0")  # the lost master resolved this one
    pending = send_half(acting, tid="TX-1", body=b"order-2")

    await acting.service.check_once()

    [put] = acting.escape.puts
    assert (put.kind, put.topic, put.body) == ("transaction_half", TOPIC, b"order-2")
    # a prepared message again: the master that receives it checks the producer
    assert put.properties[PROPERTY_TRAN_MSG] == "true"
    assert put.properties[PROPERTY_UNIQ_KEY] == "TX-1"
    assert PROPERTY_REAL_TOPIC not in put.properties
    progress = acting.service.progress
    assert progress.is_resolved(pending)
    assert (progress.half_offset, progress.op_offset) == (2, 1)
    assert acting.service.escaped == 1

    await acting.service.check_once()
    assert len(acting.escape.puts) == 1


async def test_a_slave_whose_master_returns_mid_pass_escapes_no_more_halves(
    acting: Broker,
) -> None:
    """What is left of the pass belongs to the returning master, which resolves those
    halves itself (campaign seed 5000: an escape after the return was committed twice)."""
    halves = [send_half(acting, tid=f"TX-{i}") for i in range(3)]

    def master_back() -> None:
        acting.core.acting.on_min_broker_change(0, "127.0.0.1:1")

    acting.escape.after_put = master_back
    await acting.service.check_once()

    assert len(acting.escape.puts) == 1
    progress = acting.service.progress
    assert progress.is_resolved(halves[0])
    assert not any(progress.is_resolved(h) for h in halves[1:])


async def test_end_transaction_refuses_as_retriable_when_the_escape_takes_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transaction_module, "ESCAPE_WAIT_S", 0.05)
    escape = GatedEscape("transaction_half")
    acting = make_broker(tmp_path, config(1), acting=True, escape=escape)
    half = send_half(acting)
    escaping = asyncio.create_task(acting.service.check_once())
    await asyncio.wait_for(escape.entered.wait(), 5)
    with pytest.raises(RequestTimeout, match="being handed on"):
        await end(acting, half, commit=True)
    escape.release()
    await escaping
    assert acting.service.progress.is_resolved(half)


async def test_failed_escape_is_retried_then_skipped(tmp_path: Path) -> None:
    acting = make_broker(tmp_path, config(1, escape_max_attempts=2), acting=True)
    half = send_half(acting)
    acting.escape.failures_left = 1

    await acting.service.check_once()
    assert acting.escape.puts == []
    assert not acting.service.progress.is_resolved(half)

    await acting.service.check_once()
    assert len(acting.escape.puts) == 1
    assert acting.service.progress.half_offset == half + 1

    skipped = send_half(acting, tid="TX-2")
    acting.escape.failures_left = 2
    await acting.service.check_once()
    await acting.service.check_once()
    assert len(acting.escape.puts) == 1
    assert acting.service.progress.is_resolved(skipped)


async def test_commit_while_the_half_is_being_escaped_follows_the_half(
    tmp_path: Path,
) -> None:
    """The check pass of an acting slave is handing a half to another master when the
    producer's commit of it arrives.  The commit must not escape the real message too
    (the master that receives the half would check the producer and commit it a second
    time), nor be dropped as a duplicate (that master's checks may never commit it: a
    committed transaction lost, seen in
    test_transaction_acting.py::test_end_transaction_on_acting_slave under load).  It
    waits for the escape and is forwarded to where the half went."""
    escape = GatedEscape("transaction_half")
    acting = make_broker(tmp_path / "a1", config(1), acting=True, escape=escape)
    other = make_broker(tmp_path / "b0", config(0, broker_name="broker-b"))
    # the target stores the escaped half as its own
    escape.stored_at = lambda put: send_half(
        other, tid=put.properties[PROPERTY_UNIQ_KEY], body=put.body
    )
    escape.routes.addrs["broker-b"] = {0: other.core.addr}
    acting.pool.peers[other.core.addr] = other.core.dispatcher
    half = send_half(acting)
    check = asyncio.create_task(acting.service.check_once())
    try:
        await asyncio.wait_for(escape.entered.wait(), 5)  # the half's escape is pending
        ending = asyncio.create_task(end(acting, half, commit=True))
        await asyncio.sleep(0.05)
        assert not ending.done()  # it waits for the escape
    finally:
        escape.release()
        await check
    await ending

    assert [p.kind for p in escape.puts] == ["transaction_half"]
    assert acting.core.store.appended == []
    assert acting.service.progress.is_resolved(half)
    assert acting.service.escaped == 1
    assert acting.pool.calls == [(other.core.addr, RequestCode.END_TRANSACTION)]
    [real] = other.core.store.messages(TOPIC, QID)
    assert real.properties[PROPERTY_UNIQ_KEY] == TID


@pytest.mark.parametrize("retry", ["end_transaction", "check"])
async def test_failed_commit_escape_leaves_the_half_unresolved_for_a_retry(
    tmp_path: Path, retry: str
) -> None:
    """Regression: an acting slave's check pass runs while a commit's escape is in
    flight, and that escape then fails.  The half must stay unresolved, so the
    producer's retried END_TRANSACTION, or the next check pass, still resolves it
    (the pass must neither escape it meanwhile nor count it resolved)."""
    escape = GatedEscape("transaction", fail=True)
    acting = make_broker(tmp_path, config(1), acting=True, escape=escape)
    half = send_half(acting)
    commit = asyncio.create_task(end(acting, half, commit=True))
    try:
        await asyncio.wait_for(escape.entered.wait(), 5)  # the commit's escape is pending

        await acting.service.check_once()

        assert escape.puts == []  # not handed on while the commit is in flight
    finally:
        escape.release()
    with pytest.raises(EscapeFailed):
        await commit  # the producer sees its END_TRANSACTION fail

    assert escape.puts == []
    assert not acting.service.progress.is_resolved(half)
    assert acting.service.progress.half_offset == half

    escape.gate_kind = None  # the masters are reachable again
    if retry == "end_transaction":
        await end(acting, half, commit=True)
        expected = "transaction"
    else:
        await acting.service.check_once()
        expected = "transaction_half"

    [put] = escape.puts
    assert (put.kind, put.body, put.properties[PROPERTY_UNIQ_KEY]) == (expected, b"order-1", TID)
    assert acting.service.progress.is_resolved(half)
    assert acting.service.progress.half_offset == half + 1


async def test_escape_to_local_master_then_end_transaction_is_forwarded(tmp_path: Path) -> None:
    """A half escaped to a master of this process; the producer's decision, sent to
    the acting slave that escaped it, is forwarded where the half lives now."""
    acting = make_broker(tmp_path / "a1", config(1), acting=True)
    other = make_broker(tmp_path / "b0", config(0, broker_name="broker-b"))
    acting.escape.local = (other.core, other.write_path)
    acting.escape.routes.addrs["broker-b"] = {0: other.core.addr}
    acting.pool.peers[other.core.addr] = other.core.dispatcher
    send_half(other, tid="TX-of-b")  # so the escaped half lands at another offset there
    half = send_half(acting)

    await acting.service.check_once()

    [_, escaped] = other.core.store.messages(HALF_TOPIC, 0)
    assert (half, escaped.queue_offset) == (0, 1)
    assert escaped.properties[PROPERTY_REAL_TOPIC] == TOPIC
    assert escaped.properties[PROPERTY_REAL_QID] == str(QID)
    assert escaped.properties[PROPERTY_UNIQ_KEY] == TID
    assert acting.escape.puts == []  # local escape, not a remote put
    assert acting.service.progress.is_resolved(half)

    await end(acting, half, commit=True)

    assert acting.pool.calls == [(other.core.addr, RequestCode.END_TRANSACTION)]
    [real] = other.core.store.messages(TOPIC, QID)
    assert (real.body, real.properties[PROPERTY_UNIQ_KEY]) == (b"order-1", TID)
    assert other.service.progress.is_resolved(escaped.queue_offset, TID)
    assert acting.core.store.appended == []


# ---- the check loop: master ------------------------------------------------------------


async def test_check_on_master_asks_the_producer_about_an_old_half(master: Broker) -> None:
    old = send_half(master, tid="TX-old")
    send_half(master, tid="TX-young", born_ts_ms=now_ms())
    producer = FakeConn()
    master.service.producer_seen(request_context(RequestCode.HEART_BEAT, producer), [GROUP])

    await master.service.check_once()

    [(method, body)] = producer.sent
    assert method == RequestCode.CHECK_TRANSACTION_STATE
    check = broker_pb2.CheckTransactionStateRequest.FromString(body)
    assert check.transaction_id == "TX-old"
    assert (check.message.topic, check.message.queue_id) == (TOPIC, QID)
    assert check.message.queue_offset == old
    assert check.message.body == b"order-1"
    assert (check.broker_name, check.broker_addr) == ("broker-a", master.core.addr)
    assert master.service.checked == 1
    assert master.core.store.appended == []  # nothing resolved by asking


async def test_check_skips_dead_producer_connections(master: Broker) -> None:
    send_half(master)
    live, broken, closed = FakeConn("p1:1"), FakeConn("p2:1", broken=True), FakeConn("p3:1")
    closed.closed = True
    for conn in (live, broken, closed):  # the most recently seen is tried first
        master.service.producer_seen(request_context(RequestCode.HEART_BEAT, conn), [GROUP])

    await master.service.check_once()

    assert len(live.sent) == 1
    assert broken.sent == closed.sent == []


async def test_check_without_a_producer_sends_nothing(master: Broker) -> None:
    send_half(master)
    other_group = FakeConn()
    master.service.producer_seen(request_context(RequestCode.HEART_BEAT, other_group), ["PG_other"])

    for _ in range(5):
        await master.service.check_once()

    assert other_group.sent == []
    assert master.service.checked == 0
    assert master.core.store.appended == []  # never checked, so never discarded


async def test_half_is_discarded_after_the_last_check(tmp_path: Path) -> None:
    master = make_broker(tmp_path, config(0, transaction_check_max=2))
    half = send_half(master)
    producer = FakeConn()
    master.service.producer_seen(request_context(RequestCode.HEART_BEAT, producer), [GROUP])

    for _ in range(3):
        await master.service.check_once()

    assert len(producer.sent) == 2
    [op] = master.core.store.appended
    assert op.topic == OP_TOPIC
    assert op.properties[PROPERTY_OP_RESULT] == "discard"
    assert master.service.progress.half_offset == half + 1


async def test_check_on_master_reads_ops_and_does_not_check_resolved_halves(
    master: Broker,
) -> None:
    done = send_half(master, tid="TX-done")
    write_op(master, done, "TX-done")
    producer = FakeConn()
    master.service.producer_seen(request_context(RequestCode.HEART_BEAT, producer), [GROUP])

    await master.service.check_once()

    assert producer.sent == []
    progress = master.service.progress
    assert (progress.half_offset, progress.op_offset) == (1, 1)


# ---- the loop and the progress file -------------------------------------------------


async def test_run_escapes_while_acting_and_persists_the_progress(tmp_path: Path) -> None:
    acting = make_broker(tmp_path, config(1), acting=True)
    send_half(acting)
    state_before = acting.service.progress.version.state_version
    acting.service.set_active(True)
    assert acting.service.progress.version.state_version == state_before + 1  # took over

    task = asyncio.create_task(acting.service.run())
    try:
        await eventually(lambda: len(acting.escape.puts) == 1, timeout=5)
        path = tmp_path / "transaction_offsets.json"
        await eventually(
            lambda: path.exists() and json.loads(path.read_text())["halfOffset"] == 1, timeout=5
        )
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    reloaded = make_broker(tmp_path, config(1))
    assert reloaded.service.progress.half_offset == 1
    assert reloaded.service.progress.version.compare(acting.service.progress.version) == 0


async def test_run_does_nothing_on_an_isolated_broker(tmp_path: Path) -> None:
    acting = make_broker(tmp_path, config(1, transaction_check_interval_ms=20), acting=True)
    send_half(acting)
    acting.core.isolated = True
    acting.service.set_active(True)

    task = asyncio.create_task(acting.service.run())
    try:
        await asyncio.sleep(0.2)  # several ticks of the loop: nothing may happen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert acting.escape.puts == []


# ---- the versioned table -------------------------------------------------------------


def snapshot(
    half: int, op: int, *, version: DataVersion, resolved: set[int] | None = None
) -> HalfProgress:
    return HalfProgress(half_offset=half, op_offset=op, resolved=resolved or set(), version=version)


def test_table_assign_takes_a_different_version_as_it_is(slave: Broker) -> None:
    table = slave.service.table()
    assert table.name == "transaction offsets"
    assert table.busy() is False
    theirs = snapshot(5, 3, resolved={7}, version=DataVersion(0, 4, 100))

    table.assign(theirs)

    progress = slave.service.progress
    assert (progress.half_offset, progress.op_offset, progress.resolved) == (5, 3, {7})
    assert progress.version.compare(theirs.version) == 0
    slave.service.persist()
    assert make_broker(slave.core.store_dir, config(1)).service.progress.half_offset == 5

    table.assign(snapshot(9, 9, version=DataVersion(0, 4, 100)))  # same version: no change
    assert slave.service.progress.half_offset == 5


def test_table_adopts_only_a_newer_or_equal_version(master: Broker) -> None:
    table = master.service.table()
    ours = master.service.progress
    ours.half_offset, ours.op_offset = 4, 2
    ours.version.assign(DataVersion(0, 10, 500))
    path = master.core.store_dir / "transaction_offsets.json"

    assert table.adopt_if_newer(snapshot(9, 9, version=DataVersion(0, 9, 900))) is False
    assert (ours.half_offset, ours.op_offset) == (4, 2)
    assert not path.exists()

    acting_table = snapshot(6, 1, resolved={8}, version=DataVersion(1, 1, 600))
    assert table.adopt_if_newer(acting_table) is True
    assert (ours.half_offset, ours.op_offset, ours.resolved) == (6, 2, {8})
    assert ours.version.compare(acting_table.version) == 0
    assert json.loads(path.read_text())["halfOffset"] == 6  # persisted at once

    assert table.describe(acting_table) == "half 6 op 1, ours now half 6"


async def test_table_fetch_reads_get_transaction_offsets(master: Broker, slave: Broker) -> None:
    send_half(master)
    await end(master, 0, commit=False)
    slave.pool.peers[master.core.addr] = master.core.dispatcher

    fetched = await slave.service.table().fetch(slave.core.pool, master.core.addr)

    assert fetched.half_offset == 1
    assert fetched.resolved_ids == {TID: None}
    assert fetched.version.compare(master.service.progress.version) == 0


def test_a_member_elected_merges_a_members_progress_whatever_the_versions() -> None:
    """``controller-flap``, seed 3307: the slave that acted last resolved halves the
    member elected had not, with an older version (the elected one took over first):
    the version-gated merge kept the elected member's progress and those halves were
    checked and committed again."""
    ours = HalfProgress(half_offset=60, op_offset=55, version=DataVersion(2, 9, 1))
    theirs = HalfProgress(half_offset=73, op_offset=65, version=DataVersion(2, 5, 1))
    theirs.resolved = {75}
    assert ours.adopt_if_newer(theirs) is False  # what pre-online did before
    assert ours.adopt_on_promotion(theirs, half_end=80, op_end=70)
    assert (ours.half_offset, ours.op_offset, ours.resolved) == (73, 65, {75})
    assert ours.version.key() == (2, 9, 1)
    # nothing at or past this log's ends: a member's unacknowledged tail is not here
    tail = HalfProgress(half_offset=90, op_offset=99, version=DataVersion(2, 1, 1))
    tail.resolved = {95}
    ours.adopt_on_promotion(tail, half_end=80, op_end=70)
    assert (ours.half_offset, ours.op_offset, ours.resolved) == (80, 70, set())


# ---- plain state: half progress and half-message conversions (no sockets) ----


def test_half_progress_advances_over_resolved_prefix_only() -> None:
    p = HalfProgress()
    p.resolve(1, "t1")
    assert not p.advance() and p.half_offset == 0
    p.resolve(0, "t0")
    assert p.advance() and p.half_offset == 2 and p.resolved == set()
    assert p.is_resolved(1) and p.is_resolved(7, "t1") and not p.is_resolved(2, "t2")


def test_half_progress_adopts_newer_or_equal_version_only() -> None:
    master = HalfProgress(half_offset=3, version=DataVersion(0, 5, 1))
    older = HalfProgress(half_offset=9, version=DataVersion(0, 4, 9))
    assert not master.adopt_if_newer(older) and master.half_offset == 3
    slave = HalfProgress(half_offset=8, resolved={10}, version=DataVersion(0, 5, 1))
    slave.resolved_ids["x"] = None
    assert master.adopt_if_newer(slave)
    assert master.half_offset == 8 and master.resolved == {10} and "x" in master.resolved_ids
    assert HalfProgress.from_pb(master.to_pb()).to_dict() == master.to_dict()
    assert HalfProgress.from_dict(master.to_dict()).to_dict() == master.to_dict()


def test_half_message_conversions_keep_the_transaction_id() -> None:
    half = StoredMessage(
        "RMQ_SYS_TRANS_HALF_TOPIC",
        0,
        b"b",
        {"REAL_TOPIC": "T", "REAL_QID": "3", "TRAN_MSG": "true", "UNIQ_KEY": "U"},
        queue_offset=5,
    )
    assert half_to_real(half, 5) == ("T", 3, {"UNIQ_KEY": "U", "TRAN_PREPARED_QUEUE_OFFSET": "5"})
    assert half_to_prepared(half) == ("T", 3, {"UNIQ_KEY": "U", "TRAN_MSG": "true"})
