"""``hactl message query``: find messages by key or by id (RocketMQ's ``queryMsgByKey``
and ``queryMsgById``), from every broker group's master, or its acting slave while the
master is away (the brokers' key index, broker_agent/store/keyindex.py)."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from typing import Any

from ha_controller.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PARTIAL,
    add_namesrv_arguments,
    add_parser,
    client_credentials,
    client_tls,
    comma_list,
    int_range,
    print_table,
    run_async,
)

__all__ = ["add_commands"]

#: nothing found (and every group answered); nothing found and some group could not be
#: asked (the message may be there) is EXIT_PARTIAL
EXIT_NOT_FOUND = EXIT_FAILED

QUERY_EPILOG = """\
exit status:
  0  at least one message found
  1  no message found, every broker group answered (or the nameserver could not be reached)
  2  bad arguments
  3  no message found, but some broker group could not be asked
"""


def add_commands(sub: Any) -> None:
    message = add_parser(sub, "message", help="look messages up", description="Look messages up.")
    msub = message.add_subparsers(dest="message_command", required=True, metavar="ACTION")
    q = add_parser(
        msub,
        "query",
        help="find messages by key (--topic T --key K) or by id (--id ID)",
        description=textwrap.fill(
            "Find messages by message key (the KEYS a producer set; space-separated keys are "
            "indexed one by one) in a topic, optionally within store times, or by message "
            "id (the id a producer's send returned: the unique key, or an offset message "
            "id).  Every broker group of the topic's route (or of the cluster, for --id) is "
            "asked at its master, or at its acting slave while the master is away; the "
            "answers are merged newest first.  Each group answers at most --max messages."
        ),
        epilog=QUERY_EPILOG,
    )
    add_namesrv_arguments(q)
    q.add_argument("--json", action="store_true", help="machine-readable output")
    what = q.add_mutually_exclusive_group(required=True)
    what.add_argument("--key", help="message key (needs --topic)")
    what.add_argument("--id", dest="msg_id", metavar="ID", help="message id")
    q.add_argument("--topic", help="the topic of --key")
    q.add_argument("--cluster", help="only this cluster's groups (--id)")
    q.add_argument(
        "--begin-ms",
        type=int_range(0),
        default=0,
        metavar="MS",
        help="stored at or after (epoch ms)",
    )
    q.add_argument(
        "--end-ms",
        type=int_range(0),
        default=0,
        metavar="MS",
        help="stored at or before (epoch ms)",
    )
    q.add_argument(
        "--max", dest="max_num", type=int_range(1, 64), default=32, help="messages per group"
    )
    q.set_defaults(func=run_async(_query))


def _line(broker: str, m: Any) -> dict[str, Any]:
    return {
        "broker": broker,
        "topic": m.topic,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "store_ts_ms": m.store_ts_ms,
        "born_ts_ms": m.born_ts_ms,
        "keys": m.keys.split(),
        "tags": m.tags or None,
        "msg_id": m.uniq_key or m.offset_msg_id,
        "offset_msg_id": m.offset_msg_id,
        "body_len": m.body_size,
    }


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"


async def _query(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    if args.key is not None and not args.topic:
        print("hactl message query: --key needs --topic", file=sys.stderr)
        return 2
    if args.end_ms and args.end_ms < args.begin_ms:
        print("hactl message query: --end-ms is before --begin-ms", file=sys.stderr)
        return 2
    async with NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    ) as ns:
        result = await ns.query_messages(
            topic=args.topic,
            key=args.key,
            msg_id=args.msg_id,
            begin_ms=args.begin_ms,
            end_ms=args.end_ms,
            max_num=args.max_num,
            cluster=args.cluster,
        )
    lines = [_line(broker, m) for broker, m in result.found]
    if args.json:
        print(json.dumps({"messages": lines, "failed": result.failed}))
    else:
        print_table(
            ("BROKER", "TOPIC", "QUEUE", "OFFSET", "STORED", "KEYS", "BODY", "MSG ID"),
            [
                (
                    x["broker"],
                    x["topic"],
                    x["queue_id"],
                    x["queue_offset"],
                    _when(x["store_ts_ms"]),
                    " ".join(x["keys"]) or "-",
                    x["body_len"],
                    x["msg_id"],
                )
                for x in lines
            ],
        )
        print(f"{len(lines)} message(s)")
    for group, why in sorted(result.failed.items()):
        print(f"hactl message query: group {group} not asked: {why}", file=sys.stderr)
    if lines:
        return EXIT_OK
    return EXIT_PARTIAL if result.failed else EXIT_NOT_FOUND
