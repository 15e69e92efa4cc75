"""Shared bench helpers: start a cluster, wait for masters, percentiles."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ha_controller.client.admin import NameserverClient
from ha_controller.testing import Cluster, eventually, make_workdir, run_cluster


def pct(samples: Sequence[float], p: float) -> float:
    s = sorted(samples)
    if not s:
        return float("nan")
    return s[min(len(s) - 1, int(len(s) * p))]


async def start_cluster(
    replicas: int, env: dict[str, str] | None = None, topic: str = "Bench", queues: int = 8
) -> Cluster:
    cluster = run_cluster(
        ("bench",),
        replicas,
        workdir=make_workdir("hac-bench-"),
        env={"HAC_LOG_LEVEL": "WARNING", **(env or {})},
    )
    async with NameserverClient([cluster.namesrv]) as ns:

        async def ready() -> bool:
            groups = await ns.groups()
            return bool(groups) and all(g.master_online for g in groups)

        await eventually(ready, timeout=30)
        await ns.create_topic(topic, queues=queues)

        async def routed() -> Any:
            return (await ns.route(topic)).broker_datas

        await eventually(routed, timeout=10)
    return cluster


def workdir_size(cluster: Cluster) -> int:
    return sum(p.stat().st_size for p in Path(cluster.workdir).rglob("*") if p.is_file())


def now() -> float:
    return time.perf_counter()
