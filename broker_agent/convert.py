"""Stored messages to and from their wire form (``broker_pb2.Message``): one place."""

from __future__ import annotations

from collections.abc import Mapping

from ha_controller.proto import broker_pb2
from ha_controller.protocol.record import StoredMessage, make_msg_id


def message_to_pb(
    m: StoredMessage,
    broker_name: str,
    *,
    properties: Mapping[str, str] | None = None,
    reconsume_times: int = 0,
) -> broker_pb2.Message:
    """The wire form of a stored message; ``properties`` replaces the stored ones
    (POP adds its receipt handle)."""
    return broker_pb2.Message(
        topic=m.topic,
        body=m.body,
        properties=m.properties if properties is None else properties,
        queue_id=m.queue_id,
        queue_offset=m.queue_offset,
        commit_log_offset=m.physical_offset,
        msg_id=make_msg_id(m.store_host, m.physical_offset),
        born_ts_ms=m.born_ts_ms,
        born_host=m.born_host,
        store_ts_ms=m.store_ts_ms,
        store_host=m.store_host,
        broker_name=broker_name,
        reconsume_times=reconsume_times,
        flag=m.flags,
    )


def message_from_pb(m: broker_pb2.Message) -> StoredMessage:
    """A message read back from another broker (escape bridge), as if stored here."""
    return StoredMessage(
        topic=m.topic,
        queue_id=m.queue_id,
        body=m.body,
        properties=dict(m.properties),
        flags=m.flag,
        born_ts_ms=m.born_ts_ms,
        born_host=m.born_host,
        store_host=m.store_host,
        queue_offset=m.queue_offset,
        physical_offset=m.commit_log_offset,
        store_ts_ms=m.store_ts_ms,
    )
