"""A slave that is idle is still a live copy.

A master counts a slave as able to confirm a SYNC write when the slave has everything or
reported within the last 2 s.  An idle master only sends keepalives, and the slave used
to answer them with nothing, so after 2 s without writes the slave was "caught up" only:
the first write of a burst moved the log's end, and the sends that arrived before the
slave acknowledged it were refused with InSyncReplicasNotEnough (a drill's first send
of a topic, seen as pop-acting storing nothing on broker-a).  The slave now answers
every keepalive with its position.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from special_helpers import create_topic_on, masters_online, send_raw

from ha_controller.rpc import ConnectionPool
from ha_controller.testing import run_cluster

TOPIC = "IdleBurst"


async def test_a_burst_after_an_idle_spell_is_stored_with_its_copies(tmp_path: Path) -> None:
    cluster = run_cluster(("g1",), 2, workdir=tmp_path)  # in_sync_replicas = 2
    master = cluster.broker("g1", 0)
    try:
        await masters_online(cluster.namesrv, ("g1",))
        await cluster.wait_ready()
        await create_topic_on(master.rpc, TOPIC, 4)
        async with ConnectionPool() as pool:
            await send_raw(pool, master.rpc, TOPIC, 0, {"UNIQ_KEY": "warm"})
            for spell in range(2):
                await asyncio.sleep(3.0)  # longer than the 2 s a report counts
                burst = await asyncio.gather(
                    *(
                        send_raw(pool, master.rpc, TOPIC, i % 4, {"UNIQ_KEY": f"b{spell}-{i}"})
                        for i in range(8)
                    ),
                    return_exceptions=True,
                )
                refused = [r for r in burst if isinstance(r, BaseException)]
                assert not refused, refused
    finally:
        cluster.stop()
