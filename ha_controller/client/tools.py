"""The workloads behind ``hactl produce`` and ``hactl consume``: every message gets a
unique key and a body derived from it, so that any script can audit a run
(DESIGN.md §8).

Nothing here prints: each outcome goes to the caller's callback (``on_sent``,
``on_message``, ``progress``); ``hactl --json`` turns them into one JSON object per
message (:mod:`ha_controller.cli.tools`).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from ha_controller.client.message import Message, ReceivedMessage, SendReceipt
from ha_controller.client.producer import Producer
from ha_controller.client.push_consumer import PushConsumer
from ha_controller.protocol.errors import HaError

__all__ = [
    "ConsumeStats",
    "ProduceStats",
    "Sent",
    "body_for",
    "consume",
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


@dataclass
class ProduceStats:
    sent: int = 0
    acknowledged: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Sent:
    """The outcome of one send: a receipt when acknowledged, else the error."""

    key: str
    topic: str
    #: wall-clock ms just before the send (a delayed message is due after it)
    sent_at_ms: int
    receipt: SendReceipt | None = None
    error: HaError | None = None


async def produce(
    namesrv: list[str],
    topic: str,
    count: int,
    *,
    rate: float | None = None,
    size: int = 128,
    delay_level: int = 0,
    message_group: str | None = None,
    on_sent: Callable[[Sent], None] | None = None,
    progress: Callable[[ProduceStats], None] | None = None,
    run_id: str | None = None,
) -> ProduceStats:
    """Send ``count`` messages keyed ``<run_id>-<n>``; ``on_sent`` gets every outcome,
    ``progress`` the stats after every 100th acknowledged send."""
    run_id = run_id or uuid.uuid4().hex[:8]
    stats = ProduceStats()
    interval = 1.0 / rate if rate else 0.0
    start = time.monotonic()
    async with Producer(namesrv, group=f"hactl-produce-{run_id}") as producer:
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
                message_group=message_group,
            )
            stats.sent += 1
            sent_at = now_ms()
            try:
                receipt = await producer.send(msg)
            except HaError as exc:
                stats.failed += 1
                name = type(exc).__name__
                stats.errors[name] = stats.errors.get(name, 0) + 1
                if on_sent is not None:
                    on_sent(Sent(key, topic, sent_at, error=exc))
                continue
            stats.acknowledged += 1
            if on_sent is not None:
                on_sent(Sent(key, topic, sent_at, receipt=receipt))
            if progress is not None and stats.sent % 100 == 0:
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
) -> ConsumeStats:
    """Consume as a push consumer until ``count`` distinct keys arrived or ``timeout_s``
    passed; ``on_message`` sees every delivery."""
    stats = ConsumeStats()
    done = asyncio.Event()

    async def listener(m: ReceivedMessage) -> bool:
        stats.received += 1
        if m.key in stats.keys:
            stats.duplicates += 1
        stats.keys.add(m.key)
        if on_message is not None:
            on_message(m)
        if count is not None and len(stats.keys) >= count:
            done.set()
        return True

    async with PushConsumer(namesrv, group, topic, listener):
        try:
            async with asyncio.timeout(timeout_s):
                await done.wait()
        except TimeoutError:
            pass
    return stats
