"""A returning master cuts its commit log back to its slaves (issue 17, the last
duplicate source of the partition campaigns).

The window: a master cut off by a partition keeps its lease for up to the not-active
timeout and stores due delayed messages in its own log meanwhile; no slave gets them
(a SIGSTOP of the slaves cannot stand in: the master's transfers wait in the socket
buffers and arrive on resume).  A slave acts and escapes every due message to the other
group, those the master stored too.  When the partition heals the master must cut that
tail away before its slaves re-attach, or they copy it and consumers get those
messages twice.

And the other side: under ASYNC replication a master ahead of its slave holds
acknowledged messages, and keeps them even though the slave acted meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterable

import pytest
from special_helpers import create_topic_on, masters_online, messages_on

from ha_controller.client.admin import NameserverClient
from ha_controller.drills.cluster import ClusterSpec, DrillCluster
from ha_controller.drills.netns import netns_available
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import HaError
from ha_controller.protocol.properties import PROPERTY_DELAY, PROPERTY_TIMER_DELIVER_MS
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import ProcessHandle, eventually, http_get

TOPIC = "CutDelay"
QUEUES = 2
COUNT = 12
LEVEL = 2  # 5 s


async def _send(
    pool: ConnectionPool, master: str, prefix: str, count: int, **props: str
) -> list[str]:
    keys = []
    for i in range(count):
        key = f"{prefix}-{i}"
        await pool.call_pb(
            master,
            RequestCode.SEND_MESSAGE,
            broker_pb2.SendMessageRequest(
                producer_group="PG",
                topic=TOPIC,
                queue_id=i % QUEUES,
                entries=[broker_pb2.SendEntry(body=b"m", properties={"UNIQ_KEY": key, **props})],
            ),
            broker_pb2.SendMessageResponse,
            5000,
        )
        keys.append(key)
    return keys


async def _stored(pool: ConnectionPool, addrs: Iterable[str]) -> Counter[str]:
    """How often each key is stored in TOPIC on these brokers."""
    return Counter(m.properties["UNIQ_KEY"] for m in await messages_on(pool, addrs, TOPIC, QUEUES))


async def _held_pull(pool: ConnectionPool, master: str) -> list[str]:
    """One long poll of queue 0 from its start; the keys it got (none on an error)."""
    try:
        resp = await pool.call_pb(
            master,
            RequestCode.PULL_MESSAGE,
            broker_pb2.PullMessageRequest(
                consumer_group="CG",
                topic=TOPIC,
                queue_id=0,
                queue_offset=0,
                max_msg_nums=64,
                commit_offset=-1,
                suspend_timeout_ms=20_000,
            ),
            broker_pb2.PullMessageResponse,
            40_000,
        )
    except HaError:
        return []
    return [m.properties["UNIQ_KEY"] for m in resp.messages]


async def _holding(broker: ProcessHandle) -> bool:
    status, body = await asyncio.to_thread(http_get, broker.http, "/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith("hac_pull_held_requests{"):
            return float(line.rsplit(" ", 1)[1]) >= 1
    return False


async def _log_end(broker: ProcessHandle) -> int:
    status, body = await asyncio.to_thread(http_get, broker.http, "/api/v1/status")
    assert status == 200, body
    return int(json.loads(body)["commitLogMaxOffset"])


async def _master_online(addr: str, namesrv: str, group: str = "g1") -> bool:
    async with NameserverClient([namesrv]) as ns:
        members = await ns.member_group("DefaultCluster", group)
    return members.broker_addrs.get(0) == addr


async def _acting(namesrv: str) -> bool:
    async with NameserverClient([namesrv]) as ns:
        members = await ns.member_group("DefaultCluster", "g1")
    return members.acting_broker_id in (1, 2)


@pytest.mark.parametrize("kind", ["level", "timer"])
async def test_partitioned_master_while_delayed_messages_fall_due_delivers_none_twice(
    kind: str,
) -> None:
    reason = netns_available()
    if reason is not None:
        pytest.skip(f"network namespaces: {reason}")
    # a short replica wait: the cut-off master stores several deliveries in its window
    spec = ClusterSpec(
        groups=("g1", "g2"), replicas=3, netns=True, env={"HAC_SLAVE_ACK_TIMEOUT_MS": "300"}
    )
    cluster = await asyncio.to_thread(DrillCluster(spec).start)
    master = cluster.handle("g1/0")
    slaves = [cluster.handle("g1/1"), cluster.handle("g1/2")]
    g2 = cluster.handle("g2/0").rpc
    try:
        await masters_online(cluster.namesrv, ("g1", "g2"))
        for g in ("g1", "g2"):
            await create_topic_on(cluster.handle(f"{g}/0").rpc, TOPIC, QUEUES)
        async with ConnectionPool() as pool:
            if kind == "level":
                props = {PROPERTY_DELAY: str(LEVEL)}
            else:  # a timer message (a delivery time), as the drills' delay workload sends
                props = {PROPERTY_TIMER_DELIVER_MS: str(int(time.time() * 1000) + 5_000)}
            keys = await _send(pool, master.rpc, "d", COUNT, **props)
            due_at = time.monotonic() + 5.0
            # a consumer's long poll, held on the master when the partition starts
            await asyncio.sleep(max(0.0, due_at - 1.0 - time.monotonic()))
            held = asyncio.create_task(_held_pull(pool, master.rpc))
            await eventually(lambda: _holding(master), timeout=5, interval=0.05)
            # cut off just before the messages fall due: the master holds its lease
            # for up to 2 s more and delivers them into its own log meanwhile
            await asyncio.sleep(max(0.0, due_at - 0.3 - time.monotonic()))
            await asyncio.to_thread(cluster.partition, "g1/0")
            # a slave acts and escapes every due message to g2
            await eventually(lambda: _acting(cluster.namesrv), timeout=20, interval=0.2)

            async def escaped_all() -> bool:
                return set(keys) <= set(await _stored(pool, [g2]))

            await eventually(escaped_all, timeout=20, interval=0.2)
            await asyncio.to_thread(cluster.heal_partition, "g1/0")
            await eventually(lambda: _master_online(master.rpc, cluster.namesrv), timeout=30)

            async def slaves_level() -> bool:
                end = await _log_end(master)
                return all([await _log_end(s) == end for s in slaves])

            await eventually(slaves_level, timeout=20, interval=0.2)
            await asyncio.sleep(1.0)  # time for a wrong second delivery to happen
            seen = await _stored(pool, [master.rpc, g2])
            # the poll is answered once the link heals: never with what was cut away
            seen.update(await held)
        text = master.log_path.read_text()
        # the window was there: the master stored deliveries no slave confirmed
        assert "not confirmed by its slaves" in text, master.log_tail(60)
        twice = {k: n for k, n in seen.items() if n > 1}
        assert not twice, f"delivered more than once: {twice}\n{master.log_tail(60)}"
        assert set(keys) <= set(seen)
        assert "cutting the log at" in text, master.log_tail(60)
    finally:
        await asyncio.to_thread(cluster.close)


async def test_async_master_ahead_of_its_slave_keeps_acknowledged_messages() -> None:
    reason = netns_available()
    if reason is not None:
        pytest.skip(f"network namespaces: {reason}")
    spec = ClusterSpec(groups=("g1",), replicas=2, replication="async", netns=True)
    cluster = await asyncio.to_thread(DrillCluster(spec).start)
    try:
        master, slave = cluster.handle("g1/0"), cluster.handle("g1/1")
        await masters_online(cluster.namesrv, ("g1",))
        await create_topic_on(master.rpc, TOPIC, QUEUES)
        async with ConnectionPool() as pool:
            first = await _send(pool, master.rpc, "a", 4)
            await eventually(lambda: _same_end(master, slave), timeout=10, interval=0.1)
            await asyncio.to_thread(cluster.partition, "g1/1")
            late = await _send(pool, master.rpc, "b", 6)  # acknowledged with one copy
            ahead = await _log_end(master)
            await asyncio.to_thread(master.kill)
            # the killed master's kernel still holds the unsent batch in the socket to
            # the slave and retransmits it once the slave is reachable again: cut the
            # dead master off before the slave's partition heals, and let it back only
            # once the slave acts (its replication link closed, so the stale bytes are
            # refused).  Without this the slave sometimes got the batch after all.
            await asyncio.to_thread(cluster.partition, "g1/0")
            await asyncio.to_thread(cluster.heal_partition, "g1/1")
            # the slave acts for the killed master, holding less than it
            await eventually(lambda: _acting(cluster.namesrv), timeout=20, interval=0.2)
            assert await _log_end(slave) < ahead
            await asyncio.to_thread(cluster.heal_partition, "g1/0")
            master = await asyncio.to_thread(cluster.restart, "g1/0")
            await eventually(lambda: _master_online(master.rpc, cluster.namesrv), timeout=30)
            assert await _log_end(master) == ahead
            await eventually(lambda: _same_end(master, slave), timeout=10, interval=0.1)
            seen = await _stored(pool, [master.rpc])
        assert set(first + late) <= set(seen), master.log_tail(60)
        assert "cutting the log" not in master.log_path.read_text()
    finally:
        await asyncio.to_thread(cluster.close)


async def _same_end(a: ProcessHandle, b: ProcessHandle) -> bool:
    return await _log_end(a) == await _log_end(b)
