"""One value against a key's type: coercing native (TOML) values, parsing environment
and flag strings, describing a bad value, and checking a number against its bounds."""

from __future__ import annotations

import math
import re
import types
import typing
from typing import Any, Literal

from ha_controller.config.schema import Key, is_table, unit

__all__ = [
    "FlushMode",
    "LogLevel",
    "ReplicationMode",
    "Unfit",
    "bounds_problem",
    "coerce",
    "describe",
    "expected",
    "optional_inner",
    "parse_text",
]

ReplicationMode = Literal["sync", "async"]
FlushMode = Literal["async", "sync"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class Unfit(Exception):
    """A value does not fit its type; the text says what was expected."""


_TYPE_NAMES = {bool: "boolean", int: "integer", float: "float", str: "string"}


def describe(value: object) -> str:
    """``string 'x'``, ``integer 3``, ``a table``: a value as an error message shows it."""
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list | tuple):
        text = repr(list(value))
        return f"array {text if len(text) <= 80 else text[:77] + '...'}"
    name = _TYPE_NAMES.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{name} {text if len(text) <= 80 else text[:77] + '...'}"


def optional_inner(tp: Any) -> Any | None:
    """``X`` of ``X | None``; None for any other type."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return None


def expected(tp: Any, name: str) -> str:
    """What a value of ``tp`` for the key ``name`` must be, in words."""
    inner = optional_inner(tp)
    if inner is not None:
        return expected(inner, name)
    if tp is bool:
        return "true or false"
    if tp is float:
        return "a number"
    if tp is int:
        word = unit(name)
        if word == "ms":
            return "a whole number of milliseconds (the unit is in the key's name)"
        if word == "s":
            return "a whole number of seconds (the unit is in the key's name)"
        if word == "bytes":
            return "a whole number of bytes"
        return "an integer"
    if tp is str:
        return "a string"
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(tp))
    if origin is tuple:
        return "a list of strings (or one comma-separated string)"
    if is_table(tp):
        return f"a table of {tp.__name__} settings"
    raise TypeError(f"unsupported config type {tp!r}")


def coerce(value: object, tp: Any, name: str) -> object:
    """Check a native (TOML / Python) value against ``tp``; normalise where harmless."""
    inner = optional_inner(tp)
    if inner is not None:
        return None if value is None else coerce(value, inner, name)
    origin = typing.get_origin(tp)
    if origin is Literal:
        if isinstance(value, str):
            for choice in typing.get_args(tp):
                if str(choice).lower() == value.strip().lower():
                    return choice
    elif origin is tuple:
        if isinstance(value, str):
            return tuple(p.strip() for p in value.split(",") if p.strip())
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return tuple(v.strip() for v in value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif tp in (bool, str) or is_table(tp):
        if isinstance(value, tp):
            return value
    else:
        raise TypeError(f"unsupported config type {tp!r} for {name}")
    raise Unfit(expected(tp, name))


_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})
_INT_RE = re.compile(r"[+-]?[0-9][0-9_]*", re.ASCII)
_FLOAT_RE = re.compile(
    r"[+-]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][+-]?[0-9]+)?", re.ASCII
)


def parse_text(text: str, tp: Any, name: str) -> object:
    """Turn an environment/flag string into a native value (then :func:`coerce` checks it)."""
    inner = optional_inner(tp)
    if inner is not None:
        return None if text.strip() == "" else parse_text(text, inner, name)
    if tp is bool:
        word = text.strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise Unfit("true/false, 1/0 or yes/no")
    if tp is int:
        if not _INT_RE.fullmatch(text.strip()):
            raise Unfit(expected(tp, name))
        return int(text.strip())
    if tp is float:
        if not _FLOAT_RE.fullmatch(text.strip()):
            raise Unfit(expected(tp, name))
        return float(text.strip())
    if is_table(tp):
        raise Unfit(f"individual {name}_* settings, not a whole table")
    return text


def bounds_problem(key: Key, value: object) -> str | None:
    """``must be >= 1 ms, got 0 ms`` when a number is outside the key's bounds."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    word = f" {key.unit}" if key.unit else ""
    if key.ge is not None and value < key.ge:
        return f"must be >= {key.ge}{word}, got {value}{word}"
    if key.le is not None and value > key.le:
        return f"must be <= {key.le}{word}, got {value}{word}"
    return None
