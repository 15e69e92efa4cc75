"""Catch-up rate of a master that lost its volume (docs/operations.md).

    .venv/bin/python bench/catchup.py [--mib 256] [--body-kib 64] [--segment-mib 64]

Starts a group of 3 (SYNC replication), produces about ``--mib`` MiB, kills the master
with SIGKILL, deletes its store and restarts it; reports the catch-up rate its log
states ("caught up from slave N: X MiB in Y s (Z MiB/s)") and how long it took to be
id 0 again.  Opt-in: not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message
from ha_controller.client.producer import Producer
from ha_controller.testing import eventually, make_workdir, run_cluster

TOPIC = "CatchUp"
CAUGHT_UP = re.compile(r"caught up from slave (\d+): ([\d.]+) MiB in ([\d.]+) s \(([\d.]+) MiB/s\)")


async def main(mib: int, body_kib: int, segment_mib: int, concurrency: int) -> None:
    workdir = make_workdir("hac-catchup-")
    cluster = run_cluster(
        ("g1",), 3, workdir=workdir, env={"HAC_SEGMENT_SIZE_BYTES": str(segment_mib << 20)}
    )
    ok = False
    try:
        async with NameserverClient([cluster.namesrv]) as ns:

            async def master_is(addr: str | None) -> bool:
                group = await ns.member_group("DefaultCluster", "g1")
                return group.broker_addrs.get(0) == addr

            await eventually(lambda: master_is(cluster.broker("g1", 0).rpc), timeout=30)
            await ns.create_topic(TOPIC, queues=8)
            body = b"x" * (body_kib << 10)
            count = (mib << 10) // body_kib
            t0 = time.perf_counter()
            async with Producer(cluster.namesrv, group="catchup-p") as p:
                for start in range(0, count, concurrency):
                    n = min(concurrency, count - start)
                    await asyncio.gather(*(p.send(Message(TOPIC, body)) for _ in range(n)))
            produced_s = time.perf_counter() - t0
            print(f"produced {count} x {body_kib} KiB in {produced_s:.1f} s")
            cluster.broker("g1", 0).kill()
            shutil.rmtree(workdir / "store" / "g1-0")
            await eventually(lambda: master_is(None), timeout=15)
            t1 = time.perf_counter()
            master = await asyncio.to_thread(cluster.restart, "g1", 0)
            await eventually(lambda: master_is(master.rpc), timeout=600)
            online_s = time.perf_counter() - t1
        m = CAUGHT_UP.search(master.log_path.read_text())
        if m is None:
            print("no catch-up line in the master's log:\n" + master.log_tail(40))
            raise SystemExit(1)
        slave, copied, secs, rate = m.groups()
        print(
            f"caught up {copied} MiB from slave {slave} in {secs} s = {rate} MiB/s; "
            f"online as id 0 {online_s:.1f} s after the restart"
        )
        ok = True
    finally:
        cluster.stop()
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"logs kept in {workdir}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="commit log to produce (MiB)")
    ap.add_argument("--body-kib", type=int, default=64, help="message body size (KiB)")
    ap.add_argument("--segment-mib", type=int, default=64, help="commit-log segment size")
    ap.add_argument("--concurrency", type=int, default=32, help="sends in flight")
    args = ap.parse_args()
    asyncio.run(main(args.mib, args.body_kib, args.segment_mib, args.concurrency))
