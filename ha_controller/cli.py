"""``hactl``: the operator's front door.

Service commands start the nameserver or a broker; tools inspect a running
cluster.  Every tool takes ``--namesrv H:P[,H:P]`` and ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ha_controller.protocol.errors import ConfigError, HaError

DEFAULT_NAMESRV = "127.0.0.1:9876"


def _namesrv_list(text: str) -> list[str]:
    return [a.strip() for a in text.split(",") if a.strip()]


# ---- service commands ------------------------------------------------------


def cmd_nameserver(args: argparse.Namespace) -> int:
    from ha_controller.config import load_nameserver_config
    from ha_controller.process import run_until_signalled, setup_logging

    cfg = load_nameserver_config(args.config, {"listen": args.listen, "http_listen": args.http})
    setup_logging(cfg.log_level)
    app = importlib.import_module("nameserver.app")
    run_until_signalled(lambda stop: app.serve(cfg, stop, args.ready_file))
    return 0


# ---- tools -----------------------------------------------------------------


def _print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


async def _groups(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient(_namesrv_list(args.namesrv)) as ns:
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
    _print_table(("CLUSTER", "GROUP", "MASTER", "ACTING", "MEMBERS"), rows)
    return 0


async def _route(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient
    from ha_controller.routing import Perm

    async with NameserverClient(_namesrv_list(args.namesrv)) as ns:
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
    _print_table(("GROUP", "ID", "ADDRESS", "QUEUES R/W", "PERM"), rows)
    return 0


def _async(fn: Callable[[argparse.Namespace], Any]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        result = asyncio.run(fn(args))
        return int(result)

    return run


# ---- parser ----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hactl",
        description="ha-controller: RocketMQ RIP-32 slave-acting-master broker cluster.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ns = sub.add_parser("nameserver", help="run a nameserver")
    ns.add_argument("--config", help="TOML config file")
    ns.add_argument("--listen", help="RPC listen address H:P (default 0.0.0.0:9876; port 0 = any)")
    ns.add_argument("--http", help="admin HTTP listen address H:P (default 0.0.0.0:9877)")
    ns.add_argument("--ready-file", help="write {pid, rpc, http} JSON here once listening")
    ns.set_defaults(func=cmd_nameserver)

    def tool(
        name: str, help_text: str, fn: Callable[[argparse.Namespace], Any]
    ) -> argparse.ArgumentParser:
        t = sub.add_parser(name, help=help_text)
        t.add_argument("--namesrv", default=DEFAULT_NAMESRV, help="nameserver(s) H:P[,H:P]")
        t.add_argument("--json", action="store_true", help="machine-readable output")
        t.set_defaults(func=_async(fn))
        return t

    tool("groups", "show broker groups, their members and acting masters", _groups)
    r = tool("route", "show a topic's route as clients see it", _route)
    r.add_argument("topic")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except ConfigError as exc:
        print(f"hactl: config error: {exc}", file=sys.stderr)
        code = 2
    except HaError as exc:
        print(f"hactl: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
