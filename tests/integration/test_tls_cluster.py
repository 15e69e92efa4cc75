"""A whole cluster under mutual TLS, end to end, with real processes on loopback.

One ``[tls]`` (here ``HAC_TLS_*``) governs every listener and every outgoing
connection of a process: a nameserver and two groups of three (master and two slaves)
must get through pre-online (brokers dialling the nameserver and each other with TLS),
replicate over a TLS HA link (sync replication, two copies: a send succeeds only when
a slave has it), serve HTTPS, and keep sends going through the other group when a
master is killed.  The tools (hactl, the SDK, the gRPC gateway) connect with the
``--tls-*`` flags, ``HAC_TLS_*`` or ``tls=``; a plaintext client is told, in one line,
what to pass.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from ha_controller.client import Message, NameserverClient, Producer, PullConsumer
from ha_controller.client.admin import NameserverUnavailable
from ha_controller.protocol.errors import (
    ConnectionClosed,
    TlsError,
    TlsMismatch,
    UnknownMethod,
)
from ha_controller.rpc import connect
from ha_controller.rpc.tls import client_context
from ha_controller.testing import (
    Cluster,
    ProcessHandle,
    TlsFiles,
    _base_env,
    eventually,
    eventually_sync,
    hactl_argv,
    http_get,
    make_tls_files,
    openssl_missing,
    run_cluster,
)

pytestmark = [
    pytest.mark.skipif(openssl_missing() is not None, reason=str(openssl_missing())),
    pytest.mark.timeout(240),
]

GROUPS = ("tls-a", "tls-b")
TOPIC = "TlsTopic"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    # the certificates name 127.0.0.1 only (not localhost: see the hostname check below)
    return make_tls_files(tmp_path_factory.mktemp("tls-files"), hosts=("127.0.0.1",))


def _ready(cluster: Cluster, tls: TlsFiles) -> bool:
    """Every broker answers /readyz 200 over HTTPS: masters are past pre-online."""
    try:
        return all(http_get(h.http, "/readyz", tls=tls)[0] == 200 for h in cluster.brokers.values())
    except OSError:  # a broker not listening yet (a restart)
        return False


@pytest.fixture(scope="module")
def cluster(tls: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = run_cluster(GROUPS, 3, workdir=tmp_path_factory.mktemp("tls-cluster"), tls=tls)
    try:
        eventually_sync(lambda: _ready(c, tls), timeout=60, interval=0.2)
        yield c
    finally:
        c.stop()


def hactl(
    cluster: Cluster, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        hactl_argv(*args, "--namesrv", cluster.namesrv),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_base_env(env),
    )


def one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 1, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


# --- the cluster itself --------------------------------------------------------------


async def test_cluster_goes_online_and_serves_https(cluster: Cluster, tls: TlsFiles) -> None:
    async with NameserverClient([cluster.namesrv], tls=tls.client_context()) as ns:
        groups = {g.broker_name: g for g in await ns.groups()}
    assert set(groups) == set(GROUPS)
    for name in GROUPS:
        assert groups[name].master_online
        assert groups[name].members == {i: cluster.broker(name, i).rpc for i in range(3)}, (
            "every member registered over TLS"
        )
    # the admin HTTP of every process is HTTPS (and demands a client certificate)
    status, body = await asyncio.to_thread(
        http_get, cluster.broker("tls-a", 0).http, "/api/v1/status", tls=tls
    )
    assert status == 200 and json.loads(body)["role"] == "master"
    status, body = await asyncio.to_thread(
        http_get, cluster.nameserver.http, "/api/v1/groups", tls=tls
    )
    assert status == 200 and len(json.loads(body)) == 2
    with pytest.raises(OSError):  # URLError / ConnectionResetError / RemoteDisconnected
        await asyncio.to_thread(http_get, cluster.nameserver.http, "/healthz")


async def test_the_ha_link_is_tls(cluster: Cluster, tls: TlsFiles) -> None:
    """Slaves replicate through the master's HA port, which takes TLS only: a plaintext
    attempt is answered with TlsMismatch, a TLS one without a client certificate is cut
    off, and sync sends (two copies) succeed, so the slaves' TLS links carry the data."""
    master = cluster.broker("tls-a", 0)
    with pytest.raises(TlsMismatch, match="speaks TLS"):
        conn = await connect(master.ha)
        try:
            await conn.call(12345, b"", 2000)
        finally:
            await conn.aclose()
    with pytest.raises((ConnectionClosed, TlsError)):
        conn = await connect(master.ha, ssl_context=client_context(str(tls.ca)))
        try:
            await conn.call(12345, b"", 2000)
        finally:
            await conn.aclose()
    async with await connect(master.ha, ssl_context=tls.client_context()) as conn:
        with pytest.raises(UnknownMethod):  # TLS with a client certificate gets through
            await conn.call(12345, b"", 2000)

    async def slaves_caught_up() -> bool:
        lags = [
            json.loads((await asyncio.to_thread(http_get, h.http, "/api/v1/status", tls=tls))[1])[
                "replicationLagBytes"
            ]
            for h in (cluster.broker("tls-a", 1), cluster.broker("tls-a", 2))
        ]
        return all(lag == 0 for lag in lags)

    async with Producer(cluster.namesrv, group="tls-ha", tls=tls.client_context()) as producer:
        for i in range(10):
            receipt = await producer.send(Message("TlsHaTopic", f"m{i}".encode()))
            assert receipt.broker_name in GROUPS
    await eventually(slaves_caught_up, timeout=10)


# --- hactl ---------------------------------------------------------------------------


def test_hactl_with_tls_flags_and_with_env(cluster: Cluster, tls: TlsFiles) -> None:
    flags = tls.hactl_args()
    out = hactl(cluster, "topic", "create", TOPIC, "--queues", "2", *flags)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"topic {TOPIC} created on {', '.join(GROUPS)}"

    out = hactl(cluster, "produce", "--topic", TOPIC, "--count", "20", "--json", *flags)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert lines[-1]["summary"] == {"sent": 20, "acknowledged": 20, "failed": 0}
    keys = {line["key"] for line in lines[:-1]}

    # the same settings from the environment, as the services read them
    env = tls.client_env()
    out = hactl(
        cluster, "consume", "--topic", TOPIC, "--group", "tls-g", "--count", "20", "--json",
        "--timeout", "30", env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = [json.loads(line) for line in out.stdout.splitlines()]
    assert {m["key"] for m in got[:-1]} == keys

    out = hactl(cluster, "groups", "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert {g["brokerName"] for g in json.loads(out.stdout)} == set(GROUPS)
    out = hactl(cluster, "route", TOPIC, "--json", *flags)
    assert out.returncode == 0, out.stderr
    assert {b["brokerName"] for b in json.loads(out.stdout)["brokers"]} == set(GROUPS)
    out = hactl(cluster, "topic", "describe", TOPIC, "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert sum(q["maxOffset"] for q in json.loads(out.stdout)["queues"]) >= 20
    # HAC_TLS_ENABLED=false turns the environment's files off, flags still win
    out = hactl(cluster, "groups", env={**env, "HAC_TLS_ENABLED": "false"})
    assert "speaks TLS" in one_line_error(out)
    out = hactl(cluster, "groups", *flags, env={"HAC_TLS_ENABLED": "false"})
    assert out.returncode == 0, out.stderr


def test_plaintext_hactl_is_told_to_pass_tls_flags(cluster: Cluster, tls: TlsFiles) -> None:
    line = one_line_error(hactl(cluster, "groups"))
    assert "TlsMismatch" in line and f"{cluster.namesrv} speaks TLS" in line
    assert "--tls-ca" in line
    # a CA but no client certificate under mutual TLS: named too, not a bare reset
    line = one_line_error(hactl(cluster, "groups", "--tls-ca", str(tls.ca)))
    assert "client certificate" in line and "--tls-cert" in line
    # a certificate that does not name the host dialled (127.0.0.1 is named, localhost
    # is not): the fix is named; --no-tls-verify-hostname gets through
    host_port = cluster.namesrv.replace("127.0.0.1", "localhost")
    args = ["groups", "--namesrv", host_port, *tls.hactl_args()]
    out = subprocess.run(
        hactl_argv(*args), capture_output=True, text=True, timeout=30, env=_base_env(None)
    )
    line = one_line_error(out)
    assert "TlsError" in line and "verify_hostname" in line, line
    out = subprocess.run(
        hactl_argv(*args, "--no-tls-verify-hostname"),
        capture_output=True,
        text=True,
        timeout=30,
        env=_base_env(None),
    )
    assert out.returncode == 0, out.stderr
    # bad settings are configuration errors (exit 2), named
    out = hactl(cluster, "groups", "--tls-cert", str(tls.client_cert))
    assert out.returncode == 2 and "--tls-key" in out.stderr, out.stderr
    out = hactl(cluster, "groups", "--tls-ca", str(tls.ca.with_name("nope.pem")))
    assert out.returncode == 2 and "no such file" in out.stderr, out.stderr


async def test_plaintext_sdk_client_gets_a_typed_hint(cluster: Cluster) -> None:
    async with NameserverClient([cluster.namesrv]) as ns:
        with pytest.raises(NameserverUnavailable) as caught:
            await ns.groups()
    assert isinstance(caught.value.__cause__, TlsMismatch)
    assert "speaks TLS" in str(caught.value)


# --- the gRPC gateway ----------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(cluster: Cluster, tls: TlsFiles) -> Iterator[ProcessHandle]:
    ready = cluster.workdir / "proxy.ready.json"
    handle = ProcessHandle(
        name="proxy",
        argv=hactl_argv(
            "proxy",
            "--namesrv",
            cluster.namesrv,
            "--listen",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--ready-file",
            str(ready),
        ),
        env=_base_env(tls.service_env()),
        workdir=cluster.workdir,
        ready_file=ready,
        log_path=cluster.workdir / "proxy.log",
    )
    handle.start()
    try:
        yield handle
    finally:
        handle.stop()


async def test_gateway_serves_grpc_over_tls(
    gateway: ProcessHandle, cluster: Cluster, tls: TlsFiles
) -> None:
    """A gRPC client with the CA and a client certificate routes and sends through the
    gateway, which reaches the nameserver and the brokers with TLS itself."""
    import grpc

    from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
    from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s
    from ha_controller.proto.rocketmq.v2 import service_pb2_grpc

    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.ca.read_bytes(),
        private_key=tls.client_key.read_bytes(),
        certificate_chain=tls.client_cert.read_bytes(),
    )
    async with grpc.aio.secure_channel(gateway.rpc, credentials) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        meta = (("x-mq-client-id", "tls-test-client"),)
        route = await stub.QueryRoute(
            v2s.QueryRouteRequest(topic=v2.Resource(name=TOPIC)), metadata=meta, timeout=10
        )
        assert route.status.code == v2.OK, route.status
        assert {q.broker.name for q in route.message_queues} == set(GROUPS)
        sent = await stub.SendMessage(
            v2s.SendMessageRequest(
                messages=[
                    v2.Message(
                        topic=v2.Resource(name=TOPIC),
                        body=b"through the gateway",
                        system_properties=v2.SystemProperties(
                            message_id="tls-gw-0001", message_type=v2.NORMAL
                        ),
                    )
                ]
            ),
            metadata=meta,
            timeout=10,
        )
        assert sent.status.code == v2.OK, sent.status
    # a client that does not trust the gateway's CA fails the handshake
    async with grpc.aio.secure_channel(gateway.rpc, grpc.ssl_channel_credentials()) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name=TOPIC)), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    status, _ = await asyncio.to_thread(http_get, gateway.http, "/readyz", tls=tls)
    assert status == 200


# --- failover ------------------------------------------------------------------------


async def test_failover_under_mutual_tls(cluster: Cluster, tls: TlsFiles) -> None:
    """kill -9 of tls-a's master: every send goes on through tls-b at once, the acting
    slave serves tls-a's messages, and the master comes back through pre-online."""
    ctx = tls.client_context()
    async with (
        NameserverClient([cluster.namesrv], tls=ctx) as ns,
        Producer(cluster.namesrv, group="tls-fo", tls=ctx, topics=[TOPIC]) as producer,
        PullConsumer(cluster.namesrv, "tls-fo-pull", tls=ctx) as pull,
    ):
        before = [await producer.send(Message(TOPIC, f"b{i}".encode())) for i in range(20)]
        assert {r.broker_name for r in before} == set(GROUPS)
        master = cluster.broker("tls-a", 0)
        master.kill()
        t_kill = time.monotonic()
        during = [await producer.send(Message(TOPIC, f"d{i}".encode())) for i in range(30)]
        assert {r.broker_name for r in during} == {"tls-b"}

        async def acting() -> bool:
            group = {g.broker_name: g for g in await ns.groups()}["tls-a"]
            return not group.master_online and group.acting_broker_id is not None

        await eventually(acting, timeout=10)
        assert time.monotonic() - t_kill < 10
        # tls-a's messages are read from the acting slave, over TLS
        a_queues = [q for q in await pull.queues(TOPIC) if q.broker_name == "tls-a"]
        stored = 0
        for mq in a_queues:
            stored += await pull.max_offset(mq)
        assert stored >= sum(1 for r in before if r.broker_name == "tls-a")

        # the master returns through pre-online (it syncs from the acting slave: TLS)
        await asyncio.to_thread(cluster.restart, "tls-a", 0)
        await eventually(lambda: asyncio.to_thread(_ready, cluster, tls), timeout=60)

        async def master_back() -> bool:
            return {g.broker_name: g for g in await ns.groups()}["tls-a"].master_online

        await eventually(master_back, timeout=30)
        after = [await producer.send(Message(TOPIC, f"a{i}".encode())) for i in range(20)]
        assert {r.broker_name for r in after} == set(GROUPS)
