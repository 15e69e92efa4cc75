"""Orderly POP: the batch each queue of an orderly group is given to.  Plain object.

RocketMQ's ``order=true`` POP (a request's ``order``, or the group's
``consume_orderly``) gives a queue of the group to one batch at a time.  No CK is
written: :class:`OrderLocks` holds the batch (which offsets, until when) until every
message of it is acked — then the group's offset moves past it and the next batch can
be popped — or its invisible time is over — then the same messages are popped again
from the group's offset (reconsume times + 1), never a later one first.  The locks are
in memory, as RocketMQ's ConsumerOrderInfoManager keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["OrderBatch", "OrderKey", "OrderLocks"]


@dataclass
class OrderBatch:
    offsets: tuple[int, ...]
    next_offset: int  # the group's offset once the whole batch is acked
    pop_ms: int
    until_ms: int
    attempts: int = 0  # how often these messages were popped before
    acked: set[int] = field(default_factory=set)

    @property
    def done(self) -> bool:
        return all(o in self.acked for o in self.offsets)


OrderKey = tuple[str, str, int]  # group, topic, queue id


class OrderLocks:
    """The batch each (group, topic, queue) of orderly consumers holds."""

    def __init__(self) -> None:
        self._batches: dict[OrderKey, OrderBatch] = {}
        #: set when this broker starts serving: queues wait one invisible time
        self.started_ms = 0

    def __len__(self) -> int:
        return len(self._batches)

    def reset(self, now: int) -> None:
        self._batches.clear()
        self.started_ms = now

    def get(self, key: OrderKey) -> OrderBatch | None:
        return self._batches.get(key)

    def locked(self, key: OrderKey, now: int) -> bool:
        b = self._batches.get(key)
        return b is not None and not b.done and b.until_ms > now

    def lock(self, key: OrderKey, batch: OrderBatch) -> None:
        self._batches[key] = batch

    def release(self, key: OrderKey) -> None:
        self._batches.pop(key, None)

    def ack(self, key: OrderKey, pop_ms: int, offset: int) -> int | None:
        """One message of the batch popped at ``pop_ms`` is done; the offset to commit
        when that finished the batch (the queue is then free), else None.  An ack of an
        older pop of the queue (its batch was popped again since) changes nothing."""
        b = self._batches.get(key)
        if b is None or b.pop_ms != pop_ms or offset not in b.offsets:
            return None
        b.acked.add(offset)
        if not b.done:
            return None
        del self._batches[key]
        return b.next_offset

    def extend(self, key: OrderKey, pop_ms: int, until_ms: int) -> bool:
        """Change-invisible-time of an orderly message: the batch stays locked until then."""
        b = self._batches.get(key)
        if b is None or b.pop_ms != pop_ms:
            return False
        b.until_ms = until_ms
        return True
