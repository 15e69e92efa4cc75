"""Client message types and the client message-id generator."""

from __future__ import annotations

import os
import re
import threading
from typing import Any

import pytest

from ha_controller.client import (
    Message,
    MessageIdGenerator,
    ReceivedMessage,
    new_client_id,
    new_message_id,
)
from ha_controller.client.message import _ID_EPOCH_S

HEX34 = re.compile(r"^01[0-9A-F]{32}$")


def test_message_ids_are_unique_uppercase_hex_in_rocketmq5_layout() -> None:
    ids = [new_message_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert all(HEX34.match(i) for i in ids)


def test_message_id_fields() -> None:
    gen = MessageIdGenerator(node=0x1122334455667788, pid=0xABCDEF)
    mid = gen.next_id(now_s=_ID_EPOCH_S + 0x01020304)
    assert mid[:2] == "01"
    assert mid[2:14] == "334455667788"  # low 6 bytes of the MAC
    assert mid[14:18] == "CDEF"  # low 2 bytes of the pid
    assert mid[18:26] == "01020304"  # seconds since 2021-01-01
    nxt = gen.next_id(now_s=_ID_EPOCH_S + 0x01020304)
    assert int(nxt[26:], 16) == (int(mid[26:], 16) + 1) & 0xFFFFFFFF


def test_two_generators_with_the_same_host_and_pid_do_not_collide() -> None:
    a = MessageIdGenerator(node=1, pid=2)
    b = MessageIdGenerator(node=1, pid=2)
    ids_a = {a.next_id(now_s=_ID_EPOCH_S) for _ in range(1000)}
    ids_b = {b.next_id(now_s=_ID_EPOCH_S) for _ in range(1000)}
    # Random sequence starts: overlap needs the two starts within 1000 of 2**32.
    assert len(ids_a | ids_b) == 2000


def test_message_ids_are_unique_across_threads() -> None:
    gen = MessageIdGenerator()
    out: list[list[str]] = [[] for _ in range(4)]

    def work(i: int) -> None:
        out[i].extend(gen.next_id() for _ in range(5000))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [i for chunk in out for i in chunk]
    assert len(set(flat)) == len(flat) == 20_000


def test_client_id_format() -> None:
    host, pid, index, rand = new_client_id().split("@")
    assert host and rand and index.isdigit()
    assert int(pid) == os.getpid()
    assert new_client_id() != new_client_id()


def test_wire_properties_use_rocketmq_names() -> None:
    m = Message("T", b"x", tags="TagA", keys=["k1", "k2"], properties={"a": "b"})
    props = m.wire_properties("UK", "PG")
    assert props == {"a": "b", "UNIQ_KEY": "UK", "PGROUP": "PG", "TAGS": "TagA", "KEYS": "k1 k2"}
    assert Message("T", b"", delay_level=3).wire_properties("U", "G")["DELAY"] == "3"
    assert (
        Message("T", b"", deliver_ts_ms=123).wire_properties("U", "G")["TIMER_DELIVER_MS"] == "123"
    )
    assert Message("T", b"", message_group="g1").wire_properties("U", "G")["__SHARDINGKEY"] == "g1"
    assert Message("T", b"", keys="one").keys == ("one",)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"delay_level": 19},
        {"delay_level": -1},
        {"delay_level": 2, "deliver_ts_ms": 5},
        {"message_group": "g", "delay_level": 1},
        {"message_group": "g", "deliver_ts_ms": 1},
        {"message_group": ""},
        {"keys": ["has space"]},
        {"keys": [""]},
        {"properties": {"UNIQ_KEY": "x"}},
        {"tags": ""},
    ],
)
def test_invalid_messages_are_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Message("T", b"x", **kwargs)


def test_body_must_be_bytes() -> None:
    with pytest.raises(TypeError):
        Message("T", "text")  # type: ignore[arg-type]
    assert Message("T", bytearray(b"ab")).body == b"ab"  # type: ignore[arg-type]  # taken at run time


def test_received_message_derives_tags_keys_and_uniq_key() -> None:
    m = ReceivedMessage.from_properties(
        msg_id="OFFSETID",
        topic="T",
        broker_name="broker-a",
        queue_id=2,
        queue_offset=7,
        body=b"b",
        properties={"TAGS": "t", "KEYS": "a b", "UNIQ_KEY": "U1", "__SHARDINGKEY": "g"},
        born_ts_ms=1,
        store_ts_ms=2,
    )
    assert (m.tags, m.keys, m.uniq_key, m.key, m.message_group) == ("t", ("a", "b"), "U1", "a", "g")
    assert m.queue.queue_id == 2 and m.queue.broker_name == "broker-a"
    bare = ReceivedMessage.from_properties(
        msg_id="OID",
        topic="T",
        broker_name="b",
        queue_id=0,
        queue_offset=0,
        body=b"",
        properties={},
        born_ts_ms=0,
        store_ts_ms=0,
    )
    assert (bare.uniq_key, bare.tags, bare.keys, bare.key) == ("OID", None, (), "OID")
