"""Where the open-loop end-to-end latency of ``compare.py`` goes, for our cluster.

    .venv/bin/python bench/latency_parts.py [--rate 500] [--seconds 10] [--sequential]
        [--coalesce 64] [--server-env HAC_REPLICATION_MODE=async ...]

Runs ``compare.py``'s latency workload on the same deployment (nameserver, master + 1
SYNC slave, one group; ``peers.OursCluster``) and the same client (``drivers.OursDriver``):
one send per due time, each in its own task, stamped with its *due* time.  Per message
it records four instants (due, the send call, the acknowledgement, the delivery to the
push consumer) and prints the percentiles of

- ``e2e``: due -> delivery, what ``compare.py`` reports;
- ``lag``: due -> send call, the client's event loop being late;
- ``send->ack``: the durable send itself (client, master, slave and back);
- ``ack->recv``: acknowledgement -> delivery;

next to the CPU share of one core that every server process and this client used
(``/proc/<pid>/stat``), and a baseline from the same run: the round trip of a bare
request to the master (GET_MAX_OFFSET).  ``--sequential`` awaits each send before the
next (``bench/latency.py``'s closed loop: no two sends overlap, the rate may not be
reached); ``--server-env`` sets server settings (e.g. ``HAC_FLUSH_INTERVAL_MS=100000``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from drivers import OursDriver
from peers import OursCluster
from produce_cpu import cpu_s
from workloads import HEADER, body, percentile

from ha_controller.client.pull_consumer import PullConsumer
from ha_controller.process import run


def _row(name: str, xs: list[float]) -> str:
    s = sorted(xs)
    return (
        f"  {name:12}{percentile(s, 0.5):>9.2f}{percentile(s, 0.99):>9.2f}"
        f"{percentile(s, 0.999):>9.2f}{(s[-1] if s else float('nan')):>9.2f}"
    )


async def main(args: argparse.Namespace) -> None:
    extra = dict(kv.split("=", 1) for kv in args.server_env)
    cluster = OursCluster(Path(tempfile.mkdtemp(prefix="hac-latparts-")), env=extra)
    await cluster.start()
    driver = OursDriver(cluster, coalesce=args.coalesce)
    try:
        await driver.open()
        dest = f"parts_{os.getpid()}"
        await driver.create(dest)
        got: dict[int, int] = {}

        def on_body(data: bytes) -> None:
            got[HEADER.unpack_from(data)[0]] = time.perf_counter_ns()

        sub = await driver.subscribe(dest, f"{dest}-g", on_body)
        for i in range(20):  # warm-up: connections, routes, the first rebalance
            await driver.send(dest, body(1 << 40 | i, time.perf_counter_ns(), args.size), 10)
        await asyncio.sleep(1)
        got.clear()
        pids = {
            "master": cluster.broker("broker-a", 0).pid,  # type: ignore[attr-defined]
            "slave": cluster.broker("broker-a", 1).pid,  # type: ignore[attr-defined]
            "nameserver": cluster.cluster.nameserver.pid,  # type: ignore[attr-defined]
            "client": os.getpid(),
        }
        cpu0 = {k: cpu_s(p) for k, p in pids.items()}
        n = int(args.rate * args.seconds)
        due: dict[int, int] = {}
        called: dict[int, int] = {}
        acked: dict[int, int] = {}
        tasks: set[asyncio.Task[None]] = set()

        async def one(seq: int) -> None:
            called[seq] = time.perf_counter_ns()
            await driver.send(dest, body(seq, due[seq], args.size), 10)
            acked[seq] = time.perf_counter_ns()

        start = time.perf_counter_ns()
        for seq in range(n):
            due[seq] = start + int(seq * 1e9 / args.rate)
            delay = (due[seq] - time.perf_counter_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            if args.sequential:
                await one(seq)
            else:
                task = asyncio.create_task(one(seq))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=30)
        wall = (time.perf_counter_ns() - start) / 1e9
        cpu = {k: (cpu_s(p) - cpu0[k]) / wall for k, p in pids.items()}
        deadline = time.monotonic() + 10
        while len(got) < len(acked) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await sub.aclose()
        rtt: list[float] = []  # a bare request to the master, as bench/latency.py does
        async with PullConsumer(cluster.namesrv, f"{dest}-rtt") as pull:
            mq = (await pull.queues(dest))[0]
            for _ in range(1000):
                t = time.perf_counter_ns()
                await pull.max_offset(mq)
                rtt.append((time.perf_counter_ns() - t) / 1e6)

        def ms(a: dict[int, int], b: dict[int, int]) -> list[float]:
            return [(b[s] - a[s]) / 1e6 for s in a if s in b]

        mode = "sequential" if args.sequential else "open loop, one task per send"
        print(
            f"{len(got)}/{n} delivered at {args.rate:.0f} msg/s ({mode}; achieved "
            f"{len(acked) / wall:.0f} msg/s), {args.size} B, coalesce {args.coalesce}"
            + (f", server env {extra}" if extra else "")
        )
        print(f"  {'ms':12}{'p50':>9}{'p99':>9}{'p999':>9}{'max':>9}")
        for name, xs in (
            ("e2e", ms(due, got)),
            ("lag", ms(due, called)),
            ("send->ack", ms(called, acked)),
            ("ack->recv", ms(acked, got)),
            ("bare RTT", rtt),
        ):
            print(_row(name, xs))
        print("  CPU share of one core: " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()))
    finally:
        await driver.aclose()
        await cluster.aclose()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=500, help="msgs/s (compare.py: 500)")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--size", type=int, default=1024, help="body bytes")
    p.add_argument("--coalesce", type=int, default=64, help="producer coalesce_max_messages")
    p.add_argument("--sequential", action="store_true", help="await each send (closed loop)")
    p.add_argument(
        "--server-env", nargs="*", default=[], metavar="K=V", help="extra server settings"
    )
    run(main(p.parse_args()))
