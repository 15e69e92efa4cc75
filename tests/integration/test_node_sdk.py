"""The official RocketMQ Node.js SDK (rocketmq-client-nodejs 1.0.8) against ``hactl
proxy`` in front of a two-group cluster (master + slave each): normal, FIFO, delayed,
transactional messages, RocketMQ 5.3's recall of a delayed message, and a kill -9 of a
master with delayed messages recalled before and after it.

The SDK runs in a node child process (tests/sdk_node/scenarios.js), installed by
``bash tools/install-node-sdk.sh`` (``make tools``) into .venv/sdk-node; each scenario
prints one ``RESULT {json}`` line, which the tests check.  Without node or the
installed SDK the tests skip with the installer's one-line reason.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ha_controller.testing import (
    ProcessHandle,
    _base_env,
    create_typed_topics,
    hactl_argv,
    run_cluster,
    run_scenario,
    unlike_rocketmq,
)

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "tests" / "sdk_node" / "scenarios.js"
SDK_DIR = Path(os.environ.get("HAC_NODE_SDK_DIR", ROOT / ".venv" / "sdk-node"))
SDK_PACKAGE = SDK_DIR / "node_modules" / "rocketmq-client-nodejs" / "package.json"
UNAVAILABLE = SDK_DIR.parent / "node-sdk-unavailable"

#: topic -> its message type (as `hactl topic create --message-type`)
TOPICS = {
    "node-normal": "NORMAL",
    "node-fifo": "FIFO",
    "node-delay": "DELAY",
    "node-tx": "TRANSACTION",
    "node-ha": "NORMAL",
    "node-ha-delay": "DELAY",
    "node-slow": "NORMAL",
    "node-hold": "NORMAL",
    "node-fifo2": "FIFO",
    "node-rules": "NORMAL",
    "node-rules-fifo": "FIFO",
    "node-rules-tx": "TRANSACTION",
    "node-rules-delay": "DELAY",
    "node-sql": "NORMAL",
    "node-lite": "LITE",
}
#: consumer groups set orderly (as `hactl group update G --orderly`)
ORDERLY_GROUPS = ("node-g-fifo", "node-g-fifo2")
#: invisible time of push consumers at the renewal tests' gateway
SHORT_INVISIBLE_MS = 2000


def _why_missing() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed (the Node.js SDK tests need node >= 18)"
    if not SDK_PACKAGE.exists():
        if UNAVAILABLE.exists():
            return UNAVAILABLE.read_text().strip()
        return "rocketmq-client-nodejs is not installed: run `make tools`"
    return None


pytestmark = pytest.mark.skipif(_why_missing() is not None, reason=_why_missing() or "")


def run_sdk(scenario: str, timeout: float, **args: Any) -> dict[str, Any]:
    env = {**os.environ, "NODE_PATH": str(SDK_DIR / "node_modules")}
    argv = ["node", str(SCENARIOS), scenario, json.dumps(args)]
    return run_scenario(argv, f"node scenario {scenario}", timeout, env)


def start_proxy(cluster: Any, name: str, **env: str) -> ProcessHandle:
    ready = cluster.workdir / f"{name}.ready.json"
    proxy = ProcessHandle(
        name=name,
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
        env={**_base_env(None), **env},
        workdir=cluster.workdir,
        ready_file=ready,
        log_path=cluster.workdir / f"{name}.log",
    )
    return proxy.start()


@pytest.fixture(scope="module")
def node_cluster() -> Iterator[Any]:
    env = {
        "HAC_TRANSACTION_TIMEOUT_MS": "1000",
        "HAC_TRANSACTION_CHECK_INTERVAL_MS": "500",
    }
    cluster = run_cluster(("broker-a", "broker-b"), 2, env=env)
    proxies: list[ProcessHandle] = []
    try:
        proxies.append(start_proxy(cluster, "proxy"))
        # a second gateway on the same cluster, push consumers' invisible time short
        proxies.append(
            start_proxy(cluster, "proxy-short", HAC_DEFAULT_INVISIBLE_MS=str(SHORT_INVISIBLE_MS))
        )
        # in this process: a hactl subprocess per topic cost 2-3 s (hactl: test_cli_tools)
        reached = create_typed_topics(cluster.namesrv, TOPICS, orderly_groups=ORDERLY_GROUPS)
        assert sorted(reached) == ["broker-a", "broker-b"], reached
        yield cluster, proxies[0], proxies[1]
    finally:
        for p in proxies:
            p.stop()
        cluster.stop()


#: RocketMQ's answer to each case of the rules scenario: None = taken; a v2 code =
#: refused by the gateway with it; "sdk" = refused by the SDK itself before sending
NODE_RULES_SEND = {
    "key_16kb": None,
    "key_over_16kb": 43101,  # MESSAGE_PROPERTIES_TOO_LARGE
    "key_control": 40005,  # ILLEGAL_MESSAGE_KEY
    "tag_control": 40004,  # ILLEGAL_MESSAGE_TAG
    "tag_bar": 40004,
    "props_128": None,
    "props_129": 43101,
    "props_system_key": 40007,  # ILLEGAL_MESSAGE_PROPERTY_KEY
    "normal_4mib_16kb_props": None,
    "delay_over_24h": 40012,  # ILLEGAL_DELIVERY_TIME
    "fifo_to_normal": "sdk",  # the queue accepts NORMAL only (the gateway: 40014)
    "delay_to_normal": "sdk",
    "normal_to_fifo": "sdk",
}
NODE_RULES_RECEIVE = {
    "invisible_9s": 40011,  # ILLEGAL_INVISIBLE_TIME
    "invisible_over_12h": 40011,
    "invisible_10s": None,
    "default_consumer": 40003,  # ILLEGAL_CONSUMER_GROUP
}


def test_node_sdk_own_tests_and_rocketmqs_rules(node_cluster: Any) -> None:
    """Issue 35: through the Node.js SDK 1.0.8's own test suite a normal send returned
    an empty transaction id and received messages lacked ``__SHARDINGKEY`` and
    ``__transactionId__``; and RocketMQ's e2e cases, each against RocketMQ's answer."""
    _, proxy, _ = node_cluster
    out = run_sdk("rules", 120, proxy=proxy.rpc)
    assert out["normal"]["transactionId"] == out["normal"]["messageId"]
    assert out["tx"]["transactionId"] == out["tx"]["messageId"]
    [fifo] = out["received"]["node-rules-fifo"]
    assert fifo["messageId"] == out["fifo_sent"] and fifo["messageGroup"] == "fifoMessageGroup"
    assert fifo["properties"].get("__SHARDINGKEY") == "fifoMessageGroup", fifo
    [tx] = out["received"]["node-rules-tx"]
    assert tx["messageId"] == out["tx"]["messageId"]
    assert tx["properties"].get("__transactionId__") == out["tx"]["transactionId"], tx
    wrong = unlike_rocketmq(out["send"], NODE_RULES_SEND)
    wrong += unlike_rocketmq(out["receive"], NODE_RULES_RECEIVE)
    assert not wrong, "\n".join(wrong)


def test_node_sdk_lite_push_consumer(node_cluster: Any) -> None:
    """Lite topics (RIP-83) through the Node.js SDK 1.0.8's LitePushConsumer: the lite
    topics it subscribed, each in order, none other; ILLEGAL_LITE_TOPIC (40020) for a
    name outside [a-zA-Z0-9_-], subscribed or sent."""
    _, proxy, _ = node_cluster
    out = run_sdk("lite", 90, proxy=proxy.rpc)
    got = out["got"]
    assert sorted(body for _, body in got) == sorted(
        f"{lt}:{i}" for lt in ("nl0", "nl1") for i in range(10)
    )
    for lt in ("nl0", "nl1"):
        seqs = [int(body.split(":")[1]) for t, body in got if t == lt]
        assert seqs == list(range(10)), f"lite topic {lt}: {seqs}"
    assert out["cases"]["subscribe_bad_chars"]["code"] == 40020, out["cases"]
    assert out["cases"]["send_bad_chars"]["code"] == 40020, out["cases"]


def test_node_sdk_message_types_and_recall(node_cluster: Any) -> None:
    _, proxy, _ = node_cluster
    out = run_sdk("types", 100, proxy=proxy.rpc)
    sent = out["sent"]

    # normal: every message once, tag kept (SimpleConsumer receive / ack)
    normal = [m for m in out["simple"] if m["topic"] == "node-normal"]
    assert sorted(m["id"] for m in normal) == sorted(sent["normal"])
    assert {m["tag"] for m in normal} == {"A"}

    # FIFO: a push consumer of an orderly group (`hactl group update --orderly`; no
    # gateway flag) is told to consume FIFO and consumes each message group in order
    assert out["push_fifo_setting"] is True
    assert sorted(out["push_fifo"]) == sorted(sent["fifo"])
    for g in ("ga", "gb", "gc"):
        seqs = [int(b.split(":")[1]) for b in out["push_fifo"] if b.startswith(g + ":")]
        assert seqs == sorted(seqs), f"message group {g} out of order: {seqs}"

    # transactions: the commit and the checker's commit delivered once, the rollback never
    tx = sorted(m["body"] for m in out["simple"] if m["topic"] == "node-tx")
    assert tx == ["tx-checked", "tx-commit"], out["checked"]
    assert "tx-checked" in out["checked"]

    # recall: the send returned a handle, the recall succeeded (twice: idempotent)
    assert out["recall_handle"], "no recall handle on a delayed send"
    assert out["recall"] == {"ok": True, "messageId": sent["recalled"]}
    assert out["recall_again"]["ok"] is True
    # a recall on a NORMAL topic: it takes no delayed messages (RocketMQ's answer)
    assert out["recall_wrong_topic"]["ok"] is False
    assert "40014" in out["recall_wrong_topic"]["error"], out["recall_wrong_topic"]
    assert out["recall_garbage"]["ok"] is False

    # delayed: the kept one arrives at its time (+-1 s), the recalled one never
    arrivals = out["delay_arrivals"]
    assert [a["body"] for a in arrivals] == ["kept"], arrivals
    assert abs(arrivals[0]["at"] - sent["due_ms"]) <= 1000, arrivals[0]["at"] - sent["due_ms"]
    # a recall after delivery is a clear error, not a success
    late = out["recall_after_delivery"]
    assert late["ok"] is False and "already delivered" in late["error"], late


def test_node_sdk_survives_master_kill_and_recalls_hold(node_cluster: Any) -> None:
    cluster, proxy, _ = node_cluster
    master = cluster.broker("broker-a", 0)
    out = run_sdk("failover", 110, proxy=proxy.rpc, master_pid=master.pid)
    master.proc.wait(10)  # reap the killed master
    assert out["killed_at"] == 80
    assert out["failed"] == [], out["failed"][:5]
    assert out["acked"] == 240
    assert out["missing"] == [], f"{len(out['missing'])} acknowledged messages never consumed"

    # recalls before the kill (the masters) and after it (the acting slave for the
    # killed group) all succeed, and hold: the acting slave took over delayed delivery
    # of the killed group and delivered every other message of it, none recalled
    groups = out["delayed_groups"]
    recalls = out["recalls"]
    for when in ("before", "after"):
        assert all(r["ok"] for r in recalls[when].values()), recalls
        assert sorted(groups[b] for b in recalls[when]) == ["broker-a", "broker-a", "broker-b"]
    recalled = set(recalls["before"]) | set(recalls["after"])
    expected = sorted(set(out["delayed_sent"]) - recalled)
    assert any(groups[b] == "broker-a" for b in expected)
    assert sorted(out["delayed_received"]) == expected, out
    assert out["delayed_early"] == []


def test_a_listener_slower_than_the_invisible_time_gets_each_message_once(
    node_cluster: Any,
) -> None:
    """The push consumer asks for auto-renewal: its gateway renews the invisible time
    (2 s here) while the listener works (3.5 s a message), so nothing comes twice."""
    _, _, short = node_cluster
    out = run_sdk("slow", 60, proxy=short.rpc, listener_ms=3500, count=3)
    assert sorted(out["done"]) == sorted(out["sent"])
    assert out["calls"] == {body: 1 for body in out["sent"]}, out["calls"]


def test_a_dead_consumers_message_is_redelivered(node_cluster: Any) -> None:
    """A consumer killed -9 in its listener: renewal stops once the gateway sees it is
    gone, and the message comes back to the group's next consumer."""
    _, _, short = node_cluster
    env = {**os.environ, "NODE_PATH": str(SDK_DIR / "node_modules")}
    holder = subprocess.Popen(
        ["node", str(SCENARIOS), "hold", json.dumps({"proxy": short.rpc})],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()  # bounded by the test timeout
        assert line.strip() == "HELD held", line
        held_at = time.time()
        holder.send_signal(signal.SIGKILL)
    finally:
        holder.kill()
        holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()
    out = run_sdk("drain", 60, proxy=short.rpc, timeout_ms=45_000)
    [got] = out["got"]
    assert got["body"] == "held"
    assert got["attempt"] >= 2  # a redelivery, not a second copy
    # gone after CLIENT_GONE_S (12 s) without stream or request, then at most one
    # more invisible time (2 s) and the revive pass
    assert got["at"] / 1000 - held_at < 30, got["at"] / 1000 - held_at


def test_an_orderly_group_keeps_order_across_two_gateways(node_cluster: Any) -> None:
    """Two push consumers of one orderly group, each on its own gateway: the brokers'
    orderly POP gives each queue to one batch at a time, so every message group is
    consumed in order and one message at a time, whichever gateway popped it."""
    _, proxy, short = node_cluster
    out = run_sdk("fifo2", 80, proxies=[proxy.rpc, short.rpc])
    assert out["fifo"] == [True, True]
    consumed = [e["body"] for e in out["events"]]
    assert sorted(consumed) == sorted(out["sent"]), "lost or duplicated"
    for g in ("fa", "fb", "fc", "fd"):
        events = sorted(
            (e for e in out["events"] if e["body"].startswith(g + ":")), key=lambda e: e["start"]
        )
        seqs = [int(e["body"].split(":")[1]) for e in events]
        assert seqs == list(range(6)), f"message group {g} out of order: {seqs}"
        for before, after in itertools.pairwise(events):
            assert after["start"] >= before["end"], f"{g}: {after} began before {before} ended"


def test_node_sdk_filters_by_sql92(node_cluster: Any) -> None:
    """Issue 35: SQL92 through the official Node.js SDK's ``FilterExpression`` (type
    SQL): the brokers evaluate it over user properties and TAGS, so the consumer gets
    only the selected messages and nothing else; a consumer with a bad expression fails
    to start (the SDK sends its subscriptions in the settings) with
    ILLEGAL_FILTER_EXPRESSION (40010), as RocketMQ's proxy answers it, instead of
    starting and receiving nothing."""
    _, proxy, _ = node_cluster
    out = run_sdk("sql92", 90, proxy=proxy.rpc, count=12, expression="region = 'eu' AND n >= 4")
    assert out["simple"] == [5, 7, 9, 11], out
    assert out["simple_more"] == {"ok": True, "value": 0}, out
    assert out["bad_startup"]["ok"] is False, out
    assert "response-code=40010" in out["bad_startup"]["error"], out


def test_hactl_group_describes_and_refuses_bad_names(node_cluster: Any) -> None:
    cluster, _, _ = node_cluster
    out = subprocess.run(
        hactl_argv("group", "describe", "node-g-fifo", "--json", "--namesrv", cluster.namesrv),
        check=True,
        capture_output=True,
        text=True,
        timeout=20,
    )
    described = json.loads(out.stdout)
    assert described["group"] == "node-g-fifo"
    # every online master (broker-a's is gone once the failover test ran)
    assert described["orderly"].get("broker-b") is True
    assert set(described["orderly"].values()) == {True}
    bad = subprocess.run(
        hactl_argv("group", "update", "bad/name", "--orderly", "--namesrv", cluster.namesrv),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert bad.returncode == 2 and "bad/name" in bad.stderr, bad.stderr
    missing = subprocess.run(
        hactl_argv("group", "update", "g", "--namesrv", cluster.namesrv),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert missing.returncode == 2 and "--orderly" in missing.stderr
