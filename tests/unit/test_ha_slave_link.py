"""A slave told that its master went away and came back at once keeps acknowledging.

Campaign seed 1010 (4374e5a): the nameserver told broker-a's slave 1 "min id 2", then
"min id 0" again, in the same instant.  The slave's HA client kept its link (the master's
address had not changed in the end) but had forgotten it as the link to report on, so it
appended every transfer and acknowledged none.  The master saw an attached slave that
never confirmed: with the other slave away, every SYNC write, due delayed messages
included, was refused with InSyncReplicasNotEnough for 8 s.

Real TCP between an in-process master and slave, each on its own store.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker_agent.replication.ha import HaMaster, HaSlave
from broker_agent.store import MessageStore, StoreConfig
from ha_controller.testing import eventually

CFG = StoreConfig(segment_size_bytes=256 * 1024, max_message_size_bytes=16 * 1024)


async def test_an_address_that_goes_away_and_back_in_one_instant_keeps_the_acks(
    tmp_path: Path,
) -> None:
    with (
        MessageStore.open(tmp_path / "master", CFG) as mstore,
        MessageStore.open(tmp_path / "slave", CFG) as sstore,
    ):
        master = HaMaster(mstore, broker_name="g1")
        host, port = await master.start("127.0.0.1", 0)
        addr = f"{host}:{port}"
        slave = HaSlave(sstore, "127.0.0.1:1", 1, lambda _d: None, broker_name="g1")
        task = asyncio.get_running_loop().create_task(slave.run())
        try:

            def put(n: int) -> int:
                for i in range(n):
                    mstore.put("T", 0, b"x" * 100, {"UNIQ_KEY": f"k{i}"})
                master.data_appended()
                return mstore.commitlog_max_offset

            def acked(end: int) -> bool:
                return master.in_sync_count(end) == 2

            slave.set_master(addr)
            first = put(1)
            await eventually(lambda: acked(first), 10)
            slave.set_master(None)  # the nameserver's two notices, one after the other
            slave.set_master(addr)
            await asyncio.sleep(0.2)  # the run loop wakes and keeps the same link
            end = put(5)
            await eventually(lambda: sstore.commitlog_max_offset == end, 10)
            await eventually(lambda: acked(end), 5)
            assert slave.replicating
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await slave.aclose()
            await master.server.aclose(grace_s=0.1)
