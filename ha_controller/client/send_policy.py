"""How a producer picks where a send goes and when it gives an attempt up: which errors
are retried elsewhere, endpoint isolation, per-endpoint adaptive timeouts, the round
robin over publish queues (and a FIFO message group's own queue), and the sends in flight
to a controlled group's master that a newer epoch ends.  Plain objects: no I/O.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence

from ha_controller.client.message import MessageQueue
from ha_controller.client.siphash import queue_for_message_group
from ha_controller.protocol.errors import HaError, NotMaster, TopicNotFound

__all__ = [
    "AdaptiveTimeout",
    "EndpointIsolation",
    "InFlightSends",
    "MasterMoved",
    "QueueSelector",
    "is_retriable",
]


def is_retriable(exc: BaseException) -> bool:
    """Whether a send that failed with ``exc`` may be retried on another queue.

    Retriable errors plus ``TopicNotFound`` from a broker (a stale route; RocketMQ's
    producer retries TOPIC_NOT_EXIST too) and plain socket errors.
    """
    if isinstance(exc, HaError):
        return exc.retriable or isinstance(exc, TopicNotFound)
    return isinstance(exc, OSError)


class EndpointIsolation:
    """Endpoints (broker addresses) that recently failed, each for ``isolation_s``.

    The Java client keeps an endpoint isolated until a heartbeat to it succeeds;
    we do that too and also let the isolation lapse after ``isolation_s``.
    """

    def __init__(self, isolation_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.isolation_s = isolation_s
        self._clock = clock
        self._until: dict[str, float] = {}

    def isolate(self, addr: str) -> None:
        self._until[addr] = self._clock() + self.isolation_s

    def release(self, addr: str) -> None:
        self._until.pop(addr, None)

    def is_isolated(self, addr: str | None) -> bool:
        if addr is None:
            return False
        until = self._until.get(addr)
        if until is None:
            return False
        if self._clock() >= until:
            del self._until[addr]
            return False
        return True

    def isolated(self) -> set[str]:
        return {addr for addr in list(self._until) if self.is_isolated(addr)}

    def any(self) -> bool:
        """Whether some endpoint may be isolated (cheap; lapsed entries count until looked at)."""
        return bool(self._until)


class MasterMoved(NotMaster):
    """A send in flight to a group's master was abandoned: the route showed that group
    under a newer epoch with another master (controller mode).  Retriable: the next
    attempt goes to the new master of the same group."""


class InFlightSends:
    """The sends in flight to each controlled group's master, with the epoch and the
    address they went to, so that a route showing a newer epoch with another master
    ends them at once (:meth:`superseded`) instead of leaving them to their timeout.

    A frozen or cut-off master answers nothing; without this, each send in flight to it
    waits for its connection's liveness check or its timeout (about 3 s) although the
    controller elected a new master after the not-active timeout (2 s).  Ending a send
    early is no new risk: it is what its timeout does later, and the retry that follows
    is the one the timeout would have made.  Plain object: no I/O, no clock."""

    def __init__(self) -> None:
        self._by_group: dict[str, dict[int, tuple[int, str, asyncio.Timeout]]] = {}
        self._serial = 0

    def add(self, group: str, epoch: int, addr: str, timeout: asyncio.Timeout) -> int:
        """Register a send to ``group``'s master ``addr`` in ``epoch``; returns its key."""
        self._serial += 1
        self._by_group.setdefault(group, {})[self._serial] = (epoch, addr, timeout)
        return self._serial

    def discard(self, group: str, key: int) -> None:
        sends = self._by_group.get(group)
        if sends is not None:
            sends.pop(key, None)
            if not sends:
                del self._by_group[group]

    def superseded(self, group: str, epoch: int, addr: str | None, now: float) -> int:
        """``group``'s master is now ``addr`` in ``epoch``: expire (at ``now``, loop
        time) every send that went to another address in an older epoch; how many.
        With no master shown yet (``addr`` None) nothing ends: there is nowhere to send
        again, and ending a send would only spend one of its attempts."""
        if addr is None:
            return 0
        ended = 0
        for old_epoch, old_addr, timeout in self._by_group.get(group, {}).values():
            if old_epoch < epoch and old_addr != addr and not timeout.expired():
                timeout.reschedule(now)
                ended += 1
        return ended

    def __len__(self) -> int:
        return sum(len(s) for s in self._by_group.values())


class AdaptiveTimeout:
    """Per-attempt send timeouts from the latency each endpoint showed recently.

    A frozen broker (SIGSTOP, a stuck disk) keeps its TCP connections open and
    answers nothing, so a producer that waits out the whole send timeout on it
    stalls for seconds although another group could take the message at once.
    RocketMQ's latency fault tolerance answers this with per-broker latency;
    here each endpoint keeps its last ``window`` round-trip times and an
    attempt that has somewhere else to go gets

        timeout = clamp(factor x p99(recent RTTs), floor_ms, ceiling_ms)

    (the ceiling is the producer's send timeout).  Until ``min_samples``
    RTTs are known the ceiling applies.  Timed-out attempts are not samples:
    a silent endpoint must not teach us to wait longer for it.  The p99 is
    recomputed every ``refresh_every`` samples, not per send.  A plain
    object: no clock, no I/O.
    """

    def __init__(
        self,
        *,
        factor: float = 5.0,
        floor_ms: int = 200,
        window: int = 256,
        min_samples: int = 20,
        refresh_every: int = 16,
    ) -> None:
        if factor < 1.0:
            raise ValueError(f"factor must be >= 1, got {factor}")
        if floor_ms <= 0:
            raise ValueError(f"floor_ms must be positive, got {floor_ms}")
        if window < 1 or not 1 <= min_samples <= window:
            raise ValueError(f"need 1 <= min_samples ({min_samples}) <= window ({window})")
        if refresh_every < 1:
            raise ValueError(f"refresh_every must be >= 1, got {refresh_every}")
        self.factor = factor
        self.floor_ms = floor_ms
        self.window = window
        self.min_samples = min_samples
        self.refresh_every = refresh_every
        self._rtts: dict[str, deque[float]] = {}
        self._since: dict[str, int] = {}
        self._p99: dict[str, float] = {}

    def observe(self, addr: str, rtt_ms: float) -> None:
        """One successful round trip to ``addr`` took ``rtt_ms``."""
        rtts = self._rtts.get(addr)
        if rtts is None:
            rtts = self._rtts[addr] = deque(maxlen=self.window)
            self._since[addr] = 0
        rtts.append(rtt_ms)
        since = self._since[addr] + 1
        if len(rtts) >= self.min_samples and (addr not in self._p99 or since >= self.refresh_every):
            ordered = sorted(rtts)
            self._p99[addr] = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
            since = 0
        self._since[addr] = since

    def p99_ms(self, addr: str) -> float | None:
        """The p99 RTT last computed for ``addr``; None before ``min_samples``."""
        return self._p99.get(addr)

    def timeout_ms(self, addr: str, ceiling_ms: int) -> int:
        """The timeout of the next attempt to ``addr``: at most ``ceiling_ms``."""
        p99 = self._p99.get(addr)
        if p99 is None:
            return ceiling_ms
        return int(min(ceiling_ms, max(self.floor_ms, self.factor * p99)))

    def forget(self, addr: str) -> None:
        """Drop what is known about ``addr`` (e.g. it left the route)."""
        self._rtts.pop(addr, None)
        self._since.pop(addr, None)
        self._p99.pop(addr, None)


class QueueSelector:
    """Round robin over the publish queues (Java ``PublishingLoadBalancer``).

    Each send takes the next start index (the first one is random); within a
    send, ``pick`` walks the queues from there and prefers, in order: a queue of
    a group not yet tried in this send whose endpoint is not isolated; any
    queue of an untried group; any queue not isolated; the first queue.
    """

    def __init__(self, start: int | None = None) -> None:
        self._index = random.randrange(1 << 16) if start is None else start

    def next_start(self) -> int:
        index = self._index
        self._index += 1
        return index

    @staticmethod
    def pick(
        queues: Sequence[MessageQueue],
        start: int,
        *,
        isolated: Callable[[MessageQueue], bool] = lambda mq: False,
        tried: Collection[str] = (),
    ) -> MessageQueue:
        if not queues:
            raise ValueError("no queue to pick from")
        n = len(queues)
        first = start % n
        ordered = [*queues[first:], *queues[:first]]
        for mq in ordered:
            if mq.broker_name not in tried and not isolated(mq):
                return mq
        for mq in ordered:
            if mq.broker_name not in tried:
                return mq
        for mq in ordered:
            if not isolated(mq):
                return mq
        return ordered[0]

    @staticmethod
    def for_message_group(queues: Sequence[MessageQueue], message_group: str) -> MessageQueue:
        """The queue of a FIFO message group: ``queues[siphash(group) mod n]``."""
        if not queues:
            raise ValueError("no queue to pick from")
        return queues[queue_for_message_group(message_group, len(queues))]
