"""The ACL 2.0 model: users, resources, actions and policy entries, and the table that
holds them (RocketMQ 5.3's authentication and authorization metadata).

- A **user** has a username (the access key), a password (the secret key), a type
  (``Super``: every request is allowed; ``Normal``: its ACL decides) and a status
  (``enable`` / ``disable``: a disabled user is refused everything).
- A **resource** is ``Cluster:<name>``, ``Topic:<name>``, ``Group:<name>`` or ``*``,
  matched LITERAL (``Topic:orders``), PREFIXED (``Topic:orders-*``) or ANY
  (``Topic:*``).
- A **policy entry** of a user names a resource, actions (``Pub``, ``Sub``,
  ``Create``, ``Update``, ``Delete``, ``Get``, ``List``, ``All``), optional source IP
  ranges and a decision (``Allow`` / ``Deny``).

A request needs one of some actions on each of some resources
(:mod:`ha_controller.acl.rules`).  For one action on one resource, the entries of the
user that match the resource, cover the action and admit the source IP are found;
none is a refusal; otherwise the most specific one decides (a literal name before a
longer prefix before a shorter prefix before ``Type:*`` before ``*``), and among
equally specific ones a Deny wins -- RocketMQ's order, so a ``Deny Topic:*`` with an
``Allow Topic:orders`` allows ``orders`` and nothing else.  A request that needs one
of several actions (a route lookup: Pub, Sub or Get) is allowed when one of them is.

A user holds at most one Allow and one Deny entry per resource (RocketMQ keeps one
entry per resource; the second lets ``Allow Topic:orders Sub`` stand beside ``Deny
Topic:orders Pub``, which is what a users file's ``orders=SUB`` meant).

:class:`AclTable` is immutable: every change (:meth:`AclTable.create_user` ...) is a
new table whose ``revision`` is one higher.  Tables are compared by
``(revision, digest)``: a higher revision wins, and two different tables of one
revision (two admins at once) are settled the same way everywhere by their digest.
Revision 0 is a node's bootstrap from its own users file and never travels.

Sans-IO: parsing, validation, matching and changes only.  Every refusal of bad input
is :class:`AclInvalid` (a ``BadRequest``) whose message names the problem.
"""

from __future__ import annotations

import enum
import hashlib
import ipaddress
import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Final

from ha_controller.protocol.errors import BadRequest

__all__ = [
    "Action",
    "AclInvalid",
    "AclTable",
    "Decision",
    "Pattern",
    "PolicyEntry",
    "Resource",
    "ResourceType",
    "User",
    "UserStatus",
    "UserType",
    "parse_actions",
    "parse_source_ips",
    "subject_of",
]

#: the most entries one user's ACL may hold, and the most users (bounded tables)
MAX_ENTRIES_PER_USER: Final = 1000
MAX_USERS: Final = 10_000
MAX_ENTRIES: Final = 100_000
MAX_SOURCE_IPS: Final = 64
USERNAME_MAX_LEN: Final = 128
PASSWORD_MIN_LEN: Final = 8
PASSWORD_MAX_LEN: Final = 1024
_USERNAME_RE: Final = re.compile(r"[A-Za-z0-9_.@+=-]+", re.ASCII)
#: names of resources: RocketMQ's topic and group characters
_RESOURCE_NAME_RE: Final = re.compile(r"[%|a-zA-Z0-9_-]+", re.ASCII)
RESOURCE_NAME_MAX_LEN: Final = 255


class AclInvalid(BadRequest):
    """A user, ACL entry or table that is not well formed; nothing was changed."""


class _Named(enum.Enum):
    """An enum whose value is the name users write (case-insensitive on input)."""

    @classmethod
    def parse(cls, text: str, what: str) -> Any:
        folded = text.strip().lower()
        for member in cls:
            if member.value.lower() == folded:
                return member
        known = ", ".join(m.value for m in cls)
        raise AclInvalid(f"unknown {what} {text[:64]!r} (known: {known})")


class Action(_Named):
    PUB = "Pub"
    SUB = "Sub"
    CREATE = "Create"
    UPDATE = "Update"
    DELETE = "Delete"
    GET = "Get"
    LIST = "List"
    ALL = "All"


class Decision(_Named):
    ALLOW = "Allow"
    DENY = "Deny"


class UserType(_Named):
    SUPER = "Super"
    NORMAL = "Normal"


class UserStatus(_Named):
    ENABLE = "enable"
    DISABLE = "disable"


class ResourceType(_Named):
    CLUSTER = "Cluster"
    TOPIC = "Topic"
    GROUP = "Group"
    #: only as ``*``: every resource of every type
    ANY = "Any"


class Pattern(enum.Enum):
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"
    ANY = "ANY"


_TYPE_OF_NAME: Final = {t.value.lower(): t for t in ResourceType if t is not ResourceType.ANY}


@dataclass(frozen=True, slots=True)
class Resource:
    """``Topic:orders`` (LITERAL), ``Topic:orders-*`` (PREFIXED), ``Topic:*`` (ANY) or
    ``*`` (type ANY).  A request's resource is always LITERAL."""

    type: ResourceType
    name: str = ""
    pattern: Pattern = Pattern.LITERAL

    @classmethod
    def topic(cls, name: str) -> Resource:
        return cls(ResourceType.TOPIC, name)

    @classmethod
    def group(cls, name: str) -> Resource:
        return cls(ResourceType.GROUP, name)

    @classmethod
    def cluster(cls, name: str) -> Resource:
        return cls(ResourceType.CLUSTER, name)

    @classmethod
    def parse(cls, text: str) -> Resource:
        """A resource as users write it; ``AclInvalid`` naming what is wrong."""
        raw = text.strip()
        if raw == "*":
            return cls(ResourceType.ANY, "", Pattern.ANY)
        kind, sep, name = raw.partition(":")
        if not sep:
            raise AclInvalid(
                f"resource {raw[:128]!r} is not TYPE:NAME (Topic:orders, Group:billing-*, "
                "Cluster:DefaultCluster, Topic:*) or *"
            )
        rtype = _TYPE_OF_NAME.get(kind.strip().lower())
        if rtype is None:
            raise AclInvalid(
                f"resource {raw[:128]!r}: unknown type {kind[:32]!r} (known: Cluster, Topic, Group)"
            )
        name = name.strip()
        if name == "*":
            return cls(rtype, "", Pattern.ANY)
        pattern = Pattern.LITERAL
        if name.endswith("*"):
            name = name[:-1]
            pattern = Pattern.PREFIXED
        if not name:
            raise AclInvalid(f"resource {raw[:128]!r} has an empty name")
        if "*" in name:
            raise AclInvalid(
                f"resource {raw[:128]!r}: '*' may only end a name (a prefix) or stand alone"
            )
        if len(name) > RESOURCE_NAME_MAX_LEN or _RESOURCE_NAME_RE.fullmatch(name) is None:
            raise AclInvalid(
                f"resource {raw[:128]!r}: a name is 1..{RESOURCE_NAME_MAX_LEN} characters of "
                "[%|a-zA-Z0-9_-]"
            )
        return cls(rtype, name, pattern)

    def key(self) -> str:
        if self.type is ResourceType.ANY:
            return "*"
        if self.pattern is Pattern.ANY:
            return f"{self.type.value}:*"
        suffix = "*" if self.pattern is Pattern.PREFIXED else ""
        return f"{self.type.value}:{self.name}{suffix}"

    def __str__(self) -> str:
        return self.key()

    def matches(self, target: Resource) -> bool:
        """Whether this (an entry's) resource covers ``target`` (a request's)."""
        if self.type is ResourceType.ANY:
            return True
        if self.type is not target.type:
            return False
        if self.pattern is Pattern.ANY:
            return True
        if self.pattern is Pattern.PREFIXED:
            return target.name.startswith(self.name)
        return target.name == self.name

    def rank(self) -> tuple[int, int, int]:
        """Smaller is more specific: literal, longer prefix, shorter prefix, Type:*, *."""
        if self.type is ResourceType.ANY:
            return (1, 0, 0)
        order = {Pattern.LITERAL: 0, Pattern.PREFIXED: 1, Pattern.ANY: 2}[self.pattern]
        return (0, order, -len(self.name))


IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_actions(texts: Iterable[str]) -> frozenset[Action]:
    actions = frozenset(Action.parse(t, "action") for t in texts if t.strip())
    if not actions:
        raise AclInvalid("an ACL entry needs at least one action (Pub, Sub, ..., All)")
    return actions


def parse_source_ips(texts: Iterable[str]) -> tuple[IpNetwork, ...]:
    """CIDR ranges or single addresses (``10.0.0.0/8``, ``192.168.1.5``, ``::1``)."""
    out: list[IpNetwork] = []
    for text in texts:
        t = text.strip()
        if not t:
            continue
        try:
            out.append(ipaddress.ip_network(t, strict=False))
        except ValueError:
            raise AclInvalid(
                f"source IP {t[:64]!r} is not an address or a CIDR range (10.0.0.0/8)"
            ) from None
    if len(out) > MAX_SOURCE_IPS:
        raise AclInvalid(f"an ACL entry takes at most {MAX_SOURCE_IPS} source IP ranges")
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True, slots=True)
class PolicyEntry:
    resource: Resource
    actions: frozenset[Action]
    decision: Decision = Decision.ALLOW
    source_ips: tuple[IpNetwork, ...] = ()

    def covers(self, actions: frozenset[Action]) -> bool:
        return Action.ALL in self.actions or not self.actions.isdisjoint(actions)

    def admits(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
        """Whether the source condition holds (no ranges: any source)."""
        if not self.source_ips:
            return True
        if ip is None:
            return False
        return any(ip in net for net in self.source_ips if net.version == ip.version)

    def sort_key(self) -> tuple[tuple[int, int, int], int]:
        return (self.resource.rank(), 0 if self.decision is Decision.DENY else 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "resource": self.resource.key(),
            "actions": sorted(a.value for a in self.actions),
            "decision": self.decision.value,
            "source_ips": [str(n) for n in self.source_ips],
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PolicyEntry:
        if not isinstance(raw, Mapping):
            raise AclInvalid("an ACL entry must be a table")
        actions = raw.get("actions", [])
        ips = raw.get("source_ips", [])
        if isinstance(actions, str):
            actions = actions.split(",")
        if isinstance(ips, str):
            ips = ips.split(",")
        if not isinstance(actions, list | tuple) or not isinstance(ips, list | tuple):
            raise AclInvalid("an ACL entry's actions and source_ips are lists of strings")
        return cls(
            Resource.parse(str(raw.get("resource", ""))),
            parse_actions(str(a) for a in actions),
            Decision.parse(str(raw.get("decision", "Allow")), "decision"),
            parse_source_ips(str(i) for i in ips),
        )


def _check_username(name: str) -> str:
    if not name or len(name) > USERNAME_MAX_LEN or _USERNAME_RE.fullmatch(name) is None:
        raise AclInvalid(
            f"username {name[:64]!r}: 1..{USERNAME_MAX_LEN} characters of [A-Za-z0-9_.@+=-]"
        )
    return name


def _check_password(password: str) -> str:
    if not PASSWORD_MIN_LEN <= len(password) <= PASSWORD_MAX_LEN:
        # the value itself is never shown: it is a secret
        raise AclInvalid(
            f"a password (secret key) has {PASSWORD_MIN_LEN}..{PASSWORD_MAX_LEN} characters"
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in password):
        raise AclInvalid("a password (secret key) must not contain control characters")
    return password


def subject_of(text: str) -> str:
    """The username of a subject (``User:alice`` or ``alice``)."""
    t = text.strip()
    kind, sep, name = t.partition(":")
    if sep:
        if kind.strip().lower() != "user":
            raise AclInvalid(f"subject {t[:128]!r}: only User:<name> subjects exist")
        t = name.strip()
    return _check_username(t)


@dataclass(frozen=True, slots=True)
class User:
    username: str
    password: str = field(repr=False)
    user_type: UserType = UserType.NORMAL
    status: UserStatus = UserStatus.ENABLE

    def __post_init__(self) -> None:
        _check_username(self.username)
        _check_password(self.password)

    @property
    def is_super(self) -> bool:
        return self.user_type is UserType.SUPER

    @property
    def enabled(self) -> bool:
        return self.status is UserStatus.ENABLE

    def to_dict(self, *, secrets: bool = True) -> dict[str, Any]:
        out = {
            "username": self.username,
            "user_type": self.user_type.value,
            "user_status": self.status.value,
        }
        if secrets:
            out["password"] = self.password
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> User:
        if not isinstance(raw, Mapping):
            raise AclInvalid("a user must be a table")
        return cls(
            _check_username(str(raw.get("username", ""))),
            str(raw.get("password", "")),
            UserType.parse(str(raw.get("user_type", "Normal")), "user type"),
            UserStatus.parse(str(raw.get("user_status", "enable")), "user status"),
        )


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class AclTable:
    """Users and their policy entries, at a revision.  Immutable."""

    revision: int = 0
    users: Mapping[str, User] = field(default_factory=dict)
    acls: Mapping[str, tuple[PolicyEntry, ...]] = field(default_factory=dict)
    updated_ms: int = 0

    # ---- identity ------------------------------------------------------------------

    @cached_property
    def digest(self) -> str:
        """A fingerprint of the content (users with their secrets, entries)."""
        body = json.dumps(self._content(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()[:32]

    def key(self) -> tuple[int, str]:
        return (self.revision, self.digest)

    def newer_than(self, other: AclTable | tuple[int, str]) -> bool:
        theirs = other.key() if isinstance(other, AclTable) else other
        return self.key() > theirs

    def _content(self) -> dict[str, Any]:
        return {
            "users": [self.users[u].to_dict() for u in sorted(self.users)],
            "acls": {
                s: sorted((e.to_dict() for e in self.acls[s]), key=_entry_order)
                for s in sorted(self.acls)
                if self.acls[s]
            },
        }

    # ---- serialisation -------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "updated_ms": self.updated_ms,
            "digest": self.digest,
            **self._content(),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, check_digest: bool = True) -> AclTable:
        """A table from :meth:`to_dict`'s shape; ``AclInvalid`` on any problem, also
        when the stored digest does not match the content (a damaged copy)."""
        if not isinstance(raw, Mapping):
            raise AclInvalid("an ACL table must be a JSON object")
        revision = raw.get("revision", 0)
        if not isinstance(revision, int) or revision < 0:
            raise AclInvalid("an ACL table's revision is a non-negative integer")
        raw_users = raw.get("users", [])
        raw_acls = raw.get("acls", {})
        if not isinstance(raw_users, list) or not isinstance(raw_acls, Mapping):
            raise AclInvalid("an ACL table has a list of users and a table of acls")
        users: dict[str, User] = {}
        for item in raw_users:
            user = User.from_dict(item)
            if user.username in users:
                raise AclInvalid(f"user {user.username!r} appears twice")
            users[user.username] = user
        acls: dict[str, tuple[PolicyEntry, ...]] = {}
        for subject, entries in raw_acls.items():
            name = subject_of(str(subject))
            if not isinstance(entries, list):
                raise AclInvalid(f"the ACL of {name!r} must be a list of entries")
            acls[name] = _merged((), (PolicyEntry.from_dict(e) for e in entries))
        updated = raw.get("updated_ms", 0)
        table = cls(revision, users, acls, updated if isinstance(updated, int) else 0)
        table.check()
        stored = raw.get("digest")
        if check_digest and stored is not None and stored != table.digest:
            raise AclInvalid("the ACL table's digest does not match its content (damaged)")
        return table

    def check(self) -> None:
        """Cross-entry rules: every ACL belongs to a user; bounded sizes."""
        if len(self.users) > MAX_USERS:
            raise AclInvalid(f"an ACL table holds at most {MAX_USERS} users")
        if sum(len(e) for e in self.acls.values()) > MAX_ENTRIES:
            raise AclInvalid(f"an ACL table holds at most {MAX_ENTRIES} entries")
        for subject, entries in self.acls.items():
            if subject not in self.users:
                raise AclInvalid(f"the ACL of {subject!r} names a user that does not exist")
            if len(entries) > MAX_ENTRIES_PER_USER:
                raise AclInvalid(
                    f"user {subject!r} has more than {MAX_ENTRIES_PER_USER} ACL entries"
                )

    # ---- what a request is matched against -----------------------------------------

    def entries_of(self, username: str) -> tuple[PolicyEntry, ...]:
        return self.acls.get(username, ())

    # ---- changes (each returns the next revision) -----------------------------------

    def _next(
        self,
        users: Mapping[str, User] | None = None,
        acls: Mapping[str, tuple[PolicyEntry, ...]] | None = None,
        *,
        now_ms: int | None = None,
    ) -> AclTable:
        table = replace(
            self,
            revision=self.revision + 1,
            users=dict(self.users if users is None else users),
            acls={s: e for s, e in (self.acls if acls is None else acls).items() if e},
            updated_ms=_now_ms() if now_ms is None else now_ms,
        )
        table.check()
        return table

    def create_user(self, user: User, *, now_ms: int | None = None) -> AclTable:
        if user.username in self.users:
            raise AclInvalid(f"user {user.username!r} exists already (update it instead)")
        return self._next({**self.users, user.username: user}, now_ms=now_ms)

    def update_user(
        self,
        username: str,
        *,
        password: str | None = None,
        user_type: UserType | None = None,
        status: UserStatus | None = None,
        now_ms: int | None = None,
    ) -> AclTable:
        old = self._user(username)
        new = replace(
            old,
            password=old.password if password is None else password,
            user_type=old.user_type if user_type is None else user_type,
            status=old.status if status is None else status,
        )
        if new == old:
            raise AclInvalid(f"update of user {username!r} changes nothing")
        return self._next({**self.users, username: new}, now_ms=now_ms)

    def delete_user(self, username: str, *, now_ms: int | None = None) -> AclTable:
        self._user(username)
        users = {k: v for k, v in self.users.items() if k != username}
        acls = {k: v for k, v in self.acls.items() if k != username}
        return self._next(users, acls, now_ms=now_ms)

    def create_acl(
        self, username: str, entries: Iterable[PolicyEntry], *, now_ms: int | None = None
    ) -> AclTable:
        """Add entries (an entry for a resource and decision the user has already
        replaces that one's actions and sources, as RocketMQ's createAcl does)."""
        self._user(username)
        merged = _merged(self.acls.get(username, ()), entries)
        return self._next(acls={**self.acls, username: merged}, now_ms=now_ms)

    def update_acl(
        self, username: str, entries: Iterable[PolicyEntry], *, now_ms: int | None = None
    ) -> AclTable:
        """Replace all entries of each resource named with the ones given; a resource
        the user has no entry for is refused (create it instead)."""
        self._user(username)
        entries = list(entries)
        old = self.acls.get(username, ())
        have = {e.resource for e in old}
        missing = sorted({e.resource.key() for e in entries if e.resource not in have})
        if missing:
            raise AclInvalid(
                f"user {username!r} has no ACL entry for {', '.join(missing)} (create it first)"
            )
        named = {e.resource for e in entries}
        kept = [e for e in old if e.resource not in named]
        merged = _merged(kept, entries)
        return self._next(acls={**self.acls, username: merged}, now_ms=now_ms)

    def delete_acl(
        self, username: str, resource: Resource | None = None, *, now_ms: int | None = None
    ) -> AclTable:
        """Drop the user's entry for ``resource``, or all its entries."""
        self._user(username)
        old = self.acls.get(username, ())
        if resource is None:
            if not old:
                raise AclInvalid(f"user {username!r} has no ACL entries")
            kept: tuple[PolicyEntry, ...] = ()
        else:
            kept = tuple(e for e in old if e.resource != resource)
            if len(kept) == len(old):
                raise AclInvalid(f"user {username!r} has no ACL entry for {resource.key()}")
        return self._next(acls={**self.acls, username: kept}, now_ms=now_ms)

    def replace_all(self, other: AclTable, *, now_ms: int | None = None) -> AclTable:
        """Another table's users and entries at the next revision (an import)."""
        return self._next(other.users, other.acls, now_ms=now_ms)

    def _user(self, username: str) -> User:
        user = self.users.get(username)
        if user is None:
            raise AclInvalid(f"user {username!r} does not exist")
        return user


def _entry_order(d: Mapping[str, Any]) -> tuple[str, str]:
    return (str(d["resource"]), str(d["decision"]))


def _merged(old: Iterable[PolicyEntry], new: Iterable[PolicyEntry]) -> tuple[PolicyEntry, ...]:
    """``old`` with ``new`` put in: one entry per resource and decision, the later one
    winning."""
    by_key: dict[tuple[Resource, Decision], PolicyEntry] = {
        (e.resource, e.decision): e for e in old
    }
    for e in new:
        by_key[(e.resource, e.decision)] = e
    return tuple(sorted(by_key.values(), key=lambda e: (e.resource.key(), e.decision.value)))
