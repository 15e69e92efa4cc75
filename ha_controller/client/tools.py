"""The workloads behind ``hactl produce`` and ``hactl consume``: every message gets a
unique key and a body derived from it, so that any script can audit a run
(``--json``: one JSON object per message).

Nothing here prints: each outcome goes to the caller's callback (``on_sent``,
``on_message``, ``progress``); ``hactl --json`` turns them into one JSON object per
message (:mod:`ha_controller.cli.produce`).
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from ha_controller.acl import Credentials
from ha_controller.client.message import Message, ReceivedMessage, SendReceipt
from ha_controller.client.producer import Producer
from ha_controller.client.push_consumer import PushConsumer
from ha_controller.protocol.errors import HaError
from ha_controller.protocol.properties import DELAY_LEVELS_MS

__all__ = [
    "ConsumeStats",
    "ProduceStats",
    "Sent",
    "body_for",
    "consume",
    "due_ts_ms",
    "now_ms",
    "produce",
]


def body_for(key: str, size: int) -> bytes:
    """A body of ``size`` bytes derived from ``key`` (so receivers can verify it)."""
    seed = hashlib.sha256(key.encode()).digest()
    reps = size // len(seed) + 1
    return (seed * reps)[:size]


def now_ms() -> int:
    return int(time.time() * 1000)


def due_ts_ms(sent_at_ms: int, *, delay_level: int = 0, deliver_ts_ms: int | None = None) -> int:
    """When a delayed message is due: ``deliver_ts_ms`` when given (a timer message),
    else the send time plus the level's delay in RocketMQ's default level table
    (``1s 5s 10s 30s 1m 2m ... 1h 2h``; a level above 18 counts as 18, as the brokers
    clamp it).  Brokers configured with other levels (``delay_levels``) deliver by
    theirs, which a client cannot know."""
    if deliver_ts_ms is not None:
        return deliver_ts_ms
    if delay_level < 1:
        return sent_at_ms
    return sent_at_ms + DELAY_LEVELS_MS[min(delay_level, len(DELAY_LEVELS_MS)) - 1]


@dataclass
class ProduceStats:
    sent: int = 0
    acknowledged: int = 0
    failed: int = 0
    #: error class name -> how many sends failed with it
    errors: dict[str, int] = field(default_factory=dict)
    #: error class name -> the first failure's message (the reason)
    reasons: dict[str, str] = field(default_factory=dict)

    def add_failure(self, exc: BaseException) -> None:
        self.failed += 1
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1
        self.reasons.setdefault(name, str(exc))


@dataclass(frozen=True, slots=True)
class Sent:
    """The outcome of one send: a receipt when acknowledged, else the error."""

    key: str
    topic: str
    #: wall-clock ms just before the send (a delayed message is due after it)
    sent_at_ms: int
    receipt: SendReceipt | None = None
    error: HaError | None = None
    #: when a delayed message is due (see :func:`due_ts_ms`); None when not delayed
    due_ts_ms: int | None = None


async def produce(
    namesrv: list[str],
    topic: str,
    count: int,
    *,
    rate: float | None = None,
    size: int = 128,
    delay_level: int = 0,
    deliver_ts_ms: int | None = None,
    message_group: str | None = None,
    on_sent: Callable[[Sent], None] | None = None,
    progress: Callable[[ProduceStats], None] | None = None,
    run_id: str | None = None,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials | None = None,
) -> ProduceStats:
    """Send ``count`` messages keyed ``<run_id>-<n>``; ``on_sent`` gets every outcome,
    ``progress`` the stats after every send.

    The topic's route is fetched first, so an unreachable nameserver fails the call
    (``NameserverUnavailable``) instead of every send."""
    run_id = run_id or uuid.uuid4().hex[:8]
    stats = ProduceStats()
    interval = 1.0 / rate if rate else 0.0
    delayed = bool(delay_level) or deliver_ts_ms is not None
    async with Producer(
        namesrv,
        group=f"hactl-produce-{run_id}",
        topics=[topic],
        tls=tls,
        credentials=credentials,
    ) as producer:
        start = time.monotonic()
        for i in range(count):
            if interval:
                delay = start + i * interval - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            key = f"{run_id}-{i:08d}"
            msg = Message(
                topic,
                body_for(key, size),
                keys=(key,),
                delay_level=delay_level,
                deliver_ts_ms=deliver_ts_ms,
                message_group=message_group,
            )
            stats.sent += 1
            sent_at = now_ms()
            due = (
                due_ts_ms(sent_at, delay_level=delay_level, deliver_ts_ms=deliver_ts_ms)
                if delayed
                else None
            )
            try:
                receipt = await producer.send(msg)
            except HaError as exc:
                stats.add_failure(exc)
                if on_sent is not None:
                    on_sent(Sent(key, topic, sent_at, error=exc, due_ts_ms=due))
            else:
                stats.acknowledged += 1
                if on_sent is not None:
                    on_sent(Sent(key, topic, sent_at, receipt=receipt, due_ts_ms=due))
            if progress is not None:
                progress(stats)
    return stats


@dataclass
class ConsumeStats:
    received: int = 0
    keys: set[str] = field(default_factory=set)
    duplicates: int = 0


async def consume(
    namesrv: list[str],
    topic: str,
    group: str,
    *,
    count: int | None,
    timeout_s: float,
    on_message: Callable[[ReceivedMessage], None] | None = None,
    progress: Callable[[ConsumeStats], None] | None = None,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials | None = None,
) -> ConsumeStats:
    """Consume as a push consumer until ``count`` messages were handed out or
    ``timeout_s`` passed; ``on_message`` sees every message handed out.

    Exactly ``count`` messages are handed out and committed: once that many were, the
    listener holds every further delivery without finishing it, so its offset stays
    uncommitted (the consumer commits only up to the lowest unfinished message of each
    queue) and the group's next consumer gets it.  Without ``count``, everything that
    arrives before the timeout is handed out and committed."""
    stats = ConsumeStats()
    done = asyncio.Event()
    if count is not None and count <= 0:
        return stats
    held = asyncio.Event()  # never set: a delivery past ``count`` waits here until closed

    async def listener(m: ReceivedMessage) -> bool:
        if count is not None and stats.received >= count:
            await held.wait()  # cancelled when the consumer closes: not consumed
        stats.received += 1
        if m.key in stats.keys:
            stats.duplicates += 1
        stats.keys.add(m.key)
        if on_message is not None:
            on_message(m)
        if progress is not None:
            progress(stats)
        if count is not None and stats.received >= count:
            done.set()
        return True

    batch = 32 if count is None else max(1, min(32, count))
    async with PushConsumer(
        namesrv, group, topic, listener, batch=batch, tls=tls, credentials=credentials
    ):
        try:
            async with asyncio.timeout(timeout_s):
                await done.wait()
        except TimeoutError:
            pass
    return stats
