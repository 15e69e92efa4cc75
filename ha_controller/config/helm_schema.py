"""Write the ``config`` definitions of the Helm chart's ``values.schema.json``.

    .venv/bin/python -m ha_controller.config.helm_schema           # rewrite the file
    .venv/bin/python -m ha_controller.config.helm_schema --check   # exit 1 when stale

A values ``config`` map (``broker.config``, ``groups[].config``, ``nameserver.config``)
may hold any key of its component, with the loader's types and bounds, so that helm
refuses a typo or a bad value at install time instead of the pod at start.  Only the
definitions ``brokerConfig`` and ``nameserverConfig`` are written; the rest of the file
is the chart's own.
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from ha_controller.config.broker import BrokerConfig
from ha_controller.config.generated import write_or_check
from ha_controller.config.nameserver import NameserverConfig
from ha_controller.config.schema import Key, schema
from ha_controller.config.values import optional_inner

__all__ = ["COMMAND", "DEFAULT_PATH", "DEFINITIONS", "main", "render"]

COMMAND = ".venv/bin/python -m ha_controller.config.helm_schema"
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "helm" / "ha-controller" / "values.schema.json"

#: values.schema.json definition -> config class whose keys a values `config` map may hold.
DEFINITIONS: dict[str, type] = {
    "brokerConfig": BrokerConfig,
    "nameserverConfig": NameserverConfig,
}


def _value(key: Key) -> dict[str, Any]:
    tp = optional_inner(key.tp) or key.tp  # TOML has no null: unset = leave it out
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        out: dict[str, Any] = {"type": "integer"}
        if key.ge is not None:
            out["minimum"] = key.ge
        if key.le is not None:
            out["maximum"] = key.le
        return out
    if tp is float:
        return {"type": "number"}  # ratios: their checks bound them at load
    if tp is str:
        return {"type": "string"}
    origin = typing.get_origin(tp)
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin is tuple:
        # a list of strings, or one comma-separated string (as the loader takes it)
        return {"type": ["array", "string"], "items": {"type": "string"}}
    raise TypeError(f"no schema for config type {tp!r} ({key.name})")


def _object() -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": {}}


def definition(cls: type) -> dict[str, Any]:
    """The JSON schema of a component's TOML table, nested tables as objects."""
    out = {
        "$comment": (
            f"Generated from ha_controller.config.{cls.__name__} by "
            "python -m ha_controller.config.helm_schema; "
            "keys the chart sets itself are refused by its templates (ha-controller.ownedKeys)"
        ),
        **_object(),
    }
    for key in schema(cls).keys.values():
        *tables, leaf = key.name.split(".")
        node = out
        for table in tables:
            node = node["properties"].setdefault(table, _object())
        node["properties"][leaf] = _value(key)
    return out


def render(current: str) -> str:
    """The file ``current`` with its config definitions regenerated."""
    document = json.loads(current)
    document["definitions"] = {
        **document.get("definitions", {}),
        **{name: definition(cls) for name, cls in DEFINITIONS.items()},
    }
    return json.dumps(document, indent=2) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ha_controller.config.helm_schema",
        description="Write the config definitions of the chart's values.schema.json.",
    )
    parser.add_argument("path", nargs="?", type=Path, default=DEFAULT_PATH)
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is stale")
    args = parser.parse_args(argv)
    path: Path = args.path
    text = render(path.read_text(encoding="utf-8"))
    return write_or_check(path, text, check=args.check, command=COMMAND)


if __name__ == "__main__":
    sys.exit(main())
