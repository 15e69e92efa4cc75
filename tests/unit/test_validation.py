"""RocketMQ's rules for what a message and a consumer may carry
(``ha_controller.protocol.validation``), at the boundaries RocketMQ's own end-to-end
cases for its 5.x clients use, and the v2 status the gateway answers for each (the code
RocketMQ's proxy gives for the same check).

Never imports the official SDK (see tests/integration/test_grpc_proxy.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ha_controller.proto import broker_pb2
from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
from ha_controller.protocol.errors import (
    BadRequest,
    HaError,
    IllegalConsumerGroup,
    IllegalDeliveryTime,
    IllegalInvisibleTime,
    IllegalMessageGroup,
    IllegalMessageId,
    IllegalMessageKey,
    IllegalMessageTag,
    IllegalPropertyKey,
    IllegalTopic,
    MessageBodyEmpty,
    MessageTooLarge,
    MessageTypeConflict,
    PropertiesTooLarge,
    error_table,
)
from ha_controller.protocol.topics import (
    TopicMessageType,
    message_type_name_problem,
    message_type_of,
    message_type_problem,
)
from ha_controller.protocol.validation import (
    MAX_BODY_BYTES,
    MAX_DELAY_MS,
    MAX_INVISIBLE_MS,
    MIN_INVISIBLE_MS_FOR_RECEIVE,
    check_consumer_group,
    check_invisible_ms,
    check_message,
    check_topic,
    has_control_character,
)
from ha_controller.proxy import convert
from ha_controller.routing import TopicConfig

KB = 1024
NOW = 1_800_000_000_000


def _check(**fields: Any) -> None:
    message: dict[str, Any] = {"body": b"x" * 64, "tag": None, "keys": (), "properties": {}}
    message.update(fields)
    check_message(now_ms=NOW, **message)


# ---- what RocketMQ takes -----------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"keys": ["k" * (16 * KB)]},  # a key of 16 KB exactly
        {"tag": "t" * (16 * KB)},  # a tag of 16 KB exactly
        {"properties": {str(i): "ab" for i in range(128)}},  # 128 user properties
        {"properties": {"k" * (8 * KB): "v" * (8 * KB)}},  # 16 KB of user properties
        {  # user properties, key and tag of 16 KB together, a 4 MiB body
            "body": b"b" * MAX_BODY_BYTES,
            "properties": {"k" * (4 * KB): "v" * (4 * KB)},
            "tag": "t" * (4 * KB),
            "keys": ["m" * (4 * KB)],
        },
        {"keys": ["中文字符"], "tag": "中文"},
        {"properties": {"中文": "中文", "_": "_", "%": "%", "。": "。", "||": "||", "🏷": "🏷"}},
        {"keys": ["a" * 64, "b" * 64]},
        {"message_group": "g" * 63},
        {"deliver_ms": NOW + MAX_DELAY_MS},
        {"deliver_ms": NOW - 5000},  # in the past: due at once
    ],
)
def test_what_rocketmq_takes_is_taken(fields: dict[str, object]) -> None:
    _check(**fields)


# ---- what RocketMQ refuses, and with which error -----------------------------------------


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"body": b""}, MessageBodyEmpty),
        ({"body": b"b" * (MAX_BODY_BYTES + 1)}, MessageTooLarge),
        ({"keys": ["k" * (16 * KB + 1)]}, PropertiesTooLarge),
        ({"keys": ["\u0000"]}, IllegalMessageKey),
        ({"keys": ["   "]}, IllegalMessageKey),
        ({"tag": "t" * (16 * KB + 1)}, PropertiesTooLarge),
        ({"tag": "\u0000"}, IllegalMessageTag),
        ({"tag": "a|b"}, IllegalMessageTag),
        ({"tag": ""}, IllegalMessageTag),
        ({"tag": "  "}, IllegalMessageTag),
        ({"properties": {str(i): "ab" for i in range(129)}}, PropertiesTooLarge),
        ({"properties": {"k" * (8 * KB): "v" * (8 * KB + 1)}}, PropertiesTooLarge),
        ({"properties": {"\u0000": "value"}}, IllegalPropertyKey),
        ({"properties": {"key": "va\u0085lue"}}, IllegalPropertyKey),
        ({"properties": {"UNIQ_KEY": "value"}}, IllegalPropertyKey),
        ({"properties": {"__SHARDINGKEY": "g"}}, IllegalPropertyKey),
        (
            {
                "body": b"b" * MAX_BODY_BYTES,
                "properties": {"k" * (4 * KB): "v" * (4 * KB)},
                "tag": "t" * (4 * KB),
                "keys": ["m" * (4 * KB + 1)],
            },
            PropertiesTooLarge,
        ),
        ({"message_group": "g" * 64}, IllegalMessageGroup),
        ({"message_group": "a\tb"}, IllegalMessageGroup),
        ({"deliver_ms": NOW + MAX_DELAY_MS + 1}, IllegalDeliveryTime),
    ],
)
def test_what_rocketmq_refuses_is_refused(fields: dict[str, object], error: type[HaError]) -> None:
    with pytest.raises(error):
        _check(**fields)
    assert issubclass(error, BadRequest) and not error.retriable


def test_control_characters_are_javas_iso_controls() -> None:
    assert all(has_control_character(ch) for ch in ("\x00", "\x1f", "\x7f", "\x9f"))
    assert not any(has_control_character(ch) for ch in (" ", "~", "\xa0", "中", "🏷"))


def test_invisible_time_bounds() -> None:
    floor = MIN_INVISIBLE_MS_FOR_RECEIVE
    check_invisible_ms(10_000, min_ms=floor)
    check_invisible_ms(43_200_000, min_ms=floor)
    for ms in (9999, 43_200_001):
        with pytest.raises(IllegalInvisibleTime):
            check_invisible_ms(ms, min_ms=floor)
    assert MAX_INVISIBLE_MS == 43_200_000


def test_consumer_groups_and_topics() -> None:
    for group in ("DEFAULT_CONSUMER", "TOOLS_CONSUMER", "CID_RMQ_SYS_X", "a b", ""):
        with pytest.raises(IllegalConsumerGroup):
            check_consumer_group(group)
    check_consumer_group("my-group_1")
    for topic in ("rmq_sys_x", "RMQ_SYS_TRANS_HALF_TOPIC", "TBW102", "a/b", ""):
        with pytest.raises(IllegalTopic):
            check_topic(topic)
    check_topic("%DLQ%g")  # a group's dead letters may be read, as in RocketMQ
    check_topic("orders")


# ---- topic message types ------------------------------------------------------------------

T = TopicMessageType


@pytest.mark.parametrize(
    ("props", "kind"),
    [
        ({}, T.NORMAL),
        ({"__SHARDINGKEY": "g"}, T.FIFO),
        ({"TIMER_DELIVER_MS": "1"}, T.DELAY),
        ({"DELAY": "3"}, T.DELAY),
        ({"TRAN_MSG": "true"}, T.TRANSACTION),
        ({"__PRIORITY": "3"}, T.PRIORITY),
        ({"TRAN_MSG": "true", "__SHARDINGKEY": "g"}, T.TRANSACTION),  # RocketMQ's order
    ],
)
def test_a_messages_kind_is_read_from_its_properties(props: dict[str, str], kind: T) -> None:
    assert message_type_of(props) is kind


def test_a_typed_topic_takes_only_its_kind_and_mixed_takes_all() -> None:
    kinds = [T.NORMAL, T.FIFO, T.DELAY, T.TRANSACTION, T.PRIORITY]
    for topic_type in kinds:
        for kind in kinds:
            problem = message_type_problem("t", topic_type, kind)
            assert (problem is None) == (topic_type is kind), (topic_type, kind)
        assert message_type_problem("t", T.MIXED, topic_type) is None
    problem = message_type_problem("t", T.NORMAL, T.FIFO)
    assert problem is not None and "expected type is NORMAL, but actual type is FIFO" in problem


def test_topic_types_travel_and_old_topics_are_mixed() -> None:
    assert T.parse("fifo") is T.FIFO and T.parse("") is T.MIXED
    assert message_type_name_problem("QUEUE") is not None
    assert T.from_wire("SOMETHING_NEWER") is T.MIXED
    old = {"topicName": "t", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}
    assert TopicConfig.from_json(old).message_type is T.MIXED
    typed = TopicConfig("t", 4, 4, message_type=T.DELAY)
    assert TopicConfig.from_json(typed.to_json()) == typed


# ---- through the gateway: each refusal has RocketMQ's proxy's code -----------------------


def _v2(**sp: object) -> v2.Message:
    m = v2.Message(topic=v2.Resource(name="T"), body=b"hello")
    m.system_properties.message_id = "01AB"
    for k, val in sp.items():
        setattr(m.system_properties, k, val)
    return m


def _tag(text: str) -> Callable[[v2.Message], None]:
    return lambda m: setattr(m.system_properties, "tag", text)


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda m: m.ClearField("body"), v2.MESSAGE_BODY_EMPTY),
        (lambda m: setattr(m, "body", b"x" * (MAX_BODY_BYTES + 1)), v2.MESSAGE_BODY_TOO_LARGE),
        (_tag("a|b"), v2.ILLEGAL_MESSAGE_TAG),
        (_tag(""), v2.ILLEGAL_MESSAGE_TAG),
        (_tag("\u0001"), v2.ILLEGAL_MESSAGE_TAG),
        (lambda m: m.system_properties.keys.append("\u0000"), v2.ILLEGAL_MESSAGE_KEY),
        (lambda m: m.user_properties.__setitem__("UNIQ_KEY", "x"), v2.ILLEGAL_MESSAGE_PROPERTY_KEY),
        (
            lambda m: m.user_properties.update({str(i): "v" for i in range(129)}),
            v2.MESSAGE_PROPERTIES_TOO_LARGE,
        ),
        (
            lambda m: m.user_properties.__setitem__("k", "v" * (16 * KB)),
            v2.MESSAGE_PROPERTIES_TOO_LARGE,
        ),
        (
            lambda m: setattr(m.system_properties, "message_group", "g" * 64),
            v2.ILLEGAL_MESSAGE_GROUP,
        ),
        (lambda m: setattr(m.system_properties, "message_type", v2.FIFO), v2.ILLEGAL_MESSAGE_GROUP),
        (
            lambda m: m.system_properties.delivery_timestamp.FromMilliseconds(
                NOW + MAX_DELAY_MS + 1000
            ),
            v2.ILLEGAL_DELIVERY_TIME,
        ),
        (lambda m: setattr(m.system_properties, "message_id", ""), v2.ILLEGAL_MESSAGE_ID),
    ],
)
def test_gateway_refusals_carry_rocketmqs_codes(
    mutate: Callable[[v2.Message], None], code: int
) -> None:
    m = _v2()
    mutate(m)
    with pytest.raises(BadRequest) as caught:
        convert.send_entry(m, "T", now_ms=NOW)
    assert convert.code_for(caught.value) == code, v2.Code.Name(convert.code_for(caught.value))


def test_every_validation_error_has_its_own_code() -> None:
    for cls, code in (
        (IllegalTopic, v2.ILLEGAL_TOPIC),
        (IllegalConsumerGroup, v2.ILLEGAL_CONSUMER_GROUP),
        (IllegalInvisibleTime, v2.ILLEGAL_INVISIBLE_TIME),
        (MessageTypeConflict, v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (IllegalMessageId, v2.ILLEGAL_MESSAGE_ID),
    ):
        assert convert.code_for(cls("x")) == code
        assert error_table()[cls.code] is cls  # travels from a broker as itself


def test_the_gateway_stores_its_own_born_time_and_keeps_the_sdks() -> None:
    """The broker times transaction checks from the stored born time: rocketmq-python-
    client 5.1.2 sends whole seconds, which made half messages look up to a second
    older than they were."""
    m = _v2(message_type=v2.TRANSACTION)
    m.system_properties.born_timestamp.FromMilliseconds(NOW - 999)
    plan = convert.send_entry(m, "T", now_ms=NOW)
    assert plan.entry.born_ts_ms == NOW
    assert plan.entry.properties["BORN_TIMESTAMP"] == str(NOW - 999)
    assert plan.topic_type is T.TRANSACTION


def test_queues_accept_the_topics_types() -> None:
    assert convert.accepted_types(T.FIFO) == (v2.FIFO,)
    assert set(convert.accepted_types(T.MIXED)) == {v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION}


# ---- received messages, as the official SDKs' own tests read them ------------------------


def _received(**fields: Any) -> v2.Message:
    bm = broker_pb2.Message(topic="T", body=b"payload", **fields)
    return convert.message_to_v2(bm, topic="T", receipt_handle="h", invisible_ms=30_000)


def test_an_orderly_redelivery_counts_its_attempt() -> None:
    """The broker counts an orderly batch's re-pops in ``reconsume_times`` (no retry
    topic, so no RECONSUME_TIME property): the gateway showed delivery_attempt 1 every
    time."""
    again = _received(properties={"UNIQ_KEY": "01", "__SHARDINGKEY": "g"}, reconsume_times=1)
    assert again.system_properties.delivery_attempt == 2
    retried = _received(properties={"UNIQ_KEY": "01", "RECONSUME_TIME": "2"}, reconsume_times=2)
    assert retried.system_properties.delivery_attempt == 3


def test_the_message_group_and_transaction_id_show_as_properties() -> None:
    """RocketMQ's proxy shows every property outside its system set: the Node.js SDK's
    own tests read ``__SHARDINGKEY`` and ``__transactionId__`` there."""
    fifo = _received(properties={"UNIQ_KEY": "01", "__SHARDINGKEY": "g", "PGROUP": "T"})
    assert dict(fifo.user_properties) == {"__SHARDINGKEY": "g"}
    tx = _received(
        properties={"UNIQ_KEY": "02", "__transactionId__": "02", "TRAN_PREPARED_QUEUE_OFFSET": "7"}
    )
    assert dict(tx.user_properties) == {"__transactionId__": "02"}
    assert tx.system_properties.message_type == v2.TRANSACTION
