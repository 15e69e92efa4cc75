"""The one TOML writer: configs, test clusters' files and the docs' defaults use it.

:func:`dumps_toml` writes a document that ``tomllib`` loads back to the same table
(strings, booleans, integers, finite floats, lists of those, tables and arrays of
tables); :func:`render_toml` writes the file that the loaders turn back into a config.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ha_controller.config.broker import BrokerConfig
from ha_controller.config.nameserver import NameserverConfig
from ha_controller.config.proxy import ProxyConfig
from ha_controller.config.schema import schema
from ha_controller.protocol.errors import ConfigError

__all__ = ["dumps_toml", "render_toml", "to_toml_dict", "toml_value"]

_BARE_KEY_RE = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)


def _key(key: str) -> str:
    return key if _BARE_KEY_RE.fullmatch(key) else _string(key)


def _string(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def toml_value(value: object) -> str:
    """One value as TOML writes it inline: ``true``, ``3000``, ``"text"``, ``["a", "b"]``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # "0.05", "72.0"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _is_table_array(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _lines(table: Mapping[str, Any], path: str = "") -> list[str]:
    """Scalars first, then ``[tables]``, then ``[[arrays of tables]]``."""
    lines = [
        f"{_key(k)} = {toml_value(v)}"
        for k, v in table.items()
        if not isinstance(v, dict) and not _is_table_array(v)
    ]
    for k, v in table.items():
        if isinstance(v, dict):
            sub = f"{path}{_key(k)}"
            lines += ["", f"[{sub}]", *_lines(v, sub + ".")]
    for k, v in table.items():
        if _is_table_array(v):
            sub = f"{path}{_key(k)}"
            for item in v:
                lines += ["", f"[[{sub}]]", *_lines(item, sub + ".")]
    return lines


def dumps_toml(table: Mapping[str, Any]) -> str:
    """A TOML document of ``table`` (``None`` values are not allowed: leave the key out)."""
    return "\n".join(_lines(table)).lstrip("\n") + "\n"


def _as_table(cfg: object) -> dict[str, Any]:
    s = schema(type(cfg))
    out: dict[str, Any] = {}
    for name in s.fields:
        value = getattr(cfg, name)
        if value is None:  # TOML has no null: unset = absent
            continue
        if name in s.tables:
            out[name] = _as_table(value)
        elif isinstance(value, tuple):
            out[name] = list(value)
        else:
            out[name] = value
    return out


def to_toml_dict(
    cfg: NameserverConfig | BrokerConfig | ProxyConfig | Sequence[BrokerConfig],
) -> dict[str, Any]:
    """The TOML document (as ``tomllib`` would load it) that reproduces ``cfg``.

    A sequence of brokers becomes a container document: settings equal in all
    brokers at the top level, the rest in one ``[[brokers]]`` table each.
    """
    if isinstance(cfg, NameserverConfig | BrokerConfig | ProxyConfig):
        return _as_table(cfg)
    tables = [_as_table(c) for c in cfg]
    if not tables:
        raise ConfigError("brokers: a broker container needs at least one broker")
    shared = {k: v for k, v in tables[0].items() if all(k in t and t[k] == v for t in tables[1:])}
    return {**shared, "brokers": [{k: v for k, v in t.items() if k not in shared} for t in tables]}


def render_toml(
    cfg: NameserverConfig | BrokerConfig | ProxyConfig | Sequence[BrokerConfig],
) -> str:
    """A TOML file that the matching loader turns back into ``cfg``."""
    lines = ["# ha-controller configuration (every key: docs/configuration.md)"]
    lines += _lines(to_toml_dict(cfg))
    return "\n".join(lines) + "\n"
