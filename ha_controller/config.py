"""Typed, validated configuration (DESIGN.md section 9, STYLE.md item 9).

One frozen dataclass per component (nameserver, broker, gRPC gateway).  Values
come, lowest precedence first, from the field defaults, a TOML file,
``HAC_<KEY>`` environment variables and command-line flags.  Nothing here is
written per key: the loaders walk the dataclass fields, their types (``bool``,
``int``, ``float``, ``str``, ``str | None``, ``tuple[str, ...]``, ``Literal[...]``, nested
config classes) and their metadata (``ge``/``le`` bounds, a ``check`` function,
a flag alias, whether a key identifies one broker of a container, whether it is
a secret).

Naming rules:

* Durations carry their unit in the name, ``*_ms`` or ``*_s``, never mixed.
  RocketMQ's ``...Millis``/``...Period``/``...Interval`` settings keep their
  names in snake_case with ``_ms`` (``brokerNotActiveTimeoutMillis`` ->
  ``broker_not_active_timeout_ms``).
* A nested table ``[tls]`` holds ``cert_file``; the same key is ``tls.cert_file``
  in messages, ``HAC_TLS_CERT_FILE`` in the environment and ``tls_cert_file``
  as a flag.

Every bad value is one :class:`ConfigError` whose single-line message names
the key, where the value came from and what was expected.

:class:`~ha_controller.rpc.limits.RpcLimits` (the ``[limits]`` table) lives in
the RPC layer, which must not import this module; it is loaded and checked here
like the other tables and re-exported.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import logging
import math
import os
import re
import ssl
import tomllib
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from ha_controller.protocol.errors import ConfigError
from ha_controller.protocol.properties import DEFAULT_DELAY_LEVELS, parse_delay_levels
from ha_controller.rpc.limits import RpcLimits
from ha_controller.rpc.tls import client_context, server_context

__all__ = [
    "ENV_PREFIX",
    "GIB",
    "KIB",
    "MIB",
    "AclConfig",
    "BrokerConfig",
    "ConfigError",
    "FlushMode",
    "LogLevel",
    "NameserverConfig",
    "ProxyConfig",
    "ReplicationMode",
    "RpcLimits",
    "TlsConfig",
    "config_keys",
    "env_var_name",
    "format_host_port",
    "load_broker_config",
    "load_broker_configs",
    "load_nameserver_config",
    "load_proxy_config",
    "parse_host_port",
    "render_toml",
    "to_toml_dict",
]

log = logging.getLogger(__name__)

ENV_PREFIX = "HAC_"
KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

ReplicationMode = Literal["sync", "async"]
FlushMode = Literal["async", "sync"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]

_T = TypeVar("_T")
_C = TypeVar("_C")
_Check = Callable[[Any], "str | None"]
# key -> (value, source); a layer is one of: file, env, flags.
_Layer = dict[str, tuple[object, str]]

DEFAULT_SOURCE = "default"


class _Bad(Exception):
    """Internal: a value does not fit; the text says what was expected."""


# --- host:port ---------------------------------------------------------------------------

_HOSTNAME_RE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.\-]{0,252})", re.ASCII)
_PORT_RE = re.compile(r"[0-9]{1,5}", re.ASCII)
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "*", ""})


def _host_problem(host: str) -> str | None:
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
        raise ConfigError(f"expected host:port, got {_describe(text)}")
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
    problem = _host_problem(host)
    if problem is not None:
        raise ConfigError(f"{expected}, got {text!r}: {problem}")
    if not _PORT_RE.fullmatch(port_text) or int(port_text) > 65535:
        raise ConfigError(f"{expected}, got {text!r}")
    return host, int(port_text)


def format_host_port(host: str, port: int) -> str:
    """The inverse of :func:`parse_host_port` (brackets an IPv6 host)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --- field helpers and checks ------------------------------------------------------------


def _opt(
    default: _T,
    *,
    ge: float | None = None,
    le: float | None = None,
    check: _Check | None = None,
    flag: str | None = None,
    per_broker: bool = False,
    secret: bool = False,
) -> _T:
    """A field with a default and validation metadata."""
    return field(
        default=default,
        repr=not secret,
        metadata=_meta(ge=ge, le=le, check=check, flag=flag, per_broker=per_broker, secret=secret),
    )


def _meta(**items: object) -> dict[str, object]:
    return {k: v for k, v in items.items() if v is not None and v is not False}


def _listen_check(value: str) -> str | None:
    try:
        parse_host_port(value)
    except ConfigError as exc:
        return str(exc)
    return None


def _targets_check(value: tuple[str, ...]) -> str | None:
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


def _name_check(value: str) -> str | None:
    # Broker and cluster names end up in file names and in system topic names
    # (rmq_sys_SYNC_BROKER_MEMBER_{brokerName}), so keep them plain.
    if not _NAME_RE.fullmatch(value):
        return f"expected 1..127 letters, digits, '_', '-' or '.', got {value!r}"
    return None


def _host_check(value: str) -> str | None:
    return _host_problem(value)


def _not_empty(value: str) -> str | None:
    return "must not be empty; leave it unset instead" if value == "" else None


def _delay_levels_check(value: str) -> str | None:
    try:
        parse_delay_levels(value)
    except ValueError as exc:
        return str(exc)
    return None


def _delete_when_check(value: str) -> str | None:
    # the rule of broker_agent.store.retention.parse_delete_when (RocketMQ deleteWhen)
    words = [w.strip() for w in value.split(";")]
    if all(w.isdigit() and 0 <= int(w) <= 23 for w in words):
        return None
    return f"expected hours of day 0..23 separated by ';' (like 04 or 04;05), got {value!r}"


def _fraction_check(value: float) -> str | None:
    return None if 0 <= value < 1 else f"must be in [0, 1), got {value}"


def _used_ratio_check(value: float) -> str | None:
    return None if 0 < value <= 1 else f"must be in (0, 1] (1 = never for space), got {value}"


# --- validation machinery ----------------------------------------------------------------

# While a loader builds a config, the source of each key ("file x.toml",
# "env HAC_X", "flag --x", "default") and the key prefix of the class being
# built ("" or "tls."), so that a failing __post_init__ can name them.
_BUILD_CONTEXT: ContextVar[tuple[Mapping[str, str], str] | None] = ContextVar(
    "ha_controller_config_build", default=None
)


def _fail(keys: Sequence[str], problem: str) -> ConfigError:
    context = _BUILD_CONTEXT.get()
    if context is None:
        return ConfigError(f"{', '.join(keys)}: {problem}")
    sources, prefix = context
    named = []
    for key in keys:
        full = key if "." in key else prefix + key
        named.append(f"{full} ({sources.get(full, DEFAULT_SOURCE)})")
    return ConfigError(f"{', '.join(named)}: {problem}")


_TYPE_NAMES = {bool: "boolean", int: "integer", float: "float", str: "string"}


def _describe(value: object) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list | tuple):
        text = repr(list(value))
        return f"array {text if len(text) <= 80 else text[:77] + '...'}"
    name = _TYPE_NAMES.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{name} {text if len(text) <= 80 else text[:77] + '...'}"


def _unit(name: str) -> str:
    for suffix, unit in (("_ms", " ms"), ("_s", " s"), ("_bytes", " bytes")):
        if name.endswith(suffix):
            return unit
    return ""


def _optional_inner(tp: Any) -> Any | None:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return None


def _is_config_class(tp: Any) -> bool:
    return isinstance(tp, type) and (issubclass(tp, _Validated) or tp in _FOREIGN_TABLES)


def _expected(tp: Any, name: str) -> str:
    inner = _optional_inner(tp)
    if inner is not None:
        return _expected(inner, name)
    if tp is bool:
        return "true or false"
    if tp is float:
        return "a number"
    if tp is int:
        unit = _unit(name).strip()
        if unit == "ms":
            return "a whole number of milliseconds (the unit is in the key's name)"
        if unit == "s":
            return "a whole number of seconds (the unit is in the key's name)"
        if unit == "bytes":
            return "a whole number of bytes"
        return "an integer"
    if tp is str:
        return "a string"
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(tp))
    if origin is tuple:
        return "a list of strings (or one comma-separated string)"
    if _is_config_class(tp):
        return f"a table of {tp.__name__} settings"
    raise TypeError(f"unsupported config type {tp!r}")


def _coerce(value: object, tp: Any, name: str) -> object:
    """Check a native (TOML / Python) value against ``tp``; normalise where harmless."""
    inner = _optional_inner(tp)
    if inner is not None:
        return None if value is None else _coerce(value, inner, name)
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
    elif tp in (bool, str) or _is_config_class(tp):
        if isinstance(value, tp):
            return value
    else:
        raise TypeError(f"unsupported config type {tp!r} for {name}")
    raise _Bad(_expected(tp, name))


_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})
_INT_RE = re.compile(r"[+-]?[0-9][0-9_]*", re.ASCII)
_FLOAT_RE = re.compile(
    r"[+-]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][+-]?[0-9]+)?", re.ASCII
)


def _parse_text(text: str, tp: Any, name: str) -> object:
    """Turn an environment/flag string into a native value (then :func:`_coerce` checks it)."""
    inner = _optional_inner(tp)
    if inner is not None:
        return None if text.strip() == "" else _parse_text(text, inner, name)
    if tp is bool:
        word = text.strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise _Bad("true/false, 1/0 or yes/no")
    if tp is int:
        if not _INT_RE.fullmatch(text.strip()):
            raise _Bad(_expected(tp, name))
        return int(text.strip())
    if tp is float:
        if not _FLOAT_RE.fullmatch(text.strip()):
            raise _Bad(_expected(tp, name))
        return float(text.strip())
    if _is_config_class(tp):
        raise _Bad(f"individual {name}_* settings, not a whole table")
    return text


class _Validated:
    """Base of the config classes: type, bounds, checks and cross-field rules at init."""

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if not f.init:
                continue
            raw = getattr(self, f.name)
            try:
                value = _coerce(raw, hints[f.name], f.name)
            except _Bad as bad:
                got = type(raw).__name__ if f.metadata.get("secret") else _describe(raw)
                raise _fail((f.name,), f"expected {bad}, got {got}") from None
            object.__setattr__(self, f.name, value)
            problem = _bounds_problem(f, value)
            check = f.metadata.get("check")
            if problem is None and check is not None and value is not None:
                problem = check(value)
            if problem is not None:
                raise _fail((f.name,), problem)
        rule = next(self._rules(), None)
        if rule is not None:
            raise _fail(*rule)

    def _rules(self) -> Iterator[tuple[tuple[str, ...], str]]:
        """Cross-field rules: yield ``(keys, problem)``; the first one is raised."""
        return iter(())


def _bounds_problem(f: dataclasses.Field[Any], value: object) -> str | None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    unit = _unit(f.name)
    # A duration or size of zero or less is never meaningful.
    ge = f.metadata.get("ge", 1 if unit else None)
    le = f.metadata.get("le")
    if ge is not None and value < ge:
        return f"must be >= {ge}{unit}, got {value}{unit}"
    if le is not None and value > le:
        return f"must be <= {le}{unit}, got {value}{unit}"
    return None


def _listener_clash(listeners: Mapping[str, str]) -> tuple[tuple[str, ...], str] | None:
    """Two listeners on the same non-zero port of overlapping hosts cannot both bind."""
    seen: list[tuple[str, str, int]] = []
    for key, addr in listeners.items():
        host, port = parse_host_port(addr)
        if port == 0:
            continue
        for other_key, other_host, other_port in seen:
            overlap = host == other_host or {host, other_host} & _WILDCARD_HOSTS
            if port == other_port and overlap:
                return (other_key, key), f"both listen on port {port} ({addr})"
        seen.append((key, host, port))
    return None


# --- the config classes ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TlsConfig(_Validated):
    """TLS for every RPC and HTTP listener and outgoing connection (DESIGN section 3).

    Listeners (RPC, HA, admin HTTP, the gateway's gRPC) serve ``cert_file``;
    ``require_client_cert`` turns on mutual TLS: they verify client certificates
    against ``ca_file``.  Outgoing connections (to nameservers, brokers, the HA
    master) verify the server against ``ca_file`` (the system's CAs when unset),
    check that its certificate names the host dialled unless ``verify_hostname`` is
    false, and present ``cert_file`` as the client certificate.
    """

    enabled: bool = False
    # hactl's flags: --tls-cert, --tls-key, --tls-ca (every command that connects)
    cert_file: str | None = _opt(None, check=_not_empty, flag="tls_cert")
    key_file: str | None = _opt(None, check=_not_empty, flag="tls_key")
    ca_file: str | None = _opt(None, check=_not_empty, flag="tls_ca")
    require_client_cert: bool = False
    # Peers are dialled by their advertised address (broker_ip1, namesrv_addrs): a
    # certificate must list it (DNS or IP subjectAltName), or turn this off.
    verify_hostname: bool = True

    def _rules(self) -> Iterator[tuple[tuple[str, ...], str]]:
        if (self.cert_file is None) != (self.key_file is None):
            given, missing = (
                ("cert_file", "key_file")
                if self.cert_file is not None
                else ("key_file", "cert_file")
            )
            yield (
                (given, missing),
                f"a certificate needs both cert_file and key_file; {missing} is not set",
            )
        if self.enabled and self.cert_file is None:
            yield (
                ("enabled", "cert_file", "key_file"),
                "TLS is enabled but cert_file and key_file are not set",
            )
        if self.require_client_cert and not (self.enabled and self.ca_file):
            yield (
                ("require_client_cert", "enabled", "ca_file"),
                "mutual TLS needs enabled = true and a ca_file to verify client certificates",
            )
        if self.enabled and not self.verify_hostname and not self.ca_file:
            yield (
                ("verify_hostname", "ca_file"),
                "verify_hostname = false needs a ca_file: without a private CA, any "
                "publicly signed certificate would be trusted for every peer",
            )
        if self.enabled:
            for key in ("cert_file", "key_file", "ca_file"):
                path = getattr(self, key)
                if path is not None and not Path(path).is_file():
                    yield (key,), f"no such file: {path!r}"

    def server_context(self) -> ssl.SSLContext | None:
        """The context every listener of a service uses; None when TLS is off."""
        if not self.enabled:
            return None
        assert self.cert_file and self.key_file  # checked by _rules
        return server_context(self.cert_file, self.key_file, self.ca_file, self.require_client_cert)

    def client_context(self) -> ssl.SSLContext | None:
        """The context of every outgoing connection of a service (nameservers,
        brokers, the HA master, the gateway's brokers); None when TLS is off.

        It presents ``cert_file`` (which must then allow client authentication for
        mutual TLS) and verifies the server as the class says."""
        if not self.enabled:
            return None
        return client_context(
            self.ca_file, self.cert_file, self.key_file, check_hostname=self.verify_hostname
        )


@dataclass(frozen=True, kw_only=True)
class AclConfig(_Validated):
    """The client ACL (docs/security.md): users with an access key and a secret key and
    their permissions, read from ``file``; the same table on every nameserver, broker
    and gateway of a cluster."""

    # Check clients' signatures and permissions (RocketMQ aclEnable).
    enabled: bool = False
    # Serve unsigned requests as without an ACL (the demo profile); false = every
    # client request must be signed by a user of the file.
    allow_anonymous: bool = True
    # The users a node starts with: a TOML file of [[users]] tables (access_key,
    # secret_key, admin, default_topic_perm, default_group_perm, topic_perms,
    # group_perms), like RocketMQ's plain_acl.yml; mount it from a secret, it holds the
    # secret keys.  Users and ACLs changed at runtime (hactl user, hactl acl) replace it.
    file: str | None = _opt(None, check=_not_empty)
    # Write an audit line for every allowed request too (logger ha_controller.acl.audit);
    # refusals are always written.
    audit_allowed: bool = False

    def _rules(self) -> Iterator[tuple[tuple[str, ...], str]]:
        if self.enabled and self.file is None:
            yield (("enabled", "file"), "the ACL is enabled but no users file is set")
        if not self.allow_anonymous and not self.enabled:
            yield (
                ("allow_anonymous", "enabled"),
                "allow_anonymous = false has no effect without enabled = true",
            )
        if self.enabled and self.file is not None:
            if not Path(self.file).is_file():
                yield ("file",), f"no such file: {self.file!r}"
                return
            from ha_controller.acl import load_acl_file  # the users file's own checks

            try:
                load_acl_file(self.file)
            except ConfigError as exc:
                yield ("file",), str(exc)


@dataclass(frozen=True, kw_only=True)
class _RpcLimitsTable(_Validated, RpcLimits):
    """:class:`RpcLimits` as the loaders check it: every problem names its key's source.

    Built only inside :func:`_build`, which returns a plain ``RpcLimits`` (equal to one
    made directly).  ``_Validated`` comes first so that its ``__post_init__`` reports;
    the cross-field rules are RpcLimits' own.
    """

    _rules = RpcLimits._rules


#: Config tables defined outside this module (so that their users need not import
#: it) -> the ``_Validated`` twin that loads them.
_FOREIGN_TABLES: dict[type, type[_Validated]] = {RpcLimits: _RpcLimitsTable}


@dataclass(frozen=True, kw_only=True)
class NameserverConfig(_Validated):
    """``hactl nameserver`` (RocketMQ NamesrvConfig plus our route watch and auth)."""

    listen: str = _opt("0.0.0.0:9876", check=_listen_check)
    http_listen: str = _opt("0.0.0.0:9877", check=_listen_check, flag="http")
    # RocketMQ scanNotActiveBrokerInterval
    scan_not_active_broker_interval_ms: int = 5000
    # RocketMQ defaults both to false; this product exists for them (DESIGN section 9).
    support_acting_master: bool = True
    notify_min_broker_id_changed: bool = True
    notify_timeout_ms: int = _opt(3000, le=60_000)
    notify_retries: int = _opt(3, ge=0, le=100)
    # HMAC key of the control plane (ha_controller/auth.py): every request between
    # cluster members is signed with it; unset = open mode (docs/security.md).
    cluster_secret: str | None = _opt(None, check=_not_empty, secret=True)
    # Open mode only: a broker must register an address on the host it connects from
    # (ports are not compared); off behind NAT.
    open_mode_check_peer_host: bool = True
    # Bearer token of the admin HTTP API: with it set, every endpoint but /healthz,
    # /readyz and /metrics answers 401 without "Authorization: Bearer <token>".
    admin_token: str | None = _opt(None, check=_not_empty, secret=True)
    route_watch_max_wait_ms: int = _opt(30_000, le=600_000)
    max_route_watchers: int = _opt(10_000, ge=1)
    tls: TlsConfig = field(default_factory=TlsConfig)
    acl: AclConfig = field(default_factory=AclConfig)
    limits: RpcLimits = field(default_factory=RpcLimits)
    log_level: LogLevel = "INFO"

    def _rules(self) -> Iterator[tuple[tuple[str, ...], str]]:
        clash = _listener_clash({"listen": self.listen, "http_listen": self.http_listen})
        if clash is not None:
            yield clash
        if self.acl.enabled and not self.acl.allow_anonymous and self.cluster_secret is None:
            yield (
                ("acl.allow_anonymous", "cluster_secret"),
                "acl.allow_anonymous = false needs a cluster_secret: the cluster's own "
                "requests are told from clients' by its signature",
            )


@dataclass(frozen=True, kw_only=True)
class BrokerConfig(_Validated):
    """``hactl broker``: one broker of a group (RocketMQ BrokerConfig + MessageStoreConfig)."""

    # --- identity and addresses (per broker in a container) ---
    cluster: str = _opt("DefaultCluster", check=_name_check)
    broker_name: str = field(metadata=_meta(check=_name_check, per_broker=True))
    # 0 = master, others slaves.
    broker_id: int = field(metadata=_meta(ge=0, per_broker=True))
    namesrv_addrs: tuple[str, ...] = field(metadata=_meta(check=_targets_check, flag="namesrv"))
    listen: str = _opt("0.0.0.0:10911", check=_listen_check, per_broker=True)
    ha_listen: str = _opt("0.0.0.0:10912", check=_listen_check, per_broker=True)
    http_listen: str = _opt("0.0.0.0:10913", check=_listen_check, flag="http", per_broker=True)
    # RocketMQ brokerIP1 / brokerIP2: the host advertised for RPC and for HA when
    # the listener binds a wildcard; unset = the listen host (or the local address).
    broker_ip1: str | None = _opt(None, check=_host_check, per_broker=True)
    # Unset = ~/store/<broker_name>-<broker_id> (RocketMQ: ~/store), see store_path.
    store_dir: str | None = _opt(None, check=_not_empty, per_broker=True)

    # --- RIP-32 switches (RocketMQ defaults false; DESIGN section 9 turns them on) ---
    enable_slave_acting_master: bool = True
    enable_remote_escape: bool = True
    skip_pre_online: bool = False
    broker_heartbeat_interval_ms: int = 1000
    broker_not_active_timeout_ms: int = 10_000
    send_heartbeat_timeout_ms: int = 1000
    sync_broker_member_group_period_ms: int = 1000
    # RocketMQ clamps registerNameServerPeriod to [10 s, 60 s] silently; we
    # reject a value outside that range so the operator sees what runs.
    register_name_server_period_ms: int = _opt(30_000, ge=10_000, le=60_000)
    register_broker_timeout_ms: int = 24_000
    # Broker-side route refresh used by the escape bridge (loadBalancePollNameServerInterval).
    load_balance_poll_name_server_interval_ms: int = 30_000
    lock_in_strict_mode: bool = False
    # RocketMQ defaults compatibleWithOldNameSrv to true (heartbeat by
    # QUERY_DATA_VERSION, member group from a system topic route).  Ours is
    # false: the lightweight BROKER_HEARTBEAT and GET_BROKER_MEMBER_GROUP are the
    # point of this product, and our nameserver always speaks them.
    compatible_with_old_namesrv: bool = False
    consumer_offset_update_version_step: int = _opt(500, ge=1)
    delay_offset_update_version_step: int = _opt(200, ge=1)

    # --- replication and store ---
    # RocketMQ's totalReplicas defaults to 1, but DESIGN section 9 asks for
    # in_sync_replicas = 2 (no loss) and in_sync_replicas <= total_replicas is
    # always enforced, so the default group is the master plus two slaves
    # (what `hactl demo` and the drills run, and RocketMQ's own RIP-32 ITs use).
    # total_replicas also drives pre-online (only when > 1) and the strict lock
    # quorum total_replicas // 2 + 1.
    total_replicas: int = _opt(3, ge=1, le=64)
    in_sync_replicas: int = _opt(2, ge=1)
    replication_mode: ReplicationMode = "sync"
    flush_mode: FlushMode = "async"
    # RocketMQ flushIntervalCommitLog (async flush period).
    flush_interval_ms: int = 500
    # How long a SYNC send waits for its slave copies before failing with
    # IN_SYNC_REPLICAS_NOT_ENOUGH (RocketMQ's syncFlushTimeout is 5 s).
    slave_ack_timeout_ms: int = _opt(3000, ge=1)
    segment_size_bytes: int = _opt(64 * MIB, ge=64 * KIB, le=2 * GIB)
    # RocketMQ maxMessageSize; a record must fit in one segment and one frame. A
    # client's message must leave 2 KiB of it for the properties the broker adds when
    # it delivers a delayed message, commits a transaction, revives a POP message or
    # escapes one to another group.
    max_message_bytes: int = _opt(4 * MIB, ge=4 * KIB)

    # --- disk space and retention ---
    # Below this share of the file system free (for unprivileged users), the store
    # refuses appends (NotWritable, nothing stored); the reserve is left for consume
    # queues, checkpoints and offset tables.
    min_free_disk_ratio: float = _opt(0.05, check=_fraction_check)
    # Below this share free the broker withdraws the WRITE bit from its routes so that
    # producers go elsewhere before anything is refused; unset = twice
    # min_free_disk_ratio (at most 0.5).
    warn_free_disk_ratio: float | None = _opt(None, check=_fraction_check)
    # How often free space is sampled (statvfs) while appends go on; between samples
    # the store counts what it wrote.
    disk_check_interval_ms: int = 1000
    # RocketMQ fileReservedTime (72 hours), in ms like every duration here: a closed
    # commit-log segment last written longer ago than this is expired.
    file_reserved_time_ms: int = 72 * 3600 * 1000
    # RocketMQ deleteWhen: the hours of day (local time, "04" or "04;05") in which
    # expired segments are deleted.
    delete_when: str = _opt("04", check=_delete_when_check)
    # RocketMQ diskMaxUsedSpaceRatio: with more of the file system used than this,
    # expired segments are deleted at once, whatever the hour (unexpired ones never).
    disk_max_used_space_ratio: float = _opt(0.75, check=_used_ratio_check)
    # RocketMQ cleanResourceInterval: how often retention looks for expired files.
    clean_resource_interval_ms: int = 10_000
    # A master deletes nothing its attached slaves lack, and for this long after a
    # slave was last seen attached, nothing that slave lacked (also across a restart of
    # the master; not while the disk is over disk_max_used_space_ratio or short of
    # space): a slave that reconnects (after a freeze) or restarts within it continues
    # where it was. One away longer may find its next bytes deleted and then waits for
    # an operator (see the runbook). 0: only attached slaves hold deletion back.
    detached_slave_hold_ms: int = _opt(600_000, ge=0)
    # Open files the store may keep besides its active commit-log segment: older
    # segments being read and consume-queue files, opened on demand and closed least
    # recently used first.
    max_open_files: int = _opt(256, ge=8, le=1_000_000)
    # Entries per consume-queue file (RocketMQ mappedFileSizeConsumeQueue / 20);
    # retention deletes a queue's files whose messages are all deleted.
    consume_queue_file_entries: int = _opt(300_000, ge=1)

    # --- topics, pulls ---
    auto_create_topic: bool = True
    default_topic_queue_nums: int = _opt(4, ge=1, le=1024)
    long_polling_enable: bool = True
    long_polling_check_interval_ms: int = 5000
    short_polling_check_interval_ms: int = 1000
    max_held_pulls: int = _opt(10_000, ge=1)

    # --- auth ---
    cluster_secret: str | None = _opt(None, check=_not_empty, secret=True)
    # Bearer token of the admin HTTP API: with it set, every endpoint but /healthz,
    # /readyz and /metrics answers 401 without "Authorization: Bearer <token>".
    admin_token: str | None = _opt(None, check=_not_empty, secret=True)

    # --- special services, escape bridge, locks ---
    # RocketMQ messageDelayLevel; parsed into delay_levels_ms.
    delay_levels: str = _opt(DEFAULT_DELAY_LEVELS, check=_delay_levels_check)
    # RocketMQ timerMaxDelaySec (3 days): a timer message (TIMER_DELIVER_MS) due
    # further ahead is refused (BadRequest). The timer keeps every undelivered timer
    # message in memory, about 360 bytes each (hac_timer_messages_pending).
    timer_max_delay_ms: int = _opt(3 * 24 * 3_600_000, ge=1000)
    # RocketMQ MAX_RETRY_TIMES_FOR_ESCAPE = 10; backoff doubles from initial to max.
    escape_max_attempts: int = _opt(10, ge=1, le=1000)
    escape_backoff_initial_ms: int = 100
    escape_backoff_max_ms: int = 10_000
    # EscapeBridge SEND_TIMEOUT.
    escape_send_timeout_ms: int = 3000
    # RocketMQ REBALANCE_LOCK_MAX_LIVE_TIME.  Clients renew every 20 s and treat
    # a lock as theirs for 30 s, so a broker lifetime below 30 s would let two
    # clients believe they own one queue.
    lock_max_live_time_ms: int = _opt(60_000, ge=30_000)
    # Per-peer timeout of the strict-mode quorum lock round (RocketMQ: 1000 ms).
    lock_peer_timeout_ms: int = 1000
    # RocketMQ reviveInterval.
    pop_revive_interval_ms: int = 1000
    # RocketMQ transactionCheckInterval / transactionTimeOut / transactionCheckMax.
    transaction_check_interval_ms: int = 30_000
    transaction_timeout_ms: int = 6000
    transaction_check_max: int = _opt(15, ge=1)

    tls: TlsConfig = field(default_factory=TlsConfig)
    acl: AclConfig = field(default_factory=AclConfig)
    limits: RpcLimits = field(default_factory=RpcLimits)
    log_level: LogLevel = "INFO"

    # Derived from delay_levels: delay_levels_ms[level - 1] is that level's delay.
    delay_levels_ms: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "delay_levels_ms", parse_delay_levels(self.delay_levels))

    def _rules(self) -> Iterator[tuple[tuple[str, ...], str]]:
        if self.broker_heartbeat_interval_ms >= self.broker_not_active_timeout_ms:
            yield (
                ("broker_heartbeat_interval_ms", "broker_not_active_timeout_ms"),
                f"the heartbeat interval ({self.broker_heartbeat_interval_ms} ms) must be less "
                f"than the not-active timeout ({self.broker_not_active_timeout_ms} ms)",
            )
        if self.send_heartbeat_timeout_ms >= self.broker_not_active_timeout_ms:
            yield (
                ("send_heartbeat_timeout_ms", "broker_not_active_timeout_ms"),
                f"the heartbeat send timeout ({self.send_heartbeat_timeout_ms} ms) must be less "
                f"than the not-active timeout ({self.broker_not_active_timeout_ms} ms)",
            )
        if self.in_sync_replicas > self.total_replicas:
            yield (
                ("in_sync_replicas", "total_replicas"),
                f"in_sync_replicas ({self.in_sync_replicas}) cannot exceed total_replicas "
                f"({self.total_replicas})",
            )
        if self.escape_backoff_initial_ms > self.escape_backoff_max_ms:
            yield (
                ("escape_backoff_initial_ms", "escape_backoff_max_ms"),
                f"the initial backoff ({self.escape_backoff_initial_ms} ms) exceeds the maximum "
                f"({self.escape_backoff_max_ms} ms)",
            )
        if self.max_message_bytes >= self.segment_size_bytes:
            yield (
                ("max_message_bytes", "segment_size_bytes"),
                f"a message of max_message_bytes ({self.max_message_bytes}) must fit in one "
                f"segment ({self.segment_size_bytes} bytes)",
            )
        if (
            self.warn_free_disk_ratio is not None
            and self.warn_free_disk_ratio < self.min_free_disk_ratio
        ):
            yield (
                ("warn_free_disk_ratio", "min_free_disk_ratio"),
                f"the warning reserve ({self.warn_free_disk_ratio}) cannot be below the hard "
                f"reserve ({self.min_free_disk_ratio})",
            )
        if self.max_message_bytes > self.limits.max_frame_bytes:
            yield (
                ("max_message_bytes", "limits.max_frame_bytes"),
                f"a message of max_message_bytes ({self.max_message_bytes}) must fit in one "
                f"frame ({self.limits.max_frame_bytes} bytes)",
            )
        clash = _listener_clash(
            {"listen": self.listen, "ha_listen": self.ha_listen, "http_listen": self.http_listen}
        )
        if clash is not None:
            yield clash
        if self.acl.enabled and not self.acl.allow_anonymous and self.cluster_secret is None:
            yield (
                ("acl.allow_anonymous", "cluster_secret"),
                "acl.allow_anonymous = false needs a cluster_secret: the cluster's own "
                "requests are told from clients' by its signature",
            )

    @property
    def is_master(self) -> bool:
        return self.broker_id == 0

    @property
    def store_path(self) -> Path:
        if self.store_dir is not None:
            return Path(self.store_dir).expanduser()
        return Path.home() / "store" / f"{self.broker_name}-{self.broker_id}"

    @property
    def max_delay_level(self) -> int:
        return len(self.delay_levels_ms)

    @property
    def lock_quorum(self) -> int:
        """Strict-mode lock quorum: ``total_replicas // 2 + 1`` (RocketMQ lockBatchMQ)."""
        return self.total_replicas // 2 + 1

    def delay_level_ms(self, level: int) -> int:
        """The delay of ``level`` (1-based) in ms.

        A level above the highest is clamped to the highest, as RocketMQ does;
        a level below 1 means "not delayed" and is an error here.
        """
        if level < 1:
            raise ValueError(f"delay level must be >= 1, got {level}")
        return self.delay_levels_ms[min(level, len(self.delay_levels_ms)) - 1]


@dataclass(frozen=True, kw_only=True)
class ProxyConfig(_Validated):
    """``hactl proxy``: the RocketMQ 5 gRPC gateway (docs/grpc.md)."""

    # hactl's nameserver default (a broker has none: it must be told).
    namesrv_addrs: tuple[str, ...] = _opt(("127.0.0.1:9876",), check=_targets_check, flag="namesrv")
    # gRPC listener (port 0 = any).
    listen: str = _opt("0.0.0.0:8081", check=_listen_check)
    # Admin HTTP (healthz, readyz, metrics); unset = none.
    http_listen: str | None = _opt(None, check=_listen_check, flag="http")
    # Consumer groups served in order besides those set with `hactl group update G
    # --orderly` (the gateway pops them with the broker's orderly POP).
    fifo_groups: tuple[str, ...] = ()
    # Push consumers' long polling, sent to them in the settings.
    long_polling_timeout_ms: int = _opt(20_000, ge=1000)
    # Invisible time of a receive that names none.
    default_invisible_ms: int = 30_000
    # Tries of one send (a retriable failure moves it to another group).
    send_attempts: int = _opt(3, ge=1)
    # How long a route from the nameserver is reused; 0 = ask every time.
    route_ttl_ms: int = _opt(1000, ge=0)
    # Heartbeats from the gateway to the brokers (RocketMQ heartbeatBrokerInterval).
    heartbeat_broker_interval_ms: int = 5000
    # Timeout of one request to a broker.
    broker_timeout_ms: int = 3000
    # Most messages in one SendMessage; more is answered PAYLOAD_TOO_LARGE and nothing
    # is sent.  The official SDKs send one message per call, and RocketMQ's proxy
    # bounds a batch only by its size; the gateway sends a batch's messages one after
    # another (about 1 ms each), so 1024 keeps one call to about a second, within the
    # SDKs' 3 s request timeout.
    max_messages_per_send: int = _opt(1024, ge=1)
    # Largest serialized request (one gRPC message); gRPC refuses a larger one with
    # RESOURCE_EXHAUSTED before reading it.  It must hold one 4 MiB body, the largest
    # the gateway takes, and its properties.
    max_request_bytes: int = _opt(16 * MIB, ge=4 * MIB + 64 * KIB, le=1 * GIB)
    # Calls in progress at once (long polls and telemetry streams included); one more
    # is refused with RESOURCE_EXHAUSTED.  gRPC's backlog of calls not yet picked up
    # is made twice this (at least 16384), so that a burst gets statuses, not resets.
    max_concurrent_calls: int = _opt(4096, ge=1)
    # Calls in progress at once with one `x-mq-client-id` (calls without one share a
    # single allowance); one more is refused with RESOURCE_EXHAUSTED.
    max_concurrent_calls_per_client: int = _opt(512, ge=1)
    # ReceiveMessage calls (long polls) in progress at once.  Each holds a request in
    # flight on the gateway's one connection to a broker, which takes 1024 at most
    # (`limits.max_inflight_requests`): 512 leaves the other half for sends and acks.
    max_concurrent_receives: int = _opt(512, ge=1)
    # ReceiveMessage calls in progress at once with one `x-mq-client-id`; a push
    # consumer holds one per broker group of each topic it subscribes.
    max_concurrent_receives_per_client: int = _opt(64, ge=1)
    # The cluster's secret: the gateway's own requests (heartbeats, routes) are signed
    # with it, and so are clients' requests, on behalf of their ACL user (docs/security.md).
    cluster_secret: str | None = _opt(None, check=_not_empty, secret=True)
    tls: TlsConfig = field(default_factory=TlsConfig)
    # The client ACL: the SDKs' Credentials are checked against its users.
    acl: AclConfig = field(default_factory=AclConfig)
    # How often the gateway fetches the cluster's ACL table from the nameservers (with a
    # cluster secret): users and ACLs changed at runtime take effect within about this.
    acl_sync_interval_ms: int = _opt(1000, ge=100, le=60_000)
    log_level: LogLevel = "INFO"

    def _rules(self) -> Iterator[tuple[tuple[str, ...], str]]:
        if self.http_listen is not None:
            clash = _listener_clash({"listen": self.listen, "http_listen": self.http_listen})
            if clash is not None:
                yield clash
        if self.max_concurrent_calls_per_client > self.max_concurrent_calls:
            yield (
                ("max_concurrent_calls_per_client", "max_concurrent_calls"),
                "one client cannot be allowed more calls than the gateway takes in total",
            )
        if self.max_concurrent_receives_per_client > self.max_concurrent_receives:
            yield (
                ("max_concurrent_receives_per_client", "max_concurrent_receives"),
                "one client cannot be allowed more receives than the gateway takes in total",
            )
        if self.max_concurrent_receives > self.max_concurrent_calls:
            yield (
                ("max_concurrent_receives", "max_concurrent_calls"),
                "receives are calls: they cannot be allowed more than calls in total",
            )
        if self.acl.enabled and not self.acl.allow_anonymous and self.cluster_secret is None:
            yield (
                ("acl.allow_anonymous", "cluster_secret"),
                "acl.allow_anonymous = false needs a cluster_secret: the cluster's own "
                "requests are told from clients' by its signature",
            )


# --- schema ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Key:
    name: str  # "tls.cert_file"
    env: str  # "HAC_TLS_CERT_FILE"
    flags: tuple[str, ...]  # flag dict keys: ("tls_cert_file",) or ("http_listen", "http")
    tp: Any
    required: bool
    per_broker: bool


@dataclass(frozen=True)
class _Schema:
    keys: dict[str, _Key]
    tables: frozenset[str]


# Plain dicts rather than functools.cache: mypy cannot see that classes are hashable.
_HINTS_CACHE: dict[type, dict[str, Any]] = {}
_SCHEMA_CACHE: dict[type, _Schema] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS_CACHE.get(cls)
    if hints is None:
        hints = _HINTS_CACHE[cls] = typing.get_type_hints(cls)
    return hints


def _schema(cls: type) -> _Schema:
    cached = _SCHEMA_CACHE.get(cls)
    if cached is not None:
        return cached
    keys: dict[str, _Key] = {}
    tables: set[str] = set()

    def walk(c: type, prefix: str) -> None:
        hints = _hints(c)
        for f in dataclasses.fields(c):
            if not f.init:
                continue
            name = prefix + f.name
            tp = hints[f.name]
            if _is_config_class(tp):
                tables.add(name)
                walk(tp, name + ".")
                continue
            flat = name.replace(".", "_")
            alias = f.metadata.get("flag")
            keys[name] = _Key(
                name=name,
                env=env_var_name(name),
                flags=(flat,) if alias is None else (flat, alias),
                tp=tp,
                required=f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING,
                per_broker=bool(f.metadata.get("per_broker")),
            )

    walk(cls, "")
    schema = _SCHEMA_CACHE[cls] = _Schema(keys, frozenset(tables))
    return schema


def env_var_name(key: str) -> str:
    """``"tls.cert_file"`` -> ``"HAC_TLS_CERT_FILE"``."""
    return ENV_PREFIX + key.replace(".", "_").upper()


def config_keys(
    cls: type[NameserverConfig] | type[BrokerConfig] | type[ProxyConfig],
) -> tuple[str, ...]:
    """Every settable key of a component, nested ones dotted (``tls.cert_file``)."""
    return tuple(_schema(cls).keys)


# --- layers ------------------------------------------------------------------------------


def _read_toml(path: str | Path) -> dict[str, Any]:
    try:
        with Path(path).open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {exc.strerror}") from None


def _unknown_key(key: str, where: str, candidates: Sequence[str]) -> ConfigError:
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"unknown key {key!r} in {where}{hint}")


def _file_layer(table: Mapping[str, object], cls: type, where: str, prefix: str = "") -> _Layer:
    schema = _schema(cls)
    out: _Layer = {}
    for name, value in table.items():
        full = prefix + name
        if full in schema.keys:
            out[full] = (value, where)
        elif full in schema.tables:
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{full} ({where}): expected a [{full}] table, got {_describe(value)}"
                )
            out.update(_file_layer(value, cls, where, full + "."))
        else:
            raise _unknown_key(full, where, [*schema.keys, *schema.tables])
    return out


def _env_layer(cls: type, env: Mapping[str, str]) -> _Layer:
    out: _Layer = {}
    for key in _schema(cls).keys.values():
        text = env.get(key.env)
        if text is None:
            continue
        source = f"env {key.env}"
        try:
            out[key.name] = (_parse_text(text, key.tp, key.name), source)
        except _Bad as bad:
            raise ConfigError(f"{key.name} ({source}): expected {bad}, got {text!r}") from None
    return out


def _flag_layer(cls: type, flags: Mapping[str, object]) -> _Layer:
    """Flags arrive parsed by argparse; ``None`` means "not given".

    Keys are config keys (nested ones with ``_``: ``tls_cert_file``) or a
    field's flag alias (``namesrv``, ``http``).  Other keys (``config``,
    ``ready_file``, ...) are not ours and are ignored, so ``vars(args)`` can be
    passed as it is.
    """
    out: _Layer = {}
    for key in _schema(cls).keys.values():
        for flag in key.flags:
            value = flags.get(flag)
            if value is None:
                continue
            source = f"flag --{flag.replace('_', '-')}"
            if isinstance(value, str):
                try:
                    value = _parse_text(value, key.tp, key.name)
                except _Bad as bad:
                    raise ConfigError(
                        f"{key.name} ({source}): expected {bad}, got {value!r}"
                    ) from None
            out[key.name] = (value, source)
            break
    return out


def _known_env_names() -> frozenset[str]:
    return frozenset(
        k.env
        for c in (NameserverConfig, BrokerConfig, ProxyConfig)
        for k in _schema(c).keys.values()
    )


def _warn_unknown_env(env: Mapping[str, str]) -> None:
    # Only near-misses of a real key are reported: other HAC_* variables may
    # belong to tools (drills, tests) and are not ours to reject.
    known = _known_env_names()
    for name in env:
        if name.startswith(ENV_PREFIX) and name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
            if close:
                log.warning(
                    "environment variable %s is not a setting; did you mean %s?", name, close[0]
                )


def _build(cls: type[_C], layer: _Layer, prefix: str = "") -> _C:
    schema = _schema(cls)
    hints = _hints(cls)
    kwargs: dict[str, object] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        full = prefix + f.name
        tp = hints[f.name]
        if _is_config_class(tp):
            kwargs[f.name] = _build(tp, layer, full + ".")
        elif full in layer:
            kwargs[f.name] = layer[full][0]
        elif schema.keys[f.name].required:
            raise ConfigError(
                f"{full}: required but not set (give it in the config file, "
                f"as {env_var_name(full)} or as a flag)"
            )
    sources = {key: source for key, (_, source) in layer.items()}
    token = _BUILD_CONTEXT.set((sources, prefix))
    try:
        twin = _FOREIGN_TABLES.get(cls)
        if twin is None:
            return typing.cast("Callable[..., _C]", cls)(**kwargs)
        checked = twin(**kwargs)
    finally:
        _BUILD_CONTEXT.reset(token)
    # The twin has checked and normalised every value; hand them to the real class.
    values = {name: getattr(checked, name) for name in kwargs}
    return typing.cast("Callable[..., _C]", cls)(**values)


# --- loaders -----------------------------------------------------------------------------


def _load_one(
    cls: type[_C],
    path: str | Path | None,
    flags: Mapping[str, object],
    env: Mapping[str, str],
) -> _C:
    _warn_unknown_env(env)
    file_layer = {} if path is None else _file_layer(_read_toml(path), cls, f"file {path}")
    layer = {**file_layer, **_env_layer(cls, env), **_flag_layer(cls, flags)}
    return _build(cls, layer)


def load_nameserver_config(
    path: str | Path | None,
    flags: Mapping[str, object],
    env: Mapping[str, str] = os.environ,
) -> NameserverConfig:
    """Defaults < TOML file ``path`` < ``HAC_*`` env < flags (``None`` = not given)."""
    return _load_one(NameserverConfig, path, flags, env)


def load_proxy_config(
    path: str | Path | None,
    flags: Mapping[str, object],
    env: Mapping[str, str] = os.environ,
) -> ProxyConfig:
    """The gRPC gateway's settings: defaults < TOML file ``path`` < ``HAC_*`` env < flags.

    As for the other loaders, a flag whose value is ``None`` is "not given", flag keys
    are config keys or their aliases (``namesrv``, ``http``), and string values are
    parsed like environment values (``fifo_groups="g1,g2"``).
    """
    return _load_one(ProxyConfig, path, flags, env)


def load_broker_configs(
    path: str | Path | None,
    flags: Mapping[str, object],
    env: Mapping[str, str] = os.environ,
) -> tuple[BrokerConfig, ...]:
    """The brokers of a broker container (one process hosting several brokers).

    The file's top-level keys (and tables) are defaults shared by every
    ``[[brokers]]`` table; a ``[[brokers]]`` table overrides them; env and flags
    override both for every broker, except keys that identify one broker
    (name, id, listeners, store) which env/flags cannot set when the container
    holds more than one.  A file without ``[[brokers]]`` is a single broker.
    """
    _warn_unknown_env(env)
    where = f"file {path}"
    table = {} if path is None else dict(_read_toml(path))
    entries = table.pop("brokers", None)
    if entries is None:
        entry_layers: list[_Layer] = [{}]
    elif (
        isinstance(entries, list) and entries and all(isinstance(entry, dict) for entry in entries)
    ):
        entry_layers = [
            _file_layer(entry, BrokerConfig, f"{where}, brokers[{i}]")
            for i, entry in enumerate(entries)
        ]
    else:
        raise ConfigError(
            f"brokers ({where}): expected one or more [[brokers]] tables, got {_describe(entries)}"
        )
    shared = _file_layer(table, BrokerConfig, where)
    overrides = {**_env_layer(BrokerConfig, env), **_flag_layer(BrokerConfig, flags)}
    if len(entry_layers) > 1:
        keys = _schema(BrokerConfig).keys
        for name, (_, source) in overrides.items():
            if keys[name].per_broker:
                raise ConfigError(
                    f"{name} ({source}): would give all {len(entry_layers)} brokers of the "
                    f"container the same {name}; set it in each [[brokers]] table instead"
                )
    configs = tuple(
        _build(BrokerConfig, {**shared, **entry, **overrides}) for entry in entry_layers
    )
    _check_container(configs, where)
    return configs


def load_broker_config(
    path: str | Path | None,
    flags: Mapping[str, object],
    env: Mapping[str, str] = os.environ,
) -> BrokerConfig:
    """Defaults < TOML file ``path`` < ``HAC_*`` env < flags (``None`` = not given)."""
    configs = load_broker_configs(path, flags, env)
    if len(configs) != 1:
        raise ConfigError(
            f"brokers (file {path}): lists {len(configs)} brokers (a broker container); "
            "load it with load_broker_configs"
        )
    return configs[0]


def _check_container(configs: Sequence[BrokerConfig], where: str) -> None:
    identities: dict[tuple[str, int], int] = {}
    stores: dict[Path, int] = {}
    listeners: dict[str, str] = {}
    for i, cfg in enumerate(configs):
        other = identities.setdefault((cfg.broker_name, cfg.broker_id), i)
        if other != i:
            raise ConfigError(
                f"brokers[{other}].broker_name/broker_id, brokers[{i}].broker_name/broker_id "
                f"({where}): both are {cfg.broker_name} id {cfg.broker_id}"
            )
        other = stores.setdefault(cfg.store_path, i)
        if other != i:
            raise ConfigError(
                f"brokers[{other}].store_dir, brokers[{i}].store_dir ({where}): "
                f"both use {str(cfg.store_path)!r}"
            )
        for key in ("listen", "ha_listen", "http_listen"):
            listeners[f"brokers[{i}].{key}"] = getattr(cfg, key)
    clash = _listener_clash(listeners)
    if clash is not None:
        raise ConfigError(f"{', '.join(clash[0])} ({where}): {clash[1]}")


# --- rendering ---------------------------------------------------------------------------


def _as_table(cfg: object) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
        if not f.init:
            continue
        value = getattr(cfg, f.name)
        if value is None:  # TOML has no null: unset = absent
            continue
        if _is_config_class(type(value)):
            out[f.name] = _as_table(value)
        elif isinstance(value, tuple):
            out[f.name] = list(value)
        else:
            out[f.name] = value
    return out


def to_toml_dict(
    cfg: NameserverConfig | BrokerConfig | ProxyConfig | Sequence[BrokerConfig],
) -> dict[str, Any]:
    """The TOML document (as ``tomllib`` would load it) that reproduces ``cfg``.

    A sequence of brokers becomes a container document: settings equal in all
    brokers at the top level, the rest in one ``[[brokers]]`` table each.
    """
    if isinstance(cfg, _Validated):
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
    lines += _toml_table(to_toml_dict(cfg), "")
    return "\n".join(lines) + "\n"


_BARE_KEY_RE = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)


def _toml_key(key: str) -> str:
    return key if _BARE_KEY_RE.fullmatch(key) else _toml_string(key)


def _toml_string(text: str) -> str:
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


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # finite (checked at load): "0.05", "72.0"
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot render {type(value).__name__} as TOML")


def _is_table_array(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _toml_table(table: Mapping[str, Any], path: str) -> list[str]:
    lines = [
        f"{_toml_key(k)} = {_toml_value(v)}"
        for k, v in table.items()
        if not isinstance(v, dict) and not _is_table_array(v)
    ]
    for k, v in table.items():
        if isinstance(v, dict):
            sub = f"{path}{_toml_key(k)}"
            lines += ["", f"[{sub}]", *_toml_table(v, sub + ".")]
    for k, v in table.items():
        if _is_table_array(v):
            sub = f"{path}{_toml_key(k)}"
            for item in v:
                lines += ["", f"[[{sub}]]", *_toml_table(item, sub + ".")]
    return lines
