"""End to end with every protection on: mutual TLS between every process, a cluster
secret, the client ACL with anonymous access off, and the gRPC gateway.

Two groups (master + slave each).  While ``hactl produce`` (credentials from flags
and the environment) and the official RocketMQ 5 Python SDK through ``hactl proxy``
(``Credentials(access_key, secret_key)``, TLS) send, one group's master is killed
with SIGKILL; afterwards every acknowledged message is consumed (``hactl consume`` and
the SDK's push consumer, both as the ACL user), and anonymous clients of both kinds
are refused.

The SDK runs in a child process (this file run as a script), as in
``test_grpc_proxy.py``: its generated ``apache.rocketmq.v2`` modules must never meet
ours in one process.  The SDK cannot present a client certificate, so the gateway's
gRPC listener uses server TLS and the SDKs authenticate with their credentials; the
gateway itself dials the cluster with mutual TLS.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve()
SDK_MISSING = importlib.util.find_spec("rocketmq") is None

SECRET = "e2e cluster secret"
GROUPS = ("sec-a", "sec-b")
TOPIC_CLI = "SecCli"
TOPIC_SDK = "SecSdk"
ADMIN = ("admin", "admin-secret-key")
APP = ("app", "app-secret-key-1")
CLI_GROUP = "owners"
SDK_GROUP = "sdk-owners"
SDK_COUNT = 150

ACL_FILE = f"""
[[users]]
access_key = "{ADMIN[0]}"
secret_key = "{ADMIN[1]}"
admin = true

[[users]]
access_key = "{APP[0]}"
secret_key = "{APP[1]}"
topic_perms = ["{TOPIC_CLI}=PUB|SUB", "{TOPIC_SDK}=PUB|SUB"]
group_perms = ["{CLI_GROUP}=SUB", "{SDK_GROUP}=SUB"]
"""


# --------------------------------------------------------------------------------------
# the child process: rocketmq-python-client only
# --------------------------------------------------------------------------------------


def scenario_sdk(proxy: str, access_key: str, secret_key: str, start_at: float) -> dict[str, Any]:
    import logging

    import rocketmq as rmq

    logging.getLogger("rocketmq").setLevel(logging.CRITICAL)
    out: dict[str, Any] = {}
    # anonymous: refused by the gateway
    anon = rmq.Producer(
        rmq.ClientConfiguration(proxy, rmq.Credentials(), request_timeout=5),
        (TOPIC_SDK,),
        tls_enable=True,
    )
    try:
        anon.startup()
        m = rmq.Message()
        m.topic, m.body = TOPIC_SDK, b"anonymous"
        anon.send(m)
        out["anonymous"] = "sent"
    except Exception as exc:  # the SDK's exceptions
        out["anonymous"] = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            anon.shutdown()
        except Exception:
            pass
    cfg = rmq.ClientConfiguration(proxy, rmq.Credentials(access_key, secret_key))
    received: set[str] = set()
    lock = threading.Lock()

    class Listener(rmq.MessageListener):  # type: ignore[misc]
        def consume(self, message: Any) -> Any:
            with lock:
                received.add(message.body.decode())
            return rmq.ConsumeResult.SUCCESS

    consumer = rmq.PushConsumer(
        cfg, SDK_GROUP, Listener(), {TOPIC_SDK: rmq.FilterExpression("*")}, tls_enable=True
    )
    consumer.startup()
    producer = rmq.Producer(cfg, (TOPIC_SDK,), tls_enable=True)
    producer.startup()
    acked: list[str] = []
    failed: list[str] = []
    time.sleep(max(0.0, start_at - time.time()))
    try:
        for i in range(SDK_COUNT):
            body = f"sdk-{i}"
            m = rmq.Message()
            m.topic, m.body = TOPIC_SDK, body.encode()
            try:
                producer.send(m)
                acked.append(body)
                out.setdefault("first_ack", time.time())
                out["last_ack"] = time.time()
            except Exception as exc:  # report, keep going
                failed.append(f"{body}: {type(exc).__name__}: {exc}")
            time.sleep(0.02)
        deadline = time.time() + 40
        while time.time() < deadline:
            with lock:
                if set(acked) <= received:
                    break
            time.sleep(0.2)
    finally:
        producer.shutdown()
        consumer.shutdown()
    with lock:
        out["missing"] = sorted(set(acked) - received)
    out["acked"] = len(acked)
    out["failed"] = failed
    return out


def _child_main() -> None:
    args = json.loads(sys.argv[1])
    print("RESULT " + json.dumps(scenario_sdk(**args)), flush=True)
    os._exit(0)  # the SDK's non-daemon threads must not keep the child alive


if __name__ == "__main__":
    _child_main()


# --------------------------------------------------------------------------------------
# the test
# --------------------------------------------------------------------------------------

pytestmark = [
    pytest.mark.skipif(SDK_MISSING, reason="rocketmq-python-client is not installed"),
    pytest.mark.timeout(180),
]


@pytest.fixture
def secure_cluster(tmp_path: Path) -> Iterator[tuple[Any, Any, Any, dict[str, str]]]:
    from ha_controller.testing import (
        ProcessHandle,
        _base_env,
        eventually_sync,
        hactl_argv,
        http_get,
        make_tls_files,
        openssl_missing,
        run_cluster,
    )

    if openssl_missing() is not None:
        pytest.skip(str(openssl_missing()))
    tls = make_tls_files(tmp_path / "tls", hosts=("127.0.0.1",))
    acl = tmp_path / "acl.toml"
    acl.write_text(ACL_FILE)
    acl.chmod(0o600)
    secured = {
        "HAC_CLUSTER_SECRET": SECRET,
        "HAC_ACL_ENABLED": "true",
        "HAC_ACL_ALLOW_ANONYMOUS": "false",
        "HAC_ACL_FILE": str(acl),
    }
    cluster = run_cluster(GROUPS, 2, workdir=tmp_path / "cluster", env=secured, tls=tls)
    ready = cluster.workdir / "proxy.ready.json"
    gateway = ProcessHandle(
        name="proxy",
        argv=hactl_argv(
            "proxy",
            "--namesrv",
            cluster.namesrv,
            "--listen",
            "127.0.0.1:0",
            "--ready-file",
            str(ready),
            "--long-polling-timeout-s",
            "5",
        ),
        # the SDK has no client certificate: server TLS on the gRPC side only
        env=_base_env({**tls.service_env(), "HAC_TLS_REQUIRE_CLIENT_CERT": "false", **secured}),
        workdir=cluster.workdir,
        ready_file=ready,
        log_path=cluster.workdir / "proxy.log",
    )
    tool_env = {**tls.client_env()}

    def brokers_ready() -> bool:
        try:
            return all(
                http_get(h.http, "/readyz", tls=tls)[0] == 200 for h in cluster.brokers.values()
            )
        except OSError:
            return False

    try:
        eventually_sync(brokers_ready, timeout=60, interval=0.2)
        gateway.start()
        for topic in (TOPIC_CLI, TOPIC_SDK):
            done = subprocess.run(
                hactl_argv("topic", "create", topic, "--namesrv", cluster.namesrv, "--queues", "4"),
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
                env=_base_env({**tool_env, "HAC_ACCESS_KEY": ADMIN[0], "HAC_SECRET_KEY": ADMIN[1]}),
            )
            assert done.returncode == 0, done.stderr[-2000:]
        yield cluster, gateway, tls, tool_env
    finally:
        gateway.stop()
        cluster.stop()


def _hactl(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.Popen[str]:
    from ha_controller.testing import _base_env

    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_base_env(env)
    )


def _keys(stdout: str) -> list[str]:
    return [
        json.loads(line)["key"]
        for line in stdout.splitlines()
        if line.startswith("{") and '"key"' in line
    ]


def test_failover_with_mtls_secret_and_acl(
    secure_cluster: tuple[Any, Any, Any, dict[str, str]],
) -> None:
    from ha_controller.testing import hactl_argv

    cluster, gateway, tls, tool_env = secure_cluster
    ns = cluster.namesrv
    started = time.monotonic()

    # anonymous hactl: refused, with the reason
    anon = subprocess.run(
        hactl_argv("produce", "--namesrv", ns, "--topic", TOPIC_CLI, "--count", "1"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("HAC_")} | tool_env,
    )
    assert anon.returncode != 0
    assert "anonymous" in anon.stdout + anon.stderr, anon.stderr[-2000:]

    # the workloads: the SDK through the gateway, and hactl (access key by flag,
    # secret from the environment); one master is killed -9 while both send
    sdk_env = {k: v for k, v in os.environ.items() if not k.startswith("HAC_")} | {
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(tls.ca)
    }
    start_at = time.time() + 8  # the SDK's clients need a few seconds to start
    sdk = subprocess.Popen(
        [
            sys.executable,
            str(HERE),
            json.dumps(
                {
                    "proxy": gateway.rpc,
                    "access_key": APP[0],
                    "secret_key": APP[1],
                    "start_at": start_at,
                }
            ),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=sdk_env,
    )
    time.sleep(max(0.0, start_at - time.time() - 1.0))
    produce = _hactl(
        hactl_argv(
            "produce",
            "--namesrv",
            ns,
            "--topic",
            TOPIC_CLI,
            "--count",
            "200",
            "--rate",
            "40",
            "--json",
            "--no-progress",
            "--access-key",
            APP[0],
        ),
        {**tool_env, "HAC_SECRET_KEY": APP[1]},
        timeout=90,
    )
    time.sleep(max(0.0, start_at - time.time()) + 1.5)
    master = cluster.broker(GROUPS[0], 0)
    master.kill()
    killed_at = time.time()

    out, err = produce.communicate(timeout=90)
    assert produce.returncode is not None
    acked = _keys(out)
    summary = json.loads(out.strip().splitlines()[-1])["summary"]
    assert summary["acknowledged"] == len(acked) and len(acked) >= 150, (summary, err[-2000:])
    by_broker = [json.loads(x)["broker"] for x in out.splitlines() if '"key"' in x]
    assert GROUPS[0] in by_broker[:40], "the killed group took no sends before the kill"
    assert set(by_broker[-40:]) == {GROUPS[1]}, "sends did not move to the live group"

    sdk_out, sdk_err = sdk.communicate(timeout=120)
    results = [
        json.loads(x[len("RESULT ") :]) for x in sdk_out.splitlines() if x.startswith("RESULT ")
    ]
    assert results, sdk_out[-2000:] + sdk_err[-3000:]
    result = results[0]
    assert result["anonymous"] != "sent", result["anonymous"]
    # the SDK hides the gateway's answer; the gateway's log says why
    assert "does not allow anonymous access" in gateway.log_path.read_text()
    assert result["acked"] >= SDK_COUNT - 10, result["failed"][:5]
    assert result["first_ack"] < killed_at < result["last_ack"], "the kill was not mid-stream"
    assert result["missing"] == [], f"{len(result['missing'])} acknowledged SDK messages lost"

    # every message hactl got acknowledged is consumed (from the acting slave too)
    received: set[str] = set()
    for _ in range(3):
        want = len(set(acked) - received)
        if not want:
            break
        consume = _hactl(
            hactl_argv(
                "consume",
                "--namesrv",
                ns,
                "--topic",
                TOPIC_CLI,
                "--group",
                CLI_GROUP,
                "--count",
                str(want),
                "--timeout",
                "30",
                "--json",
                "--no-progress",
            ),
            {**tool_env, "HAC_ACCESS_KEY": APP[0], "HAC_SECRET_KEY": APP[1]},
            timeout=60,
        )
        c_out, _ = consume.communicate(timeout=60)
        received |= set(_keys(c_out))
    missing = sorted(set(acked) - received)
    assert not missing, f"{len(missing)} acknowledged messages never consumed: {missing[:5]}"
    assert time.monotonic() - started < 150
