"""Nameserver benchmark: route queries/s and heartbeat handling with 1,000
simulated brokers, against a real nameserver process on loopback.

    .venv/bin/python bench/nameserver.py [--brokers 1000] [--seconds 5]

Prints p50/p99 latencies and throughput, and each figure's ratio to a
baseline measured in the same run: a bare RPC round trip (a request for an
unknown method, answered with an ERROR frame without touching the table).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from ha_controller.proto import nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import UnknownMethod
from ha_controller.rpc import RpcConnection, connect
from ha_controller.testing import run_nameserver
from ha_controller.testing.simbroker import SimulatedBroker


def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * p))] * 1000


async def closed_loop(
    conns: list[RpcConnection], make: object, seconds: float, depth: int = 16
) -> tuple[int, list[float]]:
    """Run ``depth`` outstanding calls per connection for ``seconds``."""
    lat: list[float] = []
    deadline = time.perf_counter() + seconds
    done = 0

    async def worker(conn: RpcConnection) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            await make(conn)  # type: ignore[operator]
            lat.append(time.perf_counter() - t0)
            done += 1

    await asyncio.gather(*(worker(c) for c in conns for _ in range(depth)))
    return done, lat


async def main(n_brokers: int, seconds: float) -> None:
    work = Path(tempfile.mkdtemp(prefix="hac-bench-ns-"))
    ns = run_nameserver(work, env={"HAC_LOG_LEVEL": "WARNING"})
    try:
        groups = n_brokers // 3
        topics_per_group = 8
        brokers: list[SimulatedBroker] = []
        t0 = time.perf_counter()
        for g in range(groups):
            topics = {
                f"topic-{g}-{t}": SimulatedBroker.topic(f"topic-{g}-{t}", 8)
                for t in range(topics_per_group)
            }
            for bid in range(3):
                b = SimulatedBroker(
                    ns.rpc, "bench", f"group-{g}", bid, topics=topics, listen_server=False
                )
                b.addr = f"10.{g // 250}.{g % 250}.{bid}:10911"  # never dialled
                brokers.append(b)
        sem = asyncio.Semaphore(50)

        async def reg(b: SimulatedBroker) -> None:
            async with sem:
                await b.start()
                await b.register()

        await asyncio.gather(*(reg(b) for b in brokers))
        reg_s = time.perf_counter() - t0
        print(f"registered {len(brokers)} brokers ({groups} groups) in {reg_s:.2f} s")

        clients = [await connect(ns.rpc) for _ in range(4)]
        topics = [f"topic-{g}-{t}" for g in range(groups) for t in range(topics_per_group)]

        async def bare(conn: RpcConnection) -> None:
            try:
                await conn.call(999_999, b"", 5000)
            except UnknownMethod:
                pass

        async def route(conn: RpcConnection) -> None:
            req = nameserver_pb2.GetRouteInfoRequest(topic=random.choice(topics))
            await conn.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, req.SerializeToString(), 5000)

        base_n, base_lat = await closed_loop(clients, bare, seconds)
        route_n, route_lat = await closed_loop(clients, route, seconds)

        # heartbeat handling: every broker heartbeats once a second (the RIP-32
        # default) while we time request/response heartbeats from each broker
        hb_lat: list[float] = []
        stop = time.perf_counter() + seconds

        async def beat(b: SimulatedBroker) -> None:
            req = nameserver_pb2.BrokerHeartbeatRequest(
                cluster=b.cluster, broker_addr=b.addr, broker_name=b.broker_name
            ).SerializeToString()
            await asyncio.sleep(random.random())
            while time.perf_counter() < stop:
                t = time.perf_counter()
                await b.conn.call(RequestCode.BROKER_HEARTBEAT, req, 5000)
                hb_lat.append(time.perf_counter() - t)
                await asyncio.sleep(max(0.0, 1.0 - (time.perf_counter() - t)))

        await asyncio.gather(*(beat(b) for b in brokers))
        # heartbeat throughput: all brokers as fast as they can
        hb_n, hb_burst = await closed_loop(
            [b.conn for b in brokers[:50]],
            lambda c: c.call(
                RequestCode.BROKER_HEARTBEAT,
                nameserver_pb2.BrokerHeartbeatRequest(
                    cluster="bench", broker_addr=brokers[0].addr, broker_name="group-0"
                ).SerializeToString(),
                5000,
            ),
            seconds,
            depth=4,
        )

        base_qps = base_n / seconds
        print()
        print(f"{'measure':<34}{'ops/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'ops/s vs bare':>15}")
        rows = [
            ("bare RPC round trip (baseline)", base_qps, base_lat),
            ("GET_ROUTEINFO_BY_TOPIC", route_n / seconds, route_lat),
            ("BROKER_HEARTBEAT, saturated", hb_n / seconds, hb_burst),
            (f"BROKER_HEARTBEAT, {len(brokers)} x 1/s", len(hb_lat) / seconds, hb_lat),
        ]
        for name, qps, lat in rows:
            print(
                f"{name:<34}{qps:>10.0f}{pct(lat, 0.5):>9.2f}{pct(lat, 0.99):>9.2f}"
                f"{qps / base_qps:>15.2f}"
            )
        print(
            f"\nmean heartbeat latency at 1/s per broker: {statistics.mean(hb_lat) * 1000:.2f} ms"
        )
        for c in clients:
            await c.aclose()
        await asyncio.gather(*(b.aclose() for b in brokers))
    finally:
        ns.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--brokers", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    asyncio.run(main(a.brokers, a.seconds))
