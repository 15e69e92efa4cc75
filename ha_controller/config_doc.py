"""Write ``docs/configuration.md`` from the config dataclasses of :mod:`ha_controller.config`.

    .venv/bin/python -m ha_controller.config_doc           # rewrite docs/configuration.md
    .venv/bin/python -m ha_controller.config_doc --check   # exit 1 when it is stale

Everything in the reference is read from the classes: every key (nested tables
dotted), its type, default, unit (the ``_ms``/``_s``/``_bytes`` suffix), bounds,
format check, environment variable, and whether it is secret or set per broker.
A key's description is the comment above its field in ``ha_controller/config.py``
(for the ``[limits]`` table: the entry in :class:`RpcLimits`' docstring); the
cross-field rules are read from each class's ``_rules`` (the condition of each
``yield`` and the message it yields).  What the source does not say is written in
:data:`DESCRIPTIONS` and :data:`NOTES` below.  A key without any description, a
check function nobody described, or an entry here naming a key that no longer
exists stops the generator with an error, so the reference cannot silently rot.

This module only reads the config classes (no service is imported); the output
is deterministic (field order, no dates).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ha_controller.config import (
    AclConfig,
    BrokerConfig,
    NameserverConfig,
    ProxyConfig,
    RpcLimits,
    TlsConfig,
    env_var_name,
)

__all__ = ["COMMAND", "DEFAULT_PATH", "main", "render"]

#: How to regenerate the file (printed by ``--check`` and the docs test).
COMMAND = ".venv/bin/python -m ha_controller.config_doc"
DEFAULT_PATH = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

#: component anchor -> (the command that reads it, its class)
COMPONENTS: tuple[tuple[str, str, type], ...] = (
    ("nameserver", "hactl nameserver", NameserverConfig),
    ("broker", "hactl broker", BrokerConfig),
    ("proxy", "hactl proxy", ProxyConfig),
)
#: nested tables, documented once each
TABLES: tuple[tuple[str, type], ...] = (
    ("tls", TlsConfig),
    ("acl", AclConfig),
    ("limits", RpcLimits),
)

#: What each field ``check`` function accepts (by function name).
CHECKS: dict[str, str] = {
    "_listen_check": "`host:port` (IPv6 as `[addr]:port`); port 0 = any free port",
    "_targets_check": "one or more `host:port` (a list, or one comma-separated string); "
    "port 0 is refused",
    "_name_check": "1..127 letters, digits, `_`, `-` or `.`",
    "_host_check": "a host name, IPv4 or IPv6 address (no port)",
    "_not_empty": "not empty (leave the key out instead)",
    "_delay_levels_check": "space-separated positive durations with a unit "
    "(`ms`, `s`, `m`, `h`, `d`), at least one",
    "_delete_when_check": 'hours of day 0..23 separated by `;` (`"04"`, `"04;05"`)',
    "_fraction_check": "0 ≤ value < 1",
    "_used_ratio_check": "0 < value ≤ 1",
}

# Descriptions the source does not give, or gives wrongly: (class name, field) -> text.
# They replace the comment above the field, if there is one.
DESCRIPTIONS: dict[tuple[str, str], str] = {
    # --- nameserver
    ("NameserverConfig", "listen"): "RPC listener (brokers, clients, `hactl`).",
    ("NameserverConfig", "http_listen"): "Admin HTTP listener: `/api/v1/*`, `/healthz`, "
    "`/readyz`, `/metrics`. Served over HTTPS when `tls.enabled`.",
    ("NameserverConfig", "support_acting_master"): "RIP-32 on the nameserver: when a group "
    "loses its master, show the chosen slave to clients as read-only `brokerId 0` "
    "(RocketMQ defaults this to false; this product exists for it). Only groups whose "
    "brokers register with `enable_slave_acting_master` get it.",
    ("NameserverConfig", "scan_not_active_broker_interval_ms"): "How often the "
    "nameserver looks for brokers whose heartbeats stopped (RocketMQ "
    "`scanNotActiveBrokerInterval`), so a silent broker is expired within its "
    "`broker_not_active_timeout_ms` plus this. A broker whose connection drops is "
    "expired at once.",
    ("NameserverConfig", "notify_min_broker_id_changed"): "Send "
    "`NOTIFY_MIN_BROKER_ID_CHANGE` to a group's members when its lead changes "
    "(master lost, slave chosen, master back), so a slave starts or stops acting at "
    "once instead of at its next member-group poll. RocketMQ defaults this to false.",
    ("NameserverConfig", "notify_timeout_ms"): "Timeout of one min-broker-id "
    "notification (connect and call).",
    ("NameserverConfig", "notify_retries"): "Attempts per broker at delivering a "
    "min-broker-id notification (0 counts as 1), 0.2 s apart, doubling up to 2 s.",
    ("NameserverConfig", "cluster_secret"): "HMAC-SHA256 key of the control plane, the "
    "same on every nameserver and broker: when set, every request between cluster "
    "members (register, unregister, heartbeat, min-id notices, ...) is signed over the "
    "whole request with a timestamp and a nonce; unsigned, wrongly signed, replayed ones "
    "or ones more than 30 s off this server's clock are refused (`SignatureInvalid`, "
    "`ReplayedRequest`) and change nothing. Unset = open mode (see "
    "[security](security.md)).",
    ("NameserverConfig", "open_mode_check_peer_host"): "Without a `cluster_secret`: "
    "refuse (`AddressMismatch`) a registration whose address is not on the host the "
    "broker's connection comes from (host only: ports are not compared; a name is "
    "resolved; a broker on this machine may advertise any of its addresses). Turn off "
    "when brokers reach the nameservers through NAT. Ignored with a secret.",
    ("NameserverConfig", "route_watch_max_wait_ms"): "The longest a `WATCH_ROUTE` is "
    "held before it is answered unchanged (a client may ask for less; the request's "
    "own timeout minus 0.5 s also caps it).",
    ("NameserverConfig", "max_route_watchers"): "Route watches held at once; one more "
    "is answered `Overloaded`.",
    ("NameserverConfig", "log_level"): "Log level of the process.",
    # --- broker: identity and addresses
    ("BrokerConfig", "cluster"): "Cluster name the broker registers under.",
    ("BrokerConfig", "broker_name"): "The broker group (RocketMQ `brokerName`): every "
    "member of a group has the same name.",
    ("BrokerConfig", "namesrv_addrs"): "Every nameserver; the broker registers and "
    "heartbeats with each. Run two or more: a master that reaches no nameserver for "
    "`broker_not_active_timeout_ms` fences itself.",
    ("BrokerConfig", "listen"): "RPC listener (clients, peers, nameserver notifications).",
    ("BrokerConfig", "ha_listen"): "HA replication listener. Only a master (id 0) "
    "binds it; its slaves connect to it. A slave advertises it but does not listen.",
    ("BrokerConfig", "http_listen"): "Admin HTTP listener: `/api/v1/status`, "
    "`/healthz`, `/readyz`, `/metrics`. Served over HTTPS when `tls.enabled`.",
    ("BrokerConfig", "broker_ip1"): "RocketMQ `brokerIP1`: the host advertised for the "
    "RPC and HA ports (in registrations and routes) instead of the bound one; needed "
    "when a listener binds a wildcard. Unset = the bound address.",
    ("BrokerConfig", "store_dir"): "Store directory (commit log, consume queues, "
    "checkpoint, topic and offset tables). Unset = `~/store/<broker_name>-<broker_id>`.",
    # --- broker: RIP-32 switches
    ("BrokerConfig", "enable_slave_acting_master"): "RIP-32 on the broker: a slave acts "
    "for its lost master when the nameserver names it; a master keeps a lease on id 0 "
    "and fences itself when it may have been expired. Also makes the registration carry "
    "`broker_not_active_timeout_ms` (without it the nameserver uses 120 s, as RocketMQ). "
    "RocketMQ defaults this to false.",
    ("BrokerConfig", "enable_remote_escape"): "An acting slave may send special "
    "messages (due delayed messages, open transactions, POP records) to a master of "
    "another group. Off, it only escapes to a master in the same process (broker "
    "container).",
    ("BrokerConfig", "skip_pre_online"): "Start serving at once instead of isolated: "
    "a returning master then keeps its stale offsets. For drills that show what "
    "pre-online prevents; never in production.",
    ("BrokerConfig", "broker_heartbeat_interval_ms"): "`BROKER_HEARTBEAT` to every "
    "nameserver this often. Each acknowledged heartbeat extends a master's lease.",
    ("BrokerConfig", "broker_not_active_timeout_ms"): "The nameserver expires the "
    "broker when its heartbeats stop for this long (sent in the registration), and a "
    "master's lease on id 0 is this long from the last acknowledged heartbeat.",
    ("BrokerConfig", "send_heartbeat_timeout_ms"): "Timeout of one heartbeat call.",
    ("BrokerConfig", "sync_broker_member_group_period_ms"): "Poll of "
    "`GET_BROKER_MEMBER_GROUP`: the backstop that makes a slave act (or stop) even "
    "when a notification was lost.",
    ("BrokerConfig", "register_broker_timeout_ms"): "Timeout of one `REGISTER_BROKER`.",
    ("BrokerConfig", "load_balance_poll_name_server_interval_ms"): "RocketMQ "
    "`loadBalancePollNameServerInterval`. Accepted and checked, but not read: the "
    "escape bridge reuses a route for at most 1 s and asks again after a miss or a "
    "failed send.",
    ("BrokerConfig", "lock_in_strict_mode"): "Queue locks (orderly consumption) "
    "need a quorum of the group (`total_replicas // 2 + 1` copies) instead of the "
    "receiving broker alone, so an acting slave that never saw a lock cannot grant it "
    "to a second client.",
    ("BrokerConfig", "consumer_offset_update_version_step"): "The consumer offset "
    "table's data version moves every this many commits; pre-online compares versions "
    "to adopt a slave's newer table.",
    ("BrokerConfig", "delay_offset_update_version_step"): "The same for the delay "
    "offset table (one update per delivered delayed message).",
    # --- broker: replication and store
    ("BrokerConfig", "total_replicas"): "Members of the group, the master included. "
    "Bounds `in_sync_replicas`; pre-online runs only when it is above 1; the strict "
    "lock quorum is `total_replicas // 2 + 1`. (RocketMQ defaults it to 1; 3 is what "
    "two in-sync copies need with a spare.)",
    ("BrokerConfig", "in_sync_replicas"): "Copies (the master's included) a SYNC send "
    "waits for; with fewer live slaves a send fails at once with the retriable "
    "`InSyncReplicasNotEnough`, so the producer tries another group.",
    ("BrokerConfig", "replication_mode"): "`sync`: a send is acknowledged once "
    "`in_sync_replicas` copies hold it; `async`: once the master stored it.",
    ("BrokerConfig", "flush_mode"): "`async`: the commit log is fsynced every "
    "`flush_interval_ms`; `sync`: before each send is acknowledged.",
    ("BrokerConfig", "slave_ack_timeout_ms"): "How long a SYNC send waits for its "
    "slave copies. When they do not come in time the send fails with `SlaveAckTimeout`, "
    "which is not retriable: the message is stored and will be delivered, so resending "
    "it elsewhere would duplicate it. (Too few connected slaves is a different error: "
    "`InSyncReplicasNotEnough`, at once, nothing stored.) RocketMQ's `syncFlushTimeout` "
    "is 5 s.",
    ("BrokerConfig", "segment_size_bytes"): "Size of one commit-log segment file. "
    "Must be the same on every member: slaves copy records byte for byte.",
    ("BrokerConfig", "auto_create_topic"): "A send to an unknown topic creates it "
    "with `default_topic_queue_nums` queues (RocketMQ's `autoCreateTopicEnable`).",
    ("BrokerConfig", "default_topic_queue_nums"): "Queues of an auto-created topic.",
    ("BrokerConfig", "long_polling_enable"): "Hold a pull that finds nothing until a "
    "message arrives or the client's suspend timeout passes; off, such a pull is "
    "answered empty at once.",
    ("BrokerConfig", "long_polling_check_interval_ms"): "Backstop re-check of held "
    "pulls with long polling on (an arriving message wakes them at once anyway).",
    ("BrokerConfig", "short_polling_check_interval_ms"): "The same re-check with long polling off.",
    ("BrokerConfig", "max_held_pulls"): "Pulls held at once; one more that would be "
    "held is refused with the retriable `Overloaded`.",
    ("BrokerConfig", "cluster_secret"): "HMAC key of the control plane; must equal "
    "the nameservers' and the other brokers' `cluster_secret`. The broker signs every "
    "request it sends to nameservers and brokers, refuses unsigned control requests "
    "(notices, HA-info exchange, lock votes, pre-online pulls), and its HA port counts "
    "and streams to a slave only after a challenge-response on the secret. Unset = "
    "open mode (see [security](security.md)).",
    ("BrokerConfig", "admin_token"): "Bearer token of the admin HTTP API: with it set, "
    "every endpoint but `/healthz`, `/readyz` and `/metrics` answers 401 without "
    "`Authorization: Bearer <token>`. Unset = no token required.",
    ("BrokerConfig", "delay_levels"): "RocketMQ `messageDelayLevel`: the delay of "
    "each level, level 1 first. A level above the last is clamped to the last.",
    ("BrokerConfig", "escape_max_attempts"): "Attempts of one escape (a send to "
    "another group's master) before it counts as failed; the back-off between them "
    "doubles from `escape_backoff_initial_ms` to `escape_backoff_max_ms`. An open "
    "transaction whose escape failed this many times in a row is given up.",
    ("BrokerConfig", "escape_backoff_initial_ms"): "First back-off between escape attempts.",
    ("BrokerConfig", "escape_backoff_max_ms"): "Longest back-off between escape attempts.",
    ("BrokerConfig", "escape_send_timeout_ms"): "Timeout of one escape send.",
    ("BrokerConfig", "pop_revive_interval_ms"): "How often the POP revive service "
    "(on the master or the acting slave) reads the revive queues and puts messages whose "
    "invisible time is over and that were not acked into `%RETRY%<group>` (RocketMQ "
    "`reviveInterval`).",
    ("BrokerConfig", "transaction_check_interval_ms"): "How often the check service "
    "walks the open transactions (RocketMQ `transactionCheckInterval`).",
    ("BrokerConfig", "transaction_timeout_ms"): "A half message is checked back with "
    "its producer once it is this old (RocketMQ `transactionTimeOut`).",
    ("BrokerConfig", "transaction_check_max"): "Check-backs of one transaction before "
    "it is discarded (RocketMQ `transactionCheckMax`).",
    ("BrokerConfig", "log_level"): "Log level of the process.",
    # --- proxy
    ("ProxyConfig", "namesrv_addrs"): "Nameservers the gateway reads routes from.",
    ("ProxyConfig", "log_level"): "Log level of the process.",
    # --- [tls]
    ("TlsConfig", "enabled"): "TLS on every listener of the process (RPC, HA, admin "
    "HTTP, the gateway's gRPC) and on its outgoing connections (nameservers, brokers, "
    "the HA master).",
    ("TlsConfig", "cert_file"): "PEM certificate (chain) of this process.",
    ("TlsConfig", "key_file"): "PEM private key of `cert_file`.",
    ("TlsConfig", "ca_file"): "PEM CA bundle to verify peers with (and, with "
    "`require_client_cert`, client certificates); unset = the system's CAs.",
    ("TlsConfig", "require_client_cert"): "Mutual TLS: listeners demand a client "
    "certificate signed by `ca_file`.",
    ("TlsConfig", "verify_hostname"): "Outgoing connections check that the server's "
    "certificate names the host dialled (a DNS or IP subjectAltName matching the "
    "advertised address, `broker_ip1` or `namesrv_addrs`). Turn off for peers dialled "
    "by addresses their certificate does not list (pods by IP): the chain is still "
    "verified against `ca_file`, but any certificate that CA signed is then trusted for "
    "every peer.",
    # --- [limits]
    ("RpcLimits", "max_frame_bytes"): "Largest frame (its payload: the whole envelope) "
    "accepted; a bigger one closes the connection (`FrameTooLarge`). A message must fit "
    "in one frame.",
    ("RpcLimits", "max_list_size"): "Most blocks one frame may announce "
    "(TubeMQ `listSize`); more closes the connection.",
    ("RpcLimits", "max_block_bytes"): "Size of the blocks a sender cuts a frame's "
    "payload into (a receiver accepts larger blocks up to `max_frame_bytes`).",
    ("RpcLimits", "max_inflight_requests"): "Requests one connection may have running "
    "at once; one more is answered `Overloaded` (retriable).",
    ("RpcLimits", "default_timeout_ms"): "Timeout of an outgoing call that names "
    "none; it travels in the request, and a reply later than it is dropped.",
}

# Facts to add after a key's description: (class name, field) -> text.
NOTES: dict[tuple[str, str], str] = {
    ("BrokerConfig", "auto_create_topic"): "On by default; "
    "`helm/ha-controller/examples/production.yaml` turns it off, so that a misspelled "
    "topic fails the send instead of quietly becoming a new topic. With it off, create "
    "every topic with `hactl topic create`, which creates it on every group's master: "
    "an acting slave can only escape delayed messages and open transactions of a "
    "topic to a master that has that topic.",
}

# Section headers in config.py name the source's design notes; the reference must
# stand alone.
_DESIGN_PAREN = re.compile(r"\s*\((?:see )?DESIGN(?:\.md)?\s*(?:section|§)\s*\d+\)")
_DESIGN_WORD = re.compile(r"DESIGN(?:\.md)?\s*(?:section|§)\s*\d+")
_SECTION_RE = re.compile(r"^\s*# --- (.+?) ---\s*$")
_RST_ROLE = re.compile(r":\w+:`~?([^`]+)`")
_DOCS_LINK = re.compile(r"\bdocs/([\w-]+\.md)\b")
# a definition-list entry of a docstring: ``key`` (default) [and ``key`` (default)]
_ENTRY_RE = re.compile(r"^``\w+``(?: \([^)]*\))?(?: and ``\w+``(?: \([^)]*\))?)?$")


def _clean(text: str) -> str:
    text = _DESIGN_PAREN.sub("", text)
    text = _DESIGN_WORD.sub("this project", text)
    text = _RST_ROLE.sub(lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", text)
    text = _DOCS_LINK.sub(lambda m: f"[{m.group(1)}]({m.group(1)})", text)
    return text.replace("``", "`")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# --- reading the classes --------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    owner: type  # the class that defines the field
    name: str  # dotted from the component: "tls.cert_file"
    field: dataclasses.Field[Any]
    tp: Any
    section: str | None
    comment: str


@dataclass(frozen=True)
class Rule:
    keys: tuple[str, ...]
    when: str
    message: str


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_table(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _source_comments(cls: type) -> dict[str, tuple[str | None, str]]:
    """field -> (section header above it, the comment lines right above it)."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    tree = ast.parse(source)
    node = tree.body[0]
    assert isinstance(node, ast.ClassDef)
    out: dict[str, tuple[str | None, str]] = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        comment: list[str] = []
        i = stmt.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#"):
            if _SECTION_RE.match(lines[i]):
                break
            comment.insert(0, lines[i].strip().lstrip("#").strip())
            i -= 1
        section = None
        for line in reversed(lines[: stmt.lineno - 1]):
            match = _SECTION_RE.match(line)
            if match:
                section = match.group(1)
                break
        out[stmt.target.id] = (section, " ".join(comment))
    return out


def _docstring_entries(cls: type) -> dict[str, str]:
    """``RpcLimits``-style docstrings: a line ````name```` (...) at the margin, then an
    indented paragraph; an entry naming two keys belongs to both.  A literal block
    (``::`` and deeper indentation) becomes inline code."""
    doc = inspect.getdoc(cls) or ""
    entries: dict[str, str] = {}
    names: list[str] = []
    body: list[str] = []
    literal: list[str] = []

    def end_literal() -> None:
        if literal:
            body.append("`" + " ".join(literal) + "`")
            literal.clear()

    def flush() -> None:
        end_literal()
        text = " ".join(" ".join(body).split()).replace(":: `", ": `")
        for name in names:
            entries[name] = text

    for line in doc.splitlines():
        if _ENTRY_RE.match(line):
            flush()
            names = re.findall(r"``(\w+)``", line)
            body = []
        elif not names:
            continue
        elif line.startswith("        "):
            literal.append(line.strip())
        elif line.startswith("    "):
            end_literal()
            body.append(line.strip())
        elif line.strip():
            flush()
            names = []
    flush()
    return entries


def _keys(cls: type, prefix: str = "") -> Iterator[Key]:
    hints = _hints(cls)
    comments = _source_comments(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        if _is_table(tp) and not prefix:
            continue  # documented as a table of its own
        section, comment = comments.get(f.name, (None, ""))
        yield Key(cls, prefix + f.name, f, tp, section, comment)


def _unit(name: str) -> str:
    for suffix, unit in (("_ms", "ms"), ("_s", "s"), ("_bytes", "bytes")):
        if name.endswith(suffix):
            return unit
    return ""


def _human(value: int, unit: str) -> str:
    if unit == "bytes":
        for size, word in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if value >= size and value % size == 0:
                return f"{value // size} {word}"
    if unit == "ms" and value >= 1000 and value % 1000 == 0:
        return f"{value // 1000} s"
    return ""


def _number(value: int, unit: str) -> str:
    human = _human(value, unit)
    return f"`{value}` ({human})" if human else f"`{value}`"


def _optional_inner(tp: Any) -> Any | None:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return None


def _type_name(tp: Any) -> str:
    inner = _optional_inner(tp)
    if inner is not None:
        return f"{_type_name(inner)}, optional"
    if tp is bool:
        return "boolean"
    if tp is int:
        return "integer"
    if tp is float:
        return "number"
    if tp is str:
        return "string"
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(f'`"{c}"`' for c in typing.get_args(tp))
    if origin is tuple:
        return "list of strings"
    raise TypeError(f"describe config type {tp!r} in ha_controller/config_doc.py")


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


def _default(key: Key) -> str:
    f = key.field
    value: object
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "**required**"
    if value is None:
        return "unset"
    if isinstance(value, int) and not isinstance(value, bool):
        return _number(value, _unit(key.name))
    return f"`{_toml(value)}`"


def _accepts(key: Key) -> str:
    """Bounds and format, as the loader checks them."""
    f, unit = key.field, _unit(key.name)
    parts: list[str] = []
    if key.tp is int:
        # A duration or size of zero or less is never meaningful (the loader's rule).
        ge = f.metadata.get("ge", 1 if unit else None)
        le = f.metadata.get("le")
        if ge is not None and le is not None:
            parts.append(f"{_plain(ge, unit)} … {_plain(le, unit)}")
        elif ge is not None:
            parts.append(f"≥ {_plain(ge, unit)}")
        elif le is not None:
            parts.append(f"≤ {_plain(le, unit)}")
    check = f.metadata.get("check")
    if check is not None:
        name = getattr(check, "__name__", repr(check))
        if name not in CHECKS:
            raise KeyError(
                f"{key.owner.__name__}.{f.name}: describe check {name} in "
                "ha_controller/config_doc.py CHECKS"
            )
        parts.append(CHECKS[name])
    return "; ".join(parts)


def _plain(value: int, unit: str) -> str:
    human = _human(value, unit)
    return f"{value} ({human})" if human else str(value)


def _description(key: Key, docs: dict[str, str]) -> str:
    ident = (key.owner.__name__, key.field.name)
    text = DESCRIPTIONS.get(ident) or key.comment or docs.get(key.field.name, "")
    if not text:
        raise KeyError(
            f"{key.owner.__name__}.{key.field.name} has no description: add a comment "
            "above the field in ha_controller/config.py or an entry to DESCRIPTIONS in "
            "ha_controller/config_doc.py"
        )
    text = _clean(text)
    if key.field.name in docs and ident not in DESCRIPTIONS and not key.comment:
        text = _first_sentence(text) + " (see below)"
    note = NOTES.get(ident)
    if note:
        text = f"{text} {note}"
    marks = []
    if key.field.metadata.get("secret"):
        marks.append("**Secret**: never shown in logs or error messages.")
    if key.field.metadata.get("per_broker"):
        marks.append("**Per broker** (see [broker containers](#broker-containers)).")
    return " ".join([text, *marks])


def _first_sentence(text: str) -> str:
    match = re.match(r"(.+?[.:])(\s|$)", text)
    return (match.group(1) if match else text).rstrip(":.") + "."


# --- cross-field rules ----------------------------------------------------------------------


def _strip_self(text: str) -> str:
    return re.sub(r"\bself\.", "", text)


def _message(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                out.append(str(part.value))
            elif isinstance(part, ast.FormattedValue):
                out.append("{" + _strip_self(ast.unparse(part.value)) + "}")
        return "".join(out)
    return _strip_self(ast.unparse(node))


def _self_attrs(nodes: Sequence[ast.AST]) -> list[str]:
    found: list[str] = []
    for node in nodes:
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.Attribute)
                and isinstance(sub.value, ast.Name)
                and sub.value.id == "self"
                and sub.attr not in found
            ):
                found.append(sub.attr)
    return found


def _constants(node: ast.AST) -> list[str]:
    return [
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def rules_of(cls: type) -> list[Rule]:
    """The cross-field rules ``cls._rules`` yields, read from its source."""
    func = cls.__dict__.get("_rules")
    if func is None:
        return []
    module = sys.modules[func.__module__]
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    rules: list[Rule] = []
    # each enclosing condition: (as the reference shows it, its test node or None)
    Conds = list[tuple[str, ast.AST | None]]
    # for-loop variable -> the string constants it runs over
    for_targets: dict[str, list[str]] = {}

    def record(value: ast.expr, conds: Conds, env: dict[str, ast.expr]) -> None:
        tests = [node for _, node in conds if node is not None]
        if isinstance(value, ast.Tuple) and len(value.elts) == 2:
            keys_node, message_node = value.elts
            keys: list[str] = []
            for elt in keys_node.elts if isinstance(keys_node, ast.Tuple) else [keys_node]:
                if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                    keys.append(elt.value)
                elif isinstance(elt, ast.Name) and elt.id in for_targets:
                    keys.extend(for_targets[elt.id])
                else:
                    keys.extend(k for k in _self_attrs(tests) if k not in keys)
            rules.append(Rule(tuple(dict.fromkeys(keys)), _when(conds), _message(message_node)))
            return
        if isinstance(value, ast.Name) and isinstance(env.get(value.id), ast.Call):
            call = env[value.id]
            assert isinstance(call, ast.Call)
            helper: Callable[..., Any] | None = None
            if isinstance(call.func, ast.Name):
                helper = getattr(module, call.func.id, None)
            doc = (inspect.getdoc(helper) or "") if helper is not None else ""
            keys = _constants(call.args[0]) if call.args else []
            if call.args and isinstance(call.args[0], ast.Dict):
                keys = [
                    k.value
                    for k in call.args[0].keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)
                ]
            kept = [(t, n) for t, n in conds if value.id not in {x.id for x in _names(n)}]
            rules.append(Rule(tuple(keys), _when(kept), doc.splitlines()[0] if doc else ""))
            return
        raise ValueError(f"{cls.__name__}._rules: cannot read the rule {ast.unparse(value)}")

    def walk(stmts: list[ast.stmt], conds: Conds, env: dict[str, ast.expr]) -> None:
        for stmt in stmts:
            if isinstance(stmt, ast.If):
                text = _strip_self(ast.unparse(stmt.test))
                if isinstance(stmt.test, ast.BoolOp) and isinstance(stmt.test.op, ast.Or):
                    text = f"({text})"
                walk(stmt.body, [*conds, (text, stmt.test)], env)
                if stmt.orelse:
                    walk(stmt.orelse, [*conds, (f"not {text}", stmt.test)], env)
            elif isinstance(stmt, ast.For) and isinstance(stmt.target, ast.Name):
                for_targets[stmt.target.id] = _constants(stmt.iter)
                items = ", ".join(f"`{c}`" for c in for_targets[stmt.target.id])
                walk(stmt.body, [*conds, (f"for each of {items}:", None)], env)
            elif isinstance(stmt, ast.Assign):
                if len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                    env[stmt.targets[0].id] = stmt.value
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Yield):
                if stmt.value.value is not None:
                    record(stmt.value.value, conds, env)

    walk(fn.body, [], {})
    return rules


def _names(node: ast.AST | None) -> list[ast.Name]:
    if node is None:
        return []
    return [n for n in ast.walk(node) if isinstance(n, ast.Name)]


def _when(conds: Sequence[tuple[str, ast.AST | None]]) -> str:
    """``for each of `a`, `b`: `x and y``` from the enclosing loops and conditions."""
    loops = [text for text, node in conds if node is None]
    tests = [text for text, node in conds if node is not None]
    code = f"`{' and '.join(tests)}`" if tests else "always checked"
    return " ".join([*loops, code])


# --- rendering ------------------------------------------------------------------------------

HEADER = """\
<!-- Generated by `{command}` from ha_controller/config.py; do not edit by hand. -->

# Configuration reference

Every process reads one typed, validated configuration. Values come from four
layers, each overriding the one before:

1. the defaults below;
2. a TOML file given with `--config FILE`;
3. environment variables `HAC_<KEY>`: the key in upper case, a nested key with
   `_` (`tls.cert_file` is `HAC_TLS_CERT_FILE`);
4. command-line flags. Only a handful of keys have one (`--listen`, `--http`,
   `--namesrv`, `--broker-name`, ...): `hactl nameserver --help`,
   `hactl broker --help` and `hactl proxy --help` list them.

A bad value stops the process with one line that names the key, where the value
came from and what was expected, for example
`hactl: config error: total_replicas (env HAC_TOTAL_REPLICAS): must be <= 64, got 100`.
An unknown key in the file is an error too, with the closest real key
(`unknown key 'lock_in_strict' in file broker.toml; did you mean
'lock_in_strict_mode'?`); an unknown `HAC_*` variable that is close to a real one
is logged as a warning.

How values are written:

| type | in TOML | in the environment |
|---|---|---|
| boolean | `true` / `false` | `true`/`false`, `1`/`0`, `yes`/`no` |
| integer | `3000` or `3_000` | the same |
| string | `"text"` | the text as it is |
| string, optional | leave the key out for "unset" | an empty value means unset |
| list of strings | `["a:1", "b:2"]` | one comma-separated string: `a:1,b:2` |
| one of ... | `"sync"` (any case) | the same, without quotes |

**Units are in the names**: `*_ms` is milliseconds, `*_s` seconds, `*_bytes`
bytes. A duration or size must be at least 1 unless its row says otherwise.

**The environment is shared by name**: `HAC_LISTEN` sets `listen` of whichever
process reads it. When a nameserver and a broker share one environment (one
shell, one container), give per-process values in their files or flags instead.

Example (`broker.toml`):

```toml
cluster = "prod"
broker_name = "broker-a"
broker_id = 0
namesrv_addrs = ["ns-0:9876", "ns-1:9876"]
store_dir = "/data/store"
auto_create_topic = false
lock_in_strict_mode = true

[tls]
enabled = true
cert_file = "/etc/hac/tls.crt"
key_file = "/etc/hac/tls.key"
ca_file = "/etc/hac/ca.crt"
require_client_cert = true

[limits]
max_frame_bytes = 67108864
```

Contents: {contents}.
"""

CONTAINER = """\
## Broker containers

One `hactl broker` process can host several brokers (each with its own store,
listeners and background work; an acting slave then escapes first to a master in
the same process). Give the file one `[[brokers]]` table per broker:

```toml
namesrv_addrs = ["ns-0:9876"]      # top-level keys: shared by every broker

[[brokers]]
broker_name = "broker-a"
broker_id = 0
listen = "0.0.0.0:10911"
ha_listen = "0.0.0.0:10912"
http_listen = "0.0.0.0:10913"
store_dir = "/data/a-0"

[[brokers]]
broker_name = "broker-b"
broker_id = 1
listen = "0.0.0.0:10921"
ha_listen = "0.0.0.0:10922"
http_listen = "0.0.0.0:10923"
store_dir = "/data/b-1"
```

A `[[brokers]]` table overrides the top-level keys; the environment and flags
override both, for every broker. The keys marked **per broker** identify one
broker, so with more than one broker they may not come from the environment or
flags (that would give every broker the same value). The brokers of one
container must also differ in `broker_name`/`broker_id`, in `store_dir`, and in
the ports of `listen`, `ha_listen` and `http_listen` (port 0 excepted).
"""


def _toc(entries: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"[{title}](#{anchor})" for title, anchor in entries)


def _key_table(keys: Sequence[Key], docs: dict[str, str]) -> list[str]:
    lines = [
        "| key | type | default | unit | accepts | environment | description |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in keys:
        cells = [
            f"`{key.name}`",
            _type_name(key.tp),
            _default(key),
            _unit(key.name),
            _accepts(key),
            f"`{env_var_name(key.name)}`",
            _description(key, docs),
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _rules_table(cls: type, prefix: str = "") -> list[str]:
    rules = rules_of(cls)
    if not rules:
        return []
    lines = [
        "",
        "Checked together (the first rule that fails is reported, naming its keys):",
        "",
        "| keys | fails when | message |",
        "|---|---|---|",
    ]
    for rule in rules:
        keys = ", ".join(f"`{prefix}{k}`" if "." not in k else f"`{k}`" for k in rule.keys)
        lines.append(f"| {_cell(keys)} | {_cell(rule.when)} | {_cell(rule.message)} |")
    return lines


def _sections(keys: Sequence[Key]) -> list[tuple[str | None, list[Key]]]:
    out: list[tuple[str | None, list[Key]]] = []
    for key in keys:
        if not out or out[-1][0] != key.section:
            out.append((key.section, []))
        out[-1][1].append(key)
    return out


def _class_doc(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    return _clean(" ".join(doc.split("\n\n")[0].split()))


def _tables_of(cls: type) -> list[str]:
    hints = _hints(cls)
    return [f.name for f in dataclasses.fields(cls) if f.init and _is_table(hints[f.name])]


def _check_entries() -> None:
    """Every DESCRIPTIONS / NOTES entry names a field that exists."""
    classes = {cls.__name__: cls for _, _, cls in COMPONENTS} | {
        cls.__name__: cls for _, cls in TABLES
    }
    for owner, name in [*DESCRIPTIONS, *NOTES]:
        cls = classes.get(owner)
        if cls is None or name not in {f.name for f in dataclasses.fields(cls)}:
            raise KeyError(
                f"ha_controller/config_doc.py describes {owner}.{name}, which does not exist"
            )


def render() -> str:
    """The whole of docs/configuration.md."""
    _check_entries()
    contents = [(f"`{cmd}`", anchor) for anchor, cmd, _ in COMPONENTS]
    contents += [(f"`[{name}]`", name) for name, _ in TABLES]
    contents.append(("broker containers", "broker-containers"))
    out = [HEADER.format(command=COMMAND, contents=_toc(contents))]
    for anchor, cmd, cls in COMPONENTS:
        out.append(f'<a id="{anchor}"></a>\n')
        out.append(f"## `{cmd}`\n")
        out.append(_class_doc(cls) + "\n")
        lines: list[str] = []
        for section, keys in _sections(list(_keys(cls))):
            if section is not None:
                lines += ["", f"### {_clean(section)[:1].upper()}{_clean(section)[1:]}", ""]
            lines += _key_table(keys, {})
        tables = _tables_of(cls)
        if tables:
            links = " and ".join(f"[`[{t}]`](#{t})" for t in tables)
            lines += ["", f"Tables: {links}."]
        lines += _rules_table(cls)
        out.append("\n".join(lines).lstrip("\n") + "\n")
    for name, cls in TABLES:
        users = [f"`{cmd}`" for _, cmd, component in COMPONENTS if name in _tables_of(component)]
        docs = {k: _clean(v) for k, v in _docstring_entries(cls).items()}
        out.append(f'<a id="{name}"></a>\n')
        out.append(f"## `[{name}]`\n")
        out.append(f"{_class_doc(cls)} Read by {' and '.join(users)}.\n")
        keys = [
            Key(k.owner, f"{name}.{k.name}", k.field, k.tp, k.section, k.comment)
            for k in _keys(cls, prefix="")
        ]
        lines = _key_table(keys, docs)
        lines += _rules_table(cls, prefix=f"{name}.")
        out.append("\n".join(lines) + "\n")
        if docs:
            out.append(f"### How the `[{name}]` bounds work\n")
            seen: set[str] = set()
            for key in keys:
                text = docs.get(key.field.name)
                if text is None or text in seen:
                    continue
                seen.add(text)
                named = [k.field.name for k in keys if docs.get(k.field.name) == text]
                title = " and ".join(f"`{name}.{n}`" for n in named)
                out.append(f"**{title}**: {text}\n")
    out.append(CONTAINER)
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ha_controller.config_doc",
        description="Write the configuration reference from ha_controller/config.py.",
    )
    parser.add_argument("path", nargs="?", type=Path, default=DEFAULT_PATH)
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is stale")
    args = parser.parse_args(argv)
    text = render()
    path: Path = args.path
    if args.check:
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            print(f"{path} is stale; regenerate it with: {COMMAND}", file=sys.stderr)
            return 1
        return 0
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
