"""Drill workloads: clients that record every operation in the history.

- :class:`ProducerWorkload` sends messages with unique keys (``<process>-<seq>``) at a
  bounded rate with a few sends in flight; normal, FIFO (``message_groups`` > 0: each
  key gets group ``g<n>`` round robin) or delayed (``delay_level`` or ``delay_ms``).
  Every send is an ``invoke`` followed by ``ok`` (acknowledged), ``fail`` (the client
  says it was not stored: no connection, not master, no route) or ``info`` (unknown:
  timeouts, a connection lost mid-call, anything else).
- :class:`PushWorkload` consumes with a :class:`~ha_controller.client.PushConsumer`;
  each listener call is a ``receive`` ok and, as the listener succeeds, an ``ack`` ok.
- :class:`PullWorkload` consumes every queue with a
  :class:`~ha_controller.client.PullConsumer` and commits offsets itself after each
  batch (``commit_offset`` invoke/ok/fail), so consumer-offset rollbacks after a master
  returns are visible; it can be paused (no pulls, no commits) around an offset probe.
- :func:`offset_probe` reads the group's committed offsets from the brokers
  (``offset_probe`` ok, timed at the request's start so that commits acknowledged
  before it are strictly earlier).

Hooks for the workloads other parts of the client are growing (transactions,
SimpleConsumer/POP, orderly consumption with strict locks) are in :data:`PENDING`:
:func:`available_workloads` reports which exist in the installed client.

All loops run in a task group owned by the workload: ``async with`` starts and stops it;
cancellation is re-raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Final

from ha_controller.client.message import Message, MessageQueue, ReceivedMessage
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer, PullStatus
from ha_controller.client.push_consumer import PushConsumer
from ha_controller.client.tools import body_for
from ha_controller.drills.history import (
    Ack,
    HistoryWriter,
    OffsetCommit,
    OffsetProbe,
    Receive,
    SendInvoke,
    SendOk,
    SendOutcome,
    Subscribe,
)
from ha_controller.protocol.errors import (
    BrokerUnavailable,
    HaError,
    NotMaster,
    TopicNotFound,
)

__all__ = [
    "PENDING",
    "Delivered",
    "ProducerWorkload",
    "PullWorkload",
    "PushWorkload",
    "available_workloads",
    "mq_name",
    "offset_probe",
]

log = logging.getLogger(__name__)

#: Workloads waiting for client APIs: name -> (module, attribute) that must exist.
PENDING: Final[dict[str, tuple[str, str]]] = {
    "transactional": ("ha_controller.client.producer", "TransactionChecker"),
    "pop": ("ha_controller.client.simple_consumer", "SimpleConsumer"),
    "strict-lock": ("ha_controller.client.orderly", "OrderlyPushConsumer"),
}


def available_workloads() -> dict[str, bool]:
    """Which of :data:`PENDING` the installed client can run."""
    out: dict[str, bool] = {}
    for name, (module, attr) in PENDING.items():
        try:
            out[name] = hasattr(importlib.import_module(module), attr)
        except ImportError:
            out[name] = False
    return out


def mq_name(mq: MessageQueue) -> str:
    """``"topic/broker/queue_id"`` as the history schema names a queue."""
    return f"{mq.topic}/{mq.broker_name}/{mq.queue_id}"


def _definitely_not_stored(exc: BaseException) -> bool:
    return isinstance(exc, BrokerUnavailable | NotMaster | TopicNotFound)


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
        size: int = 256,
        message_groups: int = 0,
        delay_level: int = 0,
        delay_ms: int = 0,
        max_attempts: int = 3,
        send_timeout_ms: int = 3000,
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
        )
        self.acked: set[str] = set()
        self.sent = 0
        self.failed = 0
        self.unknown = 0
        self._seq = 0
        self._inflight = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self._running = asyncio.Event()
        self._running.set()
        self._next_slot = 0.0
        self._task: asyncio.Task[None] | None = None

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    async def __aenter__(self) -> ProducerWorkload:
        await self.producer.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.process)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Stop sending: in-flight sends may finish (bounded by the send timeout); what is
        still in flight then is cancelled and recorded as info."""
        self.pause()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(
                self.producer.send_timeout_ms * self.producer.max_attempts / 1000 + 1
            ):
                await self._drained.wait()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.producer.aclose()

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
            deliver_ts = int(time.time() * 1000) + self.delay_ms
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
        key = invoke.key
        self.history.record(self.process, "invoke", invoke)
        self.sent += 1
        self._inflight += 1
        self._drained.clear()
        try:
            receipt = await self.producer.send(msg)
        except asyncio.CancelledError:
            self.history.record(self.process, "info", SendOutcome(key=key, error="cancelled"))
            self.unknown += 1
            raise
        except (HaError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            if _definitely_not_stored(exc):
                self.history.record(self.process, "fail", SendOutcome(key=key, error=error))
                self.failed += 1
            else:
                self.history.record(self.process, "info", SendOutcome(key=key, error=error))
                self.unknown += 1
            return False
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._drained.set()
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
        self.acked.add(key)
        return True

    async def burst(self, count: int) -> int:
        """Send ``count`` messages one after another (no pacing); returns how many were acked."""
        acked = 0
        for _ in range(count):
            acked += await self.send_one()
        return acked


class PushWorkload:
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
        self.history = history
        self.process = process
        self.topic = topic
        self.consumer_group = consumer_group
        self.delivered = Delivered()
        self.consumer = PushConsumer(
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

    async def _listener(self, m: ReceivedMessage) -> bool:
        record_receive(self.history, self.process, self.consumer_group, m, self.delivered)
        self.history.record(
            self.process,
            "ok",
            Ack(key=m.key, consumer=self.process, consumer_group=self.consumer_group),
        )
        return True

    async def __aenter__(self) -> PushWorkload:
        self.history.record(
            self.process,
            "info",
            Subscribe(consumer=self.process, consumer_group=self.consumer_group, topic=self.topic),
        )
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.aclose()


def record_receive(
    history: HistoryWriter,
    process: str,
    consumer_group: str,
    m: ReceivedMessage,
    delivered: Delivered,
    t_ms: int | None = None,
) -> None:
    due = m.properties.get("TIMER_DELIVER_MS")
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
        ),
        t_ms=t_ms,
    )
    delivered.keys.add(m.key)
    delivered.count += 1
    delivered.last_ms = ev.t_ms


class PullWorkload:
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
        self.history = history
        self.process = process
        self.topic = topic
        self.consumer_group = consumer_group
        self.suspend_timeout_ms = suspend_timeout_ms
        self.batch = batch
        self.requeue_interval_s = requeue_interval_s
        self.delivered = Delivered()
        self.consumer = PullConsumer(namesrv, consumer_group, request_timeout_ms=3000)
        self._running = asyncio.Event()
        self._running.set()
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._queues: dict[MessageQueue, asyncio.Task[None]] = {}

    async def pause(self) -> None:
        """Stop pulling and committing; returns once no pull or commit is in progress."""
        self._running.clear()
        await self._idle.wait()

    def resume(self) -> None:
        self._running.set()

    async def __aenter__(self) -> PullWorkload:
        self.history.record(
            self.process,
            "info",
            Subscribe(consumer=self.process, consumer_group=self.consumer_group, topic=self.topic),
        )
        await self.consumer.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.process)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.consumer.aclose()

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

    @contextlib.asynccontextmanager
    async def _working(self) -> AsyncIterator[None]:
        await self._running.wait()
        self._busy += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._busy -= 1
            if self._busy == 0:
                self._idle.set()

    async def _queue_loop(self, mq: MessageQueue) -> None:
        offset: int | None = None
        committed: int | None = None
        name = mq_name(mq)
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
                if result is not None:
                    now = int(time.time() * 1000)
                    for m in result.messages:
                        record_receive(
                            self.history, self.process, self.consumer_group, m, self.delivered, now
                        )
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
    clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
) -> dict[str, int]:
    """Read the committed offset of every queue of ``topic`` from its group's id 0."""
    out: dict[str, int] = {}
    async with PullConsumer(namesrv, consumer_group) as consumer:
        for mq in await consumer.queues(topic):
            t_ms = clock_ms()
            try:
                offset = await consumer.committed_offset(mq)
            except (HaError, OSError) as exc:
                log.warning("offset probe of %s failed: %s", mq, exc)
                continue
            if offset < 0:
                continue
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
