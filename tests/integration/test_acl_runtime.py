"""ACL 2.0 at runtime, over real processes: users and policy entries changed with
``hactl user`` / ``hactl acl`` (and the admin client it uses) take effect on every
broker, nameserver and gateway within 2 s, without a restart; an acting slave
enforces the same table; a returning master adopts a newer one in pre-online; bad
input is one clear line and changes nothing.

Two groups (master + slave each), a cluster secret, the ACL with anonymous access off,
the gateway.  The users file holds only the admin: everyone else is made at runtime.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ha_controller.acl import Credentials, PolicyEntry
from ha_controller.client.acl_admin import AclAdmin
from ha_controller.client.admin import NameserverClient
from ha_controller.proto import broker_pb2, common_pb2, nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import AccessDenied, HaError, NotMaster
from ha_controller.rpc import connect
from ha_controller.testing import (
    Cluster,
    ProcessHandle,
    _base_env,
    eventually,
    hactl_argv,
    run_cluster,
)

pytestmark = pytest.mark.timeout(240)

SECRET = "runtime-acl cluster secret"
GROUPS = ("rt-a", "rt-b")
ADMIN = Credentials("admin", "admin-secret-key")
TOPIC = "RtOrders"

ACL_FILE = f"""
[[users]]
access_key = "{ADMIN.access_key}"
secret_key = "{ADMIN.secret_key}"
admin = true
"""

#: the acceptance bound: a change is in effect everywhere within this long
EFFECT_S = 2.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("acl-runtime")
    acl = tmp / "acl.toml"
    acl.write_text(ACL_FILE)
    acl.chmod(0o600)
    env = {
        "HAC_CLUSTER_SECRET": SECRET,
        "HAC_ACL_ENABLED": "true",
        "HAC_ACL_ALLOW_ANONYMOUS": "false",
        "HAC_ACL_FILE": str(acl),
    }
    c = run_cluster(GROUPS, 2, workdir=tmp, env=env)
    try:
        asyncio.run(_settle(c))
        yield c
    finally:
        c.stop()


async def _settle(c: Cluster) -> None:
    async with NameserverClient([c.namesrv], credentials=ADMIN) as ns:

        async def online() -> bool:
            groups = await ns.groups()
            return len(groups) == 2 and all(g.master_online for g in groups)

        await eventually(online, timeout=60)
        await ns.create_topic(TOPIC, queues=2)


@pytest.fixture(scope="module")
def gateway(cluster: Cluster) -> Iterator[ProcessHandle]:
    handle = cluster.run_proxy()
    try:
        yield handle
    finally:
        handle.stop()


async def call(
    addr: str, method: int, request: Any, creds: Credentials, response: type = common_pb2.Empty
) -> Any:
    conn = await connect(addr)
    conn.signer = creds.sign
    try:
        return await conn.call_pb(method, request, response, timeout_ms=3000)
    finally:
        await conn.aclose()


def send_to(topic: str) -> broker_pb2.SendMessageRequest:
    return broker_pb2.SendMessageRequest(
        producer_group="rt-p", topic=topic, entries=[broker_pb2.SendEntry(body=b"x")]
    )


async def guard_says(
    addr: str, creds: Credentials, request: Any, method: int, response: type
) -> str:
    """``allowed`` when the broker's guard let the request through (a slave then refuses
    it as not its master's to take), ``denied`` when the ACL refused it."""
    try:
        await call(addr, method, request, creds, response)
    except AccessDenied:
        return "denied"
    except NotMaster:
        return "allowed"  # passed the guard; only a master takes a send
    except HaError as exc:
        return f"other: {type(exc).__name__}: {exc}"
    return "allowed"


def brokers(c: Cluster) -> list[str]:
    return [h.rpc for h in c.brokers.values()]


async def everywhere(
    c: Cluster, creds: Credentials, want: str, request: Any, method: int, response: type
) -> float:
    """Seconds until every broker's guard says ``want``."""
    start = time.monotonic()

    async def done() -> bool:
        says = await asyncio.gather(
            *(guard_says(a, creds, request, method, response) for a in brokers(c))
        )
        return all(s == want for s in says)

    await eventually(done, timeout=10, interval=0.05)
    return time.monotonic() - start


def grpc_send(gateway: ProcessHandle, creds: Credentials, topic: str) -> int:
    """SendMessage through the gateway, signed as the SDKs sign: the status code."""
    from datetime import UTC, datetime

    import grpc

    from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
    from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s
    from ha_controller.proto.rocketmq.v2 import service_pb2_grpc
    from ha_controller.proxy.auth import DATE_FORMAT, sdk_signature

    stamp = datetime.now(UTC).strftime(DATE_FORMAT)
    meta = (
        ("x-mq-date-time", stamp),
        (
            "authorization",
            f"MQv2-HMAC-SHA1 Credential={creds.access_key}, SignedHeaders=x-mq-date-time, "
            f"Signature={sdk_signature(creds.secret_key, stamp)}",
        ),
        ("x-mq-client-id", f"rt-{creds.access_key}"),
    )
    msg = v2.Message(
        topic=v2.Resource(name=topic),
        body=b"via gateway",
        system_properties=v2.SystemProperties(message_id="01ABCDEF", body_encoding=v2.IDENTITY),
    )
    with grpc.insecure_channel(gateway.rpc) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        try:
            resp = stub.SendMessage(
                v2s.SendMessageRequest(messages=[msg]), metadata=meta, timeout=5
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:  # an unknown user
                return int(v2.UNAUTHORIZED)
            raise
    return int(resp.status.code)


async def test_grant_use_revoke_on_every_broker_and_the_gateway(
    cluster: Cluster, gateway: ProcessHandle
) -> None:
    from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2

    bob = Credentials("bob", "bob-secret-key-1")
    req, code, resp = send_to(TOPIC), RequestCode.SEND_MESSAGE, broker_pb2.SendMessageResponse
    async with NameserverClient([cluster.namesrv], credentials=ADMIN) as ns:
        admin = AclAdmin(ns)
        await admin.create_user("bob", bob.secret_key)
        # a user without entries is refused everything but what any user may do
        assert await everywhere(cluster, bob, "denied", req, code, resp) < EFFECT_S
        route = nameserver_pb2.GetRouteInfoRequest(topic=TOPIC)
        with pytest.raises(AccessDenied):
            await call(
                cluster.namesrv,
                RequestCode.GET_ROUTEINFO_BY_TOPIC,
                route,
                bob,
                common_pb2.TopicRoute,
            )

        granted_at = time.monotonic()
        await admin.create_acl(
            "bob", [PolicyEntry.from_dict({"resource": f"Topic:{TOPIC}", "actions": ["Pub"]})]
        )
        took = await everywhere(cluster, bob, "allowed", req, code, resp)
        assert took < EFFECT_S, f"granted on every broker after {took:.2f} s"
        await call(
            cluster.namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, route, bob, common_pb2.TopicRoute
        )

        async def gateway_says(status: int) -> bool:
            return await asyncio.to_thread(grpc_send, gateway, bob, TOPIC) == status

        await eventually(lambda: gateway_says(v2.OK), timeout=10, interval=0.05)
        assert time.monotonic() - granted_at < EFFECT_S + 1.0  # the gateway polls each 1 s

        revoked_at = time.monotonic()
        await admin.delete_acl("bob", f"Topic:{TOPIC}")
        took = await everywhere(cluster, bob, "denied", req, code, resp)
        assert took < EFFECT_S, f"revoked on every broker after {took:.2f} s"
        await eventually(lambda: gateway_says(v2.FORBIDDEN), timeout=10, interval=0.05)
        assert time.monotonic() - revoked_at < EFFECT_S + 1.0
        # and a disabled user is refused at once, whatever its entries
        await admin.create_acl(
            "bob", [PolicyEntry.from_dict({"resource": "*", "actions": ["All"]})]
        )
        await everywhere(cluster, bob, "allowed", req, code, resp)
        await admin.update_user("bob", status="disable")
        assert await everywhere(cluster, bob, "denied", req, code, resp) < EFFECT_S
        spread = await admin.wait_everywhere(await admin.delete_user("bob"))
        assert not spread.behind, spread


async def test_prefix_wildcard_and_deny_over_allow(cluster: Cluster) -> None:
    eve = Credentials("eve", "eve-secret-key-1")
    async with NameserverClient([cluster.namesrv], credentials=ADMIN) as ns:
        admin = AclAdmin(ns)
        await admin.create_user("eve", eve.secret_key)
        entry = PolicyEntry.from_dict
        rev = await admin.create_acl(
            "eve",
            [
                entry({"resource": "Topic:ord-*", "actions": ["Pub"]}),
                entry({"resource": "Topic:ord-secret", "actions": ["Pub"], "decision": "Deny"}),
                entry({"resource": "Topic:*", "actions": ["Sub"]}),
            ],
        )
        await admin.wait_everywhere(rev)
    master = cluster.broker(GROUPS[0], 0).rpc
    code, resp = RequestCode.SEND_MESSAGE, broker_pb2.SendMessageResponse
    assert await guard_says(master, eve, send_to("ord-1"), code, resp) == "allowed"
    assert await guard_says(master, eve, send_to("ord-secret"), code, resp) == "denied"
    assert await guard_says(master, eve, send_to("other"), code, resp) == "denied"
    q = broker_pb2.QueueOffsetRequest(topic="ord-secret", queue_id=0)
    assert (
        await guard_says(master, eve, q, RequestCode.GET_MAX_OFFSET, broker_pb2.OffsetResponse)
        == "allowed"
    )


async def test_acting_slave_enforces_the_table_and_a_returning_master_adopts_it(
    cluster: Cluster,
) -> None:
    carol = Credentials("carol", "carol-secret-key")
    q = broker_pb2.QueueOffsetRequest(topic=TOPIC, queue_id=0)
    code, resp = RequestCode.GET_MAX_OFFSET, broker_pb2.OffsetResponse
    group = GROUPS[0]  # the coordinator's group: changes go to its acting slave
    async with NameserverClient([cluster.namesrv], credentials=ADMIN) as ns:
        admin = AclAdmin(ns)
        await admin.create_user("carol", carol.secret_key)
        granted = await admin.create_acl(
            "carol", [PolicyEntry.from_dict({"resource": f"Topic:{TOPIC}", "actions": ["Sub"]})]
        )
        await admin.wait_everywhere(granted)
        cluster.broker(group, 0).kill()
        slave = cluster.broker(group, 1).rpc

        async def acting() -> bool:
            return await admin.coordinator() == slave

        await eventually(acting, timeout=20)
        # the acting slave serves the master-only query, to carol only
        assert await guard_says(slave, carol, q, code, resp) == "allowed"
        # revoked while the master is away: made on the acting slave itself
        revoked = await admin.delete_acl("carol")
        assert await guard_says(slave, carol, q, code, resp) == "denied"
        spread = await admin.wait_everywhere(revoked)
        assert slave in spread.holding, spread
        master = cluster.restart(group, 0)

        async def back() -> bool:
            groups = {g.broker_name: g for g in await ns.groups()}
            return groups[group].master_online

        await eventually(back, timeout=60)
        # online, so past pre-online: it holds the slave's newer table
        assert await admin.revision_at(master.rpc) >= revoked
        assert await guard_says(master.rpc, carol, q, code, resp) == "denied"
    log = master.log_path.read_text()
    assert "pre-online: ACL table of slave 1 adopted" in log, log[-3000:]
    stored = json.loads((cluster.workdir / "store" / f"{group}-0" / "acl.json").read_text())
    assert stored["revision"] >= revoked


# ---- hactl user / hactl acl -------------------------------------------------------------


def hactl(
    *args: str, creds: Credentials = ADMIN, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {"HAC_ACCESS_KEY": creds.access_key, "HAC_SECRET_KEY": creds.secret_key, **(extra or {})}
    return subprocess.run(
        hactl_argv(*args),
        capture_output=True,
        text=True,
        timeout=60,
        env=_base_env(env),
        check=False,
    )


def test_hactl_user_and_acl_commands(cluster: Cluster, tmp_path: Path) -> None:
    ns = ("--namesrv", cluster.namesrv)
    secret = tmp_path / "dan.secret"
    secret.write_text("dan-secret-key-1\n")
    made = hactl("user", "create", "dan", "--password-file", str(secret), *ns, "--json")
    assert made.returncode == 0, made.stderr
    rev = json.loads(made.stdout)["revision"]
    assert not json.loads(made.stdout)["behind"]
    granted = hactl(
        "acl",
        "create",
        "User:dan",
        "-r",
        f"Topic:{TOPIC}",
        "-r",
        "Group:dan-*",
        "-a",
        "Sub,Pub",
        "-i",
        "127.0.0.0/8",
        *ns,
    )
    assert granted.returncode == 0, granted.stderr
    assert "in effect on 5/5 nodes" in granted.stdout, granted.stdout
    listed = hactl("acl", "get", "User:dan", *ns, "--json")
    entries = json.loads(listed.stdout)[0]["entries"]
    assert {e["resource"] for e in entries} == {f"Topic:{TOPIC}", "Group:dan-*"}
    assert entries[0]["source_ips"] == ["127.0.0.0/8"]
    users = hactl("user", "list", *ns, "--json")
    assert {"username": "dan", "userType": "Normal", "userStatus": "enable"} in json.loads(
        users.stdout
    )
    assert "dan-secret-key-1" not in users.stdout + listed.stdout

    # bad input: a usage error before anything is sent (exit 2), one line
    cases: tuple[tuple[tuple[str, ...], str], ...] = (
        (("acl", "create", "User:dan", "-r", "Topic:x", "-a", "Fly"), "unknown action 'Fly'"),
        (("acl", "create", "User:dan", "-r", "Topic:a*b", "-a", "Pub"), "'*' may only end"),
        (("acl", "create", "User:dan", "-r", "Queue:x", "-a", "Pub"), "unknown type"),
        (("acl", "create", "User:dan", "-r", "Topic:x", "-a", "Pub", "-i", "10.0.0/33"), "CIDR"),
        (("user", "create", "has space", "--password", "12345678"), "username"),
    )
    for args, words in cases:
        out = hactl(*args, *ns)
        assert out.returncode == 2, (args, out.stderr)
        assert words in out.stderr, (args, out.stderr)
    # refused by the cluster: one line, exit 1, nothing changed
    cases = (
        (("user", "create", "dan", "--password", "another-secret"), "exists already"),
        (("user", "create", "fay", "--password", "short"), "8.."),
        (("acl", "update", "User:dan", "-r", "Topic:none", "-a", "Pub"), "no ACL entry"),
        (("acl", "delete", "User:ghost"), "does not exist"),
        (("user", "delete", "admin"), "no enabled Super user"),
        (("user", "update", "admin", "--type", "Normal"), "no enabled Super user"),
    )
    for args, words in cases:
        out = hactl(*args, *ns)
        assert out.returncode == 1, (args, out.stdout, out.stderr)
        assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1, (args, out.stderr)
    after = json.loads(hactl("user", "get", "dan", *ns, "--json").stdout)
    assert after == [{"username": "dan", "userType": "Normal", "userStatus": "enable"}]
    check = hactl("acl", "list", *ns, "--json", "--subject-filter", "dan")
    assert len(json.loads(check.stdout)[0]["entries"]) == 2
    # only a Super user may manage users
    dan = Credentials("dan", "dan-secret-key-1")
    refused = hactl("user", "list", *ns, creds=dan)
    assert refused.returncode == 1 and "Super user" in refused.stderr, refused.stderr
    assert rev >= 1
    gone = hactl("user", "delete", "dan", *ns)
    assert gone.returncode == 0, gone.stderr
