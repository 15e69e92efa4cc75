"""A hostile tenant with valid credentials against the production profile.

One group (master + slave) with a cluster secret, mutual TLS and the client ACL with
anonymous access off, and the gRPC gateway.  The tenant ``mallory`` holds a client
certificate and a user that may publish and subscribe to its own topic ``M1`` and read
every other topic except ``PAY`` (an explicit DENY).  The victim ``payments`` owns
``PAY``, its producer group and its consumer group.  Each attack below worked before
requests were authorised by what they touch:

1. END_TRANSACTION naming M1 committed and rolled back PAY's transactions;
2. a producer claiming the victim's producer group got its transaction checks (with
   the message bodies);
3. pulling ``RMQ_SYS_TRANS_HALF_TOPIC`` read PAY's pending transactions, and another
   group's retry topic was readable;
4. a captured signed UPDATE_CONSUMER_OFFSET replayed within its window rewound an
   offset;

and 1 and 2 through the gateway with the official Python SDK (run in a child process,
this file as a script: its ``apache.rocketmq.v2`` modules must not meet ours).
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

SECRET = "attack-test cluster secret"
GROUP = "atk"
PAY = "PAY"
M1 = "M1"
PAY_PRODUCERS = "pay-producers"
PAY_CONSUMERS = "pay-consumers"
#: the group whose offsets the replay test moves (not the one the SDK reads with)
PAY_AUDIT = "pay-audit"
ADMIN = ("admin", "admin-secret-key")
VICTIM = ("payments", "payments-secret-key")
MALLORY = ("mallory", "mallory-secret-key")

ACL_FILE = f"""
[[users]]
access_key = "{ADMIN[0]}"
secret_key = "{ADMIN[1]}"
admin = true

[[users]]
access_key = "{VICTIM[0]}"
secret_key = "{VICTIM[1]}"
topic_perms = ["{PAY}=PUB|SUB"]
group_perms = ["{PAY_CONSUMERS}=SUB", "{PAY_AUDIT}=SUB"]

[[users]]
access_key = "{MALLORY[0]}"
secret_key = "{MALLORY[1]}"
# may read every topic but PAY, and publish only to its own
default_topic_perm = "SUB"
topic_perms = ["{M1}=PUB|SUB", "{PAY}=DENY"]
default_group_perm = "SUB"
group_perms = ["{PAY_CONSUMERS}=DENY"]
"""


# --------------------------------------------------------------------------------------
# the child process: rocketmq-python-client only
# --------------------------------------------------------------------------------------


def scenario_sdk(proxy: str, victim: list[str], mallory: list[str]) -> dict[str, Any]:
    import logging

    import rocketmq as rmq
    from rocketmq.grpc_protocol import TransactionSource

    logging.getLogger("rocketmq").setLevel(logging.CRITICAL)
    out: dict[str, Any] = {"mallory_checked": []}
    checked_lock = threading.Lock()

    class Unknown(rmq.TransactionChecker):  # type: ignore[misc]
        def check(self, message: Any) -> Any:
            return rmq.TransactionResolution.UNKNOWN

    class Snoop(rmq.TransactionChecker):  # type: ignore[misc]
        def check(self, message: Any) -> Any:
            with checked_lock:
                out["mallory_checked"].append(message.body.decode(errors="replace"))
            return rmq.TransactionResolution.COMMIT

    class Commit(rmq.TransactionChecker):  # type: ignore[misc]
        def check(self, message: Any) -> Any:
            out.setdefault("victim_checked", []).append(message.body.decode())
            return rmq.TransactionResolution.COMMIT

    def config(user: list[str]) -> Any:
        return rmq.ClientConfiguration(proxy, rmq.Credentials(*user), request_timeout=5)

    def message(topic: str, body: str) -> Any:
        m = rmq.Message()
        m.topic, m.body = topic, body.encode()
        return m

    # 1: mallory resolves the victim's transactions, naming its own topic
    victim_p = rmq.Producer(config(victim), (PAY,), checker=Unknown(), tls_enable=True)
    victim_p.startup()
    txs, receipts = [], []
    for body in ("sdk-a", "sdk-b"):
        tx = victim_p.begin_transaction()
        receipts.append(victim_p.send(message(PAY, body), tx))
        txs.append(tx)
    mallory_p = rmq.Producer(config(mallory), (M1,), checker=Snoop(), tls_enable=True)
    mallory_p.startup()
    out["forged"] = []
    for receipt, resolution in zip(
        receipts,
        (rmq.TransactionResolution.COMMIT, rmq.TransactionResolution.ROLLBACK),
        strict=True,
    ):
        forged = message(M1, "forged")
        forged._Message__message_id = receipt.message_id  # what the request carries
        try:
            res = mallory_p.end_transaction(
                receipt.message_queue.endpoints,
                forged,
                receipt.transaction_id,
                resolution,
                TransactionSource.SOURCE_CLIENT,
            )
            out["forged"].append([int(res.status.code), res.status.message])
        except Exception as exc:  # the SDK's exceptions
            out["forged"].append([-1, f"{type(exc).__name__}: {exc}"])
    # the victim wants the opposite: a rolled back, b committed
    txs[0].rollback()
    txs[1].commit()
    mallory_p.shutdown()

    # 2: the victim's next half waits for a check while mallory claims PAY's group
    pending = victim_p.begin_transaction()
    victim_p.send(message(PAY, "sdk-c"), pending)
    victim_p.shutdown()
    try:
        snoop = rmq.Producer(config(mallory), (PAY, M1), checker=Snoop(), tls_enable=True)
        snoop.startup()
        out["snoop_started"] = True
    except Exception as exc:
        snoop = None
        out["snoop_started"] = f"{type(exc).__name__}: {exc}"
    time.sleep(4)  # several check rounds (the brokers check every 0.5 s)
    with checked_lock:
        out["mallory_checked_before_victim"] = list(out["mallory_checked"])
    victim_again = rmq.Producer(config(victim), (PAY,), checker=Commit(), tls_enable=True)
    victim_again.startup()
    deadline = time.time() + 30
    while time.time() < deadline and not out.get("victim_checked"):
        time.sleep(0.2)
    victim_again.shutdown()
    if snoop is not None:
        snoop.shutdown()

    # what the victim's consumer group receives of PAY
    consumer = rmq.SimpleConsumer(
        config(victim), PAY_CONSUMERS, {PAY: rmq.FilterExpression("*")}, tls_enable=True
    )
    consumer.startup()
    got: set[str] = set()
    deadline = time.time() + 20
    while time.time() < deadline and not {"sdk-b", "sdk-c"} <= got:
        for m in consumer.receive(16, 20):
            got.add(m.body.decode())
            consumer.ack(m)
    consumer.shutdown()
    out["received"] = sorted(b for b in got if b.startswith("sdk-"))
    return out


def _child_main() -> None:
    args = json.loads(sys.argv[1])
    print("RESULT " + json.dumps(scenario_sdk(**args)), flush=True)
    os._exit(0)  # the SDK's non-daemon threads must not keep the child alive


if __name__ == "__main__":
    _child_main()


# --------------------------------------------------------------------------------------
# the tests
# --------------------------------------------------------------------------------------

from ha_controller.acl import Credentials  # noqa: E402
from ha_controller.auth import ClusterAuth  # noqa: E402
from ha_controller.client.message import Message  # noqa: E402
from ha_controller.client.producer import Producer  # noqa: E402
from ha_controller.client.pull_consumer import PullConsumer  # noqa: E402
from ha_controller.client.transaction import TransactionResolution  # noqa: E402
from ha_controller.proto import broker_pb2, common_pb2  # noqa: E402
from ha_controller.protocol.codes import RequestCode  # noqa: E402
from ha_controller.protocol.errors import AccessDenied, HaError, ReplayedRequest  # noqa: E402
from ha_controller.protocol.properties import HALF_TOPIC, SCHEDULE_TOPIC  # noqa: E402
from ha_controller.rpc import connect  # noqa: E402
from ha_controller.testing import (  # noqa: E402
    Cluster,
    ProcessHandle,
    TlsFiles,
    eventually,
    make_tls_files,
    openssl_missing,
    run_cluster,
    stored_messages,
)

pytestmark = pytest.mark.timeout(240)

ADMIN_C = Credentials(*ADMIN)
VICTIM_C = Credentials(*VICTIM)
MALLORY_C = Credentials(*MALLORY)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    if openssl_missing() is not None:
        pytest.skip(str(openssl_missing()))
    return make_tls_files(tmp_path_factory.mktemp("tls"), hosts=("127.0.0.1",))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tls: TlsFiles) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("attacks")
    acl = tmp / "acl.toml"
    acl.write_text(ACL_FILE)
    acl.chmod(0o600)
    env = {
        "HAC_CLUSTER_SECRET": SECRET,
        "HAC_ACL_ENABLED": "true",
        "HAC_ACL_ALLOW_ANONYMOUS": "false",
        "HAC_ACL_FILE": str(acl),
        "HAC_TRANSACTION_CHECK_INTERVAL_MS": "500",
        "HAC_TRANSACTION_TIMEOUT_MS": "1000",
        "HAC_TRANSACTION_CHECK_MAX": "100",
    }
    c = run_cluster((GROUP,), 2, workdir=tmp, env=env, tls=tls)
    try:
        import asyncio

        asyncio.run(_settle(c, tls))
        yield c
    finally:
        c.stop()


async def _settle(c: Cluster, tls: TlsFiles) -> None:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient([c.namesrv], tls=tls.client_context(), credentials=ADMIN_C) as ns:

        async def online() -> bool:
            groups = await ns.groups()
            return bool(groups) and groups[0].master_online

        await eventually(online, timeout=60)
        for topic in (PAY, M1):
            await ns.create_topic(topic, queues=2)


async def call(
    c: Cluster,
    method: int,
    request: Any,
    creds: Credentials | None,
    response: type = common_pb2.Empty,
    *,
    auth: Any = None,
) -> Any:
    """One request to the master over mutual TLS, signed by ``creds`` (or with the
    given signature ``auth``: a captured one)."""
    assert c.tls is not None
    conn = await connect(c.broker(GROUP, 0).rpc, ssl_context=c.tls.client_context())
    if auth is not None:
        conn.signer = lambda m, b: auth
    else:
        conn.signer = creds.sign if creds is not None else None
    try:
        return await conn.call_pb(method, request, response, timeout_ms=5000)
    finally:
        await conn.aclose()


async def refused(
    c: Cluster, method: int, request: Any, creds: Credentials | None, **kw: Any
) -> HaError:
    with pytest.raises(HaError) as info:
        await call(c, method, request, creds, **kw)
    return info.value


def producer(c: Cluster, user: Credentials, group: str, checker: Any, topic: str = PAY) -> Producer:
    assert c.tls is not None
    return Producer(
        c.namesrv,
        group,
        topics=(topic,),  # its heartbeats go to the topic's brokers (the one group here)
        checker=checker,
        credentials=user,
        tls=c.tls.client_context(),
    )


async def bodies_of(c: Cluster, topic: str) -> list[bytes]:
    assert c.tls is not None
    async with PullConsumer(
        c.namesrv, PAY_CONSUMERS, credentials=VICTIM_C, tls=c.tls.client_context()
    ) as pull:
        return [m.body async for m in stored_messages(pull, await pull.queues(topic))]


async def unknown(_: Any) -> TransactionResolution:
    return TransactionResolution.UNKNOWN


# ---- 1: END_TRANSACTION by the half message's topic ----------------------------------


async def test_end_transaction_naming_another_topic_is_refused(cluster: Cluster) -> None:
    async with producer(cluster, VICTIM_C, PAY_PRODUCERS, unknown) as p:
        txs = []
        for body in (b"tx-a", b"tx-b"):
            tx = p.begin_transaction()
            await p.send(Message(PAY, body), tx)
            txs.append(tx)
        # mallory commits a and rolls back b, naming its own topic and the victim's
        # group (what it can guess), by half offset, with and without the id
        for tx, commit in zip(txs, (True, False), strict=True):
            receipt = tx.receipt
            assert receipt is not None
            for tid in (receipt.uniq_key, ""):
                forged = broker_pb2.EndTransactionRequest(
                    producer_group=PAY_PRODUCERS,
                    topic=M1,
                    transaction_id=tid,
                    commit=commit,
                    broker_name=receipt.broker_name,
                    half_queue_offset=receipt.queue_offset,
                )
                exc = await refused(cluster, RequestCode.END_TRANSACTION, forged, MALLORY_C)
                assert isinstance(exc, AccessDenied), exc
                assert f"Topic:{PAY} Pub" in str(exc), exc
        # the victim decides the opposite: a rolled back, b committed
        await txs[0].rollback()
        await txs[1].commit()

    async def settled() -> bool:
        return b"tx-b" in await bodies_of(cluster, PAY)

    await eventually(settled, timeout=20)
    assert b"tx-a" not in await bodies_of(cluster, PAY)


async def test_end_transaction_of_another_producer_group_is_refused(cluster: Cluster) -> None:
    async with producer(cluster, VICTIM_C, PAY_PRODUCERS, unknown) as p:
        tx = p.begin_transaction()
        await p.send(Message(PAY, b"tx-group"), tx)
        receipt = tx.receipt
        assert receipt is not None
        # even a user that may publish to PAY (the victim's own key, in another
        # application) cannot end a half of another producer group (RocketMQ's rule)
        other = broker_pb2.EndTransactionRequest(
            producer_group="someone-else",
            topic=PAY,
            commit=True,
            broker_name=receipt.broker_name,
            half_queue_offset=receipt.queue_offset,
        )
        exc = await refused(cluster, RequestCode.END_TRANSACTION, other, VICTIM_C)
        assert "producer group" in str(exc), exc
        await tx.rollback()


# ---- 2: a transaction check goes only to a producer allowed to see it ------------------


async def test_a_stranger_in_the_victims_producer_group_is_never_asked(
    cluster: Cluster,
) -> None:
    asked_mallory: list[bytes] = []
    asked_victim: list[bytes] = []

    async def snoop(m: Any) -> TransactionResolution:
        asked_mallory.append(m.body)
        return TransactionResolution.COMMIT

    async def commit(m: Any) -> TransactionResolution:
        asked_victim.append(m.body)
        return TransactionResolution.COMMIT

    async with producer(cluster, VICTIM_C, PAY_PRODUCERS, unknown) as p:
        tx = p.begin_transaction()
        await p.send(Message(PAY, b"secret-payload"), tx)
    # the victim's producer is gone; mallory claims its group and waits for checks
    async with producer(cluster, MALLORY_C, PAY_PRODUCERS, snoop, M1):
        await _sleep(3.0)  # six check rounds
        assert asked_mallory == []
        # the victim comes back: the check goes to it (so checks were being made)
        async with producer(cluster, VICTIM_C, PAY_PRODUCERS, commit):

            async def victim_asked() -> bool:
                return b"secret-payload" in asked_victim

            await eventually(victim_asked, timeout=20)
    assert asked_mallory == [], "the stranger received the victim's transaction check"
    log = cluster.broker(GROUP, 0).log_path.read_text()
    assert "that may publish to 'PAY'" in log


async def _sleep(s: float) -> None:
    import asyncio

    await asyncio.sleep(s)


# ---- 3: the brokers' own topics and other groups' topics --------------------------------


@pytest.mark.parametrize(
    ("topic", "group", "why"),
    [
        (HALF_TOPIC, "mallory-g", "the brokers' own"),
        ("RMQ_SYS_TRANS_OP_HALF_TOPIC", "mallory-g", "the brokers' own"),
        (SCHEDULE_TOPIC, "mallory-g", "the brokers' own"),
        ("rmq_sys_wheel_timer", "mallory-g", "the brokers' own"),
        (f"%RETRY%{PAY_CONSUMERS}", PAY_CONSUMERS, f"Group:{PAY_CONSUMERS} Sub"),
        (f"%DLQ%{PAY_CONSUMERS}", "mallory-g", f"Group:{PAY_CONSUMERS} Sub"),
        (PAY, "mallory-g", f"Topic:{PAY} Sub"),
    ],
)
async def test_system_topics_and_other_groups_topics_are_refused(
    cluster: Cluster, topic: str, group: str, why: str
) -> None:
    # a pending transaction of the victim sits in the half topic
    async with producer(cluster, VICTIM_C, PAY_PRODUCERS, unknown) as p:
        tx = p.begin_transaction()
        await p.send(Message(PAY, b"pending-secret"), tx)
        pull = broker_pb2.PullMessageRequest(
            consumer_group=group, topic=topic, queue_id=0, queue_offset=0, max_msg_nums=32
        )
        exc = await refused(
            cluster,
            RequestCode.PULL_MESSAGE,
            pull,
            MALLORY_C,
            response=broker_pb2.PullMessageResponse,
        )
        assert isinstance(exc, AccessDenied), exc
        assert why in str(exc), exc
        if topic != PAY:
            # nor may it write there (an op message would resolve the victim's half)
            send = broker_pb2.SendMessageRequest(
                producer_group="x", topic=topic, entries=[broker_pb2.SendEntry(body=b"forged")]
            )
            exc = await refused(
                cluster,
                RequestCode.SEND_MESSAGE,
                send,
                MALLORY_C,
                response=broker_pb2.SendMessageResponse,
            )
            assert isinstance(exc, AccessDenied), exc
        await tx.rollback()


# ---- 4: a replayed signed request ---------------------------------------------------------


async def test_a_replayed_offset_commit_is_refused(cluster: Cluster) -> None:
    def commit(offset: int) -> broker_pb2.ConsumerOffsetRequest:
        return broker_pb2.ConsumerOffsetRequest(
            consumer_group=PAY_AUDIT, topic=PAY, queue_id=1, offset=offset
        )

    query = broker_pb2.ConsumerOffsetRequest(consumer_group=PAY_AUDIT, topic=PAY, queue_id=1)
    rewind = commit(0)
    # the victim commits 0, then 5; an attacker on the path captured the first
    captured = VICTIM_C.sign(RequestCode.UPDATE_CONSUMER_OFFSET, rewind.SerializeToString())
    await call(cluster, RequestCode.UPDATE_CONSUMER_OFFSET, rewind, None, auth=captured)
    await call(cluster, RequestCode.UPDATE_CONSUMER_OFFSET, commit(5), VICTIM_C)
    got = await call(
        cluster, RequestCode.QUERY_CONSUMER_OFFSET, query, VICTIM_C, broker_pb2.OffsetResponse
    )
    assert got.offset == 5
    exc = await refused(cluster, RequestCode.UPDATE_CONSUMER_OFFSET, rewind, None, auth=captured)
    assert isinstance(exc, ReplayedRequest), exc
    got = await call(
        cluster, RequestCode.QUERY_CONSUMER_OFFSET, query, VICTIM_C, broker_pb2.OffsetResponse
    )
    assert got.offset == 5, "the replay rewound the offset"
    # a cluster member's own requests are not affected
    member = ClusterAuth(SECRET, sign_all=True)
    table = await call(
        cluster,
        RequestCode.GET_ALL_CONSUMER_OFFSET,
        common_pb2.Empty(),
        None,
        broker_pb2.ConsumerOffsetTable,
        auth=member.sign(RequestCode.GET_ALL_CONSUMER_OFFSET, b""),
    )
    assert any(e.consumer_group == PAY_AUDIT for e in table.entries)


# ---- 1 and 2 through the gateway, with the official Python SDK ----------------------------


@pytest.fixture(scope="module")
def gateway(cluster: Cluster, tls: TlsFiles) -> Iterator[ProcessHandle]:
    # the SDK has no client certificate: server TLS on the gRPC side only
    handle = cluster.run_proxy(env={"HAC_TLS_REQUIRE_CLIENT_CERT": "false"})
    try:
        yield handle
    finally:
        handle.stop()


@pytest.mark.skipif(SDK_MISSING, reason="rocketmq-python-client is not installed")
def test_gateway_attacks_with_the_official_sdk(
    cluster: Cluster, gateway: ProcessHandle, tls: TlsFiles
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAC_")} | {
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(tls.ca)
    }
    child = subprocess.run(
        [
            sys.executable,
            str(HERE),
            json.dumps({"proxy": gateway.rpc, "victim": list(VICTIM), "mallory": list(MALLORY)}),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )
    results = [
        json.loads(x[len("RESULT ") :])
        for x in child.stdout.splitlines()
        if x.startswith("RESULT ")
    ]
    assert results, child.stdout[-2000:] + child.stderr[-3000:]
    r = results[0]
    from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2

    # 1: both forged resolutions refused: a transaction id is the victim's message id,
    # which the gateway knows under PAY only (as RocketMQ's proxy keys its transaction
    # data by producer group, the topic for gRPC), so naming M1 finds nothing; with the
    # half's location in hand the gateway's broker would refuse it (FORBIDDEN)
    assert len(r["forged"]) == 2
    for code, text in r["forged"]:
        assert code != v2.OK, text
        assert code in (v2.INVALID_TRANSACTION_ID, v2.FORBIDDEN) or "Topic:PAY Pub" in text, text
    # 2: mallory may not declare PAY; no check reached it, the victim's did
    assert (
        r["snoop_started"] is True
        or "FORBIDDEN" in str(r["snoop_started"])
        or ("Topic:PAY" in str(r["snoop_started"]))
    ), r["snoop_started"]
    assert r["mallory_checked"] == [], "mallory's checker saw the victim's transaction"
    assert r["victim_checked"] == ["sdk-c"]
    # the victim's decisions stand: a rolled back, b committed, c committed by its check
    assert r["received"] == ["sdk-b", "sdk-c"], r["received"]
    log = gateway.log_path.read_text()
    assert "Telemetry needs Topic:PAY Pub" in log or "settings refused" in log
