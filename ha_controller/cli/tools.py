"""The tools: ``hactl produce``, ``consume``, ``topic create``, ``groups`` and ``route``.

Every tool takes ``--namesrv H:P[,H:P]``; ``--json`` makes the output
machine-readable: ``produce`` and ``consume`` print one object per message on stdout
and a ``{"summary": ...}`` object last (DESIGN.md §8), the others one document.
Human-readable progress and summaries go to stderr.  The client SDK is imported when a
tool runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ha_controller.cli.common import DEFAULT_NAMESRV, comma_list, print_table, run_async

if TYPE_CHECKING:
    from ha_controller.client.message import ReceivedMessage
    from ha_controller.client.tools import ProduceStats, Sent

__all__ = ["add_commands"]

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def add_commands(sub: Any) -> None:
    """Add ``produce``, ``consume``, ``topic``, ``groups`` and ``route``."""

    def tool(name: str, help_text: str, fn: Handler) -> argparse.ArgumentParser:
        t: argparse.ArgumentParser = sub.add_parser(name, help=help_text)
        t.add_argument("--namesrv", default=DEFAULT_NAMESRV, help="nameserver(s) H:P[,H:P]")
        t.add_argument("--json", action="store_true", help="machine-readable output")
        t.set_defaults(func=run_async(fn))
        return t

    pr = tool("produce", "send messages (each with a unique key)", _produce)
    pr.add_argument("--topic", required=True)
    pr.add_argument("--count", type=int, default=100)
    pr.add_argument("--rate", type=float, help="messages per second (default: as fast as acked)")
    pr.add_argument("--size", type=int, default=128, help="body size in bytes")
    pr.add_argument("--delay-level", type=int, default=0, help="1..18 (1s .. 2h)")
    pr.add_argument("--message-group", help="FIFO message group")
    co = tool("consume", "receive messages as a push consumer", _consume)
    co.add_argument("--topic", required=True)
    co.add_argument("--group", required=True, help="consumer group")
    co.add_argument("--count", type=int, help="exit 0 only once this many keys arrived")
    co.add_argument("--timeout", type=float, default=30.0, help="seconds to wait")
    topic = sub.add_parser("topic", help="manage topics")
    topic_sub = topic.add_subparsers(dest="topic_command", required=True, metavar="ACTION")
    tc = topic_sub.add_parser("create", help="create or update a topic on every master")
    tc.add_argument("topic")
    tc.add_argument("--namesrv", default=DEFAULT_NAMESRV, help="nameserver(s) H:P[,H:P]")
    tc.add_argument("--cluster", help="only masters of this cluster")
    tc.add_argument("--queues", type=int, default=4)
    tc.add_argument("--perm", type=int, default=6, help="READ 4 | WRITE 2 | INHERIT 1")
    tc.set_defaults(func=run_async(_topic_create))
    tool("groups", "show broker groups, their members and acting masters", _groups)
    r = tool("route", "show a topic's route as clients see it", _route)
    r.add_argument("topic")


# ---- produce / consume ---------------------------------------------------------------


def sent_line(sent: Sent, *, delay_level: int) -> dict[str, Any]:
    """One ``hactl produce --json`` object: the receipt, or the error of a failed send."""
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
    if delay_level:
        line["due_ts_ms"] = sent.sent_at_ms  # refined by the caller's delay table
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


async def _produce(args: argparse.Namespace) -> int:
    from ha_controller.client.tools import produce

    def on_sent(sent: Sent) -> None:
        print(json.dumps(sent_line(sent, delay_level=args.delay_level)), flush=True)

    def progress(stats: ProduceStats) -> None:
        if not args.json:
            print(f"\r{stats}", end="", file=sys.stderr, flush=True)

    stats = await produce(
        comma_list(args.namesrv),
        args.topic,
        args.count,
        rate=args.rate,
        size=args.size,
        delay_level=args.delay_level,
        message_group=args.message_group,
        on_sent=on_sent if args.json else None,
        progress=progress,
    )
    summary = {"sent": stats.sent, "acknowledged": stats.acknowledged, "failed": stats.failed}
    if args.json:
        print(json.dumps({"summary": summary}))
    else:
        print(
            f"\rsent {stats.sent}, acknowledged {stats.acknowledged}, failed {stats.failed}"
            + (f" {stats.errors}" if stats.errors else ""),
            file=sys.stderr,
        )
    return 0 if stats.acknowledged > 0 or args.count == 0 else 1


async def _consume(args: argparse.Namespace) -> int:
    from ha_controller.client.tools import consume, now_ms

    def on_message(m: ReceivedMessage) -> None:
        print(json.dumps(received_line(m, now_ms())), flush=True)

    stats = await consume(
        comma_list(args.namesrv),
        args.topic,
        args.group,
        count=args.count,
        timeout_s=args.timeout,
        on_message=on_message if args.json else None,
    )
    if args.json:
        print(json.dumps({"summary": {"received": stats.received}}))
    else:
        print(f"received {stats.received} ({len(stats.keys)} distinct keys)", file=sys.stderr)
    if args.count is None:
        return 0
    return 0 if len(stats.keys) >= args.count else 1


# ---- topics, groups, routes ------------------------------------------------------------


async def _topic_create(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient(comma_list(args.namesrv)) as ns:
        created = await ns.create_topic(
            args.topic, cluster=args.cluster, queues=args.queues, perm=args.perm
        )
    print(f"topic {args.topic} created on {', '.join(created) or 'no master'}")
    return 0 if created else 1


async def _groups(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient(comma_list(args.namesrv)) as ns:
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
                    }
                    for g in groups
                ]
            )
        )
        return 0
    rows = [
        (
            g.cluster,
            g.broker_name,
            "yes" if g.master_online else "NO",
            "-" if g.acting_broker_id is None else g.acting_broker_id,
            " ".join(f"{k}={v}" for k, v in sorted(g.members.items())),
        )
        for g in groups
    ]
    print_table(("CLUSTER", "GROUP", "MASTER", "ACTING", "MEMBERS"), rows)
    return 0


async def _route(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient
    from ha_controller.routing import Perm

    async with NameserverClient(comma_list(args.namesrv)) as ns:
        route = await ns.route(args.topic)
    if args.json:
        print(json.dumps(route.to_json()))
        return 0
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
    return 0
