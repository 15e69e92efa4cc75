"""The official RocketMQ 5 Python SDK (rocketmq-python-client, gRPC v2) against
``hactl proxy`` in front of a two-group cluster (master + slave each).

The SDK runs in a child process (this file, run as a script): its generated
protobuf modules register the package ``apache.rocketmq.v2`` in the default
descriptor pool, as ours do, so the two must never be imported by one process;
a child process also keeps the SDK's threads away from pytest.  Each scenario
prints one JSON object, which the test checks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
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

TOPIC_NORMAL = "v2-normal"
TOPIC_FIFO = "v2-fifo"
TOPIC_DELAY = "v2-delay"
TOPIC_TX = "v2-tx"
TOPIC_HA = "v2-ha"
TOPIC_AFTER = "v2-after-kill"
FIFO_GROUP = "g-fifo"


# --------------------------------------------------------------------------------------
# the child process: rocketmq-python-client only (never ha_controller's v2 protos)
# --------------------------------------------------------------------------------------


def _sdk() -> Any:
    import logging

    import rocketmq

    logging.getLogger("rocketmq").setLevel(logging.WARNING)
    return rocketmq


def _message(rmq: Any, topic: str, body: bytes, **fields: Any) -> Any:
    m = rmq.Message()
    m.topic = topic
    m.body = body
    for k, v in fields.items():
        setattr(m, k, v)
    return m


def _drain_simple(
    rmq: Any,
    cfg: Any,
    group: str,
    topics: list[str],
    want: int,
    timeout: float,
    await_duration: int = 1,
) -> list[dict[str, Any]]:
    sub = {t: rmq.FilterExpression("*") for t in topics}
    consumer = rmq.SimpleConsumer(cfg, group, sub, await_duration=await_duration)
    consumer.startup()
    got: list[dict[str, Any]] = []
    deadline = time.time() + timeout
    try:
        while len(got) < want and time.time() < deadline:
            for msg in consumer.receive(16, 20):
                got.append(
                    {
                        "id": msg.message_id,
                        "topic": msg.topic,
                        "body": msg.body.decode(),
                        "tag": msg.tag,
                        "received_ms": int(time.time() * 1000),
                        "delivery_ms": msg.delivery_timestamp,
                    }
                )
                consumer.ack(msg)
    finally:
        consumer.shutdown()
    return got


def scenario_types(proxy: str) -> dict[str, Any]:
    """Normal, FIFO, delayed and transactional messages; SimpleConsumer and PushConsumer."""
    rmq = _sdk()
    cfg = rmq.ClientConfiguration(proxy, rmq.Credentials())
    out: dict[str, Any] = {}

    class Checker(rmq.TransactionChecker):  # type: ignore[misc,name-defined]
        checked: list[str] = []

        def check(self, message: Any) -> Any:
            Checker.checked.append(message.body.decode())
            return rmq.TransactionResolution.COMMIT

    delay_arrivals: list[tuple[str, int]] = []

    class DelayListener(rmq.MessageListener):  # type: ignore[misc,name-defined]
        def consume(self, message: Any) -> Any:
            delay_arrivals.append((message.message_id, int(time.time() * 1000)))
            return rmq.ConsumeResult.SUCCESS

    # a push consumer long-polls every group at once: it sees the delayed message
    # as soon as the broker delivers it (a simple consumer visits one group per call)
    delay_watch = rmq.PushConsumer(
        cfg, "g-delay", DelayListener(), {TOPIC_DELAY: rmq.FilterExpression("*")}
    )
    delay_watch.startup()
    producer = rmq.Producer(cfg, (TOPIC_NORMAL, TOPIC_FIFO, TOPIC_DELAY, TOPIC_TX), Checker())
    producer.startup()
    try:
        normal = [
            producer.send(_message(rmq, TOPIC_NORMAL, f"n{i}".encode(), tag="A")).message_id
            for i in range(20)
        ]
        fifo_sent = []
        for seq in range(10):
            for g in ("ga", "gb", "gc"):
                producer.send(_message(rmq, TOPIC_FIFO, f"{g}:{seq}".encode(), message_group=g))
                fifo_sent.append(f"{g}:{seq}")
        due_s = int(time.time()) + 3  # the SDK sends whole seconds
        delayed = producer.send(
            _message(rmq, TOPIC_DELAY, b"later", delivery_timestamp=due_s)
        ).message_id
        tx = producer.begin_transaction()
        producer.send(_message(rmq, TOPIC_TX, b"tx-commit"), tx)
        tx.commit()
        tx = producer.begin_transaction()
        producer.send(_message(rmq, TOPIC_TX, b"tx-rollback"), tx)
        tx.rollback()
        tx = producer.begin_transaction()  # orphaned: the broker's check asks Checker
        producer.send(_message(rmq, TOPIC_TX, b"tx-checked"), tx)
        out["sent"] = {
            "normal": normal,
            "fifo": fifo_sent,
            "delayed": delayed,
            "due_ms": due_s * 1000,
        }

        # one simple consumer per topic: a simple consumer visits one topic and one
        # group per receive(), so a late message on a shared consumer waits its turn
        got = []
        for topic, want in ((TOPIC_NORMAL, 20), (TOPIC_TX, 2), (TOPIC_DELAY, 1)):
            got += _drain_simple(rmq, cfg, "g-simple", [topic], want, 20)
        out["simple"] = got
        out["checked"] = list(Checker.checked)

        # PushConsumer: FIFO group on the FIFO topic, and a plain group on the normal topic
        consumed: dict[str, list[str]] = {"fifo": [], "normal": []}
        lock = threading.Lock()

        class Listener(rmq.MessageListener):  # type: ignore[misc,name-defined]
            def __init__(self, key: str) -> None:
                self.key = key

            def consume(self, message: Any) -> Any:
                with lock:
                    consumed[self.key].append(message.body.decode())
                return rmq.ConsumeResult.SUCCESS

        pushers = [
            rmq.PushConsumer(
                cfg, FIFO_GROUP, Listener("fifo"), {TOPIC_FIFO: rmq.FilterExpression("*")}
            ),
            rmq.PushConsumer(
                cfg, "g-push", Listener("normal"), {TOPIC_NORMAL: rmq.FilterExpression("*")}
            ),
        ]
        for p in pushers:
            p.startup()
        deadline = time.time() + 25
        while time.time() < deadline:
            with lock:
                if len(consumed["fifo"]) >= 30 and len(consumed["normal"]) >= 20:
                    break
            time.sleep(0.1)
        for p in pushers:
            p.shutdown()
        out["push"] = consumed
        out["push_fifo_setting"] = pushers[0].fifo
        out["delay_arrivals"] = list(delay_arrivals)
    finally:
        producer.shutdown()
        delay_watch.shutdown()
    return out


def scenario_failover(proxy: str, master_pid: int) -> dict[str, Any]:
    """Produce and push-consume while one group's master is killed -9."""
    rmq = _sdk()
    cfg = rmq.ClientConfiguration(proxy, rmq.Credentials())
    received: set[str] = set()
    lock = threading.Lock()

    class Listener(rmq.MessageListener):  # type: ignore[misc,name-defined]
        def consume(self, message: Any) -> Any:
            with lock:
                received.add(message.body.decode())
            return rmq.ConsumeResult.SUCCESS

    consumer = rmq.PushConsumer(cfg, "g-ha", Listener(), {TOPIC_HA: rmq.FilterExpression("*")})
    consumer.startup()
    producer = rmq.Producer(cfg, (TOPIC_HA,))
    producer.startup()
    acked: list[str] = []
    failed: list[str] = []
    per_queue: dict[str, int] = {}
    killed_at = -1
    try:
        for i in range(240):
            if i == 80:
                os.kill(master_pid, signal.SIGKILL)
                killed_at = i
            body = f"ha-{i}"
            try:
                r = producer.send(_message(rmq, TOPIC_HA, body.encode()))
                acked.append(body)
                per_queue[str(r.message_queue)] = per_queue.get(str(r.message_queue), 0) + 1
            except Exception as exc:  # the SDK's exceptions; report, keep going
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
        missing = sorted(set(acked) - received)
    return {"acked": len(acked), "failed": failed, "missing": missing, "killed_at": killed_at}


def scenario_simple_after_kill(proxy: str, master_pid: int) -> dict[str, Any]:
    """300 messages acknowledged across a kill -9 of one group's master, then a new
    SimpleConsumer group reads them (issue 34, item 7: the killed group's messages came
    60-160 s late, some not within 90 s)."""
    rmq = _sdk()
    cfg = rmq.ClientConfiguration(proxy, rmq.Credentials())
    producer = rmq.Producer(cfg, (TOPIC_AFTER,))
    producer.startup()
    acked: list[str] = []
    try:
        for i in range(300):
            if i == 100:
                os.kill(master_pid, signal.SIGKILL)
            body = f"k-{i}"
            try:
                producer.send(_message(rmq, TOPIC_AFTER, body.encode()))
                acked.append(body)
            except Exception:  # report by omission: only acknowledged ones count
                pass
            time.sleep(0.01)
    finally:
        producer.shutdown()
    started = time.time()
    # as a new user would: the SDK's default long poll (20 s)
    got = _drain_simple(rmq, cfg, "g-after-kill", [TOPIC_AFTER], len(acked), 60, 20)
    arrival = {m["body"]: m["received_ms"] / 1000 - started for m in got}
    return {
        "acked": acked,
        "missing": sorted(set(acked) - set(arrival)),
        "twice": len(got) - len(arrival),
        "slowest_s": max(arrival.values(), default=0.0),
    }


def _child_main() -> None:
    name, args = sys.argv[1], json.loads(sys.argv[2])
    result = {
        "types": scenario_types,
        "failover": scenario_failover,
        "simple_after_kill": scenario_simple_after_kill,
    }[name](**args)
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)  # the SDK's non-daemon threads must not keep the child alive


if __name__ == "__main__":
    _child_main()


# --------------------------------------------------------------------------------------
# the tests
# --------------------------------------------------------------------------------------

pytestmark = pytest.mark.skipif(
    SDK_MISSING,
    reason="rocketmq-python-client is not installed (pip install rocketmq-python-client==5.1.2)",
)


def run_sdk(scenario: str, timeout: float, **args: Any) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(HERE), scenario, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    raise AssertionError(
        f"SDK scenario {scenario} exited {proc.returncode} without a result:\n"
        + proc.stdout[-3000:]
        + proc.stderr[-3000:]
    )


@pytest.fixture(scope="module")
def grpc_cluster() -> Iterator[Any]:
    from ha_controller.testing import ProcessHandle, _base_env, hactl_argv, run_cluster

    env = {
        "HAC_TRANSACTION_TIMEOUT_MS": "1000",
        "HAC_TRANSACTION_CHECK_INTERVAL_MS": "500",
    }
    cluster = run_cluster(("broker-a", "broker-b"), 2, env=env)
    ready = cluster.workdir / "proxy.ready.json"
    proxy = ProcessHandle(
        name="proxy",
        argv=hactl_argv(
            "proxy",
            "--namesrv",
            cluster.namesrv,
            "--listen",
            "127.0.0.1:0",
            "--ready-file",
            str(ready),
            "--fifo-groups",
            FIFO_GROUP,
            "--long-polling-timeout-s",
            "5",
        ),
        env=_base_env(None),
        workdir=cluster.workdir,
        ready_file=ready,
        log_path=cluster.workdir / "proxy.log",
    )
    try:
        proxy.start()
        for topic in (TOPIC_NORMAL, TOPIC_FIFO, TOPIC_DELAY, TOPIC_TX, TOPIC_HA, TOPIC_AFTER):
            subprocess.run(
                hactl_argv("topic", "create", topic, "--namesrv", cluster.namesrv, "--queues", "4"),
                check=True,
                capture_output=True,
                timeout=20,
            )
        yield cluster, proxy
    finally:
        proxy.stop()
        cluster.stop()


def test_official_sdk_message_types(grpc_cluster: Any) -> None:
    _, proxy = grpc_cluster
    out = run_sdk("types", 90, proxy=proxy.rpc)
    sent = out["sent"]
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for m in out["simple"]:
        by_topic.setdefault(m["topic"], []).append(m)

    # normal: every message once, tag kept
    normal = by_topic.get(TOPIC_NORMAL, [])
    assert sorted(m["id"] for m in normal) == sorted(sent["normal"])
    assert {m["tag"] for m in normal} == {"A"}

    # push consumers: the plain group got the normal topic, the FIFO group kept order
    push = out["push"]
    assert sorted(push["normal"]) == sorted(f"n{i}" for i in range(20))
    assert out["push_fifo_setting"] is True
    assert sorted(push["fifo"]) == sorted(sent["fifo"])
    for g in ("ga", "gb", "gc"):
        seqs = [int(b.split(":")[1]) for b in push["fifo"] if b.startswith(g + ":")]
        assert seqs == sorted(seqs), f"message group {g} out of order: {seqs}"

    # transactions: the commit and the checker's commit are delivered once, the rollback never
    tx = sorted(m["body"] for m in by_topic.get(TOPIC_TX, []))
    assert tx == ["tx-checked", "tx-commit"], out["checked"]
    assert "tx-checked" in out["checked"]

    # delayed: received (and acked) by the simple consumer, and seen by a push
    # consumer at its delivery time, +-1 s
    delayed = by_topic.get(TOPIC_DELAY, [])
    assert [m["id"] for m in delayed] == [sent["delayed"]]
    arrivals = [t for mid, t in out["delay_arrivals"] if mid == sent["delayed"]]
    assert len(arrivals) == 1, out["delay_arrivals"]
    assert abs(arrivals[0] - sent["due_ms"]) <= 1000, arrivals[0] - sent["due_ms"]


def test_official_sdk_survives_master_kill(grpc_cluster: Any) -> None:
    cluster, proxy = grpc_cluster
    master = cluster.broker("broker-a", 0)
    out = run_sdk("failover", 90, proxy=proxy.rpc, master_pid=master.pid)
    master.proc.wait(10)  # reap the killed master
    assert out["killed_at"] == 80
    assert out["failed"] == [], out["failed"][:5]
    assert out["acked"] == 240
    assert out["missing"] == [], f"{len(out['missing'])} acknowledged messages never consumed"


#: how soon after it starts a new consumer must have every acknowledged message of a
#: group whose master was killed (served by its acting slave)
AFTER_KILL_BOUND_S = 15.0


def test_official_sdk_simple_consumer_reads_a_killed_groups_messages(grpc_cluster: Any) -> None:
    cluster, proxy = grpc_cluster
    master = cluster.broker("broker-a", 0)
    if not master.alive():
        master = cluster.restart("broker-a", 0)
    out = run_sdk("simple_after_kill", 120, proxy=proxy.rpc, master_pid=master.pid)
    master.proc.wait(10)
    assert len(out["acked"]) >= 280, len(out["acked"])
    assert out["missing"] == [], f"{len(out['missing'])} acknowledged messages never received"
    assert out["twice"] == 0
    assert out["slowest_s"] < AFTER_KILL_BOUND_S, out["slowest_s"]
