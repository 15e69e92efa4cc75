"""A delayed message whose topic became read-only (or was deleted) while it waited does
not hold up the other messages of its delay level.

Found by attacking the schedule service: delivering a due message checked its topic as
a client's send does, so after an operator made one topic read-only (RocketMQ's way of
draining a topic before deleting it), its due message was refused again and again, and
every later message of that delay level, of every topic, waited behind it.  RocketMQ's
schedule service writes a due message to its topic's queue whatever the topic's
permission: the message was taken in while the topic took writes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from special_helpers import create_topic_on, masters_online, messages_on, send_raw

from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import Cluster, eventually, run_cluster

DRAINED = "DrainedTopic"
OTHER = "OtherTopic"


async def _set_perm(pool: ConnectionPool, addr: str, topic: str, perm: int) -> None:
    await pool.call_pb(
        addr,
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        broker_pb2.CreateTopicRequest(
            topic=common_pb2.TopicConfig(
                topic_name=topic, read_queue_nums=1, write_queue_nums=1, perm=perm
            )
        ),
        common_pb2.Empty,
    )


async def _two_delayed(cluster: Cluster, pool: ConnectionPool) -> None:
    """Both topics on g1's master, and one message of delay level 2 (5 s) on each."""
    master = cluster.broker("g1", 0)
    await masters_online(cluster.namesrv, ("g1",))
    await create_topic_on(master.rpc, DRAINED, 1)
    await create_topic_on(master.rpc, OTHER, 1)
    await send_raw(pool, master.rpc, DRAINED, 0, {"DELAY": "2", "UNIQ_KEY": "d"})
    await send_raw(pool, master.rpc, OTHER, 0, {"DELAY": "2", "UNIQ_KEY": "o"})


async def test_a_read_only_topic_does_not_hold_up_its_delay_level(tmp_path: Path) -> None:
    cluster: Cluster = run_cluster(("g1",), 1, workdir=tmp_path)
    master = cluster.broker("g1", 0)
    try:
        async with ConnectionPool() as pool:
            await _two_delayed(cluster, pool)
            await _set_perm(pool, master.rpc, DRAINED, 4)  # read-only: drained

            async def both_delivered() -> bool:
                got = await messages_on(pool, [master.rpc], DRAINED, 1)
                got += await messages_on(pool, [master.rpc], OTHER, 1)
                return sorted(m.properties.get("UNIQ_KEY", "") for m in got) == ["d", "o"]

            await eventually(both_delivered, timeout=15, interval=0.2)
            await asyncio.sleep(0.5)
            assert await both_delivered()  # once each
    finally:
        cluster.stop()


async def test_a_deleted_topic_does_not_hold_up_its_delay_level(tmp_path: Path) -> None:
    """Topics are not auto-created: the deleted topic's due message is stored in its
    queue (read once the topic is created again), and the other topic's is delivered."""
    cluster: Cluster = run_cluster(
        ("g1",), 1, workdir=tmp_path, env={"HAC_AUTO_CREATE_TOPIC": "false"}
    )
    master = cluster.broker("g1", 0)
    try:
        async with ConnectionPool() as pool:
            await _two_delayed(cluster, pool)
            await pool.call_pb(
                master.rpc,
                RequestCode.DELETE_TOPIC_IN_BROKER,
                broker_pb2.CreateTopicRequest(topic=common_pb2.TopicConfig(topic_name=DRAINED)),
                common_pb2.Empty,
            )

            async def other_delivered() -> bool:
                got = await messages_on(pool, [master.rpc], OTHER, 1)
                return [m.properties.get("UNIQ_KEY") for m in got] == ["o"]

            await eventually(other_delivered, timeout=15, interval=0.2)
            await create_topic_on(master.rpc, DRAINED, 1)
            got = await messages_on(pool, [master.rpc], DRAINED, 1)
            assert [m.properties.get("UNIQ_KEY") for m in got] == ["d"]
    finally:
        cluster.stop()
