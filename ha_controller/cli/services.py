"""``hactl nameserver``, ``hactl broker`` and ``hactl proxy``: run one service process
until SIGTERM/SIGINT.

Settings come from defaults < ``--config`` TOML < ``HAC_*`` environment < flags
(:mod:`ha_controller.config`); a flag left out is "not given", so the help states each
default instead of argparse holding it.  The service packages are imported inside the
command that runs them (``hactl --help`` and the tools do not load them); this module
is the only one of ``ha_controller`` that imports them (tests/unit/test_architecture.py).
Failing to start — a port in use, a store directory that is a file, a corrupt store
file — is one line on stderr (:func:`ha_controller.cli.main`), never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import re
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from ha_controller.cli.common import (
    DEFAULT_NAMESRV,
    add_parser,
    add_tls_arguments,
    int_range,
    log_level,
    service_tls_flags,
)

__all__ = ["add_commands", "check_store_dir", "cmd_broker", "cmd_nameserver", "cmd_proxy"]

LOG_LEVEL_HELP = "DEBUG, INFO, WARNING, ERROR or CRITICAL (default: the config's log_level, INFO)"


def add_commands(sub: Any) -> None:
    """Add ``nameserver``, ``broker`` and ``proxy`` to the ``hactl`` sub-parsers."""
    ns = add_parser(sub, "nameserver", help="run a nameserver")
    ns.add_argument("--config", metavar="FILE", help="TOML config file")
    ns.add_argument(
        "--listen", metavar="H:P", help="RPC listen address (default 0.0.0.0:9876; port 0 = any)"
    )
    ns.add_argument(
        "--http", metavar="H:P", help="admin HTTP listen address (default 0.0.0.0:9877)"
    )
    ns.add_argument(
        "--ready-file", metavar="FILE", help="write {pid, rpc, http} JSON here once listening"
    )
    ns.add_argument(
        "--etcd-endpoints",
        metavar="H:P[,H:P]",
        help="run the controller (automatic master switch) over this etcd; "
        "env HAC_ETCD_ENDPOINTS (default: none, RIP-32 acting only)",
    )
    ns.add_argument(
        "--auto-switch-after-ms",
        type=int_range(0),
        metavar="MS",
        help="elect a new master once a group has had none this long; 0 = never "
        "(env HAC_AUTO_SWITCH_AFTER_MS; default 500; needs --etcd-endpoints)",
    )
    ns.add_argument("--log-level", type=log_level, metavar="LEVEL", help=LOG_LEVEL_HELP)
    add_tls_arguments(ns, service=True)
    ns.set_defaults(func=cmd_nameserver)

    br = add_parser(sub, "broker", help="run a broker (id 0 = master, others slaves)")
    br.add_argument("--config", metavar="FILE", help="TOML config file")
    br.add_argument("--cluster", help="cluster name (default DefaultCluster)")
    br.add_argument("--broker-name", metavar="NAME", help="broker group name")
    br.add_argument("--broker-id", type=int, metavar="ID", help="0 = master, 1.. = slaves")
    br.add_argument("--namesrv", metavar="H:P", help="nameserver(s) H:P[,H:P]")
    br.add_argument("--listen", metavar="H:P", help="RPC listen address (default 0.0.0.0:10911)")
    br.add_argument("--ha-listen", metavar="H:P", help="HA listen address (default 0.0.0.0:10912)")
    br.add_argument(
        "--http", metavar="H:P", help="admin HTTP listen address (default 0.0.0.0:10913)"
    )
    br.add_argument(
        "--store-dir",
        metavar="DIR",
        help="store directory (default ~/store/<broker-name>-<broker-id>)",
    )
    br.add_argument(
        "--ready-file",
        metavar="FILE",
        help="write {pid, rpc, http, ha} JSON here once listening "
        "(a container of several brokers: {pid, brokers: [{name, id, rpc, http, ha}]})",
    )
    br.add_argument("--log-level", type=log_level, metavar="LEVEL", help=LOG_LEVEL_HELP)
    add_tls_arguments(br, service=True)
    br.set_defaults(func=cmd_broker)

    px = add_parser(sub, "proxy", help="run the RocketMQ 5 gRPC gateway (official SDKs)")
    px.add_argument("--config", metavar="FILE", help="TOML config file")
    px.add_argument(
        "--namesrv", metavar="H:P", help=f"nameserver(s) H:P[,H:P] (default {DEFAULT_NAMESRV})"
    )
    px.add_argument(
        "--listen", metavar="H:P", help="gRPC listen address (default 0.0.0.0:8081; port 0 = any)"
    )
    px.add_argument(
        "--http", metavar="H:P", help="admin HTTP (healthz, readyz, metrics) listen address"
    )
    px.add_argument(
        "--ready-file", metavar="FILE", help="write {pid, rpc[, http]} JSON here once listening"
    )
    px.add_argument(
        "--fifo-groups",
        metavar="G[,G]",
        help="consumer groups served in order besides those set with `hactl group update G "
        "--orderly` (comma separated; default none)",
    )
    px.add_argument(
        "--long-polling-timeout-s",
        type=int_range(1),
        metavar="S",
        help="push consumers' long polling (default 20)",
    )
    px.add_argument("--log-level", type=log_level, metavar="LEVEL", help=LOG_LEVEL_HELP)
    add_tls_arguments(px, service=True)
    px.set_defaults(func=cmd_proxy)

    al = add_parser(
        sub,
        "accept-data-loss",
        help="let a master whose store lost data go online without it",
        description=(
            "A master whose commit log ends before what its group held (a lost volume, a "
            "lost unflushed tail) and that finds no slave holding the rest waits in "
            "pre-online (its status and log say so).  This lets it go online with what "
            "it has: the messages it lacks are lost, and a slave that comes back with "
            "them is refused until it is started again with an empty store.  Prefer "
            "bringing a slave back.  Run it on the broker's machine (kubectl exec); the "
            "broker takes it within a second and logs it as an ERROR."
        ),
    )
    al.add_argument("--store-dir", required=True, type=Path, help="the master's store directory")
    al.add_argument("--reason", required=True, help="why (kept in the file and the log)")
    al.set_defaults(func=cmd_accept_data_loss)


def cmd_accept_data_loss(args: argparse.Namespace) -> int:
    import json
    import time

    from broker_agent.app import ACCEPT_LOSS
    from ha_controller.protocol.errors import ConfigError

    if not args.store_dir.is_dir():
        raise ConfigError(f"--store-dir: {str(args.store_dir)!r} is not a directory")
    marker = args.store_dir / ACCEPT_LOSS
    marker.write_text(json.dumps({"at": time.time(), "reason": args.reason}) + "\n")
    print(f"{marker} written: the master goes online without the missing data within a second")
    return 0


def check_store_dir(path: Path) -> None:
    """ConfigError when ``path`` (or a directory above it) exists and is not a directory."""
    from ha_controller.protocol.errors import ConfigError

    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                where = "" if p == path else f" ({str(path)!r} is inside it)"
                raise ConfigError(f"store_dir: {str(p)!r} is a file, not a directory{where}")
            return


def run_service(
    main: Callable[[Any], Awaitable[None]], listeners: Mapping[str, str | None]
) -> None:
    """``run_until_signalled(main)``; a port in use that the error does not name is
    put on the configured listeners that could be it (``filename`` of the OSError)."""
    from ha_controller.process import run_until_signalled

    try:
        run_until_signalled(main)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE or re.search(r"\('[^']*', \d+\)", str(exc)):
            raise
        fixed = [
            f"{addr} ({name})"
            for name, addr in listeners.items()
            if addr and not addr.endswith(":0")
        ]
        raise OSError(exc.errno, "address already in use", " or ".join(fixed) or None) from exc


def cmd_nameserver(args: argparse.Namespace) -> int:
    from ha_controller.config import load_nameserver_config
    from ha_controller.exposure import warn_if_open
    from ha_controller.process import setup_logging

    cfg = load_nameserver_config(
        args.config,
        {
            "listen": args.listen,
            "http_listen": args.http,
            "log_level": args.log_level,
            "etcd_endpoints": args.etcd_endpoints,
            "auto_switch_after_ms": args.auto_switch_after_ms,
            **service_tls_flags(args),
        },
    )
    setup_logging(cfg.log_level)
    from nameserver import app

    warn_if_open(cfg)
    run_service(
        lambda stop: app.serve(cfg, stop, args.ready_file),
        {"--listen": cfg.listen, "--http": cfg.http_listen},
    )
    return 0


def cmd_broker(args: argparse.Namespace) -> int:
    from ha_controller.config import load_broker_configs
    from ha_controller.exposure import warn_if_open
    from ha_controller.process import setup_logging

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
            "log_level": args.log_level,
            **service_tls_flags(args),
        },
    )
    for cfg in configs:
        check_store_dir(cfg.store_path)
    setup_logging(configs[0].log_level)
    warn_if_open(configs)  # one line for the process, a container's brokers together
    listeners = {
        f"{flag} of {cfg.broker_name}/{cfg.broker_id}" if len(configs) > 1 else flag: addr
        for cfg in configs
        for flag, addr in (
            ("--listen", cfg.listen),
            ("--ha-listen", cfg.ha_listen),
            ("--http", cfg.http_listen),
        )
    }
    if len(configs) == 1:
        from broker_agent import app

        run_service(lambda stop: app.serve(configs[0], stop, args.ready_file), listeners)
    else:  # a broker container: several brokers in this process
        from broker_agent import container

        run_service(lambda stop: container.serve(configs, stop, args.ready_file), listeners)
    return 0


def cmd_proxy(args: argparse.Namespace) -> int:
    """The RocketMQ 5 gRPC gateway (ha_controller/proxy, docs/grpc.md); grpc loads here."""
    from ha_controller.config import load_proxy_config
    from ha_controller.exposure import warn_if_open
    from ha_controller.process import setup_logging

    polling = args.long_polling_timeout_s
    cfg = load_proxy_config(
        args.config,
        {
            "namesrv": args.namesrv,
            "listen": args.listen,
            "http": args.http,
            "fifo_groups": args.fifo_groups,
            "long_polling_timeout_ms": None if polling is None else polling * 1000,
            "log_level": args.log_level,
            **service_tls_flags(args),
        },
    )
    setup_logging(cfg.log_level)
    from ha_controller.proxy import app as proxy

    warn_if_open(cfg)
    try:
        run_service(
            lambda stop: proxy.serve(cfg, stop, args.ready_file),
            {"--listen": cfg.listen, "--http": cfg.http_listen},
        )
    except RuntimeError as exc:
        # grpc reports a port it cannot bind as RuntimeError("Failed to bind to address")
        if "bind" not in str(exc).lower():
            raise
        raise OSError(
            f"cannot listen on {cfg.listen}: gRPC could not bind it (in use, or not allowed)"
        ) from exc
    return 0
