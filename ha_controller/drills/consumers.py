"""Drill consumers: every delivery and every poll recorded.

:class:`PushWorkload`, :class:`PullWorkload` (commits its offsets itself, pausable
around :func:`offset_probe`) and :class:`PopWorkload` (acks, and deliberately not
some); each checks every body against its key.  The rules are in
:mod:`ha_controller.drills.workloads`; the orderly consumers with their recorded locks
are in :mod:`ha_controller.drills.orderly_workload`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Self

from ha_controller.client.lifecycle import AsyncLifecycle
from ha_controller.client.message import MessageQueue, ReceivedMessage
from ha_controller.client.pull_consumer import PullConsumer, PullStatus
from ha_controller.client.push_consumer import PushConsumer
from ha_controller.client.simple_consumer import SimpleConsumer
from ha_controller.client.tools import body_for
from ha_controller.drills.history import (
    Ack,
    Event,
    HistoryWriter,
    OffsetCommit,
    OffsetProbe,
    Receive,
    Subscribe,
)
from ha_controller.drills.tasks import InFlight, cancel_and_wait
from ha_controller.protocol.errors import (
    HaError,
)
from ha_controller.protocol.properties import PROPERTY_TIMER_DELIVER_MS, now_ms

__all__ = [
    "Delivered",
    "ListenerWorkload",
    "PopWorkload",
    "PullWorkload",
    "PushWorkload",
    "mq_name",
    "offset_probe",
    "record_read_outcome",
    "record_receive",
]

log = logging.getLogger(__name__)


def _body_ok(key: str, body: bytes) -> bool:
    """Whether ``body`` is the one ``key``'s sender wrote: producers derive it from the key
    (:func:`body_for`) at the size they were given, so the received length says which.
    A body cut short would pass this check; the store's CRC refuses such a record."""
    return bool(body) and body == body_for(key, len(body))


def mq_name(mq: MessageQueue) -> str:
    """``"topic/broker/queue_id"`` as the history schema names a queue."""
    return f"{mq.topic}/{mq.broker_name}/{mq.queue_id}"


@dataclass
class Delivered:
    """Keys seen by one consumer group (for the drain)."""

    keys: set[str] = field(default_factory=set)
    count: int = 0
    last_ms: int = 0


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
            corrupt=True if not _body_ok(m.key, m.body) else None,
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


class ListenerWorkload(_RecordingConsumer, AsyncLifecycle):
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
        self._busy = InFlight()

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
        await cancel_and_wait(self._task)
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


class PushWorkload(ListenerWorkload):
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
