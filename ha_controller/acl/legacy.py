"""The users file: RocketMQ's plain ACL (``plain_acl.yml``) in TOML, read into an
ACL 2.0 table at revision 0 (a node's bootstrap, :mod:`ha_controller.acl.model`).

The file has ``[[users]]`` tables with ``access_key``, ``secret_key``, ``admin``,
``default_topic_perm``, ``default_group_perm``, ``topic_perms`` and ``group_perms``
(a permission is ``DENY``, ``PUB``, ``SUB`` or ``PUB|SUB``; a group takes ``SUB`` or
``DENY``).  Each user becomes an ACL 2.0 user (``admin = true``: ``Super``) whose
entries mean exactly what the file said:

- ``default_topic_perm = "PUB|SUB"`` -> ``Allow Topic:* Pub,Sub`` (``DENY``: no entry;
  what no entry allows is refused);
- ``topic_perms = ["orders=SUB"]`` -> ``Allow Topic:orders Sub`` and, for what the
  permission leaves out, ``Deny Topic:orders Pub``, so a wider default does not reach
  it (RocketMQ's own migration leaves the default to apply there; we do not);
- groups alike with ``Sub``.

Once a runtime change exists (revision 1 and later, ``hactl user`` / ``hactl acl``)
the cluster's table replaces the file; the file stays the bootstrap of a new node.
"""

from __future__ import annotations

import enum
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ha_controller.acl.model import (
    AclInvalid,
    AclTable,
    Action,
    Decision,
    Pattern,
    PolicyEntry,
    Resource,
    ResourceType,
    User,
    UserType,
)
from ha_controller.protocol.errors import ConfigError

__all__ = ["Perm", "load_acl_file", "parse_acl", "parse_perm"]


class Perm(enum.IntFlag):
    """A users file's permission on a topic or a group (``DENY|PUB|SUB``)."""

    DENY = 0
    PUB = 1
    SUB = 2

    def text(self) -> str:
        if not self:
            return "DENY"
        return "|".join(p.name for p in (Perm.PUB, Perm.SUB) if p in self and p.name)

    def actions(self) -> frozenset[Action]:
        out = set()
        if Perm.PUB in self:
            out.add(Action.PUB)
        if Perm.SUB in self:
            out.add(Action.SUB)
        return frozenset(out)


def parse_perm(text: str) -> Perm:
    """``"PUB|SUB"``, ``"SUB"``, ``"DENY"`` ... (case-insensitive) -> :class:`Perm`."""
    perm = Perm.DENY
    words = [w.strip().upper() for w in text.split("|")]
    for word in words:
        if word == "DENY" and len(words) == 1:
            continue
        if word not in ("PUB", "SUB"):
            raise ValueError(f"{text!r} is not DENY, PUB, SUB or PUB|SUB")
        perm |= Perm[word]
    return perm


_USER_KEYS = frozenset(
    {
        "access_key",
        "secret_key",
        "admin",
        "default_topic_perm",
        "default_group_perm",
        "topic_perms",
        "group_perms",
    }
)


def _perm_list(where: str, value: object) -> dict[str, Perm]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f'{where}: expected a list of "NAME=PERM" strings')
    out: dict[str, Perm] = {}
    for item in value:
        name, sep, perm = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(
                f'{where}: {item!r} is not "NAME=PERM" (for example "orders=PUB|SUB")'
            )
        try:
            out[name.strip()] = parse_perm(perm)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return out


def _entries(
    rtype: ResourceType, default: Perm, named: Mapping[str, Perm], where: str
) -> list[PolicyEntry]:
    everything = (
        frozenset({Action.PUB, Action.SUB})
        if rtype is ResourceType.TOPIC
        else (frozenset({Action.SUB}))
    )
    out: list[PolicyEntry] = []
    if default:
        out.append(PolicyEntry(Resource(rtype, "", Pattern.ANY), default.actions()))
    for name, perm in named.items():
        try:
            resource = Resource.parse(f"{rtype.value}:{name}")
        except AclInvalid as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if resource.pattern is not Pattern.LITERAL:
            raise ConfigError(f"{where}: {name!r}: a users file names topics and groups literally")
        allowed = perm.actions() & everything
        if allowed:
            out.append(PolicyEntry(resource, allowed))
        if everything - allowed:
            out.append(PolicyEntry(resource, everything - allowed, Decision.DENY))
    return out


def _user(where: str, raw: object) -> tuple[User, list[PolicyEntry]]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a table ([[users]])")
    unknown = sorted(set(raw) - _USER_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: {sorted(_USER_KEYS)})")
    ak, sk = raw.get("access_key"), raw.get("secret_key")
    if not isinstance(ak, str) or not ak:
        raise ConfigError(f"{where}.access_key: expected a non-empty string")
    if not isinstance(sk, str) or len(sk) < 8:
        # the value itself is never shown: it is a secret
        raise ConfigError(f"{where}.secret_key: expected a string of at least 8 characters")
    admin = raw.get("admin", False)
    if not isinstance(admin, bool):
        raise ConfigError(f"{where}.admin: expected true or false")
    perms: dict[str, Perm] = {}
    for key in ("default_topic_perm", "default_group_perm"):
        text = raw.get(key, "DENY")
        if not isinstance(text, str):
            raise ConfigError(f"{where}.{key}: expected DENY, PUB, SUB or PUB|SUB")
        try:
            perms[key] = parse_perm(text)
        except ValueError as exc:
            raise ConfigError(f"{where}.{key}: {exc}") from None
    if perms["default_group_perm"] & Perm.PUB:
        raise ConfigError(f"{where}.default_group_perm: a group takes SUB or DENY, not PUB")
    groups = _perm_list(f"{where}.group_perms", raw.get("group_perms", []))
    for group, perm in groups.items():
        if perm & Perm.PUB:
            raise ConfigError(f"{where}.group_perms: a group takes SUB or DENY, not PUB ({group})")
    topics = _perm_list(f"{where}.topic_perms", raw.get("topic_perms", []))
    try:
        user = User(ak, sk, UserType.SUPER if admin else UserType.NORMAL)
    except AclInvalid as exc:
        raise ConfigError(f"{where}.access_key: {exc}") from None
    entries = [
        *_entries(ResourceType.TOPIC, perms["default_topic_perm"], topics, f"{where}.topic_perms"),
        *_entries(ResourceType.GROUP, perms["default_group_perm"], groups, f"{where}.group_perms"),
    ]
    return user, ([] if admin else entries)


def parse_acl(table: Mapping[str, Any], where: str = "acl file") -> AclTable:
    """The table (revision 0) of an ACL file's contents."""
    unknown = sorted(set(table) - {"users"})
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; users go in [[users]] tables")
    raw_users = table.get("users", [])
    if not isinstance(raw_users, list):
        raise ConfigError(f"{where}: users must be [[users]] tables")
    users: dict[str, User] = {}
    acls: dict[str, tuple[PolicyEntry, ...]] = {}
    for i, raw in enumerate(raw_users):
        user, entries = _user(f"{where}: users[{i}]", raw)
        if user.username in users:
            raise ConfigError(f"{where}: users[{i}]: access key {user.username!r} appears twice")
        users[user.username] = user
        if entries:
            acls[user.username] = tuple(entries)
    table_ = AclTable(0, users, acls)
    try:
        table_.check()
    except AclInvalid as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return table_


def load_acl_file(path: str | Path) -> AclTable:
    """Read and check an ACL file (TOML, ``[[users]]`` tables); one ``ConfigError``
    naming the file and the key on any problem (never a secret's value)."""
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"acl.file: cannot read {str(path)!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"acl.file: {str(path)!r} is not valid TOML: {exc}") from None
    return parse_acl(table, f"acl file {str(path)!r}")
