"""``hactl demo``: a whole failover on this machine, end to end, with a verdict.

A nameserver plus two broker groups (each a master and two slaves) start as
real processes on loopback.  A producer and a push consumer run the whole
time.  The master of ``broker-a`` is killed with SIGKILL: the nameserver
shows its lowest slave as id 0 (read-only), the consumer keeps reading and
committing through that acting slave, producers move to ``broker-b``.  The
master comes back through pre-online (adopting the acting slave's consumer
offsets) and takes over again.  The demo exits 0 only if nothing acknowledged
was lost and nothing was delivered twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message, ReceivedMessage
from ha_controller.client.producer import Producer
from ha_controller.client.push_consumer import PushConsumer
from ha_controller.client.tools import body_for
from ha_controller.protocol.errors import HaError
from ha_controller.routing import Perm
from ha_controller.testing import Cluster, eventually, make_workdir, run_cluster

TOPIC = "DemoTopic"
GROUP = "demo-consumers"


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


@dataclass
class Tally:
    acked: dict[str, str] = field(default_factory=dict)  # key -> broker
    failed: int = 0
    received: Counter[str] = field(default_factory=Counter)
    received_from: Counter[str] = field(default_factory=Counter)


async def show_route(ns: NameserverClient) -> None:
    route = await ns.route(TOPIC)
    for b in route.broker_datas:
        q = route.queue(b.broker_name)
        perm = "" if q is None else Perm.to_string(q.perm)
        addrs = "  ".join(f"id {i}={a}" for i, a in sorted(b.broker_addrs.items()))
        say(f"    route {b.broker_name}: {addrs}  perm {perm}")


async def run_demo(per_phase: int = 150, rate: float = 150.0) -> bool:
    workdir = make_workdir("hac-demo-")
    say(
        f"starting a nameserver and groups broker-a, broker-b (master + 2 slaves each) in {workdir}"
    )
    cluster: Cluster = await asyncio.to_thread(
        run_cluster, ("broker-a", "broker-b"), 3, workdir=workdir
    )
    tally = Tally()
    try:
        async with NameserverClient([cluster.namesrv]) as ns:

            async def both_masters() -> bool:
                groups = await ns.groups()
                return len(groups) == 2 and all(g.master_online for g in groups)

            await eventually(both_masters, timeout=30)
            await ns.create_topic(TOPIC, queues=4)
            await eventually(lambda: _route_has(ns, 2), timeout=10)
            await show_route(ns)

            async def listener(m: ReceivedMessage) -> bool:
                tally.received[m.key] += 1
                tally.received_from[m.broker_name] += 1
                return True

            consumer = PushConsumer(cluster.namesrv, GROUP, TOPIC, listener, commit_interval_s=0.5)
            await consumer.start()
            producer = Producer(cluster.namesrv, group="demo-producer")
            await producer.start()
            seq = 0

            async def produce(n: int) -> None:
                nonlocal seq
                for _ in range(n):
                    key = f"demo-{seq:06d}"
                    seq += 1
                    try:
                        r = await producer.send(Message(TOPIC, body_for(key, 256), keys=(key,)))
                    except HaError:
                        tally.failed += 1
                    else:
                        tally.acked[key] = r.broker_name
                    await asyncio.sleep(1 / rate)

            say(f"phase 1: producing {per_phase} messages to both groups while consuming")
            await produce(per_phase)
            await eventually(lambda: len(tally.received) >= len(tally.acked), timeout=20)
            say(f"    acknowledged {len(tally.acked)}, consumed {len(tally.received)}")

            say("phase 2: kill -9 the master of broker-a")
            t_kill = time.monotonic()
            cluster.broker("broker-a", 0).kill()

            async def acting() -> bool:
                r = await ns.route(TOPIC)
                b = r.broker("broker-a")
                q = r.queue("broker-a")
                return bool(
                    b
                    and q
                    and b.broker_addrs.get(0) == cluster.broker("broker-a", 1).rpc
                    and not Perm.is_writeable(q.perm)
                )

            await eventually(acting, timeout=10, interval=0.01)
            say(
                "    nameserver shows slave 1 as id 0, read-only, after "
                f"{time.monotonic() - t_kill:.2f} s"
            )
            await show_route(ns)
            say(
                f"    producing {per_phase} more: they go to broker-b; "
                "consuming continues from the acting slave"
            )
            await produce(per_phase)
            await eventually(lambda: len(tally.received) >= len(tally.acked), timeout=30)
            say(f"    acknowledged {len(tally.acked)}, consumed {len(tally.received)}")

            say("phase 3: restart the master of broker-a (pre-online first, then online)")
            await asyncio.to_thread(cluster.restart, "broker-a", 0)

            async def master_back() -> bool:
                r = await ns.route(TOPIC)
                b = r.broker("broker-a")
                q = r.queue("broker-a")
                return bool(
                    b
                    and q
                    and b.broker_addrs.get(0) == cluster.broker("broker-a", 0).rpc
                    and Perm.is_writeable(q.perm)
                )

            await eventually(master_back, timeout=30)
            await show_route(ns)
            say(f"    producing {per_phase} more to both groups")
            await produce(per_phase)
            await eventually(lambda: len(tally.received) >= len(tally.acked), timeout=30)
            await asyncio.sleep(2.0)  # let any duplicate surface
            await producer.aclose()
            await consumer.aclose()
    finally:
        await asyncio.to_thread(cluster.stop)

    lost = [k for k in tally.acked if k not in tally.received]
    dup = sum(c - 1 for c in tally.received.values() if c > 1)
    say("verdict:")
    say(
        f"    sent {len(tally.acked) + tally.failed}  acknowledged {len(tally.acked)}  "
        f"failed (not acknowledged) {tally.failed}"
    )
    say(
        f"    consumed {sum(tally.received.values())}  distinct {len(tally.received)}  "
        f"by group {dict(tally.received_from)}"
    )
    say(f"    lost {len(lost)}  duplicated {dup}")
    ok = not lost and dup == 0
    say("OK: every acknowledged message was delivered exactly once" if ok else "FAILED")
    if ok:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        say(f"logs kept in {workdir}")
    return ok


async def _route_has(ns: NameserverClient, groups: int) -> bool:
    with contextlib.suppress(HaError):
        return len((await ns.route(TOPIC)).broker_datas) == groups
    return False


def main() -> int:
    logging.basicConfig(level=logging.ERROR, format="    (%(name)s: %(message)s)")
    return 0 if asyncio.run(run_demo()) else 1


if __name__ == "__main__":
    sys.exit(main())
