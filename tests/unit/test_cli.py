"""``hactl`` without a cluster: the command set, the ``--json`` lines of the tools (the SDK
no longer prints them), a ``--help`` that loads nothing heavy, arguments refused before
anything is sent, exit codes, progress lines and one-line errors."""

from __future__ import annotations

import argparse
import errno
import importlib.metadata
import io
import json
import subprocess
import sys
import time

import pytest

from ha_controller.cli import build_parser, describe_os_error
from ha_controller.cli.groups import switch_target
from ha_controller.cli.produce import deliver_at, produce_exit_code, produce_summary, sent_line
from ha_controller.cli.progress import format_duration, reporter
from ha_controller.client.admin import ConsumerLag, GroupInfo, GroupLag
from ha_controller.client.message import SendReceipt
from ha_controller.client.tools import ProduceStats, Sent, due_ts_ms
from ha_controller.protocol.errors import BadRequest, InSyncReplicasNotEnough, NotMaster
from ha_controller.protocol.topics import (
    MAX_QUEUE_NUMS,
    perm_problem,
    queue_nums_problem,
    topic_name_problem,
)


def test_every_command_in_help_order() -> None:
    text = build_parser().format_help()
    commands = [
        "nameserver",
        "broker",
        "proxy",
        "demo",
        "produce",
        "consume",
        "topic",
        "route",
        "groups",
        "drill",
        "analyze",
    ]
    where = [text.find(f"\n    {name}") for name in commands]
    assert -1 not in where and where == sorted(where), text


def test_produce_json_lines() -> None:
    receipt = SendReceipt("MSGID", "UNIQ", "T", "broker-a", 2, 41)
    ok = sent_line(Sent("run-00000007", "T", 1_000, receipt=receipt), delay_level=3)
    assert ok == {
        "msg_id": "UNIQ",
        "key": "run-00000007",
        "topic": "T",
        "broker": "broker-a",
        "queue_id": 2,
        "queue_offset": 41,
        "due_ts_ms": 1_000 + 10_000,  # level 3 of RocketMQ's default table: 10 s
    }
    assert "due_ts_ms" not in sent_line(Sent("k", "T", 1_000, receipt=receipt), delay_level=0)
    failed = sent_line(Sent("k", "T", 1_000, error=NotMaster("broker-a is a slave")), delay_level=0)
    assert json.loads(json.dumps(failed)) == {
        "key": "k",
        "error": "NotMaster",
        "detail": "broker-a is a slave",
    }


def test_help_loads_no_sdk_runner_or_spark() -> None:
    probe = (
        "import sys, ha_controller.cli as c\n"
        "c.build_parser().format_help()\n"
        "heavy = ('pyspark', 'grpc', 'aiohttp', 'rich', 'ha_controller.client',"
        " 'ha_controller.drills', 'ha_controller.pipeline', 'broker_agent', 'nameserver')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


# ---- arguments are checked before anything is sent ---------------------------------------


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["produce", "--topic", "T", "--count", "-5"], "--count: must be >= 1, got -5"),
        (["produce", "--topic", "T", "--size", "-1"], "--size: must be >= 1, got -1"),
        (["produce", "--topic", "T", "--rate", "-1"], "--rate: must be > 0, got -1"),
        (["produce", "--topic", "T", "--rate", "nan"], "--rate: must be > 0"),
        (["produce", "--topic", "T", "--delay-level", "99"], "--delay-level: must be 1..18"),
        (["produce", "--topic", "T", "--delay-level", "1", "--deliver-at", "+5s"], "not allowed"),
        (["produce", "--topic", "T", "--deliver-at", "tomorrow"], "--deliver-at: expected"),
        (["produce", "--topic", "a/b"], "outside [%|a-zA-Z0-9_-]"),
        (["consume", "--topic", "T", "--group", "g", "--count", "0"], "--count: must be >= 1"),
        (["consume", "--topic", "T", "--group", "g", "--timeout", "-1"], "--timeout: must be > 0"),
        (["drill", "kill-master", "--duration", "-5"], "--duration: must be > 0, got -5"),
        (["drill", "kill-master", "--repeat", "0"], "--repeat: must be >= 1"),
        (["topic", "create", "a/b"], "outside [%|a-zA-Z0-9_-]: '/'"),
        (["topic", "create", "%RETRY%x"], "'%RETRY%', which is reserved"),
        (["topic", "create", "%DLQ%x"], "'%DLQ%', which is reserved"),
        (["topic", "create", "rmq_sys_x"], "'rmq_sys_', which is reserved"),
        (["topic", "create", "SCHEDULE_TOPIC_XXXX"], "reserved"),
        (["topic", "create", "RMQ_SYS_TRANS_HALF_TOPIC"], "reserved"),
        (["topic", "create", "x" * 300], "at most 127 characters, this one 300"),
        (["topic", "create", "T", "--perm", "9"], "--perm: perm 9 is not"),
        (["topic", "create", "T", "--perm", "0"], "--perm: perm 0 is not"),
        (["topic", "create", "T", "--queues", "100000"], "--queues: must be 1..1024 queues"),
        (["topic", "create", "T", "--queues", "0"], "--queues: must be 1..1024 queues"),
        (["topic", "update", "T", "--perm", "8"], "--perm: perm 8 is not"),
        (["topic", "delete", "%RETRY%x"], "reserved"),
        (["nameserver", "--log-level", "LOUD"], "--log-level: must be one of DEBUG"),
    ],
)
def test_bad_arguments_are_refused(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert says in err, err
    assert "Traceback" not in err


def test_good_arguments_parse() -> None:
    parser = build_parser()
    args = parser.parse_args(["topic", "create", "Q4", "--queues", "1024", "--perm", "7"])
    assert (args.topic, args.queues, args.perm) == ("Q4", 1024, 7)
    args = parser.parse_args(["topic", "update", "Q4", "--perm", "4"])
    assert (args.queues, args.perm) == (None, 4)  # only what was given changes
    assert parser.parse_args(["topic", "describe", "%RETRY%g"]).topic == "%RETRY%g"
    args = parser.parse_args(["produce", "--topic", "T", "--deliver-at", "1800000000000"])
    assert args.deliver_at == 1_800_000_000_000 and args.delay_level == 0
    args = parser.parse_args(["produce", "--topic", "T", "--deliver-at", "2027-01-15T08:00:00Z"])
    assert args.deliver_at == 1_800_000_000_000
    for level in ("debug", "WARNING"):
        for service in ("nameserver", "broker", "proxy"):
            assert parser.parse_args([service, "--log-level", level]).log_level == level.upper()


def test_deliver_at_relative() -> None:
    before = int(time.time() * 1000)
    value = deliver_at("+30s")
    after = int(time.time() * 1000)
    assert before + 30_000 <= value <= after + 30_000


def test_help_shows_defaults_and_exit_codes() -> None:
    parser = build_parser()

    def squash(text: str) -> str:
        return "".join(text.split())

    def help_of(*argv: str) -> str:
        sub: argparse.ArgumentParser = parser
        for name in argv:
            action = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction))
            sub = action.choices[name]
        return "".join(sub.format_help().split())  # wrapping does not matter

    produce = help_of("produce")
    assert squash("nameserver(s) H:P[,H:P] (default: 127.0.0.1:9876)") in produce
    assert squash("delayed message of level 1..18") in produce
    for code in ("0 every send was acknowledged", "1 no send was acknowledged", "3 some sends"):
        assert squash(code) in produce
    assert "due_ts_ms" in produce and squash("1s 5s 10s 30s 1m") in produce
    consume = help_of("consume")
    assert squash("seconds to wait (default: 30.0)") in consume
    assert squash("hand out and commit exactly this many messages") in consume
    assert squash("default ~/store/<broker-name>-<broker-id>") in help_of("broker")
    for service in ("nameserver", "broker", "proxy"):
        assert squash("--log-level LEVEL") in help_of(service), service
    assert squash("(1..1024)") in help_of("topic", "create")
    assert squash("3 the brokers dropped it, but a nameserver still routes it") in help_of(
        "topic", "delete"
    )
    assert squash("--topic TOPIC topic to send to") in produce


def test_version_comes_from_the_package_metadata() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ha_controller.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert out.stdout.strip() == f"hactl {importlib.metadata.version('ha-controller')}"


# ---- produce: due times, exit codes, summaries -------------------------------------------


def test_due_ts_ms_uses_rocketmq_default_levels() -> None:
    assert due_ts_ms(1_000, delay_level=1) == 2_000
    assert due_ts_ms(1_000, delay_level=4) == 31_000
    assert due_ts_ms(1_000, delay_level=18) == 1_000 + 2 * 3_600_000
    assert due_ts_ms(1_000, delay_level=99) == 1_000 + 2 * 3_600_000  # brokers clamp
    assert due_ts_ms(1_000, deliver_ts_ms=5_000) == 5_000  # a timer message: its time
    assert due_ts_ms(1_000) == 1_000
    receipt = SendReceipt("MSGID", "UNIQ", "T", "broker-a", 0, 0)
    timer = sent_line(Sent("k", "T", 1_000, receipt=receipt, due_ts_ms=9_999))
    assert timer["due_ts_ms"] == 9_999


def test_produce_exit_code_and_summary() -> None:
    ok = ProduceStats(sent=3, acknowledged=3)
    assert produce_exit_code(ok) == 0
    none = ProduceStats(sent=3)
    for _ in range(3):
        none.add_failure(BadRequest("message of 10000182 bytes exceeds max_message_bytes=4194304"))
    assert produce_exit_code(none) == 1
    partial = ProduceStats(sent=3, acknowledged=2)
    partial.add_failure(NotMaster("broker-a is a slave"))
    assert produce_exit_code(partial) == 3
    lines = produce_summary(none, 1.0)
    assert lines[0] == "sent 3, acknowledged 0, failed 3 in 1.0 s, 3 msg/s"
    assert lines[1] == (
        "  3 x BadRequest: message of 10000182 bytes exceeds max_message_bytes=4194304"
    )


# ---- progress -----------------------------------------------------------------------------


class _Pipe(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_plain_progress_is_whole_lines() -> None:
    out = _Pipe()
    bar = reporter("produce T", 100, stream=out, interval_s=0.0)
    for n in range(1, 101):
        bar.update(n, f"acked {n}")
    bar.close()
    text = out.getvalue()
    assert "\r" not in text and text.endswith("\n")
    last = text.splitlines()[-1]
    assert last.startswith("produce T: 100/100 (100%) acked 100, ") and "msg/s" in last
    assert "ETA" in text.splitlines()[0]  # while not done
    assert "ProduceStats" not in text


def test_progress_off_for_json_on_a_pipe_and_when_nothing_ran() -> None:
    out = _Pipe()
    bar = reporter("produce T", 10, stream=out, json_output=True, interval_s=0.0)
    bar.update(5)
    bar.close()
    assert out.getvalue() == ""
    bar = reporter("produce T", 10, stream=out, interval_s=0.0)
    bar.close()  # failed before the first send: no progress line
    assert out.getvalue() == ""


def test_indeterminate_plain_progress_ticks_while_the_caller_blocks() -> None:
    out = _Pipe()
    bar = reporter("analyze d", unit="", stream=out, interval_s=0.05)
    bar.update(0, "judging the history")
    time.sleep(0.3)  # the caller blocks (a Spark job): the ticker still prints
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and all(line.startswith("analyze d: judging") for line in lines)
    assert format_duration(5) == "5s" and format_duration(184) == "3m04s"
    assert format_duration(3720) == "1h02m"


# ---- errors are one line --------------------------------------------------------------------


def test_os_errors_are_described_in_one_line() -> None:
    in_use = OSError(
        errno.EADDRINUSE,
        "error while attempting to bind on address ('127.0.0.1', 9876): address already in use",
    )
    assert describe_os_error(in_use).startswith(
        "cannot listen on 127.0.0.1:9876: address already in use"
    )
    missing = FileNotFoundError(errno.ENOENT, "No such file or directory", "/x/topics.json")
    assert describe_os_error(missing) == "No such file or directory: /x/topics.json"


def test_topic_rules() -> None:
    assert topic_name_problem("Order_Topic-1|%") is None
    assert topic_name_problem("x" * 127) is None
    assert topic_name_problem("") is not None
    assert topic_name_problem("%RETRY%g") is not None
    assert topic_name_problem("%RETRY%g", allow_group_topics=True) is None
    assert topic_name_problem("rmq_sys_x", allow_group_topics=True) is not None
    assert topic_name_problem("rmq_sys_x", allow_reserved=True) is None
    assert topic_name_problem("TBW102") is not None
    assert topic_name_problem("a.b", allow_reserved=True) is not None
    assert [p for p in range(16) if perm_problem(p) is None] == [2, 3, 4, 5, 6, 7]
    assert queue_nums_problem(1) is None and queue_nums_problem(MAX_QUEUE_NUMS) is None
    assert queue_nums_problem(MAX_QUEUE_NUMS + 1) is not None


# --- hactl group switch --to auto / --if-master -------------------------------------------


def _group(master: int | None, sync_set: tuple[int, ...], epoch: int | None = 3) -> GroupInfo:
    return GroupInfo(
        cluster="DefaultCluster",
        broker_name="broker-a",
        enable_acting_master=True,
        members={0: "a:10911", 1: "b:10911", 2: "c:10911"},
        epoch=epoch,
        master_member=master,
        sync_state_set=sync_set,
    )


def test_switch_to_auto_picks_the_lowest_in_sync_slave() -> None:
    # member 2 is master; 0 and 1 are in sync; 3 is not in the set
    assert switch_target(_group(2, (0, 1, 2)), None, None) == 0
    assert switch_target(_group(0, (0, 2)), None, None) == 2  # 1 is not in sync
    assert switch_target(_group(1, (1, 2, 0)), None, 1) == 0
    assert switch_target(_group(0, (0, 1)), 1, None) == 1  # an explicit id stays


def test_switch_if_master_does_nothing_on_another_member() -> None:
    assert switch_target(_group(0, (0, 1, 2)), None, 1) is None
    assert switch_target(_group(0, (0, 1, 2)), 2, 2) is None


def test_switch_to_auto_refuses_without_an_in_sync_slave_or_controller() -> None:
    with pytest.raises(InSyncReplicasNotEnough, match="no slave besides master 0"):
        switch_target(_group(0, (0,)), None, None)
    with pytest.raises(BadRequest, match="not in controller mode"):
        switch_target(_group(None, (), epoch=None), None, None)


def test_switch_to_parses_an_id_or_auto() -> None:
    parser = build_parser()
    args = parser.parse_args(["group", "switch", "broker-a", "--to", "auto", "--if-master", "0"])
    assert (args.target, args.if_master) == (None, 0)
    assert parser.parse_args(["group", "switch", "broker-a", "--to", "2"]).target == 2
    for bad in ("first", "-1"):
        with pytest.raises(SystemExit):
            parser.parse_args(["group", "switch", "broker-a", "--to", bad])


def test_group_lag_output() -> None:
    from ha_controller.cli.groups import age_text, lag_document

    assert [age_text(None), age_text(400), age_text(57_000), age_text(723_000)] == [
        "-",
        "0.4s",
        "57s",
        "12m03s",
    ]
    lag = GroupLag(
        "G",
        [
            ConsumerLag("T", "broker-a", 0, 10, 3, 7, 57_000),
            ConsumerLag("T", "broker-a", 1, 4, -1, 0, None),
        ],
        answered_by={"broker-a": 1},
        failed={"broker-b": "no master online and no slave acting for it"},
    )
    assert lag.lag == 7
    assert lag_document(lag) == {
        "group": "G",
        "lag": 7,
        "queues": [
            {
                "topic": "T",
                "brokerName": "broker-a",
                "brokerId": 1,
                "queueId": 0,
                "maxOffset": 10,
                "consumerOffset": 3,
                "lag": 7,
                "oldestAgeMs": 57_000,
            },
            {
                "topic": "T",
                "brokerName": "broker-a",
                "brokerId": 1,
                "queueId": 1,
                "maxOffset": 4,
                "consumerOffset": -1,
                "lag": 0,
                "oldestAgeMs": None,
            },
        ],
        "failed": {"broker-b": "no master online and no slave acting for it"},
    }


def test_group_lag_arguments() -> None:
    args = build_parser().parse_args(["group", "lag", "G", "--topic", "T", "--json"])
    assert (args.group, args.topic, args.json, args.cluster) == ("G", "T", True, None)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["group", "lag", "bad group"])
