"""``hactl produce`` and ``hactl consume``: send messages with unique keys, receive them as
a push consumer.

Every tool takes ``--namesrv H:P[,H:P]`` and the TLS options (``--tls-ca``,
``--tls-cert``, ``--tls-key``, or ``HAC_TLS_*``: :func:`.common.client_tls`) and the ACL
credentials (``--access-key``/``--secret-key`` or ``HAC_ACCESS_KEY``/``HAC_SECRET_KEY``:
:func:`.common.client_credentials`); ``--json`` makes the output machine-readable.
``produce`` and ``consume`` then print one object per message on stdout and a
``{"summary": ...}`` object last; human-readable progress and summaries go to stderr
(:mod:`.progress`). The client SDK is imported when a tool runs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import TYPE_CHECKING, Any

from ha_controller.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PARTIAL,
    add_tool,
    client_credentials,
    client_tls,
    comma_list,
    float_above,
    int_range,
)
from ha_controller.protocol.properties import DEFAULT_DELAY_LEVELS, MAX_DELAY_LEVEL

if TYPE_CHECKING:
    from ha_controller.client.message import ReceivedMessage
    from ha_controller.client.tools import ProduceStats, Sent

from ha_controller.cli.topics import any_topic_name

__all__ = ["add_commands", "deliver_at", "produce_exit_code", "produce_summary", "sent_line"]

PRODUCE_EPILOG = f"""\
exit status:
  0  every send was acknowledged
  1  no send was acknowledged (or the nameserver could not be reached)
  2  bad arguments or configuration
  3  some sends were acknowledged and some failed (the summary names each error)

Failed sends are not retried beyond the client's own attempts (3, moving to another
group on a retriable error).  With --json, every acknowledged message is one line
{{"msg_id", "key", "topic", "broker", "queue_id", "queue_offset"}}, a failed send
{{"key", "error", "detail"}}, and the last line {{"summary": {{"sent", "acknowledged",
"failed"[, "errors"]}}}}.  A delayed message adds "due_ts_ms", when it is due: the
--deliver-at time, or the send time plus the level's delay in RocketMQ's default
table, levels 1..{MAX_DELAY_LEVEL}:
  {DEFAULT_DELAY_LEVELS}
(brokers configured with other delay_levels deliver by theirs, which a client cannot
know).
"""

CONSUME_EPILOG = """\
exit status:
  0  --count messages were received (without --count: whatever arrived)
  1  fewer than --count arrived within --timeout
  2  bad arguments or configuration

With --count N exactly N messages are handed out and committed: the group's next
consumer starts right after them.  With --json every message is one line
{"msg_id", "key", "topic", "broker", "queue_id", "queue_offset", "body_len",
"born_ts_ms", "received_ts_ms"}, and the last line {"summary": {"received"}}.
"""

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def deliver_at(text: str) -> int:
    """``--deliver-at``: epoch milliseconds, an ISO-8601 time (local time when it names
    no zone), or ``+DURATION`` from now (``+30s``, ``+5m``, ``+1500ms``)."""
    from datetime import datetime

    t = text.strip()
    m = re.fullmatch(r"\+([0-9]{1,9})(ms|s|m|h|d)", t)
    if m is not None:
        return int(time.time() * 1000) + int(m[1]) * _UNIT_MS[m[2]]
    if t.isdigit():
        value = int(t)
        if value < 10**12:
            raise argparse.ArgumentTypeError(
                f"{t} is not epoch milliseconds (too small; did you mean +{t}s?)"
            )
        return value
    try:
        return int(datetime.fromisoformat(t).timestamp() * 1000)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected epoch milliseconds, an ISO-8601 time or +DURATION (+30s), got {text!r}"
        ) from None


def add_commands(sub: Any) -> None:
    """Add ``produce`` and ``consume``."""
    pr = add_tool(
        sub, "produce", "send messages (each with a unique key)", _produce, epilog=PRODUCE_EPILOG
    )
    pr.add_argument(
        "--topic",
        required=True,
        type=any_topic_name,
        help="topic to send to (auto-created by the brokers when it is new)",
    )
    pr.add_argument("--count", type=int_range(1), default=100, help="messages to send")
    pr.add_argument(
        "--rate",
        type=float_above(0),
        metavar="MSGS_PER_S",
        help="messages per second (default: as fast as they are acknowledged)",
    )
    pr.add_argument("--size", type=int_range(1), default=128, help="body size in bytes")
    when = pr.add_mutually_exclusive_group()
    when.add_argument(
        "--delay-level",
        type=int_range(1, MAX_DELAY_LEVEL),
        default=0,
        metavar="L",
        help=f"delayed message of level 1..{MAX_DELAY_LEVEL} (1s .. 2h: {DEFAULT_DELAY_LEVELS})",
    )
    when.add_argument(
        "--deliver-at",
        type=deliver_at,
        metavar="TIME",
        help="timer message due at TIME: epoch ms, ISO-8601, or +DURATION from now (+30s)",
    )
    pr.add_argument("--message-group", help="FIFO message group (not with a delay)")
    pr.add_argument("--no-progress", action="store_true", help="no progress on stderr")

    co = add_tool(
        sub, "consume", "receive messages as a push consumer", _consume, epilog=CONSUME_EPILOG
    )
    co.add_argument("--topic", required=True, type=any_topic_name, help="topic to consume")
    co.add_argument("--group", required=True, help="consumer group")
    co.add_argument(
        "--count",
        type=int_range(1),
        help="hand out and commit exactly this many messages; exit 0 once they arrived",
    )
    co.add_argument(
        "--timeout", type=float_above(0), default=30.0, metavar="S", help="seconds to wait"
    )
    co.add_argument("--no-progress", action="store_true", help="no progress on stderr")


def sent_line(sent: Sent, *, delay_level: int = 0) -> dict[str, Any]:
    """One ``hactl produce --json`` object: the receipt, or the error of a failed send.

    ``due_ts_ms`` is the sent's own, else computed from ``delay_level`` (see
    :func:`ha_controller.client.tools.due_ts_ms`)."""
    if sent.receipt is None:
        assert sent.error is not None
        return {"key": sent.key, "error": type(sent.error).__name__, "detail": str(sent.error)}
    r = sent.receipt
    line: dict[str, Any] = {
        "msg_id": r.uniq_key,
        "key": sent.key,
        "topic": sent.topic,
        "broker": r.broker_name,
        "queue_id": r.queue_id,
        "queue_offset": r.queue_offset,
    }
    due = sent.due_ts_ms
    if due is None and delay_level:
        from ha_controller.client.tools import due_ts_ms

        due = due_ts_ms(sent.sent_at_ms, delay_level=delay_level)
    if due is not None:
        line["due_ts_ms"] = due
    return line


def received_line(m: ReceivedMessage, received_ts_ms: int) -> dict[str, Any]:
    """One ``hactl consume --json`` object."""
    return {
        "msg_id": m.uniq_key,
        "key": m.key,
        "topic": m.topic,
        "broker": m.broker_name,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "body_len": len(m.body),
        "born_ts_ms": m.born_ts_ms,
        "received_ts_ms": received_ts_ms,
    }


def produce_exit_code(stats: ProduceStats) -> int:
    """0 when every send was acknowledged, 1 when none was, 3 in between."""
    if stats.failed == 0:
        return EXIT_OK
    return EXIT_PARTIAL if stats.acknowledged else EXIT_FAILED


def produce_summary(stats: ProduceStats, elapsed_s: float) -> list[str]:
    """The human summary: counts, then one line per kind of error with its reason."""
    rate = f", {stats.sent / elapsed_s:,.0f} msg/s" if elapsed_s > 0 and stats.sent else ""
    lines = [
        f"sent {stats.sent}, acknowledged {stats.acknowledged}, failed {stats.failed} "
        f"in {elapsed_s:.1f} s{rate}"
    ]
    for name, n in sorted(stats.errors.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {n} x {name}: {stats.reasons.get(name, '')}".rstrip())
    return lines


async def _produce(args: argparse.Namespace) -> int:
    from ha_controller.cli.progress import reporter
    from ha_controller.client.tools import produce

    if args.message_group is not None and (args.delay_level or args.deliver_at is not None):
        print(
            "hactl produce: a FIFO message (--message-group) cannot also be delayed "
            "(--delay-level, --deliver-at)",
            file=sys.stderr,
        )
        return 2

    tls = client_tls(args)  # a bad TLS setting fails before anything is shown
    credentials = client_credentials(args)

    def on_sent(sent: Sent) -> None:
        print(json.dumps(sent_line(sent)), flush=True)

    bar = reporter(
        f"produce {args.topic}", args.count, enabled=not args.no_progress, json_output=args.json
    )

    def progress(stats: ProduceStats) -> None:
        failed = f", failed {stats.failed}" if stats.failed else ""
        bar.update(stats.sent, f"acked {stats.acknowledged}{failed}")

    started = time.monotonic()
    try:
        stats = await produce(
            comma_list(args.namesrv),
            args.topic,
            args.count,
            rate=args.rate,
            size=args.size,
            delay_level=args.delay_level,
            deliver_ts_ms=args.deliver_at,
            message_group=args.message_group,
            on_sent=on_sent if args.json else None,
            progress=progress,
            tls=tls,
            credentials=credentials,
        )
    finally:
        bar.close()
    if args.json:
        summary: dict[str, Any] = {
            "sent": stats.sent,
            "acknowledged": stats.acknowledged,
            "failed": stats.failed,
        }
        if stats.errors:
            summary["errors"] = {
                name: {"count": n, "reason": stats.reasons.get(name, "")}
                for name, n in sorted(stats.errors.items())
            }
        print(json.dumps({"summary": summary}), flush=True)
    else:
        for line in produce_summary(stats, time.monotonic() - started):
            print(line, file=sys.stderr)
    return produce_exit_code(stats)


async def _consume(args: argparse.Namespace) -> int:
    from ha_controller.cli.progress import reporter
    from ha_controller.client.tools import ConsumeStats, consume, now_ms

    tls = client_tls(args)
    credentials = client_credentials(args)

    def on_message(m: ReceivedMessage) -> None:
        print(json.dumps(received_line(m, now_ms())), flush=True)

    bar = reporter(
        f"consume {args.topic} as {args.group}",
        args.count,
        enabled=not args.no_progress,
        json_output=args.json,
    )

    def progress(stats: ConsumeStats) -> None:
        bar.update(stats.received, f"{stats.duplicates} twice" if stats.duplicates else "")

    try:
        stats = await consume(
            comma_list(args.namesrv),
            args.topic,
            args.group,
            count=args.count,
            timeout_s=args.timeout,
            on_message=on_message if args.json else None,
            progress=progress,
            tls=tls,
            credentials=credentials,
        )
    finally:
        bar.close()
    short = args.count is not None and stats.received < args.count
    if args.json:
        print(json.dumps({"summary": {"received": stats.received}}), flush=True)
    else:
        twice = f", {stats.duplicates} delivered twice" if stats.duplicates else ""
        expected = f"; expected {args.count} within {args.timeout:g} s" if short else ""
        print(
            f"received {stats.received} ({len(stats.keys)} distinct keys{twice}){expected}",
            file=sys.stderr,
        )
    return EXIT_FAILED if short else EXIT_OK
