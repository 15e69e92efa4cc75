"""The gRPC gateway's plain parts: handles, FIFO locks, conversions, and the
committed v2 protocol files (regenerate == committed).

Never imports the official SDK: its generated modules and ours both define
``apache.rocketmq.v2`` in the default descriptor pool (see
tests/integration/test_grpc_proxy.py).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest
from fakes import FakeClock

from ha_controller.filter.sql92 import FilterSyntaxError
from ha_controller.proto import broker_pb2, regen
from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s
from ha_controller.protocol.errors import (
    BadRequest,
    BrokerUnavailable,
    IllegalFilterExpression,
    InSyncReplicasNotEnough,
    MessageTooLarge,
    NotMaster,
    NotRecallable,
    Overloaded,
    ReceiptHandleExpired,
    TopicNotFound,
)
from ha_controller.protocol.validation import MAX_BODY_BYTES
from ha_controller.proxy import convert
from ha_controller.proxy.handles import (
    GatewayHandle,
    InvalidHandle,
    RecallHandle,
    TransactionId,
)
from ha_controller.proxy.renewal import MAX_FAILURES, RENEW_MAX_MS, RenewalTable
from ha_controller.proxy.sessions import PRODUCER, Sessions
from ha_controller.routing import BrokerData, Perm, QueueData, TopicRouteData


def test_v2_protocol_files_regenerate_to_the_committed_ones(tmp_path: Path) -> None:
    regen.regenerate(tmp_path)
    out = tmp_path / "ha_controller" / "proto" / "rocketmq" / "v2"
    expected = {f"{p.stem}_pb2{ext}" for p in regen.v2_proto_files() for ext in (".py", ".pyi")}
    expected |= {f"{Path(name).stem}_pb2_grpc.py" for name in regen.GRPC_PROTOS}
    assert {p.name for p in out.glob("*_pb2*.py*")} == expected
    for new in out.glob("*_pb2*.py*"):
        committed = regen.V2_DIR / new.name
        assert committed.read_text() == new.read_text(), f"{new.name} differs: run `make proto`"


def test_service_path_is_the_official_one() -> None:
    svc = v2s.DESCRIPTOR.services_by_name["MessagingService"]
    assert svc.full_name == "apache.rocketmq.v2.MessagingService"
    assert svc.methods_by_name["ReceiveMessage"].server_streaming
    telemetry = svc.methods_by_name["Telemetry"]
    assert telemetry.client_streaming and telemetry.server_streaming
    # a few field numbers the SDKs depend on
    sp = v2.SystemProperties.DESCRIPTOR.fields_by_name
    assert sp["receipt_handle"].number == 12
    assert sp["delivery_attempt"].number == 16
    assert sp["message_group"].number == 17
    assert (
        v2s.TelemetryCommand.DESCRIPTOR.fields_by_name[
            "recover_orphaned_transaction_command"
        ].number
        == 5
    )


@pytest.mark.parametrize("handle", ["", "x", "h1.!!!", "h1.e30", "t1.WyJhIl0"])
def test_bad_receipt_handles_are_typed(handle: str) -> None:
    with pytest.raises(InvalidHandle):
        GatewayHandle.decode(handle)


def test_handles_round_trip() -> None:
    h = GatewayHandle("broker-a", "%RETRY%g", 3, 42, "1 2 3 4 L broker-a 3 42", 99)
    assert GatewayHandle.decode(h.encode()) == h
    t = TransactionId("broker-b", 7, 123456, "01ABC")
    assert TransactionId.decode(t.encode()) == t
    with pytest.raises(InvalidHandle):
        TransactionId.decode(h.encode())
    assert isinstance(InvalidHandle("x"), BadRequest)


def _route(acting_b: bool = False) -> TopicRouteData:
    return TopicRouteData(
        topic="T",
        broker_datas=[
            BrokerData("c", "broker-a", {0: "10.0.0.1:1", 1: "10.0.0.2:1"}, True),
            BrokerData("c", "broker-b", {0: "10.0.0.4:1"} if acting_b else {0: "10.0.0.3:1"}, True),
            BrokerData("c", "broker-c", {1: "10.0.0.5:1"}, False),
        ],
        queue_datas=[
            QueueData("broker-a", 2, 2, Perm.READ | Perm.WRITE),
            QueueData("broker-b", 2, 2, Perm.READ if acting_b else Perm.READ | Perm.WRITE),
            QueueData("broker-c", 2, 2, Perm.READ | Perm.WRITE),
        ],
    )


def test_routes_point_at_the_gateway_and_follow_the_acting_rewrite() -> None:
    gw = convert.endpoints_of("127.0.0.1:8081")
    queues = convert.v2_queues(_route(acting_b=True), gw)
    # broker-c has no id 0 (no master, acting disabled): not offered
    assert {q.broker.name for q in queues} == {"broker-a", "broker-b"}
    assert all(q.broker.id == 0 and q.broker.endpoints == gw for q in queues)
    perms = {(q.broker.name, q.id): q.permission for q in queues}
    assert perms[("broker-a", 0)] == v2.READ_WRITE
    assert perms[("broker-b", 1)] == v2.READ
    writable = convert.writable_queues(_route(acting_b=True))
    assert {q.broker_name for q in writable} == {"broker-a"}
    assert {
        q.addr for q in convert.route_queues(_route(acting_b=True)) if q.broker_name == "broker-b"
    } == {"10.0.0.4:1"}
    found = convert.assignments(_route(acting_b=True), gw)
    assert [(a.message_queue.broker.name, a.message_queue.id) for a in found] == [
        ("broker-a", -1),
        ("broker-b", -1),
    ]


def test_fifo_groups_stay_on_one_queue() -> None:
    queues = convert.writable_queues(_route())
    picks = {convert.fifo_queue(queues, "order-7") for _ in range(5)}
    assert len(picks) == 1


def _v2_message(**sp: object) -> v2.Message:
    m = v2.Message(topic=v2.Resource(name="T"), body=b"hello")
    m.system_properties.message_id = "01AB"
    for k, val in sp.items():
        setattr(m.system_properties, k, val)
    return m


def test_send_entry_maps_types_to_rocketmq_properties() -> None:
    m = _v2_message(tag="A", message_type=v2.FIFO, message_group="g1")
    m.system_properties.keys.extend(["k1", "k2"])
    m.user_properties["color"] = "red"
    plan = convert.send_entry(m, "T")
    props = dict(plan.entry.properties)
    assert props == {
        "color": "red",
        "UNIQ_KEY": "01AB",
        "PGROUP": "T",
        "TAGS": "A",
        "KEYS": "k1 k2",
        "__SHARDINGKEY": "g1",
    }
    assert plan.message_group == "g1"

    now = 1_799_999_000_000
    d = _v2_message(message_type=v2.DELAY)
    d.system_properties.delivery_timestamp.seconds = 1_800_000_000
    sent = convert.send_entry(d, "T", now_ms=now).entry.properties
    assert sent["TIMER_DELIVER_MS"] == "1800000000000"
    # rocketmq-python-client 5.1.2 puts milliseconds into Timestamp.seconds
    d.system_properties.delivery_timestamp.seconds = 1_800_000_000_123
    sent = convert.send_entry(d, "T", now_ms=now).entry.properties
    assert sent["TIMER_DELIVER_MS"] == "1800000000123"

    t = _v2_message(message_type=v2.TRANSACTION)
    assert convert.send_entry(t, "T").entry.properties["TRAN_MSG"] == "true"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda m: m.ClearField("body"),
        lambda m: m.user_properties.__setitem__("UNIQ_KEY", "x"),
        lambda m: setattr(m.system_properties, "message_type", v2.FIFO),
        lambda m: setattr(m.system_properties, "message_type", v2.DELAY),
    ],
)
def test_bad_sends_are_rejected(mutate: Callable[[v2.Message], object]) -> None:
    m = _v2_message()
    mutate(m)
    with pytest.raises(BadRequest):
        convert.send_entry(m, "T")


def test_received_messages_carry_digest_handle_and_attempt() -> None:
    bm = broker_pb2.Message(
        topic="%RETRY%g",
        body=b"payload",
        properties={
            "UNIQ_KEY": "01CD",
            "TAGS": "B",
            "KEYS": "x y",
            "__SHARDINGKEY": "grp",
            "RECONSUME_TIME": "2",
            "POP_CK": "ck",
            "user": "1",
        },
        queue_id=1,
        queue_offset=9,
        born_ts_ms=1_700_000_000_123,
        store_ts_ms=1_700_000_000_456,
    )
    m = convert.message_to_v2(bm, topic="T", receipt_handle="h", invisible_ms=30_000)
    sp = m.system_properties
    assert m.topic.name == "T"
    assert sp.message_id == "01CD"
    # MD5, upper-case hex, as RocketMQ's proxy (Node.js 1.0.8 reads CRC32 as decimal)
    assert sp.body_digest.type == v2.MD5
    assert sp.body_digest.checksum == hashlib.md5(b"payload").hexdigest().upper()
    assert sp.delivery_attempt == 3
    assert sp.message_type == v2.FIFO and sp.message_group == "grp"
    assert list(sp.keys) == ["x", "y"] and sp.tag == "B"
    assert sp.receipt_handle == "h" and sp.invisible_duration.seconds == 30
    assert convert.ms_of_timestamp(sp.born_timestamp) == 1_700_000_000_123
    # the message group shows as RocketMQ's proxy shows it (the SDKs' tests read it)
    assert dict(m.user_properties) == {"user": "1", "__SHARDINGKEY": "grp"}


def test_error_codes_keep_the_sdk_retrying_except_on_overload() -> None:
    assert convert.code_for(NotMaster("x")) == v2.HA_NOT_AVAILABLE
    assert convert.code_for(BrokerUnavailable("x")) == v2.HA_NOT_AVAILABLE
    assert convert.code_for(InSyncReplicasNotEnough("x")) == v2.SLAVE_PERSISTENCE_TIMEOUT
    assert convert.code_for(TopicNotFound("x")) == v2.TOPIC_NOT_FOUND
    assert convert.code_for(Overloaded("x")) == v2.TOO_MANY_REQUESTS
    assert convert.code_for(InvalidHandle("x")) == v2.INVALID_RECEIPT_HANDLE
    # an ack after the invisible time: the SDK is told the handle is no longer good
    assert convert.code_for(ReceiptHandleExpired("x")) == v2.INVALID_RECEIPT_HANDLE
    assert convert.code_for(RuntimeError("x")) == v2.INTERNAL_ERROR


def test_a_body_over_the_limit_is_rocketmqs_message_body_too_large() -> None:
    m = _v2_message()
    m.body = b"x" * (MAX_BODY_BYTES + 1)
    with pytest.raises(MessageTooLarge) as caught:
        convert.send_entry(m, "T")
    assert convert.code_for(caught.value) == v2.MESSAGE_BODY_TOO_LARGE
    assert convert.code_for(BadRequest("x")) == v2.BAD_REQUEST


def test_tag_and_sql92_filters() -> None:
    def of(kind: v2.FilterType, text: str) -> tuple[list[str], str]:
        return convert.filter_of(v2.FilterExpression(type=kind, expression=text))

    assert of(v2.TAG, "*") == ([], "")
    assert of(v2.FILTER_TYPE_UNSPECIFIED, "") == ([], "")
    assert of(v2.TAG, "a || b") == (["a", "b"], "")
    # SQL92 passes through to the brokers, parsed first
    assert of(v2.SQL, " a > 1 AND TAGS IN ('x') ") == ([], "a > 1 AND TAGS IN ('x')")
    for bad in ("a >", "", "a = NULL"):
        with pytest.raises(FilterSyntaxError) as caught:
            of(v2.SQL, bad)
        assert convert.code_for(caught.value) == v2.ILLEGAL_FILTER_EXPRESSION
    with pytest.raises(IllegalFilterExpression):
        of(7, "x")  # type: ignore[arg-type]  # no such filter type


def test_transaction_checks_prefer_the_producer_that_sent_the_half() -> None:
    sessions: Sessions[str] = Sessions()
    for cid in ("p1", "p2"):
        s = sessions.get(cid)
        s.kind, s.topics, s.streams = PRODUCER, frozenset({"T"}), 1
    other = sessions.get("p3")
    other.kind, other.topics, other.streams = PRODUCER, frozenset({"U"}), 1
    assert sessions.producers_for("T", prefer="p1")[0].client_id == "p1"
    assert {s.client_id for s in sessions.producers_for("T")} == {"p1", "p2"}
    woken: list[str] = []
    sessions.wakers["p2"] = lambda: woken.append("p2")
    assert sessions.push(sessions.get("p2"), "cmd")
    assert woken == ["p2"] and sessions.get("p2").outbox == ["cmd"]


# ---- recall handles (RocketMQ 5.3 RecallMessageHandle.HandleV1) ---------------------------


def test_recall_handle_is_rocketmqs_v1_format() -> None:
    h = RecallHandle("T", "broker-a", 1_700_000_000_123, "0A0B0C")
    text = h.encode()
    # URL-safe base64 of "v1 topic brokerName timestamp messageId", as RocketMQ builds it
    assert base64.urlsafe_b64decode(text) == b"v1 T broker-a 1700000000123 0A0B0C"
    assert RecallHandle.decode(text) == h
    assert RecallHandle.decode(text.rstrip("=")) == h  # padding optional


@pytest.mark.parametrize(
    "text",
    [
        "",
        "%%%not base64",
        base64.urlsafe_b64encode(b"v2 T b 1 id").decode(),
        base64.urlsafe_b64encode(b"v1 T b 1").decode(),
        base64.urlsafe_b64encode(b"v1 T b soon id").decode(),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
        GatewayHandle("b", "T", 0, 1, "x", 2).encode(),
    ],
)
def test_hostile_recall_handles_are_invalid(text: str) -> None:
    with pytest.raises(InvalidHandle):
        RecallHandle.decode(text)


def test_not_recallable_maps_to_not_found() -> None:
    assert convert.code_for(NotRecallable("already delivered")) == v2.NOT_FOUND


# ---- invisible-time renewal (push consumers) ------------------------------------------------


def _handle(offset: int, until: int, broker_handle: str = "ck0") -> GatewayHandle:
    return GatewayHandle("broker-a", "T", 1, offset, broker_handle, until)


def test_renewal_is_due_shortly_before_the_invisible_time_runs_out() -> None:
    clock = FakeClock()
    table = RenewalTable(clock)
    table.add("c1", "G", "T", _handle(5, clock.now_ms() + 30_000), 30_000)
    alive = lambda cid: True  # noqa: E731
    assert table.due(alive) == []
    clock.now += 20_001  # 9.999 s to go: within RENEW_AHEAD_MS
    [r] = table.due(alive)
    assert table.due(alive) == []  # in flight: not handed out twice
    table.renewed(r, _handle(5, clock.now_ms() + 30_000, "ck1"))
    assert table.due(alive) == []
    # the ack goes with the newest broker handle, and renewal stops
    assert table.take("G", _handle(5, 0)).broker_handle == "ck1"
    assert len(table) == 0
    assert table.take("G", _handle(5, 0, "mine")).broker_handle == "mine"  # unknown: as given


def test_short_invisible_times_renew_at_half_time() -> None:
    clock = FakeClock()
    table = RenewalTable(clock)
    table.add("c1", "G", "T", _handle(1, clock.now_ms() + 2000), 2000)
    clock.now += 900
    assert table.due(lambda cid: True) == []
    clock.now += 101
    assert len(table.due(lambda cid: True)) == 1


def test_renewal_stops_for_a_gone_client_a_bound_and_repeated_failures() -> None:
    clock = FakeClock()
    table = RenewalTable(clock)
    table.add("dead", "G", "T", _handle(1, clock.now_ms() + 1000), 2000)
    table.add("live", "G", "T", _handle(2, clock.now_ms() + 1000), 2000)
    table.add("live", "G", "T", _handle(3, clock.now_ms() + 1000), 2000)
    [r2, r3] = table.due(lambda cid: cid == "live")
    assert len(table) == 2  # the dead client's message is left to its invisible time
    for _ in range(MAX_FAILURES):
        table.renewed(r2, None)
        r2.in_flight = True
    table.renewed(r2, None)
    table.renewed(r3, _handle(3, clock.now_ms() + RENEW_MAX_MS + 10_000, "ck"))
    clock.now += RENEW_MAX_MS  # r3: renewed for the whole bound
    assert table.due(lambda cid: True) == []
    assert len(table) == 0


def test_an_ack_during_a_renewal_is_not_undone_by_it() -> None:
    clock = FakeClock()
    table = RenewalTable(clock)
    table.add("c", "G", "T", _handle(1, clock.now_ms() + 1000), 2000)
    [r] = table.due(lambda cid: True)
    table.take("G", _handle(1, 0))
    table.renewed(r, _handle(1, clock.now_ms() + 2000, "ck2"))
    assert len(table) == 0


def test_a_terminated_clients_messages_are_no_longer_renewed() -> None:
    table = RenewalTable(FakeClock())
    table.add("c", "G", "T", _handle(1, 0), 2000)
    table.add("c", "G", "T", _handle(2, 0), 2000)
    table.add("d", "G", "T", _handle(3, 0), 2000)
    assert table.drop_client("c") == 2
    assert len(table) == 1 and ("G", "broker-a", "T", 1, 3) in table
