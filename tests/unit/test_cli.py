"""``hactl`` without a cluster: the command set, the ``--json`` lines of the tools (the SDK
no longer prints them), and a ``--help`` that loads nothing heavy."""

from __future__ import annotations

import json
import subprocess
import sys

from ha_controller.cli import build_parser
from ha_controller.cli.tools import sent_line
from ha_controller.client.message import SendReceipt
from ha_controller.client.tools import Sent
from ha_controller.protocol.errors import NotMaster


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
        "groups",
        "route",
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
        "due_ts_ms": 1_000,
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
        "heavy = ('pyspark', 'grpc', 'aiohttp', 'ha_controller.client', 'ha_controller.drills',"
        " 'ha_controller.pipeline', 'broker_agent', 'nameserver')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
