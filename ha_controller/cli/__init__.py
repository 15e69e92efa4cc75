"""``hactl``: the operator's front door.

One module per area, each adding its sub-commands with ``add_commands(sub)``:

- :mod:`.services` — ``nameserver``, ``broker``, ``proxy``: run a service process;
- :mod:`.demo` — ``demo``: a whole failover on loopback, narrated, with a verdict
  (the scenario is :mod:`.demo_scenario`);
- :mod:`.tools` — ``produce``, ``consume``, ``topic create``, ``groups``, ``route``:
  inspect and exercise a running cluster (``--namesrv H:P[,H:P]``, ``--json``);
- :mod:`.drill` — ``drill``, ``analyze``: failover drills and their Spark verdict.

Importing this package is cheap: each command imports what it needs (the services, the
client SDK, the drill runner, pyspark, grpc) when it runs, so ``hactl --help`` is fast.
Exit codes: the command's own, 2 for a configuration error, 1 for any other
:class:`~ha_controller.protocol.errors.HaError`, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ha_controller.cli import demo, drill, services, tools
from ha_controller.protocol.errors import ConfigError, HaError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hactl",
        description="ha-controller: RocketMQ RIP-32 slave-acting-master broker cluster.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    services.add_commands(sub)  # nameserver, broker, proxy
    demo.add_commands(sub)
    tools.add_commands(sub)  # produce, consume, topic, groups, route
    drill.add_commands(sub)  # drill, analyze
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
