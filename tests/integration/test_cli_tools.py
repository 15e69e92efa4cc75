"""``hactl produce``, ``consume`` and ``topic`` as a user runs them: subprocesses against a
real cluster of two groups (one broker each; broker-b takes messages of at most 8 KiB, so
that a run can fail on one group and not the other)."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message
from ha_controller.client.producer import Producer
from ha_controller.protocol.errors import BadRequest
from ha_controller.testing import Cluster, eventually_sync, hactl_argv, run_cluster

pytestmark = pytest.mark.timeout(180)

SMALL_GROUP_MAX_BYTES = 8192


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = run_cluster(
        ("broker-a", "broker-b"),
        1,
        workdir=tmp_path_factory.mktemp("cli"),
        broker_env={("broker-b", 0): {"HAC_MAX_MESSAGE_BYTES": str(SMALL_GROUP_MAX_BYTES)}},
    )
    try:

        def both_masters() -> bool:
            out = hactl(c, "groups", "--json")
            groups = json.loads(out.stdout) if out.returncode == 0 else []
            return len(groups) == 2 and all(g["masterOnline"] for g in groups)

        eventually_sync(both_masters, timeout=30, interval=0.3)
        yield c
    finally:
        c.stop()


def hactl(cluster: Cluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        hactl_argv(*args, "--namesrv", cluster.namesrv),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def json_lines(out: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(one object per message, the summary)."""
    objs = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert objs and "summary" in objs[-1], out
    return objs[:-1], objs[-1]["summary"]


def topics(cluster: Cluster, *extra: str) -> dict[tuple[str, str], dict[str, Any]]:
    out = hactl(cluster, "topic", "list", "--json", *extra)
    assert out.returncode == 0, out.stderr
    return {(t["topic"], t["brokerName"]): t for t in json.loads(out.stdout)}


def create(cluster: Cluster, topic: str, *args: str) -> None:
    out = hactl(cluster, "topic", "create", topic, *args)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"topic {topic} created on broker-a, broker-b"


def test_produce_exits_0_only_when_every_send_was_acknowledged(cluster: Cluster) -> None:
    create(cluster, "ProduceCodes")
    ok = hactl(cluster, "produce", "--topic", "ProduceCodes", "--count", "20", "--size", "100")
    assert ok.returncode == 0, ok.stderr
    assert "sent 20, acknowledged 20, failed 0" in ok.stderr

    # broker-b refuses 10 kB messages, broker-a takes them: some acknowledged, some not
    partial = hactl(
        cluster, "produce", "--topic", "ProduceCodes", "--count", "20", "--size", "10000"
    )
    assert partial.returncode == 3, partial.stderr
    summary = [line for line in partial.stderr.splitlines() if " x MessageTooLarge: " in line]
    assert len(summary) == 1, partial.stderr
    # (broker-b's max_message_bytes bounds the body, as RocketMQ's maxMessageSize)
    assert f"message body of 10000 bytes exceeds the max {SMALL_GROUP_MAX_BYTES}" in summary[0]

    # too large for the client's own limit: refused before anything is sent, the reason named
    none = hactl(
        cluster, "produce", "--topic", "ProduceCodes", "--count", "2", "--size", "10000000"
    )
    assert none.returncode == 1, none.stderr
    assert "sent 2, acknowledged 0, failed 2" in none.stderr
    assert "2 x MessageTooLarge: message body of 10000000 bytes exceeds" in none.stderr
    assert "the max 4194304" in none.stderr
    assert "Traceback" not in none.stderr

    # --json: every outcome one line, the errors and their reason in the summary
    js = hactl(
        cluster,
        "produce",
        "--topic",
        "ProduceCodes",
        "--count",
        "2",
        "--size",
        "10000000",
        "--json",
    )
    lines, summary_obj = json_lines(js.stdout)
    assert js.returncode == 1
    assert [line["error"] for line in lines] == ["MessageTooLarge", "MessageTooLarge"]
    assert summary_obj["failed"] == 2 and summary_obj["errors"]["MessageTooLarge"]["count"] == 2
    assert "the max 4194304" in summary_obj["errors"]["MessageTooLarge"]["reason"]


def test_topic_create_refuses_an_existing_topic_and_update_changes_only_what_is_given(
    cluster: Cluster,
) -> None:
    create(cluster, "Q4", "--queues", "4")
    again = hactl(cluster, "topic", "create", "Q4", "--perm", "4")
    assert again.returncode == 1
    assert again.stdout == ""
    [line] = again.stderr.splitlines()
    assert "topic Q4 already exists on broker-a (4/4 queues, perm 6)" in line
    assert "hactl topic update Q4" in line
    both = topics(cluster)
    assert [both[("Q4", g)]["perm"] for g in ("broker-a", "broker-b")] == [6, 6]

    out = hactl(cluster, "topic", "update", "Q4", "--perm", "4")
    assert out.returncode == 0, out.stderr
    assert (
        "topic Q4 on broker-a: queues 4/4 perm 6 (RW-) type NORMAL -> queues 4/4 perm 4 (R--) "
        "type NORMAL" in out.stdout
    )
    q4 = topics(cluster)[("Q4", "broker-b")]
    assert (q4["readQueueNums"], q4["writeQueueNums"], q4["perm"]) == (4, 4, 4)

    out = hactl(cluster, "topic", "update", "Q4", "--write-queues", "2")
    assert out.returncode == 0, out.stderr
    q4 = topics(cluster)[("Q4", "broker-a")]
    assert (q4["readQueueNums"], q4["writeQueueNums"], q4["perm"]) == (4, 2, 4)

    missing = hactl(cluster, "topic", "update", "NoSuchTopic", "--perm", "6")
    assert missing.returncode == 1 and "TopicNotFound" in missing.stderr
    nothing = hactl(cluster, "topic", "update", "Q4")
    assert nothing.returncode == 2 and "nothing to change" in nothing.stderr


def test_topics_have_a_message_type(cluster: Cluster) -> None:
    """``--message-type`` (NORMAL unless given, as RocketMQ), shown by ``topic list``,
    changed by ``topic update``; the brokers refuse a send of another type (and the
    gateway, before it sends: tests/integration/test_message_rules.py)."""
    create(cluster, "Typed")
    create(cluster, "TypedFifo", "--message-type", "fifo")
    listed = topics(cluster)
    assert listed[("Typed", "broker-a")]["messageType"] == "NORMAL"
    assert {listed[("TypedFifo", g)]["messageType"] for g in ("broker-a", "broker-b")} == {"FIFO"}
    table = hactl(cluster, "topic", "list")
    assert re.search(r"TypedFifo\s+broker-a\s+4/4\s+6 \(RW-\)\s+FIFO", table.stdout), table.stdout

    out = hactl(cluster, "topic", "update", "Typed", "--message-type", "DELAY")
    assert out.returncode == 0, out.stderr
    assert "type NORMAL -> queues 4/4 perm 6 (RW-) type DELAY" in out.stdout
    assert topics(cluster)[("Typed", "broker-b")]["messageType"] == "DELAY"

    bad = hactl(cluster, "topic", "create", "Fine", "--message-type", "QUEUE")
    assert bad.returncode == 2 and "is not one of NORMAL|FIFO|DELAY" in bad.stderr, bad.stderr
    assert ("Fine", "broker-a") not in topics(cluster)


@pytest.mark.parametrize(
    "argv",
    [
        ["topic", "create", "a/b"],
        ["topic", "create", "%RETRY%x"],
        ["topic", "create", "x" * 300],
        ["topic", "create", "Fine", "--perm", "9"],
        ["topic", "create", "Fine", "--perm", "0"],
        ["topic", "create", "Fine", "--queues", "100000"],
    ],
    ids=["slash", "retry-prefix", "300-chars", "perm-9", "perm-0", "100000-queues"],
)
def test_bad_topics_are_refused_by_the_cli(cluster: Cluster, argv: list[str]) -> None:
    out = hactl(cluster, *argv)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "error: argument" in out.stderr
    assert ("Fine", "broker-a") not in topics(cluster)


async def test_brokers_refuse_bad_names_before_creating_anything(cluster: Cluster) -> None:
    """The CLI is not the only client: the brokers check too, on the admin path and
    before auto-creating a topic for a send."""
    async with NameserverClient([cluster.namesrv]) as ns:
        for bad in ("a/b", "x" * 300, "rmq_sys_mine"):
            with pytest.raises(BadRequest):
                await ns.create_topic(bad)
        with pytest.raises(BadRequest, match="perm 9"):
            await ns.create_topic("PermNine", perm=9)
        with pytest.raises(BadRequest, match=r"1\.\.1024"):
            await ns.create_topic("TooMany", queues=100_000)
    async with Producer([cluster.namesrv], group="cli-bad-names") as producer:
        for bad in ("a/b", "y" * 200):
            with pytest.raises(BadRequest):
                await producer.send(Message(bad, b"x"))
    listed = await asyncio.to_thread(topics, cluster, "--all")
    names = {t for t, _ in listed}
    assert not names & {"a/b", "x" * 300, "rmq_sys_mine", "PermNine", "TooMany", "y" * 200}
    for store in (cluster.workdir / "store").iterdir():
        table = json.loads((store / "topics.json").read_text())
        assert not [t for t in table["topics"] if "/" in t["topicName"]]


def test_topic_list_describe_delete(cluster: Cluster) -> None:
    create(cluster, "Described")
    out = hactl(cluster, "produce", "--topic", "Described", "--count", "40", "--no-progress")
    assert out.returncode == 0, out.stderr
    assert ("Described", "broker-a") in topics(cluster)
    assert not [t for t, _ in topics(cluster) if t.startswith("rmq_sys_")]  # --all shows them
    assert [t for t, _ in topics(cluster, "--all") if t.startswith("rmq_sys_")]

    desc = hactl(cluster, "topic", "describe", "Described", "--json")
    assert desc.returncode == 0, desc.stderr
    doc = json.loads(desc.stdout)
    assert {b["brokerName"] for b in doc["route"]["brokers"]} == {"broker-a", "broker-b"}
    assert len(doc["queues"]) == 8
    assert sum(q["maxOffset"] - q["minOffset"] for q in doc["queues"]) == 40
    table = hactl(cluster, "topic", "describe", "Described")
    assert "total: 40 messages in 8 queues" in table.stdout

    gone = hactl(cluster, "topic", "delete", "Described")
    assert "topic Described deleted on broker-a/0, broker-b/0" in gone.stdout, gone.stderr
    if gone.returncode == 3:  # the nameserver keeps the route until it serves code 216
        assert "still routes Described" in gone.stderr
        assert "DELETE_TOPIC_IN_NAMESRV (216)" in gone.stderr
    else:
        assert gone.returncode == 0, gone.stderr
        assert hactl(cluster, "route", "Described").returncode == 1
    assert ("Described", "broker-a") not in topics(cluster)
    again = hactl(cluster, "topic", "delete", "Described")
    assert again.returncode == 1 and "no broker has topic Described" in again.stderr


def test_consume_count_hands_out_and_commits_exactly_n(cluster: Cluster) -> None:
    create(cluster, "Exact")
    out = hactl(cluster, "produce", "--topic", "Exact", "--count", "300", "--json")
    sent, summary = json_lines(out.stdout)
    assert out.returncode == 0 and summary["acknowledged"] == 300

    def consume(count: int | None, timeout: str = "30") -> list[dict[str, Any]]:
        args = ["consume", "--topic", "Exact", "--group", "exact-g", "--json"]
        args += ["--timeout", timeout] + ([] if count is None else ["--count", str(count)])
        result = hactl(cluster, *args)
        got, summary = json_lines(result.stdout)
        assert summary["received"] == len(got)
        assert result.returncode == 0, result.stderr
        return got

    first = consume(5)
    assert len(first) == 5
    rest = consume(295)
    assert len(rest) == 295
    keys = [m["key"] for m in first + rest]
    assert len(set(keys)) == 300 and set(keys) == {m["key"] for m in sent}
    assert consume(None, timeout="3") == []  # everything was committed, nothing more


def test_delayed_messages_carry_when_they_are_due(cluster: Cluster) -> None:
    create(cluster, "Delayed", "--message-type", "DELAY")
    before = int(time.time() * 1000)
    out = hactl(
        cluster, "produce", "--topic", "Delayed", "--count", "2", "--delay-level", "1", "--json"
    )
    after = int(time.time() * 1000)
    leveled, _ = json_lines(out.stdout)
    assert out.returncode == 0, out.stderr
    for m in leveled:  # level 1 of RocketMQ's default table is 1 s after the send
        assert before + 1000 <= m["due_ts_ms"] <= after + 1000
    deliver_at = int(time.time() * 1000) + 2000
    out = hactl(
        cluster,
        "produce",
        "--topic",
        "Delayed",
        "--count",
        "1",
        "--deliver-at",
        str(deliver_at),
        "--json",
    )
    timed, _ = json_lines(out.stdout)
    assert out.returncode == 0, out.stderr
    assert timed[0]["due_ts_ms"] == deliver_at

    due = {m["key"]: m["due_ts_ms"] for m in leveled + timed}
    out = hactl(
        cluster, "consume", "--topic", "Delayed", "--group", "delayed-g", "--count", "3", "--json"
    )
    received, _ = json_lines(out.stdout)
    assert out.returncode == 0, out.stderr
    for m in received:
        assert due[m["key"]] - 50 <= m["received_ts_ms"] <= due[m["key"]] + 5000, (m, due)


def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(cluster: Cluster) -> None:
    out = hactl(cluster, "produce", "--topic", "Progress", "--count", "300")
    assert out.returncode == 0, out.stderr
    assert "\r" not in out.stderr and "ProduceStats" not in out.stderr
    lines = out.stderr.splitlines()
    assert [
        line for line in lines if line.startswith("produce Progress: 300/300 (100%) acked 300,")
    ]
    assert "msg/s" in lines[-2] and lines[-1].startswith("sent 300, acknowledged 300, failed 0")
    co = hactl(cluster, "consume", "--topic", "Progress", "--group", "pg", "--count", "300")
    assert co.returncode == 0, co.stderr
    assert "consume Progress as pg: 300/300 (100%)" in co.stderr
    assert co.stderr.splitlines()[-1] == "received 300 (300 distinct keys)"


def test_progress_is_a_bar_on_a_terminal(cluster: Cluster) -> None:
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(
            hactl_argv(
                "produce", "--topic", "Progress", "--count", "200", "--namesrv", cluster.namesrv
            ),
            stdout=subprocess.DEVNULL,
            stderr=terminal,
            env={**os.environ, "COLUMNS": "120", "TERM": "xterm"},
        )
        os.close(terminal)
        terminal = -1
        chunks = []
        while True:
            try:
                data = os.read(controller, 65536)
            except OSError:  # the terminal closed with the process
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(60) == 0
    finally:
        os.close(controller)
        if terminal >= 0:
            os.close(terminal)
    text = b"".join(chunks).decode(errors="replace")
    assert "200/200" in text and "msg/s" in text and "━" in text, text
    assert "sent 200, acknowledged 200, failed 0" in text


def test_service_log_level_flag(tmp_path: Path) -> None:
    from ha_controller.testing import run_nameserver

    ns = run_nameserver(tmp_path, extra_args=["--log-level", "warning"])
    try:
        out = subprocess.run(
            hactl_argv("groups", "--namesrv", ns.rpc), capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0, out.stderr
    finally:
        ns.stop()
    assert " INFO " not in ns.log_path.read_text()
