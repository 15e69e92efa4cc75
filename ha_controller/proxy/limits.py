"""The gateway's per-call bounds: what one gRPC call, one client and all clients together
may ask of it, and how a refusal is told (docs/grpc.md, "Bounds").

- A request that is not a valid protobuf message ends with ``INVALID_ARGUMENT``.  gRPC's
  asyncio server would log a traceback per call (its ``Unexpected [DecodeError] raised
  by servicer method`` line) and answer ``UNKNOWN``: the deserializer installed here
  never raises, it hands the handler a :class:`Malformed` marker instead.
- Calls in progress are counted per ``x-mq-client-id`` and in total, ReceiveMessage
  long polls also on their own (:class:`Admission`); one more is refused with
  ``RESOURCE_EXHAUSTED`` naming the limit (the config key) before the servicer runs.
- A SendMessage with more than ``max_messages_per_send`` messages is answered, before
  anything is sent, with the v2 status the RocketMQ API defines for a request larger
  than the server's limits, ``PAYLOAD_TOO_LARGE`` (:meth:`CallBounds.send_refusal`).
- ``max_request_bytes`` is gRPC's own receive limit (:func:`server_options`): a larger
  request is refused by gRPC with ``RESOURCE_EXHAUSTED`` before the gateway reads it.

Every refusal is counted in ``hac_proxy_refused_total{reason}`` (the reason is the
limit's config key, or ``malformed``) and logged once per kind per
:data:`LOG_INTERVAL_S` with the number of refusals the line stands for
(:class:`ThrottledLog`).

Admission happens in the handler, not in :meth:`CallBounds.intercept_service`: gRPC
calls the interceptor before it reads the request, and a call that never gets a request
(refused by gRPC for its size, or cancelled at once) never runs its handler, so a slot
taken there would never be given back.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NoReturn

import grpc

from ha_controller.config import ProxyConfig
from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
from ha_controller.proxy.metrics import ProxyMetrics
from ha_controller.rpc.bounds import Throttle

__all__ = [
    "LOG_INTERVAL_S",
    "REFUSAL_REASONS",
    "Admission",
    "CallBounds",
    "Malformed",
    "ThrottledLog",
    "server_options",
]

log = logging.getLogger(__name__)

#: one log line per kind of refusal (or failure) at most this often
LOG_INTERVAL_S: Final = 10.0
#: reasons of ``hac_proxy_refused_total``
REFUSAL_REASONS: Final = (
    "malformed",
    "max_messages_per_send",
    "max_concurrent_calls",
    "max_concurrent_calls_per_client",
    "max_concurrent_receives",
    "max_concurrent_receives_per_client",
)
#: gRPC's backlog of calls it accepted that the gateway has not picked up yet is at
#: least this (see :func:`server_options`)
PENDING_CALLS_FLOOR: Final = 16384
CLIENT_ID_HEADER: Final = "x-mq-client-id"
RECEIVE_METHOD: Final = "/apache.rocketmq.v2.MessagingService/ReceiveMessage"

if TYPE_CHECKING:
    _Handler = grpc.RpcMethodHandler[Any, Any]
    _Context = grpc.aio.ServicerContext[Any, Any]
else:
    _Handler = grpc.RpcMethodHandler
    _Context = grpc.aio.ServicerContext


def server_options(cfg: ProxyConfig) -> list[tuple[str, int]]:
    """gRPC server options that follow from the gateway's bounds.

    gRPC holds the calls it accepted until the asyncio server picks them up, one at a
    time.  Past ``grpc.server.max_pending_requests`` (default 1000) it drops some of
    them at random, and all past the hard limit (3000): the client sees ``CANCELLED``
    with no status, which is what 3000 concurrent ReceiveMessage calls met.  The
    gateway refuses excess calls itself, at once and with a status, so the backlog is
    made large enough for any burst it can answer: the streams it holds are already
    read off the connection, and dropping them saves little."""
    pending = max(PENDING_CALLS_FLOOR, 2 * cfg.max_concurrent_calls)
    return [
        ("grpc.max_receive_message_length", cfg.max_request_bytes),
        ("grpc.server.max_pending_requests", pending),
        ("grpc.server.max_pending_requests_hard_limit", pending),
    ]


def client_id(context: _Context) -> str:
    """The call's ``x-mq-client-id`` ("" when it has none)."""
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_HEADER:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return ""


class Admission:
    """Calls in progress, per client and in total, as a plain object.

    ``admit(client)`` takes a slot and returns None, or returns the key of the limit
    that refuses it (the client's own limit is named first); ``release(client)`` gives
    a slot back.  Clients with no slot are forgotten, so the table holds at most
    ``total`` clients.
    """

    def __init__(self, *, total: int, per_client: int, total_key: str, per_client_key: str):
        self.total = total
        self.per_client = per_client
        self.total_key = total_key
        self.per_client_key = per_client_key
        self.active = 0
        self._by_client: dict[str, int] = {}

    def held(self, client: str) -> int:
        return self._by_client.get(client, 0)

    def admit(self, client: str) -> str | None:
        held = self._by_client.get(client, 0)
        if held >= self.per_client:
            return self.per_client_key
        if self.active >= self.total:
            return self.total_key
        self._by_client[client] = held + 1
        self.active += 1
        return None

    def release(self, client: str) -> None:
        held = self._by_client.get(client, 0)
        if held <= 0:
            raise ValueError(f"client {client[:64]!r} holds no slot")
        if held == 1:
            del self._by_client[client]
        else:
            self._by_client[client] = held - 1
        self.active -= 1


class ThrottledLog:
    """One log line per kind per interval; a line says how many it stands for."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._interval_s = interval_s
        self._clock = clock
        self._throttles: dict[str, Throttle] = {}

    def __call__(self, kind: str, level: int, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless a line of ``kind`` went out less than an interval
        ago; True when it was logged.  ``kind`` must come from a small set."""
        throttle = self._throttles.get(kind)
        if throttle is None:
            throttle = self._throttles[kind] = Throttle(self._interval_s)
        count = throttle.hit(self._clock())
        if not count:
            return False
        if count > 1:
            self._log.log(level, msg + " (%d like it since the last such line)", *args, count)
        else:
            self._log.log(level, msg, *args)
        return True


@dataclass(frozen=True)
class Malformed:
    """What the handler gets instead of a request that could not be parsed."""

    error: str


def _safe(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def parse(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        # any failure of the generated parser means the bytes are not the message
        except Exception as exc:  # noqa: BLE001 - not swallowed: the call ends INVALID_ARGUMENT
            return Malformed(f"{type(exc).__name__}: {str(exc)[:200]}")

    return parse


class CallBounds(grpc.aio.ServerInterceptor):
    """The interceptor that enforces the bounds on every call of the gateway's server."""

    def __init__(self, cfg: ProxyConfig, metrics: ProxyMetrics) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.calls = Admission(
            total=cfg.max_concurrent_calls,
            per_client=cfg.max_concurrent_calls_per_client,
            total_key="max_concurrent_calls",
            per_client_key="max_concurrent_calls_per_client",
        )
        self.receives = Admission(
            total=cfg.max_concurrent_receives,
            per_client=cfg.max_concurrent_receives_per_client,
            total_key="max_concurrent_receives",
            per_client_key="max_concurrent_receives_per_client",
        )
        self.log = ThrottledLog(log)
        for reason in REFUSAL_REASONS:
            metrics.refused.labels(reason=reason)

    # ---- refusals -------------------------------------------------------------------

    def send_refusal(self, count: int, client: str) -> v2.Status | None:
        """The status of a SendMessage of ``count`` messages: None when it may go on."""
        limit = self.cfg.max_messages_per_send
        if count <= limit:
            return None
        reason = "max_messages_per_send"
        text = (
            f"{count} messages in one SendMessage; the gateway takes at most {limit} "
            f"per call ({reason}): send them in smaller batches"
        )
        self._count(reason, "SendMessage", client, f"{count} messages, at most {limit}")
        return v2.Status(code=v2.PAYLOAD_TOO_LARGE, message=text)

    def _count(self, reason: str, method: str, client: str, detail: str) -> None:
        self.metrics.refused.labels(reason=reason).inc()
        self.log(
            reason,
            logging.WARNING,
            "refused %s of client %r: %s (%s)",
            method,
            client[:64],
            reason,
            detail,
        )

    async def _refuse(self, reason: str, method: str, client: str, context: _Context) -> NoReturn:
        limit = getattr(self.cfg, reason)
        who = f" for client {client[:64]!r}" if reason.endswith("_per_client") else ""
        self._count(reason, method, client, f"{limit} reached")
        await context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{reason} ({limit}) reached{who}: {method} refused, retry later",
        )

    async def _malformed(self, method: str, bad: Malformed, context: _Context) -> NoReturn:
        text = f"{method}: the request is not a valid protobuf message ({bad.error})"
        self.metrics.refused.labels(reason="malformed").inc()
        self.log(
            "malformed",
            logging.WARNING,
            "refused a malformed %s request from %s (client %r): %s",
            method,
            context.peer(),
            client_id(context)[:64],
            bad.error,
        )
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, text)

    # ---- admission ----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _slot(self, method: str, context: _Context, *, receive: bool) -> AsyncIterator[None]:
        client = client_id(context)
        reason = self.calls.admit(client)
        if reason is None and receive:
            reason = self.receives.admit(client)
            if reason is not None:
                self.calls.release(client)
        if reason is not None:
            await self._refuse(reason, method, client, context)
        self.metrics.calls.inc()
        try:
            yield
        finally:
            self.metrics.calls.dec()
            self.calls.release(client)
            if receive:
                self.receives.release(client)

    # ---- handlers -----------------------------------------------------------------

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        handler: _Handler | None = await continuation(handler_call_details)
        if handler is None:
            return None
        method = str(handler_call_details.method)
        return self.bounded(handler, method)

    def bounded(self, handler: _Handler, method: str) -> _Handler:
        """``handler`` with a deserializer that never raises, and admission."""
        name = method.rsplit("/", 1)[-1]
        receive = method == RECEIVE_METHOD
        parse = _safe(handler.request_deserializer)
        out = handler.response_serializer
        if not handler.request_streaming:
            inner = handler.unary_stream if handler.response_streaming else handler.unary_unary
            assert inner is not None
            if handler.response_streaming and inspect.isasyncgenfunction(inner):
                return grpc.unary_stream_rpc_method_handler(
                    self._unary_stream(name, inner, receive=receive), parse, out
                )
            wrapped = self._unary(name, inner, receive=receive)
            if handler.response_streaming:
                return grpc.unary_stream_rpc_method_handler(wrapped, parse, out)
            return grpc.unary_unary_rpc_method_handler(wrapped, parse, out)
        inner = handler.stream_stream if handler.response_streaming else handler.stream_unary
        assert inner is not None
        if handler.response_streaming and inspect.isasyncgenfunction(inner):
            return grpc.stream_stream_rpc_method_handler(
                self._stream_stream(name, inner), parse, out
            )
        wrapped = self._stream(name, inner)
        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(wrapped, parse, out)
        return grpc.stream_unary_rpc_method_handler(wrapped, parse, out)

    def _unary(self, name: str, inner: Any, *, receive: bool) -> Any:
        """A unary-request handler that answers (or writes) and returns."""

        async def handler(request: Any, context: _Context) -> Any:
            if isinstance(request, Malformed):
                await self._malformed(name, request, context)
            async with self._slot(name, context, receive=receive):
                return await inner(request, context)

        return handler

    def _unary_stream(self, name: str, inner: Any, *, receive: bool) -> Any:
        """A unary-request handler that is an async generator of responses."""

        async def handler(request: Any, context: _Context) -> AsyncIterator[Any]:
            if isinstance(request, Malformed):
                await self._malformed(name, request, context)
            async with self._slot(name, context, receive=receive):
                async for response in inner(request, context):
                    yield response

        return handler

    def _stream(self, name: str, inner: Any) -> Any:
        """A streaming-request handler that answers (or writes) and returns.  A stream
        whose first request is malformed ends INVALID_ARGUMENT before the handler runs;
        a later malformed request ends the stream the handler reads, and once the
        handler is done, the call ends INVALID_ARGUMENT."""

        async def handler(request_iterator: Any, context: _Context) -> Any:
            bad: list[Malformed] = []
            async with self._slot(name, context, receive=False):
                requests = await self._checked(name, request_iterator, bad, context)
                result = await inner(requests, context)
            if bad:
                await self._malformed(name, bad[0], context)
            return result

        return handler

    def _stream_stream(self, name: str, inner: Any) -> Any:
        async def handler(request_iterator: Any, context: _Context) -> AsyncIterator[Any]:
            bad: list[Malformed] = []
            async with self._slot(name, context, receive=False):
                requests = await self._checked(name, request_iterator, bad, context)
                async for response in inner(requests, context):
                    yield response
            if bad:
                await self._malformed(name, bad[0], context)

        return handler

    async def _checked(
        self, name: str, requests: AsyncIterator[Any], bad: list[Malformed], context: _Context
    ) -> AsyncIterator[Any]:
        """``requests`` for the handler, its first one already read: a malformed one
        ends the call at once."""
        iterator = aiter(requests)
        try:
            first = await anext(iterator)
        except StopAsyncIteration:
            return _no_requests()
        if isinstance(first, Malformed):
            await self._malformed(name, first, context)
        return _until_malformed(first, iterator, bad)


async def _no_requests() -> AsyncIterator[Any]:
    return
    yield  # an async generator that yields nothing


async def _until_malformed(
    first: Any, requests: AsyncIterator[Any], bad: list[Malformed]
) -> AsyncIterator[Any]:
    """``first``, then ``requests`` up to the first malformed one, which goes to ``bad``."""
    yield first
    async for request in requests:
        if isinstance(request, Malformed):
            bad.append(request)
            return
        yield request
