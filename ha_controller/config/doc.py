"""Write ``docs/configuration.md`` from the config classes of :mod:`ha_controller.config`.

    .venv/bin/python -m ha_controller.config_doc           # rewrite docs/configuration.md
    .venv/bin/python -m ha_controller.config_doc --check   # exit 1 when it is stale

Everything in the reference comes from :func:`~ha_controller.config.schema.schema`:
every key (nested tables dotted), its type, default, unit (the ``_ms``/``_s``/``_bytes``
suffix), bounds, format check (what its :class:`~ha_controller.config.schema.Check`
accepts), environment variable, description (``doc``, and ``details`` shown below the
table), section, and whether it is secret or set per broker.  The cross-field rules are
read from each class's ``_rules`` (:mod:`ha_controller.config.doc_rules`).  A key
without a description stops the generator with an error, so the reference cannot
silently rot.

This module only reads the config classes (no service is imported); the output is
deterministic (field order, no dates).
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from ha_controller.config.broker import BrokerConfig
from ha_controller.config.doc_rules import rules_of
from ha_controller.config.generated import write_or_check
from ha_controller.config.nameserver import NameserverConfig
from ha_controller.config.proxy import ProxyConfig
from ha_controller.config.schema import Key, env_var_name, schema
from ha_controller.config.tables import AclConfig, RpcLimits, TlsConfig
from ha_controller.config.toml_writer import toml_value
from ha_controller.config.values import optional_inner

__all__ = ["COMMAND", "COMPONENTS", "DEFAULT_PATH", "TABLES", "main", "render"]

#: How to regenerate the file (printed by ``--check`` and the docs test).
COMMAND = ".venv/bin/python -m ha_controller.config_doc"
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

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

_RST_ROLE = re.compile(r":\w+:`~?([^`]+)`")
_DOCS_LINK = re.compile(r"\bdocs/([\w-]+\.md)\b")


def _clean(text: str) -> str:
    """Docstring and source text as Markdown: roles as code, ``docs/x.md`` as links."""
    text = _RST_ROLE.sub(lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", text)
    text = _DOCS_LINK.sub(lambda m: f"[{m.group(1)}]({m.group(1)})", text)
    return text.replace("``", "`")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# --- one key ----------------------------------------------------------------------------------


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


def _plain(value: float, unit: str) -> str:
    human = _human(int(value), unit) if value == int(value) else ""
    return f"{value} ({human})" if human else str(value)


def _type_name(tp: Any) -> str:
    inner = optional_inner(tp)
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
    raise TypeError(f"describe config type {tp!r} in ha_controller/config/doc.py")


def _default(key: Key) -> str:
    if key.required:
        return "**required**"
    value = key.default
    if value is None:
        return "unset"
    if isinstance(value, int) and not isinstance(value, bool):
        return _number(value, key.unit)
    return f"`{toml_value(value)}`"


def _accepts(key: Key) -> str:
    """Bounds and format, as the loader checks them."""
    parts: list[str] = []
    if key.tp is int:
        if key.ge is not None and key.le is not None:
            parts.append(f"{_plain(key.ge, key.unit)} … {_plain(key.le, key.unit)}")
        elif key.ge is not None:
            parts.append(f"≥ {_plain(key.ge, key.unit)}")
        elif key.le is not None:
            parts.append(f"≤ {_plain(key.le, key.unit)}")
    if key.check is not None:
        parts.append(key.check.accepts)
    return "; ".join(parts)


def _description(key: Key) -> str:
    if not key.doc:
        raise KeyError(
            f"{key.owner.__name__}.{key.field} has no description: give its setting() a doc"
        )
    text = _clean(key.doc)
    if key.details:
        text += " (see below)"
    marks = []
    if key.secret:
        marks.append("**Secret**: never shown in logs or error messages.")
    if key.per_broker:
        marks.append("**Per broker** (see [broker containers](#broker-containers)).")
    return " ".join([text, *marks])


# --- rendering ------------------------------------------------------------------------------

HEADER = """\
<!-- Generated by `{command}` from ha_controller/config/; do not edit by hand. -->

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


def _key_table(keys: Sequence[tuple[str, Key]]) -> list[str]:
    """One row per ``(name as shown, key)``."""
    lines = [
        "| key | type | default | unit | accepts | environment | description |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, key in keys:
        cells = [
            f"`{name}`",
            _type_name(key.tp),
            _default(key),
            key.unit,
            _accepts(key),
            f"`{env_var_name(name)}`",
            _description(key),
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
    return [name for name in schema(cls).tables if "." not in name]


def _component(anchor: str, command: str, cls: type) -> list[str]:
    out = [f'<a id="{anchor}"></a>\n', f"## `{command}`\n", _class_doc(cls) + "\n"]
    lines: list[str] = []
    for section, keys in _sections(list(schema(cls).own_keys())):
        if section is not None:
            lines += ["", f"### {section}", ""]
        lines += _key_table([(key.name, key) for key in keys])
    tables = _tables_of(cls)
    if tables:
        links = " and ".join(f"[`[{t}]`](#{t})" for t in tables)
        lines += ["", f"Tables: {links}."]
    lines += _rules_table(cls)
    out.append("\n".join(lines).lstrip("\n") + "\n")
    return out


def _table(name: str, cls: type) -> list[str]:
    users = [f"`{cmd}`" for _, cmd, component in COMPONENTS if name in _tables_of(component)]
    keys = [(f"{name}.{key.name}", key) for key in schema(cls).keys.values()]
    out = [f'<a id="{name}"></a>\n', f"## `[{name}]`\n"]
    out.append(f"{_class_doc(cls)} Read by {' and '.join(users)}.\n")
    lines = _key_table(keys) + _rules_table(cls, prefix=f"{name}.")
    out.append("\n".join(lines) + "\n")
    detailed = [(shown, key) for shown, key in keys if key.details]
    if detailed:
        out.append(f"### How the `[{name}]` bounds work\n")
        seen: set[tuple[str, str]] = set()
        for _, key in detailed:
            text = (key.doc, key.details)
            if text in seen:
                continue
            seen.add(text)
            named = [shown for shown, k in detailed if (k.doc, k.details) == text]
            title = " and ".join(f"`{n}`" for n in named)
            out.append(f"**{title}**: {_clean(key.doc)} {_clean(key.details)}\n")
    return out


def render() -> str:
    """The whole of docs/configuration.md."""
    contents = [(f"`{cmd}`", anchor) for anchor, cmd, _ in COMPONENTS]
    contents += [(f"`[{name}]`", name) for name, _ in TABLES]
    contents.append(("broker containers", "broker-containers"))
    out = [HEADER.format(command=COMMAND, contents=_toc(contents))]
    for anchor, cmd, cls in COMPONENTS:
        out += _component(anchor, cmd, cls)
    for name, cls in TABLES:
        out += _table(name, cls)
    out.append(CONTAINER)
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ha_controller.config_doc",
        description="Write the configuration reference from ha_controller/config/.",
    )
    parser.add_argument("path", nargs="?", type=Path, default=DEFAULT_PATH)
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is stale")
    args = parser.parse_args(argv)
    return write_or_check(args.path, render(), check=args.check, command=COMMAND)


if __name__ == "__main__":
    sys.exit(main())
