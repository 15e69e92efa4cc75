"""``hactl demo`` (``make demo``): one whole failover on loopback, narrated, with a verdict.

The scenario itself is :mod:`ha_controller.cli.demo_scenario`, imported when the
command runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from ha_controller.cli.common import add_parser, int_range

__all__ = ["add_commands", "cmd_demo"]


def add_commands(sub: Any) -> None:
    """Add ``demo`` to the ``hactl`` sub-parsers."""
    de = add_parser(sub, "demo", help="a whole failover on loopback, with a verdict")
    de.add_argument("--messages", type=int_range(1), default=150, help="messages per phase")
    de.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    """Exit 0 only if every invariant of the verdict held."""
    import asyncio
    import logging

    from ha_controller.cli.demo_scenario import run_demo

    logging.basicConfig(level=logging.ERROR, format="    (%(name)s: %(message)s)")
    return 0 if asyncio.run(run_demo(per_phase=args.messages)) else 1
