"""What a setting is: :func:`setting` declares one, :func:`schema` lists a component's.

Every key is one dataclass field declared with :func:`setting`; its metadata holds all
there is to know about it (description, bounds, format check, flag alias, whether it is
secret or set per broker).  :func:`schema` walks a config class once and gives every
key, nested tables dotted (``tls.cert_file``), with its environment variable and
flags; the loader, the configuration reference (:mod:`ha_controller.config.doc`) and the
Helm values schema (:mod:`ha_controller.config.helm_schema`) all read it.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

__all__ = [
    "ENV_PREFIX",
    "GIB",
    "KIB",
    "MIB",
    "Check",
    "Key",
    "Schema",
    "config_keys",
    "env_var_name",
    "is_table",
    "schema",
    "setting",
    "unit",
]

ENV_PREFIX = "HAC_"
KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

_T = TypeVar("_T")


@dataclass(frozen=True)
class Check:
    """A key's format check: ``problem(value)`` is None or what is wrong with it."""

    accepts: str  # Markdown, for the reference's "accepts" column: what passes
    problem: Callable[[Any], str | None]

    def __call__(self, value: Any) -> str | None:
        return self.problem(value)


@overload
def setting(
    default: _T,
    *,
    doc: str,
    details: str | None = None,
    section: str | None = None,
    ge: float | None = None,
    le: float | None = None,
    check: Check | None = None,
    flag: str | None = None,
    per_broker: bool = False,
    secret: bool = False,
) -> _T: ...


@overload
def setting(
    *,
    doc: str,
    details: str | None = None,
    section: str | None = None,
    ge: float | None = None,
    le: float | None = None,
    check: Check | None = None,
    flag: str | None = None,
    per_broker: bool = False,
    secret: bool = False,
) -> Any: ...


def setting(
    default: object = dataclasses.MISSING,
    *,
    doc: str,
    details: str | None = None,
    section: str | None = None,
    ge: float | None = None,
    le: float | None = None,
    check: Check | None = None,
    flag: str | None = None,
    per_broker: bool = False,
    secret: bool = False,
) -> Any:
    """One configuration key: a dataclass field with its default (none = required).

    ``doc`` is the key's description in docs/configuration.md (Markdown, one paragraph);
    ``details`` a longer explanation shown below the table (the row then says "see
    below").  ``section`` starts a titled group of keys in the reference, lasting to the
    next key that names one.  ``ge``/``le`` bound a number (a duration or size, by its
    ``_ms``/``_s``/``_bytes`` name, is at least 1 unless ``ge`` says otherwise);
    ``check`` checks its format; ``flag`` is a second flag name besides the key's own;
    ``per_broker`` keys identify one broker of a container (never from env or flags
    there); ``secret`` keys are left out of ``repr`` and error messages.
    """
    options = {
        "doc": doc,
        "details": details,
        "section": section,
        "ge": ge,
        "le": le,
        "check": check,
        "flag": flag,
        "per_broker": per_broker,
        "secret": secret,
    }
    metadata = {k: v for k, v in options.items() if v is not None and v is not False}
    if default is dataclasses.MISSING:
        return field(repr=not secret, metadata=metadata)
    return field(default=default, repr=not secret, metadata=metadata)


def unit(name: str) -> str:
    """The unit in a key's name: ``"ms"``, ``"s"``, ``"bytes"`` or ``""``."""
    for suffix, word in (("_ms", "ms"), ("_s", "s"), ("_bytes", "bytes")):
        if name.endswith(suffix):
            return word
    return ""


def is_table(tp: Any) -> bool:
    """Is ``tp`` a nested table (``[tls]``): a dataclass rather than a value type?"""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def env_var_name(key: str) -> str:
    """``"tls.cert_file"`` -> ``"HAC_TLS_CERT_FILE"``."""
    return ENV_PREFIX + key.replace(".", "_").upper()


@dataclass(frozen=True)
class Key:
    """One settable key of a component, as :func:`setting` declared it."""

    name: str  # dotted from the component: "tls.cert_file"
    owner: type  # the class declaring the field
    tp: Any  # its type: bool, int, float, str, X | None, tuple[str, ...], Literal[...]
    default: object  # dataclasses.MISSING when required
    doc: str
    details: str
    section: str | None
    ge: float | None  # the bound the loader enforces (a unit in the name implies >= 1)
    le: float | None
    check: Check | None
    flag: str | None
    per_broker: bool
    secret: bool

    @property
    def field(self) -> str:
        """The field's name in its class: ``"cert_file"``."""
        return self.name.rsplit(".", 1)[-1]

    @property
    def env(self) -> str:
        return env_var_name(self.name)

    @property
    def flags(self) -> tuple[str, ...]:
        """Keys of a parsed-flags mapping that set it: ``("tls_cert_file", "tls_cert")``."""
        flat = self.name.replace(".", "_")
        return (flat,) if self.flag is None else (flat, self.flag)

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING

    @property
    def unit(self) -> str:
        return unit(self.name)


@dataclass(frozen=True)
class Schema:
    """The keys and tables of one config class, in field order."""

    fields: tuple[str, ...]  # the class's own fields (keys and tables)
    keys: Mapping[str, Key]  # every key, nested ones dotted
    tables: Mapping[str, type]  # "tls" -> TlsConfig (nested ones dotted)

    def own_keys(self) -> Iterator[Key]:
        """The class's own keys (not those of its tables)."""
        return (key for name, key in self.keys.items() if "." not in name)


# Plain dicts rather than functools.cache: mypy cannot see that classes are hashable.
_SCHEMAS: dict[type, Schema] = {}


def schema(cls: type) -> Schema:
    """Every key of ``cls`` (a config class), read from its fields once and cached."""
    cached = _SCHEMAS.get(cls)
    if cached is not None:
        return cached
    keys: dict[str, Key] = {}
    tables: dict[str, type] = {}

    def walk(c: type, prefix: str) -> tuple[str, ...]:
        hints = typing.get_type_hints(c)
        own: list[str] = []
        section: str | None = None
        for f in dataclasses.fields(c):
            if not f.init:
                continue
            own.append(f.name)
            name, tp, meta = prefix + f.name, hints[f.name], f.metadata
            if is_table(tp):
                tables[name] = tp
                walk(tp, name + ".")
                continue
            section = meta.get("section", section)
            default: object = f.default
            if f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            keys[name] = Key(
                name=name,
                owner=c,
                tp=tp,
                default=default,
                doc=meta.get("doc", ""),
                details=meta.get("details", ""),
                section=section,
                # A duration or size of zero or less is never meaningful.
                ge=meta.get("ge", 1 if unit(f.name) else None),
                le=meta.get("le"),
                check=meta.get("check"),
                flag=meta.get("flag"),
                per_broker=bool(meta.get("per_broker")),
                secret=bool(meta.get("secret")),
            )
        return tuple(own)

    fields = walk(cls, "")
    result = _SCHEMAS[cls] = Schema(fields, keys, tables)
    return result


def config_keys(cls: type) -> tuple[str, ...]:
    """Every settable key of a component, nested ones dotted (``tls.cert_file``)."""
    return tuple(schema(cls).keys)
