"""Invisible-time auto-renewal for push consumers (RocketMQ 5 proxy's
ReceiptHandleProcessor / DefaultReceiptHandleManager idea).  Plain objects, no I/O:
the servicer feeds the table and makes the CHANGE_MESSAGE_INVISIBLETIME calls.

A push consumer asks for it (``ReceiveMessageRequest.auto_renew``): every message it
receives is renewed shortly before its invisible time runs out, for as long as it is
being consumed, so a listener slower than the invisible time does not see it twice.
Renewal stops when

- the message is acked, nacked (ChangeInvisibleDuration) or sent to the DLQ;
- the client goes away: it said so (NotifyClientTermination), or it has no telemetry
  stream and sent nothing for :data:`CLIENT_GONE_S` (a dead process) — its messages
  are then redelivered when their current invisible time is over;
- the message was renewed for :data:`RENEW_MAX_MS` in all (a stuck listener), or the
  renewal failed :data:`MAX_FAILURES` times in a row.

Each renewal moves the broker's receipt handle on (a new checkpoint, the old one
acked), while the client keeps the handle it received: an ack or nack of a renewed
message goes to the broker with the newest handle, found here by the message's place
(group, group name of the broker, popped topic, queue, offset).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ha_controller.proxy.handles import GatewayHandle

__all__ = [
    "CLIENT_GONE_S",
    "MAX_FAILURES",
    "MAX_RENEWING",
    "RENEW_AHEAD_MS",
    "RENEW_MAX_MS",
    "Renewal",
    "RenewalTable",
]

#: Renew when the invisible time has at most this long to go (RocketMQ
#: renewAheadTimeMillis), or half the message's invisible time when that is shorter.
RENEW_AHEAD_MS: Final = 10_000
#: A message is renewed for at most this long after it was received (RocketMQ's
#: renewMaxTimeMillis, 3 h): a listener stuck longer gets it redelivered.
RENEW_MAX_MS: Final = 3 * 3600 * 1000
#: Messages renewed at once at most; more are not renewed (and counted).
MAX_RENEWING: Final = 100_000
#: A client with no telemetry stream that sent nothing for this long is gone (the SDKs
#: heartbeat every 10 s and a push consumer long-polls continuously).
CLIENT_GONE_S: Final = 12.0
#: Consecutive failed renewals after which a message is left to its invisible time.
MAX_FAILURES: Final = 3

Key = tuple[str, str, str, int, int]  # group, broker name, popped topic, queue, offset


def key_of(group: str, handle: GatewayHandle) -> Key:
    return (group, handle.broker_name, handle.pop_topic, handle.queue_id, handle.queue_offset)


@dataclass(slots=True)
class Renewal:
    """One message being consumed by a push consumer."""

    client_id: str
    group: str
    topic: str  # the message's topic (the route to find its group by)
    handle: GatewayHandle  # the newest: its broker handle is the one the broker knows
    invisible_ms: int  # each renewal makes it invisible this long again
    received_ms: int
    failures: int = 0
    in_flight: bool = False

    @property
    def key(self) -> Key:
        return key_of(self.group, self.handle)

    def ahead_ms(self) -> int:
        return min(RENEW_AHEAD_MS, self.invisible_ms // 2)


class RenewalTable:
    """Messages handed to push consumers that asked for auto-renewal, by place."""

    def __init__(self, clock_ms: Callable[[], int] | None = None) -> None:
        self._clock = clock_ms or (lambda: int(time.time() * 1000))
        self._by_key: dict[Key, Renewal] = {}
        #: messages not tracked because the table was full
        self.overflowed = 0

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def add(
        self, client_id: str, group: str, topic: str, handle: GatewayHandle, invisible_ms: int
    ) -> bool:
        """Track one received message; False when the table is full."""
        key = key_of(group, handle)
        if key not in self._by_key and len(self._by_key) >= MAX_RENEWING:
            self.overflowed += 1
            return False
        self._by_key[key] = Renewal(
            client_id, group, topic, handle, invisible_ms, received_ms=self._clock()
        )
        return True

    def take(self, group: str, handle: GatewayHandle) -> GatewayHandle:
        """The message is done (ack, nack, DLQ): stop renewing it, and return the
        handle to use for it — the newest one when it was renewed."""
        r = self._by_key.pop(key_of(group, handle), None)
        return handle if r is None else r.handle

    def due(self, alive: Callable[[str], bool]) -> list[Renewal]:
        """The renewals to make now (marked in flight); drops what is over its bound,
        failed too often, or belongs to a client that is gone."""
        now = self._clock()
        out: list[Renewal] = []
        for key, r in list(self._by_key.items()):
            if r.in_flight:
                continue
            if (
                not alive(r.client_id)
                or now - r.received_ms >= RENEW_MAX_MS
                or r.failures >= MAX_FAILURES
                or r.handle.invisible_until_ms <= now  # too late: it is visible again
            ):
                del self._by_key[key]
                continue
            if r.handle.invisible_until_ms - now <= r.ahead_ms():
                r.in_flight = True
                out.append(r)
        return out

    def renewed(self, r: Renewal, handle: GatewayHandle | None) -> None:
        """The outcome of one renewal: the new handle, or None when it failed.  A
        message acked while its renewal was in flight stays dropped."""
        r.in_flight = False
        if self._by_key.get(r.key) is not r:
            return
        if handle is None:
            r.failures += 1
            return
        r.failures = 0
        r.handle = handle

    def drop_client(self, client_id: str) -> int:
        gone = [k for k, r in self._by_key.items() if r.client_id == client_id]
        for k in gone:
            del self._by_key[k]
        return len(gone)
