"""A graceful stop (SIGTERM) in the middle of a produce: the broker stops accepting,
unregisters, drains what is in flight, cancels its loops and only then closes the
store; after a restart every acknowledged message is there."""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer
from ha_controller.client.tools import body_for
from ha_controller.protocol.errors import HaError
from ha_controller.testing import eventually, run_cluster, stored_messages

TOPIC = "T"
PHASES = [
    "shutdown phase 1: stop accepting",
    "shutdown phase 2: unregistering",
    "shutdown phase 3: draining",
    "shutdown phase 4: cancelling",
    "shutdown phase 5: closing",
]


async def online(ns: NameserverClient) -> bool:
    groups = await ns.groups()
    return bool(groups) and all(g.master_online for g in groups)


async def test_sigterm_during_produce_stops_in_phases_and_loses_nothing(tmp_path: Path) -> None:
    cluster = run_cluster(("stop",), 2, workdir=tmp_path)
    acked: dict[str, bytes] = {}
    try:
        async with NameserverClient([cluster.namesrv]) as ns:
            await eventually(lambda: online(ns), timeout=30)
            await ns.create_topic(TOPIC, queues=4)
        master = cluster.broker("stop", 0)
        async with Producer(cluster.namesrv, group="stop-producer", max_attempts=1) as producer:
            seq = 0

            async def stream() -> None:
                nonlocal seq
                while True:
                    key = f"k{seq:06d}"
                    seq += 1
                    body = body_for(key, 700)
                    try:
                        await producer.send(Message(TOPIC, body, keys=(key,)))
                    except HaError:
                        if not master.alive():
                            return
                        continue
                    acked[key] = body

            task = asyncio.create_task(stream())
            await eventually(lambda: len(acked) >= 300, timeout=30)
            master.signal(signal.SIGTERM)
            assert master.proc is not None
            code = await asyncio.to_thread(master.proc.wait, 20)
            await asyncio.wait_for(task, 20)
        assert code == 0, master.log_tail(60)
        log = master.log_path.read_text()
        positions = [log.find(p) for p in PHASES]
        assert all(p >= 0 for p in positions), f"missing phases {positions}:\n{log[-3000:]}"
        assert positions == sorted(positions), f"phases out of order: {positions}"
        # the store is closed last: its closing line follows phase 5
        closed = [m.start() for m in re.finditer("closed at commit log offset", log)]
        assert closed and closed[-1] > positions[-1], "store closed before phase 5"

        await asyncio.to_thread(cluster.restart, "stop", 0)
        async with NameserverClient([cluster.namesrv]) as ns:
            await eventually(lambda: online(ns), timeout=30)
        async with PullConsumer(cluster.namesrv, "stop-check") as pull:
            stored = {m.key: m.body async for m in stored_messages(pull, await pull.queues(TOPIC))}
        missing = [k for k in acked if k not in stored]
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:3]}"
        assert all(stored[k] == body for k, body in acked.items())
    finally:
        cluster.stop()
