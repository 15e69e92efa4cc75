"""Control-plane authentication over real processes and loopback TCP.

With a cluster secret, forged control requests (unsigned, signed with a wrong secret,
signed too long ago, or copies of a real one) are refused and change nothing: a
frozen master is not kept alive by forged heartbeats, forged min-id notices and
HA-info exchanges neither fence the master nor repoint the slaves, and a fake HA
"slave" is never counted as a copy.  Without a secret (open mode) a stranger's
connection cannot unregister, heartbeat or displace a live master, and no report
beyond the master's end counts as a copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf.message import Message as PbMessage

from ha_controller.auth import ClusterAuth, wall_ms
from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message
from ha_controller.client.producer import Producer
from ha_controller.proto import broker_pb2, common_pb2, nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.envelope import RequestAuth
from ha_controller.protocol.errors import (
    AddressMismatch,
    ConnectionClosed,
    HaError,
    RegistrationConflict,
    ReplayedRequest,
    SignatureInvalid,
)
from ha_controller.rpc import RpcConnection, Signer, connect
from ha_controller.testing import Cluster, eventually, http_get, run_cluster

SECRET = "correct horse battery staple"
CLUSTER = "DefaultCluster"
GROUP = "g1"
TOPIC = "AuthT"

#: what a stranger without the secret can send: nothing, a guess, an old signature
FORGERS: dict[str, Signer | None] = {
    "unsigned": None,
    "wrong secret": ClusterAuth("guessed").sign,
    "old signature": ClusterAuth(SECRET, clock_ms=lambda: wall_ms() - 120_000).sign,
}


# ---- helpers --------------------------------------------------------------------------------


async def forge(
    addr: str,
    method: int,
    request: PbMessage,
    signer: Signer | None = None,
    response: type[PbMessage] = common_pb2.Empty,
) -> HaError | None:
    """One request from a connection of its own; the error it got, or None."""
    conn = await connect(addr)
    conn.signer = signer
    try:
        await conn.call_pb(method, request, response, timeout_ms=3000)
    except HaError as exc:
        return exc
    finally:
        await conn.aclose()
    return None


def refused(addr: str, reason: str) -> float:
    """hac_auth_refused_total{reason} of the process serving HTTP at ``addr``."""
    status, body = http_get(addr, "/metrics")
    assert status == 200
    pattern = re.compile(rf'^hac_auth_refused_total\{{[^}}]*reason="{reason}"[^}}]*\}} (\S+)$')
    return sum(float(m.group(1)) for m in map(pattern.match, body.decode().splitlines()) if m)


async def id0(ns: NameserverClient) -> str | None:
    return (await ns.member_group(CLUSTER, GROUP)).broker_addrs.get(0)


async def send_some(cluster: Cluster, count: int, pause_s: float = 0.0) -> None:
    """``count`` sends, each acknowledged (SYNC: the master and a slave hold it)."""
    async with Producer(cluster.namesrv, group="auth-p", max_attempts=1) as p:
        for i in range(count):
            async with asyncio.timeout(10):
                await p.send(Message(TOPIC, f"m{i}".encode()))
            await asyncio.sleep(pause_s)


async def settle(cluster: Cluster) -> None:
    """Master online with both slaves, the topic created, a send acknowledged."""
    master = cluster.broker(GROUP, 0)
    async with NameserverClient([cluster.namesrv]) as ns:

        async def all_members() -> bool:
            group = await ns.member_group(CLUSTER, GROUP)
            return group.broker_addrs.get(0) == master.rpc and len(group.broker_addrs) == 3

        await eventually(all_members, timeout=40)
        await ns.create_topic(TOPIC, queues=2)

    async def one_send() -> bool:
        try:
            await send_some(cluster, 1)
        except HaError:
            return False
        return True

    await eventually(one_send, timeout=30, interval=0.5)


async def fake_ha_slave(master_ha: str) -> RpcConnection:
    """A connection to the master's HA port that claims a huge offset without any
    handshake: at first the truth (0), then 2**60."""
    conn = await connect(master_ha)
    for offset in (0, 1 << 60):
        report = broker_pb2.HaReport(max_offset=offset, slave_addr="127.0.0.1:1", broker_id=7)
        with contextlib.suppress(ConnectionClosed):  # the master may close it at once
            conn.oneway(RequestCode.HA_REPORT_OFFSET, report.SerializeToString())
        await asyncio.sleep(0.2)
    return conn


async def sync_send_with_slaves_paused(cluster: Cluster) -> HaError | None:
    """Pause both real slaves and send once: the error (no second copy), or None when
    the send was acknowledged (something else was counted as a copy)."""
    slaves = [cluster.broker(GROUP, 1), cluster.broker(GROUP, 2)]
    for slave in slaves:
        slave.pause()
    try:
        async with Producer(
            cluster.namesrv, group="auth-sync", max_attempts=1, send_timeout_ms=10_000
        ) as p:
            try:
                await p.send(Message(TOPIC, b"needs two copies"))
            except HaError as exc:
                return exc
            return None
    finally:
        for slave in slaves:
            slave.resume()


# ---- with a cluster secret ------------------------------------------------------------------


@pytest.fixture
def secret_cluster(tmp_path: Path) -> Iterator[Cluster]:
    cluster = run_cluster((GROUP,), 3, workdir=tmp_path, env={"HAC_CLUSTER_SECRET": SECRET})
    try:
        yield cluster
    finally:
        cluster.stop()


async def test_forged_notices_and_ha_info_change_nothing(secret_cluster: Cluster) -> None:
    cluster = secret_cluster
    await settle(cluster)
    master, s1, s2 = (cluster.broker(GROUP, i) for i in range(3))
    # "the master is gone, slave 1 leads": would fence the master, make slave 1 act
    notice = nameserver_pb2.NotifyMinBrokerIdChangeRequest(
        min_broker_id=1,
        min_broker_addr=s1.rpc,
        offline_broker_addr=master.rpc,
        broker_name=GROUP,
        cluster=CLUSTER,
    )
    # "replicate from here": would cut the slaves off the real master
    elsewhere = broker_pb2.BrokerHaInfo(master_ha_addr="127.0.0.1:9", master_addr="127.0.0.1:9")
    answers: list[tuple[str, str, str, HaError | None]] = []
    for name, signer in FORGERS.items():
        for target in (master, s1, s2):
            exc = await forge(target.rpc, RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE, notice, signer)
            answers.append(("notice", name, target.name, exc))
        for target in (s1, s2):
            exc = await forge(
                target.rpc,
                RequestCode.EXCHANGE_BROKER_HA_INFO,
                elsewhere,
                signer,
                broker_pb2.BrokerHaInfo,
            )
            answers.append(("HA info", name, target.name, exc))
    # sends keep succeeding, each acknowledged by a slave's copy, for a few seconds
    await send_some(cluster, 15, pause_s=0.2)
    assert "fenced:" not in master.log_path.read_text(), master.log_tail(40)
    accepted = [a for a in answers if not isinstance(a[3], SignatureInvalid)]
    assert not accepted, accepted
    for slave in (s1, s2):
        assert "127.0.0.1:9" not in slave.log_path.read_text(), slave.log_tail(40)
        assert refused(slave.http, "unsigned") >= 2
        assert refused(slave.http, "bad_signature") >= 2
        assert refused(slave.http, "stale") >= 2
    assert refused(master.http, "unsigned") >= 1


async def test_a_replayed_request_is_refused(secret_cluster: Cluster) -> None:
    cluster = secret_cluster
    await settle(cluster)
    slave = cluster.broker(GROUP, 1)
    heartbeat = nameserver_pb2.BrokerHeartbeatRequest(
        cluster=CLUSTER, broker_addr=slave.rpc, broker_name=GROUP
    )
    # a real member's signed heartbeat, captured once and sent again as it was
    captured = ClusterAuth(SECRET).sign(RequestCode.BROKER_HEARTBEAT, heartbeat.SerializeToString())
    assert captured is not None
    before = refused(cluster.nameserver.http, "replayed")

    def replay(method: int, body: bytes) -> RequestAuth:
        return captured

    assert await forge(cluster.namesrv, RequestCode.BROKER_HEARTBEAT, heartbeat, replay) is None
    for _ in range(2):  # on another connection each time
        exc = await forge(cluster.namesrv, RequestCode.BROKER_HEARTBEAT, heartbeat, replay)
        assert isinstance(exc, ReplayedRequest), exc
    conn = await connect(cluster.namesrv)
    conn.signer = replay
    try:  # and on one connection
        with pytest.raises(ReplayedRequest):
            await conn.call_pb(RequestCode.BROKER_HEARTBEAT, heartbeat, common_pb2.Empty)
    finally:
        await conn.aclose()
    assert refused(cluster.nameserver.http, "replayed") == before + 3


async def test_a_fake_ha_slave_is_never_a_copy(secret_cluster: Cluster) -> None:
    cluster = secret_cluster
    await settle(cluster)
    master = cluster.broker(GROUP, 0)
    # reports without the handshake: not counted (and the link is closed)
    fake = await fake_ha_slave(master.ha)
    try:
        exc = await sync_send_with_slaves_paused(cluster)
        assert exc is not None, "a SYNC send was acknowledged with only the master's copy"
        await eventually(lambda: fake.closed, timeout=5)
    finally:
        await fake.aclose()
    await settle(cluster)  # the real slaves attach again
    # a handshake with a guessed secret fails at the master
    conn = await connect(master.ha)
    try:
        challenge = await conn.call_pb(
            RequestCode.HA_HELLO,
            broker_pb2.HaHello(slave_nonce=b"n" * 16),
            broker_pb2.HaChallenge,
        )
        assert challenge.challenge
        guess = ClusterAuth("guessed").ha_slave_signature(
            challenge.challenge, GROUP, 7, "127.0.0.1:1"
        )
        with pytest.raises(SignatureInvalid):
            await conn.call_pb(
                RequestCode.HA_AUTH,
                broker_pb2.HaAuth(
                    broker_name=GROUP, broker_id=7, slave_addr="127.0.0.1:1", signature=guess
                ),
                common_pb2.Empty,
            )
    finally:
        await conn.aclose()
    assert refused(master.http, "ha_unauthenticated") >= 1
    assert refused(master.http, "ha_bad_signature") >= 1


async def test_forged_heartbeats_do_not_keep_a_frozen_master(secret_cluster: Cluster) -> None:
    cluster = secret_cluster
    await settle(cluster)
    master = cluster.broker(GROUP, 0)
    heartbeat = nameserver_pb2.BrokerHeartbeatRequest(
        cluster=CLUSTER, broker_addr=master.rpc, broker_name=GROUP
    )
    errors: list[HaError | None] = []

    async def keep_alive() -> None:
        while True:
            for signer in FORGERS.values():
                errors.append(
                    await forge(cluster.namesrv, RequestCode.BROKER_HEARTBEAT, heartbeat, signer)
                )
            await asyncio.sleep(0.2)

    async with NameserverClient([cluster.namesrv]) as ns:
        master.pause()
        forger = asyncio.create_task(keep_alive())
        try:
            started = time.monotonic()
            # the normal not-active timeout (2 s here) plus the scan interval, and margin
            await eventually(lambda: _is_not(ns, master.rpc), timeout=15)
            took = time.monotonic() - started
        finally:
            forger.cancel()
            await asyncio.gather(forger, return_exceptions=True)
            master.resume()
    assert errors and all(isinstance(e, SignatureInvalid) for e in errors), errors
    assert took < 10, f"failover took {took:.1f} s"
    assert refused(cluster.nameserver.http, "unsigned") >= 1
    assert refused(cluster.nameserver.http, "stale") >= 1


async def _is_not(ns: NameserverClient, addr: str) -> bool:
    return await id0(ns) != addr


# ---- open mode ------------------------------------------------------------------------------


@pytest.fixture
def open_cluster(tmp_path: Path) -> Iterator[Cluster]:
    cluster = run_cluster((GROUP,), 3, workdir=tmp_path)
    try:
        yield cluster
    finally:
        cluster.stop()


async def test_open_mode_a_stranger_cannot_unregister_a_master(open_cluster: Cluster) -> None:
    cluster = open_cluster
    await settle(cluster)
    master = cluster.broker(GROUP, 0)
    unregister = nameserver_pb2.UnregisterBrokerRequest(
        cluster=CLUSTER, broker_addr=master.rpc, broker_name=GROUP, broker_id=0
    )
    unregistered = await forge(cluster.namesrv, RequestCode.UNREGISTER_BROKER, unregister)
    heartbeat = nameserver_pb2.BrokerHeartbeatRequest(
        cluster=CLUSTER, broker_addr=master.rpc, broker_name=GROUP
    )
    heartbeated = await forge(cluster.namesrv, RequestCode.BROKER_HEARTBEAT, heartbeat)
    async with NameserverClient([cluster.namesrv]) as ns:
        assert await id0(ns) == master.rpc
    await send_some(cluster, 10, pause_s=0.2)
    assert isinstance(unregistered, RegistrationConflict), unregistered
    assert isinstance(heartbeated, RegistrationConflict), heartbeated
    assert refused(cluster.nameserver.http, "registration_conflict") >= 2


async def test_open_mode_a_rogue_register_does_not_lock_the_master_out(
    open_cluster: Cluster,
) -> None:
    cluster = open_cluster
    await settle(cluster)
    master = cluster.broker(GROUP, 0)

    def rogue(addr: str, name: str = GROUP) -> nameserver_pb2.RegisterBrokerRequest:
        return nameserver_pb2.RegisterBrokerRequest(
            cluster=CLUSTER,
            broker_addr=addr,
            broker_name=name,
            broker_id=0,
            ha_addr=addr,
            enable_acting_master=True,
            heartbeat_timeout_ms=600_000,
            # "newer than the real master": a registration that would displace it and
            # make the master's own next registration stale
            data_version=common_pb2.DataVersion(
                state_version=1 << 40, counter=1, timestamp_ms=wall_ms()
            ),
            pre_online_done=True,
        )

    same_host = await forge(cluster.namesrv, RequestCode.REGISTER_BROKER, rogue("127.0.0.1:1"))
    other_host = await forge(
        cluster.namesrv, RequestCode.REGISTER_BROKER, rogue("10.255.255.254:10911")
    )
    # an address on another host than the connection's, even for a free id
    free_id = await forge(
        cluster.namesrv, RequestCode.REGISTER_BROKER, rogue("10.255.255.254:10911", "rogue")
    )
    async with NameserverClient([cluster.namesrv]) as ns:
        assert await id0(ns) == master.rpc
        route = await ns.route(TOPIC)
        brokers = route.broker(GROUP)
        assert brokers is not None and brokers.broker_addrs.get(0) == master.rpc
    await send_some(cluster, 10, pause_s=0.2)
    assert isinstance(same_host, RegistrationConflict), same_host
    # the host is checked first: another host's address is refused whatever the id
    assert isinstance(other_host, AddressMismatch), other_host
    assert isinstance(free_id, AddressMismatch), free_id
    assert refused(cluster.nameserver.http, "addr_mismatch") >= 1


async def test_open_mode_a_report_beyond_the_masters_end_is_refused(
    open_cluster: Cluster,
) -> None:
    cluster = open_cluster
    await settle(cluster)
    master = cluster.broker(GROUP, 0)
    fake = await fake_ha_slave(master.ha)
    try:
        exc = await sync_send_with_slaves_paused(cluster)
        assert exc is not None, "a SYNC send was acknowledged with only the master's copy"
        assert fake.closed
    finally:
        await fake.aclose()
    assert refused(master.http, "ha_offset_beyond_max") >= 1
    await settle(cluster)
