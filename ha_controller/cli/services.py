"""``hactl nameserver``, ``hactl broker`` and ``hactl proxy``: run one service process
until SIGTERM/SIGINT.

The service packages are imported by name when a command runs (``hactl --help`` and
the tools do not load them).
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from ha_controller.cli.common import DEFAULT_NAMESRV, comma_list

__all__ = ["add_commands", "cmd_broker", "cmd_nameserver", "cmd_proxy"]


def add_commands(sub: Any) -> None:
    """Add ``nameserver``, ``broker`` and ``proxy`` to the ``hactl`` sub-parsers."""
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
    """The RocketMQ 5 gRPC gateway (ha_controller/proxy, docs/grpc.md); grpc loads here."""
    from ha_controller.process import run_until_signalled, setup_logging

    proxy = importlib.import_module("ha_controller.proxy.app")
    cfg = proxy.ProxyConfig(
        namesrv=tuple(comma_list(args.namesrv)),
        listen=args.listen,
        http=args.http,
        fifo_groups=frozenset(comma_list(args.fifo_groups)),
        long_polling_timeout_s=args.long_polling_timeout_s,
    )
    setup_logging(args.log_level)
    run_until_signalled(lambda stop: proxy.serve(cfg, stop, args.ready_file))
    return 0
