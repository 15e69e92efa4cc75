"""Lite topics (RocketMQ 5.5's RIP-83) through ``hactl proxy`` with the official Python
SDK (rocketmq-python-client 5.1.2): LITE messages sent with ``lite_topic``, a
LiteSimpleConsumer and a LitePushConsumer subscribing lite topics of one LITE parent
topic (SyncLiteSubscription), each lite topic in order; and what is refused, with
which status.

The SDK runs in a child process (this file, run as a script), as in
test_grpc_proxy.py: its protobuf modules and ours must never share a process.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve()
SDK_MISSING = importlib.util.find_spec("rocketmq") is None

PARENT = "v2-lite-parent"
NORMAL = "v2-lite-normal"
#: the gateway's bounds in this test: 3 lite topics per client, 6 in all
QUOTA = 3
TOTAL = 6
PER_LITE = 8  # messages per lite topic


# --------------------------------------------------------------------------------------
# the child process: rocketmq-python-client only
# --------------------------------------------------------------------------------------


def _outcome(fn: Any) -> dict[str, Any]:
    """ok, or the error and its v2 code (None when the SDK refused it itself)."""
    try:
        value = fn()
    except Exception as exc:  # the SDK's exceptions: the outcome is the point
        return {"ok": False, "code": getattr(exc, "code", None), "error": str(exc)[:300]}
    return {"ok": True, "value": value}


class LiteName(str):
    """A lite topic name for ``subscribe_lite``: rocketmq-python-client 5.1.2 builds its
    PARTIAL_ADD with ``lite_topic_set.extend(name)``, which sends each character of a
    plain ``str`` as a lite topic of its own; iterated, this one is its whole self."""

    __slots__ = ()

    def __iter__(self) -> Iterator[str]:
        yield str(self)


def scenario_lite(proxy: str) -> dict[str, Any]:
    import logging

    import rocketmq as rmq
    from rocketmq.v5.consumer.push.lite_push_consumer import LitePushConsumer
    from rocketmq.v5.consumer.simple.lite_simple_consumer import LiteSimpleConsumer

    logging.getLogger("rocketmq").setLevel(logging.CRITICAL)
    cfg = rmq.ClientConfiguration(proxy, rmq.Credentials())
    out: dict[str, Any] = {}
    pushed: list[str] = []

    class Listener(rmq.MessageListener):  # type: ignore[misc]
        def consume(self, message: Any) -> Any:
            pushed.append(f"{message.lite_topic}:{message.body.decode()}")
            return rmq.ConsumeResult.SUCCESS

    def message(topic: str, body: str, lite: str | None = None) -> Any:
        m = rmq.Message()
        m.topic = topic
        m.body = body.encode()
        if lite is not None:
            m.lite_topic = lite
        return m

    producer = rmq.Producer(cfg, (PARENT, NORMAL))
    producer.startup()
    simple = LiteSimpleConsumer(PARENT, cfg, "g-lite-simple", await_duration=1)
    simple.startup()
    push = LitePushConsumer(cfg, "g-lite-push", PARENT, Listener())
    push.startup()
    third = LiteSimpleConsumer(PARENT, cfg, "g-lite-third", await_duration=1)
    third.startup()
    on_normal = LiteSimpleConsumer(NORMAL, cfg, "g-lite-normal", await_duration=1)
    on_normal.startup()
    simple_got: list[str] = []

    def drain(want: int, timeout: float) -> None:
        deadline = time.time() + timeout
        while len(simple_got) < want and time.time() < deadline:
            for m in simple.receive(16, 20):
                simple_got.append(f"{m.lite_topic}:{m.body.decode()}")
                simple.ack(m)

    try:
        manager = simple._LiteSimpleConsumer__subscription_manager  # what the settings told
        out["settings"] = {
            "quota": manager.lite_subscription_quota,
            "max_size": manager.max_lite_topic_size,
        }
        # SyncLiteSubscription: simple dev-0, dev-1; push dev-1, dev-2; dev-3 nobody's
        for lite in ("dev-0", "dev-1"):
            simple.subscribe_lite(LiteName(lite))
        for lite in ("dev-1", "dev-2"):
            push.subscribe_lite(LiteName(lite))
        started = time.time()
        for i in range(PER_LITE):
            for lite in ("dev-0", "dev-1", "dev-2", "dev-3"):
                producer.send(message(PARENT, f"{i}", lite))
        out["send_s"] = time.time() - started
        drain(2 * PER_LITE, 20)
        out["simple"] = list(simple_got)
        deadline = time.time() + 20
        while len(pushed) < 2 * PER_LITE and time.time() < deadline:
            time.sleep(0.05)
        # PARTIAL_REMOVE: the simple consumer drops dev-0; what follows of it is not its
        simple.unsubscribe_lite(LiteName("dev-0"))
        for lite in ("dev-0", "dev-1"):
            producer.send(message(PARENT, "after", lite))
        drain(2 * PER_LITE + 1, 10)
        out["simple_after"] = simple_got[2 * PER_LITE :]
        out["simple_more"] = _outcome(lambda: len(simple.receive(16, 20)))
        deadline = time.time() + 10
        while len(pushed) < 2 * PER_LITE + 1 and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # nothing else may come
        out["push"] = list(pushed)

        # refusals
        out["refused"] = {
            "subscribe_illegal_name": _outcome(lambda: simple.subscribe_lite(LiteName("a.b"))),
            "subscribe_too_long": _outcome(lambda: simple.subscribe_lite(LiteName("x" * 65))),
            # the SDK knows the quota (3) from its settings and refuses the 4th itself
            "subscribe_over_client_quota": _outcome(
                lambda: [simple.subscribe_lite(LiteName(f"q-{i}")) for i in range(3)]
            ),
            # the SDK's quirk: a plain str sends its characters, 4 lite topics > 3
            "subscribe_plain_str": _outcome(lambda: third.subscribe_lite("abcd")),
            # simple holds 3 now, push 2: the gateway's total (6) refuses the 2nd here
            "subscribe_first_of_third": _outcome(lambda: third.subscribe_lite(LiteName("t-0"))),
            "subscribe_over_total": _outcome(lambda: third.subscribe_lite(LiteName("t-1"))),
            "subscribe_under_normal_topic": _outcome(
                lambda: on_normal.subscribe_lite(LiteName("x"))
            ),
            "send_illegal_lite_topic": _outcome(
                lambda: producer.send(message(PARENT, "bad", "a.b")).message_id
            ),
            "send_lite_to_normal_topic": _outcome(
                lambda: producer.send(message(NORMAL, "lite", "dev-0")).message_id
            ),
            "send_normal_to_lite_topic": _outcome(
                lambda: producer.send(message(PARENT, "plain")).message_id
            ),
        }
    finally:
        for c in (producer, simple, push, third, on_normal):
            c.shutdown()
    return out


def _child_main() -> None:
    from ha_controller.testing import scenario_main

    scenario_main({"lite": scenario_lite})


if __name__ == "__main__":
    _child_main()


# --------------------------------------------------------------------------------------
# the test
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
def lite_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from ha_controller.testing import create_typed_topics, run_cluster

    cluster = run_cluster(("broker-a",), 1, workdir=tmp_path_factory.mktemp("lite"))
    try:
        create_typed_topics(cluster.namesrv, {PARENT: "LITE", NORMAL: "NORMAL"})
        proxy = cluster.run_proxy(
            env={
                "HAC_LITE_SUBSCRIPTION_QUOTA": str(QUOTA),
                "HAC_MAX_LITE_SUBSCRIPTIONS": str(TOTAL),
            }
        )
        try:
            yield proxy
        finally:
            proxy.stop()
    finally:
        cluster.stop()


def _in_order(got: list[str], lite: str) -> list[str]:
    return [body for name, body in (g.split(":", 1) for g in got) if name == lite]


def test_official_sdk_lite_consumers_get_their_lite_topics_in_order(lite_proxy: Any) -> None:
    out = run_sdk("lite", 120, proxy=lite_proxy.rpc)
    seq = [str(i) for i in range(PER_LITE)]
    assert out["settings"] == {"quota": QUOTA, "max_size": 64}

    # the LiteSimpleConsumer: dev-0 and dev-1, each in send order, nothing else
    simple = out["simple"]
    assert sorted({g.split(":")[0] for g in simple}) == ["dev-0", "dev-1"], simple
    assert _in_order(simple, "dev-0") == seq
    assert _in_order(simple, "dev-1") == seq
    # after PARTIAL_REMOVE of dev-0 only dev-1's message comes
    assert out["simple_after"] == ["dev-1:after"]
    assert out["simple_more"] == {"ok": True, "value": 0}

    # the LitePushConsumer: dev-1 and dev-2 (dev-1 shared with the other group), in order
    push = out["push"]
    assert sorted({g.split(":")[0] for g in push}) == ["dev-1", "dev-2"], push
    assert _in_order(push, "dev-1") == [*seq, "after"]
    assert _in_order(push, "dev-2") == seq

    refused = out["refused"]

    def code(case: str) -> Any:
        got = refused[case]
        assert not got["ok"], (case, got)
        return got["code"]

    assert code("subscribe_illegal_name") == 40020, refused  # ILLEGAL_LITE_TOPIC
    assert code("subscribe_too_long") is None  # the SDK: max_lite_topic_size from settings
    # the SDK's own quota check (settings: 3), with the server's code 42902
    assert code("subscribe_over_client_quota") == 42902, refused
    # 5.1.2's subscribe_lite("abcd") asks for "a", "b", "c", "d": over the quota here (with
    # the default 2000 they are subscribed, and its 30 s COMPLETE_ADD resync replaces them)
    assert code("subscribe_plain_str") == 42902, refused
    assert "would have 4" in refused["subscribe_plain_str"]["error"], refused
    assert refused["subscribe_first_of_third"]["ok"], refused
    assert code("subscribe_over_total") == 42902, refused  # the gateway's total
    assert code("subscribe_under_normal_topic") == 40002, refused  # ILLEGAL_TOPIC
    assert code("send_illegal_lite_topic") == 40020, refused
    # the route's accepted message types: the SDK refuses either itself
    assert code("send_lite_to_normal_topic") is None, refused
    assert code("send_normal_to_lite_topic") is None, refused
