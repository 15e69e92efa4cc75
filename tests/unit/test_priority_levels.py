"""Priority messages (RIP-80) without sockets: a priority is a queue, clamped to the
topic's write queues; a PRIORITY topic is popped highest queue first; a send's batch
takes one level; the SDK's and the gateway's conversions."""

from __future__ import annotations

import pytest

from broker_agent.handlers.messages import priority_queue
from ha_controller.client.message import Message
from ha_controller.proto import broker_pb2
from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
from ha_controller.protocol.errors import BadRequest
from ha_controller.protocol.priority import pop_order, priority_of, queue_for_priority
from ha_controller.protocol.properties import PROPERTY_PRIORITY, PROPERTY_TIMER_DELIVER_MS
from ha_controller.protocol.topics import TopicMessageType, message_type_of
from ha_controller.proxy import convert
from ha_controller.routing import TopicConfig

P = PROPERTY_PRIORITY
TOPIC = TopicConfig("T", 4, 4, message_type=TopicMessageType.PRIORITY)


def _entry(**props: str) -> broker_pb2.SendEntry:
    return broker_pb2.SendEntry(body=b"x", properties=props)


def test_a_priority_is_its_queue_clamped_to_the_highest() -> None:
    assert [queue_for_priority(p, 4) for p in (0, 1, 3, 4, 100)] == [0, 1, 3, 3, 3]
    assert queue_for_priority(7, 1) == 0


def test_a_priority_pop_visits_the_highest_queue_first() -> None:
    assert pop_order([0, 1, 2, 3], 5, priority=True) == [3, 2, 1, 0]
    # others go round robin from the start position
    assert pop_order([0, 1, 2, 3], 5, priority=False) == [1, 2, 3, 0]
    assert pop_order([2, 0, 5], 0, priority=True) == [5, 2, 0]  # an acting slave's stored ids


@pytest.mark.parametrize("text", ["-1", "x", "1.5", "", "٣"])
def test_a_bad_priority_property_is_refused(text: str) -> None:
    with pytest.raises(BadRequest):
        priority_of({P: text})
    assert priority_of({}) is None


def test_a_send_goes_to_its_levels_queue_whatever_the_producer_picked() -> None:
    assert priority_queue(TOPIC, [_entry(**{P: "2"}), _entry(**{P: "2"})]) == 2
    assert priority_queue(TOPIC, [_entry(**{P: "9"})]) == 3
    assert priority_queue(TOPIC, [_entry()]) is None


def test_a_batch_mixing_levels_is_refused_before_anything_is_stored() -> None:
    with pytest.raises(BadRequest, match="mixes priority levels"):
        priority_queue(TOPIC, [_entry(**{P: "1"}), _entry(**{P: "2"})])
    with pytest.raises(BadRequest, match="without a priority"):
        priority_queue(TOPIC, [_entry(**{P: "1"}), _entry()])


def test_a_priority_on_another_kind_is_dropped() -> None:
    delayed = _entry(**{P: "3", PROPERTY_TIMER_DELIVER_MS: "1800000000000"})
    assert message_type_of(delayed.properties) is TopicMessageType.DELAY
    assert priority_queue(TOPIC, [delayed]) is None
    assert P not in delayed.properties


def test_the_sdk_message_carries_its_priority() -> None:
    m = Message("T", b"x", priority=0)
    assert m.wire_properties("U", "G")[P] == "0"
    assert P not in Message("T", b"x").wire_properties("U", "G")
    with pytest.raises(ValueError, match=">= 0"):
        Message("T", b"x", priority=-1)
    with pytest.raises(ValueError, match="FIFO or delayed"):
        Message("T", b"x", priority=1, message_group="g")
    with pytest.raises(ValueError, match="FIFO or delayed"):
        Message("T", b"x", priority=1, delay_level=2)
    with pytest.raises(ValueError, match="reserved"):
        Message("T", b"x", properties={P: "1"})


def _v2(**sp: object) -> v2.Message:
    m = v2.Message(topic=v2.Resource(name="T"), body=b"x")
    m.system_properties.message_id = "01AB"
    for k, val in sp.items():
        setattr(m.system_properties, k, val)
    return m


def test_the_gateway_keeps_a_priority_whatever_the_declared_type() -> None:
    # Node.js SDK 1.0.8 declares a priority-0 message NORMAL: the property tells
    plan = convert.send_entry(_v2(message_type=v2.NORMAL, priority=0), "T")
    assert plan.entry.properties[P] == "0"
    assert plan.topic_type is TopicMessageType.PRIORITY
    # declared PRIORITY with no priority: a NORMAL message (the topic check refuses it)
    plan = convert.send_entry(_v2(message_type=v2.PRIORITY), "T")
    assert plan.topic_type is TopicMessageType.NORMAL
    with pytest.raises(BadRequest, match=">= 0"):
        convert.send_entry(_v2(message_type=v2.PRIORITY, priority=-1), "T")
    # and back: a received priority message says its priority
    got = convert.message_to_v2(
        broker_pb2.Message(topic="T", body=b"x", properties={P: "5"}), topic="T"
    )
    assert got.system_properties.priority == 5
    assert got.system_properties.message_type == v2.PRIORITY
