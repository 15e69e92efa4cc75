"""RIP-32 nameserver behaviour over real TCP against a real nameserver process
(after RocketMQ's RouteInfoManager tests), with simulated brokers speaking the protocol."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ha_controller.client.admin import NameserverClient
from ha_controller.protocol.errors import SignatureInvalid, TopicNotFound
from ha_controller.routing import Perm
from ha_controller.testing import ProcessHandle, eventually, run_nameserver
from ha_controller.testing.simbroker import SimulatedBroker

TOPIC = "T"


def http_json(ns: ProcessHandle, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://{ns.http}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


async def make_group(
    ns: ProcessHandle,
    name: str = "broker-a",
    ids: tuple[int, ...] = (0, 1, 2),
    *,
    acting: bool | None = True,
    timeout_ms: int | None = 10_000,
) -> list[SimulatedBroker]:
    brokers = []
    for bid in ids:
        b = SimulatedBroker(
            ns.rpc,
            "c1",
            name,
            bid,
            enable_acting_master=acting,
            heartbeat_timeout_ms=timeout_ms,
            topics={TOPIC: SimulatedBroker.topic(TOPIC, 8)},
        )
        await b.start()
        await b.register()
        brokers.append(b)
    return brokers


@pytest.fixture
async def client(nameserver: ProcessHandle) -> AsyncIterator[NameserverClient]:
    async with NameserverClient([nameserver.rpc]) as c:
        yield c


async def close_all(brokers: list[SimulatedBroker]) -> None:
    await asyncio.gather(*(b.aclose() for b in brokers))


async def test_master_connection_drop_makes_slave1_acting(
    nameserver: ProcessHandle, client: NameserverClient
) -> None:
    master, s1, s2 = await make_group(nameserver)
    try:
        route = await client.route(TOPIC)
        assert route.broker_datas[0].broker_addrs == {0: master.addr, 1: s1.addr, 2: s2.addr}
        assert route.queue_datas[0].perm == Perm.READ | Perm.WRITE
        assert route.queue_datas[0].read_queue_nums == 8

        t0 = time.monotonic()
        await master.drop_connection()

        async def rewritten() -> bool:
            r = await client.route(TOPIC)
            return r.broker_datas[0].broker_addrs == {0: s1.addr, 2: s2.addr} and (
                r.queue_datas[0].perm == Perm.READ
            )

        await eventually(rewritten, timeout=1.0, interval=0.01)
        assert time.monotonic() - t0 < 1.0
        for slave in (s1, s2):
            note = await slave.wait_notification(timeout=1.0)
            assert note.offline_broker_addr == master.addr
            assert note.min_broker_id == 1
            assert note.min_broker_addr == s1.addr
            assert note.broker_name == "broker-a"
        # the member group keeps raw ids
        group = await client.member_group("c1", "broker-a")
        assert group.broker_addrs == {1: s1.addr, 2: s2.addr}

        # the master comes back: id 0 again, writable, slaves told
        s1.notifications.clear()
        s2.notifications.clear()
        await master.register()
        route = await client.route(TOPIC)
        assert route.broker_datas[0].broker_addrs == {0: master.addr, 1: s1.addr, 2: s2.addr}
        assert route.queue_datas[0].perm == Perm.READ | Perm.WRITE
        for slave in (s1, s2):
            note = await slave.wait_notification(timeout=2.0)
            assert note.min_broker_id == 0
            assert note.min_broker_addr == master.addr
    finally:
        await close_all([master, s1, s2])


async def test_the_slave_holding_everything_acts_and_a_report_hands_over(
    nameserver: ProcessHandle, client: NameserverClient
) -> None:
    """Brokers report position and store health; the nameserver picks the acting slave
    from them (not the lowest id) and hands over on a heartbeat that changes it."""
    reports = {0: (10_000, True), 1: (6_000, False), 2: (10_000, True)}
    brokers = []
    for bid, (pos, writable) in reports.items():
        b = SimulatedBroker(
            nameserver.rpc,
            "c1",
            "broker-a",
            bid,
            topics={TOPIC: SimulatedBroker.topic(TOPIC, 8)},
            max_offset=pos,
            store_writable=writable,
        )
        await b.start()
        await b.register()
        brokers.append(b)
    master, s1, s2 = brokers
    try:
        await master.drop_connection()
        # the nameserver chooses from positions reported after the master left
        await asyncio.sleep(0.1)
        s1.heartbeat()
        s2.heartbeat()

        async def acting(slave: SimulatedBroker, other: SimulatedBroker) -> bool:
            r = await client.route(TOPIC)
            assert r.broker_datas[0].broker_addrs == {0: slave.addr, other.broker_id: other.addr}
            group = await client.member_group("c1", "broker-a")
            assert group.acting_broker_id == slave.broker_id
            assert group.broker_addrs == {1: s1.addr, 2: s2.addr}
            return True

        await eventually(lambda: acting(s2, s1), timeout=2.0)
        for slave in (s1, s2):  # slave 1 is told too: it must not act
            note = await slave.wait_notification(timeout=2.0)
            assert (note.min_broker_id, note.min_broker_addr) == (2, s2.addr)
            assert note.offline_broker_addr == master.addr

        # slave 1 gets its space back, but it is behind: no change; slave 2 reports
        # that it cannot write, but it alone holds everything: no change either
        s1.store_writable = True
        s1.heartbeat()
        s2.store_writable = False
        s2.heartbeat()
        await asyncio.sleep(0.3)
        assert await acting(s2, s1)

        # slave 1 turns out level with slave 2 (and it can write): slave 1 acts
        s1.notifications.clear()
        s2.notifications.clear()
        s1.max_offset = 10_000
        s1.heartbeat()
        await eventually(lambda: acting(s1, s2), timeout=2.0)
        for slave in (s1, s2):
            note = await slave.wait_notification(timeout=2.0)
            assert (note.min_broker_id, note.min_broker_addr) == (1, s1.addr)
            assert note.offline_broker_addr == ""
        status, groups = await asyncio.to_thread(http_json, nameserver, "/api/v1/groups")
        assert status == 200 and groups[0]["actingBrokerId"] == 1
        members = {m["brokerId"]: m for m in groups[0]["members"]}
        assert (members[2]["maxOffset"], members[2]["storeWritable"]) == (10_000, False)
    finally:
        await close_all(brokers)


async def test_silent_master_expires_within_timeout_plus_scan(
    nameserver: ProcessHandle, client: NameserverClient
) -> None:
    timeout_ms = 1500
    brokers = await make_group(nameserver, timeout_ms=timeout_ms)
    master, s1, s2 = brokers
    try:
        t0 = time.monotonic()
        stop = asyncio.Event()

        async def beat() -> None:
            while not stop.is_set():
                s1.heartbeat()
                s2.heartbeat()
                await asyncio.sleep(0.2)

        beater = asyncio.create_task(beat())

        # the master keeps its connection open but sends no heartbeat
        async def rewritten() -> bool:
            r = await client.route(TOPIC)
            return r.broker_datas[0].broker_addrs.get(0) == s1.addr

        await eventually(rewritten, timeout=(timeout_ms + 500) / 1000 + 1.5)
        elapsed = time.monotonic() - t0
        assert elapsed >= timeout_ms / 1000 - 0.05, "expired before its heartbeat timeout"
        route = await client.route(TOPIC)
        assert route.broker_datas[0].broker_addrs == {0: s1.addr, 2: s2.addr}
        assert route.queue_datas[0].perm == Perm.READ
        note = await s2.wait_notification(timeout=1.0)
        assert note.offline_broker_addr == master.addr
        assert not master.conn.closed or True  # the nameserver may close it, as RocketMQ does
        stop.set()
        await beater
    finally:
        await close_all(brokers)


async def test_group_without_acting_master_is_never_rewritten(
    nameserver: ProcessHandle, client: NameserverClient
) -> None:
    brokers = await make_group(nameserver, "old-group", (0, 1), acting=None, timeout_ms=None)
    master, slave = brokers
    try:
        await master.drop_connection()
        await eventually(lambda: _group_ids(client, "old-group", {1}), timeout=2.0)
        route = await client.route(TOPIC)
        assert route.broker_datas[0].broker_addrs == {1: slave.addr}
        assert 0 not in route.broker_datas[0].broker_addrs
        assert route.queue_datas[0].perm == Perm.READ | Perm.WRITE
        await asyncio.sleep(0.2)
        assert slave.notifications == []
    finally:
        await close_all(brokers)


async def _group_ids(client: NameserverClient, name: str, ids: set[int]) -> bool:
    group = await client.member_group("c1", name)
    return set(group.broker_addrs) == ids


async def test_compatibility_mode(nameserver: ProcessHandle, client: NameserverClient) -> None:
    brokers = await make_group(nameserver, "compat", (0, 1), timeout_ms=1500)
    _master, slave = brokers
    try:
        # QUERY_DATA_VERSION is the slave's only heartbeat; the master stays silent
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            resp = await slave.query_data_version()
            assert resp.changed is False
            await asyncio.sleep(0.2)
        group = await client.member_group("c1", "compat")
        assert group.broker_addrs == {1: slave.addr}, "slave kept alive, master expired"
        sys_route = await client.route("rmq_sys_SYNC_BROKER_MEMBER_compat")
        assert sys_route.broker_datas[0].broker_addrs == {1: slave.addr}
        user_route = await client.route(TOPIC)
        assert user_route.broker_datas[0].broker_addrs == {0: slave.addr}
    finally:
        await close_all(brokers)


async def test_route_watch_answers_within_100ms(
    nameserver: ProcessHandle, client: NameserverClient
) -> None:
    brokers = await make_group(nameserver, ids=(0, 1))
    master, slave = brokers
    try:
        version, route = await client.watch_route(TOPIC, "", max_wait_ms=100)
        assert route is not None and route.broker_datas[0].broker_addrs[0] == master.addr
        async with NameserverClient([nameserver.rpc]) as watcher:
            watch = asyncio.create_task(watcher.watch_route(TOPIC, version, max_wait_ms=10_000))
            await asyncio.sleep(0.3)
            assert not watch.done(), "the watch must wait while the route is unchanged"
            t0 = time.monotonic()
            await master.drop_connection()
            new_version, new_route = await asyncio.wait_for(watch, 2.0)
            latency = time.monotonic() - t0
        assert new_version != version
        assert new_route is not None
        assert new_route.broker_datas[0].broker_addrs == {0: slave.addr}
        assert latency < 0.1, f"route watch answered after {latency * 1000:.0f} ms"
    finally:
        await close_all(brokers)


async def test_unknown_topic_is_typed_error(client: NameserverClient) -> None:
    with pytest.raises(TopicNotFound):
        await client.route("nope")


def test_signed_registration(tmp_path: Path) -> None:
    async def scenario(ns: ProcessHandle) -> None:
        good = SimulatedBroker(ns.rpc, "c1", "sec", 0, topics={TOPIC: SimulatedBroker.topic(TOPIC)})
        evil = SimulatedBroker(ns.rpc, "c1", "sec", 0, topics={TOPIC: SimulatedBroker.topic(TOPIC)})
        await good.start()
        await evil.start()
        try:
            with pytest.raises(SignatureInvalid):
                await evil.register(secret="wrong-secret")
            with pytest.raises(SignatureInvalid):
                await evil.register(secret="")
            await good.register(secret="s3cret")
            async with NameserverClient([ns.rpc]) as c:
                route = await c.route(TOPIC)
            assert route.broker_datas[0].broker_addrs == {0: good.addr}
        finally:
            await good.aclose()
            await evil.aclose()

    ns = run_nameserver(tmp_path, env={"HAC_CLUSTER_SECRET": "s3cret"})
    try:
        asyncio.run(scenario(ns))
    finally:
        ns.stop()


async def test_http_api_shapes(nameserver: ProcessHandle, client: NameserverClient) -> None:
    brokers = await make_group(nameserver, ids=(0, 1))
    master, slave = brokers
    try:
        status, _ = await asyncio.to_thread(http_json, nameserver, "/healthz")
        assert status == 200
        status, _ = await asyncio.to_thread(http_json, nameserver, "/readyz")
        assert status == 200
        status, groups = await asyncio.to_thread(http_json, nameserver, "/api/v1/groups")
        assert status == 200
        (g,) = groups
        assert g["cluster"] == "c1" and g["brokerName"] == "broker-a"
        assert g["enableActingMaster"] is True and g["masterOnline"] is True
        assert g["actingBrokerId"] is None
        assert [m["brokerId"] for m in g["members"]] == [0, 1]
        assert set(g["members"][0]) == {
            "brokerId",
            "addr",
            "haAddr",
            "lastHeartbeatAgeMs",
            "maxOffset",
            "storeWritable",
        }
        status, route = await asyncio.to_thread(http_json, nameserver, f"/api/v1/routes/{TOPIC}")
        assert status == 200
        assert route == {
            "topic": TOPIC,
            "brokers": [
                {
                    "cluster": "c1",
                    "brokerName": "broker-a",
                    "brokerAddrs": {"0": master.addr, "1": slave.addr},
                }
            ],
            "queues": [
                {"brokerName": "broker-a", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6}
            ],
        }
        status, _ = await asyncio.to_thread(http_json, nameserver, "/api/v1/routes/missing")
        assert status == 404

        await master.drop_connection()
        await eventually(lambda: _group_ids(client, "broker-a", {1}), timeout=2.0)
        status, groups = await asyncio.to_thread(http_json, nameserver, "/api/v1/groups")
        assert groups[0]["masterOnline"] is False and groups[0]["actingBrokerId"] == 1

        with urllib.request.urlopen(f"http://{nameserver.http}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert 'hac_group_member_up{broker_id="1",broker_name="broker-a",cluster="c1"} 1.0' in text
        assert 'hac_group_acting_master{broker_name="broker-a",cluster="c1"} 1.0' in text
        assert 'hac_min_broker_id_changes_total{broker_name="broker-a",cluster="c1"}' in text
        assert "hac_broker_heartbeat_age_seconds" in text
        assert 'hac_group_acting_master_since_seconds{broker_name="broker-a",cluster="c1"}' in text
    finally:
        await close_all(brokers)
