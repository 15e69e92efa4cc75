"""The gateway's side of the client ACL: the official SDKs' ``Credentials``.

A RocketMQ 5 SDK built with ``Credentials(access_key, secret_key)`` sends, with every
gRPC call, the metadata ``x-mq-date-time`` (``%Y%m%dT%H%M%SZ``) and

    authorization: MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time, Signature=<hex>

where the signature is the hex HMAC-SHA1 of the ``x-mq-date-time`` value keyed with the
secret key (``rocketmq.v5.util.signature`` in rocketmq-python-client; the Java and Go
SDKs do the same).  :class:`GatewayAuth` checks it against the users of the gateway's
``[acl]`` file (:mod:`ha_controller.acl`), and the gateway then signs every request it
sends to brokers and nameservers on that call's behalf as that user
(:meth:`GatewayAuth.signer`): the brokers enforce the user's permissions.  Its own
requests (broker heartbeats, route refreshes outside any call) are signed with the
cluster secret when it has one.

The SDK signs only a timestamp, not the request: anyone who captures the metadata can
reuse it, with any request, while the timestamp is within :data:`MAX_SKEW_S`; run the
gateway with TLS (docs/security.md).  The Python SDK writes its *local* time with a
``Z``; either reading (UTC or the gateway's local time) within the window is accepted.
"""

from __future__ import annotations

import contextvars
import hmac
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from hashlib import sha1
from typing import TYPE_CHECKING, Any

import grpc

from ha_controller.acl import Acl, AclUser, Credentials
from ha_controller.auth import ClusterAuth
from ha_controller.protocol.envelope import RequestAuth
from ha_controller.protocol.errors import AccessDenied

log = logging.getLogger(__name__)

__all__ = ["AuthInterceptor", "GatewayAuth", "parse_authorization", "sdk_signature"]

AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
ALGORITHM = "MQv2-HMAC-SHA1"
DATE_FORMAT = "%Y%m%dT%H%M%SZ"
#: how far the SDK's ``x-mq-date-time`` may be from the gateway's clock
MAX_SKEW_S = 15 * 60

_AUTH_RE = re.compile(
    r"MQv2-HMAC-SHA1\s+Credential=(?P<ak>[^,\s]*),\s*SignedHeaders=(?P<headers>[^,\s]+),"
    r"\s*Signature=(?P<sig>[0-9A-Fa-f]+)\s*",
    re.ASCII,
)


class _Background:
    """The marker of "no client call": the gateway's own requests."""


_BACKGROUND = _Background()
#: the user of the gRPC call being served (None: anonymous)
_CALLER: contextvars.ContextVar[Credentials | _Background | None] = contextvars.ContextVar(
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


class GatewayAuth:
    """Verifies the SDKs' credentials and signs the gateway's downstream requests."""

    def __init__(
        self,
        acl: Acl,
        cluster: ClusterAuth | None = None,
        *,
        clock_s: Callable[[], float] = time.time,
        max_skew_s: float = MAX_SKEW_S,
    ) -> None:
        self.acl = acl
        self.cluster = cluster or ClusterAuth(None)
        self._clock_s = clock_s
        self.max_skew_s = max_skew_s

    @classmethod
    def from_config(
        cls, cfg: Any, *, on_denied: Callable[[int, str], None] | None = None
    ) -> GatewayAuth:
        """From a :class:`~ha_controller.config.ProxyConfig` (``acl``, ``cluster_secret``)."""
        acl = Acl.from_config(cfg.acl, on_denied=on_denied)
        return cls(acl, ClusterAuth(cfg.cluster_secret, sign_all=True))

    def identify(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> AclUser | None:
        """The user a call's metadata proves (None: anonymous, allowed).  Raises
        ``AccessDenied`` naming the problem: no credentials while anonymous access is
        off, an unknown access key, a bad signature or an old date-time."""
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
        assert self.acl.users is not None
        user = self.acl.users.get(ak)
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
        if not hmac.compare_digest(sdk_signature(user.secret_key, date_time), signature):
            raise AccessDenied(f"the signature does not match access key {ak!r}'s secret key")
        return user

    def signer(self, method: int, body: bytes) -> RequestAuth | None:
        """The ``Signer`` of the gateway's pools: as the caller of the gRPC call being
        served, else (the gateway's own work) with the cluster secret."""
        caller = _CALLER.get()
        if isinstance(caller, _Background):
            return self.cluster.sign(method, body)
        return caller.sign(method, body) if caller is not None else None

    @staticmethod
    def serve_as(user: AclUser | None) -> None:
        """Make ``user`` the caller of the current call (its context and the tasks it
        starts)."""
        _CALLER.set(user.credentials if user is not None else None)


if TYPE_CHECKING:
    _Handler = grpc.RpcMethodHandler[Any, Any]
else:
    _Handler = grpc.RpcMethodHandler


def _refusal(handler: _Handler, exc: AccessDenied) -> _Handler:
    """A handler of the same kind that aborts the call with UNAUTHENTICATED."""

    async def abort(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            abort,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(
            abort,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            abort,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return grpc.unary_unary_rpc_method_handler(
        abort,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks every call's credentials before its handler runs; the handler then runs
    as that user (:meth:`GatewayAuth.serve_as`)."""

    def __init__(self, auth: GatewayAuth) -> None:
        self.auth = auth

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        try:
            user = self.auth.identify(handler_call_details.invocation_metadata)
        except AccessDenied as exc:
            self.auth.acl.log_denied("gateway client", exc)
            handler = await continuation(handler_call_details)
            return _refusal(handler, exc) if handler is not None else handler
        GatewayAuth.serve_as(user)
        return await continuation(handler_call_details)
