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
TOPIC_RULES = "v2-rules"
TOPIC_RULES_FIFO = "v2-rules-fifo"
TOPIC_RULES_DELAY = "v2-rules-delay"
TOPIC_RULES_TX = "v2-rules-tx"
TOPIC_RULES_ORDER = "v2-rules-order"
TOPIC_TX50 = "v2-tx50"
TOPIC_SWITCH = "v2-switch"
TOPIC_SQL = "v2-sql92"
SWITCH_GROUP = "g-switch"
FIFO_GROUP = "g-fifo"
#: set orderly as `hactl group update G --orderly` does (create_typed_topics)
ORDERLY_GROUP = "g-rules-orderly"
#: topic -> its message type (as `hactl topic create --message-type`)
TOPICS = {
    TOPIC_NORMAL: "NORMAL",
    TOPIC_FIFO: "FIFO",
    TOPIC_DELAY: "DELAY",
    TOPIC_TX: "TRANSACTION",
    TOPIC_HA: "NORMAL",
    TOPIC_AFTER: "NORMAL",
    TOPIC_RULES: "NORMAL",
    TOPIC_RULES_FIFO: "FIFO",
    TOPIC_RULES_DELAY: "DELAY",
    TOPIC_RULES_TX: "TRANSACTION",
    TOPIC_RULES_ORDER: "FIFO",
    TOPIC_TX50: "TRANSACTION",
    TOPIC_SWITCH: "FIFO",
    TOPIC_SQL: "NORMAL",
}
KB = 1024
MIB = 1024 * 1024


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
    for key in fields.pop("keys", ()):
        m.keys = key  # the SDK's setter adds one key
    for name, value in fields.pop("properties", {}).items():
        m.add_property(name, value)
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


def _outcome(fn: Any) -> dict[str, Any]:
    """What a call of the SDK came to: ok, or the error and its v2 code (None when the
    SDK refused it itself)."""
    try:
        value = fn()
    except Exception as exc:  # the SDK's exceptions: the outcome is the point
        return {"ok": False, "code": getattr(exc, "code", None), "error": str(exc)[:300]}
    return {"ok": True, "value": value}


def scenario_rules(proxy: str) -> dict[str, Any]:
    """RocketMQ's end-to-end cases for its 5.x clients (apache/rocketmq-e2e: MessageKey,
    MessageTag, MessageUserProperty, NormalMessageSize, SimpleConsumerInit,
    ConsumerGroup, topic types), each an outcome for the test to check against what
    RocketMQ does; and an orderly group's redelivery, which must count its attempt."""
    rmq = _sdk()
    cfg = rmq.ClientConfiguration(proxy, rmq.Credentials())
    out: dict[str, Any] = {}

    class Commit(rmq.TransactionChecker):  # type: ignore[misc,name-defined]
        def check(self, message: Any) -> Any:
            return rmq.TransactionResolution.COMMIT

    # an orderly group's batch, not acked: it comes again once its invisible time (10 s,
    # the least a receive may ask) is over, with its delivery attempt counted
    orderly = rmq.SimpleConsumer(
        cfg, ORDERLY_GROUP, {TOPIC_RULES_ORDER: rmq.FilterExpression("*")}, await_duration=5
    )
    orderly.startup()
    producer = rmq.Producer(cfg, (TOPIC_RULES,), Commit())
    producer.startup()
    try:
        first = producer.send(_message(rmq, TOPIC_RULES_ORDER, b"ordered", message_group="og"))
        got = orderly.receive(1, 10)
        started = time.time()
        out["orderly_first"] = [(m.message_id, m.delivery_attempt) for m in got]
        out["orderly_sent"] = first.message_id

        def send(topic: str, body: bytes = b"x" * 64, **fields: Any) -> Any:
            receipt = producer.send(_message(rmq, topic, body, **fields))
            return [receipt.message_id, receipt.transaction_id]

        def send_tx(topic: str, body: bytes) -> Any:
            tx = producer.begin_transaction()
            receipt = producer.send(_message(rmq, topic, body), tx)
            tx.commit()
            return receipt.message_id

        big = b"b" * (4 * MIB)
        props16k = {"k" * (8 * KB): "v" * (8 * KB)}
        cases: dict[str, Any] = {
            # MessageKeyTest
            "key_16kb": lambda: send(TOPIC_RULES, keys=["k" * (16 * KB)]),
            "key_over_16kb": lambda: send(TOPIC_RULES, keys=["k" * (16 * KB + 1)]),
            "key_control": lambda: send(TOPIC_RULES, keys=["\u0000"]),
            "key_chinese": lambda: send(TOPIC_RULES, keys=["中文字符"]),
            # MessageTagTest
            "tag_16kb": lambda: send(TOPIC_RULES, tag="t" * (16 * KB)),
            "tag_over_16kb": lambda: send(TOPIC_RULES, tag="t" * (16 * KB + 1)),
            "tag_control": lambda: send(TOPIC_RULES, tag="\u0000"),
            "tag_bar": lambda: send(TOPIC_RULES, tag="a|b"),
            # MessageUserPropertyTest
            "props_128": lambda: send(TOPIC_RULES, properties={str(i): "ab" for i in range(128)}),
            "props_129": lambda: send(TOPIC_RULES, properties={str(i): "ab" for i in range(129)}),
            "props_16kb": lambda: send(TOPIC_RULES, properties=props16k),
            "props_over_16kb": lambda: send(
                TOPIC_RULES, properties={"k" * (8 * KB): "v" * (8 * KB + 1)}
            ),
            "props_control": lambda: send(TOPIC_RULES, properties={"\u0000": "value"}),
            "props_system_key": lambda: send(TOPIC_RULES, properties={"UNIQ_KEY": "value"}),
            "props_key_tag_16kb_4mib": lambda: send(
                TOPIC_RULES,
                big,
                properties={"p" * (4 * KB): "v" * (4 * KB)},
                tag="t" * (4 * KB),
                keys=["m" * (4 * KB)],
            ),
            "props_key_tag_over_16kb": lambda: send(
                TOPIC_RULES,
                properties={"p" * (4 * KB): "v" * (4 * KB)},
                tag="t" * (4 * KB),
                keys=["m" * (4 * KB + 1)],
            ),
            # NormalMessageSizeTest: 4 MiB bodies are taken, 4 MiB + 1 is not
            "normal_4mib": lambda: send(TOPIC_RULES, big),
            "normal_4mib_16kb_props": lambda: send(TOPIC_RULES, big, properties=props16k),
            "normal_over_4mib": lambda: send(TOPIC_RULES, big + b"b"),
            "fifo_4mib": lambda: send(TOPIC_RULES_FIFO, big, message_group="size"),
            "fifo_4mib_16kb_props": lambda: send(
                TOPIC_RULES_FIFO, big, message_group="size", properties=props16k
            ),
            "delay_4mib": lambda: send(
                TOPIC_RULES_DELAY, big, delivery_timestamp=int(time.time()) + 2
            ),
            "tx_4mib": lambda: send_tx(TOPIC_RULES_TX, big),
            # delivery time at most a day ahead
            "delay_over_24h": lambda: send(
                TOPIC_RULES_DELAY, delivery_timestamp=int(time.time()) + 25 * 3600
            ),
            # topic message types (the SDK checks the queues' accepted types itself)
            "fifo_to_normal": lambda: send(TOPIC_RULES, message_group="g"),
            "delay_to_normal": lambda: send(TOPIC_RULES, delivery_timestamp=int(time.time()) + 2),
            "tx_to_normal": lambda: send_tx(TOPIC_RULES, b"tx"),
            "normal_to_fifo": lambda: send(TOPIC_RULES_FIFO),
        }
        out["send"] = {name: _outcome(fn) for name, fn in cases.items()}

        # SimpleConsumerInitTest, ConsumerGroupTest
        consumer = rmq.SimpleConsumer(
            cfg, "g-rules", {TOPIC_RULES: rmq.FilterExpression("*")}, await_duration=1
        )
        consumer.startup()
        builtin = rmq.SimpleConsumer(
            cfg, "DEFAULT_CONSUMER", {TOPIC_RULES: rmq.FilterExpression("*")}, await_duration=1
        )
        builtin.startup()
        try:
            out["receive"] = {
                "invisible_9s": _outcome(lambda: len(consumer.receive(1, 9))),
                "invisible_over_12h": _outcome(lambda: len(consumer.receive(1, 12 * 3600 + 1))),
                "invisible_10s": _outcome(lambda: len(consumer.receive(1, 10))),
                "default_consumer": _outcome(lambda: len(builtin.receive(1, 10))),
            }
        finally:
            consumer.shutdown()
            builtin.shutdown()

        time.sleep(max(0.0, started + 11 - time.time()))
        again = orderly.receive(16, 10)
        out["orderly_again"] = [(m.message_id, m.delivery_attempt) for m in again]
        for m in again:
            orderly.ack(m)
        # the message group as RocketMQ's proxy shows it, among the user properties
        out["orderly_properties"] = [dict(m.properties) for m in again]
    finally:
        producer.shutdown()
        orderly.shutdown()
    return out


def scenario_tx50(proxy: str) -> dict[str, Any]:
    """50 committed transactional messages through the gateway, received by a
    SimpleConsumer (RocketMQ's TransactionMessageTest: its checker answers ROLLBACK, so
    only the producer's own commits deliver).  Five commits come after the broker has
    checked their half messages (the cluster's transaction timeout is 1 s): the check's
    ROLLBACK came first, and the commit the producer was told succeeded was ignored."""
    rmq = _sdk()
    cfg = rmq.ClientConfiguration(proxy, rmq.Credentials())
    checked: list[str] = []

    class Rollback(rmq.TransactionChecker):  # type: ignore[misc,name-defined]
        def check(self, message: Any) -> Any:
            checked.append(message.body.decode())
            return rmq.TransactionResolution.ROLLBACK

    consumer = rmq.SimpleConsumer(
        cfg, "g-tx50", {TOPIC_TX50: rmq.FilterExpression("*")}, await_duration=5
    )
    consumer.startup()
    consumer.receive(32, 10)  # as the e2e cases do before they send (tryReceiveOnce)
    producer = rmq.Producer(cfg, (TOPIC_TX50,), Rollback())
    producer.startup()
    sent: list[str] = []
    late = []
    try:
        for i in range(50):
            tx = producer.begin_transaction()
            producer.send(_message(rmq, TOPIC_TX50, f"tx-{i}".encode()), tx)
            sent.append(f"tx-{i}")
            if i % 10 == 9:
                late.append(tx)  # committed once the broker has checked it
            else:
                tx.commit()
        time.sleep(3.0)  # three transaction timeouts: the checks have come and gone
        for tx in late:
            tx.commit()
        got: dict[str, float] = {}
        started = time.time()
        deadline = started + 30
        while len(got) < len(sent) and time.time() < deadline:
            for msg in consumer.receive(32, 20):
                got.setdefault(msg.body.decode(), time.time() - started)
                consumer.ack(msg)
    finally:
        producer.shutdown()
        consumer.shutdown()
    return {
        "sent": len(sent),
        "missing": sorted(set(sent) - set(got)),
        "unexpected": sorted(set(got) - set(sent)),
        "checked": sorted(checked),
        "slowest_s": max(got.values(), default=0.0),
    }


def scenario_switch(proxy: str, http: str, namesrv: str) -> dict[str, Any]:
    """A group consumed concurrently is switched to orderly (`hactl group update G
    --orderly`) and its consumer restarted at once: the new consumer must be told to
    consume FIFO (the SDK keeps the first answer for its whole life) and its message
    groups consumed in order.  The gateway here caches routes for 30 s."""
    import random
    import subprocess as sp

    from ha_controller.testing import eventually_sync, http_get

    def held_receives() -> float:
        _, body = http_get(http, "/metrics")
        for line in body.decode().splitlines():
            if line.startswith("hac_proxy_held_receives "):
                return float(line.split()[1])
        return 0.0

    rmq = _sdk()
    cfg = rmq.ClientConfiguration(proxy, rmq.Credentials())
    got: list[str] = []
    lock = threading.Lock()

    class Listener(rmq.MessageListener):  # type: ignore[misc,name-defined]
        def consume(self, message: Any) -> Any:
            time.sleep(random.random() / 50)  # jitter: a concurrent consumer reorders
            with lock:
                got.append(message.body.decode())
            return rmq.ConsumeResult.SUCCESS

    sub = {TOPIC_SWITCH: rmq.FilterExpression("*")}
    before = rmq.PushConsumer(cfg, SWITCH_GROUP, Listener(), sub)
    before.startup()
    fifo_before = before.fifo
    eventually_sync(lambda: held_receives() >= 1, timeout=30)  # its long polls are held
    sp.run(
        [
            *(sys.executable, "-m", "ha_controller.cli", "group", "update", SWITCH_GROUP),
            *("--orderly", "--namesrv", namesrv),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    before.shutdown()
    after = rmq.PushConsumer(cfg, SWITCH_GROUP, Listener(), sub)
    after.startup()
    producer = rmq.Producer(cfg, (TOPIC_SWITCH,))
    producer.startup()
    sent = []
    try:
        for i in range(40):
            body = f"{'ab'[i % 2]}:{i}"
            producer.send(_message(rmq, TOPIC_SWITCH, body.encode(), message_group="ab"[i % 2]))
            sent.append(body)
        deadline = time.time() + 40
        while time.time() < deadline:
            with lock:
                if len(got) >= len(sent):
                    break
            time.sleep(0.1)
    finally:
        producer.shutdown()
        after.shutdown()
    with lock:
        return {"sent": sent, "got": list(got), "fifo": [fifo_before, after.fifo]}


#: the SQL92 scenario's messages: n, region eu/us and tags A/B by n
SQL_N = 12
SQL_SIMPLE = "region = 'eu' AND n >= 4"  # n = 5, 7, 9, 11
SQL_PUSH = "TAGS = 'A' AND (n < 6 OR vip IS NOT NULL)"  # n = 0, 1, 4, 5 (no vip anywhere)


def scenario_sql92(proxy: str) -> dict[str, Any]:
    """SQL92 subscriptions (FilterType.SQL): a SimpleConsumer and a PushConsumer get only
    what their expressions select; a bad expression fails the receive, and a push
    consumer with one fails to start instead of receiving nothing."""
    rmq = _sdk()
    from rocketmq.grpc_protocol import FilterType

    cfg = rmq.ClientConfiguration(proxy, rmq.Credentials())
    out: dict[str, Any] = {}

    def sql(text: str) -> Any:
        return rmq.FilterExpression(text, FilterType.SQL)

    class Listener(rmq.MessageListener):  # type: ignore[misc,name-defined]
        got: list[int] = []

        def consume(self, message: Any) -> Any:
            Listener.got.append(int(message.properties["n"]))
            return rmq.ConsumeResult.SUCCESS

    # started first (it waits 10 s for settings that never come): in parallel
    bad_push: dict[str, Any] = {}

    def start_bad_push() -> None:
        consumer = rmq.PushConsumer(cfg, "g-sql-bad-push", Listener(), {TOPIC_SQL: sql("n >")})
        bad_push.update(_outcome(consumer.startup))
        consumer.shutdown()

    bad_thread = threading.Thread(target=start_bad_push, daemon=True)
    bad_thread.start()
    push = rmq.PushConsumer(cfg, "g-sql-push", Listener(), {TOPIC_SQL: sql(SQL_PUSH)})
    push.startup()
    simple = rmq.SimpleConsumer(cfg, "g-sql-simple", {TOPIC_SQL: sql(SQL_SIMPLE)}, 1)
    simple.startup()
    bad = rmq.SimpleConsumer(cfg, "g-sql-bad", {TOPIC_SQL: sql("region = 'eu")}, 1)
    bad.startup()
    producer = rmq.Producer(cfg, (TOPIC_SQL,))
    producer.startup()
    try:
        for i in range(SQL_N):
            properties = {"n": str(i), "region": ("us", "eu")[i % 2]}
            producer.send(
                _message(rmq, TOPIC_SQL, b"%d" % i, tag="AB"[i // 2 % 2], properties=properties)
            )
        got: list[int] = []
        deadline = time.time() + 20
        while len(got) < 4 and time.time() < deadline:
            for m in simple.receive(16, 10):
                got.append(int(m.properties["n"]))
                simple.ack(m)
        out["simple"] = sorted(got)
        out["simple_more"] = _outcome(lambda: len(simple.receive(16, 10)))
        out["bad_receive"] = _outcome(lambda: len(bad.receive(1, 10)))
        deadline = time.time() + 20
        while len(Listener.got) < 4 and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # nothing else may come
        out["push"] = sorted(Listener.got)
    finally:
        producer.shutdown()
        simple.shutdown()
        bad.shutdown()
        push.shutdown()
    bad_thread.join(20)
    out["bad_push"] = bad_push
    return out


def _child_main() -> None:
    from ha_controller.testing import scenario_main

    scenario_main(
        {
            "types": scenario_types,
            "failover": scenario_failover,
            "simple_after_kill": scenario_simple_after_kill,
            "rules": scenario_rules,
            "tx50": scenario_tx50,
            "switch": scenario_switch,
            "sql92": scenario_sql92,
        }
    )


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
    from ha_controller.testing import run_scenario

    argv = [sys.executable, str(HERE), scenario, json.dumps(args)]
    return run_scenario(argv, f"SDK scenario {scenario}", timeout)


@pytest.fixture(scope="module")
def grpc_cluster() -> Iterator[Any]:
    from ha_controller.testing import (
        ProcessHandle,
        _base_env,
        create_typed_topics,
        hactl_argv,
        run_cluster,
    )

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
        # in this process; hactl's --message-type: test_cli_tools, --orderly: the switch case
        create_typed_topics(cluster.namesrv, TOPICS, orderly_groups=(ORDERLY_GROUP,))
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


#: RocketMQ's answer to each case of the rules scenario: None = taken; a v2 code = refused
#: by the gateway with it; "sdk" = refused by the SDK itself before sending (as with
#: RocketMQ, whose proxy sends the same settings: max body size, message type check)
RULES_SEND = {
    "key_16kb": None,
    "key_over_16kb": 43101,  # MESSAGE_PROPERTIES_TOO_LARGE
    "key_control": 40005,  # ILLEGAL_MESSAGE_KEY
    "key_chinese": None,
    "tag_16kb": None,
    "tag_over_16kb": 43101,
    "tag_control": 40004,  # ILLEGAL_MESSAGE_TAG
    "tag_bar": "sdk",  # the SDK refuses "|" itself (the gateway: 40004)
    "props_128": None,
    "props_129": 43101,
    "props_16kb": None,
    "props_over_16kb": 43101,
    "props_control": 40007,  # ILLEGAL_MESSAGE_PROPERTY_KEY
    "props_system_key": 40007,
    "props_key_tag_16kb_4mib": None,
    "props_key_tag_over_16kb": 43101,
    "normal_4mib": None,
    "normal_4mib_16kb_props": None,
    "normal_over_4mib": "sdk",  # the settings' max body size (the gateway: 41301)
    "fifo_4mib": None,
    "fifo_4mib_16kb_props": None,
    "delay_4mib": None,
    "tx_4mib": None,
    "delay_over_24h": 40012,  # ILLEGAL_DELIVERY_TIME
    "fifo_to_normal": "sdk",  # the queue accepts NORMAL only (the gateway: 40014)
    "delay_to_normal": "sdk",
    "tx_to_normal": "sdk",
    "normal_to_fifo": "sdk",
}
RULES_RECEIVE = {
    "invisible_9s": 40011,  # ILLEGAL_INVISIBLE_TIME
    "invisible_over_12h": 40011,
    "invisible_10s": None,
    "default_consumer": 40003,  # ILLEGAL_CONSUMER_GROUP
}


def test_official_sdk_meets_rocketmqs_rules(grpc_cluster: Any) -> None:
    """RocketMQ 5's end-to-end cases through the official Python SDK: what RocketMQ
    takes is taken, what it refuses is refused with its proxy's code."""
    _, proxy = grpc_cluster
    from ha_controller.testing import unlike_rocketmq

    out = run_sdk("rules", 150, proxy=proxy.rpc)
    wrong = unlike_rocketmq(out["send"], RULES_SEND)
    wrong += unlike_rocketmq(out["receive"], RULES_RECEIVE)
    assert not wrong, "\n".join(wrong)
    # every send's transaction id is its message id, as RocketMQ's broker answers
    message_id, transaction_id = out["send"]["key_16kb"]["value"]
    assert transaction_id == message_id
    # an orderly group's batch that was not acked comes again, its attempt counted
    assert out["orderly_first"] == [[out["orderly_sent"], 1]]
    assert [out["orderly_sent"], 2] in out["orderly_again"], out["orderly_again"]
    assert {"__SHARDINGKEY": "og"}.items() <= out["orderly_properties"][0].items()


def test_fifty_committed_transactions_all_arrive(grpc_cluster: Any) -> None:
    """Issue 35: committed transactional messages went missing through the gateway.  The
    broker checked half messages whose commit was still on its way (rocketmq-python-
    client sends its born time in whole seconds, and the gateway stored it: a half
    looked up to a second older than it was), the checker answered ROLLBACK, and the
    commit that followed was ignored while the SDK was told OK.  Now the stored born time
    is the gateway's, and a producer's own commit after a check's rollback commits, as
    in RocketMQ: the five commits sent after the checks arrive too."""
    _, proxy = grpc_cluster
    out = run_sdk("tx50", 120, proxy=proxy.rpc)
    assert out["sent"] == 50
    assert out["missing"] == [], f"{len(out['missing'])} committed transactions never received"
    assert out["unexpected"] == []
    assert {f"tx-{i}" for i in range(9, 50, 10)} <= set(out["checked"]), out["checked"]


def test_a_group_switched_to_orderly_is_consumed_in_order(grpc_cluster: Any) -> None:
    """Issue 35: a group switched to orderly, its consumer restarted, was still consumed
    out of order: the gateway told the new consumer the orderly flag it had cached (for
    the route TTL), and the SDK keeps the first answer for good.  Now a consumer's
    settings read the group's config afresh, and refresh what receives use."""
    cluster, _ = grpc_cluster
    proxy = cluster.run_proxy(env={"HAC_ROUTE_TTL_MS": "30000"}, name="proxy-long-ttl")
    try:
        out = run_sdk("switch", 120, proxy=proxy.rpc, http=proxy.http, namesrv=cluster.namesrv)
    finally:
        proxy.stop()
    assert out["fifo"] == [False, True]
    assert sorted(out["got"]) == sorted(out["sent"])
    for g in "ab":
        seqs = [int(b.split(":")[1]) for b in out["got"] if b.startswith(g + ":")]
        assert seqs == sorted(seqs), f"message group {g} out of order: {seqs}"


def test_official_sdk_filters_by_sql92(grpc_cluster: Any) -> None:
    """Issue 35: SQL92 subscriptions were refused, and an official push consumer with
    one started and then received nothing.  Now the brokers evaluate the expression
    (over user properties and TAGS; a missing property is NULL), and a bad one is
    refused: a receive answers ILLEGAL_FILTER_EXPRESSION (RocketMQ's proxy: the same
    for a subscription it cannot build; for an expression only its broker cannot parse,
    INTERNAL_SERVER_ERROR), and a push consumer's settings are refused, so it fails to
    start."""
    _, proxy = grpc_cluster
    out = run_sdk("sql92", 90, proxy=proxy.rpc)
    assert out["simple"] == [5, 7, 9, 11]
    assert out["simple_more"] == {"ok": True, "value": 0}
    assert out["push"] == [0, 1, 4, 5]
    assert out["bad_receive"]["ok"] is False
    assert out["bad_receive"]["code"] == 40010, out["bad_receive"]  # ILLEGAL_FILTER_EXPRESSION
    assert out["bad_push"]["ok"] is False, out["bad_push"]


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
