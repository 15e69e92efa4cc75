"""Priority messages (RocketMQ 5.4's RIP-80) over real processes: two groups (a master
and a slave each; the topics live on "prio") and ``hactl proxy``.  Our SDK, the official
Python SDK (the calls of rocketmq-clients' python/example/priority_producer_example.py;
a simple and a push consumer) and the Node.js SDK send priorities to a PRIORITY topic of
10 queues and get them highest first, one priority in the order sent; what RocketMQ
refuses is refused; a redelivered message comes after the fresh ones.  Last, the master
is killed and the acting slave serves the pops, still highest first.

The Python SDK runs in a child process (this file as a script), as in
tests/integration/test_grpc_proxy.py (its protobuf modules and ours must not meet in
one process); the Node.js SDK runs tests/sdk_node/scenarios.js.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
TOPIC = "prio"  # PRIORITY, 10 queues: levels 0..9
TOPIC_ACTING = "prio-acting"
TOPIC_PY = "prio-py"
TOPIC_NODE = "prio-node"
TOPIC_NORMAL = "prio-normal"
TOPIC_RETRY = "prio-retry"
TOPIC_RAW = "prio-raw"
LEVELS = 10
TOPICS = {
    TOPIC: "PRIORITY",
    TOPIC_ACTING: "PRIORITY",
    TOPIC_PY: "PRIORITY",
    TOPIC_NODE: "PRIORITY",
    TOPIC_RETRY: "PRIORITY",
    TOPIC_RAW: "PRIORITY",
    TOPIC_NORMAL: "NORMAL",
}


# --------------------------------------------------------------------------------------
# the child process: rocketmq-python-client only
# --------------------------------------------------------------------------------------


def _outcome(fn: Any) -> dict[str, Any]:
    try:
        fn()
    except Exception as exc:  # the SDK's exceptions: the outcome is the point
        return {"ok": False, "code": getattr(exc, "code", None), "error": str(exc)[:300]}
    return {"ok": True}


def scenario_python(proxy: str, topic: str, normal_topic: str) -> dict[str, Any]:
    import logging

    import rocketmq as rmq

    logging.getLogger("rocketmq").setLevel(logging.WARNING)
    cfg = rmq.ClientConfiguration(proxy, rmq.Credentials())
    out: dict[str, Any] = {}
    producer = rmq.Producer(cfg, (topic,))
    producer.startup()

    def message(topic: str, **fields: Any) -> Any:
        m = rmq.Message()
        m.topic, m.body = topic, b"x"
        for k, v in fields.items():
            setattr(m, k, v)
        return m

    try:
        # what the official example does: one message, a tag and a key, priority 0..9
        msg = rmq.Message()
        msg.topic = topic
        msg.body = b"hello, rocketmq."
        msg.tag = "tag"
        msg.keys = "keys"
        for i in range(LEVELS):
            msg.priority = i
            producer.send(msg)
        out["to_normal"] = _outcome(lambda: producer.send(message(normal_topic, priority=1)))
        out["plain_to_priority"] = _outcome(lambda: producer.send(message(topic)))
        out["negative"] = _outcome(lambda: message(topic, priority=-1))
        out["with_group"] = _outcome(lambda: message(topic, message_group="g", priority=1))
    finally:
        producer.shutdown()
    consumer = rmq.SimpleConsumer(
        cfg, "py-g-prio", {topic: rmq.FilterExpression("*")}, await_duration=1
    )
    consumer.startup()
    got: list[int] = []
    deadline = time.time() + 20
    try:
        while len(got) < LEVELS and time.time() < deadline:
            for m in consumer.receive(16, 20):
                got.append(m.priority)
                consumer.ack(m)
    finally:
        consumer.shutdown()
    out["received"] = got

    # a push consumer (one consumption thread) of another group: the same backlog,
    # in the same order (its receives are POPs too)
    pushed: list[int] = []

    class Listener(rmq.MessageListener):  # type: ignore[misc]
        def consume(self, message: Any) -> Any:
            pushed.append(message.priority)
            return rmq.ConsumeResult.SUCCESS

    push = rmq.PushConsumer(
        cfg,
        "py-g-prio-push",
        Listener(),
        {topic: rmq.FilterExpression("*")},
        consumption_thread_count=1,
    )
    push.startup()
    deadline = time.time() + 20
    try:
        while len(pushed) < LEVELS and time.time() < deadline:
            time.sleep(0.05)
    finally:
        push.shutdown()
    out["pushed"] = pushed
    return out


if __name__ == "__main__":
    result = scenario_python(**json.loads(sys.argv[1]))
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)  # the SDK's non-daemon threads must not keep the child alive


# --------------------------------------------------------------------------------------
# the tests
# --------------------------------------------------------------------------------------

from special_helpers import acting, create_topic_on, masters_online  # noqa: E402

from ha_controller.client.admin import NameserverClient  # noqa: E402
from ha_controller.client.message import Message  # noqa: E402
from ha_controller.client.producer import Producer  # noqa: E402
from ha_controller.client.simple_consumer import SimpleConsumer  # noqa: E402
from ha_controller.proto import broker_pb2, common_pb2  # noqa: E402
from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2  # noqa: E402
from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s  # noqa: E402
from ha_controller.proto.rocketmq.v2 import service_pb2_grpc  # noqa: E402
from ha_controller.protocol.codes import RequestCode  # noqa: E402
from ha_controller.protocol.errors import MessageTypeConflict  # noqa: E402
from ha_controller.rpc import ConnectionPool  # noqa: E402
from ha_controller.testing import (  # noqa: E402
    Cluster,
    ProcessHandle,
    eventually,
    run_cluster,
)

grpc = pytest.importorskip("grpc")
pytestmark = pytest.mark.timeout(120)

#: (priority, sent index) in the order sent: levels interleaved, 12 above the highest
SENDS = [(1, 0), (5, 1), (3, 2), (5, 3), (12, 4), (0, 5), (3, 6), (1, 7)]


def expected_order(sends: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Highest level first (12 is level 9), the order sent within a level."""
    return sorted(sends, key=lambda s: (-min(s[0], LEVELS - 1), s[1]))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, ProcessHandle]]:
    # two groups: an acting slave's POP checkpoints go to a live master of another
    # group; the topics live on "prio" only, so that one broker orders every pop
    c = run_cluster(
        ("prio", "prio-b"),
        2,
        workdir=tmp_path_factory.mktemp("prio"),
        env={"HAC_POP_REVIVE_INTERVAL_MS": "200"},
    )
    proxy = None
    try:
        asyncio.run(create_topics(c))
        # a receive may ask for 1 s (RocketMQ's least is 10 s): the redelivery test
        proxy = c.run_proxy(
            "--long-polling-timeout-s", "5", env={"HAC_RECEIVE_MIN_INVISIBLE_MS": "1000"}
        )
        yield c, proxy
    finally:
        if proxy is not None:
            proxy.stop()
        c.stop()


async def create_topics(c: Cluster) -> None:
    await masters_online(c.namesrv, ["prio", "prio-b"])
    for topic, kind in TOPICS.items():
        await create_topic_on(c.broker("prio", 0).rpc, topic, LEVELS, message_type=kind)

    async def routed() -> bool:
        async with NameserverClient([c.namesrv]) as ns:
            for topic in TOPICS:
                await ns.route(topic)
        return True

    await eventually(routed, timeout=20)


async def send_levels(c: Cluster, topic: str) -> None:
    async with Producer(c.namesrv, "prio-producer", topics=[topic]) as producer:
        for priority, i in SENDS:
            receipt = await producer.send(
                Message(topic, f"{priority}-{i}".encode(), priority=priority)
            )
            assert receipt.queue_id == min(priority, LEVELS - 1)  # the level, not the pick


async def receive_levels(c: Cluster, topic: str, group: str) -> list[tuple[int, int]]:
    got: list[tuple[int, int]] = []
    async with SimpleConsumer(c.namesrv, group, [topic]) as consumer:

        async def step() -> bool:
            for m in await consumer.receive(1, wait_s=0.5):  # one at a time: each pop's pick
                priority, i = m.body.decode().split("-")
                assert m.priority == int(priority)
                got.append((int(priority), int(i)))
                await consumer.ack(m)
            return len(got) >= len(SENDS)

        await eventually(step, timeout=20, interval=0.01)
    return got


async def test_our_sdk_gets_the_highest_priority_first(cluster: Any) -> None:
    c, _ = cluster
    await send_levels(c, TOPIC)
    assert await receive_levels(c, TOPIC, "g-prio") == expected_order(SENDS)
    async with Producer(c.namesrv, "prio-producer", topics=[TOPIC]) as producer:
        with pytest.raises(MessageTypeConflict):  # a priority for a NORMAL topic
            await producer.send(Message(TOPIC_NORMAL, b"x", priority=1))
        with pytest.raises(MessageTypeConflict):  # a plain message for a PRIORITY topic
            await producer.send(Message(TOPIC, b"x"))
        with pytest.raises(ValueError, match="one priority"):
            await producer.send_batch([Message(TOPIC, b"x", priority=p) for p in (1, 2)])


SDK_MISSING = importlib.util.find_spec("rocketmq") is None


@pytest.mark.skipif(SDK_MISSING, reason="rocketmq-python-client is not installed")
def test_official_python_sdk_priority_example(cluster: Any) -> None:
    _, proxy = cluster
    args = {"proxy": proxy.rpc, "topic": TOPIC_PY, "normal_topic": TOPIC_NORMAL}
    proc = subprocess.run(
        [sys.executable, str(HERE), json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[0][len("RESULT ") :])
    assert out["received"] == list(range(LEVELS - 1, -1, -1))
    assert out["pushed"] == list(range(LEVELS - 1, -1, -1))
    # the SDK refuses these itself (the route's queues accept PRIORITY only; the gateway
    # would answer MESSAGE_PROPERTY_CONFLICT_WITH_TYPE: test_message_rules)
    assert out["to_normal"]["ok"] is False, out
    assert out["plain_to_priority"]["ok"] is False, out
    assert out["negative"]["ok"] is False, out
    assert out["with_group"]["ok"] is False, out


NODE_SDK = Path(os.environ.get("HAC_NODE_SDK_DIR", ROOT / ".venv" / "sdk-node")) / "node_modules"
NODE_MISSING = shutil.which("node") is None or not (NODE_SDK / "rocketmq-client-nodejs").exists()


@pytest.mark.skipif(NODE_MISSING, reason="node or rocketmq-client-nodejs is not installed")
def test_node_sdk_priority(cluster: Any) -> None:
    _, proxy = cluster
    args = {"proxy": proxy.rpc, "topic": TOPIC_NODE, "normal_topic": TOPIC_NORMAL}
    proc = subprocess.run(
        ["node", str(ROOT / "tests" / "sdk_node" / "scenarios.js"), "priority", json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        env={**os.environ, "NODE_PATH": str(NODE_SDK)},
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[0][len("RESULT ") :])
    # the example's levels 1, 5, 10, 100 (10 and 100 both level 9: in the order sent)
    assert out["received"] == ["p10", "p100", "p5", "p1a", "p1b"], out
    for case in ("to_normal", "plain_to_priority", "negative", "with_group", "zero"):
        assert out[case]["ok"] is False, (case, out)


async def _receive(stub: Any, group: str, topic: str, invisible_ms: int) -> list[str]:
    """One v2 ReceiveMessage through the gateway: the bodies, in the order given."""
    request = v2s.ReceiveMessageRequest(
        group=v2.Resource(name=group),
        message_queue=v2.MessageQueue(
            topic=v2.Resource(name=topic), id=-1, broker=v2.Broker(name="prio")
        ),
        batch_size=16,
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
    )
    request.long_polling_timeout.FromMilliseconds(1000)
    request.invisible_duration.FromMilliseconds(invisible_ms)
    return [
        r.message.body.decode()
        async for r in stub.ReceiveMessage(request, timeout=10)
        if r.WhichOneof("content") == "message"
    ]


async def test_the_gateway_redelivers_after_the_levels(cluster: Any) -> None:
    """A PRIORITY topic's redelivered message comes after the fresh ones (RocketMQ's
    default, popFromRetryProbabilityForPriority 0), not first as for other topics."""
    c, proxy = cluster
    group = "g-prio-retry"
    async with Producer(c.namesrv, "prio-producer", topics=[TOPIC_RETRY]) as producer:
        await producer.send(Message(TOPIC_RETRY, b"old", priority=9))
        async with grpc.aio.insecure_channel(proxy.rpc) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            assert await _receive(stub, group, TOPIC_RETRY, 1000) == ["old"]  # not acked

            async def revived() -> bool:
                async with NameserverClient([c.namesrv]) as ns:
                    route = await ns.route(f"%RETRY%{group}")
                    return sum(q.max_offset for q in await ns.queue_offsets(route)) == 1

            await eventually(revived, timeout=15, interval=0.1)
            for body, priority in (("new0", 0), ("new5", 5)):
                await producer.send(Message(TOPIC_RETRY, body.encode(), priority=priority))
            got: list[str] = []

            async def all_three() -> bool:
                got.extend(await _receive(stub, group, TOPIC_RETRY, 10_000))
                return len(got) >= 3

            await eventually(all_three, timeout=15)
            assert got == ["new5", "new0", "old"]


def _v2_send(topic: str, n: int, **sp: Any) -> v2s.SendMessageRequest:
    m = v2.Message(topic=v2.Resource(name=topic), body=b"x")
    m.system_properties.message_id = f"01PRIO{n:010d}"
    for name, value in sp.items():
        setattr(m.system_properties, name, value)
    return v2s.SendMessageRequest(messages=[m])


async def test_the_gateway_answers_rocketmqs_codes(cluster: Any) -> None:
    """What the SDKs refuse themselves, sent raw: the gateway's answer to each."""
    _, proxy = cluster
    cases: dict[str, tuple[dict[str, Any], int]] = {
        "priority": (dict(message_type=v2.PRIORITY, priority=3), v2.OK),
        "declared_normal": (dict(message_type=v2.NORMAL, priority=0), v2.OK),  # Node.js 1.0.8
        "no_priority": (dict(message_type=v2.PRIORITY), v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        "plain": (dict(message_type=v2.NORMAL), v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        "negative": (dict(message_type=v2.PRIORITY, priority=-1), v2.BAD_REQUEST),
    }
    async with grpc.aio.insecure_channel(proxy.rpc) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        got = {}
        for n, (case, (fields, _)) in enumerate(cases.items()):
            resp = await stub.SendMessage(_v2_send(TOPIC_RAW, n, **fields), timeout=10)
            got[case] = resp.status.code
        to_normal = _v2_send(TOPIC_NORMAL, 99, message_type=v2.PRIORITY, priority=1)
        got["to_normal"] = (await stub.SendMessage(to_normal, timeout=10)).status.code
    want = {case: code for case, (_, code) in cases.items()}
    assert got == {**want, "to_normal": v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE}


async def slave_knows(addr: str, topic: str, kind: str) -> None:
    """Wait until the slave at ``addr`` synced ``topic``'s type from its master."""

    async def ok() -> bool:
        async with ConnectionPool() as pool:
            table = await pool.call_pb(
                addr,
                RequestCode.GET_ALL_TOPIC_CONFIG,
                common_pb2.Empty(),
                broker_pb2.TopicConfigTable,
            )
        return any(t.topic_name == topic and t.message_type == kind for t in table.topics)

    await eventually(ok, timeout=20, interval=0.2)


async def test_an_acting_slave_pops_the_highest_priority_first(cluster: Any) -> None:
    c, _ = cluster
    slave = c.broker("prio", 1).rpc
    await send_levels(c, TOPIC_ACTING)
    await slave_knows(slave, TOPIC_ACTING, "PRIORITY")
    c.broker("prio", 0).kill()
    await acting(c.namesrv, "prio", slave, TOPIC_ACTING)
    assert await receive_levels(c, TOPIC_ACTING, "g-prio-acting") == expected_order(SENDS)
