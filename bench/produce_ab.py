"""Produce into one real group twice in one run, a setting on and off, and compare.

Used by ``bench/acl.py produce`` (the client ACL) and ``bench/key_index.py produce``
(the key index); ``make bench`` prints both rows.  Each mode starts its own nameserver,
master and SYNC slave (``run_cluster``), sends ``count`` 1 KiB messages with 64 in
flight, and stops them; the modes alternate for ``rounds`` rounds and the best rate of
each is kept, so a burst of another process on the machine does not decide the ratio.
With ``cpu`` given, :func:`compare` also keeps each mode's least CPU time of the
brokers (master and slave, user + system, from ``/proc``) per message sent: what the
servers spend, which another process's load moves less than msg/s (one round by about
5 us either way at a load of 10 on two cores: compare medians of several runs).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SIZE = 1024
CONCURRENCY = 64


@dataclass
class Mode:
    """One side of the comparison: the brokers' environment, the credentials the
    producer signs with and the admin's (both None without an ACL), and what to write
    into the mode's work directory before the cluster starts (it returns the
    environment that names what it wrote)."""

    env: dict[str, str] = field(default_factory=dict)
    creds: Any = None
    admin: Any = None
    prepare: Callable[[Path], dict[str, str]] | None = None


def _cpu_s(pids: Sequence[int]) -> float:
    """User + system CPU seconds the processes used so far (Linux ``/proc``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / ticks


async def produce_rate(
    mode: Mode,
    topic: str,
    count: int,
    workdir: Path,
    keys: Callable[[int], Sequence[str]],
    cpu: dict[str, float] | None = None,
) -> float:
    """msg/s of ``count`` SYNC sends of 1 KiB with 64 in flight into a fresh group;
    ``cpu["us_per_msg"]``: the brokers' CPU microseconds per message meanwhile."""
    from ha_controller.client.admin import NameserverClient
    from ha_controller.client.message import Message
    from ha_controller.client.producer import Producer
    from ha_controller.testing import eventually, run_cluster

    workdir.mkdir(parents=True, exist_ok=True)
    env = {"HAC_LOG_LEVEL": "WARNING", **mode.env}
    if mode.prepare is not None:
        env |= mode.prepare(workdir)
    cluster = await asyncio.to_thread(
        run_cluster, ("bench",), 2, workdir=workdir / "cluster", env=env
    )
    try:
        async with NameserverClient([cluster.namesrv], credentials=mode.admin) as ns:

            async def ready() -> bool:
                groups = await ns.groups()
                return bool(groups) and all(g.master_online for g in groups)

            await eventually(ready, timeout=30)
            await ns.create_topic(topic, queues=8)
        payload = b"x" * SIZE
        async with Producer(cluster.namesrv, "bench-ab", credentials=mode.creds) as producer:
            await producer.send(Message(topic, payload))
            sent = 0
            pids = [h.pid for h in cluster.brokers.values()]
            cpu0 = _cpu_s(pids)
            t0 = time.perf_counter()

            async def worker() -> None:
                nonlocal sent
                while sent < count:
                    i = sent
                    sent += 1
                    await producer.send(Message(topic, payload, keys=keys(i)))

            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
            rate = count / (time.perf_counter() - t0)
            if cpu is not None:
                cpu["us_per_msg"] = (_cpu_s(pids) - cpu0) / count * 1e6
            return rate
    finally:
        await asyncio.to_thread(cluster.stop)


async def compare(
    modes: Mapping[str, Mode],
    topic: str,
    count: int,
    rounds: int,
    keys: Callable[[int], Sequence[str]] = lambda i: (),
    cpu: dict[str, float] | None = None,
) -> dict[str, float]:
    """The best msg/s of each mode over ``rounds`` rounds, the order alternating;
    ``cpu``, when given, gets each mode's least broker CPU microseconds per message."""
    names = list(modes)
    best = dict.fromkeys(names, 0.0)
    with tempfile.TemporaryDirectory(prefix="hac-bench-ab-") as tmp:
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                used: dict[str, float] = {}
                rate = await produce_rate(
                    modes[name], topic, count, Path(tmp) / f"r{r}-{name}", keys, used
                )
                best[name] = max(best[name], rate)
                if cpu is not None:
                    cpu[name] = min(cpu.get(name, float("inf")), used["us_per_msg"])
    return best
