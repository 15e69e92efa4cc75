"""The workloads behind ``hactl produce`` and ``hactl consume``: every message
gets a unique key and a body derived from it, and ``--json`` prints one object
per message so that any script can audit a run (DESIGN.md §8)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from ha_controller.client.message import Message, ReceivedMessage
from ha_controller.client.producer import Producer
from ha_controller.client.push_consumer import PushConsumer
from ha_controller.protocol.errors import HaError


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


async def produce(
    namesrv: list[str],
    topic: str,
    count: int,
    *,
    rate: float | None = None,
    size: int = 128,
    delay_level: int = 0,
    message_group: str | None = None,
    json_out: bool = False,
    out: TextIO = sys.stdout,
    progress: Callable[[ProduceStats], None] | None = None,
    run_id: str | None = None,
) -> ProduceStats:
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
                if json_out:
                    print(json.dumps({"key": key, "error": name, "detail": str(exc)}), file=out)
                continue
            stats.acknowledged += 1
            if json_out:
                line: dict[str, Any] = {
                    "msg_id": receipt.uniq_key,
                    "key": key,
                    "topic": topic,
                    "broker": receipt.broker_name,
                    "queue_id": receipt.queue_id,
                    "queue_offset": receipt.queue_offset,
                }
                if delay_level:
                    line["due_ts_ms"] = sent_at  # refined by the caller's delay table
                print(json.dumps(line), file=out, flush=True)
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
    json_out: bool = False,
    out: TextIO = sys.stdout,
) -> ConsumeStats:
    stats = ConsumeStats()
    done = asyncio.Event()

    async def listener(m: ReceivedMessage) -> bool:
        stats.received += 1
        if m.key in stats.keys:
            stats.duplicates += 1
        stats.keys.add(m.key)
        if json_out:
            print(
                json.dumps(
                    {
                        "msg_id": m.uniq_key,
                        "key": m.key,
                        "topic": m.topic,
                        "broker": m.broker_name,
                        "queue_id": m.queue_id,
                        "queue_offset": m.queue_offset,
                        "body_len": len(m.body),
                        "born_ts_ms": m.born_ts_ms,
                        "received_ts_ms": now_ms(),
                    }
                ),
                file=out,
                flush=True,
            )
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
