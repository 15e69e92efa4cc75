"""What a POP and its ack cost with ``flush_mode = "sync"``: the latency of each, with
``--consumers`` simple consumers popping and acking at once.

    .venv/bin/python bench/pop_sync.py [--messages 2000] [--consumers 4] [--replicas 1]

``--messages`` are sent first; then each consumer pops (up to 16 at a time, no
long polling) and acks every message it got, one ack after the other, until all are
acked.  With sync flush a POP is answered once the group's offsets are on disk (one
group-committed write of the offset table shared by the POPs in flight), and an ack
once its ACK record is synced with the commit log.  Run it with ``PYTHONPATH`` on the
code to measure (the brokers start with the same path).
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
from ha_controller.client.simple_consumer import SimpleConsumer

TOPIC = "BenchPop"
GROUP = "bench-pop"


def line(name: str, samples: list[float]) -> str:
    ms = [s * 1000 for s in samples]
    return (
        f"{name:>4}: n={len(ms)} p50={pct(ms, 0.5):.2f} ms p99={pct(ms, 0.99):.2f} ms "
        f"max={max(ms, default=float('nan')):.2f} ms"
    )


async def run(messages: int, consumers: int, replicas: int) -> None:
    cluster = await start_cluster(replicas, {"HAC_FLUSH_MODE": "sync"}, topic=TOPIC, queues=4)
    try:
        async with Producer(cluster.namesrv) as producer:
            sends = [producer.send(Message(TOPIC, b"x" * 200)) for _ in range(messages)]
            for chunk in range(0, len(sends), 64):
                await asyncio.gather(*sends[chunk : chunk + 64])
        pops: list[float] = []
        acks: list[float] = []
        acked = 0

        async def consume() -> None:
            nonlocal acked
            async with SimpleConsumer(cluster.namesrv, GROUP, [TOPIC], 60) as pop:
                idle = 0
                while acked < messages and idle < 20:
                    started = time.perf_counter()
                    got: list[ReceivedMessage] = await pop.receive(16)
                    if not got:
                        idle += 1
                        await asyncio.sleep(0.05)
                        continue
                    idle = 0
                    pops.append(time.perf_counter() - started)
                    for m in got:
                        started = time.perf_counter()
                        await pop.ack(m)
                        acks.append(time.perf_counter() - started)
                        acked += 1

        began = time.perf_counter()
        await asyncio.gather(*(consume() for _ in range(consumers)))
        took = time.perf_counter() - began
        print(
            f"sync flush, {replicas} replica(s), {consumers} consumer(s): "
            f"{acked}/{messages} acked in {took:.1f} s"
        )
        print(line("pop", pops))
        print(line("ack", acks))
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args()
    asyncio.run(run(args.messages, args.consumers, args.replicas))


if __name__ == "__main__":
    main()
