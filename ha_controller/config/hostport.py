"""``host:port`` addresses as settings take them: parsing, formatting, checking a host."""

from __future__ import annotations

import ipaddress
import re

from ha_controller.config.values import describe
from ha_controller.protocol.errors import ConfigError

__all__ = ["WILDCARD_HOSTS", "format_host_port", "host_problem", "parse_host_port"]

_HOSTNAME_RE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.\-]{0,252})", re.ASCII)
_PORT_RE = re.compile(r"[0-9]{1,5}", re.ASCII)
#: hosts a listener binds to mean "every address" (they overlap any other host)
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "*", ""})


def host_problem(host: str) -> str | None:
    """What is wrong with ``host`` as a host name, IPv4 or IPv6 address; None if nothing."""
    if ":" in host:
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            return f"{host!r} is not an IPv6 address"
        return None
    if not _HOSTNAME_RE.fullmatch(host):
        return f"{host!r} is not a host name or IPv4 address"
    return None


def parse_host_port(text: str) -> tuple[str, int]:
    """Split ``"host:port"`` (``"[v6]:port"`` for IPv6) into ``(host, port)``.

    The port may be 0 ("any free port" for a listener).  Raises
    :class:`ConfigError` (a ``ValueError``) naming the text on anything else.
    """
    if not isinstance(text, str):
        raise ConfigError(f"expected host:port, got {describe(text)}")
    s = text.strip()
    expected = "expected host:port (IPv6 as [addr]:port) with a port in 0..65535"
    if s.startswith("["):
        end = s.find("]")
        if end < 0 or s[end + 1 : end + 2] != ":":
            raise ConfigError(f"{expected}, got {text!r}")
        host, port_text = s[1:end], s[end + 2 :]
        if ":" not in host:
            raise ConfigError(f"{expected}, got {text!r} (brackets are for IPv6 only)")
    else:
        host, sep, port_text = s.rpartition(":")
        if not sep or not host:
            raise ConfigError(f"{expected}, got {text!r}")
        if ":" in host:
            raise ConfigError(f"{expected}, got {text!r} (put an IPv6 address in brackets)")
    problem = host_problem(host)
    if problem is not None:
        raise ConfigError(f"{expected}, got {text!r}: {problem}")
    if not _PORT_RE.fullmatch(port_text) or int(port_text) > 65535:
        raise ConfigError(f"{expected}, got {text!r}")
    return host, int(port_text)


def format_host_port(host: str, port: int) -> str:
    """The inverse of :func:`parse_host_port` (brackets an IPv6 host)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
