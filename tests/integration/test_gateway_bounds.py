"""The gRPC gateway's per-call bounds in the production profile, over real processes.

A nameserver and a broker with a cluster secret, mutual TLS and the client ACL
(anonymous access off), and ``hactl proxy`` in front of them with small bounds.  A raw
gRPC client (our own v2 stubs; it presents the test client certificate and signs its
calls as an ACL user, as the SDKs do) checks that:

- a SendMessage with too many messages is answered ``PAYLOAD_TOO_LARGE`` and one larger
  than ``max_request_bytes`` ends ``RESOURCE_EXHAUSTED``, and neither stores anything;
- malformed requests of every call shape end ``INVALID_ARGUMENT``, are counted, and
  leave one log line, not a traceback each;
- thousands of concurrent ReceiveMessage calls each end with a status (a v2 status in
  the stream, or ``RESOURCE_EXHAUSTED`` naming the limit), none ``CANCELLED``.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from hashlib import sha1
from typing import Any

import pytest

from ha_controller.testing import (
    Cluster,
    ProcessHandle,
    TlsFiles,
    _base_env,
    eventually_sync,
    hactl_argv,
    http_get,
    make_tls_files,
    openssl_missing,
    run_cluster,
)

grpc = pytest.importorskip("grpc")

from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2  # noqa: E402
from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s  # noqa: E402
from ha_controller.proto.rocketmq.v2 import service_pb2_grpc  # noqa: E402

pytestmark = [
    pytest.mark.skipif(openssl_missing() is not None, reason=str(openssl_missing())),
    pytest.mark.timeout(120),
]

SECRET = "bounds-test cluster secret"
GROUP = "gb"
TOPIC = "BoundsT"
CONSUMERS = "bounds-consumers"
ADMIN = ("admin", "admin-secret-key")
APP = ("app", "app-secret-key-1")
ACL_FILE = f"""
[[users]]
access_key = "{ADMIN[0]}"
secret_key = "{ADMIN[1]}"
admin = true

[[users]]
access_key = "{APP[0]}"
secret_key = "{APP[1]}"
topic_perms = ["{TOPIC}=PUB|SUB"]
group_perms = ["{CONSUMERS}=SUB"]
"""
MAX_MESSAGES = 8
MAX_REQUEST_BYTES = 4 * 1024 * 1024 + 64 * 1024  # the smallest allowed
MAX_RECEIVES = 60
MAX_RECEIVES_PER_CLIENT = 25
SERVICE = "/apache.rocketmq.v2.MessagingService/"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"), hosts=("127.0.0.1",))


@pytest.fixture(scope="module")
def gateway(tls: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessHandle]:
    tmp = tmp_path_factory.mktemp("bounds")
    acl = tmp / "acl.toml"
    acl.write_text(ACL_FILE)
    acl.chmod(0o600)
    secured = {
        "HAC_CLUSTER_SECRET": SECRET,
        "HAC_ACL_ENABLED": "true",
        "HAC_ACL_ALLOW_ANONYMOUS": "false",
        "HAC_ACL_FILE": str(acl),
    }
    cluster: Cluster = run_cluster((GROUP,), 1, workdir=tmp / "cluster", env=secured, tls=tls)
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
        env=_base_env(
            {
                **tls.service_env(),
                **secured,
                "HAC_MAX_MESSAGES_PER_SEND": str(MAX_MESSAGES),
                "HAC_MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES),
                "HAC_MAX_CONCURRENT_RECEIVES": str(MAX_RECEIVES),
                "HAC_MAX_CONCURRENT_RECEIVES_PER_CLIENT": str(MAX_RECEIVES_PER_CLIENT),
            }
        ),
        workdir=cluster.workdir,
        ready_file=ready,
        log_path=cluster.workdir / "proxy.log",
    )

    def broker_ready() -> bool:
        try:
            return all(
                http_get(h.http, "/readyz", tls=tls)[0] == 200 for h in cluster.brokers.values()
            )
        except OSError:
            return False

    try:
        eventually_sync(broker_ready, timeout=60, interval=0.2)
        created = subprocess.run(
            hactl_argv("topic", "create", TOPIC, "--namesrv", cluster.namesrv, "--queues", "1"),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env=_base_env(
                {**tls.client_env(), "HAC_ACCESS_KEY": ADMIN[0], "HAC_SECRET_KEY": ADMIN[1]}
            ),
        )
        assert created.returncode == 0, created.stderr[-2000:]
        handle.start()
        yield handle
    finally:
        handle.stop()
        cluster.stop()


def signed(client: str) -> tuple[tuple[str, str], ...]:
    """The metadata an SDK built with ``Credentials(*APP)`` sends (MQv2-HMAC-SHA1 over
    ``x-mq-date-time``)."""
    date_time = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    signature = hmac.new(APP[1].encode(), date_time.encode(), sha1).hexdigest()
    return (
        ("x-mq-client-id", client),
        ("x-mq-date-time", date_time),
        (
            "authorization",
            f"MQv2-HMAC-SHA1 Credential={APP[0]}, SignedHeaders=x-mq-date-time, "
            f"Signature={signature}",
        ),
    )


def channel(gateway: ProcessHandle, tls: TlsFiles) -> Any:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.ca.read_bytes(),
        private_key=tls.client_key.read_bytes(),
        certificate_chain=tls.client_cert.read_bytes(),
    )
    return grpc.aio.secure_channel(gateway.rpc, credentials)


def message(i: int, body: bytes = b"m") -> v2.Message:
    return v2.Message(
        topic=v2.Resource(name=TOPIC),
        body=body,
        system_properties=v2.SystemProperties(message_id=f"bounds-{i:06d}", message_type=v2.NORMAL),
    )


def refused(gateway: ProcessHandle, tls: TlsFiles) -> dict[str, float]:
    """``hac_proxy_refused_total`` by reason."""
    status, body = http_get(gateway.http, "/metrics", tls=tls)
    assert status == 200
    out: dict[str, float] = collections.defaultdict(float)
    for line in body.decode().splitlines():
        if line.startswith("hac_proxy_refused_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] += float(line.rsplit(" ", 1)[1])
    return out


async def test_oversized_sends_are_refused_and_store_nothing(
    gateway: ProcessHandle, tls: TlsFiles
) -> None:
    async with channel(gateway, tls) as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)
        meta = signed("bounds-sender")
        # one message too many: the v2 status RocketMQ gives a request over its limits
        too_many = v2s.SendMessageRequest(messages=[message(i) for i in range(MAX_MESSAGES + 1)])
        resp = await stub.SendMessage(too_many, metadata=meta, timeout=30)
        assert resp.status.code == v2.PAYLOAD_TOO_LARGE, resp.status
        assert "max_messages_per_send" in resp.status.message, resp.status
        assert not resp.entries
        # a request larger than max_request_bytes (two bodies that are each allowed)
        body = b"x" * (MAX_REQUEST_BYTES // 2 + 1024)
        too_big = v2s.SendMessageRequest(messages=[message(100, body), message(101, body)])
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SendMessage(too_big, metadata=meta, timeout=30)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value
        # nothing was stored: the topic's only queue is still empty
        ok = await stub.SendMessage(
            v2s.SendMessageRequest(messages=[message(200)]), metadata=meta, timeout=30
        )
        assert ok.status.code == v2.OK, ok.status
        assert ok.entries[0].offset == 0, "a refused SendMessage stored messages"
    assert refused(gateway, tls)["max_messages_per_send"] == 1


async def _requests(payload: bytes) -> AsyncIterator[bytes]:
    yield payload


async def test_malformed_calls_end_invalid_argument_without_a_traceback_each(
    gateway: ProcessHandle, tls: TlsFiles
) -> None:
    garbage = b"\xff\xff\xff\xff\x0f not a protobuf message"
    before = refused(gateway, tls)["malformed"]
    lines_before = len(gateway.log_path.read_text(errors="replace").splitlines())
    codes: collections.Counter[str] = collections.Counter()
    async with channel(gateway, tls) as ch:
        calls = [
            ch.unary_unary(SERVICE + "QueryRoute"),
            ch.unary_unary(SERVICE + "SendMessage"),
            ch.unary_stream(SERVICE + "ReceiveMessage"),
            ch.stream_stream(SERVICE + "Telemetry"),
        ]
        for i in range(40):
            call = calls[i % len(calls)]
            meta = signed(f"bounds-garbage-{i % 3}")
            try:
                if isinstance(call, grpc.aio.UnaryUnaryMultiCallable):
                    await call(garbage, metadata=meta, timeout=10)
                elif isinstance(call, grpc.aio.UnaryStreamMultiCallable):
                    async for _ in call(garbage, metadata=meta, timeout=10):
                        pass
                else:
                    async for _ in call(_requests(garbage), metadata=meta, timeout=10):
                        pass
                codes["OK"] += 1
            except grpc.aio.AioRpcError as exc:
                codes[exc.code().name] += 1
                assert "not a valid protobuf message" in (exc.details() or ""), exc
    assert codes == {"INVALID_ARGUMENT": 40}, codes
    assert refused(gateway, tls)["malformed"] - before == 40
    new = gateway.log_path.read_text(errors="replace").splitlines()[lines_before:]
    assert not [x for x in new if "Traceback" in x], "\n".join(new[:40])
    malformed = [x for x in new if "malformed" in x]
    assert len(malformed) == 1, "\n".join(new[:40])  # one line per kind per interval
    assert len(new) < 10, "\n".join(new[:40])


async def test_many_concurrent_receives_each_end_with_a_status(
    gateway: ProcessHandle, tls: TlsFiles
) -> None:
    streams = 2500
    before = refused(gateway, tls)
    request = v2s.ReceiveMessageRequest(
        group=v2.Resource(name=CONSUMERS),
        message_queue=v2.MessageQueue(
            topic=v2.Resource(name=TOPIC), broker=v2.Broker(name=GROUP), id=-1
        ),
        batch_size=1,
    )
    request.long_polling_timeout.FromMilliseconds(1000)
    request.invisible_duration.FromSeconds(10)

    async with channel(gateway, tls) as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)

        async def receive(i: int) -> str:
            statuses = []
            try:
                async for r in stub.ReceiveMessage(
                    request, metadata=signed(f"bounds-recv-{i % 20}"), timeout=60
                ):
                    if r.WhichOneof("content") == "status":
                        statuses.append(v2.Code.Name(r.status.code))
            except grpc.aio.AioRpcError as exc:
                details = exc.details() or ""
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    return f"RESOURCE_EXHAUSTED {details.split(' ', 1)[0]}"
                return f"{exc.code().name} {details[:80]}"
            return f"v2 {statuses}"

        started = time.monotonic()
        results = collections.Counter(await asyncio.gather(*(receive(i) for i in range(streams))))
        elapsed = time.monotonic() - started
    ended = {r: n for r, n in results.items() if r.startswith("v2 ")}
    limited = {r: n for r, n in results.items() if r.startswith("RESOURCE_EXHAUSTED ")}
    others = {r: n for r, n in results.items() if r not in ended and r not in limited}
    assert not others, (others, results.most_common(6))
    assert set(ended) <= {"v2 ['MESSAGE_NOT_FOUND']", "v2 ['OK']"}, results
    assert set(limited) <= {
        "RESOURCE_EXHAUSTED max_concurrent_receives",
        "RESOURCE_EXHAUSTED max_concurrent_receives_per_client",
    }, results
    assert ended and limited, results
    after = refused(gateway, tls)
    counted = sum(
        after[k] - before[k]
        for k in ("max_concurrent_receives", "max_concurrent_receives_per_client")
    )
    assert counted == sum(limited.values())
    assert elapsed < 60

    def calls_in_progress() -> bool:  # every slot came back
        _, body = http_get(gateway.http, "/metrics", tls=tls)
        return "\nhac_proxy_calls 0.0\n" in body.decode()

    eventually_sync(calls_in_progress, timeout=10)
