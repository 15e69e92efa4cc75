"""Produce then consume N 1 KiB messages; msgs/s and MB/s.

    .venv/bin/python bench/throughput.py [--count 20000] [--concurrency 64]

The product default (SYNC replication to one slave, async flush) is measured
next to a baseline in the same run: one broker without replication. The
ratio is what a second copy costs.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import now, start_cluster

from ha_controller.client.message import Message
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer, PullStatus

TOPIC = "Bench"
SIZE = 1024


async def measure(
    replicas: int, env: dict[str, str], count: int, concurrency: int
) -> dict[str, float]:
    cluster = await start_cluster(replicas, env, TOPIC)
    try:
        body = b"x" * SIZE
        async with Producer(cluster.namesrv, group="bench-p") as producer:
            await producer.send(Message(TOPIC, body))  # warm the route
            sent = 0
            t0 = now()

            async def worker() -> None:
                nonlocal sent
                while sent < count:
                    sent += 1
                    await producer.send(Message(TOPIC, body))

            await asyncio.gather(*(worker() for _ in range(concurrency)))
            produce_s = now() - t0
        received = 0
        async with PullConsumer(cluster.namesrv, "bench-c") as pull:
            queues = await pull.queues(TOPIC)
            t0 = now()

            async def drain(mq: object) -> None:
                nonlocal received
                offset = 0
                while True:
                    res = await pull.pull(mq, offset, max_msgs=256, suspend_timeout_ms=0)  # type: ignore[arg-type]
                    if res.status is not PullStatus.FOUND:
                        return
                    received += len(res.messages)
                    offset = res.next_begin_offset

            await asyncio.gather(*(drain(q) for q in queues))
            consume_s = now() - t0
        return {
            "produce_msgs_s": count / produce_s,
            "produce_mb_s": count * SIZE / produce_s / 1e6,
            "consume_msgs_s": received / consume_s,
            "consume_mb_s": received * SIZE / consume_s / 1e6,
            "received": received,
        }
    finally:
        cluster.stop()


async def main(count: int, concurrency: int) -> None:
    base = await measure(
        1, {"HAC_TOTAL_REPLICAS": "1", "HAC_IN_SYNC_REPLICAS": "1"}, count, concurrency
    )
    sync = await measure(2, {}, count, concurrency)
    print(f"{count} x {SIZE} B messages, {concurrency} concurrent sends, 2-core machine")
    print(f"{'':34}{'produce msg/s':>14}{'MB/s':>8}{'consume msg/s':>15}{'MB/s':>8}")
    for name, r in (
        ("1 broker, no replica (baseline)", base),
        ("SYNC to 1 slave, async flush", sync),
    ):
        print(
            f"{name:34}{r['produce_msgs_s']:>14.0f}{r['produce_mb_s']:>8.1f}"
            f"{r['consume_msgs_s']:>15.0f}{r['consume_mb_s']:>8.1f}"
        )
    print(
        f"ratio SYNC/baseline: produce {sync['produce_msgs_s'] / base['produce_msgs_s']:.2f}, "
        f"consume {sync['consume_msgs_s'] / base['consume_msgs_s']:.2f}"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=64)
    a = ap.parse_args()
    asyncio.run(main(a.count, a.concurrency))
