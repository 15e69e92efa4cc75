"""Cluster authentication: signed control-plane requests and the HA handshake.

With a cluster secret (``cluster_secret``, the same on every nameserver and broker),
every request one cluster member sends another on the control plane (registration,
heartbeat, member group, min-id notices, the HA-info exchange, peer lock votes,
pre-online pulls; :data:`SIGNED_CODES`) carries ``RequestBody.authInfo``: an
HMAC-SHA256 over the WHOLE request (method code, timestamp, nonce and the serialized
request bytes), keyed with a key derived from the secret.  The receiver
(:meth:`ClusterAuth.check`, the dispatcher's guard) refuses

* an unsigned request whose code needs a signature (:func:`requires_signature`):
  ``SignatureInvalid``, reason ``unsigned``;
* a signature that does not match: ``SignatureInvalid``, ``bad_signature``;
* a timestamp more than :data:`MAX_SKEW_MS` (30 s) off its own clock:
  ``SignatureInvalid``, ``stale``;
* a nonce it accepted before within that window: ``ReplayedRequest``, ``replayed``
  (nonces are remembered until their timestamp leaves the window, at most
  :data:`MAX_NONCES` of them; beyond that a signed request is refused ``Overloaded``,
  ``replay_cache_full``, rather than forgetting a nonce early);

before the handler runs, so a refused request changes nothing.  A signature on any
other request is checked too (a wrong one is refused) and marks the request as a
cluster member's (``RequestContext.authenticated``); clients' requests are never
signed and never need to be.

The HA port has its own challenge-response (:meth:`ClusterAuth.ha_slave_signature`
and friends; see ``broker_agent.replication.ha``): the master answers a slave's hello
with a random challenge and its proof of the secret, the slave answers HMAC(secret,
challenge || broker name || broker id || its address), and only then are its offset
reports counted and the log streamed to it.

The module does no I/O (the services wire it in); its clock is injectable.

The first scheme (:func:`canonical`, :func:`sign`, :func:`verify`: HMAC over a few
registration fields) is still filled in by brokers so that nameservers not yet
upgraded keep accepting them; upgraded nameservers check the request signature only.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import logging
import secrets
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode, method_name
from ha_controller.protocol.envelope import RequestAuth
from ha_controller.protocol.errors import (
    HaError,
    Overloaded,
    ReplayedRequest,
    SignatureInvalid,
)
from ha_controller.rpc.bounds import Throttle

if TYPE_CHECKING:
    from ha_controller.rpc.connection import RequestContext

log = logging.getLogger(__name__)

#: How far a request's timestamp may be from the receiver's clock (either way).
MAX_SKEW_MS = 30_000
#: Nonces a receiver remembers at most (only of correctly signed requests).
MAX_NONCES = 100_000
NONCE_BYTES = 16
CHALLENGE_BYTES = 32
#: the signature's size (HMAC-SHA256)
SIGNATURE_BYTES = 32
LOG_INTERVAL_S = 10.0

#: Requests cluster members sign when they have a secret.
SIGNED_CODES: frozenset[int] = frozenset(
    {
        RequestCode.REGISTER_BROKER,
        RequestCode.UNREGISTER_BROKER,
        RequestCode.BROKER_HEARTBEAT,
        RequestCode.QUERY_DATA_VERSION,
        RequestCode.GET_BROKER_MEMBER_GROUP,
        RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE,
        RequestCode.EXCHANGE_BROKER_HA_INFO,
        RequestCode.LOCK_BATCH_MQ,
        RequestCode.UNLOCK_BATCH_MQ,
        RequestCode.GET_ALL_CONSUMER_OFFSET,
        RequestCode.GET_ALL_DELAY_OFFSET,
        RequestCode.GET_TIMER_CHECK_POINT,
        RequestCode.GET_TRANSACTION_OFFSETS,
        RequestCode.GET_ALL_TOPIC_CONFIG,
        RequestCode.GET_COMMITLOG_RANGE,
        RequestCode.GET_RECALL_TABLE,
        RequestCode.GET_POP_ACK_TABLE,
        RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
        RequestCode.GET_ACL_TABLE,
        RequestCode.PUT_ACL_TABLE,
        RequestCode.PUT_RECALLS,
    }
)

#: Data-plane requests members sign whenever they have a secret (not only with a
#: client ACL): a broker sends SEND_MESSAGE only to escape, and a target honours the
#: escape id of a member's send only (a client could otherwise store a forged id
#: first, and the real escape would be answered as a repeat and lost).
MEMBER_DATA_CODES: frozenset[int] = frozenset({RequestCode.SEND_MESSAGE})

#: Requests refused unsigned when the receiver has a secret: only cluster members send
#: them.  GET_BROKER_MEMBER_GROUP, GET_ALL_TOPIC_CONFIG and
#: GET_ALL_SUBSCRIPTIONGROUP_CONFIG are signed by brokers but also asked by clients,
#: the gateway and ``hactl`` (read-only; GET_BROKER_CLUSTER_INFO and the
#: routes tell the same): unsigned, they are answered as any client's request.
REQUIRED_CODES: frozenset[int] = frozenset(
    {
        RequestCode.REGISTER_BROKER,
        RequestCode.UNREGISTER_BROKER,
        RequestCode.BROKER_HEARTBEAT,
        RequestCode.QUERY_DATA_VERSION,
        RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE,
        RequestCode.EXCHANGE_BROKER_HA_INFO,
        RequestCode.GET_ALL_CONSUMER_OFFSET,
        RequestCode.GET_ALL_DELAY_OFFSET,
        RequestCode.GET_TIMER_CHECK_POINT,
        RequestCode.GET_TRANSACTION_OFFSETS,
        RequestCode.GET_COMMITLOG_RANGE,
        RequestCode.GET_RECALL_TABLE,
        RequestCode.GET_POP_ACK_TABLE,
        RequestCode.GET_ACL_TABLE,
        RequestCode.PUT_ACL_TABLE,
        RequestCode.PUT_RECALLS,
    }
)

#: Refusal reasons of ``hac_auth_refused_total`` (both services).
RPC_REASONS = ("unsigned", "bad_signature", "stale", "replayed", "replay_cache_full")
#: The nameserver's open-mode refusals (no secret; see ``nameserver.service``).
OPEN_MODE_REASONS = ("registration_conflict", "addr_mismatch")
#: The HA port's refusals (broker).
HA_REASONS = ("ha_unauthenticated", "ha_bad_signature", "ha_offset_beyond_max")

RefusalHook = Callable[[str, int], None]


def _lock_vote(body: bytes) -> bool:
    """A peer's LOCK/UNLOCK_BATCH_MQ vote (``only_this_broker``); an undecodable body
    counts as one (its handler refuses it anyway)."""
    req = broker_pb2.LockBatchRequest()
    try:
        req.ParseFromString(body)
    except (DecodeError, ValueError, RuntimeError):
        return True
    return req.only_this_broker


#: Codes that need a signature only for some bodies.
_CONDITIONAL: dict[int, Callable[[bytes], bool]] = {
    RequestCode.LOCK_BATCH_MQ: _lock_vote,
    RequestCode.UNLOCK_BATCH_MQ: _lock_vote,
}


def requires_signature(method: int, body: bytes) -> bool:
    """Whether a request must be signed when the receiver has a cluster secret."""
    if method in REQUIRED_CODES:
        return True
    predicate = _CONDITIONAL.get(method)
    return predicate is not None and predicate(body)


class SteadyWallClock:
    """Wall time as this process first read it, moved on by the monotonic clock.

    Signatures carry a timestamp that receivers compare with their own clocks; with the
    raw wall clock, a step of one process's clock (an NTP step, a VM restored, an
    operator) made it refuse every signed request as stale, or be refused by everyone
    (a nameserver stepped +45 s emptied its group table).  This clock does not move
    with such a step: the process keeps the time it had, which its peers agreed with,
    and says once per step that it saw one.  A restart takes the new time."""

    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        step_s: float = 1.0,
        keeps: str = "signatures and their freshness checks",
    ) -> None:
        """``keeps`` names what this clock serves, for the line a step logs."""
        self._wall = wall
        self._keeps = keeps
        self._monotonic = monotonic
        self._step_s = step_s
        self._base = wall() - monotonic()
        self._off = 0.0  # wall - steady, as last seen

    def __call__(self) -> int:
        steady = self._base + self._monotonic()
        off = self._wall() - steady
        if abs(off - self._off) > self._step_s:
            log.warning(
                "the wall clock stepped by %+.1f s (now %+.1f s from this process's clock): "
                "%s keep the clock from before; restart the process to take the new time",
                off - self._off,
                off,
                self._keeps,
            )
            self._off = off
        return int(steady * 1000)


#: this process's clock for signatures and their freshness checks
steady_wall_ms = SteadyWallClock()


def wall_ms() -> int:
    """The time signatures carry and are checked against (:class:`SteadyWallClock`)."""
    return steady_wall_ms()


def derive_key(secret: str, purpose: bytes) -> bytes:
    """A key per use of the secret, so that no signature of one kind is valid as
    another (a request MAC is never an HA answer, nor a legacy registration MAC)."""
    return hmac.new(secret.encode(), b"ha-controller/" + purpose, hashlib.sha256).digest()


def _fields(*parts: bytes) -> bytes:
    """Length-prefixed concatenation: no two field lists encode alike."""
    return b"".join(struct.pack(">I", len(p)) + p for p in parts)


def request_mac(
    key: bytes, method: int, timestamp_ms: int, nonce: bytes, body: bytes, extra: bytes = b""
) -> bytes:
    """The signature of one request: method, timestamp and nonce (and ``extra``, a
    gateway's on-behalf fields), then the body."""
    head = struct.pack(">iqB", method, timestamp_ms, len(nonce)) + nonce + extra
    return hmac.new(key, head + body, hashlib.sha256).digest()


def on_behalf_fields(user: str, source_ip: str) -> bytes:
    """What a gateway's request for a client signs besides the request (never empty,
    so that no such signature is valid as a plain member's)."""
    return _fields(b"on-behalf", user.encode(), source_ip.encode())


class ReplayCache:
    """Nonces of accepted requests until they leave the replay window (bounded)."""

    def __init__(self, capacity: int = MAX_NONCES) -> None:
        self.capacity = capacity
        self._expiry: dict[bytes, int] = {}
        self._heap: list[tuple[int, bytes]] = []

    def __len__(self) -> int:
        return len(self._expiry)

    def _purge(self, now_ms: int) -> None:
        heap = self._heap
        while heap and heap[0][0] < now_ms:
            _, nonce = heapq.heappop(heap)
            self._expiry.pop(nonce, None)

    def add(self, nonce: bytes, expires_ms: int, now_ms: int) -> bool:
        """Remember ``nonce`` until ``expires_ms``; False when it is remembered already.
        Raises ``Overloaded`` when full of unexpired nonces (nothing is forgotten early:
        that would let a copy of the forgotten request through)."""
        self._purge(now_ms)
        if nonce in self._expiry:
            return False
        if len(self._expiry) >= self.capacity:
            raise Overloaded(f"more than {self.capacity} signed requests within the replay window")
        self._expiry[nonce] = expires_ms
        heapq.heappush(self._heap, (expires_ms, nonce))
        return True


#: A numbered nonce: ``0x01 | session (15 random bytes) | counter (8 bytes)``.
NUMBERED_NONCE_VERSION = 1
SESSION_BYTES = 15
NUMBERED_NONCE_LEN = 1 + SESSION_BYTES + 8


def numbered_nonce(session: bytes, counter: int) -> bytes:
    return bytes([NUMBERED_NONCE_VERSION]) + session + counter.to_bytes(8, "big")


def split_nonce(nonce: bytes) -> tuple[bytes, int] | None:
    """(session, counter) of a numbered nonce, None for any other shape."""
    if len(nonce) != NUMBERED_NONCE_LEN or nonce[0] != NUMBERED_NONCE_VERSION:
        return None
    return nonce[1 : 1 + SESSION_BYTES], int.from_bytes(nonce[1 + SESSION_BYTES :], "big")


class NumberedNonces:
    """One signer's numbered nonces: a random session, a counter from 1."""

    __slots__ = ("_counter", "_session")

    def __init__(self) -> None:
        self._session = secrets.token_bytes(SESSION_BYTES)
        self._counter = 0

    def next(self) -> bytes:
        self._counter += 1
        return numbered_nonce(self._session, self._counter)


class ClusterAuth:
    """One process's side of cluster authentication; ``enabled`` with a secret.

    ``sign`` is the :data:`~ha_controller.rpc.Signer` of a member's connection pool,
    ``check`` the :data:`~ha_controller.rpc.Guard` of its dispatcher.  ``on_refused``
    counts every refusal by reason (the service's ``hac_auth_refused_total``).
    """

    def __init__(
        self,
        secret: str | None,
        *,
        on_refused: RefusalHook | None = None,
        clock_ms: Callable[[], int] = wall_ms,
        max_skew_ms: int = MAX_SKEW_MS,
        max_nonces: int = MAX_NONCES,
        sign_all: bool = False,
    ) -> None:
        self._rpc_key = derive_key(secret, b"rpc/v1") if secret else None
        self._ha_key = derive_key(secret, b"ha/v1") if secret else None
        self._on_refused = on_refused or (lambda reason, method: None)
        self._clock_ms = clock_ms
        self.max_skew_ms = max_skew_ms
        self.nonces = ReplayCache(max_nonces)
        self._numbered = NumberedNonces()
        self._log = Throttle(LOG_INTERVAL_S)
        #: sign every request, not only the control plane's (a broker whose cluster
        #: has a client ACL: its escape sends, pulls and route queries are a member's)
        self.sign_all = sign_all

    @property
    def enabled(self) -> bool:
        return self._rpc_key is not None

    # ---- requests ------------------------------------------------------------------

    def sign(self, method: int, body: bytes) -> RequestAuth | None:
        """The signature of an outgoing request (None: sent unsigned)."""
        if self._rpc_key is None or not (
            self.sign_all or method in SIGNED_CODES or method in MEMBER_DATA_CODES
        ):
            return None
        ts = self._clock_ms()
        nonce = secrets.token_bytes(NONCE_BYTES)
        return RequestAuth(ts, nonce, request_mac(self._rpc_key, method, ts, nonce, body))

    def sign_on_behalf(
        self, method: int, body: bytes, user: str, source_ip: str
    ) -> RequestAuth | None:
        """A gateway's request for client ``user`` connected from ``source_ip``: signed
        with the cluster key over both (None without a secret).  The receiver
        authorises it as that user from that address, and refuses a copy of it
        (numbered nonces, :mod:`ha_controller.acl.replay`)."""
        if self._rpc_key is None:
            return None
        ts = self._clock_ms()
        nonce = self._numbered.next()
        extra = on_behalf_fields(user, source_ip)
        mac = request_mac(self._rpc_key, method, ts, nonce, body, extra)
        return RequestAuth(ts, nonce, mac, "", user, source_ip)

    def check(self, ctx: RequestContext, body: bytes) -> None:
        """Refuse (raise) an unsigned control request, a bad, stale or replayed
        signature; mark a good one ``ctx.authenticated``.  Nothing without a secret."""
        key = self._rpc_key
        if key is None:
            return
        auth = ctx.auth
        method = ctx.method
        if auth is not None and auth.access_key:
            auth = None  # a client's, signed as an ACL user: checked by the ACL
        if auth is not None and auth.on_behalf_of:
            self._check_on_behalf(ctx, body, key, auth)
            return
        if auth is None:
            if requires_signature(method, body):
                raise self.refuse(
                    "unsigned",
                    method,
                    ctx.peer,
                    SignatureInvalid(
                        f"{method_name(method)} is not signed; this cluster requires "
                        "cluster_secret on every broker and nameserver"
                    ),
                )
            return
        now = self._clock_ms()
        off = now - auth.timestamp_ms
        if abs(off) > self.max_skew_ms:
            raise self.refuse(
                "stale",
                method,
                ctx.peer,
                SignatureInvalid(
                    f"{method_name(method)} signed {off} ms from this server's clock "
                    f"(the window is ±{self.max_skew_ms} ms: synchronise the clocks)"
                ),
            )
        expected = request_mac(key, method, auth.timestamp_ms, auth.nonce, body)
        if len(auth.nonce) > 255 or not hmac.compare_digest(expected, auth.signature):
            raise self.refuse(
                "bad_signature",
                method,
                ctx.peer,
                SignatureInvalid(
                    f"{method_name(method)}: the signature does not match this "
                    "server's cluster_secret"
                ),
            )
        if method not in SIGNED_CODES:
            # a member's data-plane request (sign_all): too many to remember; a copy
            # replayed within the window is what TLS prevents (docs/security.md)
            ctx.authenticated = True
            return
        try:
            fresh = self.nonces.add(auth.nonce, auth.timestamp_ms + self.max_skew_ms, now)
        except Overloaded as exc:
            raise self.refuse("replay_cache_full", method, ctx.peer, exc) from None
        if not fresh:
            raise self.refuse(
                "replayed",
                method,
                ctx.peer,
                ReplayedRequest(f"{method_name(method)}: a copy of a request already served"),
            )
        ctx.authenticated = True

    def _check_on_behalf(
        self, ctx: RequestContext, body: bytes, key: bytes, auth: RequestAuth
    ) -> None:
        """A gateway's request for a client: a good signature makes it that client's
        (``ctx.on_behalf``), to be authorised by the ACL as that user; never a
        member's.  Its replay check is the ACL's (numbered nonces)."""
        method = ctx.method
        off = self._clock_ms() - auth.timestamp_ms
        if abs(off) > self.max_skew_ms:
            raise self.refuse(
                "stale",
                method,
                ctx.peer,
                SignatureInvalid(
                    f"{method_name(method)} signed {off} ms from this server's clock "
                    f"(the window is ±{self.max_skew_ms} ms: synchronise the clocks)"
                ),
            )
        extra = on_behalf_fields(auth.on_behalf_of, auth.source_ip)
        expected = request_mac(key, method, auth.timestamp_ms, auth.nonce, body, extra)
        if len(auth.nonce) > 255 or not hmac.compare_digest(expected, auth.signature):
            raise self.refuse(
                "bad_signature",
                method,
                ctx.peer,
                SignatureInvalid(
                    f"{method_name(method)} for {auth.on_behalf_of[:64]!r}: the signature "
                    "does not match this server's cluster_secret"
                ),
            )
        ctx.on_behalf = (auth.on_behalf_of, auth.source_ip)

    def refuse(self, reason: str, method: int, peer: str, exc: HaError) -> HaError:
        """Count and log (at most once per 10 s) a refusal; returns ``exc`` to raise."""
        self._on_refused(reason, method)
        count = self._log.hit(time.monotonic())
        if count:
            log.warning(
                "refused %d request(s) since the last such line (latest: %s from %s, %s: %s); "
                "logged at most every %.0f s",
                count,
                method_name(method),
                peer,
                reason,
                exc,
                LOG_INTERVAL_S,
            )
        return exc

    # ---- the HA handshake ----------------------------------------------------------

    def ha_challenge(self) -> bytes:
        """A fresh random challenge (the master's, per HA connection)."""
        return secrets.token_bytes(CHALLENGE_BYTES)

    def ha_nonce(self) -> bytes:
        """The slave's own nonce, so that the master's proof is fresh too."""
        return secrets.token_bytes(NONCE_BYTES)

    def ha_master_proof(self, slave_nonce: bytes, challenge: bytes, broker_name: str) -> bytes:
        """The master's proof that it holds the secret (checked by the slave)."""
        assert self._ha_key is not None, "no cluster secret"
        payload = _fields(b"master", slave_nonce, challenge, broker_name.encode())
        return hmac.new(self._ha_key, payload, hashlib.sha256).digest()

    def ha_slave_signature(
        self, challenge: bytes, broker_name: str, broker_id: int, slave_addr: str
    ) -> bytes:
        """HMAC(secret, challenge || broker name || broker id || address): the slave's
        answer to the master's challenge."""
        assert self._ha_key is not None, "no cluster secret"
        payload = _fields(
            b"slave",
            challenge,
            broker_name.encode(),
            struct.pack(">q", broker_id),
            slave_addr.encode(),
        )
        return hmac.new(self._ha_key, payload, hashlib.sha256).digest()

    def ha_proof_ok(
        self, proof: bytes, slave_nonce: bytes, challenge: bytes, broker_name: str
    ) -> bool:
        expected = self.ha_master_proof(slave_nonce, challenge, broker_name)
        return hmac.compare_digest(expected, proof)

    def ha_signature_ok(
        self,
        signature: bytes,
        challenge: bytes,
        broker_name: str,
        broker_id: int,
        slave_addr: str,
    ) -> bool:
        expected = self.ha_slave_signature(challenge, broker_name, broker_id, slave_addr)
        return hmac.compare_digest(expected, signature)


# ---- the first scheme (registration fields only) -------------------------------------

LEGACY_MAX_SKEW_MS = 5 * 60 * 1000


def canonical(
    op: str, cluster: str, addr: str, broker_name: str, broker_id: int, ts_ms: int
) -> bytes:
    """The fields the first registration signature covered (kept for nameservers not
    yet upgraded; it covers neither the HA address, the topics nor the timeout)."""
    return "|".join((op, cluster, addr, broker_name, str(broker_id), str(ts_ms))).encode()


def sign(secret: str, payload: bytes) -> bytes:
    return hmac.new(secret.encode(), payload, hashlib.sha256).digest()


def verify(
    secret: str,
    payload: bytes,
    signature: bytes,
    ts_ms: int,
    *,
    now_ms: int | None = None,
    max_skew_ms: int = LEGACY_MAX_SKEW_MS,
) -> None:
    """Raise ``SignatureInvalid`` unless ``signature`` (first scheme) is valid and fresh."""
    now_ms = wall_ms() if now_ms is None else now_ms
    if not signature:
        raise SignatureInvalid("registration is not signed but the cluster requires a secret")
    if abs(now_ms - ts_ms) > max_skew_ms:
        raise SignatureInvalid(f"registration timestamp is {abs(now_ms - ts_ms)} ms off")
    if not hmac.compare_digest(sign(secret, payload), signature):
        raise SignatureInvalid("registration signature does not match the cluster secret")
