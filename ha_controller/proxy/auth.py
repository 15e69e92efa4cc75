"""The gateway's side of the client ACL: the official SDKs' ``Credentials``.

A RocketMQ 5 SDK built with ``Credentials(access_key, secret_key)`` sends, with every
gRPC call, the metadata ``x-mq-date-time`` (``%Y%m%dT%H%M%SZ``) and

    authorization: MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time, Signature=<hex>

where the signature is the hex HMAC-SHA1 of the ``x-mq-date-time`` value keyed with the
secret key (``rocketmq.v5.util.signature`` in rocketmq-python-client; the Java and Go
SDKs do the same).  :class:`GatewayAuth` checks it against the users of the gateway's
ACL table (:mod:`ha_controller.acl`: the users file at start, then the cluster's
runtime table, fetched from the nameservers every second), and
:class:`AuthInterceptor` then authorises the call by what it touches
(:data:`ha_controller.acl.rules.GRPC_RULES`, as RocketMQ's proxy does), before the
servicer runs: a refusal is the call's ``FORBIDDEN`` status.  A client id
(``x-mq-client-id``) belongs to the user that first used it; another user's call with
it is refused, so nobody can take over another application's telemetry stream (and
the transaction checks it carries).

Every request the gateway sends to brokers and nameservers for a call is signed with
the cluster secret *on behalf of* that user and the client's address
(:meth:`ha_controller.auth.ClusterAuth.sign_on_behalf`): the brokers authorise it as
that user again (END_TRANSACTION against the half message's real topic, which only
the broker holding it knows).  Without a cluster secret the gateway signs as the user
with the user's own key.  Its own requests (broker heartbeats, route refreshes outside
any call, the ACL table) are signed with the cluster secret.

The SDK signs only a timestamp, not the request: anyone who captures the metadata can
reuse it, with any request, while the timestamp is within :data:`MAX_SKEW_S`; run the
gateway with TLS (docs/security.md).  The Python SDK writes its *local* time with a
``Z``; either reading (UTC or the gateway's local time) within the window is accepted.
"""

from __future__ import annotations

import contextvars
import hmac
import ipaddress
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from hashlib import sha1
from typing import TYPE_CHECKING, Any, Final

import grpc
from google.protobuf.message import Message as PbMessage

from ha_controller.acl import Acl, Credentials, User
from ha_controller.acl.authorizer import peer_ip
from ha_controller.acl.rules import GRPC_RULES, Need, grpc_settings_need
from ha_controller.auth import ClusterAuth, wall_ms
from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s
from ha_controller.protocol.envelope import RequestAuth
from ha_controller.protocol.errors import AccessDenied
from ha_controller.rpc.bounds import Throttle

log = logging.getLogger(__name__)

__all__ = [
    "AuthInterceptor",
    "Caller",
    "GatewayAuth",
    "parse_authorization",
    "sdk_signature",
]

AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
CLIENT_ID = "x-mq-client-id"
ALGORITHM = "MQv2-HMAC-SHA1"
DATE_FORMAT = "%Y%m%dT%H%M%SZ"
#: how far the SDK's ``x-mq-date-time`` may be from the gateway's clock
MAX_SKEW_S = 15 * 60
#: client ids remembered with their owner: per user, and in all
MAX_CLIENT_IDS_PER_USER: Final = 10_000
MAX_CLIENT_IDS: Final = 200_000
#: a client id unused this long is forgotten (the SDKs heartbeat every 10 s)
CLIENT_ID_EXPIRY_S: Final = 120.0

_AUTH_RE = re.compile(
    r"MQv2-HMAC-SHA1\s+Credential=(?P<ak>[^,\s]*),\s*SignedHeaders=(?P<headers>[^,\s]+),"
    r"\s*Signature=(?P<sig>[0-9A-Fa-f]+)\s*",
    re.ASCII,
)

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class Caller:
    """The client of the gRPC call being served: its user (None: anonymous) and
    address."""

    user: User | None
    ip: IpAddress | None
    source: str = ""


class _Background:
    """The marker of "no client call": the gateway's own requests."""


_BACKGROUND = _Background()
#: the caller of the gRPC call being served
_CALLER: contextvars.ContextVar[Caller | _Background] = contextvars.ContextVar(
    "hac_gateway_caller", default=_BACKGROUND
)


def sdk_signature(secret_key: str, date_time: str) -> str:
    """What an SDK sends as ``Signature=``: hex HMAC-SHA1 of the date-time value."""
    return hmac.new(secret_key.encode(), date_time.encode(), sha1).hexdigest()


def parse_authorization(value: str) -> tuple[str, str, str]:
    """``(access key, signed headers, signature)`` of an ``authorization`` value;
    ``AccessDenied`` when it is not the SDKs' ``MQv2-HMAC-SHA1`` form."""
    match = _AUTH_RE.fullmatch(value.strip())
    if match is None:
        raise AccessDenied(
            f"the authorization metadata is not '{ALGORITHM} Credential=<access key>, "
            "SignedHeaders=x-mq-date-time, Signature=<hex>'"
        )
    return match["ak"], match["headers"], match["sig"].lower()


def _metadata(pairs: Sequence[tuple[str, str | bytes]] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in pairs or ():
        out[key.lower()] = value if isinstance(value, str) else value.decode(errors="replace")
    return out


def _within(date_time: str, now: float, window_s: float) -> bool:
    try:
        naive = datetime.strptime(date_time, DATE_FORMAT)
    except ValueError:
        return False
    as_utc = naive.replace(tzinfo=UTC).timestamp()
    as_local = naive.timestamp()  # the Python SDK's local time marked Z
    return abs(now - as_utc) <= window_s or abs(now - as_local) <= window_s


def grpc_peer_ip(peer: str | None) -> IpAddress | None:
    """The IP of a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``)."""
    if not peer:
        return None
    _, _, rest = peer.partition(":")
    return peer_ip(rest or peer)


class ClientIds:
    """Which user each client id belongs to (bounded; unused ids expire)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._owner: dict[str, tuple[str, float]] = {}
        self._per_user: dict[str, int] = {}
        self._next_sweep = 0.0

    def _sweep(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + 5.0
        for cid in [c for c, (_, t) in self._owner.items() if now - t > CLIENT_ID_EXPIRY_S]:
            self._forget(cid)

    def _forget(self, cid: str) -> None:
        owner, _ = self._owner.pop(cid)
        left = self._per_user[owner] - 1
        if left:
            self._per_user[owner] = left
        else:
            del self._per_user[owner]

    def claim(self, cid: str, user: str) -> str | None:
        """None when ``cid`` is ``user``'s (now or from here on), else why not."""
        now = self._clock()
        self._sweep(now)
        held = self._owner.get(cid)
        if held is not None:
            if held[0] != user:
                return f"client id {cid[:64]!r} belongs to another user"
            self._owner[cid] = (user, now)
            return None
        if len(self._owner) >= MAX_CLIENT_IDS or (
            self._per_user.get(user, 0) >= MAX_CLIENT_IDS_PER_USER
        ):
            return "too many client ids in use"
        self._owner[cid] = (user, now)
        self._per_user[user] = self._per_user.get(user, 0) + 1
        return None

    def owner(self, cid: str) -> str | None:
        held = self._owner.get(cid)
        return None if held is None else held[0]


class GatewayAuth:
    """Verifies the SDKs' credentials, authorises their calls and signs the gateway's
    downstream requests."""

    def __init__(
        self,
        acl: Acl,
        cluster: ClusterAuth | None = None,
        *,
        clock_s: Callable[[], float] = lambda: wall_ms() / 1000,
        max_skew_s: float = MAX_SKEW_S,
    ) -> None:
        self.acl = acl
        self.cluster = cluster or ClusterAuth(None)
        self._clock_s = clock_s
        self.max_skew_s = max_skew_s
        self.client_ids = ClientIds()
        #: a caller's client address, by client id (for the checks sent to it)
        self.client_ips: dict[str, IpAddress | None] = {}
        self._credentials: dict[tuple[str, str], Credentials] = {}

    @classmethod
    def from_config(
        cls, cfg: Any, *, on_denied: Callable[[int, str], None] | None = None
    ) -> GatewayAuth:
        """From a :class:`~ha_controller.config.ProxyConfig` (``acl``, ``cluster_secret``)."""
        acl = Acl.from_config(cfg.acl, on_denied=on_denied)
        return cls(acl, ClusterAuth(cfg.cluster_secret, sign_all=True))

    # ---- who -------------------------------------------------------------------------

    def identify(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> User | None:
        """The user a call's metadata proves (None: anonymous, allowed).  Raises
        ``AccessDenied`` naming the problem: no credentials while anonymous access is
        off, an unknown or disabled user, a bad signature or an old date-time."""
        if not self.acl.enabled:
            return None
        meta = _metadata(metadata)
        value = meta.get(AUTHORIZATION)
        if not value:  # no credentials at all
            if not self.acl.allow_anonymous:
                raise AccessDenied(
                    "this cluster does not allow anonymous access: build the client with "
                    "Credentials(access_key, secret_key)"
                )
            return None
        ak, headers, signature = parse_authorization(value)
        if not ak:  # an SDK built with empty Credentials() signs as nobody
            if not self.acl.allow_anonymous:
                raise AccessDenied(
                    "this cluster does not allow anonymous access: the client's Credentials "
                    "have no access key"
                )
            return None
        assert self.acl.holder is not None
        user = self.acl.holder.user(ak)
        if user is None:
            raise AccessDenied(f"unknown access key {ak[:64]!r}")
        if headers.lower() != DATE_TIME:
            raise AccessDenied(f"SignedHeaders must be {DATE_TIME}, not {headers[:64]!r}")
        date_time = meta.get(DATE_TIME, "")
        if not _within(date_time, self._clock_s(), self.max_skew_s):
            raise AccessDenied(
                f"{DATE_TIME} {date_time[:32]!r} is missing or more than {self.max_skew_s:.0f} s "
                "from the gateway's clock"
            )
        if not hmac.compare_digest(sdk_signature(user.password, date_time), signature):
            raise AccessDenied(f"the signature does not match access key {ak!r}'s secret key")
        if not user.enabled:
            raise AccessDenied(f"user {ak!r} is disabled")
        return user

    # ---- what ------------------------------------------------------------------------

    def refusal(
        self, method: str, user: User | None, need: Need, ip: IpAddress | None
    ) -> str | None:
        """None when ``user`` may do what ``need`` says from ``ip``, else why not."""
        if user is None or not self.acl.enabled:
            return None
        try:
            self.acl.authorize(0, user, need, ip, name=method)
        except AccessDenied as exc:
            return str(exc)
        return None

    def allows(self, username: str | None, need: Need, ip: IpAddress | None) -> bool:
        """Whether the owner of a client id ("" or None: anonymous) may do what ``need``
        says (the gateway's check-back to producers)."""
        return self.acl.permits(username or None, need, ip)

    def call_refusal(self, method: str, request: Any, caller: Caller) -> str | None:
        rule = GRPC_RULES.get(method)
        if rule is None or rule.need is None:
            return None
        return self.refusal(method, caller.user, rule.need(request), caller.ip)

    def settings_refusal(self, settings: Any) -> str | None:
        """Telemetry's settings command of the current caller (RocketMQ's proxy)."""
        caller = _CALLER.get()
        if not isinstance(caller, Caller):
            return None
        return self.refusal("Telemetry", caller.user, grpc_settings_need(settings), caller.ip)

    # ---- downstream --------------------------------------------------------------------

    def signer(self, method: int, body: bytes) -> RequestAuth | None:
        """The ``Signer`` of the gateway's pools: for the caller of the gRPC call being
        served (on its behalf, with the cluster secret), else (the gateway's own work)
        with the cluster secret."""
        caller = _CALLER.get()
        if isinstance(caller, _Background):
            return self.cluster.sign(method, body)
        if caller.user is None:
            return None
        if self.cluster.enabled:
            return self.cluster.sign_on_behalf(method, body, caller.user.username, caller.source)
        key = (caller.user.username, caller.user.password)
        creds = self._credentials.get(key)
        if creds is None:
            if len(self._credentials) > 10_000:
                self._credentials.clear()
            creds = self._credentials[key] = Credentials(*key)
        return creds.sign(method, body)

    @staticmethod
    def serve_as(user: User | None, ip: IpAddress | None = None) -> None:
        """Make ``user`` (from ``ip``) the caller of the current call (its context and
        the tasks it starts)."""
        _CALLER.set(Caller(user, ip, str(ip) if ip is not None else ""))

    @staticmethod
    def caller() -> Caller | None:
        c = _CALLER.get()
        return c if isinstance(c, Caller) else None


if TYPE_CHECKING:
    _Handler = grpc.RpcMethodHandler[Any, Any]
else:
    _Handler = grpc.RpcMethodHandler

_SERVICE = v2s.DESCRIPTOR.services_by_name["MessagingService"]


def _forbidden_response(method: str, code: Any, text: str) -> PbMessage:
    """The method's response with a refusal status (RocketMQ's proxy answers an
    authorization failure with FORBIDDEN in the status, not a gRPC error)."""
    out_type = _SERVICE.methods_by_name[method].output_type
    cls = getattr(v2s, out_type.name)
    resp: PbMessage = cls()
    resp.status.CopyFrom(v2.Status(code=code, message=text))  # type: ignore[attr-defined]
    return resp


def _refusal(handler: _Handler, exc: AccessDenied) -> _Handler:
    """A handler of the same kind that aborts the call with UNAUTHENTICATED."""

    async def abort(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))

    return _same_kind(handler, abort, abort, abort, abort)


def _same_kind(handler: _Handler, uu: Any, us: Any, su: Any, ss: Any) -> _Handler:
    kw = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(ss, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(su, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(us, **kw)
    return grpc.unary_unary_rpc_method_handler(uu, **kw)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks every call's credentials and client id, and authorises it by what it
    touches, before its handler runs; the handler then runs as that user
    (:meth:`GatewayAuth.serve_as`)."""

    def __init__(self, auth: GatewayAuth) -> None:
        self.auth = auth
        #: one line per interval for refused calls (a client could flood the log)
        self._refusals = Throttle(10.0)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        auth = self.auth
        metadata = handler_call_details.invocation_metadata
        try:
            user = auth.identify(metadata)
        except AccessDenied as exc:
            auth.acl.log_denied("gateway client", exc)
            handler = await continuation(handler_call_details)
            return _refusal(handler, exc) if handler is not None else handler
        handler = await continuation(handler_call_details)
        if handler is None or not auth.acl.enabled:
            GatewayAuth.serve_as(user)
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        cid = _metadata(metadata).get(CLIENT_ID, "")
        return self._wrap(handler, method, user, cid)

    def _wrap(self, handler: _Handler, method: str, user: User | None, cid: str) -> _Handler:
        auth = self.auth
        behaviour: Any = handler  # the aio behaviours are coroutines / async generators

        def admit(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
            ip = grpc_peer_ip(context.peer())
            GatewayAuth.serve_as(user, ip)
            if cid:
                why = auth.client_ids.claim(cid, user.username if user is not None else "")
                if why is not None:
                    return f"{method}: {why}"
                auth.client_ips[cid] = ip
                if len(auth.client_ips) > MAX_CLIENT_IDS:
                    auth.client_ips.clear()
            if request is None:
                return None
            caller = GatewayAuth.caller()
            assert caller is not None
            return auth.call_refusal(method, request, caller)

        def refused(why: str) -> PbMessage:
            count = self._refusals.hit(time.monotonic())
            if count:
                log.info(
                    "gateway call refused: %s (%d refusal(s) since the last such line; "
                    "logged at most every %.0f s)",
                    why,
                    count,
                    self._refusals.interval_s,
                )
            return _forbidden_response(method, v2.FORBIDDEN, why)

        async def uu(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            why = admit(request, context)
            if why is not None:
                return refused(why)
            return await behaviour.unary_unary(request, context)

        async def us(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            why = admit(request, context)
            if why is not None:
                yield refused(why)
                return
            async for item in behaviour.unary_stream(request, context):
                yield item

        async def ss(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            why = admit(None, context)
            if why is not None:
                await context.write(refused(why))
                return None
            return await behaviour.stream_stream(requests, context)

        async def su(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            why = admit(None, context)
            if why is not None:
                return refused(why)
            return await behaviour.stream_unary(requests, context)

        return _same_kind(handler, uu, us, su, ss)
