"""CPU per produced message on each process of the durable produce path.

    .venv/bin/python bench/produce_cpu.py [-n 20000] [--rounds 3] [--window 64] [--size 1024]
        [--coalesce 64]

Starts our cluster as ``compare.py`` does (nameserver, master + 1 SYNC slave), sends ``n``
durable messages per round with ``window`` sends in flight, and reads the CPU time
(user + system, ``/proc/<pid>/stat``) that the master, the slave and this client process
spent on them.  CPU per message barely moves with the load of a shared machine, unlike
msgs/s, so it is the figure to compare code before and after a change on such a box.
Prints one JSON line per round and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from drivers import OursDriver
from peers import OursCluster
from workloads import body

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


async def produce(driver: OursDriver, dest: str, n: int, size: int, window: int) -> int:
    counter = iter(range(n))
    errors = 0

    async def sender() -> None:
        nonlocal errors
        for seq in counter:
            try:
                await driver.send(dest, body(seq, time.perf_counter_ns(), size), 10.0)
            except Exception:
                errors += 1

    await asyncio.gather(*(sender() for _ in range(window)))
    return errors


async def main(args: argparse.Namespace) -> None:
    cluster = OursCluster(Path(tempfile.mkdtemp(prefix="hac-cpu-")))
    await cluster.start()
    driver = OursDriver(cluster, coalesce=args.coalesce)
    try:
        await driver.open()
        pids: dict[str, int] = {
            "master": cluster.broker("broker-a", 0).pid,  # type: ignore[attr-defined]
            "slave": cluster.broker("broker-a", 1).pid,  # type: ignore[attr-defined]
            "client": os.getpid(),
        }
        rows: list[dict[str, Any]] = []
        for rnd in range(args.rounds):
            dest = f"cpu-{rnd}"
            await driver.create(dest)
            await produce(driver, dest, 200, args.size, args.window)  # warm-up
            before = {k: cpu_s(p) for k, p in pids.items()}
            t0 = time.perf_counter()
            errors = await produce(driver, dest, args.n, args.size, args.window)
            wall = time.perf_counter() - t0
            row: dict[str, Any] = {
                "round": rnd + 1,
                "msgs_s": round(args.n / wall),
                "errors": errors,
                "load": os.getloadavg()[0],
            }
            for k, p in pids.items():
                row[f"{k}_us_per_msg"] = round((cpu_s(p) - before[k]) / args.n * 1e6, 1)
            print(json.dumps(row), flush=True)
            rows.append(row)
        medians = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k not in ("round",)}
        print(json.dumps({"median": medians}), flush=True)
    finally:
        await driver.aclose()
        await cluster.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=20_000, help="messages per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=int, default=64, help="sends in flight")
    parser.add_argument("--size", type=int, default=1024, help="body bytes")
    parser.add_argument(
        "--coalesce", type=int, default=64, help="producer coalesce_max_messages (1 = off)"
    )
    asyncio.run(main(parser.parse_args()))
