"""Lite topics (RocketMQ 5.5's RIP-83) through ``hactl proxy`` with the official Python
SDK (rocketmq-python-client 5.1.2: ``Message.lite_topic``, ``LitePushConsumer``),
written from RocketMQ's documented behaviour: a LITE parent topic takes messages of
any number of lite topics; a lite push consumer gets the lite topics it subscribed
(``SyncLiteSubscription``), each in order, and no other; bad names are
``ILLEGAL_LITE_TOPIC``, a subscription beyond a quota ``LITE_SUBSCRIPTION_QUOTA_EXCEEDED``,
a parent topic that is not LITE ``ILLEGAL_TOPIC``.

The SDK runs in a child process (this file as a script), as in test_grpc_proxy.py: its
generated protobuf modules and ours cannot share a process.  The official lite
examples (apache/rocketmq-clients' python/example) run in test_official_examples.py.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve()
SDK_MISSING = importlib.util.find_spec("rocketmq") is None

PARENT = "lite-parent"
NORMAL = "lite-normal"
#: the gateway's bounds in this test (HAC_LITE_SUBSCRIPTION_QUOTA, HAC_MAX_LITE_SUBSCRIPTIONS)
CLIENT_QUOTA = 5
GATEWAY_MAX = 9
LITE_TOPICS = ("l0", "l1", "l2")
PER_LITE_TOPIC = 12


# --------------------------------------------------------------------------------------
# the child process: rocketmq-python-client only
# --------------------------------------------------------------------------------------


def _outcome(fn: Any) -> dict[str, Any]:
    try:
        value = fn()
    except Exception as exc:  # the SDK's exceptions: the outcome is the point
        return {"ok": False, "code": getattr(exc, "code", None), "error": str(exc)[:300]}
    return {"ok": True, "value": value}


def scenario_lite(proxy: str) -> dict[str, Any]:
    import logging

    import rocketmq as rmq

    logging.getLogger("rocketmq").setLevel(logging.WARNING)
    cfg = rmq.ClientConfiguration(proxy, rmq.Credentials())
    out: dict[str, Any] = {"got": [], "cases": {}}
    lock = threading.Lock()

    class Listener(rmq.MessageListener):  # type: ignore[misc]
        def consume(self, message: Any) -> Any:
            with lock:
                out["got"].append([message.lite_topic, message.body.decode(), message.message_type])
            return rmq.ConsumeResult.SUCCESS

    def wait_for(n: int, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            with lock:
                if len(out["got"]) >= n:
                    return
            time.sleep(0.05)

    consumer = rmq.LitePushConsumer(cfg, "g-lite", PARENT, Listener())
    consumer.startup()
    producer = rmq.Producer(cfg, (PARENT,))
    producer.startup()
    cases = out["cases"]

    def send(lite: str, body: str, topic: str = PARENT) -> Any:
        m = rmq.Message()
        m.topic = topic
        m.body = body.encode()
        m.lite_topic = lite
        return producer.send(m).message_id

    others: list[Any] = []
    try:
        for lt in LITE_TOPICS:
            consumer.subscribe_lite(lt)
        # SDK 5.1.2 quirk: subscribe_lite(name) sends the characters of the name as
        # lite topics (``lite_topic_set.extend(name)``); its periodic resync (every
        # 30 s), which subscribe_lite_all() runs at once, sends the real set
        consumer.subscribe_lite_all()
        for i in range(PER_LITE_TOPIC):
            for lt in (*LITE_TOPICS, "unsubscribed"):
                send(lt, f"{lt}:{i}")
        wait_for(len(LITE_TOPICS) * PER_LITE_TOPIC, 30)
        time.sleep(1.0)  # nothing more may come
        with lock:
            out["first"] = list(out["got"])
            out["got"].clear()

        # unsubscribed: no more of it; the others keep coming
        consumer.unsubscribe_lite("l2")
        send("l2", "l2:after")
        send("l0", "l0:after")
        wait_for(1, 20)
        time.sleep(1.5)
        with lock:
            out["after_unsubscribe"] = list(out["got"])

        # what RocketMQ refuses
        cases["subscribe_bad_chars"] = _outcome(lambda: consumer.subscribe_lite("a.b"))
        cases["subscribe_too_long"] = _outcome(lambda: consumer.subscribe_lite("x" * 65))
        cases["send_bad_chars"] = _outcome(lambda: send("a.b", "bad"))
        cases["send_to_normal_topic"] = _outcome(lambda: send("l0", "bad", NORMAL))
        # the client quota (5, from the settings; the SDK checks it itself); names of
        # one character, which the SDK's subscribe_lite sends as they are
        quota = rmq.LitePushConsumer(cfg, "g-lite-quota", PARENT, Listener())
        quota.startup()
        others.append(quota)
        cases["quota_5"] = _outcome(lambda: [quota.subscribe_lite(n) for n in "abcde"] and None)
        cases["quota_6th"] = _outcome(lambda: quota.subscribe_lite("f"))
        # the gateway's total (9): g-lite holds l0, l1; g-lite-quota 5; two more fit
        total = rmq.LitePushConsumer(cfg, "g-lite-total", PARENT, Listener())
        total.startup()
        others.append(total)
        cases["total_8_9"] = _outcome(lambda: [total.subscribe_lite(n) for n in "tu"] and None)
        cases["total_10th"] = _outcome(lambda: total.subscribe_lite("v"))
        # a parent topic that is not LITE
        wrong = rmq.LitePushConsumer(cfg, "g-lite-wrong", NORMAL, Listener())
        wrong.startup()
        others.append(wrong)
        cases["bind_normal_topic"] = _outcome(lambda: wrong.subscribe_lite("l0"))
    finally:
        producer.shutdown()
        consumer.shutdown()
        for c in others:
            c.shutdown()
    return out


def _child_main() -> None:
    from ha_controller.testing import scenario_main

    scenario_main({"lite": scenario_lite})


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
def lite_cluster() -> Iterator[Any]:
    from ha_controller.testing import run_cluster

    cluster = run_cluster(("broker-a", "broker-b"), 2)
    try:
        _create(cluster, {PARENT: "LITE", NORMAL: "NORMAL"})
        proxy = cluster.run_proxy(
            "--long-polling-timeout-s",
            "5",
            env={
                "HAC_LITE_SUBSCRIPTION_QUOTA": str(CLIENT_QUOTA),
                "HAC_MAX_LITE_SUBSCRIPTIONS": str(GATEWAY_MAX),
            },
        )
        try:
            from gateway_helpers import wait_routed  # (the SDK child imports this file)

            wait_routed(proxy, PARENT, NORMAL)
            yield cluster, proxy
        finally:
            proxy.stop()
    finally:
        cluster.stop()


def test_lite_push_consumer_gets_its_lite_topics_in_order(lite_cluster: Any) -> None:
    _, proxy = lite_cluster
    out = run_sdk("lite", 150, proxy=proxy.rpc)
    first = out["first"]
    # every message of the subscribed lite topics, once, as LITE (5), and no other
    want = sorted(f"{lt}:{i}" for lt in LITE_TOPICS for i in range(PER_LITE_TOPIC))
    assert sorted(body for _, body, _ in first) == want
    assert {lt for lt, _, _ in first} == set(LITE_TOPICS)
    assert all(body.startswith(lt + ":") and kind == 5 for lt, body, kind in first)
    for lt in LITE_TOPICS:  # per-lite-topic order
        seqs = [int(body.split(":")[1]) for t, body, _ in first if t == lt]
        assert seqs == sorted(seqs), f"lite topic {lt} out of order: {seqs}"
    # after unsubscribe_lite("l2") only l0's message came
    assert [body for _, body, _ in out["after_unsubscribe"]] == ["l0:after"]

    cases = out["cases"]
    # RocketMQ's proxy: ILLEGAL_LITE_TOPIC (40020) for a name outside [a-zA-Z0-9_-]
    # (the SDK's subscribe_lite sends "a.b" as "a", ".", "b": "." is refused)
    assert cases["subscribe_bad_chars"]["code"] == 40020, cases["subscribe_bad_chars"]
    assert cases["send_bad_chars"]["code"] == 40020, cases["send_bad_chars"]
    # the SDK itself refuses a name over max_lite_topic_size (64, from the settings)
    # and a lite message to a queue that does not accept LITE
    assert cases["subscribe_too_long"]["ok"] is False, cases
    assert cases["subscribe_too_long"]["code"] is None, cases["subscribe_too_long"]
    assert cases["send_to_normal_topic"]["ok"] is False, cases
    assert cases["send_to_normal_topic"]["code"] is None, cases["send_to_normal_topic"]
    # quotas: LITE_SUBSCRIPTION_QUOTA_EXCEEDED (42902), the client's (the SDK checks the
    # quota it was told) and the gateway's total (the gateway refuses)
    assert cases["quota_5"]["ok"] is True, cases["quota_5"]
    assert cases["quota_6th"]["code"] == 42902, cases["quota_6th"]
    assert cases["total_8_9"]["ok"] is True, cases["total_8_9"]
    assert cases["total_10th"]["code"] == 42902, cases["total_10th"]
    assert "max_lite_subscriptions" in cases["total_10th"]["error"], cases["total_10th"]
    # a lite consumer bound to a NORMAL topic: ILLEGAL_TOPIC (40002), as RocketMQ's
    # proxy answers a bind topic that is not the lite group's
    assert cases["bind_normal_topic"]["code"] == 40002, cases["bind_normal_topic"]


def test_a_lite_subscription_with_an_offset_option_is_made(lite_cluster: Any) -> None:
    """The SDKs' ``subscribeLite(name, OffsetOption)`` (the Node.js SDK's
    LitePushConsumerExample asks MIN_OFFSET and ofTailN(100)) sends an ``offset_option``:
    the gateway makes the subscription (the start is where the group is: docs/grpc.md)
    instead of refusing the call, which ended the official example."""
    import grpc

    from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
    from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s
    from ha_controller.proto.rocketmq.v2 import service_pb2_grpc

    _, proxy = lite_cluster
    from gateway_helpers import lite_subscriptions

    before = lite_subscriptions(proxy)
    options = {
        "oo-min": v2.OffsetOption(policy=v2.OffsetOption.MIN),
        "oo-tail": v2.OffsetOption(tail_n=100),
        "oo-offset": v2.OffsetOption(offset=0),
        "oo-time": v2.OffsetOption(timestamp=int(time.time() * 1000)),
    }
    meta = (("x-mq-client-id", "offset-option-client"),)
    with grpc.insecure_channel(proxy.rpc) as channel:
        stub: Any = service_pb2_grpc.MessagingServiceStub(channel)

        def sync(action: v2.LiteSubscriptionAction, names: list[str], option: Any = None) -> Any:
            req = v2s.SyncLiteSubscriptionRequest(
                action=action,
                topic=v2.Resource(name=PARENT),
                group=v2.Resource(name="g-lite-offset-option"),
                lite_topic_set=names,
                offset_option=option,
            )
            return stub.SyncLiteSubscription(req, metadata=meta, timeout=10).status

        for name, option in options.items():
            status = sync(v2.PARTIAL_ADD, [name], option)
            assert status.code == v2.OK, (name, status.message)
        assert lite_subscriptions(proxy) == before + len(options)
        # the names are still checked as without an option
        bad = sync(v2.PARTIAL_ADD, ["a.b"], options["oo-min"])
        assert bad.code == v2.ILLEGAL_LITE_TOPIC, bad.message
        assert sync(v2.COMPLETE_REMOVE, []).code == v2.OK
        assert lite_subscriptions(proxy) == before


def _create(cluster: Any, topics: dict[str, str]) -> None:
    """Create ``topics`` on both groups' masters, once both are registered (a master
    registers after its pre-online: a topic asked for before reaches only the others)."""
    from ha_controller.testing import create_typed_topics, eventually_sync

    eventually_sync(
        lambda: sorted(create_typed_topics(cluster.namesrv, topics)) == ["broker-a", "broker-b"],
        timeout=20,
        interval=0.5,
    )
