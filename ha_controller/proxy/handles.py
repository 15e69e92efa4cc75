"""What the gateway hands to v2 clients and gets back: receipt handles and
transaction ids, plus the gateway-side FIFO queue locks.  Plain objects, no I/O.

A v2 client sends back only opaque strings (``receipt_handle``,
``transaction_id``) and never a broker address, so each string carries what the
gateway needs to find the broker again; nothing is kept in gateway memory that a
gateway restart could lose.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from ha_controller.protocol.errors import BadRequest
from ha_controller.protocol.properties import now_ms

__all__ = [
    "FifoLocks",
    "GatewayHandle",
    "InvalidHandle",
    "TransactionId",
]

_HANDLE_PREFIX: Final = "h1."
_TX_PREFIX: Final = "t1."


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
    """The v2 transaction id: where the half message is (group, half-queue
    offset, commit-log offset) and the broker's transaction id (UNIQ_KEY)."""

    broker_name: str
    half_offset: int
    commit_log_offset: int
    uniq_key: str

    def encode(self) -> str:
        return _pack(
            _TX_PREFIX,
            [self.broker_name, self.half_offset, self.commit_log_offset, self.uniq_key],
        )

    @classmethod
    def decode(cls, text: str) -> TransactionId:
        data = _unpack(_TX_PREFIX, text, "transaction id")
        try:
            name, half, clo, uniq = data
            return cls(_str(name), _int(half), _int(clo), _str(uniq))
        except (TypeError, ValueError) as exc:
            raise InvalidHandle("malformed transaction id") from exc


@dataclass(slots=True)
class _Lock:
    outstanding: set[int] = field(default_factory=set)
    until_ms: int = 0


class FifoLocks:
    """Gateway-side ordered consumption for FIFO consumer groups.

    Our broker's POP has no "orderly" mode, so the gateway gives a (group, broker,
    topic, queue) to one receive at a time: a queue is locked from the pop of a
    batch until every message of it is acked (or forwarded to the DLQ), or until
    its invisible time is over (then the broker's revive re-delivers through the
    retry topic, and order is not kept for those messages).
    """

    def __init__(self, clock_ms: Callable[[], int] | None = None) -> None:
        self._clock = clock_ms or now_ms
        self._locks: dict[tuple[str, str, str, int], _Lock] = {}

    def locked(self, group: str, broker: str, topic: str, queue_id: int) -> bool:
        key = (group, broker, topic, queue_id)
        lock = self._locks.get(key)
        if lock is None:
            return False
        if not lock.outstanding or lock.until_ms <= self._clock():
            del self._locks[key]
            return False
        return True

    def lock(
        self, group: str, broker: str, topic: str, queue_id: int, offsets: list[int], until_ms: int
    ) -> None:
        if offsets:
            self._locks[(group, broker, topic, queue_id)] = _Lock(set(offsets), until_ms)

    def extend(
        self, group: str, broker: str, topic: str, queue_id: int, offset: int, until_ms: int
    ) -> None:
        lock = self._locks.get((group, broker, topic, queue_id))
        if lock is not None and offset in lock.outstanding:
            lock.until_ms = max(lock.until_ms, until_ms)

    def release(self, group: str, broker: str, topic: str, queue_id: int, offset: int) -> bool:
        """One message is done; returns True when that unlocked the queue."""
        key = (group, broker, topic, queue_id)
        lock = self._locks.get(key)
        if lock is None:
            return False
        lock.outstanding.discard(offset)
        if lock.outstanding:
            return False
        del self._locks[key]
        return True

    def __len__(self) -> int:
        return len(self._locks)
