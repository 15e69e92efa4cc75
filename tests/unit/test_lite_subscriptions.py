"""Lite topics (RocketMQ 5.5's RIP-83) without sockets: the gateway's lite subscription
table and its bounds, the lite topic rules, the conversion of LITE messages and the
broker's lite filter."""

from __future__ import annotations

import pytest

from ha_controller.filter.selector import Selector
from ha_controller.proto import broker_pb2
from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
from ha_controller.protocol.errors import (
    BadRequest,
    IllegalLiteTopic,
    IllegalPropertyKey,
    LiteSubscriptionQuotaExceeded,
    MessageTypeConflict,
)
from ha_controller.protocol.topics import TopicMessageType, message_type_of
from ha_controller.protocol.validation import check_lite_topic
from ha_controller.proxy import convert
from ha_controller.proxy.lite import LiteSubscriptions, Subscriber

A = Subscriber("c1", "g", "parent")
B = Subscriber("c2", "g", "parent")
OTHER_GROUP = Subscriber("c3", "h", "parent")


def test_actions_add_remove_replace_and_drop() -> None:
    t = LiteSubscriptions(client_quota=10, max_total=100)
    assert t.sync(A, v2.PARTIAL_ADD, ["x", "y"]) == 2
    assert t.sync(A, v2.PARTIAL_ADD, ["y", "z"]) == 3
    assert t.sync(A, v2.PARTIAL_REMOVE, ["x", "never"]) == 2
    assert t.of(A) == {"y", "z"}
    assert t.sync(A, v2.COMPLETE_ADD, ["q"]) == 1  # the SDKs' periodic resync
    assert t.of(A) == {"q"}
    assert t.sync(A, v2.COMPLETE_REMOVE, []) == 0
    assert len(t) == 0
    assert t.group_topics("g", "parent") == frozenset()
    with pytest.raises(BadRequest):
        t.sync(A, 99, ["x"])


def test_a_group_lets_through_what_any_of_its_clients_subscribes() -> None:
    t = LiteSubscriptions(client_quota=10, max_total=100)
    t.sync(A, v2.PARTIAL_ADD, ["x", "y"])
    t.sync(B, v2.PARTIAL_ADD, ["y", "z"])
    t.sync(OTHER_GROUP, v2.PARTIAL_ADD, ["w"])
    assert t.group_topics("g", "parent") == {"x", "y", "z"}
    assert t.group_topics("h", "parent") == {"w"}
    assert t.group_topics("g", "other-parent") == frozenset()
    t.sync(A, v2.PARTIAL_REMOVE, ["y"])
    assert t.group_topics("g", "parent") == {"x", "y", "z"}  # B still has y
    assert t.drop_client("c2") == 2
    assert t.group_topics("g", "parent") == {"x"}
    assert len(t) == 2  # A's x, c3's w
    assert t.keys_of("c1") == {("g", "parent")}
    assert t.drop_client("c2") == 0


def test_the_client_quota_refuses_and_changes_nothing() -> None:
    t = LiteSubscriptions(client_quota=3, max_total=100)
    t.sync(A, v2.PARTIAL_ADD, ["a", "b"])
    with pytest.raises(LiteSubscriptionQuotaExceeded, match="3 per client"):
        t.sync(A, v2.PARTIAL_ADD, ["c", "d"])
    with pytest.raises(LiteSubscriptionQuotaExceeded):
        t.sync(A, v2.COMPLETE_ADD, ["1", "2", "3", "4"])
    assert t.of(A) == {"a", "b"} and len(t) == 2
    assert t.group_topics("g", "parent") == {"a", "b"}
    # removing, or a smaller set, always goes through
    assert t.sync(A, v2.COMPLETE_ADD, ["a"]) == 1
    assert t.sync(A, v2.PARTIAL_ADD, ["b", "c"]) == 3  # exactly the quota


def test_the_gateway_total_refuses_and_changes_nothing() -> None:
    t = LiteSubscriptions(client_quota=3, max_total=4)
    t.sync(A, v2.PARTIAL_ADD, ["a", "b", "c"])
    with pytest.raises(LiteSubscriptionQuotaExceeded, match="max_lite_subscriptions 4"):
        t.sync(B, v2.PARTIAL_ADD, ["a", "b"])
    assert t.of(B) == frozenset() and len(t) == 3
    assert t.sync(B, v2.PARTIAL_ADD, ["a"]) == 1  # the 4th
    t.drop_client("c1")
    assert t.sync(B, v2.PARTIAL_ADD, ["b", "c"]) == 3  # room again
    assert len(t) == 3


def test_the_bounds_are_positive() -> None:
    with pytest.raises(ValueError):
        LiteSubscriptions(client_quota=0, max_total=1)


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("device-1_A", True),
        ("x" * 64, True),
        ("x" * 65, False),
        ("", False),
        ("   ", False),
        ("a.b", False),
        ("a/b", False),
        ("中文", False),
        ("a b", False),
    ],
)
def test_lite_topic_names_follow_rocketmqs_proxy(name: str, ok: bool) -> None:
    if ok:
        check_lite_topic(name)
    else:
        with pytest.raises(IllegalLiteTopic):
            check_lite_topic(name)
    assert convert.code_for(IllegalLiteTopic("x")) == v2.ILLEGAL_LITE_TOPIC
    assert (
        convert.code_for(LiteSubscriptionQuotaExceeded("x")) == v2.LITE_SUBSCRIPTION_QUOTA_EXCEEDED
    )


def _lite(**sp: object) -> v2.Message:
    m = v2.Message(topic=v2.Resource(name="parent"), body=b"hello")
    m.system_properties.message_id = "01AB"
    for k, val in sp.items():
        setattr(m.system_properties, k, val)
    return m


def test_a_lite_message_carries_its_lite_topic_there_and_back() -> None:
    plan = convert.send_entry(_lite(message_type=v2.LITE, lite_topic="dev-1"), "parent")
    assert plan.entry.properties["__LITE_TOPIC"] == "dev-1"
    assert plan.lite_topic == "dev-1" and plan.message_group is None
    assert plan.topic_type is TopicMessageType.LITE
    # without a message type, the lite topic says it is LITE
    assert convert.send_entry(_lite(lite_topic="dev-2"), "parent").lite_topic == "dev-2"
    with pytest.raises(IllegalLiteTopic):
        convert.send_entry(_lite(message_type=v2.LITE, lite_topic="a.b"), "parent")
    with pytest.raises(IllegalLiteTopic):
        convert.send_entry(_lite(message_type=v2.LITE), "parent")
    with pytest.raises(MessageTypeConflict):
        convert.send_entry(_lite(message_type=v2.NORMAL, lite_topic="dev-1"), "parent")
    bad = _lite(message_type=v2.NORMAL)
    bad.user_properties["__LITE_TOPIC"] = "dev-1"  # not as a user property
    with pytest.raises(IllegalPropertyKey):
        convert.send_entry(bad, "parent")

    got = convert.message_to_v2(
        broker_pb2.Message(body=b"x", properties={"UNIQ_KEY": "01", "__LITE_TOPIC": "dev-1"}),
        topic="parent",
    )
    assert got.system_properties.lite_topic == "dev-1"
    assert got.system_properties.message_type == v2.LITE
    assert "__LITE_TOPIC" not in got.user_properties
    assert convert.accepted_types(TopicMessageType.LITE) == (v2.LITE,)


def test_the_broker_tells_a_lite_message_by_its_property() -> None:
    assert message_type_of({"__LITE_TOPIC": "x"}) is TopicMessageType.LITE
    assert TopicMessageType.parse("lite") is TopicMessageType.LITE
    assert not TopicMessageType.NORMAL.accepts(TopicMessageType.LITE)
    assert TopicMessageType.MIXED.accepts(TopicMessageType.LITE)


def test_the_lite_filter_selects_only_subscribed_lite_topics() -> None:
    plain = Selector.of_request([], "")
    assert plain.properties is None  # not a lite pop: no property filter
    lite = Selector.of_request([], "", ["a", "b"])
    assert lite.properties is not None
    assert lite.properties({"__LITE_TOPIC": "a"})
    assert not lite.properties({"__LITE_TOPIC": "c"})
    assert not lite.properties({})  # a message without a lite topic
    none = Selector.of_request([], "", [])
    assert none.properties is not None and not none.properties({"__LITE_TOPIC": "a"})
    both = Selector.of_request(["T1"], "", ["a"])
    assert both.tag_hashes is not None  # tags still by hash
    sql = Selector.of_request([], "n > 1", ["a"])
    assert sql.properties is not None
    assert sql.properties({"__LITE_TOPIC": "a", "n": "2"})
    assert not sql.properties({"__LITE_TOPIC": "a", "n": "0"})
    assert not sql.properties({"__LITE_TOPIC": "b", "n": "2"})
