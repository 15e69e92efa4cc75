"""The receiver's side of the client ACL: who signed a request, and whether that user
may do what the request needs (:mod:`ha_controller.acl.rules`).

:class:`AclHolder` keeps a node's current table (:mod:`ha_controller.acl.model`):
the users file's at start (revision 0), then any newer one it is offered (a runtime
change made on this node, pushed by a nameserver, fetched in a sync).  :class:`Acl`
checks requests against whatever table the holder has *now*, so a change takes effect
on the next request, without a restart.

A request is refused (:class:`~ha_controller.protocol.errors.AccessDenied`, before its
handler runs, so nothing changes) when it is

* unsigned while anonymous access is off (``anonymous``);
* signed by an unknown access key (``unknown_user``), a disabled user (``disabled``),
  with a bad signature (``bad_signature``) or a timestamp more than
  :data:`MAX_SKEW_MS` from the receiver's clock (``stale``);
* a copy of one served before (``replayed``, :mod:`ha_controller.acl.replay`; also
  ``replay_window_passed`` and ``replay_cache_full``, both retriable);
* not allowed by the user's entries (``no_permission``): a ``Normal`` user needs every
  check of the request; the ``Super`` role only where the rules say so; a request
  only cluster members send is refused to every user.

Each refusal is counted (``on_denied(code, reason)``: ``hac_acl_denied_total``) and
written to the audit log (logger ``ha_controller.acl.audit``: one line per refusal,
at most :data:`AUDIT_LINES_PER_S` a second, the rest counted in the next line; with
``audit_allowed`` one line per allowed request too).

No I/O; the clock is injectable.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import logging
import time
from collections.abc import Callable
from typing import Any, Final

from ha_controller.acl.credentials import user_key
from ha_controller.acl.model import AclTable, Action, Decision, User
from ha_controller.acl.replay import ReplayWindow
from ha_controller.acl.rules import Check, Need
from ha_controller.auth import request_mac, wall_ms
from ha_controller.protocol.codes import method_name
from ha_controller.protocol.envelope import RequestAuth
from ha_controller.protocol.errors import AccessDenied, Overloaded, ReplayedRequest
from ha_controller.rpc.bounds import Throttle

log = logging.getLogger(__name__)
audit_log = logging.getLogger("ha_controller.acl.audit")

__all__ = ["DENY_REASONS", "Acl", "AclHolder", "ReplayWindowPassed", "peer_ip"]

#: How far a signed client request's timestamp may be from the receiver's clock.
MAX_SKEW_MS: Final = 30_000
LOG_INTERVAL_S: Final = 10.0
#: client addresses whose last log line is remembered (oldest forgotten first)
MAX_LOGGED_PEERS: Final = 4096
AUDIT_LINES_PER_S: Final = 100
#: remembered decisions (user, resource, actions, source): cleared on a new table
MAX_CACHED_DECISIONS: Final = 100_000
#: Refusal reasons of ``hac_acl_denied_total``.
DENY_REASONS: Final = (
    "anonymous",
    "unknown_user",
    "disabled",
    "bad_signature",
    "stale",
    "replayed",
    "replay_window_passed",
    "replay_cache_full",
    "no_permission",
)

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
DeniedHook = Callable[[int, str], None]


class ReplayWindowPassed(ReplayedRequest):
    """A signed request held back behind too many later ones of its signer: re-sign
    and send it again (a copy could not be told from it)."""

    retriable = True


@functools.lru_cache(maxsize=8192)
def peer_ip(peer: str) -> IpAddress | None:
    """The IP of ``host:port``, ``[v6]:port`` or a bare address (None: not an IP;
    remembered: a connection asks for each of its requests)."""
    host = peer.rpartition(":")[0] if peer.count(":") == 1 or peer.startswith("[") else peer
    host = host.strip("[]").split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


class AclHolder:
    """A node's current ACL table and the signing keys of its users.

    ``offer`` takes a newer table (revision 1 and up: a runtime change; revision 0 is
    each node's own users file and never replaces anything); ``persist`` (a broker's
    file) and the listeners run after each adoption."""

    def __init__(
        self,
        table: AclTable,
        *,
        persist: Callable[[AclTable], None] | None = None,
    ) -> None:
        self._table = table
        self._keys: dict[str, bytes] = {}
        self._persist = persist
        self._listeners: list[Callable[[AclTable], None]] = []

    @property
    def table(self) -> AclTable:
        return self._table

    def key(self) -> tuple[int, str]:
        return self._table.key()

    def subscribe(self, listener: Callable[[AclTable], None]) -> None:
        self._listeners.append(listener)

    def user(self, name: str) -> User | None:
        return self._table.users.get(name)

    def signing_key(self, user: User) -> bytes:
        key = self._keys.get(user.username)
        if key is None:
            key = self._keys[user.username] = user_key(user.password)
        return key

    def offer(self, table: AclTable) -> bool:
        """Adopt ``table`` when it is a runtime table newer than ours."""
        if table.revision < 1 or not table.newer_than(self._table):
            return False
        self._adopt(table)
        return True

    def _adopt(self, table: AclTable) -> None:
        old = self._table
        self._table = table
        self._keys = {}
        log.info(
            "ACL table revision %d (%s) adopted (was %d): %d users",
            table.revision,
            table.digest[:12],
            old.revision,
            len(table.users),
        )
        if self._persist is not None:
            self._persist(table)
        for listener in list(self._listeners):
            listener(table)

    def change(self, make: Callable[[AclTable], AclTable]) -> AclTable:
        """A runtime change made here: ``make(current)`` (raises ``AclInvalid``)."""
        table = make(self._table)
        self._adopt(table)
        return table


class Acl:
    """A service's client ACL (enabled with a holder); ``check`` in :mod:`.guard`."""

    def __init__(
        self,
        holder: AclHolder | None = None,
        *,
        allow_anonymous: bool = True,
        on_denied: DeniedHook | None = None,
        clock_ms: Callable[[], int] = wall_ms,
        max_skew_ms: int = MAX_SKEW_MS,
        audit_allowed: bool = False,
    ) -> None:
        self.holder = holder
        self.allow_anonymous = allow_anonymous
        self._on_denied = on_denied or (lambda code, reason: None)
        self._clock_ms = clock_ms
        self.max_skew_ms = max_skew_ms
        self.audit_allowed = audit_allowed
        self.replay = ReplayWindow(max_skew_ms=max_skew_ms)
        self._logged: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._audit = Throttle(1.0 / AUDIT_LINES_PER_S)
        self._decisions: dict[tuple[str, str, str, frozenset[Action], Any], str | None] = {}
        self._decided_on: tuple[int, str] | None = None

    @classmethod
    def from_config(
        cls,
        cfg: Any,
        *,
        on_denied: DeniedHook | None = None,
        holder: AclHolder | None = None,
    ) -> Acl:
        """From an ``[acl]`` table (``AclConfig``): disabled unless ``enabled``; the
        holder starts from the users file unless one is given (a broker's, loaded
        from its store)."""
        if not cfg.enabled:
            return cls(None, on_denied=on_denied)
        if holder is None:
            from ha_controller.acl.legacy import load_acl_file

            assert cfg.file is not None  # checked at load
            holder = AclHolder(load_acl_file(cfg.file))
        return cls(
            holder,
            allow_anonymous=cfg.allow_anonymous,
            on_denied=on_denied,
            audit_allowed=getattr(cfg, "audit_allowed", False),
        )

    @property
    def enabled(self) -> bool:
        return self.holder is not None

    @property
    def table(self) -> AclTable:
        assert self.holder is not None
        return self.holder.table

    # ---- who -----------------------------------------------------------------------

    def authenticate(self, method: int, body: bytes, auth: RequestAuth | None) -> User | None:
        """The user that signed a request (None: anonymous, allowed).  Raises
        ``AccessDenied`` for a bad, stale, replayed or unknown signature, a disabled
        user, and an anonymous request when anonymous access is off."""
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
        assert self.holder is not None
        ak = auth.access_key
        user = self.holder.user(ak)
        if user is None:
            # (a stranger's text: shortened before it reaches a log line)
            raise self._deny(method, "unknown_user", f"unknown access key {ak[:64]!r}")
        now = self._clock_ms()
        off = now - auth.timestamp_ms
        if abs(off) > self.max_skew_ms:
            raise self._deny(
                method,
                "stale",
                f"{method_name(method)} signed {off} ms from this server's clock (the window "
                f"is ±{self.max_skew_ms} ms: synchronise the clocks)",
            )
        key = self.holder.signing_key(user)
        expected = request_mac(key, method, auth.timestamp_ms, auth.nonce, body)
        if len(auth.nonce) > 255 or not hmac.compare_digest(expected, auth.signature):
            raise self._deny(
                method,
                "bad_signature",
                f"{method_name(method)}: the signature does not match access key {ak!r}'s "
                "secret key",
            )
        self._check_enabled(method, user)
        self.check_replay(method, ak, auth, now)
        return user

    def user_on_behalf(self, method: int, name: str) -> User:
        """The user a gateway vouches for (its request is signed with the cluster key)."""
        assert self.holder is not None
        user = self.holder.user(name)
        if user is None:
            raise self._deny(method, "unknown_user", f"unknown access key {name[:64]!r}")
        self._check_enabled(method, user)
        return user

    def _check_enabled(self, method: int, user: User) -> None:
        if not user.enabled:
            raise self._deny(
                method, "disabled", f"{method_name(method)}: user {user.username!r} is disabled"
            )

    def check_replay(
        self, method: int, key: str, auth: RequestAuth, now_ms: int | None = None
    ) -> None:
        """Refuse a copy of a request this receiver served (numbered nonces)."""
        now = self._clock_ms() if now_ms is None else now_ms
        reason = self.replay.check(key, auth.nonce, auth.timestamp_ms, now)
        if reason is None:
            return
        name = method_name(method)
        if reason == "replayed":
            exc: AccessDenied | ReplayedRequest | Overloaded = ReplayedRequest(
                f"{name}: a copy of a request already served"
            )
        elif reason == "replay_window_passed":
            exc = ReplayWindowPassed(
                f"{name}: signed before more than a window of its signer's later requests; "
                "sign it again"
            )
        else:
            exc = Overloaded(f"{name}: too many signing sessions within the replay window")
        self._on_denied(method, reason)
        self._audit_line("DENY", name, key, "-", reason, str(exc))
        raise exc

    # ---- what --------------------------------------------------------------------------

    def authorize(
        self,
        method: int,
        user: User | None,
        need: Need,
        ip: IpAddress | None = None,
        *,
        name: str | None = None,
    ) -> None:
        """Refuse (``AccessDenied``) unless ``user`` may do what ``need`` says
        (``name``: the request's name in the message, a gRPC method's at the gateway)."""
        if user is None:
            return  # anonymous (allowed) is served as without an ACL
        who = f"user {user.username!r}"
        name = name or method_name(method)
        if need.members:
            raise self._deny(
                method,
                "no_permission",
                f"{name} is {need.why or 'for cluster members only'}",
                name=name,
            )
        if user.is_super:
            self._allowed(name, user, need, ip)
            return
        if need.admin:
            why = f" ({need.why})" if need.why else ""
            raise self._deny(
                method,
                "no_permission",
                f"{name} needs a Super user{why}; {who} is Normal",
                user=user.username,
                name=name,
            )
        for check in need.checks:
            problem = self._decide(user, check, ip)
            if problem is not None:
                raise self._deny(
                    method,
                    "no_permission",
                    f"{name} needs {check.text()}; {who} {problem}",
                    user=user.username,
                    resource=check.text(),
                    name=name,
                )
        self._allowed(name, user, need, ip)

    def permits(self, username: str | None, need: Need, ip: IpAddress | None = None) -> bool:
        """Whether ``username`` (None: anonymous) may do what ``need`` says, without a
        refusal being counted: who of the producers may be asked about a transaction."""
        if self.holder is None:
            return True
        if username is None:
            return self.allow_anonymous
        user = self.holder.user(username)
        if user is None or not user.enabled or need.members:
            return False
        if user.is_super:
            return True
        if need.admin:
            return False
        return all(self._decide(user, check, ip) is None for check in need.checks)

    def _decide(self, user: User, check: Check, ip: IpAddress | None) -> str | None:
        """None when allowed, else why not (cached until the table changes)."""
        table = self.table
        if self._decided_on != table.key():
            self._decisions.clear()
            self._decided_on = table.key()
        r = check.resource
        key = (user.username, r.type.value, r.name, check.actions, ip)
        if key in self._decisions:
            return self._decisions[key]
        result = decide(table, user.username, check, ip)
        if len(self._decisions) >= MAX_CACHED_DECISIONS:
            self._decisions.clear()
        self._decisions[key] = result
        return result

    # ---- refusals and the audit log -------------------------------------------------

    def _deny(
        self,
        method: int,
        reason: str,
        message: str,
        *,
        user: str = "-",
        resource: str = "-",
        name: str | None = None,
    ) -> AccessDenied:
        self._on_denied(method, reason)
        self._audit_line("DENY", name or method_name(method), user, resource, reason, message)
        return AccessDenied(message)

    def _allowed(self, name: str, user: User, need: Need, ip: IpAddress | None) -> None:
        if self.audit_allowed:
            resources = ",".join(c.text() for c in need.checks) or ("Super" if need.admin else "-")
            audit_log.info(
                "ALLOW user=%s ip=%s code=%s resources=%s",
                user.username,
                ip if ip is not None else "-",
                name,
                resources,
            )

    def _audit_line(
        self, decision: str, name: str, user: str, resource: str, reason: str, detail: str
    ) -> None:
        count = self._audit.hit(time.monotonic())
        if count:
            more = f" ({count - 1} more since the last line)" if count > 1 else ""
            audit_log.warning(
                "%s user=%s code=%s resource=%s reason=%s: %s%s",
                decision,
                user[:64],
                name,
                resource[:160],
                reason,
                detail,
                more,
            )

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


def decide(table: AclTable, username: str, check: Check, ip: IpAddress | None) -> str | None:
    """None when ``username``'s entries allow one of ``check``'s actions on its
    resource from ``ip``; otherwise why not (RocketMQ's order, see the model)."""
    entries = [
        e for e in table.entries_of(username) if e.resource.matches(check.resource) and e.admits(ip)
    ]
    denied = False
    for action in check.actions:
        covering = [e for e in entries if e.covers(frozenset({action}))]
        if not covering:
            continue
        best = min(covering, key=lambda e: e.sort_key())
        if best.decision is Decision.ALLOW:
            return None
        denied = True
    if denied:
        return "is denied it"
    return "has no entry that allows it"
