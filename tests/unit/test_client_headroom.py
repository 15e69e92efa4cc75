"""A client's message leaves room for what the brokers add when they hand it on.

Found by attacking the escape path: a delayed message whose schedule record was within
a few dozen bytes of ``max_message_bytes`` could be stored, but not escaped (the escape
adds ``ESCAPE_ID`` and the escaping broker's address): the target refused it as too
large, the acting slave retried it for ever, and its whole delay level waited behind
it.  POP retries add more (their retry topic and origin).  So a client's message must
leave :data:`CLIENT_HEADROOM_BYTES` of the largest record, and every message the brokers
derive from one that fits, with the longest names the cluster accepts, must fit in it.
The largest record is a body of ``max_message_bytes`` and 64 KiB more (RocketMQ's store
counts the body alone against maxMessageSize): the messages here reach it with a
property, their bodies stay small.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_agent.core import BrokerCore
from broker_agent.special.escape_ids import escape_id
from broker_agent.special.pop import Checkpoint
from broker_agent.special.pop.revive import retry_properties
from broker_agent.special.schedule import delayed_target, restored
from broker_agent.store.message_store import PutRequest
from broker_agent.write_path import CLIENT_HEADROOM_BYTES, WritePath
from ha_controller.config import BrokerConfig
from ha_controller.protocol.errors import BadRequest, MessageTooLarge
from ha_controller.protocol.properties import PROPERTY_ESCAPE_ID, retry_topic
from ha_controller.protocol.record import StoredMessage, encoded_size
from ha_controller.protocol.topics import GROUP_NAME_MAX_LEN, TOPIC_NAME_MAX_LEN
from ha_controller.protocol.validation import RECORD_ALLOWANCE_BYTES

LIMIT = 8192  # max_message_bytes: the body
RECORD = LIMIT + RECORD_ALLOWANCE_BYTES  # the largest record (segments are 64 MiB)
BODY = 16
BROKER = "b" * 127  # the longest broker name a config accepts
GROUP = "g" * GROUP_NAME_MAX_LEN
TOPIC = "t" * TOPIC_NAME_MAX_LEN
CLIENT_HOST = "10.0.0.1:1"  # short: the escaping broker's address is longer
BROKER_HOST = "[fd00:aaaa:bbbb:cccc:dddd:eeee:ffff:1111]:10911"


@pytest.fixture
def write_path(tmp_path: Path) -> WritePath:
    return WritePath(
        BrokerCore(
            BrokerConfig(
                cluster="c",
                broker_name=BROKER,
                broker_id=0,
                namesrv_addrs=("127.0.0.1:1",),
                store_dir=str(tmp_path / "store"),
                max_message_bytes=LIMIT,
            )
        )
    )


def _request(topic: str, body_len: int, props: dict[str, str]) -> PutRequest:
    return PutRequest(topic, 0, b"x" * body_len, props, 0, None, CLIENT_HOST, BROKER_HOST)


def _size(r: PutRequest) -> int:
    return encoded_size(
        StoredMessage(
            r.topic,
            r.queue_id,
            r.body,
            dict(r.properties or {}),
            born_host=r.born_host,
            store_host=r.store_host,
        )
    )


def _stored(topic: str, queue_id: int, body: bytes, props: dict[str, str]) -> StoredMessage:
    """As the first broker stored it, with the longest offsets and times."""
    return StoredMessage(
        topic,
        queue_id,
        body,
        dict(props),
        born_host=CLIENT_HOST,
        store_host=BROKER_HOST,
        physical_offset=2**62,
        store_ts_ms=2**42,
    )


def _at_client_limit(topic: str, props: dict[str, str], extra: int = 0) -> PutRequest:
    """The largest message with ``props`` that a client may send (``extra`` bytes more):
    a small body and a property that fills the record."""
    base = _request(topic, BODY, {**props, "filler": ""})
    need = RECORD - CLIENT_HEADROOM_BYTES - _size(base) + extra
    return _request(topic, BODY, {**props, "filler": "x" * need})


def test_a_client_message_must_leave_the_headroom(write_path: WritePath) -> None:
    assert write_path.core.cfg.max_record_bytes == RECORD
    props = {"UNIQ_KEY": "u" * 32, "KEYS": "é" * 10}  # not ASCII: sized in bytes
    largest = _at_client_limit(TOPIC, props)
    assert _size(largest) == RECORD - CLIENT_HEADROOM_BYTES
    write_path.check_client_size([_request(TOPIC, 10, props), largest])
    too_large = _at_client_limit(TOPIC, props, extra=1)
    with pytest.raises(MessageTooLarge, match=f"exceeds {RECORD - CLIENT_HEADROOM_BYTES}"):
        write_path.check_client_size([_request(TOPIC, 10, props), too_large])
    assert issubclass(MessageTooLarge, BadRequest)


def test_the_body_alone_counts_against_max_message_bytes(write_path: WritePath) -> None:
    """As RocketMQ: a body of max_message_bytes is taken with properties on top, one
    byte more is refused."""
    props = {"UNIQ_KEY": "u" * 32, "p": "v" * 16_000}
    write_path.check_client_size([_request(TOPIC, LIMIT, props)])
    with pytest.raises(MessageTooLarge, match="body"):
        write_path.check_client_size([_request(TOPIC, LIMIT + 1, props)])


def test_a_delayed_message_at_the_limit_can_still_be_escaped(write_path: WritePath) -> None:
    cfg = write_path.core.cfg
    props = {"UNIQ_KEY": "u" * 32, "DELAY": "3"}
    schedule_topic, qid = delayed_target(cfg, TOPIC, 0, props)  # props rewritten in place
    sent = _at_client_limit(schedule_topic, props)
    write_path.check_client_size([sent])
    stored = _stored(schedule_topic, qid, sent.body, dict(sent.properties or {}))
    target = restored(stored)
    assert target is not None
    topic, _qid, out = target
    out[PROPERTY_ESCAPE_ID] = escape_id(BROKER, "timer", stored)
    escaped = _request(topic, len(sent.body), out)._replace(born_host=BROKER_HOST)
    assert _size(escaped) <= RECORD


def test_a_pop_retry_of_a_message_at_the_limit_can_still_be_escaped(
    write_path: WritePath,
) -> None:
    props = {"UNIQ_KEY": "u" * 32}
    sent = _at_client_limit("t", props)  # a short topic: the retry topic is long
    write_path.check_client_size([sent])
    stored = _stored("t", 0, sent.body, dict(sent.properties or {}))
    ck = Checkpoint(
        broker_name=BROKER,
        group=GROUP,
        topic="t",
        queue_id=2**31 - 1,
        start_offset=2**62,
        offsets=(2**62,),
        pop_time_ms=2**42,
        invisible_ms=60_000,
        due_ms=2**42,
        reput_times=0,
    )
    out = retry_properties(stored, ck)
    out[PROPERTY_ESCAPE_ID] = escape_id(BROKER, "pop_retry", stored, ck.key)
    retry = _request(retry_topic(GROUP), len(sent.body), out)._replace(born_host=BROKER_HOST)
    assert _size(retry) <= RECORD
