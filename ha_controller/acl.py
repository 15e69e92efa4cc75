"""Client ACL: users with an access key and a secret key, signed client requests,
permissions on topics and consumer groups, and an admin role.

The model is RocketMQ's plain ACL (``plain_acl.yml``: ``accessKey``, ``secretKey``,
``admin``, ``defaultTopicPerm``, ``defaultGroupPerm``, ``topicPerms``, ``groupPerms``)
in a TOML file that the ``[acl]`` table of every service points to
(:func:`load_acl_file`).  A permission is ``DENY``, ``PUB``, ``SUB`` or ``PUB|SUB``;
``admin = true`` allows everything, including the admin requests (topic create,
update and delete, broker registration, the cluster's own metadata pulls and every
request code not in :data:`RULES`).

A client signs every request with its :class:`Credentials`: ``RequestBody.authInfo``
carries the access key, a timestamp, a nonce and an HMAC-SHA256 (keyed with a key
derived from the secret key) over the method, timestamp, nonce and the whole request
body, made by :func:`ha_controller.auth.request_mac`, the same code that signs the
cluster's control plane.  A receiver (:meth:`Acl.check`, part of the dispatcher's
guard, :func:`guard`) refuses, with :class:`AccessDenied` naming what is missing,
before the handler runs and so before anything changes:

* a request signed by an unknown access key, with a bad signature, or more than
  :data:`MAX_SKEW_MS` off its clock (reasons ``unknown_user``, ``bad_signature``,
  ``stale``); client requests are not kept in a replay cache (see docs/security.md);
* an unsigned request when ``allow_anonymous`` is false (``anonymous``); with
  ``allow_anonymous`` true an unsigned request is served as without an ACL;
* a signed request whose user lacks the permission (``no_permission``).

A request signed with the cluster secret (a cluster member's, ``ctx.authenticated``)
is always allowed.  Every refusal is counted (``on_denied(code, reason)``; the
services' ``hac_acl_denied_total``) and logged at most once per client address per
:data:`LOG_INTERVAL_S`.

Group names are checked here too, for every request that names one (with or without
an ACL): a bad name is refused ``BadRequest`` before any handler stores it.

No I/O besides reading the ACL file; the clock is injectable.
"""

from __future__ import annotations

import enum
import hmac
import logging
import secrets
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError, Message

from ha_controller.auth import ClusterAuth, derive_key, request_mac, wall_ms
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode, method_name
from ha_controller.protocol.envelope import RequestAuth
from ha_controller.protocol.errors import AccessDenied, BadRequest, ConfigError
from ha_controller.protocol.properties import RETRY_PREFIX
from ha_controller.protocol.topics import group_name_problem

if TYPE_CHECKING:
    from ha_controller.rpc.connection import Guard, RequestContext

log = logging.getLogger(__name__)

__all__ = [
    "DENY_REASONS",
    "Acl",
    "AclUser",
    "Credentials",
    "Need",
    "Perm",
    "guard",
    "load_acl_file",
    "need_of",
]

#: How far a signed client request's timestamp may be from the receiver's clock.
MAX_SKEW_MS = 30_000
LOG_INTERVAL_S = 10.0
#: client addresses whose last log line is remembered (oldest forgotten first)
MAX_LOGGED_PEERS = 4096
#: Refusal reasons of ``hac_acl_denied_total``.
DENY_REASONS = ("anonymous", "unknown_user", "bad_signature", "stale", "no_permission")


class Perm(enum.IntFlag):
    """A user's permission on a topic or a group (RocketMQ's ``DENY|PUB|SUB``)."""

    DENY = 0
    PUB = 1
    SUB = 2

    def text(self) -> str:
        if not self:
            return "DENY"
        return "|".join(p.name for p in (Perm.PUB, Perm.SUB) if p in self and p.name)


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


def _secret_key(secret: str) -> bytes:
    return derive_key(secret, b"acl/v1")


@dataclass(frozen=True)
class Credentials:
    """An ACL user's access key and secret key, as a client holds them.

    ``sign`` is the :data:`~ha_controller.rpc.Signer` of a client's connection pool:
    every request is signed.  The secret key never appears in ``repr``."""

    access_key: str
    secret_key: str = field(repr=False)
    _key: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ValueError("credentials need a non-empty access key and secret key")
        object.__setattr__(self, "_key", _secret_key(self.secret_key))

    def sign(self, method: int, body: bytes, *, now_ms: int | None = None) -> RequestAuth:
        ts = wall_ms() if now_ms is None else now_ms
        nonce = secrets.token_bytes(16)
        mac = request_mac(self._key, method, ts, nonce, body)
        return RequestAuth(ts, nonce, mac, self.access_key)

    @classmethod
    def maybe(cls, access_key: str | None, secret_key: str | None) -> Credentials | None:
        """Credentials from optional settings: None when neither is set; a
        ``ValueError`` naming the missing one when only one is."""
        if not access_key and not secret_key:
            return None
        if not access_key:
            raise ValueError("a secret key was given without an access key")
        if not secret_key:
            raise ValueError(f"access key {access_key!r} was given without its secret key")
        return cls(access_key, secret_key)


@dataclass(frozen=True)
class AclUser:
    """One user of the ACL file."""

    access_key: str
    secret_key: str = field(repr=False)
    admin: bool = False
    default_topic_perm: Perm = Perm.DENY
    default_group_perm: Perm = Perm.DENY
    topic_perms: Mapping[str, Perm] = field(default_factory=dict)
    group_perms: Mapping[str, Perm] = field(default_factory=dict)

    def topic_perm(self, topic: str) -> Perm:
        return self.topic_perms.get(topic, self.default_topic_perm)

    def group_perm(self, group: str) -> Perm:
        return self.group_perms.get(group, self.default_group_perm)

    @property
    def credentials(self) -> Credentials:
        return Credentials(self.access_key, self.secret_key)


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


def _user(where: str, raw: object) -> AclUser:
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
    groups = _perm_list(f"{where}.group_perms", raw.get("group_perms", []))
    for group, perm in groups.items():
        if perm & Perm.PUB:
            raise ConfigError(f"{where}.group_perms: a group takes SUB or DENY, not PUB ({group})")
    return AclUser(
        ak,
        sk,
        admin=admin,
        default_topic_perm=perms["default_topic_perm"],
        default_group_perm=perms["default_group_perm"],
        topic_perms=_perm_list(f"{where}.topic_perms", raw.get("topic_perms", [])),
        group_perms=groups,
    )


def parse_acl(table: Mapping[str, Any], where: str = "acl file") -> dict[str, AclUser]:
    """The users of an ACL file's contents: access key -> user."""
    unknown = sorted(set(table) - {"users"})
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; users go in [[users]] tables")
    raw_users = table.get("users", [])
    if not isinstance(raw_users, list):
        raise ConfigError(f"{where}: users must be [[users]] tables")
    users: dict[str, AclUser] = {}
    for i, raw in enumerate(raw_users):
        user = _user(f"{where}: users[{i}]", raw)
        if user.access_key in users:
            raise ConfigError(f"{where}: users[{i}]: access key {user.access_key!r} appears twice")
        users[user.access_key] = user
    return users


def load_acl_file(path: str | Path) -> dict[str, AclUser]:
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


# ---- what a request needs -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Need:
    """What one request touches: topics and groups with the permission each needs, or
    the admin role."""

    topics: tuple[tuple[str, Perm], ...] = ()
    groups: tuple[str, ...] = ()  # each needs SUB
    admin: bool = False


ANY_USER = Need()
ADMIN = Need(admin=True)

_Rule = Callable[[Any], Need]


def _parse(cls: type[Message], body: bytes) -> Any:
    msg = cls()
    try:
        msg.ParseFromString(body)
    except (DecodeError, ValueError, RuntimeError):
        return None
    return msg


def _pub(req: Any) -> Need:
    return Need(topics=((req.topic, Perm.PUB),))


def _sub_topic(req: Any) -> Need:
    return Need(topics=((req.topic, Perm.SUB),))


def _consume(req: Any) -> Need:
    return Need(topics=((req.topic, Perm.SUB),), groups=(req.consumer_group,))


def _lock(req: Any) -> Need:
    if req.only_this_broker:
        return ADMIN  # a peer broker's quorum vote
    topics = tuple(dict.fromkeys((mq.topic, Perm.SUB) for mq in req.mqs))
    return Need(topics=topics, groups=(req.consumer_group,))


def _client(req: Any) -> Need:
    return Need(groups=tuple(req.consumer_groups))


def _group(req: Any) -> Need:
    return Need(groups=(req.consumer_group,))


#: request code -> (request type, what it needs).  A code that is not here needs the
#: admin role (a new handler is refused to users until someone adds its rule).
RULES: dict[int, tuple[type[Message] | None, _Rule | None]] = {
    RequestCode.SEND_MESSAGE: (broker_pb2.SendMessageRequest, _pub),
    RequestCode.RECALL_MESSAGE: (broker_pb2.RecallMessageRequest, _pub),
    RequestCode.END_TRANSACTION: (broker_pb2.EndTransactionRequest, _pub),
    RequestCode.PULL_MESSAGE: (broker_pb2.PullMessageRequest, _consume),
    RequestCode.POP_MESSAGE: (broker_pb2.PopMessageRequest, _consume),
    RequestCode.ACK_MESSAGE: (broker_pb2.AckMessageRequest, _consume),
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: (broker_pb2.AckMessageRequest, _consume),
    RequestCode.QUERY_CONSUMER_OFFSET: (broker_pb2.ConsumerOffsetRequest, _consume),
    RequestCode.UPDATE_CONSUMER_OFFSET: (broker_pb2.ConsumerOffsetRequest, _consume),
    RequestCode.GET_MAX_OFFSET: (broker_pb2.QueueOffsetRequest, _sub_topic),
    RequestCode.GET_MIN_OFFSET: (broker_pb2.QueueOffsetRequest, _sub_topic),
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: (broker_pb2.QueueOffsetRequest, _sub_topic),
    RequestCode.GET_EARLIEST_MSG_STORETIME: (broker_pb2.QueueOffsetRequest, _sub_topic),
    RequestCode.LOCK_BATCH_MQ: (broker_pb2.LockBatchRequest, _lock),
    RequestCode.UNLOCK_BATCH_MQ: (broker_pb2.LockBatchRequest, _lock),
    RequestCode.HEART_BEAT: (broker_pb2.ClientHeartbeat, _client),
    RequestCode.UNREGISTER_CLIENT: (broker_pb2.ClientHeartbeat, _client),
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: (broker_pb2.ConsumerListRequest, _group),
    # read-only metadata any user may see (the routes tell as much)
    RequestCode.GET_ROUTEINFO_BY_TOPIC: (None, None),
    RequestCode.GET_BROKER_CLUSTER_INFO: (None, None),
    RequestCode.WATCH_ROUTE: (None, None),
    RequestCode.GET_BROKER_STATUS: (None, None),
    RequestCode.GET_ALL_TOPIC_CONFIG: (None, None),
    RequestCode.GET_BROKER_MEMBER_GROUP: (None, None),
}


def need_of(method: int, body: bytes) -> Need:
    """What request ``method`` with ``body`` needs (:data:`RULES`).  An undecodable
    body needs nothing here: its handler refuses it as ``BadRequest``."""
    rule = RULES.get(method)
    if rule is None:
        return ADMIN
    cls, fn = rule
    if cls is None or fn is None:
        return ANY_USER
    req = _parse(cls, body)
    return ANY_USER if req is None else fn(req)


#: Codes whose requests name consumer groups that a broker then keeps (offsets,
#: consumer lists, locks, POP checkpoints): their names are checked always.
GROUP_CODES: frozenset[int] = frozenset(
    code for code, (_, fn) in RULES.items() if fn in (_consume, _lock, _client, _group)
)


def check_groups(need: Need, *, allow_reserved: bool = False) -> None:
    """Refuse (``BadRequest``) a request that names a group RocketMQ would refuse
    (``allow_reserved``: the brokers' own groups pass, for a cluster member)."""
    for group in need.groups:
        problem = group_name_problem(group, allow_reserved=allow_reserved)
        if problem is not None:
            raise BadRequest(problem)


# ---- the receiver ----------------------------------------------------------------------

DeniedHook = Callable[[int, str], None]


class Acl:
    """A service's client ACL (``enabled`` with users loaded); ``check`` is its part of
    the dispatcher's guard."""

    def __init__(
        self,
        users: Mapping[str, AclUser] | Iterable[AclUser] | None = None,
        *,
        allow_anonymous: bool = True,
        on_denied: DeniedHook | None = None,
        clock_ms: Callable[[], int] = wall_ms,
        max_skew_ms: int = MAX_SKEW_MS,
    ) -> None:
        if users is None:
            self.users: dict[str, AclUser] | None = None
        elif isinstance(users, Mapping):
            self.users = dict(users)
        else:
            self.users = {u.access_key: u for u in users}
        self.allow_anonymous = allow_anonymous
        self._keys = {ak: _secret_key(u.secret_key) for ak, u in (self.users or {}).items()}
        self._on_denied = on_denied or (lambda code, reason: None)
        self._clock_ms = clock_ms
        self.max_skew_ms = max_skew_ms
        self._logged: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    @classmethod
    def from_config(cls, cfg: Any, *, on_denied: DeniedHook | None = None) -> Acl:
        """From an ``[acl]`` table (``AclConfig``): disabled unless ``enabled``."""
        if not cfg.enabled:
            return cls(None, on_denied=on_denied)
        assert cfg.file is not None  # checked at load
        return cls(
            load_acl_file(cfg.file), allow_anonymous=cfg.allow_anonymous, on_denied=on_denied
        )

    @property
    def enabled(self) -> bool:
        return self.users is not None

    def authenticate(self, method: int, body: bytes, auth: RequestAuth | None) -> AclUser | None:
        """The user that signed a request (None: anonymous, allowed).  Raises
        ``AccessDenied`` for a bad, stale or unknown signature and for an anonymous
        request when anonymous access is off."""
        if auth is None or not auth.access_key:
            if not self.allow_anonymous:
                raise self._deny(
                    method,
                    "anonymous",
                    f"{method_name(method)}: this cluster does not allow anonymous access; "
                    "sign requests with an access key and secret key (hactl --access-key/"
                    "--secret-key or HAC_ACCESS_KEY/HAC_SECRET_KEY)",
                )
            return None
        assert self.users is not None
        ak = auth.access_key
        user = self.users.get(ak)
        key = self._keys.get(ak)
        if user is None or key is None:
            # (a stranger's text: shortened before it reaches a log line)
            raise self._deny(method, "unknown_user", f"unknown access key {ak[:64]!r}")
        off = self._clock_ms() - auth.timestamp_ms
        if abs(off) > self.max_skew_ms:
            raise self._deny(
                method,
                "stale",
                f"{method_name(method)} signed {off} ms from this server's clock (the window "
                f"is ±{self.max_skew_ms} ms: synchronise the clocks)",
            )
        expected = request_mac(key, method, auth.timestamp_ms, auth.nonce, body)
        if len(auth.nonce) > 255 or not hmac.compare_digest(expected, auth.signature):
            raise self._deny(
                method,
                "bad_signature",
                f"{method_name(method)}: the signature does not match access key {ak!r}'s "
                "secret key",
            )
        return user

    def authorize(self, method: int, user: AclUser | None, need: Need) -> None:
        """Refuse (``AccessDenied``) unless ``user`` has what ``need`` says."""
        if user is None or user.admin:
            return  # anonymous (allowed) is served as without an ACL
        who = f"user {user.access_key!r}"
        if need.admin:
            raise self._deny(
                method,
                "no_permission",
                f"{method_name(method)} needs the admin role; {who} is not an admin",
            )
        for topic, perm in need.topics:
            if topic.startswith(RETRY_PREFIX):
                # a group's retry topic is the group's (RocketMQ's plain ACL too)
                need = Need(groups=(*need.groups, topic[len(RETRY_PREFIX) :]))
                continue
            if perm not in user.topic_perm(topic):
                raise self._deny(
                    method,
                    "no_permission",
                    f"{method_name(method)} needs {perm.text()} on topic {topic[:128]!r}; "
                    f"{who} has {user.topic_perm(topic).text()}",
                )
        for group in need.groups:
            if Perm.SUB not in user.group_perm(group):
                raise self._deny(
                    method,
                    "no_permission",
                    f"{method_name(method)} needs SUB on group {group[:128]!r}; {who} has "
                    f"{user.group_perm(group).text()}",
                )

    def _deny(self, method: int, reason: str, message: str) -> AccessDenied:
        self._on_denied(method, reason)
        return AccessDenied(message)

    def log_denied(self, peer: str, exc: AccessDenied) -> None:
        """One line per client address per :data:`LOG_INTERVAL_S` (the rest counted)."""
        host = peer.rpartition(":")[0] or peer
        now = time.monotonic()
        last = self._logged.get(host)
        if last is not None and now - last < LOG_INTERVAL_S:
            self._suppressed[host] = self._suppressed.get(host, 0) + 1
            return
        if host not in self._logged and len(self._logged) >= MAX_LOGGED_PEERS:
            oldest = next(iter(self._logged))
            del self._logged[oldest]
            self._suppressed.pop(oldest, None)
        self._logged.pop(host, None)
        self._logged[host] = now
        more = self._suppressed.pop(host, 0)
        log.warning(
            "access denied to %s: %s (%d more from this host since its last such line; "
            "logged at most every %.0f s per host)",
            peer,
            exc,
            more,
            LOG_INTERVAL_S,
        )


def guard(cluster: ClusterAuth, acl: Acl) -> Guard:
    """The dispatcher guard of a service: cluster authentication (control plane), then
    the client ACL, then group-name checks; all before the handler runs."""

    def check(ctx: RequestContext, body: bytes) -> None:
        cluster.check(ctx, body)
        method = ctx.method
        need: Need | None = None
        if method in GROUP_CODES:
            need = need_of(method, body)
            check_groups(need, allow_reserved=ctx.authenticated)
        if not acl.enabled or ctx.authenticated:
            return
        try:
            user = acl.authenticate(method, body, ctx.auth)
            if user is not None and not user.admin:
                acl.authorize(method, user, need if need is not None else need_of(method, body))
        except AccessDenied as exc:
            acl.log_denied(ctx.peer, exc)
            raise

    return check
