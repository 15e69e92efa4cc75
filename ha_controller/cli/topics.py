"""``hactl topic create|update|delete|list|describe`` and ``hactl route``.

Every tool takes ``--namesrv H:P[,H:P]`` and the TLS options (``--tls-ca``,
``--tls-cert``, ``--tls-key``, or ``HAC_TLS_*``: :func:`.common.client_tls`) and the ACL
credentials (``--access-key``/``--secret-key`` or ``HAC_ACCESS_KEY``/``HAC_SECRET_KEY``:
:func:`.common.client_credentials`); ``--json`` makes the output machine-readable.
Arguments are checked by argparse before anything is sent (topic names, queue counts and
permissions by :mod:`ha_controller.protocol.topics`, the brokers' own rules).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from typing import TYPE_CHECKING, Any

from ha_controller.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PARTIAL,
    Handler,
    add_namesrv_arguments,
    add_parser,
    add_tool,
    client_credentials,
    client_tls,
    comma_list,
    int_range,
    print_table,
    run_async,
)
from ha_controller.protocol.topics import (
    MAX_QUEUE_NUMS,
    TopicMessageType,
    perm_problem,
    reserved_prefix,
    topic_name_problem,
)

if TYPE_CHECKING:
    pass

__all__ = ["add_commands", "any_topic_name", "message_type", "perm", "topic_name"]

DELETE_EPILOG = """\
exit status:
  0  every broker that had the topic dropped it and every nameserver forgot its route
  1  no broker had the topic, or a broker could not be asked
  3  the brokers dropped it, but a nameserver still routes it (a nameserver without
     DELETE_TOPIC_IN_NAMESRV keeps the route while the groups live; a send to the
     topic then creates it again)

The topic's messages stay in the brokers' stores until retention removes them.
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


def add_commands(sub: Any) -> None:
    """Add ``topic`` and ``route``."""
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
        add_namesrv_arguments(t)
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

    r = add_tool(sub, "route", "show a topic's route as clients see it", _route)
    r.add_argument("topic", type=any_topic_name, help="the topic whose route to show")


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
