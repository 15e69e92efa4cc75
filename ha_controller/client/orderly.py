"""Orderly (FIFO) push consumption with broker queue locks.

Like RocketMQ's ``ConsumeMessageOrderlyService`` with ``RebalanceImpl.lock``,
and RIP-32's quorum locks at the acting slave:

- The consumer locks every queue the rebalance gives it with LOCK_BATCH_MQ at
  the group's id-0 address — the master, or the acting slave the route shows as
  id 0 — one batch per broker group.  It renews every 20 s
  (``lock_renew_interval_s``; sooner, every ``lock_retry_interval_s``, while a
  queue is not granted) and trusts a lock for 30 s after the request that
  last renewed it was *sent* (``lock_max_live_s``; the broker keeps it 60 s).
  A queue the broker leaves out of its answer, or a ``QuorumNotReached``
  answer, is not ours any more at once; a broker that does not answer changes
  nothing until the 30 s run out.
- A queue is consumed only while its lock is trusted, from the offset the
  group committed (read after the lock was won, so the previous holder's last
  commit counts), strictly one message at a time in queue order.  Offsets are
  committed only while the lock is trusted.
- A failing message is retried in place with a doubling backoff; after
  ``max_consume_attempts`` it is sent to the dead-letter topic
  ``%DLQ%<group>`` (retried every ``dlq_retry_interval_s`` until it is
  stored) and consumption goes on with the next message.
- A queue the rebalance takes away is stopped, its offset committed, and then
  unlocked; ``aclose()`` does the same for every queue.

A queue whose lock was lost and won back starts again from the committed
offset: messages consumed but not yet committed are delivered again (in order).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from ha_controller.client.message import (
    RESERVED_PROPERTIES,
    Message,
    MessageQueue,
    ReceivedMessage,
)
from ha_controller.client.producer import Producer
from ha_controller.client.push_consumer import MessageListener, PushConsumer, _QueueState
from ha_controller.client.routes import RouteCache
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BrokerUnavailable, HaError, QuorumNotReached
from ha_controller.protocol.properties import (
    PROPERTY_ORIGIN_MESSAGE_GROUP,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_ORIGIN_QUEUE,
    PROPERTY_ORIGIN_QUEUE_OFFSET,
    PROPERTY_ORIGIN_UNIQ_KEY,
    PROPERTY_RECONSUME_TIMES,
    PROPERTY_RETRY_TOPIC,
    dlq_topic,
)
from ha_controller.rpc import ConnectionPool

__all__ = [
    "DEFAULT_LOCK_MAX_LIVE_S",
    "DEFAULT_LOCK_RENEW_INTERVAL_S",
    "LockOutcome",
    "OrderlyPushConsumer",
    "QueueLocker",
    "dlq_topic",
]

log = logging.getLogger(__name__)

DEFAULT_LOCK_RENEW_INTERVAL_S = 20.0
"""RocketMQ ``rocketmq.client.rebalance.lockInterval``."""
DEFAULT_LOCK_MAX_LIVE_S = 30.0
"""RocketMQ ``rocketmq.client.rebalance.lockMaxLiveTime``."""


def _mq_to_pb(mq: MessageQueue) -> broker_pb2.MessageQueue:
    return broker_pb2.MessageQueue(topic=mq.topic, broker_name=mq.broker_name, queue_id=mq.queue_id)


@dataclasses.dataclass(frozen=True, slots=True)
class LockOutcome:
    """One lock round: what the brokers granted, refused, or did not answer about."""

    granted: frozenset[MessageQueue] = frozenset()
    refused: frozenset[MessageQueue] = frozenset()
    unknown: frozenset[MessageQueue] = frozenset()


class QueueLocker:
    """LOCK_BATCH_MQ / UNLOCK_BATCH_MQ for one client of one consumer group.

    Each broker group is asked at its id-0 address, all groups at once.
    """

    def __init__(
        self,
        routes: RouteCache,
        pool: ConnectionPool,
        group: str,
        client_id: str,
        *,
        request_timeout_ms: int = 3000,
    ) -> None:
        self.routes = routes
        self.group = group
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self._pool = pool

    def _request(self, mqs: Iterable[MessageQueue]) -> broker_pb2.LockBatchRequest:
        return broker_pb2.LockBatchRequest(
            consumer_group=self.group,
            client_id=self.client_id,
            mqs=[_mq_to_pb(mq) for mq in sorted(mqs)],
        )

    @staticmethod
    def _by_broker(mqs: Iterable[MessageQueue]) -> dict[str, list[MessageQueue]]:
        by_broker: dict[str, list[MessageQueue]] = defaultdict(list)
        for mq in mqs:
            by_broker[mq.broker_name].append(mq)
        return by_broker

    async def _addr(self, broker_name: str, mqs: Sequence[MessageQueue]) -> str:
        addr = self.routes.broker_addr_for_publish(broker_name)
        if addr is None:
            await self.routes.refresh_quietly(mqs[0].topic)
            addr = self.routes.broker_addr_for_publish(broker_name)
        if addr is None:
            raise BrokerUnavailable(f"group {broker_name} has no id-0 broker to lock at")
        return addr

    async def lock(self, mqs: Iterable[MessageQueue]) -> LockOutcome:
        """Lock (or renew) ``mqs``; never raises for a broker that fails."""
        granted: set[MessageQueue] = set()
        refused: set[MessageQueue] = set()
        unknown: set[MessageQueue] = set()

        async def one(broker_name: str, wanted: list[MessageQueue]) -> None:
            try:
                addr = await self._addr(broker_name, wanted)
                response = await self._pool.call_pb(
                    addr,
                    RequestCode.LOCK_BATCH_MQ,
                    self._request(wanted),
                    broker_pb2.LockBatchResponse,
                    self.request_timeout_ms,
                )
            except QuorumNotReached as exc:
                log.warning("lock of %d queue(s) of %s refused: %s", len(wanted), broker_name, exc)
                refused.update(wanted)
                return
            except (HaError, OSError) as exc:
                log.warning("lock of %d queue(s) of %s failed: %s", len(wanted), broker_name, exc)
                unknown.update(wanted)
                if not isinstance(exc, HaError) or exc.retriable:
                    await self.routes.refresh_quietly(wanted[0].topic)
                return
            locked = {MessageQueue(pb.topic, pb.broker_name, pb.queue_id) for pb in response.locked}
            granted.update(mq for mq in wanted if mq in locked)
            refused.update(mq for mq in wanted if mq not in locked)

        async with asyncio.TaskGroup() as tg:
            for broker_name, wanted in sorted(self._by_broker(mqs).items()):
                tg.create_task(one(broker_name, wanted), name=f"lock-{broker_name}")
        return LockOutcome(frozenset(granted), frozenset(refused), frozenset(unknown))

    async def unlock(self, mqs: Iterable[MessageQueue]) -> None:
        """Unlock ``mqs`` (best effort: a lock that stays expires on the broker)."""

        async def one(broker_name: str, wanted: list[MessageQueue]) -> None:
            try:
                addr = await self._addr(broker_name, wanted)
                await self._pool.call_pb(
                    addr,
                    RequestCode.UNLOCK_BATCH_MQ,
                    self._request(wanted),
                    common_pb2.Empty,
                    self.request_timeout_ms,
                )
            except (HaError, OSError) as exc:
                log.warning("unlock of %d queue(s) of %s failed: %s", len(wanted), broker_name, exc)

        async with asyncio.TaskGroup() as tg:
            for broker_name, wanted in sorted(self._by_broker(mqs).items()):
                tg.create_task(one(broker_name, wanted), name=f"unlock-{broker_name}")


@dataclasses.dataclass(eq=False)
class _QueueLock:
    """What this client believes about its lock on one queue."""

    held: bool = False
    renewed_at: float = -math.inf  # loop time the last granting request was sent
    epoch: int = 0  # bumped each time the lock is won (not on renewals)
    granted: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def holds(self, now: float, max_live_s: float) -> bool:
        return self.held and now - self.renewed_at < max_live_s


class OrderlyPushConsumer(PushConsumer):
    """A push consumer that consumes each queue in order under a broker lock.

    ``async with OrderlyPushConsumer(ns, "G", "T", listener) as consumer: ...``
    Other keyword options are those of :class:`PushConsumer`.
    """

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str,
        topic: str,
        listener: MessageListener,
        *,
        lock_renew_interval_s: float = DEFAULT_LOCK_RENEW_INTERVAL_S,
        lock_max_live_s: float = DEFAULT_LOCK_MAX_LIVE_S,
        lock_retry_interval_s: float = 1.0,
        dead_letter: bool = True,
        dlq_retry_interval_s: float = 1.0,
        **options: Any,
    ) -> None:
        if not 0 < lock_renew_interval_s < lock_max_live_s:
            raise ValueError(
                f"lock_renew_interval_s ({lock_renew_interval_s}) must be > 0 and less than "
                f"lock_max_live_s ({lock_max_live_s})"
            )
        if lock_retry_interval_s <= 0 or dlq_retry_interval_s <= 0:
            raise ValueError("lock_retry_interval_s and dlq_retry_interval_s must be > 0")
        super().__init__(namesrv_addrs, group, topic, listener, **options)
        self.lock_renew_interval_s = lock_renew_interval_s
        self.lock_max_live_s = lock_max_live_s
        self.lock_retry_interval_s = lock_retry_interval_s
        self.dead_letter = dead_letter
        self.dlq_retry_interval_s = dlq_retry_interval_s
        self.locker = QueueLocker(
            self.routes,
            self._pool,
            group,
            self.client_id,
            request_timeout_ms=self.request_timeout_ms,
        )
        self._namesrv_addrs = namesrv_addrs
        self._locks: dict[MessageQueue, _QueueLock] = {}
        self._lock_io = asyncio.Lock()  # lock rounds and unlocks never interleave
        self._lock_now = asyncio.Event()
        self._dlq: Producer | None = None
        self._dlq_start = asyncio.Lock()
        self.dead_lettered = 0

    # ---- public state ----------------------------------------------------------------

    def held_queues(self) -> set[MessageQueue]:
        """The queues whose lock this client trusts now (and may consume)."""
        now = asyncio.get_running_loop().time()
        return {mq for mq, lock in self._locks.items() if lock.holds(now, self.lock_max_live_s)}

    async def lock_all(self) -> LockOutcome:
        """One lock round over every assigned queue now (the renewal loop does this)."""
        async with self._lock_io:
            mqs = sorted(self._locks)
            if not mqs:
                return LockOutcome()
            loop = asyncio.get_running_loop()
            sent_at = loop.time()
            outcome = await self.locker.lock(mqs)
            now = loop.time()
            for mq in outcome.granted:
                lock = self._locks.get(mq)
                if lock is None:
                    continue
                if not lock.holds(now, self.lock_max_live_s):
                    lock.epoch += 1
                    log.info("%s locked %s", self.client_id, mq)
                lock.held = True
                lock.renewed_at = sent_at
                lock.granted.set()
            for mq in outcome.refused:
                lock = self._locks.get(mq)
                if lock is not None and lock.held:
                    log.warning("%s lost the lock of %s", self.client_id, mq)
                    lock.held = False
                    lock.granted.clear()
            return outcome

    # ---- life cycle ----------------------------------------------------------------

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._lock_loop(), name=f"orderly-lock-{self.group}")
            await super()._run()

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            if self._dlq is not None:
                await self._dlq.aclose()

    async def _lock_loop(self) -> None:
        all_granted = True
        while True:
            wait = self.lock_renew_interval_s if all_granted else self.lock_retry_interval_s
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._lock_now.wait()
            self._lock_now.clear()
            outcome = await self.lock_all()
            all_granted = not outcome.refused and not outcome.unknown

    def _start_queue(self, mq: MessageQueue) -> None:
        self._locks.setdefault(mq, _QueueLock())
        super()._start_queue(mq)
        self._lock_now.set()

    async def _stop_states(self, states: list[_QueueState]) -> None:
        # Stop and commit first (while the lock is still trusted), then unlock.
        await super()._stop_states(states)
        async with self._lock_io:
            gone = [s.mq for s in states if s.mq not in self._queues]
            for mq in gone:
                lock = self._locks.pop(mq, None)
                if lock is not None:
                    lock.held = False
            if gone:
                await self.locker.unlock(gone)

    async def _commit_state(self, state: _QueueState) -> None:
        if self._holds(state.mq):
            await super()._commit_state(state)

    def _holds(self, mq: MessageQueue, epoch: int | None = None) -> bool:
        lock = self._locks.get(mq)
        if lock is None:
            return False
        now = asyncio.get_running_loop().time()
        return lock.holds(now, self.lock_max_live_s) and (epoch is None or lock.epoch == epoch)

    # ---- the per-queue loop --------------------------------------------------------

    async def _queue_loop(self, state: _QueueState) -> None:
        mq = state.mq
        while True:
            epoch = await self._until_locked(mq)
            if epoch is None:
                return  # the queue was taken away from this client
            await self._commit_settled(state)  # read the last commit, not one in flight
            committed = await self._initial_offset(mq)
            state.tracker.reset(max(committed, 0))
            state.last_committed = committed if committed >= 0 else None
            state.ready = True
            await self._consume_locked(state, epoch, max(committed, 0))
            state.ready = False
            log.info("%s stops consuming %s: lock not held", self.client_id, mq)

    async def _until_locked(self, mq: MessageQueue) -> int | None:
        """Wait until this client trusts its lock on ``mq``; returns the lock's epoch,
        or None when the queue is no longer assigned to this client."""
        while True:
            lock = self._locks.get(mq)
            if lock is None:
                return None
            if self._holds(mq):
                return lock.epoch
            lock.granted.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.lock_retry_interval_s):
                    await lock.granted.wait()

    async def _consume_locked(self, state: _QueueState, epoch: int, offset: int) -> None:
        """Pull and consume in order from ``offset`` until the lock is lost."""

        async def consume_batch(messages: list[ReceivedMessage]) -> bool:
            for message in sorted(messages, key=lambda m: m.queue_offset):
                if not await self._consume_in_order(state, epoch, message):
                    return False
                state.tracker.done(message.queue_offset)
            return True

        await self._pull_loop(state, offset, consume_batch, lambda: self._holds(state.mq, epoch))

    async def _consume_in_order(
        self, state: _QueueState, epoch: int, message: ReceivedMessage
    ) -> bool:
        """Consume one message (retries, then the DLQ); False if the lock was lost first."""
        attempt = 0
        while True:
            if not self._holds(state.mq, epoch):
                return False
            async with self._consume_slots:
                ok = await self._call_listener(state, message, attempt)
            if ok:
                return True
            attempt += 1
            if attempt >= self.max_consume_attempts:
                return await self._give_up(state, epoch, message, attempt)
            await asyncio.sleep(self._retry_delay_s(attempt - 1))

    async def _give_up(
        self, state: _QueueState, epoch: int, message: ReceivedMessage, attempts: int
    ) -> bool:
        if not self.dead_letter:
            self._count_given_up(state, message, attempts)
            return True
        dead = self._dead_letter_message(message, attempts)
        while self._holds(state.mq, epoch):
            try:
                producer = await self._dlq_producer()
                receipt = await producer.send(dead)
            except (HaError, OSError) as exc:
                log.warning(
                    "dead-lettering %s (%s offset %d) failed: %s; retrying",
                    message.uniq_key,
                    state.mq,
                    message.queue_offset,
                    exc,
                )
                await asyncio.sleep(self.dlq_retry_interval_s)
                continue
            self.dead_lettered += 1
            log.error(
                "message %s (%s offset %d) failed %d times: moved to %s as %s",
                message.uniq_key,
                state.mq,
                message.queue_offset,
                attempts,
                dead.topic,
                receipt.msg_id,
            )
            return True
        return False

    def _dead_letter_message(self, message: ReceivedMessage, attempts: int) -> Message:
        # the reserved ones are set again from the message's fields when it is sent
        properties = {k: v for k, v in message.properties.items() if k not in RESERVED_PROPERTIES}
        properties.update(
            {
                PROPERTY_ORIGIN_MESSAGE_ID: message.msg_id,
                PROPERTY_ORIGIN_UNIQ_KEY: message.uniq_key,
                PROPERTY_RETRY_TOPIC: message.topic,
                PROPERTY_ORIGIN_QUEUE: str(message.queue),
                PROPERTY_ORIGIN_QUEUE_OFFSET: str(message.queue_offset),
                PROPERTY_RECONSUME_TIMES: str(message.reconsume_times + attempts),
            }
        )
        if message.message_group is not None:
            properties[PROPERTY_ORIGIN_MESSAGE_GROUP] = message.message_group
        return Message(
            topic=dlq_topic(self.group),
            body=message.body,
            tags=message.tags,
            keys=message.keys,
            properties=properties,
        )

    async def _dlq_producer(self) -> Producer:
        async with self._dlq_start:
            if self._dlq is None:
                producer = Producer(
                    self._namesrv_addrs,
                    self.group,
                    topics=(),
                    send_timeout_ms=self.request_timeout_ms,
                    tls=self.tls,
                    credentials=self.credentials,
                )
                producer.reserved_properties = frozenset()
                await producer.start()
                self._dlq = producer
            return self._dlq
