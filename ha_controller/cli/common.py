"""What every ``hactl`` area shares: the default nameserver, address lists, tables, the
help formatter, argument types that refuse bad values, and running an async command
from argparse."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

__all__ = [
    "DEFAULT_NAMESRV",
    "LOG_LEVELS",
    "HelpFormatter",
    "add_parser",
    "comma_list",
    "float_above",
    "int_range",
    "log_level",
    "print_table",
    "run_async",
]

DEFAULT_NAMESRV = "127.0.0.1:9876"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; ``(default: X)`` after the help of every
    option that has a default worth showing (not None/False, not already said)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            not action.option_strings
            or action.default in (None, False, argparse.SUPPRESS)
            or "default" in text
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def add_parser(sub: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """``sub.add_parser`` with :class:`HelpFormatter`."""
    kwargs.setdefault("formatter_class", HelpFormatter)
    parser: argparse.ArgumentParser = sub.add_parser(name, **kwargs)
    return parser


def int_range(lo: int, hi: int | None = None, *, unit: str = "") -> Callable[[str], int]:
    """An argparse type: an integer in ``lo..hi`` (no upper bound when ``hi`` is None)."""
    allowed = f"{lo}..{hi}" if hi is not None else f">= {lo}"
    suffix = f" {unit}" if unit else ""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {allowed}{suffix}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def float_above(lo: float = 0.0, *, unit: str = "") -> Callable[[str], float]:
    """An argparse type: a finite number greater than ``lo``."""
    suffix = f" {unit}" if unit else ""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value > lo or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be > {lo:g}{suffix}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def log_level(text: str) -> str:
    """An argparse type: a logging level name, any case."""
    level = text.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level


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
