"""Rebalance (ordered-consumption) queue locks, and the strict-mode quorum count.

A plain object without I/O, after RocketMQ's ``RebalanceLockManager``.
A lock is ``(consumer group, queue) -> client``
with a last-update time; it lives ``lock_max_live_time_ms`` (60 s) past the
last lock or renewal.  Clients renew every 20 s and stop trusting a lock after
30 s, so a live client never loses its lock, and a dead client's lock is
stolen at most 60 s after its last renewal.

The manager is used from the event loop only; it is not thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ha_controller.protocol.errors import BadRequest

__all__ = [
    "DEFAULT_LOCK_MAX_LIVE_TIME_MS",
    "MessageQueueKey",
    "RebalanceLockManager",
    "quorum_grant",
    "quorum_size",
]

logger = logging.getLogger(__name__)

DEFAULT_LOCK_MAX_LIVE_TIME_MS = 60_000
"""RocketMQ ``rocketmq.broker.rebalance.lockMaxLiveTime``."""


@dataclass(frozen=True, slots=True, order=True)
class MessageQueueKey:
    """One message queue: RocketMQ's ``MessageQueue(topic, brokerName, queueId)``."""

    topic: str
    broker_name: str
    queue_id: int

    def to_dict(self) -> dict[str, str | int]:
        """The JSON shape of RocketMQ's ``MessageQueue``."""
        return {"topic": self.topic, "brokerName": self.broker_name, "queueId": self.queue_id}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> MessageQueueKey:
        """Parse :meth:`to_dict` output; a missing or mistyped field raises ``BadRequest``."""
        topic = data.get("topic")
        broker_name = data.get("brokerName")
        queue_id = data.get("queueId")
        if not isinstance(topic, str) or not topic:
            raise BadRequest(f"message queue: 'topic' must be a non-empty string, got {topic!r}")
        if not isinstance(broker_name, str):
            raise BadRequest(f"message queue: 'brokerName' must be a string, got {broker_name!r}")
        if isinstance(queue_id, bool) or not isinstance(queue_id, int) or queue_id < 0:
            raise BadRequest(f"message queue: 'queueId' must be an int >= 0, got {queue_id!r}")
        return cls(topic, broker_name, queue_id)


@dataclass(slots=True)
class _LockEntry:
    client_id: str
    last_update_ms: int


class RebalanceLockManager:
    """``group -> queue -> (client, last update)`` with expiry by an injected clock.

    ``clock`` returns milliseconds (monotonic in production).  A lock whose last
    update is more than ``lock_max_live_time_ms`` old is expired: it no longer
    counts as held and the next locker takes it.
    """

    def __init__(
        self,
        clock: Callable[[], int],
        lock_max_live_time_ms: int = DEFAULT_LOCK_MAX_LIVE_TIME_MS,
    ) -> None:
        if lock_max_live_time_ms <= 0:
            raise ValueError(f"lock_max_live_time_ms must be > 0, got {lock_max_live_time_ms}")
        self._clock = clock
        self._max_live_ms = lock_max_live_time_ms
        self._table: dict[str, dict[MessageQueueKey, _LockEntry]] = {}

    @property
    def lock_max_live_time_ms(self) -> int:
        return self._max_live_ms

    def _expired(self, entry: _LockEntry, now_ms: int) -> bool:
        return now_ms - entry.last_update_ms > self._max_live_ms

    def _try_lock(
        self,
        locks: dict[MessageQueueKey, _LockEntry],
        mq: MessageQueueKey,
        client_id: str,
        now: int,
    ) -> bool:
        entry = locks.get(mq)
        if entry is None:
            locks[mq] = _LockEntry(client_id, now)
            return True
        if entry.client_id == client_id:
            # Mine: renew (also when it had lapsed; nobody took it in between).
            entry.last_update_ms = now
            return True
        if self._expired(entry, now):
            logger.info(
                "lock of %s taken over by %s from expired holder %s (idle %d ms)",
                mq,
                client_id,
                entry.client_id,
                now - entry.last_update_ms,
            )
            entry.client_id = client_id
            entry.last_update_ms = now
            return True
        return False

    def try_lock(self, group: str, mq: MessageQueueKey, client_id: str) -> bool:
        """Lock (or renew) one queue for ``client_id``; False if another live client holds it."""
        locks = self._table.setdefault(group, {})
        return self._try_lock(locks, mq, client_id, self._clock())

    def try_lock_batch(
        self, group: str, mqs: Iterable[MessageQueueKey], client_id: str
    ) -> set[MessageQueueKey]:
        """Lock or renew each queue; returns the queues now held by ``client_id``.

        Already mine -> renewed; free -> mine; expired -> taken over; held by
        another live client -> not granted.
        """
        now = self._clock()
        locks = self._table.setdefault(group, {})
        granted = {mq for mq in mqs if self._try_lock(locks, mq, client_id, now)}
        if not locks:
            del self._table[group]
        return granted

    def _remove_held(
        self, group: str, mqs: Iterable[MessageQueueKey], client_id: str
    ) -> set[MessageQueueKey]:
        locks = self._table.get(group)
        if locks is None:
            return set()
        removed: set[MessageQueueKey] = set()
        for mq in mqs:
            entry = locks.get(mq)
            if entry is not None and entry.client_id == client_id:
                del locks[mq]
                removed.add(mq)
        if not locks:
            del self._table[group]
        return removed

    def unlock_batch(
        self, group: str, mqs: Iterable[MessageQueueKey], client_id: str
    ) -> set[MessageQueueKey]:
        """Remove the locks ``client_id`` holds among ``mqs``; others' locks stay.

        Returns the queues actually unlocked (RocketMQ answers SUCCESS either way).
        """
        return self._remove_held(group, mqs, client_id)

    def release(
        self, group: str, mqs: Iterable[MessageQueueKey], client_id: str
    ) -> set[MessageQueueKey]:
        """Strict mode: drop the local locks that missed quorum.

        Same rule as :meth:`unlock_batch` (only ``client_id``'s own locks go),
        logged as a quorum release rather than a client unlock.
        """
        released = self._remove_held(group, mqs, client_id)
        if released:
            logger.info(
                "released %d local lock(s) of group %s for %s: quorum not reached",
                len(released),
                group,
                client_id,
            )
        return released

    def is_locked(self, group: str, mq: MessageQueueKey, client_id: str) -> bool:
        """True if ``client_id`` holds a live lock on ``mq`` (does not renew it)."""
        entry = self._table.get(group, {}).get(mq)
        return (
            entry is not None
            and entry.client_id == client_id
            and not self._expired(entry, self._clock())
        )

    def is_lock_all_expired(self, group: str) -> bool:
        """True if ``group`` has no live lock (RocketMQ ``isLockAllExpired``)."""
        locks = self._table.get(group)
        if not locks:
            return True
        now = self._clock()
        return all(self._expired(entry, now) for entry in locks.values())

    def holders(self, group: str) -> dict[MessageQueueKey, str]:
        """Live locks of ``group``: queue -> client id."""
        now = self._clock()
        return {
            mq: entry.client_id
            for mq, entry in self._table.get(group, {}).items()
            if not self._expired(entry, now)
        }

    def groups(self) -> list[str]:
        """Groups with at least one lock entry (live or not yet collected)."""
        return list(self._table)

    def expire(self) -> int:
        """Housekeeping: forget expired locks and empty groups; returns how many went."""
        now = self._clock()
        removed = 0
        for group in list(self._table):
            locks = self._table[group]
            for mq in [mq for mq, entry in locks.items() if self._expired(entry, now)]:
                del locks[mq]
                removed += 1
            if not locks:
                del self._table[group]
        if removed:
            logger.debug("expired %d rebalance lock(s)", removed)
        return removed


def quorum_size(total_replicas: int) -> int:
    """Copies that must hold a lock in strict mode: ``total_replicas // 2 + 1``."""
    return total_replicas // 2 + 1


def quorum_grant(
    self_locked: set[MessageQueueKey],
    peer_results: Iterable[set[MessageQueueKey]],
    total_replicas: int,
    *,
    own_vote: bool = True,
) -> set[MessageQueueKey]:
    """Queues granted in strict mode (RocketMQ ``AdminBrokerProcessor.lockBatchMQ``).

    The broker locks locally first (``self_locked``), then asks each peer of its
    group to lock the same set (``onlyThisBroker``); ``peer_results`` holds what
    each answering peer locked.  A queue is granted when the local lock plus the
    peers that locked it reach ``total_replicas // 2 + 1`` (from static config,
    not the alive count).  With a quorum of 1 the local result stands alone.
    A queue a peer reports but this broker did not lock is never granted.  Without
    ``own_vote`` (a broker that forgot the locks it voted for) the local lock is still
    needed but does not count: only the peers' votes make the quorum.
    """
    quorum = quorum_size(total_replicas)
    if quorum <= 1 and own_vote:
        return set(self_locked)
    counts = dict.fromkeys(self_locked, 1 if own_vote else 0)
    for locked in peer_results:
        for mq in locked:
            if mq in counts:
                counts[mq] += 1
    return {mq for mq, count in counts.items() if count >= quorum}
