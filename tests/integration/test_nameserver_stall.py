"""A nameserver frozen past the brokers' heartbeat timeout and resumed expires nobody
(issue 17, defect B).

It used to measure its own freeze as every broker's silence: it expired them all at
once, served clients no routes, and told each group's slaves that the master was
gone, so a slave briefly acted beside its live master.  Now the late scan tells it
that it stalled, and every broker gets a fresh grace period instead.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from special_helpers import create_topic_on, masters_online

from ha_controller.client.admin import NameserverClient
from ha_controller.client.routes import RouteCache
from ha_controller.testing import (
    FAST_ENV,
    ProcessHandle,
    eventually,
    run_broker,
    run_nameserver,
)

TOPIC = "StallTopic"


async def test_paused_nameserver_resumed_expires_nobody(tmp_path: Path) -> None:
    env = {**FAST_ENV, "HAC_TOTAL_REPLICAS": "2"}
    paused = run_nameserver(tmp_path / "ns-a", env=env, name="ns-a")
    other = run_nameserver(tmp_path / "ns-b", env=env, name="ns-b")
    namesrv = f"{paused.rpc},{other.rpc}"
    brokers = []
    try:
        brokers.append(run_broker(namesrv, "g1", 1, tmp_path, env=env))
        brokers.append(run_broker(namesrv, "g1", 0, tmp_path, env=env))
        slave, master = brokers
        await masters_online(paused.rpc, ["g1"])
        await masters_online(other.rpc, ["g1"])
        await create_topic_on(master.rpc, TOPIC)

        async def routed() -> bool:
            async with NameserverClient([paused.rpc]) as ns:
                route = await ns.route(TOPIC)
            broker = route.broker("g1")
            return broker is not None and broker.broker_addrs.get(0) == master.rpc

        await eventually(routed, timeout=20, interval=0.1)
        # the slave acted at its start, before the master came: judge what follows
        seen = {h.name: len(h.log_path.read_text()) for h in (paused, slave, master)}

        def log_since(handle: ProcessHandle) -> str:
            return handle.log_path.read_text()[seen[handle.name] :]

        paused.pause()
        await asyncio.sleep(4.0)  # twice the brokers' 2 s heartbeat timeout
        paused.resume()
        # the first answers after the resume: every broker is still there
        async with NameserverClient([paused.rpc]) as ns:
            route = await ns.route(TOPIC)
            group = await ns.member_group("DefaultCluster", "g1")
        assert group.broker_addrs == {0: master.rpc, 1: slave.rpc}
        broker = route.broker("g1")
        assert broker is not None and broker.broker_addrs.get(0) == master.rpc
        await asyncio.sleep(2.0)  # time for a wrong expiry and a wrong notice to land
        ns_log = log_since(paused)
        assert "nameserver stalled" in ns_log, ns_log
        assert "expire broker" not in ns_log, ns_log
        assert "start acting" not in log_since(slave), log_since(slave)
        assert "fenced" not in log_since(master), log_since(master)
    finally:
        paused.resume()
        for b in brokers:
            b.kill()
        paused.stop()
        other.stop()


async def test_a_paused_nameserver_does_not_hold_up_the_heartbeats_to_the_other(
    tmp_path: Path,
) -> None:
    """Each nameserver gets its heartbeats on its own clock.  With one round over both,
    every round waited out the paused one's send timeout (1.8 s here, a valid setting
    below the 2 s not-active timeout): the live nameserver heard from the master too
    late, expired it, and the master fenced itself (campaign seed 5000, with the default
    1 s timeout and a loaded machine)."""
    env = {**FAST_ENV, "HAC_TOTAL_REPLICAS": "2", "HAC_SEND_HEARTBEAT_TIMEOUT_MS": "1800"}
    paused = run_nameserver(tmp_path / "ns-a", env=env, name="ns-a")
    other = run_nameserver(tmp_path / "ns-b", env=env, name="ns-b")
    namesrv = f"{paused.rpc},{other.rpc}"
    brokers = []
    try:
        brokers.append(run_broker(namesrv, "g1", 1, tmp_path, env=env))
        brokers.append(run_broker(namesrv, "g1", 0, tmp_path, env=env))
        slave, master = brokers
        await masters_online(paused.rpc, ["g1"])
        await masters_online(other.rpc, ["g1"])
        seen = {h.name: len(h.log_path.read_text()) for h in (other, slave, master)}

        def log_since(handle: ProcessHandle) -> str:
            return handle.log_path.read_text()[seen[handle.name] :]

        paused.pause()
        await asyncio.sleep(5.0)
        async with NameserverClient([other.rpc]) as ns:
            group = await ns.member_group("DefaultCluster", "g1")
        assert group.broker_addrs == {0: master.rpc, 1: slave.rpc}
        assert "expire broker" not in log_since(other), log_since(other)
        assert "fenced" not in log_since(master), log_since(master)
        assert "start acting" not in log_since(slave), log_since(slave)
    finally:
        paused.resume()
        for b in brokers:
            b.kill()
        paused.stop()
        other.stop()


async def test_client_asks_the_other_nameserver_when_one_has_no_route(tmp_path: Path) -> None:
    """A nameserver that restarted knows no topic until the brokers' next full
    registration: the route cache asks the other configured nameserver first."""
    env = {**FAST_ENV, "HAC_TOTAL_REPLICAS": "1", "HAC_IN_SYNC_REPLICAS": "1"}
    empty = run_nameserver(tmp_path / "ns-empty", env=env, name="ns-empty")
    full = run_nameserver(tmp_path / "ns-full", env=env, name="ns-full")
    broker = run_broker(full.rpc, "g1", 0, tmp_path, env=env)  # registers with one only
    try:
        await masters_online(full.rpc, ["g1"])
        await create_topic_on(broker.rpc, TOPIC)
        async with NameserverClient([empty.rpc, full.rpc]) as ns:

            async def known() -> bool:
                async with NameserverClient([full.rpc]) as one:
                    return (await one.route(TOPIC)).broker("g1") is not None

            await eventually(known, timeout=20, interval=0.1)
            async with RouteCache(ns, watch=False) as cache:
                route = await cache.route(TOPIC)
        assert route.broker("g1") is not None
    finally:
        broker.kill()
        empty.stop()
        full.stop()
