"""TLS (mutual) on the RPC layer, and the operator CLI against a live nameserver."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from ha_controller.protocol.errors import (
    BrokerUnavailable,
    ConnectionClosed,
    TlsClosedEarly,
    TlsMismatch,
    UnknownMethod,
)
from ha_controller.rpc import Dispatcher, RpcServer, connect
from ha_controller.rpc.tls import client_context, server_context
from ha_controller.testing import ProcessHandle, hactl_argv, make_tls_files
from ha_controller.testing.simbroker import SimulatedBroker


def make_ca_and_cert(d: Path, name: str) -> tuple[Path, Path, Path]:
    """A throwaway CA and a certificate for 127.0.0.1 signed by it (openssl CLI)."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    if not (d / "ca.pem").exists():
        run(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=hac-test-ca",
        )
    (d / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={name}",
    )
    run(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        f"{name}.pem",
        "-extfile",
        f"{name}.ext",
    )
    return d / "ca.pem", d / f"{name}.pem", d / f"{name}.key"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not installed")
async def test_mutual_tls_rpc(tmp_path: Path) -> None:
    ca, cert, key = make_ca_and_cert(tmp_path, "server")
    _, ccert, ckey = make_ca_and_cert(tmp_path, "client")
    server = RpcServer(
        Dispatcher(),
        ssl_context=server_context(str(cert), str(key), str(ca), require_client_cert=True),
    )
    host, port = await server.start("127.0.0.1", 0)
    addr = f"{host}:{port}"
    try:
        good = client_context(str(ca), str(ccert), str(ckey))
        async with await connect(addr, ssl_context=good) as conn:
            with pytest.raises(UnknownMethod):  # a full round trip over mutual TLS
                await conn.call(12345, b"", 2000)
        # no client certificate: the handshake (or the first call) fails
        anonymous = client_context(str(ca))
        with pytest.raises((BrokerUnavailable, ConnectionClosed, ssl.SSLError)):
            conn = await connect(addr, ssl_context=anonymous)
            try:
                await conn.call(12345, b"", 2000)
            finally:
                await conn.aclose()
        # plain TCP to a TLS port: the server drops it, the client sees a closed connection
        with pytest.raises((ConnectionClosed, BrokerUnavailable)):
            conn = await connect(addr)
            try:
                await conn.call(12345, b"", 2000)
            finally:
                await conn.aclose()
    finally:
        await server.aclose()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not installed")
async def test_a_tls_mismatch_is_named_both_ways(tmp_path: Path) -> None:
    """Plaintext to a TLS listener and TLS to a plaintext one fail with TlsMismatch
    (one line saying what to pass), not with a bare closed connection; a missing client
    certificate under mutual TLS is named too.  The listeners count what they refused."""
    files = make_tls_files(tmp_path)
    tls_server = RpcServer(
        Dispatcher(),
        ssl_context=server_context(str(files.cert), str(files.key), str(files.ca), True),
    )
    plain_server = RpcServer(Dispatcher())
    await tls_server.start("127.0.0.1", 0)
    await plain_server.start("127.0.0.1", 0)
    tls_addr, plain_addr = tls_server.bound, plain_server.bound

    async def call(addr: str, ctx: ssl.SSLContext | None) -> None:
        conn = await connect(addr, ssl_context=ctx)
        try:
            await conn.call(12345, b"", 2000)
        finally:
            await conn.aclose()

    try:
        with pytest.raises(TlsMismatch, match=f"{tls_addr} speaks TLS.*--tls-ca"):
            await call(tls_addr, None)
        with pytest.raises(TlsMismatch, match=f"{plain_addr} does not speak TLS"):
            await call(plain_addr, files.client_context())
        with pytest.raises(TlsClosedEarly, match="client certificate"):
            await call(tls_addr, client_context(str(files.ca)))
        with pytest.raises(UnknownMethod):
            await call(tls_addr, files.client_context())
        assert tls_server.stats.refused["tls_required"] == 1
        assert tls_server.stats.refused["tls_handshake"] == 1
    finally:
        await tls_server.aclose()
        await plain_server.aclose()


def test_hactl_with_tls_to_a_plaintext_nameserver(
    nameserver: ProcessHandle, tmp_path: Path
) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    files = make_tls_files(tmp_path)
    out = subprocess.run(
        hactl_argv("groups", "--namesrv", nameserver.rpc, "--tls-ca", str(files.ca)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"TlsMismatch: the server at {nameserver.rpc} does not speak TLS" in out.stderr


async def test_hactl_groups_and_route(nameserver: ProcessHandle) -> None:
    broker = SimulatedBroker(
        nameserver.rpc,
        "c1",
        "cli-group",
        0,
        topics={"CliTopic": SimulatedBroker.topic("CliTopic", 4)},
    )
    await broker.start()
    await broker.register()
    try:

        def hactl(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                hactl_argv(*args, "--namesrv", nameserver.rpc),
                capture_output=True,
                text=True,
                timeout=30,
            )

        out = await asyncio.to_thread(hactl, "groups", "--json")
        assert out.returncode == 0, out.stderr
        (group,) = json.loads(out.stdout)
        assert group["brokerName"] == "cli-group" and group["masterOnline"] is True
        assert group["members"] == {"0": broker.addr}
        out = await asyncio.to_thread(hactl, "route", "CliTopic", "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["queues"][0]["perm"] == 6
        table = await asyncio.to_thread(hactl, "route", "CliTopic")
        assert "cli-group" in table.stdout and "RW-" in table.stdout
        missing = await asyncio.to_thread(hactl, "route", "NoSuchTopic")
        assert missing.returncode == 1 and "TopicNotFound" in missing.stderr
    finally:
        await broker.aclose()


def test_bad_config_is_one_error_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "ns.toml"
    cfg.write_text("scan_not_active_broker_intervall_ms = 1000\n")
    out = subprocess.run(
        hactl_argv("nameserver", "--config", str(cfg)), capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2
    assert "scan_not_active_broker_intervall_ms" in out.stderr
    assert "scan_not_active_broker_interval_ms" in out.stderr  # the suggestion
    assert "Traceback" not in out.stderr
    out = subprocess.run(
        hactl_argv("broker", "--broker-name", "b", "--broker-id", "-1", "--namesrv", "x:1"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "broker_id" in out.stderr and "Traceback" not in out.stderr
