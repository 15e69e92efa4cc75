"""End-to-end latency at a fixed rate: from send to receipt by a push
consumer (long polling), and send to acknowledgement; p50/p99/p999.

    .venv/bin/python bench/latency.py [--rate 500] [--seconds 10]

Baseline in the same run: the RPC round trip of a request to the same broker
(GET_MAX_OFFSET), so the ratio shows what the produce-store-replicate-wake-
deliver path costs over one bare round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import pct, start_cluster

from ha_controller.client.message import Message, ReceivedMessage
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer
from ha_controller.client.push_consumer import PushConsumer

TOPIC = "Bench"


async def main(rate: float, seconds: float) -> None:
    cluster = await start_cluster(2, topic=TOPIC)
    try:
        sent_at: dict[str, float] = {}
        latencies: list[float] = []
        ack_lat: list[float] = []

        async def listener(m: ReceivedMessage) -> bool:
            t = time.perf_counter()
            sent = sent_at.get(m.key)
            if sent is not None:
                latencies.append(t - sent)
            return True

        async with PushConsumer(cluster.namesrv, "lat-c", TOPIC, listener) as consumer:
            await asyncio.sleep(0.5)  # let the first rebalance assign queues
            async with Producer(cluster.namesrv, group="lat-p") as producer:
                n = int(rate * seconds)
                t0 = time.perf_counter()
                for i in range(n):
                    delay = t0 + i / rate - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    key = f"k{i}"
                    sent_at[key] = t_send = time.perf_counter()
                    await producer.send(Message(TOPIC, b"x" * 1024, keys=(key,)))
                    ack_lat.append(time.perf_counter() - t_send)
                deadline = time.perf_counter() + 10
                while len(latencies) < n and time.perf_counter() < deadline:
                    await asyncio.sleep(0.05)
            assert consumer.consumed >= 0
        rtt: list[float] = []
        async with PullConsumer(cluster.namesrv, "lat-rtt") as pull:
            mq = (await pull.queues(TOPIC))[0]
            for _ in range(2000):
                t = time.perf_counter()
                await pull.max_offset(mq)
                rtt.append(time.perf_counter() - t)
        print(f"{len(latencies)}/{int(rate * seconds)} messages at {rate:.0f} msg/s, 1 KiB, SYNC")
        print(f"{'':28}{'p50 ms':>9}{'p99 ms':>9}{'p999 ms':>9}")
        rows = (
            ("RPC round trip (baseline)", rtt),
            ("send -> ack (SYNC)", ack_lat),
            ("send -> receipt", latencies),
        )
        for name, xs in rows:
            print(
                f"{name:28}{pct(xs, 0.5) * 1000:>9.2f}{pct(xs, 0.99) * 1000:>9.2f}"
                f"{pct(xs, 0.999) * 1000:>9.2f}"
            )
        print(
            f"ratio p99 send->receipt / RPC round trip: {pct(latencies, 0.99) / pct(rtt, 0.99):.1f}"
        )
    finally:
        cluster.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=500)
    ap.add_argument("--seconds", type=float, default=10)
    a = ap.parse_args()
    asyncio.run(main(a.rate, a.seconds))
