"""v2 clients known to the gateway: their type, topics or group, and the
telemetry stream on which the gateway can reach them.  Plain objects, no I/O:
the servicer feeds them and drains the outboxes."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

log = logging.getLogger(__name__)

#: A client neither heartbeating nor streaming for this long is forgotten
#: (the SDKs heartbeat every 10 s).
SESSION_EXPIRY_S: Final = 60.0
#: Commands queued for one client at most; more are dropped (the broker re-checks).
OUTBOX_LIMIT: Final = 1024

T = TypeVar("T")

PRODUCER: Final = "producer"
CONSUMER: Final = "consumer"


@dataclass
class Session(Generic[T]):
    client_id: str
    kind: str = ""  # PRODUCER | CONSUMER | "" (not told yet)
    topics: frozenset[str] = frozenset()
    group: str = ""
    #: a lite consumer (LITE_PUSH_CONSUMER, LITE_SIMPLE_CONSUMER): its receives are lite
    lite: bool = False
    last_seen: float = field(default_factory=time.monotonic)
    streams: int = 0
    outbox: list[T] = field(default_factory=list)

    @property
    def reachable(self) -> bool:
        return self.streams > 0


class Sessions(Generic[T]):
    """client id -> Session; ``push`` queues a command for a client's stream and
    calls ``wake`` so its stream writer sends it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._by_id: dict[str, Session[T]] = {}
        self.wakers: dict[str, Callable[[], None]] = {}

    def get(self, client_id: str) -> Session[T]:
        s = self._by_id.get(client_id)
        if s is None:
            s = self._by_id[client_id] = Session(client_id)
        s.last_seen = self._clock()
        return s

    def find(self, client_id: str) -> Session[T] | None:
        return self._by_id.get(client_id)

    def remove(self, client_id: str) -> None:
        self._by_id.pop(client_id, None)
        self.wakers.pop(client_id, None)

    def expire(self) -> list[str]:
        now = self._clock()
        gone = [
            cid
            for cid, s in self._by_id.items()
            if not s.reachable and now - s.last_seen > SESSION_EXPIRY_S
        ]
        for cid in gone:
            self.remove(cid)
        return gone

    def producer_topics(self) -> set[str]:
        return {t for s in self._by_id.values() if s.kind == PRODUCER for t in s.topics}

    def consumer_groups(self) -> set[str]:
        return {s.group for s in self._by_id.values() if s.kind == CONSUMER and s.group}

    def count(self, kind: str) -> int:
        return sum(1 for s in self._by_id.values() if s.kind == kind and s.reachable)

    def producers_for(self, topic: str, prefer: str | None = None) -> list[Session[T]]:
        """Reachable producers of ``topic``: ``prefer`` (the client that sent the
        half message) first, then the most recently seen."""
        out = [
            s
            for s in self._by_id.values()
            if s.kind == PRODUCER and s.reachable and (topic in s.topics or not s.topics)
        ]
        out.sort(key=lambda s: (s.client_id != prefer, -s.last_seen))
        return out

    def push(self, session: Session[T], command: T) -> bool:
        if len(session.outbox) >= OUTBOX_LIMIT:
            log.warning("outbox of %s is full: command dropped", session.client_id)
            return False
        session.outbox.append(command)
        waker = self.wakers.get(session.client_id)
        if waker is not None:
            waker()
        return True


class BoundedMap(OrderedDict[str, str]):
    """A small LRU map (transaction id -> client id that sent it)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: str, value: str) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)
