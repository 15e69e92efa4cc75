"""One RPC connection, symmetric: either side may send requests.

Pending calls live in ``dict[serial, Future]``; a late reply to a call that
timed out or was cancelled is dropped.  A protocol error (bad token, oversize
frame, undecodable envelope) closes the connection with one log line naming
the peer and the reason, and fails every pending call with
``ConnectionClosed`` chained to the cause.  Incoming requests are handed to a
``Dispatcher``; an unknown method gets an ERROR response, not a disconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.message import DecodeError, Message

from ha_controller.protocol import envelope
from ha_controller.protocol.codes import method_name
from ha_controller.protocol.errors import (
    BadRequest,
    BrokerUnavailable,
    ConnectionClosed,
    HaError,
    Overloaded,
    ProtocolError,
    RemoteError,
    RequestTimeout,
    ServiceStopping,
    UnknownMethod,
)
from ha_controller.protocol.framing import FrameDecoder
from ha_controller.rpc.limits import RpcLimits

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
READ_CHUNK = 256 * 1024


@dataclass(slots=True)
class RequestContext:
    conn: RpcConnection
    method: int
    received_at: float
    timeout_ms: int

    @property
    def peer(self) -> str:
        return self.conn.peer


RawHandler = Callable[[RequestContext, bytes], Awaitable[bytes | None]]


class Dispatcher:
    """method id -> handler.  Typed handlers get a parsed protobuf request."""

    def __init__(self) -> None:
        self._handlers: dict[int, RawHandler] = {}

    def add_raw(self, method: int, handler: RawHandler) -> None:
        if method in self._handlers:
            raise ValueError(f"handler for {method_name(method)} registered twice")
        self._handlers[method] = handler

    def add(
        self,
        method: int,
        request_type: type[M],
        handler: Callable[[RequestContext, M], Awaitable[Message | None]],
    ) -> None:
        async def raw(ctx: RequestContext, body: bytes) -> bytes | None:
            req = request_type()
            try:
                req.ParseFromString(body)
            except (DecodeError, ValueError, RuntimeError) as exc:
                raise BadRequest(
                    f"undecodable {request_type.__name__} for {method_name(method)}"
                ) from exc
            out = await handler(ctx, req)
            return None if out is None else out.SerializeToString()

        self.add_raw(method, raw)

    def get(self, method: int) -> RawHandler | None:
        return self._handlers.get(method)


class RpcConnection:
    """A framed connection.  Create with ``connect()`` or let ``RpcServer`` make one."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        dispatcher: Dispatcher | None = None,
        limits: RpcLimits | None = None,
        on_close: Callable[[RpcConnection], None] | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._dispatcher = dispatcher
        self.limits = limits or RpcLimits()
        self._decoder = FrameDecoder(self.limits.max_list_size, self.limits.max_frame_bytes)
        self._pending: dict[int, asyncio.Future[envelope.Response]] = {}
        self._serial = 0
        self._handlers: set[asyncio.Task[None]] = set()
        self._closed = asyncio.Event()
        self._close_reason: BaseException | None = None
        self._on_close = on_close
        self._stopping = False
        self._wbuf: list[bytes] = []
        self._flush_scheduled = False
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.attrs: dict[str, Any] = {}
        self._reader_task = asyncio.get_running_loop().create_task(
            self._read_loop(), name=f"rpc-read-{self.peer}"
        )

    # ---- public API ------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def inflight(self) -> int:
        return len(self._handlers)

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def call(self, method: int, body: bytes, timeout_ms: int | None = None) -> bytes:
        """Send a request and wait for its response data; errors are typed."""
        if self.closed:
            raise ConnectionClosed(f"connection to {self.peer} is closed") from self._close_reason
        timeout_ms = self.limits.default_timeout_ms if timeout_ms is None else timeout_ms
        serial = self._next_serial()
        fut: asyncio.Future[envelope.Response] = asyncio.get_running_loop().create_future()
        self._pending[serial] = fut
        try:
            self._write(
                envelope.encode_request(
                    serial,
                    method,
                    body,
                    timeout_ms=timeout_ms,
                    max_block_bytes=self.limits.max_block_bytes,
                )
            )
            try:
                async with asyncio.timeout(timeout_ms / 1000):
                    resp = await fut
            except TimeoutError as exc:
                raise RequestTimeout(
                    f"{method_name(method)} to {self.peer} timed out after {timeout_ms} ms"
                ) from exc
        finally:
            self._pending.pop(serial, None)
        if not resp.ok:
            raise resp.error()
        return resp.data

    async def call_pb(
        self, method: int, request: Message, response_type: type[M], timeout_ms: int | None = None
    ) -> M:
        data = await self.call(method, request.SerializeToString(), timeout_ms)
        out = response_type()
        try:
            out.ParseFromString(data)
        except (DecodeError, ValueError, RuntimeError) as exc:
            raise RemoteError(f"undecodable {response_type.__name__} from {self.peer}") from exc
        return out

    def oneway(self, method: int, body: bytes) -> None:
        """Fire a one-way request (heartbeat, notify): no response comes back."""
        if self.closed:
            raise ConnectionClosed(f"connection to {self.peer} is closed") from self._close_reason
        self._write(
            envelope.encode_request(
                self._next_serial(),
                method,
                body,
                oneway=True,
                max_block_bytes=self.limits.max_block_bytes,
            )
        )

    async def drain(self) -> None:
        if self._wbuf:
            self._flush()
        if not self.closed:
            with contextlib.suppress(ConnectionError):
                await self._writer.drain()

    def stop_accepting(self) -> None:
        """Phased shutdown: new incoming requests get ServiceStopping."""
        self._stopping = True

    async def wait_handlers(self, timeout_s: float) -> None:
        if self._handlers:
            await asyncio.wait(set(self._handlers), timeout=timeout_s)

    async def aclose(self, reason: BaseException | None = None) -> None:
        """Close the connection; idempotent."""
        self._shutdown(reason or ConnectionClosed(f"connection to {self.peer} closed locally"))
        if self._reader_task is not asyncio.current_task():
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(self._reader_task)
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.wait(set(self._handlers), timeout=1.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), 1.0)

    async def __aenter__(self) -> RpcConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- internals --------------------------------------------------------

    def _next_serial(self) -> int:
        self._serial = (self._serial + 1) & 0xFFFFFFFF or 1
        return self._serial

    def _write(self, data: bytes) -> None:
        """Queue a frame; every frame queued in one event-loop tick goes out in one
        write (one syscall instead of one per response: the profile's top frame)."""
        if self.closed:
            raise ConnectionClosed(f"connection to {self.peer} is closed") from self._close_reason
        self._wbuf.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._wbuf or self.closed:
            self._wbuf.clear()
            return
        data = self._wbuf[0] if len(self._wbuf) == 1 else b"".join(self._wbuf)
        self._wbuf.clear()
        try:
            self._writer.write(data)
        except (ConnectionError, RuntimeError) as exc:
            # pending calls fail with ConnectionClosed chained to this cause
            self._shutdown(exc)

    def _shutdown(self, reason: BaseException) -> None:
        if self._closed.is_set():
            return
        self._close_reason = reason
        self._closed.set()
        with contextlib.suppress(Exception):
            self._writer.close()
        err = ConnectionClosed(f"connection to {self.peer} closed: {reason}")
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
                # The awaiting call re-raises; mark retrieved if nobody awaits.
                fut.exception()
        self._pending.clear()
        if self._on_close is not None:
            try:
                self._on_close(self)
            except Exception:
                log.exception("on_close callback failed for %s", self.peer)

    async def _read_loop(self) -> None:
        reason: BaseException = ConnectionClosed(f"{self.peer} closed the connection")
        try:
            while True:
                data = await self._reader.read(READ_CHUNK)
                if not data:
                    if self._decoder.buffered:
                        log.warning(
                            "closing connection from %s: peer closed mid-frame (%d bytes pending)",
                            self.peer,
                            self._decoder.buffered,
                        )
                    break
                for frame in self._decoder.feed(data):
                    msg = envelope.decode(frame.serial_no, frame.payload)
                    if isinstance(msg, envelope.Response):
                        fut = self._pending.get(msg.serial_no)
                        if fut is not None and not fut.done():
                            fut.set_result(msg)
                        # else: a late reply to a cancelled/timed-out call: dropped
                    else:
                        self._on_request(msg)
        except ProtocolError as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            reason = exc
        except (ConnectionError, ssl.SSLError, OSError) as exc:
            reason = exc
        except asyncio.CancelledError:
            self._shutdown(ConnectionClosed(f"connection to {self.peer} closed locally"))
            raise
        self._shutdown(reason)

    def _on_request(self, req: envelope.Request) -> None:
        received = time.monotonic()
        if self._stopping:
            self._reply_error(req, ServiceStopping("service is stopping"))
            return
        if len(self._handlers) >= self.limits.max_inflight_requests:
            self._reply_error(
                req, Overloaded(f"more than {self.limits.max_inflight_requests} requests in flight")
            )
            return
        task = asyncio.get_running_loop().create_task(self._handle(req, received))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    def _reply_error(self, req: envelope.Request, exc: HaError) -> None:
        if req.oneway or self.closed:
            return
        with contextlib.suppress(ConnectionClosed):
            self._write(
                envelope.encode_error(
                    req.serial_no, exc, max_block_bytes=self.limits.max_block_bytes
                )
            )

    def _expired(self, req: envelope.Request, received: float) -> bool:
        return req.timeout_ms > 0 and (time.monotonic() - received) * 1000 > req.timeout_ms

    async def _handle(self, req: envelope.Request, received: float) -> None:
        handler = self._dispatcher.get(req.method) if self._dispatcher else None
        if handler is None:
            self._reply_error(req, UnknownMethod(f"unknown method {req.method}"))
            return
        ctx = RequestContext(self, req.method, received, req.timeout_ms)
        try:
            result = await handler(ctx, req.body)
        except HaError as exc:
            self._reply_error(req, exc)
            return
        except Exception as exc:
            log.exception("handler for %s from %s failed", method_name(req.method), self.peer)
            self._reply_error(req, RemoteError(f"internal error: {type(exc).__name__}: {exc}"))
            return
        if req.oneway or self.closed:
            return
        if self._expired(req, received):
            log.debug("dropping late response to %s from %s", method_name(req.method), self.peer)
            return
        with contextlib.suppress(ConnectionClosed):
            self._write(
                envelope.encode_response(
                    req.serial_no,
                    req.method,
                    result or b"",
                    max_block_bytes=self.limits.max_block_bytes,
                )
            )


async def connect(
    addr: str,
    *,
    dispatcher: Dispatcher | None = None,
    limits: RpcLimits | None = None,
    ssl_context: ssl.SSLContext | None = None,
    timeout_ms: int = 3000,
    on_close: Callable[[RpcConnection], None] | None = None,
) -> RpcConnection:
    """Open a connection to ``host:port``; raises ``BrokerUnavailable`` when it cannot."""
    host, _, port = addr.rpartition(":")
    try:
        async with asyncio.timeout(timeout_ms / 1000):
            reader, writer = await asyncio.open_connection(
                host.strip("[]"), int(port), ssl=ssl_context, limit=READ_CHUNK
            )
    except (OSError, TimeoutError, ValueError) as exc:
        raise BrokerUnavailable(f"cannot connect to {addr}: {exc}") from exc
    return RpcConnection(reader, writer, dispatcher=dispatcher, limits=limits, on_close=on_close)
