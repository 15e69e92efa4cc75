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


def cmd_broker(args: argparse.Namespace) -> int:
    from ha_controller.config import load_broker_configs
    from ha_controller.process import run_until_signalled, setup_logging

    configs = load_broker_configs(
        args.config,
        {
            "cluster": args.cluster,
            "broker_name": args.broker_name,
            "broker_id": args.broker_id,
            "namesrv": args.namesrv,
            "listen": args.listen,
            "ha_listen": args.ha_listen,
            "http": args.http,
            "store_dir": args.store_dir,
        },
    )
    setup_logging(configs[0].log_level)
    if len(configs) == 1:
        app = importlib.import_module("broker_agent.app")
        run_until_signalled(lambda stop: app.serve(configs[0], stop, args.ready_file))
    else:  # a broker container: several brokers in this process
        container = importlib.import_module("broker_agent.container")
        run_until_signalled(lambda stop: container.serve(configs, stop, args.ready_file))
    return 0


def cmd_proxy(args: argparse.Namespace) -> int:
    """The RocketMQ 5 gRPC gateway (ha_controller/proxy, docs/grpc.md)."""
    from ha_controller.process import run_until_signalled, setup_logging

    proxy = importlib.import_module("ha_controller.proxy.app")
    cfg = proxy.ProxyConfig(
        namesrv=tuple(a.strip() for a in args.namesrv.split(",") if a.strip()),
        listen=args.listen,
        http=args.http,
        fifo_groups=frozenset(g.strip() for g in args.fifo_groups.split(",") if g.strip()),
        long_polling_timeout_s=args.long_polling_timeout_s,
    )
    setup_logging(args.log_level)
    run_until_signalled(lambda stop: proxy.serve(cfg, stop, args.ready_file))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    import logging

    from ha_controller.demo import run_demo

    logging.basicConfig(level=logging.ERROR, format="    (%(name)s: %(message)s)")
    return 0 if asyncio.run(run_demo(per_phase=args.messages)) else 1


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


async def _produce(args: argparse.Namespace) -> int:
    from ha_controller.client.tools import produce

    def progress(stats: object) -> None:
        if not args.json:
            print(f"\r{stats}", end="", file=sys.stderr, flush=True)

    stats = await produce(
        _namesrv_list(args.namesrv),
        args.topic,
        args.count,
        rate=args.rate,
        size=args.size,
        delay_level=args.delay_level,
        message_group=args.message_group,
        json_out=args.json,
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
    from ha_controller.client.tools import consume

    stats = await consume(
        _namesrv_list(args.namesrv),
        args.topic,
        args.group,
        count=args.count,
        timeout_s=args.timeout,
        json_out=args.json,
    )
    if args.json:
        print(json.dumps({"summary": {"received": stats.received}}))
    else:
        print(f"received {stats.received} ({len(stats.keys)} distinct keys)", file=sys.stderr)
    if args.count is None:
        return 0
    return 0 if len(stats.keys) >= args.count else 1


async def _topic_create(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient(_namesrv_list(args.namesrv)) as ns:
        created = await ns.create_topic(
            args.topic, cluster=args.cluster, queues=args.queues, perm=args.perm
        )
    print(f"topic {args.topic} created on {', '.join(created) or 'no master'}")
    return 0 if created else 1


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

    br = sub.add_parser("broker", help="run a broker (id 0 = master, others slaves)")
    br.add_argument("--config", help="TOML config file")
    br.add_argument("--cluster", help="cluster name (default DefaultCluster)")
    br.add_argument("--broker-name", help="broker group name")
    br.add_argument("--broker-id", type=int, help="0 = master, 1.. = slaves")
    br.add_argument("--namesrv", help="nameserver(s) H:P[,H:P]")
    br.add_argument("--listen", help="RPC listen address (default 0.0.0.0:10911)")
    br.add_argument("--ha-listen", help="HA listen address (default 0.0.0.0:10912)")
    br.add_argument("--http", help="admin HTTP listen address (default 0.0.0.0:10913)")
    br.add_argument("--store-dir", help="store directory")
    br.add_argument(
        "--ready-file",
        help="write {pid, rpc, http, ha} JSON here once listening "
        "(a container of several brokers: {pid, brokers: [{name, id, rpc, http, ha}]})",
    )
    br.set_defaults(func=cmd_broker)

    px = sub.add_parser("proxy", help="run the RocketMQ 5 gRPC gateway (official SDKs)")
    px.add_argument("--namesrv", default=DEFAULT_NAMESRV, help="nameserver(s) H:P[,H:P]")
    px.add_argument("--listen", default="0.0.0.0:8081", help="gRPC listen H:P (port 0 = any)")
    px.add_argument("--http", help="admin HTTP (healthz, readyz, metrics) listen H:P")
    px.add_argument("--ready-file", help="write {pid, rpc[, http]} JSON here once listening")
    px.add_argument(
        "--fifo-groups", default="", help="consumer groups that consume FIFO (comma separated)"
    )
    px.add_argument(
        "--long-polling-timeout-s", type=int, default=20, help="push consumers' long polling"
    )
    px.add_argument("--log-level", default="INFO", help="logging level")
    px.set_defaults(func=cmd_proxy)

    de = sub.add_parser("demo", help="a whole failover on loopback, with a verdict")
    de.add_argument("--messages", type=int, default=150, help="messages per phase")
    de.set_defaults(func=cmd_demo)

    def tool(
        name: str, help_text: str, fn: Callable[[argparse.Namespace], Any]
    ) -> argparse.ArgumentParser:
        t = sub.add_parser(name, help=help_text)
        t.add_argument("--namesrv", default=DEFAULT_NAMESRV, help="nameserver(s) H:P[,H:P]")
        t.add_argument("--json", action="store_true", help="machine-readable output")
        t.set_defaults(func=_async(fn))
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
    tc.set_defaults(func=_async(_topic_create))
    tool("groups", "show broker groups, their members and acting masters", _groups)
    r = tool("route", "show a topic's route as clients see it", _route)
    r.add_argument("topic")
    from ha_controller.drills.commands import add_subcommands as add_drill_commands

    add_drill_commands(sub)  # `hactl drill`, `hactl analyze`
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
