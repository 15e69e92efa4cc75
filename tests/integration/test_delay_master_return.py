"""A master that returns without a restart hands on no special message a second time
(issue 17, defect A).

The master is frozen (SIGSTOP) past the not-active timeout while delayed messages fall
due; its slave acts and escapes them to the other group.  When the master is resumed
(not restarted) its timer loops wake before its heartbeat loop notices the lost lease:
they must not deliver what the acting slave delivered.  The master must fence first,
reverse-sync the acting slave's progress in pre-online, and only then restart its
special services from the synced tables, as a restart does.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from special_helpers import create_topic_on, masters_online, messages_on, send_raw

from ha_controller.client.admin import NameserverClient
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import Cluster, eventually, run_cluster

TOPIC = "ReturnDelay"
QUEUES = 2
COUNT = 20
LEVEL = 2  # 5 s: due while the master is frozen and its slave acts


async def _send_delayed(pool: ConnectionPool, master: str, prefix: str) -> list[str]:
    keys = [f"{prefix}-{i}" for i in range(COUNT)]
    for i, key in enumerate(keys):
        props = {"UNIQ_KEY": key, "DELAY": str(LEVEL)}
        await send_raw(pool, master, TOPIC, i % QUEUES, props, body=b"delayed")
    return keys


async def _delivered(pool: ConnectionPool, addrs: Iterable[str]) -> Counter[str]:
    """How often each key is stored in TOPIC on these brokers (each a group's id 0)."""
    return Counter(m.properties["UNIQ_KEY"] for m in await messages_on(pool, addrs, TOPIC, QUEUES))


async def _master_online(addr: str, namesrv: str) -> bool:
    async with NameserverClient([namesrv]) as ns:
        group = await ns.member_group("DefaultCluster", "g1")
    return group.broker_addrs.get(0) == addr


async def test_frozen_master_resumed_delivers_no_delayed_message_again(tmp_path: Path) -> None:
    cluster: Cluster = run_cluster(("g1", "g2"), 3, workdir=tmp_path)
    master = cluster.broker("g1", 0)
    try:
        await masters_online(cluster.namesrv, ("g1", "g2"))
        for g in ("g1", "g2"):
            await create_topic_on(cluster.broker(g, 0).rpc, TOPIC, QUEUES)
        async with ConnectionPool() as pool:
            keys = await _send_delayed(pool, master.rpc, "d")
            sent_at = time.monotonic()
            master.pause()
            # the slave acts (about 2.5 s) and escapes the due messages (5 s) to g2
            g2 = cluster.broker("g2", 0).rpc

            async def escaped_all() -> bool:
                return set(keys) <= set(await _delivered(pool, [g2]))

            await eventually(escaped_all, timeout=20, interval=0.2)
            await asyncio.sleep(max(0.0, 7.0 - (time.monotonic() - sent_at)))
            master.resume()
            await eventually(lambda: _master_online(master.rpc, cluster.namesrv), timeout=30)
            await asyncio.sleep(1.0)  # time for a wrong second delivery to happen
            seen = await _delivered(pool, [master.rpc, g2])
        twice = {k: n for k, n in seen.items() if n > 1}
        assert not twice, f"delivered more than once: {twice}\n{master.log_tail(60)}"
        assert set(keys) <= set(seen)
        assert "fenced:" in master.log_path.read_text()
    finally:
        master.resume()
        cluster.stop()
