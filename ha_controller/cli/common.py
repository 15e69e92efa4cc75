"""What every ``hactl`` area shares: the default nameserver, address lists, tables, and
running an async command from argparse."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

__all__ = ["DEFAULT_NAMESRV", "comma_list", "print_table", "run_async"]

DEFAULT_NAMESRV = "127.0.0.1:9876"


def comma_list(text: str) -> list[str]:
    """``"h1:p1, h2:p2"`` -> ``["h1:p1", "h2:p2"]`` (blanks dropped): addresses, groups."""
    return [a.strip() for a in text.split(",") if a.strip()]


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Left-aligned columns under a dashed header line."""
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def run_async(
    fn: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
) -> Callable[[argparse.Namespace], int]:
    """An argparse handler that runs the coroutine handler ``fn`` to its exit code."""

    def run(args: argparse.Namespace) -> int:
        return int(asyncio.run(fn(args)))

    return run
