"""The tools: ``hactl produce``, ``consume``, ``topic create|update|delete|list|describe``,
``groups`` and ``route``.

Every tool takes ``--namesrv H:P[,H:P]`` and the TLS options (``--tls-ca``,
``--tls-cert``, ``--tls-key``, or ``HAC_TLS_*``: :func:`.common.client_tls`) and the ACL
credentials (``--access-key``/``--secret-key`` or ``HAC_ACCESS_KEY``/``HAC_SECRET_KEY``:
:func:`.common.client_credentials`);
``--json`` makes the output machine-readable: ``produce`` and ``consume`` print one
object per message on stdout and a ``{"summary": ...}`` object last, the others one
document.  Human-readable
progress and summaries go to stderr (:mod:`.progress`).  Arguments are checked by
argparse before anything is sent (topic names, queue counts and permissions by
:mod:`ha_controller.protocol.topics`, the brokers' own rules).  The client SDK is
imported when a tool runs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ha_controller.cli.common import (
    DEFAULT_NAMESRV,
    add_credential_arguments,
    add_parser,
    add_tls_arguments,
    client_credentials,
    client_tls,
    comma_list,
    float_above,
    int_range,
    print_table,
    run_async,
)
from ha_controller.protocol.errors import BadRequest, InSyncReplicasNotEnough
from ha_controller.protocol.properties import DEFAULT_DELAY_LEVELS, MAX_DELAY_LEVEL
from ha_controller.protocol.topics import (
    MAX_QUEUE_NUMS,
    TopicMessageType,
    perm_problem,
    reserved_prefix,
    topic_name_problem,
)

if TYPE_CHECKING:
    from ha_controller.client.admin import GroupInfo, GroupLag
    from ha_controller.client.message import ReceivedMessage
    from ha_controller.client.tools import ProduceStats, Sent

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_PARTIAL", "add_commands", "produce_exit_code"]

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]

EXIT_OK = 0
#: nothing acknowledged (produce), too few messages in time (consume), refused
EXIT_FAILED = 1
#: produce: some sends acknowledged, some failed
EXIT_PARTIAL = 3

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

DELETE_EPILOG = """\
exit status:
  0  every broker that had the topic dropped it and every nameserver forgot its route
  1  no broker had the topic, or a broker could not be asked
  3  the brokers dropped it, but a nameserver still routes it (a nameserver without
     DELETE_TOPIC_IN_NAMESRV keeps the route while the groups live; a send to the
     topic then creates it again)

The topic's messages stay in the brokers' stores until retention removes them.
"""

LAG_EPILOG = """\
exit status:
  0  every broker group answered
  1  no broker group holds an offset of the group (or none could be asked)
  3  some broker groups answered, others could not be asked (each is named)

With --json one document {"group", "lag", "queues": [{"topic", "brokerName",
"brokerId", "queueId", "maxOffset", "consumerOffset", "lag", "oldestAgeMs"}],
"failed": {brokerName: reason}}; brokerId is the member that answered (0, or the
acting slave's id), consumerOffset -1 and oldestAgeMs null where nothing is committed
or nothing waits.
"""

MESSAGE_TYPE_HELP = (
    "the messages the topic takes: NORMAL, FIFO, DELAY, TRANSACTION, PRIORITY or LITE only "
    "that kind, MIXED every kind (what topics made before message types take)"
)
TOPIC_RULES = (
    "A topic name is 1..127 characters of [%|a-zA-Z0-9_-]; the prefixes %RETRY%, "
    "%DLQ%, rmq_sys_, SCHEDULE_TOPIC, RMQ_SYS_ (and TBW102) are the brokers' own.  "
    f"A topic has 1..{MAX_QUEUE_NUMS} queues per broker group; perm is READ 4 | WRITE 2 "
    "| INHERIT 1 with READ or WRITE (6 = read-write, 4 = read-only, 2 = write-only)."
)


# ---- argument types -----------------------------------------------------------------


def topic_name(text: str) -> str:
    """A topic a client may create or change (no reserved prefix)."""
    problem = topic_name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def any_topic_name(text: str) -> str:
    """A well-formed topic name, the brokers' own included (to read or send to)."""
    problem = topic_name_problem(text, allow_reserved=True)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def message_type(text: str) -> TopicMessageType:
    """A topic message type (NORMAL, FIFO, DELAY, TRANSACTION, PRIORITY, LITE, MIXED; any
    case)."""
    if not text:
        raise argparse.ArgumentTypeError("a message type must not be empty")
    try:
        return TopicMessageType.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def perm(text: str) -> int:
    """A topic permission (see :func:`ha_controller.protocol.topics.perm_problem`)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    problem = perm_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


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


# ---- the commands ---------------------------------------------------------------------


def add_commands(sub: Any) -> None:
    """Add ``produce``, ``consume``, ``topic``, ``groups`` and ``route``."""

    def namesrv(t: argparse.ArgumentParser) -> None:
        t.add_argument(
            "--namesrv", default=DEFAULT_NAMESRV, metavar="H:P", help="nameserver(s) H:P[,H:P]"
        )
        add_tls_arguments(t)
        add_credential_arguments(t)

    def tool(name: str, help_text: str, fn: Handler, **kwargs: Any) -> argparse.ArgumentParser:
        t = add_parser(sub, name, help=help_text, description=help_text, **kwargs)
        namesrv(t)
        t.add_argument("--json", action="store_true", help="machine-readable output")
        t.set_defaults(func=run_async(fn))
        return t

    pr = tool("produce", "send messages (each with a unique key)", _produce, epilog=PRODUCE_EPILOG)
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

    co = tool("consume", "receive messages as a push consumer", _consume, epilog=CONSUME_EPILOG)
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

    topic = add_parser(
        sub,
        "topic",
        help="manage topics",
        description=textwrap.fill("Manage topics.  " + TOPIC_RULES),
    )
    topic_sub = topic.add_subparsers(dest="topic_command", required=True, metavar="ACTION")

    def action(name: str, help_text: str, fn: Handler, **kwargs: Any) -> argparse.ArgumentParser:
        t = add_parser(
            topic_sub,
            name,
            help=help_text,
            description=textwrap.fill(f"{help_text}.  {TOPIC_RULES}"),
            **kwargs,
        )
        namesrv(t)
        t.set_defaults(func=run_async(fn))
        return t

    tc = action("create", "create a new topic on every master (refused if it exists)", _create)
    tc.add_argument("topic", type=topic_name, help="the new topic's name")
    tc.add_argument("--cluster", help="only the masters of this cluster (default: all)")
    tc.add_argument(
        "--queues",
        type=int_range(1, MAX_QUEUE_NUMS, unit="queues"),
        default=4,
        help=f"read and write queues per broker group (1..{MAX_QUEUE_NUMS})",
    )
    tc.add_argument("--perm", type=perm, default=6, help="READ 4 | WRITE 2 | INHERIT 1")
    tc.add_argument(
        "--message-type",
        type=message_type,
        default=TopicMessageType.NORMAL,
        help=MESSAGE_TYPE_HELP + " (default NORMAL, as RocketMQ)",
    )

    tu = action("update", "change only the given settings of a topic on every master", _update)
    tu.add_argument("topic", type=topic_name, help="an existing topic")
    tu.add_argument("--cluster", help="only the masters of this cluster (default: all)")
    queues = int_range(1, MAX_QUEUE_NUMS, unit="queues")
    tu.add_argument("--queues", type=queues, help="read and write queues per broker group")
    tu.add_argument("--read-queues", type=queues, help="read queues per broker group")
    tu.add_argument("--write-queues", type=queues, help="write queues per broker group")
    tu.add_argument("--perm", type=perm, help="READ 4 | WRITE 2 | INHERIT 1")
    tu.add_argument("--message-type", type=message_type, help=MESSAGE_TYPE_HELP)

    td = action(
        "delete",
        "delete a topic on every broker, then ask the nameservers to forget its route",
        _delete,
        epilog=DELETE_EPILOG,
    )
    td.add_argument("topic", type=topic_name, help="the topic to delete")
    td.add_argument("--cluster", help="only the groups of this cluster (default: all)")

    tl = action("list", "list the topics of every broker group", _list)
    tl.add_argument("--cluster", help="only the groups of this cluster (default: all)")
    tl.add_argument("--all", action="store_true", help="include the brokers' own topics")
    tl.add_argument("--json", action="store_true", help="machine-readable output")

    ts = action("describe", "a topic's route and the min/max offset of every queue", _describe)
    ts.add_argument("topic", type=any_topic_name, help="the topic to describe")
    ts.add_argument("--json", action="store_true", help="machine-readable output")

    group = add_parser(
        sub,
        "group",
        help="manage consumer groups' settings",
        description="Manage consumer groups' own settings (RocketMQ subscription group configs).",
    )
    group_sub = group.add_subparsers(dest="group_command", required=True, metavar="ACTION")
    gu = add_parser(
        group_sub,
        "update",
        help="set a consumer group's settings on every master",
        description=textwrap.fill(
            "Set a consumer group's settings on every master.  --orderly makes its POP "
            "orderly (RocketMQ's consumeMessageOrderly): each queue goes to one batch at a "
            "time, until the batch is acked or its invisible time is over; the gRPC gateway "
            "then tells the group's SDK clients to consume FIFO."
        ),
    )
    namesrv(gu)
    gu.add_argument("group", type=group_name, help="the consumer group")
    gu.add_argument("--cluster", help="only the masters of this cluster (default: all)")
    orderly = gu.add_mutually_exclusive_group(required=True)
    orderly.add_argument(
        "--orderly",
        dest="orderly",
        action="store_true",
        default=argparse.SUPPRESS,
        help="consume in order",
    )
    orderly.add_argument(
        "--no-orderly",
        dest="orderly",
        action="store_false",
        default=argparse.SUPPRESS,
        help="consume concurrently",
    )
    gu.set_defaults(func=run_async(_group_update))
    gd = add_parser(
        group_sub,
        "describe",
        help="a consumer group's settings on every broker group",
        description="A consumer group's settings, as each broker group's master has them.",
    )
    namesrv(gd)
    gd.add_argument("group", type=group_name, help="the consumer group")
    gd.add_argument("--cluster", help="only the masters of this cluster (default: all)")
    gd.add_argument("--json", action="store_true", help="machine-readable output")
    gd.set_defaults(func=run_async(_group_describe))
    gl = add_parser(
        group_sub,
        "lag",
        help="a consumer group's lag on every queue",
        description=textwrap.fill(
            "A consumer group's lag on every queue of every broker group, as the group's "
            "master (or the slave acting for it) computes it for "
            "rocketmq_consumer_lag_messages: the queue's max offset, the group's committed "
            "offset, the lag (their difference) and how long the oldest unconsumed message "
            "has waited.  A queue the group committed nothing for shows '-' and counts no "
            "lag, as in RocketMQ."
        ),
        epilog=LAG_EPILOG,
    )
    namesrv(gl)
    gl.add_argument("group", type=group_name, help="the consumer group")
    gl.add_argument("--topic", type=any_topic_name, help="only this topic")
    gl.add_argument("--cluster", help="only the broker groups of this cluster (default: all)")
    gl.add_argument("--json", action="store_true", help="machine-readable output")
    gl.set_defaults(func=run_async(_group_lag))
    gs = add_parser(
        group_sub,
        "switch",
        help="make another member a broker group's master (controller mode)",
        description=textwrap.fill(
            "Planned handover of a broker group's master (controller mode: the nameservers "
            "run with --etcd-endpoints).  The master stops taking writes, the target member "
            "catches up with it, the controller moves the group to a new epoch with the "
            "target as master (brokerId 0) and the old master rejoins as a slave.  Writes "
            "to the group pause for about half a second; nothing acknowledged is lost.  "
            "The target must be in the group's sync-state set (hactl groups shows it); "
            "--to auto takes its lowest member other than the master.  "
            "This is what a Kubernetes preStop hook or a node drain calls: with "
            "--if-master ID it switches only when member ID is the master, and does "
            "nothing (exit 0) on any other member."
        ),
    )
    namesrv(gs)
    gs.add_argument("broker_group", metavar="GROUP", help="the broker group (broker name)")
    gs.add_argument(
        "--to",
        dest="target",
        type=switch_target_arg,
        required=True,
        metavar="ID|auto",
        help=(
            "member id (configured broker_id) of the new master, or auto: the lowest "
            "in-sync slave of the nameserver's group view"
        ),
    )
    gs.add_argument(
        "--if-master",
        dest="if_master",
        type=int,
        metavar="ID",
        help="switch only when member ID is the group's master now; otherwise do nothing",
    )
    gs.add_argument("--cluster", default="DefaultCluster", help="its cluster (default %(default)s)")
    gs.add_argument(
        "--timeout-ms",
        type=int,
        default=3000,
        metavar="MS",
        help="how long the master may pause for the target (default %(default)s)",
    )
    gs.add_argument("--json", action="store_true", help="machine-readable output")
    gs.set_defaults(func=run_async(_group_switch))

    tool("groups", "show broker groups, their members and acting masters", _groups)
    r = tool("route", "show a topic's route as clients see it", _route)
    r.add_argument("topic", type=any_topic_name, help="the topic whose route to show")


# ---- produce / consume ---------------------------------------------------------------


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


# ---- topics, groups, routes ------------------------------------------------------------


async def _create(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient, TopicExists

    async with NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    ) as ns:
        try:
            created = await ns.create_topic(
                args.topic,
                cluster=args.cluster,
                queues=args.queues,
                perm=args.perm,
                exist_ok=False,
                message_type=args.message_type,
            )
        except TopicExists as exc:
            print(
                f"hactl topic create: {exc}; change it with: hactl topic update {args.topic} "
                "[--queues N] [--perm P]",
                file=sys.stderr,
            )
            return EXIT_FAILED
    if not created:
        where = f"cluster {args.cluster}" if args.cluster else "the cluster"
        print(f"hactl topic create: no master of {where} is online", file=sys.stderr)
        return EXIT_FAILED
    print(f"topic {args.topic} created on {', '.join(created)}")
    return EXIT_OK


async def _update(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient
    from ha_controller.routing import Perm

    if args.queues is not None and (args.read_queues is not None or args.write_queues is not None):
        print(
            "hactl topic update: --queues sets both; use it or --read-queues/--write-queues",
            file=sys.stderr,
        )
        return 2
    read_q = args.queues if args.queues is not None else args.read_queues
    write_q = args.queues if args.queues is not None else args.write_queues
    if read_q is None and write_q is None and args.perm is None and args.message_type is None:
        print(
            "hactl topic update: nothing to change (--queues, --read-queues, --write-queues, "
            "--perm, --message-type)",
            file=sys.stderr,
        )
        return 2
    async with NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    ) as ns:
        changes = await ns.update_topic(
            args.topic,
            cluster=args.cluster,
            read_queues=read_q,
            write_queues=write_q,
            perm=args.perm,
            message_type=args.message_type,
        )

    def show(c: Any) -> str:
        return (
            f"queues {c.read_queue_nums}/{c.write_queue_nums} perm {c.perm} "
            f"({Perm.to_string(c.perm)}) type {c.message_type.value}"
        )

    for group, (before, after) in sorted(changes.items()):
        if before == after:
            print(f"topic {args.topic} on {group}: unchanged, {show(after)}")
        else:
            print(f"topic {args.topic} on {group}: {show(before)} -> {show(after)}")
    return EXIT_OK


async def _delete(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    ) as ns:
        result = await ns.delete_topic(args.topic, cluster=args.cluster)
    if result.deleted:
        print(f"topic {args.topic} deleted on {', '.join(result.deleted)}")
    elif not result.failed:
        print(f"hactl topic delete: no broker has topic {args.topic}", file=sys.stderr)
    if result.nameservers_forgot:
        print(f"no route for {args.topic} on nameserver {', '.join(result.nameservers_forgot)}")
    for name, why in sorted(result.failed.items()):
        print(f"hactl topic delete: {name} failed: {why}", file=sys.stderr)
    for addr, why in sorted(result.nameservers_kept.items()):
        print(
            f"hactl topic delete: nameserver {addr} still routes {args.topic}: {why}",
            file=sys.stderr,
        )
    if result.failed or not result.deleted:
        return EXIT_FAILED
    return EXIT_PARTIAL if result.nameservers_kept else EXIT_OK


async def _list(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient
    from ha_controller.routing import Perm

    async with NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    ) as ns:
        tables = await ns.topic_tables(args.cluster)
    rows = sorted(
        (topic, group, config)
        for group, table in tables.items()
        for topic, config in table.items()
        if args.all or reserved_prefix(topic) is None
    )
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "topic": t,
                        "brokerName": g,
                        **{k: v for k, v in c.to_json().items() if k != "topicName"},
                    }
                    for t, g, c in rows
                ]
            )
        )
        return EXIT_OK
    print_table(
        ("TOPIC", "GROUP", "QUEUES R/W", "PERM", "TYPE"),
        [
            (
                t,
                g,
                f"{c.read_queue_nums}/{c.write_queue_nums}",
                f"{c.perm} ({Perm.to_string(c.perm)})",
                c.message_type.value,
            )
            for t, g, c in rows
        ],
    )
    return EXIT_OK


async def _describe(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    ) as ns:
        route = await ns.route(args.topic)
        offsets = await ns.queue_offsets(route)
    if args.json:
        print(
            json.dumps(
                {
                    "topic": args.topic,
                    "route": route.to_json(),
                    "queues": [
                        {
                            "brokerName": q.broker_name,
                            "queueId": q.queue_id,
                            "minOffset": q.min_offset,
                            "maxOffset": q.max_offset,
                        }
                        for q in offsets
                    ],
                }
            )
        )
        return EXIT_OK
    print(f"topic {args.topic}: route as clients see it")
    _print_route(route)
    print()
    print("queues (offsets from each group's id-0 broker):")
    print_table(
        ("GROUP", "QUEUE", "MIN", "MAX", "MESSAGES"),
        [(q.broker_name, q.queue_id, q.min_offset, q.max_offset, q.messages) for q in offsets],
    )
    total = sum(q.messages for q in offsets)
    print(f"total: {total} messages in {len(offsets)} queues")
    return EXIT_OK


def switch_target_arg(text: str) -> int | None:
    """``--to``: a member id, or ``auto`` (None: chosen from the group view)."""
    if text == "auto":
        return None
    try:
        member = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a member id or auto, got {text!r}") from None
    if member < 0:
        raise argparse.ArgumentTypeError(f"a member id is 0 or more, got {member}")
    return member


def switch_target(group: GroupInfo, target: int | None, if_master: int | None) -> int | None:
    """The member ``hactl group switch`` makes master: ``target``, or for ``auto`` the
    lowest member of the sync-state set other than the master; None when ``if_master``
    names a member that is not the master (nothing to do)."""
    if group.epoch is None or group.master_member is None:
        raise BadRequest(
            f"{group.broker_name}: not in controller mode (the nameservers run without "
            "--etcd-endpoints), so it has no master to switch"
        )
    if if_master is not None and if_master != group.master_member:
        return None
    if target is not None:
        return target
    slaves = sorted(m for m in group.sync_state_set if m != group.master_member)
    if not slaves:
        raise InSyncReplicasNotEnough(
            f"{group.broker_name}: the sync-state set {list(group.sync_state_set)} holds no "
            f"slave besides master {group.master_member}: no member can take over now"
        )
    return slaves[0]


async def _group_switch(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    ) as ns:
        target = args.target
        if target is None or args.if_master is not None:
            found = [
                g
                for g in await ns.groups()
                if g.cluster == args.cluster and g.broker_name == args.broker_group
            ]
            if not found:
                raise BadRequest(f"no broker group {args.broker_group} in cluster {args.cluster}")
            target = switch_target(found[0], target, args.if_master)
            if target is None:
                master = found[0].master_member
                if args.json:
                    print(json.dumps({"group": args.broker_group, "masterId": master}))
                else:
                    print(
                        f"{args.broker_group}: member {args.if_master} is not the master "
                        f"(member {master} is): nothing to switch"
                    )
                return EXIT_OK
        resp = await ns.switch_master(
            args.cluster, args.broker_group, target, timeout_ms=args.timeout_ms
        )
    state = resp.controller.state
    out = {
        "group": args.broker_group,
        "epoch": state.epoch,
        "masterId": state.master_member,
        "syncStateSet": sorted(state.sync_state_set),
        "pausedMs": resp.paused_ms,
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"{args.broker_group}: member {state.master_member} is master of epoch "
            f"{state.epoch} (writes paused {resp.paused_ms} ms on the old master; "
            f"sync-state set {sorted(state.sync_state_set)})"
        )
    return EXIT_OK


async def _groups(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    ) as ns:
        groups = await ns.groups()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "cluster": g.cluster,
                        "brokerName": g.broker_name,
                        "enableActingMaster": g.enable_acting_master,
                        "members": {str(k): v for k, v in sorted(g.members.items())},
                        "masterOnline": g.master_online,
                        "actingBrokerId": g.acting_broker_id,
                        **(
                            {
                                "epoch": g.epoch,
                                "masterId": g.master_member,
                                "syncStateSet": list(g.sync_state_set),
                            }
                            if g.epoch is not None
                            else {}
                        ),
                    }
                    for g in groups
                ]
            )
        )
        return EXIT_OK
    controlled = any(g.epoch is not None for g in groups)
    rows = [
        (
            g.cluster,
            g.broker_name,
            "yes" if g.master_online else "NO",
            "-" if g.acting_broker_id is None else g.acting_broker_id,
            *(
                (
                    "-" if g.epoch is None else g.epoch,
                    "-" if g.master_member is None else g.master_member,
                    ",".join(str(m) for m in g.sync_state_set) or "-",
                )
                if controlled
                else ()
            ),
            " ".join(f"{k}={v}" for k, v in sorted(g.members.items())),
        )
        for g in groups
    ]
    head: tuple[str, ...] = ("CLUSTER", "GROUP", "MASTER", "ACTING")
    if controlled:
        head = (*head, "EPOCH", "MASTER-ID", "SYNC-SET")
    print_table((*head, "MEMBERS"), rows)
    return EXIT_OK


def _print_route(route: Any) -> None:
    from ha_controller.routing import Perm

    rows = []
    for b in route.broker_datas:
        q = route.queue(b.broker_name)
        for bid, addr in sorted(b.broker_addrs.items()):
            rows.append(
                (
                    b.broker_name,
                    bid,
                    addr,
                    "" if q is None else f"{q.read_queue_nums}/{q.write_queue_nums}",
                    "" if q is None else f"{q.perm} ({Perm.to_string(q.perm)})",
                )
            )
    print_table(("GROUP", "ID", "ADDRESS", "QUEUES R/W", "PERM"), rows)


async def _route(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    ) as ns:
        route = await ns.route(args.topic)
    if args.json:
        print(json.dumps(route.to_json()))
        return EXIT_OK
    _print_route(route)
    return EXIT_OK


# ---- consumer group settings ----------------------------------------------------------------


def group_name(text: str) -> str:
    """A consumer group name a client may use (see
    :func:`ha_controller.protocol.topics.group_name_problem`)."""
    from ha_controller.protocol.topics import group_name_problem

    problem = group_name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


async def _group_update(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    ) as ns:
        updated = await ns.update_subscription_group(
            args.group, orderly=args.orderly, cluster=args.cluster
        )
    if not updated:
        where = f"cluster {args.cluster}" if args.cluster else "the cluster"
        print(f"hactl group update: no master of {where} is online", file=sys.stderr)
        return EXIT_FAILED
    mode = "orderly" if args.orderly else "concurrently"
    print(f"group {args.group} consumes {mode} on {', '.join(updated)}")
    return EXIT_OK


def age_text(ms: int | None) -> str:
    """``57s``, ``12m03s``, ``2h05m`` (:func:`.progress.format_duration`); ``-`` for
    None, and sub-second ages as ``0.4s``."""
    from ha_controller.cli.progress import format_duration

    if ms is None:
        return "-"
    return f"{ms / 1000:.1f}s" if ms < 1000 else format_duration(ms / 1000)


def lag_document(lag: GroupLag) -> dict[str, Any]:
    """The ``hactl group lag --json`` document."""
    return {
        "group": lag.group,
        "lag": lag.lag,
        "queues": [
            {
                "topic": q.topic,
                "brokerName": q.broker_name,
                "brokerId": lag.answered_by[q.broker_name],
                "queueId": q.queue_id,
                "maxOffset": q.max_offset,
                "consumerOffset": q.consumer_offset,
                "lag": q.lag,
                "oldestAgeMs": q.oldest_age_ms,
            }
            for q in lag.queues
        ],
        "failed": dict(sorted(lag.failed.items())),
    }


async def _group_lag(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    ) as ns:
        lag = await ns.consumer_lag(args.group, topic=args.topic, cluster=args.cluster)
    if args.json:
        print(json.dumps(lag_document(lag)))
    elif lag.queues:
        ages = [q.oldest_age_ms for q in lag.queues if q.oldest_age_ms is not None]
        oldest = f", oldest unconsumed message {age_text(max(ages))} old" if ages else ""
        print(f"consumer group {args.group}: lag {lag.lag} messages{oldest}")
        for name, member in sorted(lag.answered_by.items()):
            if member != 0:
                print(f"{name}: answered by slave {member}, acting for its master")
        print_table(
            ("TOPIC", "BROKER", "QUEUE", "MAX", "CONSUMER", "LAG", "OLDEST"),
            [
                (
                    q.topic,
                    q.broker_name,
                    q.queue_id,
                    q.max_offset,
                    "-" if q.consumer_offset < 0 else q.consumer_offset,
                    q.lag,
                    age_text(q.oldest_age_ms),
                )
                for q in lag.queues
            ],
        )
    for name, why in sorted(lag.failed.items()):
        print(f"hactl group lag: {name} could not be asked: {why}", file=sys.stderr)
    if not lag.queues:
        if not args.json:
            where = f" for topic {args.topic}" if args.topic else ""
            print(
                f"hactl group lag: consumer group {args.group} has committed no offset{where} "
                f"on {'any broker group that answered' if lag.failed else 'any broker group'}",
                file=sys.stderr,
            )
        return EXIT_FAILED
    return EXIT_PARTIAL if lag.failed else EXIT_OK


async def _group_describe(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    ) as ns:
        per_group = await ns.subscription_group(args.group, args.cluster)
    if args.json:
        print(json.dumps({"group": args.group, "orderly": per_group}))
    else:
        for name, orderly in sorted(per_group.items()):
            state = "not configured" if orderly is None else "orderly" if orderly else "concurrent"
            print(f"{args.group} on {name}: {state}")
    return EXIT_OK
