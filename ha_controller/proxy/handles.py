"""What the gateway hands to v2 clients and gets back: receipt handles,
transaction ids, recall handles.  Plain objects, no I/O.

A v2 client sends back only opaque strings and never a broker address.  A receipt
handle and a recall handle carry what the gateway needs to find the broker again, so
any gateway instance reads them.  A transaction id is the message id, as with RocketMQ
(the SDKs compare the two); where its half message is (:class:`TransactionId`) the
gateway keeps in memory, as RocketMQ's proxy does (``ha_controller.proxy.transactions``).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Final

from ha_controller.protocol.errors import BadRequest

__all__ = [
    "GatewayHandle",
    "InvalidHandle",
    "RecallHandle",
    "TX_PREFIX",
    "TransactionId",
]

_HANDLE_PREFIX: Final = "h1."
TX_PREFIX: Final = "t1."


class InvalidHandle(BadRequest):
    """A receipt handle or transaction id the gateway did not issue (v2
    ``INVALID_RECEIPT_HANDLE`` / ``INVALID_TRANSACTION_ID``); travels as BadRequest."""


def _pack(prefix: str, fields: list[object]) -> str:
    raw = json.dumps(fields, separators=(",", ":")).encode()
    return prefix + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unpack(prefix: str, text: str, what: str) -> list[object]:
    if not text.startswith(prefix):
        raise InvalidHandle(f"not a {what} issued by this gateway: {text[:40]!r}")
    body = text[len(prefix) :]
    try:
        data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (binascii.Error, ValueError) as exc:
        raise InvalidHandle(f"undecodable {what}") from exc
    if not isinstance(data, list):
        raise InvalidHandle(f"undecodable {what}")
    return data


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class GatewayHandle:
    """The v2 receipt handle: which group and topic a message was popped from
    (``pop_topic`` is the topic or ``%RETRY%{group}``) and the broker's own POP
    handle, which the broker checks."""

    broker_name: str
    pop_topic: str
    queue_id: int
    queue_offset: int
    broker_handle: str
    invisible_until_ms: int

    def encode(self) -> str:
        return _pack(
            _HANDLE_PREFIX,
            [
                self.broker_name,
                self.pop_topic,
                self.queue_id,
                self.queue_offset,
                self.broker_handle,
                self.invisible_until_ms,
            ],
        )

    @classmethod
    def decode(cls, text: str) -> GatewayHandle:
        data = _unpack(_HANDLE_PREFIX, text, "receipt handle")
        try:
            name, topic, qid, offset, handle, until = data
            return cls(_str(name), _str(topic), _int(qid), _int(offset), _str(handle), _int(until))
        except (TypeError, ValueError) as exc:
            raise InvalidHandle("malformed receipt handle") from exc


@dataclass(frozen=True, slots=True)
class TransactionId:
    """Where a half message is (group, half-queue offset, commit-log offset) and the
    broker's transaction id (UNIQ_KEY).  Before transaction ids were message ids, its
    encoding was the v2 transaction id; it is still read as one."""

    broker_name: str
    half_offset: int
    commit_log_offset: int
    uniq_key: str

    def encode(self) -> str:
        return _pack(
            TX_PREFIX,
            [self.broker_name, self.half_offset, self.commit_log_offset, self.uniq_key],
        )

    @classmethod
    def decode(cls, text: str) -> TransactionId:
        data = _unpack(TX_PREFIX, text, "transaction id")
        try:
            name, half, clo, uniq = data
            return cls(_str(name), _int(half), _int(clo), _str(uniq))
        except (TypeError, ValueError) as exc:
            raise InvalidHandle("malformed transaction id") from exc


@dataclass(frozen=True, slots=True)
class RecallHandle:
    """RocketMQ 5.3's recall handle (RecallMessageHandle.HandleV1): URL-safe base64
    of ``v1 topic brokerName deliverMs messageId``, so a handle issued by a RocketMQ
    proxy and ours read the same."""

    topic: str
    broker_name: str
    deliver_ms: int
    message_id: str

    def encode(self) -> str:
        raw = " ".join(["v1", self.topic, self.broker_name, str(self.deliver_ms), self.message_id])
        return base64.urlsafe_b64encode(raw.encode()).decode()

    @classmethod
    def decode(cls, text: str) -> RecallHandle:
        if not text:
            raise InvalidHandle("the recall handle is empty")
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        except (binascii.Error, ValueError) as exc:
            raise InvalidHandle("undecodable recall handle") from exc
        items = raw.split(" ")
        if len(items) < 5 or items[0] != "v1" or not all(items[1:5]):
            raise InvalidHandle(f"not a v1 recall handle: {raw[:60]!r}")
        try:
            deliver_ms = int(items[3])
        except ValueError as exc:
            raise InvalidHandle(f"recall handle with a bad timestamp {items[3][:20]!r}") from exc
        return cls(items[1], items[2], deliver_ms, items[4])
