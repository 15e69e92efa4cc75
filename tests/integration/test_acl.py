"""The client ACL, the admin token and validation over real processes and loopback TCP.

One cluster (a nameserver and a master) with a cluster secret, the client ACL on and
anonymous access off, and an admin token: a stranger (a valid user without the
group's permission, or nobody) cannot reset a group's offsets or take its queue
locks, and nothing changes; an anonymous or wrongly signed request is refused with
``AccessDenied`` and counted; ``hactl`` authenticates with ``--access-key`` or
``HAC_ACCESS_KEY``; the admin HTTP API needs the token except for the probes and the
metrics; bad group names and oversized messages are refused before anything changes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf.message import Message as PbMessage

from ha_controller.acl import Credentials
from ha_controller.auth import ClusterAuth
from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message
from ha_controller.client.producer import Producer
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.envelope import RequestAuth
from ha_controller.protocol.errors import (
    AccessDenied,
    BadRequest,
    HaError,
    MessageTooLarge,
    Unauthorized,
)
from ha_controller.rpc import connect
from ha_controller.testing import (
    Cluster,
    _base_env,
    eventually,
    hactl_argv,
    http_get,
    run_cluster,
)

SECRET = "acl-test cluster secret"
TOKEN = "admin-token-for-tests"
GROUP = "g1"
TOPIC = "AclT"
OWNERS = "owners"

ADMIN = Credentials("admin", "admin-secret-key")
APP = Credentials("app", "app-secret-key-1")
STRANGER = Credentials("stranger", "stranger-secret-key")

ACL_FILE = f"""
[[users]]
access_key = "{ADMIN.access_key}"
secret_key = "{ADMIN.secret_key}"
admin = true

[[users]]
access_key = "{APP.access_key}"
secret_key = "{APP.secret_key}"
topic_perms = ["{TOPIC}=PUB|SUB"]
group_perms = ["{OWNERS}=SUB"]

[[users]]
access_key = "{STRANGER.access_key}"
secret_key = "{STRANGER.secret_key}"
# may read every topic, but no group of its own
default_topic_perm = "SUB"
"""


def acl_env(tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "acl.toml"
    path.write_text(ACL_FILE)
    path.chmod(0o600)
    return {
        "HAC_CLUSTER_SECRET": SECRET,
        "HAC_ACL_ENABLED": "true",
        "HAC_ACL_ALLOW_ANONYMOUS": "false",
        "HAC_ACL_FILE": str(path),
        "HAC_ADMIN_TOKEN": TOKEN,
    }


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("acl")
    cluster = run_cluster((GROUP,), 1, workdir=tmp, env=acl_env(tmp))
    try:
        asyncio.run(_settle(cluster))
        yield cluster
    finally:
        cluster.stop()


async def _settle(cluster: Cluster) -> None:
    master = cluster.broker(GROUP, 0)
    async with NameserverClient([cluster.namesrv], credentials=ADMIN) as ns:

        async def online() -> bool:
            group = await ns.member_group("DefaultCluster", GROUP)
            return group.broker_addrs.get(0) == master.rpc

        await eventually(online, timeout=30)
        await ns.create_topic(TOPIC, queues=2)


async def call(
    addr: str,
    method: int,
    request: PbMessage,
    creds: Credentials | None,
    response: type[PbMessage] = common_pb2.Empty,
) -> PbMessage:
    conn = await connect(addr)
    conn.signer = creds.sign if creds is not None else None
    try:
        return await conn.call_pb(method, request, response, timeout_ms=3000)
    finally:
        await conn.aclose()


async def refusal(
    addr: str,
    method: int,
    request: PbMessage,
    creds: Credentials | None,
    response: type[PbMessage] = common_pb2.Empty,
) -> HaError:
    with pytest.raises(HaError) as info:
        await call(addr, method, request, creds, response)
    return info.value


def denied(http: str, reason: str, code: str | None = None) -> float:
    """hac_acl_denied_total{reason[, code]} of the process serving HTTP at ``http``."""
    status, body = http_get(http, "/metrics")
    assert status == 200
    total = 0.0
    for line in body.decode().splitlines():
        if not line.startswith("hac_acl_denied_total{") or f'reason="{reason}"' not in line:
            continue
        if code is not None and f'code="{code}"' not in line:
            continue
        total += float(line.rsplit(" ", 1)[1])
    return total


def offset_request(group: str, offset: int = 0) -> broker_pb2.ConsumerOffsetRequest:
    return broker_pb2.ConsumerOffsetRequest(
        consumer_group=group, topic=TOPIC, queue_id=0, offset=offset
    )


async def query_offset(addr: str, group: str) -> int:
    resp = await call(
        addr,
        RequestCode.QUERY_CONSUMER_OFFSET,
        offset_request(group),
        APP,
        broker_pb2.OffsetResponse,
    )
    assert isinstance(resp, broker_pb2.OffsetResponse)
    return resp.offset


# ---- a stranger cannot touch another group -------------------------------------------


async def test_stranger_cannot_reset_offsets_or_take_locks(acl_cluster: Cluster) -> None:
    master = acl_cluster.broker(GROUP, 0)
    async with Producer(acl_cluster.namesrv, group="acl-p", credentials=APP) as p:
        for i in range(3):
            await p.send(Message(TOPIC, f"m{i}".encode()))
    # the owners commit offset 3 on queue 0 (as the app user)
    await call(master.rpc, RequestCode.UPDATE_CONSUMER_OFFSET, offset_request(OWNERS, 3), APP)
    assert await query_offset(master.rpc, OWNERS) == 3
    before = denied(master.http, "no_permission")

    for creds in (STRANGER, None):
        exc = await refusal(
            master.rpc, RequestCode.UPDATE_CONSUMER_OFFSET, offset_request(OWNERS, 0), creds
        )
        assert isinstance(exc, AccessDenied), exc
        if creds is STRANGER:
            assert "Group:owners Sub" in str(exc), exc
        else:
            assert "anonymous" in str(exc), exc
    assert await query_offset(master.rpc, OWNERS) == 3  # nothing was reset

    mq = broker_pb2.MessageQueue(topic=TOPIC, broker_name=GROUP, queue_id=0)
    grab = broker_pb2.LockBatchRequest(consumer_group=OWNERS, client_id="thief", mqs=[mq])
    exc = await refusal(
        master.rpc, RequestCode.LOCK_BATCH_MQ, grab, STRANGER, broker_pb2.LockBatchResponse
    )
    assert isinstance(exc, AccessDenied), exc
    # a forged "peer vote" (only_this_broker) needs the cluster, not a user
    vote = broker_pb2.LockBatchRequest(
        consumer_group=OWNERS, client_id="thief", mqs=[mq], only_this_broker=True
    )
    exc = await refusal(
        master.rpc, RequestCode.LOCK_BATCH_MQ, vote, APP, broker_pb2.LockBatchResponse
    )
    assert isinstance(exc, Unauthorized), exc  # refused by the cluster's own guard first
    # the queue is still free: its owner gets it
    mine = broker_pb2.LockBatchRequest(consumer_group=OWNERS, client_id="owner", mqs=[mq])
    got = await call(master.rpc, RequestCode.LOCK_BATCH_MQ, mine, APP, broker_pb2.LockBatchResponse)
    assert isinstance(got, broker_pb2.LockBatchResponse)
    assert [m.queue_id for m in got.locked] == [0]
    assert denied(master.http, "no_permission") >= before + 2


async def test_admin_requests_need_the_admin_role(acl_cluster: Cluster) -> None:
    with pytest.raises(AccessDenied, match="Topic:AclNotMine Create"):
        async with NameserverClient([acl_cluster.namesrv], credentials=APP) as ns:
            await ns.create_topic("AclNotMine", queues=1)
    async with NameserverClient([acl_cluster.namesrv], credentials=ADMIN) as ns:
        await ns.create_topic("AclMine", queues=1)
        assert "AclMine" in (await ns.broker_topics(acl_cluster.broker(GROUP, 0).rpc))


async def test_anonymous_and_forged_requests_are_refused(acl_cluster: Cluster) -> None:
    master = acl_cluster.broker(GROUP, 0)
    send = broker_pb2.SendMessageRequest(
        producer_group="x", topic=TOPIC, entries=[broker_pb2.SendEntry(body=b"forged")]
    )
    before = {r: denied(master.http, r) for r in ("anonymous", "bad_signature", "stale")}
    exc = await refusal(
        master.rpc, RequestCode.SEND_MESSAGE, send, None, broker_pb2.SendMessageResponse
    )
    assert isinstance(exc, AccessDenied) and "anonymous" in str(exc), exc
    guessed = Credentials(APP.access_key, "not-the-secret-key")
    exc = await refusal(
        master.rpc, RequestCode.SEND_MESSAGE, send, guessed, broker_pb2.SendMessageResponse
    )
    assert isinstance(exc, AccessDenied) and "signature" in str(exc), exc

    class Old(Credentials):
        def sign(self, method: int, body: bytes, *, now_ms: int | None = None) -> RequestAuth:
            return super().sign(method, body, now_ms=int(time.time() * 1000) - 120_000)

    exc = await refusal(
        master.rpc,
        RequestCode.SEND_MESSAGE,
        send,
        Old(APP.access_key, APP.secret_key),
        broker_pb2.SendMessageResponse,
    )
    assert isinstance(exc, AccessDenied) and "clock" in str(exc), exc
    # the nameserver too: routes need a user
    exc = await refusal(
        acl_cluster.namesrv,
        RequestCode.GET_BROKER_CLUSTER_INFO,
        common_pb2.Empty(),
        None,
    )
    assert isinstance(exc, AccessDenied), exc
    for reason, n in before.items():
        assert denied(master.http, reason) >= n + 1, reason
    # the master's log names the client once, never the secret
    log = master.log_path.read_text()
    assert "access denied to 127.0.0.1:" in log
    assert APP.secret_key not in log and "not-the-secret-key" not in log


def run_hactl(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        hactl_argv(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_base_env(env),
        check=False,
    )


def test_hactl_signs_with_credentials(acl_cluster: Cluster) -> None:
    ns = acl_cluster.namesrv
    anon = run_hactl("produce", "--namesrv", ns, "--topic", TOPIC, "--count", "1", "--json")
    assert anon.returncode != 0
    assert "AccessDenied" in anon.stdout + anon.stderr, anon.stderr[-2000:]
    flags = run_hactl(
        "produce",
        "--namesrv",
        ns,
        "--topic",
        TOPIC,
        "--count",
        "3",
        "--json",
        "--access-key",
        APP.access_key,
        "--secret-key",
        APP.secret_key,
    )
    assert flags.returncode == 0, flags.stderr[-2000:]
    env = {"HAC_ACCESS_KEY": APP.access_key, "HAC_SECRET_KEY": APP.secret_key}
    consumed = run_hactl(
        "consume",
        "--namesrv",
        ns,
        "--topic",
        TOPIC,
        "--group",
        OWNERS,
        "--count",
        "3",
        "--timeout",
        "30",
        "--json",
        env=env,
    )
    assert consumed.returncode == 0, consumed.stderr[-2000:]
    summary = json.loads(consumed.stdout.splitlines()[-1])["summary"]
    assert summary["received"] >= 3
    half = run_hactl("groups", "--namesrv", ns, env={"HAC_ACCESS_KEY": "app"})
    assert half.returncode != 0
    assert "HAC_SECRET_KEY" in half.stderr, half.stderr


# ---- the admin token ----------------------------------------------------------------------


def http_status(addr: str, path: str, token: str | None) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://{addr}{path}")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()


@pytest.mark.parametrize("process", ["nameserver", "broker"])
def test_admin_token_guards_the_api_not_the_probes(acl_cluster: Cluster, process: str) -> None:
    handle = acl_cluster.nameserver if process == "nameserver" else acl_cluster.broker(GROUP, 0)
    api = "/api/v1/groups" if process == "nameserver" else "/api/v1/status"
    for path in ("/healthz", "/readyz", "/metrics"):
        status, _ = http_status(handle.http, path, None)
        assert status == 200, path
    status, body = http_status(handle.http, api, None)
    assert status == 401
    assert "Authorization: Bearer" in json.loads(body)["reason"]
    status, body = http_status(handle.http, api, "wrong")
    assert status == 401 and "does not match" in json.loads(body)["reason"]
    assert http_status(handle.http, "/no/such/path", None)[0] == 401
    status, _ = http_status(handle.http, api, TOKEN)
    assert status == 200
    assert TOKEN not in handle.log_path.read_text()


# ---- validation before any state changes ------------------------------------------------


async def test_bad_group_names_change_nothing(acl_cluster: Cluster) -> None:
    master = acl_cluster.broker(GROUP, 0)
    bad = ["../../etc", "", "x" * 256, "CID_RMQ_SYS_mine", "with space"]
    for group in bad:
        exc = await refusal(
            master.rpc, RequestCode.UPDATE_CONSUMER_OFFSET, offset_request(group, 1), ADMIN
        )
        assert isinstance(exc, BadRequest) and "group name" in str(exc), (group, exc)
        beat = broker_pb2.ClientHeartbeat(client_id="c1", consumer_groups=[group])
        exc = await refusal(master.rpc, RequestCode.HEART_BEAT, beat, ADMIN)
        assert isinstance(exc, BadRequest), (group, exc)
    # the longest valid name passes
    ok = "g" * 255
    await call(master.rpc, RequestCode.UPDATE_CONSUMER_OFFSET, offset_request(ok, 1), ADMIN)
    conn = await connect(master.rpc)
    conn.signer = ClusterAuth(SECRET).sign  # the table only cluster members may read
    try:
        table = await conn.call_pb(
            RequestCode.GET_ALL_CONSUMER_OFFSET,
            common_pb2.Empty(),
            broker_pb2.ConsumerOffsetTable,
            timeout_ms=3000,
        )
    finally:
        await conn.aclose()
    groups = {e.consumer_group for e in table.entries}
    assert ok in groups
    assert not groups & set(bad), groups & set(bad)


async def test_oversized_message_is_refused_before_sending(acl_cluster: Cluster) -> None:
    async with Producer(acl_cluster.namesrv, group="acl-big", credentials=APP) as p:
        started = time.monotonic()
        with pytest.raises(MessageTooLarge, match="the max 4194304"):
            await p.send(Message(TOPIC, b"x" * (40 * 1024 * 1024)))
        assert time.monotonic() - started < 1.0  # no attempt, no retry
        with pytest.raises(MessageTooLarge, match="batch of 2"):
            await p.send_batch([Message(TOPIC, b"y" * (3 * 1024 * 1024))] * 2)
        receipt = await p.send(Message(TOPIC, b"z" * (1024 * 1024)))
        assert receipt.queue_offset >= 0
