"""Drill workloads: clients that record every operation in the history.

- :class:`ProducerWorkload` sends messages with unique keys (``<process>-<seq>``) at a
  bounded rate with a few sends in flight; normal, FIFO (``message_groups`` > 0: each
  key gets group ``g<n>`` round robin) or delayed (``delay_level`` or ``delay_ms``).
  Every send is an ``invoke`` followed by ``ok`` (acknowledged), ``fail`` (the client
  says it was not stored: no connection, not master, no route) or ``info`` (unknown:
  timeouts, a connection lost mid-call, anything else).
- Every body is :data:`BODY_SIZE` bytes derived from the key
  (:func:`~ha_controller.client.tools.body_for`); every consumer checks the body it
  received against its key and records a delivery whose body differs as ``receive`` ok
  with ``corrupt: true`` (the checkers count ``corrupt_deliveries``).
- :class:`PushWorkload` consumes with a :class:`~ha_controller.client.PushConsumer`;
  each listener call is a ``receive`` ok and, as the listener succeeds, an ``ack`` ok.
- :class:`PullWorkload` consumes every queue with a
  :class:`~ha_controller.client.PullConsumer` and commits offsets itself after each
  batch (``commit_offset`` invoke/ok/fail), so consumer-offset rollbacks after a master
  returns are visible; it can be paused (no pulls, no commits) around an offset probe.
  A pull that fails is a ``receive`` fail naming the queue's ``broker`` (no ``key``); the
  first pull of that queue that works again is a ``receive`` ok (no ``key`` when it
  found nothing): the read-unavailable windows of the checkers are measured from them
  (:func:`record_read_outcome`).  :class:`PopWorkload` records its failed receives the
  same way, without a broker (the client chooses it).
- :func:`offset_probe` reads the group's committed offsets from the brokers
  (``offset_probe`` ok, timed at the request's start so that commits acknowledged
  before it are strictly earlier).
- :class:`DelayedProducerWorkload` alternates delay-level and timer messages; a level
  is recorded as ``delay_ms`` (the broker's configured delay of that level, since the
  checker's level table is RocketMQ's default one), a timer as ``due_ts_ms``.
- :class:`TransactionWorkload` sends each message in a transaction (``tx: true``) and
  follows a plan drawn per key: commit or roll back at once (``end_tx`` invoke/ok/info)
  or leave it open for the brokers' check-back, which the producer's checker answers
  with the plan's outcome (``end_tx`` ok with ``via: "check"``).
- :class:`PopWorkload` receives with a :class:`~ha_controller.client.SimpleConsumer`
  (POP) and acks (``ack`` ok); a share of first deliveries is deliberately not acked
  (a ``nack`` info event, ignored by the checkers) so that the brokers revive it into
  the retry topic; judge it with ``CheckOptions(redelivery="after_ack")``.
- :class:`OrderlyWorkload` consumes in order with an
  :class:`~ha_controller.client.orderly.OrderlyPushConsumer` whose queue locker
  records every lock round (``lock`` invoke, then ok ``granted`` true/false or info
  when the broker did not answer) and every unlock (``unlock`` invoke/ok; a renewal the
  broker refuses is an ``unlock`` info ``"dropped"``: the client stops at once).

All loops run in a task group owned by the workload: ``async with`` starts and stops it;
cancellation is re-raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Self

from ha_controller.client.lifecycle import AsyncLifecycle
from ha_controller.client.message import Message, MessageQueue, ReceivedMessage, SendReceipt
from ha_controller.client.orderly import LockOutcome, OrderlyPushConsumer, QueueLocker
from ha_controller.client.producer import (
    Producer,
    Transaction,
    TransactionChecker,
    TransactionResolution,
)
from ha_controller.client.pull_consumer import PullConsumer, PullStatus
from ha_controller.client.push_consumer import PushConsumer
from ha_controller.client.simple_consumer import SimpleConsumer
from ha_controller.client.tools import body_for
from ha_controller.drills.history import (
    Ack,
    EndTx,
    Event,
    HistoryWriter,
    Lock,
    OffsetCommit,
    OffsetProbe,
    Receive,
    SendInvoke,
    SendOk,
    SendOutcome,
    Subscribe,
    Unlock,
)
from ha_controller.protocol.errors import (
    BrokerUnavailable,
    HaError,
    NotMaster,
    TopicNotFound,
)
from ha_controller.protocol.properties import PROPERTY_TIMER_DELIVER_MS, now_ms

__all__ = [
    "BODY_SIZE",
    "DelayedProducerWorkload",
    "Delivered",
    "OrderlyWorkload",
    "PopWorkload",
    "ProducerWorkload",
    "PullWorkload",
    "PushWorkload",
    "RecordingQueueLocker",
    "TransactionWorkload",
    "mq_name",
    "offset_probe",
]

log = logging.getLogger(__name__)

#: the size of every drill message body (derived from its key: ``body_for(key, size)``)
BODY_SIZE: Final = 256


def mq_name(mq: MessageQueue) -> str:
    """``"topic/broker/queue_id"`` as the history schema names a queue."""
    return f"{mq.topic}/{mq.broker_name}/{mq.queue_id}"


def _definitely_not_stored(exc: BaseException) -> bool:
    return isinstance(exc, BrokerUnavailable | NotMaster | TopicNotFound)


async def _cancel(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (when there is one) and wait until it has ended."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class _InFlight:
    """Counts the operations in progress; :attr:`idle` is set while there is none."""

    def __init__(self) -> None:
        self.count = 0
        self.idle = asyncio.Event()
        self.idle.set()

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """One operation in progress for the duration of the ``with`` block."""
        self.count += 1
        self.idle.clear()
        try:
            yield
        finally:
            self.count -= 1
            if self.count == 0:
                self.idle.set()


@dataclass
class Delivered:
    """Keys seen by one consumer group (for the drain)."""

    keys: set[str] = field(default_factory=set)
    count: int = 0
    last_ms: int = 0


class ProducerWorkload:
    """Sends ``rate`` messages/s with ``concurrency`` sends in flight until stopped."""

    def __init__(
        self,
        namesrv: str,
        topic: str,
        history: HistoryWriter,
        *,
        process: str = "producer-0",
        rate: float = 100.0,
        concurrency: int = 4,
        size: int = BODY_SIZE,
        message_groups: int = 0,
        delay_level: int = 0,
        delay_ms: int = 0,
        max_attempts: int = 3,
        send_timeout_ms: int = 3000,
        checker: TransactionChecker | None = None,
    ) -> None:
        if rate <= 0 or concurrency < 1:
            raise ValueError("rate must be > 0 and concurrency >= 1")
        self.namesrv = namesrv
        self.topic = topic
        self.history = history
        self.process = process
        self.rate = rate
        self.concurrency = concurrency
        self.size = size
        self.message_groups = message_groups
        self.delay_level = delay_level
        self.delay_ms = delay_ms
        self.producer = Producer(
            namesrv,
            group=f"drill-{process}",
            max_attempts=max_attempts,
            send_timeout_ms=send_timeout_ms,
            checker=checker,
            # brokers send check-backs to the connection of the group's last heartbeat
            heartbeat_interval_s=1.0 if checker is not None else 10.0,
        )
        self.acked: set[str] = set()
        self.sent = 0
        self.failed = 0
        self.unknown = 0
        self._seq = 0
        self._inflight = _InFlight()
        self._running = asyncio.Event()
        self._running.set()
        self._next_slot = 0.0
        self._task: asyncio.Task[None] | None = None

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    async def __aenter__(self) -> Self:
        await self.producer.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.process)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop_sending()
        await self.producer.aclose()

    async def stop(self) -> None:
        """Stop sending (see :meth:`stop_sending`) and close the producer."""
        await self.stop_sending()
        await self.producer.aclose()

    async def stop_sending(self) -> None:
        """Stop sending: in-flight sends may finish (bounded by the send timeout); what is
        still in flight then is cancelled and recorded as info."""
        self.pause()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(
                self.producer.send_timeout_ms * self.producer.max_attempts / 1000 + 1
            ):
                await self._inflight.idle.wait()
        await _cancel(self._task)
        self._task = None

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for _ in range(self.concurrency):
                tg.create_task(self._worker())

    async def _slot(self) -> None:
        """A simple pacer shared by the workers: one send every ``1/rate`` s."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._next_slot = max(self._next_slot + 1.0 / self.rate, now)
        if self._next_slot > now:
            await asyncio.sleep(self._next_slot - now)

    async def _worker(self) -> None:
        while True:
            await self._running.wait()
            await self._slot()
            if not self._running.is_set():
                continue
            await self.send_one()

    def _next_message(self) -> tuple[Message, SendInvoke]:
        key = f"{self.process}-{self._seq}"
        group = f"g{self._seq % self.message_groups}" if self.message_groups else None
        self._seq += 1
        deliver_ts: int | None = None
        if self.delay_ms:
            deliver_ts = now_ms() + self.delay_ms
        msg = Message(
            self.topic,
            body_for(key, self.size),
            keys=(key,),
            message_group=group,
            delay_level=self.delay_level,
            deliver_ts_ms=deliver_ts,
        )
        invoke = SendInvoke(
            key=key,
            topic=self.topic,
            group=group,
            delay_level=self.delay_level or None,
            due_ts_ms=deliver_ts,
        )
        return msg, invoke

    async def send_one(self) -> bool:
        """One recorded send; True when acknowledged."""
        msg, invoke = self._next_message()
        receipt = await self._send_recorded(msg, invoke)
        if receipt is None:
            return False
        self.acked.add(invoke.key)
        return True

    async def _send_recorded(
        self, msg: Message, invoke: SendInvoke, transaction: Transaction | None = None
    ) -> SendReceipt | None:
        """Send ``msg`` recording invoke and outcome; the receipt when acknowledged."""
        key = invoke.key
        self.history.record(self.process, "invoke", invoke)
        self.sent += 1
        with self._inflight.track():
            try:
                receipt = await self.producer.send(msg, transaction=transaction)
            except asyncio.CancelledError:
                self.history.record(self.process, "info", SendOutcome(key=key, error="cancelled"))
                self.unknown += 1
                raise
            except (HaError, OSError) as exc:
                error = f"{type(exc).__name__}: {exc}"
                broker = exc.broker_name if isinstance(exc, HaError) else None
                outcome = SendOutcome(key=key, error=error, broker=broker)
                if _definitely_not_stored(exc):
                    self.history.record(self.process, "fail", outcome)
                    self.failed += 1
                else:
                    self.history.record(self.process, "info", outcome)
                    self.unknown += 1
                return None
        self.history.record(
            self.process,
            "ok",
            SendOk(
                key=key,
                msg_id=receipt.msg_id,
                broker=receipt.broker_name,
                queue_id=receipt.queue_id,
                queue_offset=receipt.queue_offset,
            ),
        )
        return receipt

    async def burst(self, count: int) -> int:
        """Send ``count`` messages one after another (no pacing); returns how many were acked."""
        acked = 0
        for _ in range(count):
            acked += await self.send_one()
        return acked


def record_receive(
    history: HistoryWriter,
    process: str,
    consumer_group: str,
    m: ReceivedMessage,
    delivered: Delivered,
    t_ms: int | None = None,
) -> None:
    due = m.properties.get(PROPERTY_TIMER_DELIVER_MS)
    ev = history.record(
        process,
        "ok",
        Receive(
            key=m.key,
            msg_id=m.msg_id,
            broker=m.broker_name,
            queue_id=m.queue_id,
            queue_offset=m.queue_offset,
            consumer=process,
            consumer_group=consumer_group,
            group=m.message_group,
            due_ts_ms=int(due) if due and due.isdigit() else None,
            topic=m.topic,
            stored_ms=m.store_ts_ms or None,
            corrupt=True if m.body != body_for(m.key, BODY_SIZE) else None,
        ),
        t_ms=t_ms,
    )
    delivered.keys.add(m.key)
    delivered.count += 1
    delivered.last_ms = ev.t_ms


def record_read_outcome(
    history: HistoryWriter,
    process: str,
    consumer_group: str,
    topic: str,
    *,
    ok: bool,
    broker: str | None,
    error: str | None = None,
    t_ms: int | None = None,
) -> Event:
    """A poll that delivered nothing: ``receive`` fail (it failed: the group was not
    readable for this client) or ``receive`` ok without ``key`` (it worked and found
    nothing).  The checkers count both as read operations of ``broker``'s group (see
    :mod:`ha_controller.drills.checker`, "Availability"); neither is a delivery."""
    value: dict[str, Any] = {
        "key": None,
        "broker": broker,
        "consumer": process,
        "consumer_group": consumer_group,
        "topic": topic,
    }
    if error is not None:
        value["error"] = error
    event = Event(
        now_ms() if t_ms is None else t_ms, process, "ok" if ok else "fail", "receive", value
    )
    history.write(event)
    return event


class _RecordingConsumer:
    """What every consumer workload records: its subscription (``subscribe`` info when
    it starts) and each delivery (``receive`` ok, counted in :attr:`delivered`)."""

    consumer: AsyncLifecycle

    def _init_recording(
        self, history: HistoryWriter, process: str, topic: str, consumer_group: str
    ) -> None:
        self.history = history
        self.process = process
        self.topic = topic
        self.consumer_group = consumer_group
        self.delivered = Delivered()

    def _ack_value(self, key: str) -> Ack:
        return Ack(key=key, consumer=self.process, consumer_group=self.consumer_group)

    def _record_receive(self, m: ReceivedMessage, t_ms: int | None = None) -> None:
        record_receive(self.history, self.process, self.consumer_group, m, self.delivered, t_ms)

    def _record_read(self, *, ok: bool, broker: str | None, error: str | None = None) -> None:
        record_read_outcome(
            self.history,
            self.process,
            self.consumer_group,
            self.topic,
            ok=ok,
            broker=broker,
            error=error,
        )

    async def _subscribe_and_start(self) -> None:
        self.history.record(
            self.process,
            "info",
            Subscribe(consumer=self.process, consumer_group=self.consumer_group, topic=self.topic),
        )
        await self.consumer.start()


class _ListenerWorkload(_RecordingConsumer, AsyncLifecycle):
    """A push-style workload: the client calls :meth:`_listener`, which records the
    delivery and its ``ack`` (the listener always succeeds)."""

    async def _listener(self, m: ReceivedMessage) -> bool:
        self._record_receive(m)
        self.history.record(self.process, "ok", self._ack_value(m.key))
        return True

    async def start(self) -> None:
        await self._subscribe_and_start()

    async def aclose(self) -> None:
        await self.consumer.aclose()


class _ConsumerLoop(_RecordingConsumer):
    """A consumer workload: records its subscription, runs :meth:`_run` as one task
    between ``async with`` enter and exit, and can be paused (a fault hook waits for
    it to be idle)."""

    def _init_loop(
        self, history: HistoryWriter, process: str, topic: str, consumer_group: str
    ) -> None:
        self._init_recording(history, process, topic, consumer_group)
        self._task: asyncio.Task[None] | None = None
        self._running = asyncio.Event()
        self._running.set()
        self._busy = _InFlight()

    async def pause(self) -> None:
        """Stop the loop; returns once no operation of it is in progress."""
        self._running.clear()
        await self._busy.idle.wait()

    def resume(self) -> None:
        self._running.set()

    async def __aenter__(self) -> Self:
        await self._subscribe_and_start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.process)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await _cancel(self._task)
        self._task = None
        await self.consumer.aclose()

    async def _run(self) -> None:
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def _working(self) -> AsyncIterator[None]:
        """One operation of the loop: waits while paused, then counts as in progress."""
        await self._running.wait()
        with self._busy.track():
            yield


class PushWorkload(_ListenerWorkload):
    """A push consumer that records each delivery (``receive``) and its ``ack``."""

    def __init__(
        self,
        namesrv: str,
        topic: str,
        consumer_group: str,
        history: HistoryWriter,
        *,
        process: str = "consumer-0",
    ) -> None:
        self._init_recording(history, process, topic, consumer_group)
        self.consumer: PushConsumer = PushConsumer(
            namesrv,
            consumer_group,
            topic,
            self._listener,
            commit_interval_s=1.0,
            rebalance_interval_s=2.0,
            heartbeat_interval_s=3.0,
            pull_error_backoff_s=0.3,
            suspend_timeout_ms=5000,
        )


class PullWorkload(_ConsumerLoop):
    """Pulls every queue of ``topic`` and commits offsets itself, recording the commits."""

    def __init__(
        self,
        namesrv: str,
        topic: str,
        consumer_group: str,
        history: HistoryWriter,
        *,
        process: str = "puller-0",
        suspend_timeout_ms: int = 2000,
        batch: int = 32,
        requeue_interval_s: float = 2.0,
    ) -> None:
        self._init_loop(history, process, topic, consumer_group)
        self.suspend_timeout_ms = suspend_timeout_ms
        self.batch = batch
        self.requeue_interval_s = requeue_interval_s
        # one attempt per pull: a failed attempt is a failed read in the history (the
        # loop below tries again), not hidden in a slow pull (as sends use 1 attempt)
        self.consumer: PullConsumer = PullConsumer(
            namesrv, consumer_group, request_timeout_ms=3000, call_attempts=1
        )
        self._queues: dict[MessageQueue, asyncio.Task[None]] = {}

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            while True:
                try:
                    queues = await self.consumer.queues(self.topic)
                except (HaError, OSError) as exc:
                    log.debug("no queues of %s yet: %s", self.topic, exc)
                    queues = []
                for mq in queues:
                    if mq not in self._queues:
                        self._queues[mq] = tg.create_task(self._queue_loop(mq), name=f"pull-{mq}")
                await asyncio.sleep(self.requeue_interval_s)

    async def _queue_loop(self, mq: MessageQueue) -> None:
        offset: int | None = None
        committed: int | None = None
        name = mq_name(mq)
        failing = False  # the last pull of this queue failed (recorded)
        while True:
            async with self._working():
                try:
                    if offset is None:
                        committed = await self.consumer.committed_offset(mq)
                        offset = max(committed, 0)
                    result = await self.consumer.pull(
                        mq, offset, self.batch, self.suspend_timeout_ms
                    )
                except (HaError, OSError) as exc:
                    log.debug("pull of %s failed: %s", mq, exc)
                    result = None
                    failing = True
                    self._record_read(ok=False, broker=mq.broker_name, error=type(exc).__name__)
                if result is not None:
                    now = now_ms()
                    if failing and not result.messages:
                        # readable again, nothing new: the success that closes the window
                        self._record_read(ok=True, broker=mq.broker_name)
                    failing = False
                    for m in result.messages:
                        self._record_receive(m, now)
                    if result.status is PullStatus.OFFSET_ILLEGAL or result.messages:
                        offset = result.next_begin_offset
                    if offset is not None and offset != committed:
                        committed = await self._commit(mq, name, offset, committed)
            if result is None:
                await asyncio.sleep(0.3)

    async def _commit(
        self, mq: MessageQueue, name: str, offset: int, prev: int | None
    ) -> int | None:
        value = OffsetCommit(consumer_group=self.consumer_group, mq=name, offset=offset)
        self.history.record(self.process, "invoke", value)
        try:
            await self.consumer.commit(mq, offset)
        except (HaError, OSError) as exc:
            log.debug("commit of %s at %d failed: %s", mq, offset, exc)
            self.history.record(self.process, "fail", value)
            return prev
        self.history.record(self.process, "ok", value)
        return offset


async def offset_probe(
    namesrv: str,
    topic: str,
    consumer_group: str,
    history: HistoryWriter,
    *,
    process: str = "prober",
    clock_ms: Callable[[], int] = now_ms,
) -> dict[str, int]:
    """Read the committed offset of every queue of ``topic`` from its group's id 0
    (0 for a queue it has no offset of)."""
    out: dict[str, int] = {}
    async with PullConsumer(namesrv, consumer_group) as consumer:
        for mq in await consumer.queues(topic):
            t_ms = clock_ms()
            try:
                offset = await consumer.committed_offset(mq)
            except (HaError, OSError) as exc:
                log.warning("offset probe of %s failed: %s", mq, exc)
                continue
            # No offset at all (a master that lost or never stored the group's offsets)
            # makes a consumer start over at the queue's first message, as this
            # workload's pull loop does: a rollback to 0 when something was committed.
            offset = max(offset, 0)
            name = mq_name(mq)
            out[name] = offset
            history.record(
                process,
                "ok",
                OffsetProbe(
                    consumer_group=consumer_group, mq=name, offset=offset, broker=mq.broker_name
                ),
                t_ms=t_ms,
            )
    return out


# --- delayed messages ------------------------------------------------------------------


class DelayedProducerWorkload(ProducerWorkload):
    """Alternates delay-level and timer messages (never FIFO).

    ``levels_ms`` is the brokers' configured level table (``HAC_DELAY_LEVELS``) and
    ``levels`` the levels to draw from; timer delays are drawn from ``timer_ms``
    (inclusive bounds).  A level message is recorded with ``delay_ms`` = its level's
    configured delay, a timer message with its absolute ``due_ts_ms``.  While
    :attr:`blackout_ms` (wall-clock ``(start, end)``) is set, delays are drawn among
    those whose due time falls outside it (when there is one).
    """

    def __init__(
        self,
        namesrv: str,
        topic: str,
        history: HistoryWriter,
        *,
        levels_ms: Sequence[int],
        levels: Sequence[int],
        timer_ms: tuple[int, int],
        seed: int = 0,
        **options: Any,
    ) -> None:
        if not levels or any(not 1 <= lv <= len(levels_ms) for lv in levels):
            raise ValueError(f"levels {list(levels)} must be within 1..{len(levels_ms)}")
        if not 0 < timer_ms[0] <= timer_ms[1]:
            raise ValueError(f"timer_ms must be 0 < low <= high, got {timer_ms}")
        super().__init__(namesrv, topic, history, **options)
        self.levels_ms = tuple(levels_ms)
        self.levels = tuple(levels)
        self.timer_ms = timer_ms
        self.blackout_ms: tuple[int, int] | None = None
        self._rng = random.Random(seed)

    def _choose(self, now: int, delays: Sequence[int]) -> int:
        """One of ``delays`` (ms), avoiding due times in the blackout when possible."""
        if self.blackout_ms is not None:
            start, end = self.blackout_ms
            allowed = [d for d in delays if not start <= now + d <= end]
            if allowed:
                return self._rng.choice(allowed)
        return self._rng.choice(delays)

    def _next_message(self) -> tuple[Message, SendInvoke]:
        key = f"{self.process}-{self._seq}"
        timer = self._seq % 2 == 1
        self._seq += 1
        body = body_for(key, self.size)
        now = now_ms()
        if timer:
            low, high = self.timer_ms
            due = now + self._choose(now, range(low, high + 1, 50))
            msg = Message(self.topic, body, keys=(key,), deliver_ts_ms=due)
            return msg, SendInvoke(key=key, topic=self.topic, due_ts_ms=due)
        delay = self._choose(now, [self.levels_ms[lv - 1] for lv in self.levels])
        level = self.levels_ms.index(delay) + 1
        msg = Message(self.topic, body, keys=(key,), delay_level=level)
        return msg, SendInvoke(key=key, topic=self.topic, delay_ms=delay)


# --- transactions ----------------------------------------------------------------------

TxPlan = Literal["commit", "rollback", "check-commit", "check-rollback"]
TX_PLANS: Final[tuple[TxPlan, ...]] = ("commit", "rollback", "check-commit", "check-rollback")


class TransactionWorkload(ProducerWorkload):
    """One transaction per message, resolved at once or left to the brokers' check.

    Each key draws a plan (weights ``plan_weights`` over :data:`TX_PLANS`).  ``commit``
    / ``rollback`` end the transaction right after the half message is stored; the
    ``check-*`` plans leave it open and the producer's checker answers the brokers'
    check-back with the plan's outcome (also for an explicit end whose outcome was
    unknown).  :attr:`acked` holds the keys that must be delivered (stored and
    committed); :meth:`unresolved` those stored and not resolved yet.
    """

    def __init__(
        self,
        namesrv: str,
        topic: str,
        history: HistoryWriter,
        *,
        seed: int = 0,
        plan_weights: Sequence[float] = (0.35, 0.15, 0.3, 0.2),
        **options: Any,
    ) -> None:
        if len(plan_weights) != len(TX_PLANS):
            raise ValueError(f"plan_weights needs {len(TX_PLANS)} weights")
        super().__init__(namesrv, topic, history, checker=self._check, **options)
        self.plan_weights = tuple(plan_weights)
        self.plans: dict[str, TxPlan] = {}
        self.stored: set[str] = set()
        self.resolved: dict[str, bool] = {}  # key -> committed
        self.checks = 0
        self._rng = random.Random(seed)

    def unresolved(self) -> set[str]:
        return self.stored - self.resolved.keys()

    async def stop(self) -> None:
        """Stop sending; the producer stays open (until the workload exits) to answer the
        brokers' check-backs of the transactions still open."""
        await self.stop_sending()

    def _resolve(self, key: str, commit: bool) -> None:
        self.resolved[key] = commit
        if commit and key in self.stored:
            self.acked.add(key)

    async def send_one(self) -> bool:
        key = f"{self.process}-{self._seq}"
        self._seq += 1
        plan = self._rng.choices(TX_PLANS, self.plan_weights)[0]
        self.plans[key] = plan
        msg = Message(self.topic, body_for(key, self.size), keys=(key,))
        tx = self.producer.begin_transaction()
        invoke = SendInvoke(key=key, topic=self.topic, tx=True)
        if await self._send_recorded(msg, invoke, tx) is None:
            return False
        self.stored.add(key)
        if key in self.resolved:  # a check answered before the send's ok arrived
            self._resolve(key, self.resolved[key])
        if plan in ("commit", "rollback"):
            await self._end(tx, key, commit=plan == "commit")
        return True

    async def _end(self, tx: Transaction, key: str, *, commit: bool) -> None:
        value = EndTx(key=key, commit=commit)
        self.history.record(self.process, "invoke", value)
        with self._inflight.track():
            try:
                await (tx.commit() if commit else tx.rollback())
            except asyncio.CancelledError:
                self.history.record(self.process, "info", value)
                raise
            except (HaError, OSError) as exc:
                # END_TRANSACTION may or may not have arrived: the check decides
                log.debug("end of transaction %s failed: %s", key, exc)
                self.history.record(self.process, "info", value)
                return
        self.history.record(self.process, "ok", value)
        self._resolve(key, commit)

    async def _check(self, message: ReceivedMessage) -> TransactionResolution:
        plan = self.plans.get(message.key)
        if plan is None:
            return TransactionResolution.UNKNOWN
        commit = plan in ("commit", "check-commit")
        self.checks += 1
        # The answer goes out as END_TRANSACTION right after; should it be lost, the
        # brokers ask again (the schema records the producer's answer as the outcome).
        self.history.record(self.process, "ok", EndTx(key=message.key, commit=commit, via="check"))
        self._resolve(message.key, commit)
        return TransactionResolution.COMMIT if commit else TransactionResolution.ROLLBACK


# --- POP ---------------------------------------------------------------------------------


class PopWorkload(_ConsumerLoop):
    """Receives with a SimpleConsumer (POP) and acks, leaving a share un-acked once.

    A first delivery (not from the retry topic) is not acked with probability
    ``skip_ratio``: the key goes to :attr:`skipped` and a ``nack`` info event records
    the decision; the brokers revive it after ``invisible_s`` into ``%RETRY%<group>``
    and that delivery is acked.  Failed acks are recorded as ``ack`` fail (ignored by the
    checkers): such a message comes back too.
    """

    def __init__(
        self,
        namesrv: str,
        topic: str,
        consumer_group: str,
        history: HistoryWriter,
        *,
        process: str = "pop-0",
        invisible_s: float = 4.0,
        skip_ratio: float = 0.1,
        batch: int = 16,
        seed: int = 0,
    ) -> None:
        if not 0 <= skip_ratio < 1:
            raise ValueError(f"skip_ratio must be in [0, 1), got {skip_ratio}")
        self._init_loop(history, process, topic, consumer_group)
        self.skip_ratio = skip_ratio
        self.batch = batch
        self.acked: set[str] = set()
        self.skipped: set[str] = set()
        self.retried: set[str] = set()  # keys delivered from the retry topic
        self.ack_failures = 0
        self.consumer: SimpleConsumer = SimpleConsumer(
            namesrv, consumer_group, [topic], invisible_duration_s=invisible_s
        )
        self._rng = random.Random(seed)
        self._failing = False  # the last receive failed (recorded)

    def pending(self) -> set[str]:
        """Delivered keys not acked yet (the deliberately skipped ones among them)."""
        return self.delivered.keys - self.acked

    async def _run(self) -> None:
        while True:
            async with self._working():
                await self._receive_once()

    async def _receive_once(self) -> None:
        try:
            messages = await self.consumer.receive(self.batch, wait_s=1.0)
        except (HaError, OSError) as exc:
            log.debug("receive from %s failed: %s", self.topic, exc)
            self._failing = True
            self._record_read(ok=False, broker=None, error=type(exc).__name__)
            await asyncio.sleep(0.3)
            return
        if self._failing and not messages:
            self._record_read(ok=True, broker=None)
        self._failing = False
        now = now_ms()
        for m in messages:
            self._record_receive(m, now)
        for m in messages:
            await self._settle(m)

    async def _settle(self, m: ReceivedMessage) -> None:
        key = m.key
        if m.topic != self.topic:
            self.retried.add(key)
        elif key not in self.skipped and self._rng.random() < self.skip_ratio:
            self.skipped.add(key)
            self.history.write(
                Event(
                    now_ms(),
                    self.process,
                    "info",
                    "nack",
                    {"key": key, "consumer": self.process, "consumer_group": self.consumer_group},
                )
            )
            return
        value = self._ack_value(key)
        try:
            await self.consumer.ack(m)
        except (HaError, OSError, ValueError) as exc:
            log.debug("ack of %s failed: %s", key, exc)
            self.ack_failures += 1
            self.history.record(self.process, "fail", value)
            return
        self.history.record(self.process, "ok", value)
        self.acked.add(key)


# --- orderly consumption with queue locks -------------------------------------------------


class RecordingQueueLocker(QueueLocker):
    """A :class:`QueueLocker` that records its lock rounds and unlocks in the history."""

    def __init__(self, history: HistoryWriter, process: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.history = history
        self.process = process
        self.granted_now: set[MessageQueue] = set()
        self.grants = 0
        self.refusals = 0

    def _value(self, mq: MessageQueue, *, granted: bool | None = None) -> Lock:
        return Lock(
            consumer=self.process, consumer_group=self.group, mq=mq_name(mq), granted=granted
        )

    def _unlock_value(self, mq: MessageQueue, reason: str) -> Unlock:
        return Unlock(
            consumer=self.process, consumer_group=self.group, mq=mq_name(mq), reason=reason
        )

    async def lock(self, mqs: Iterable[MessageQueue]) -> LockOutcome:
        wanted = sorted(mqs)
        for mq in wanted:
            self.history.record(self.process, "invoke", self._value(mq))
        outcome = await super().lock(wanted)
        for mq in sorted(outcome.granted):
            self.history.record(self.process, "ok", self._value(mq, granted=True))
            self.granted_now.add(mq)
            self.grants += 1
        for mq in sorted(outcome.refused):
            self.history.record(self.process, "ok", self._value(mq, granted=False))
            self.refusals += 1
            if mq in self.granted_now:  # the consumer stops consuming it at once
                self.granted_now.discard(mq)
                self.history.record(self.process, "info", self._unlock_value(mq, "dropped"))
        for mq in sorted(outcome.unknown):
            self.history.record(self.process, "info", self._value(mq))
        return outcome

    async def unlock(self, mqs: Iterable[MessageQueue]) -> None:
        wanted = sorted(mqs)
        # the consumer stopped consuming these before it asked
        for mq in wanted:
            self.history.record(self.process, "invoke", self._unlock_value(mq, "unlock"))
            self.granted_now.discard(mq)
        await super().unlock(wanted)
        for mq in wanted:
            self.history.record(self.process, "ok", self._unlock_value(mq, "unlock"))


class _RecordingOrderlyConsumer(OrderlyPushConsumer):
    def __init__(self, history: HistoryWriter, process: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.locker = RecordingQueueLocker(
            history,
            process,
            self.routes,
            self._pool,
            self.group,
            self.client_id,
            request_timeout_ms=self.request_timeout_ms,
        )


class OrderlyWorkload(_ListenerWorkload):
    """An orderly push consumer whose deliveries, acks, locks and unlocks are recorded.

    Options are those of :class:`~ha_controller.client.orderly.OrderlyPushConsumer`
    (drill defaults: rebalance every 2 s, heartbeats every 1 s, no dead-letter topic).
    :meth:`start` is idempotent; :meth:`aclose` stops consuming: commit, unlock
    (recorded), close; idempotent.
    """

    def __init__(
        self,
        namesrv: str,
        topic: str,
        consumer_group: str,
        history: HistoryWriter,
        *,
        process: str = "orderly-0",
        **options: Any,
    ) -> None:
        self._init_recording(history, process, topic, consumer_group)
        defaults: dict[str, Any] = {
            "rebalance_interval_s": 2.0,
            "heartbeat_interval_s": 1.0,
            "commit_interval_s": 1.0,
            "suspend_timeout_ms": 2000,
            "pull_error_backoff_s": 0.3,
            "dead_letter": False,
        }
        self.consumer: _RecordingOrderlyConsumer = _RecordingOrderlyConsumer(
            history,
            process,
            namesrv,
            consumer_group,
            topic,
            self._listener,
            **{**defaults, **options},
        )
        self._started = False

    @property
    def locker(self) -> RecordingQueueLocker:
        locker = self.consumer.locker
        assert isinstance(locker, RecordingQueueLocker)
        return locker

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        await super().start()
