"""The format checks of single keys (a :class:`~ha_controller.config.schema.Check`
each: the function that finds a problem and the words, shown in the reference's
"accepts" column, that say what passes) and the listener clash rule."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ha_controller.config.hostport import WILDCARD_HOSTS, host_problem, parse_host_port
from ha_controller.config.schema import Check
from ha_controller.protocol.errors import ConfigError
from ha_controller.protocol.properties import parse_delay_levels

__all__ = [
    "DELAY_LEVELS",
    "DELETE_WHEN",
    "FRACTION",
    "HOST",
    "LISTEN",
    "NAME",
    "NOT_EMPTY",
    "TARGETS",
    "OPTIONAL_TARGETS",
    "USED_RATIO",
    "listener_clash",
]


def _listen(value: str) -> str | None:
    try:
        parse_host_port(value)
    except ConfigError as exc:
        return str(exc)
    return None


def _targets(value: tuple[str, ...]) -> str | None:
    if not value:
        return "expected at least one host:port"
    for addr in value:
        try:
            _, port = parse_host_port(addr)
        except ConfigError as exc:
            return str(exc)
        if port == 0:
            return f"port 0 only makes sense for a listener, got {addr!r}"
    return None


_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,127}", re.ASCII)


def _name(value: str) -> str | None:
    # Broker and cluster names end up in file names and in system topic names
    # (rmq_sys_SYNC_BROKER_MEMBER_{brokerName}), so keep them plain.
    if not _NAME_RE.fullmatch(value):
        return f"expected 1..127 letters, digits, '_', '-' or '.', got {value!r}"
    return None


def _not_empty(value: str) -> str | None:
    return "must not be empty; leave it unset instead" if value == "" else None


def _delay_levels(value: str) -> str | None:
    try:
        parse_delay_levels(value)
    except ValueError as exc:
        return str(exc)
    return None


def _delete_when(value: str) -> str | None:
    # the rule of broker_agent.store.retention.parse_delete_when (RocketMQ deleteWhen)
    words = [w.strip() for w in value.split(";")]
    if all(w.isdigit() and 0 <= int(w) <= 23 for w in words):
        return None
    return f"expected hours of day 0..23 separated by ';' (like 04 or 04;05), got {value!r}"


def _fraction(value: float) -> str | None:
    return None if 0 <= value < 1 else f"must be in [0, 1), got {value}"


def _used_ratio(value: float) -> str | None:
    return None if 0 < value <= 1 else f"must be in (0, 1] (1 = never for space), got {value}"


LISTEN = Check("`host:port` (IPv6 as `[addr]:port`); port 0 = any free port", _listen)
TARGETS = Check(
    "one or more `host:port` (a list, or one comma-separated string); port 0 is refused",
    _targets,
)
OPTIONAL_TARGETS = Check(
    "none, or `host:port` values (a list, or one comma-separated string); port 0 is refused",
    lambda value: None if not value else _targets(value),
)
NAME = Check("1..127 letters, digits, `_`, `-` or `.`", _name)
HOST = Check("a host name, IPv4 or IPv6 address (no port)", host_problem)
NOT_EMPTY = Check("not empty (leave the key out instead)", _not_empty)
DELAY_LEVELS = Check(
    "space-separated positive durations with a unit (`ms`, `s`, `m`, `h`, `d`), at least one",
    _delay_levels,
)
DELETE_WHEN = Check('hours of day 0..23 separated by `;` (`"04"`, `"04;05"`)', _delete_when)
FRACTION = Check("0 ≤ value < 1", _fraction)
USED_RATIO = Check("0 < value ≤ 1", _used_ratio)


def listener_clash(listeners: Mapping[str, str]) -> tuple[tuple[str, ...], str] | None:
    """Two listeners on the same non-zero port of overlapping hosts cannot both bind."""
    seen: list[tuple[str, str, int]] = []
    for key, addr in listeners.items():
        host, port = parse_host_port(addr)
        if port == 0:
            continue
        for other_key, other_host, other_port in seen:
            overlap = host == other_host or {host, other_host} & WILDCARD_HOSTS
            if port == other_port and overlap:
                return (other_key, key), f"both listen on port {port} ({addr})"
        seen.append((key, host, port))
    return None
