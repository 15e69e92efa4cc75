"""Consumer lag: how far each consumer group is behind, per queue and per topic.

A plain computation over what the broker holds when it is asked (a scrape of
``/metrics``, a GET_CONSUME_STATS request): nothing is counted per message.  As in
RocketMQ's ``ConsumerLagCalculator``:

- a queue's lag is its max offset (the next offset to be written) minus the group's
  committed offset; a queue the group committed nothing for counts 0 (RocketMQ takes
  the max offset as the consumer offset then);
- the oldest unconsumed message is the one at the committed offset (or, when
  retention deleted it, the first one left), its store time the lag's age;
- a topic's lag is the sum over its queues, its age that of its oldest queue.

The (group, topic) pairs are those of the broker's consumer offset table: a group
shows once it committed an offset on this broker.  The queues are the topic's read
queues plus any queue the group committed on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ha_controller.protocol.properties import RETRY_PREFIX
from ha_controller.protocol.topics import RESERVED_GROUP_PREFIXES, reserved_prefix

__all__ = [
    "LagSource",
    "QueueLag",
    "TopicLag",
    "bound_queues",
    "by_topic",
    "is_system",
    "queue_lags",
]

#: The brokers' own groups (RESERVED_GROUP_PREFIXES without the retry/DLQ prefixes,
#: which name topics, not groups).
_SYSTEM_GROUP_PREFIXES = tuple(p for p in RESERVED_GROUP_PREFIXES if not p.startswith("%"))


class LagSource(Protocol):
    """What the computation reads from the store."""

    def max_offset(self, topic: str, queue_id: int) -> int: ...

    def min_offset(self, topic: str, queue_id: int) -> int: ...

    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int | None: ...


@dataclass(frozen=True)
class QueueLag:
    """One queue of a topic as one consumer group has consumed it."""

    group: str
    topic: str
    queue_id: int
    #: the queue's max offset (the next offset to be written)
    broker_offset: int
    #: the group's committed offset; -1 when it committed none for this queue
    consumer_offset: int
    #: unconsumed messages
    lag: int
    #: store time (epoch ms) of the oldest unconsumed message; None when none is left
    oldest_store_ms: int | None

    def age_ms(self, now_ms: int) -> int:
        """How long the oldest unconsumed message has waited (0 when none waits)."""
        return 0 if self.oldest_store_ms is None else max(0, now_ms - self.oldest_store_ms)


@dataclass(frozen=True)
class TopicLag:
    """A consumer group's lag on one topic of this broker (all its queues)."""

    group: str
    topic: str
    lag: int
    oldest_store_ms: int | None
    queues: int

    @property
    def is_retry(self) -> bool:
        return self.topic.startswith(RETRY_PREFIX)

    @property
    def is_system(self) -> bool:
        return is_system(self.topic, self.group)

    def age_ms(self, now_ms: int) -> int:
        return 0 if self.oldest_store_ms is None else max(0, now_ms - self.oldest_store_ms)


def is_system(topic: str, group: str) -> bool:
    """RocketMQ's ``isSystem``: a broker's own topic (schedule, timer, transactions,
    revive) or a broker's own group."""
    return reserved_prefix(topic, group_topics=False) is not None or group.startswith(
        _SYSTEM_GROUP_PREFIXES
    )


def queue_lag(source: LagSource, group: str, topic: str, queue_id: int, committed: int) -> QueueLag:
    """The lag of one queue; ``committed`` < 0: the group committed nothing there."""
    broker = max(0, source.max_offset(topic, queue_id))
    if committed < 0:
        return QueueLag(group, topic, queue_id, broker, -1, 0, None)
    lag = max(0, broker - committed)
    oldest = None
    if lag:
        start = max(committed, source.min_offset(topic, queue_id))
        oldest = source.store_time_at(topic, queue_id, start)
    return QueueLag(group, topic, queue_id, broker, committed, lag, oldest)


def queue_lags(
    source: LagSource,
    offsets: Iterable[tuple[str, str, int, int]],
    read_queues: Callable[[str], int],
    *,
    group: str | None = None,
    topic: str | None = None,
) -> list[QueueLag]:
    """Every queue of every (group, topic) of ``offsets`` ((group, topic, queue id,
    committed offset) rows), sorted by group, topic and queue; ``read_queues(topic)``
    is the topic's read queue count (0 for a topic this broker has no config for).
    ``group`` and ``topic`` keep only that group or topic."""
    committed: dict[tuple[str, str], dict[int, int]] = {}
    for g, t, q, o in offsets:
        if (group is None or g == group) and (topic is None or t == topic):
            committed.setdefault((g, t), {})[q] = o
    out: list[QueueLag] = []
    for (g, t), by_queue in sorted(committed.items()):
        ids = sorted(set(range(read_queues(t))) | set(by_queue))
        out += [queue_lag(source, g, t, q, by_queue.get(q, -1)) for q in ids]
    return out


def by_topic(queues: Iterable[QueueLag]) -> list[TopicLag]:
    """The per-(group, topic) sums, in the order of ``queues``."""
    acc: dict[tuple[str, str], tuple[int, int | None, int]] = {}
    for q in queues:
        lag, oldest, n = acc.get((q.group, q.topic), (0, None, 0))
        if q.oldest_store_ms is not None and (oldest is None or q.oldest_store_ms < oldest):
            oldest = q.oldest_store_ms
        acc[(q.group, q.topic)] = (lag + q.lag, oldest, n + 1)
    return [TopicLag(g, t, lag, oldest, n) for (g, t), (lag, oldest, n) in acc.items()]


def bound_queues(queues: Sequence[QueueLag], limit: int) -> tuple[list[QueueLag], int]:
    """At most ``limit`` queues for per-queue series: the ones furthest behind (the
    largest lag, then the oldest message, then by name), and how many were left out."""
    if len(queues) <= limit:
        return list(queues), 0
    ranked = sorted(
        queues,
        key=lambda q: (
            -q.lag,
            q.oldest_store_ms if q.oldest_store_ms is not None else 2**63,
            q.group,
            q.topic,
            q.queue_id,
        ),
    )
    return ranked[:limit], len(queues) - limit
