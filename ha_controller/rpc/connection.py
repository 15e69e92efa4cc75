"""One RPC connection, symmetric: either side may send requests.

Pending calls live in ``dict[serial, Future]``; a late reply to a call that
timed out or was cancelled is dropped.  A protocol error (bad token, oversize
frame, undecodable envelope) closes the connection with one log line naming
the peer and the reason, and fails every pending call with
``ConnectionClosed`` chained to the cause.  Incoming requests are handed to a
``Dispatcher``; an unknown method gets an ERROR response, not a disconnect.

The connection is an ``asyncio.BufferedProtocol``: the transport reads straight into
a per-thread scratch buffer of at most as many bytes as the connection may take, and
the frame decoder keeps only the incomplete frame.  A connection accepted by an
``RpcServer`` (it has a :class:`Listener`) is bounded as ``RpcLimits`` describes: its
incomplete frame draws on the listener's assembly budget beyond its own allowance,
reading pauses while its replies are not read, and the server's sweep applies the
frame deadline and the idle timeout.  An outgoing connection only keeps the frame
bounds: it is ours, and it must always read the replies it waits for (two peers that
both stopped reading while their writes back up would deadlock).

A TLS mismatch is named, not reported as a closed connection (:mod:`.tls`): a
plaintext listener answers a TLS handshake with one line of text, which the TLS
client reports as ``TlsMismatch``; a plaintext outgoing connection that reads a TLS
record fails its calls with ``TlsMismatch``; TLS failures after the handshake (a
client certificate the server refused) fail the pending calls with ``TlsError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from google.protobuf.message import DecodeError, Message

from ha_controller.protocol import envelope
from ha_controller.protocol.codes import RequestCode, method_name
from ha_controller.protocol.errors import (
    BadRequest,
    BrokerUnavailable,
    ConnectionClosed,
    FrameTimeout,
    HaError,
    Overloaded,
    ProtocolError,
    RemoteError,
    RequestTimeout,
    ServiceStopping,
    TlsClosedEarly,
    TlsError,
    TlsMismatch,
    UnknownMethod,
)
from ha_controller.protocol.framing import FrameDecoder
from ha_controller.rpc.bounds import AssemblyBudget, RpcStats
from ha_controller.rpc.limits import RpcLimits
from ha_controller.rpc.tls import (
    NOT_TLS_REPLY,
    handshake_error,
    looks_like_tls,
    plaintext_to_tls_hint,
    session_error,
)

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
READ_CHUNK = 256 * 1024
#: bytes a connection first asks the assembly budget for (then as much as it holds)
BUDGET_CHUNK = 64 * 1024
#: a response at least this large is written at once, not with the rest of its tick.
#: Several requests read in one tick (a consumer's pulls of its queues) ran one after
#: the other and their answers left together after the last: the client then worked
#: through all of them while this side idled, and sent the next requests together
#: (a convoy; pulls of 32 messages took 5-7 ms for 1 ms of work).  A large answer
#: pays for its own write call many times over.
FLUSH_NOW_BYTES = 16 * 1024

_scratch = threading.local()


def _scratch_buffer() -> memoryview:
    """The buffer the transports of this thread read into (get_buffer, recv_into and
    buffer_updated run back to back, and the decoder copies what it keeps)."""
    view: memoryview | None = getattr(_scratch, "view", None)
    if view is None:
        view = _scratch.view = memoryview(bytearray(READ_CHUNK))
    return view


@dataclass(eq=False)
class Listener:
    """What an ``RpcServer`` shares with the connections it accepted."""

    name: str
    limits: RpcLimits
    stats: RpcStats
    budget: AssemblyBudget[RpcConnection]
    #: called once the connection's transport is gone (its descriptor is closed)
    released: Callable[[RpcConnection], None] = field(default=lambda conn: None)


@dataclass(slots=True)
class RequestContext:
    conn: RpcConnection
    method: int
    received_at: float
    timeout_ms: int
    #: the request's signature (``RequestBody.authInfo``), None when unsigned
    auth: envelope.RequestAuth | None = None
    #: set by the dispatcher's guard once the signature checked out (a cluster member)
    authenticated: bool = False
    #: set by the guard for a gateway's request for a client: (user, client address)
    on_behalf: tuple[str, str] | None = None
    #: set by the ACL guard: the user the request was authorised as (None: anonymous or
    #: a member) and the client's address it was judged from
    acl_user: str | None = None
    acl_ip: Any = None

    @property
    def peer(self) -> str:
        return self.conn.peer


RawHandler = Callable[[RequestContext, bytes], Awaitable[bytes | None]]
#: Checks a request before its handler runs (raises an ``HaError`` to refuse it):
#: the cluster's control-plane authentication (:class:`ha_controller.auth.ClusterAuth`).
Guard = Callable[[RequestContext, bytes], None]
#: Signs an outgoing request: (method, request bytes) -> its signature, or None to
#: send it unsigned.
Signer = Callable[[int, bytes], envelope.RequestAuth | None]


class Dispatcher:
    """method id -> handler.  Typed handlers get a parsed protobuf request.

    With a ``guard``, every request passes it before its handler runs (and before its
    body is parsed); a request it refuses gets the guard's error and changes nothing."""

    def __init__(self, guard: Guard | None = None) -> None:
        self._handlers: dict[int, RawHandler] = {}
        self.guard = guard

    def add_raw(self, method: int, handler: RawHandler) -> None:
        if method in self._handlers:
            raise ValueError(f"handler for {method_name(method)} registered twice")
        if self.guard is not None:
            handler = _guarded(self.guard, handler)
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


def _guarded(guard: Guard, handler: RawHandler) -> RawHandler:
    async def checked(ctx: RequestContext, body: bytes) -> bytes | None:
        guard(ctx, body)
        return await handler(ctx, body)

    return checked


class RpcConnection(asyncio.BufferedProtocol):
    """A framed connection.  Create with ``connect()`` or let ``RpcServer`` make one."""

    def __init__(
        self,
        *,
        dispatcher: Dispatcher | None = None,
        limits: RpcLimits | None = None,
        on_close: Callable[[RpcConnection], None] | None = None,
        listener: Listener | None = None,
        dialled: str | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._listener = listener
        self.limits = limits or (listener.limits if listener is not None else RpcLimits())
        self._decoder = FrameDecoder(self.limits.max_list_size, self.limits.max_frame_bytes)
        self._pending: dict[int, asyncio.Future[envelope.Response]] = {}
        self._serial = 0
        self._handlers: set[asyncio.Task[None]] = set()
        self._closed = asyncio.Event()
        self._lost = asyncio.Event()
        self._close_reason: BaseException | None = None
        self._on_close = on_close
        self._stopping = False
        self._wbuf: list[bytes] = []
        self._wbuf_bytes = 0
        self._flush_scheduled = False
        self._transport: asyncio.Transport | None = None
        self._abort_handle: asyncio.TimerHandle | None = None
        # reading is paused while this is not empty (reasons: write_backlog, assembly_budget)
        self._read_paused: set[str] = set()
        self._writable = asyncio.Event()
        self._writable.set()
        self._parked = 0  # handlers waiting for the write backlog to drain
        self._frame_started: float | None = None
        self._last_activity = time.monotonic()
        self.peer = "?"
        #: the address an outgoing connection was made to, as given (None: accepted)
        self.dialled = dialled
        #: the first two bytes the peer sent (to tell a TLS record from a frame)
        self._head = b""
        self._got_frame = False
        self.attrs: dict[str, Any] = {}
        #: signs outgoing requests (a cluster member's pool sets it); None: unsigned
        self.signer: Signer | None = None
        # liveness of an outgoing connection (RpcLimits.liveness_probe_ms): when the peer
        # was last heard, or a wait for it began; when the unanswered probe went out
        self._heard_at = time.monotonic()
        self._probe_sent: float | None = None
        self._watch: asyncio.TimerHandle | None = None

    # ---- public API ------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def made(self) -> bool:
        """Whether a transport was attached (``connection_lost`` will follow)."""
        return self._transport is not None

    @property
    def inflight(self) -> int:
        return len(self._handlers)

    @property
    def buffered_bytes(self) -> int:
        """Bytes of the incomplete frame held for this connection."""
        return self._decoder.buffered

    @property
    def reading_paused(self) -> bool:
        return bool(self._read_paused)

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def call(self, method: int, body: bytes, timeout_ms: int | None = None) -> bytes:
        """Send a request and wait for its response data; errors are typed."""
        if self.closed:
            raise ConnectionClosed(f"connection to {self.peer} is closed") from self._close_reason
        timeout_ms = self.limits.default_timeout_ms if timeout_ms is None else timeout_ms
        serial = self._next_serial()
        fut: asyncio.Future[envelope.Response] = asyncio.get_running_loop().create_future()
        if not self._pending:
            self._heard_at = time.monotonic()  # silence counts from the first pending call
        self._pending[serial] = fut
        self._arm_watch()
        try:
            self._write(
                envelope.encode_request(
                    serial,
                    method,
                    body,
                    timeout_ms=timeout_ms,
                    max_block_bytes=self.limits.max_block_bytes,
                    auth=self.signer(method, body) if self.signer is not None else None,
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
                auth=self.signer(method, body) if self.signer is not None else None,
            )
        )

    def flush(self) -> None:
        """Write the frames queued in this tick now instead of at its end (a reply on
        someone's critical path that should not wait for the work that follows it)."""
        if self._wbuf:
            self._flush()

    async def drain(self) -> None:
        """Wait until what was written is below the transport's low-water mark."""
        if self._wbuf:
            self._flush()
        if not self.closed:
            await self._writable.wait()

    def stop_accepting(self) -> None:
        """Phased shutdown: new incoming requests get ServiceStopping."""
        self._stopping = True

    async def wait_handlers(self, timeout_s: float) -> None:
        if self._handlers:
            await asyncio.wait(set(self._handlers), timeout=timeout_s)

    async def aclose(self, reason: BaseException | None = None) -> None:
        """Close the connection; idempotent."""
        self._shutdown(reason or ConnectionClosed(f"connection to {self.peer} closed locally"))
        current = asyncio.current_task()
        handlers = {t for t in self._handlers if t is not current}
        for task in handlers:
            task.cancel()
        if handlers:
            await asyncio.wait(handlers, timeout=1.0)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await asyncio.shield(self._lost.wait())
        if not self._lost.is_set() and self._transport is not None:
            self._transport.abort()  # the peer does not read what is left to send

    async def __aenter__(self) -> RpcConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- asyncio.BufferedProtocol ----------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._last_activity = time.monotonic()
        if self._listener is not None:
            high = self.limits.write_high_water_bytes
            self._transport.set_write_buffer_limits(high, self.limits.write_low_water_bytes)

    def get_buffer(self, sizehint: int) -> memoryview:
        view = _scratch_buffer()
        if self._listener is None:
            return view
        # Never read more than is covered: the connection's own allowance plus what it
        # holds of the budget.  Reading is paused before this reaches 0; the 1 is a
        # guard (an empty buffer is a fatal error for the transport).
        room = (
            self.limits.conn_frame_buffer_bytes
            + self._listener.budget.held(self)
            - self._decoder.buffered
        )
        return view[: max(1, min(room, len(view)))]

    def buffer_updated(self, nbytes: int) -> None:
        self._heard_at = now = time.monotonic()
        if len(self._head) < 2:
            self._head += bytes(_scratch_buffer()[: min(nbytes, 2 - len(self._head))])
        try:
            frames = self._decoder.feed(_scratch_buffer()[:nbytes])
            if frames:
                self._got_frame = True
                self._last_activity = now
                self._frame_started = now if self._decoder.buffered else None
            elif self._frame_started is None:
                self._frame_started = now
            for frame in frames:
                msg = envelope.decode(frame.serial_no, frame.payload)
                if isinstance(msg, envelope.Response):
                    fut = self._pending.get(msg.serial_no)
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
                    # else: a late reply to a cancelled/timed-out call: dropped
                else:
                    self._on_request(msg)
        except ProtocolError as exc:
            if looks_like_tls(self._head):
                self._not_tls(exc)
                return
            log.warning("closing connection from %s: %s", self.peer, exc)
            self._shutdown(exc)
            return
        if self._listener is not None and not self.closed:
            self._rebalance(self._listener)

    def eof_received(self) -> bool:
        if self._decoder.buffered:
            log.warning(
                "closing connection from %s: peer closed mid-frame (%d bytes pending)",
                self.peer,
                self._decoder.buffered,
            )
        return False  # the transport closes itself; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if self._listener is None and self._is_tls():
            if isinstance(exc, ssl.SSLError):
                exc = session_error(self.dialled or self.peer, exc)
            elif (exc is None or isinstance(exc, ConnectionResetError)) and not self._got_frame:
                # With TLS 1.3 a server checks the client certificate after our handshake
                # is done, and asyncio drops its alert: all we see is a close or a reset.
                # Retriable still: a server that died just now looks the same.
                closed = TlsClosedEarly(
                    f"{self.dialled or self.peer} closed the connection right after the TLS "
                    "handshake, before any answer: does it require a client certificate "
                    "this client did not present (--tls-cert/--tls-key)?"
                )
                closed.__cause__ = exc
                exc = closed
        self._shutdown(exc or ConnectionClosed(f"{self.peer} closed the connection"))
        if self._abort_handle is not None:
            self._abort_handle.cancel()
        self._writable.set()
        self._lost.set()
        if self._listener is not None:
            try:
                self._listener.released(self)
            except Exception:
                log.exception("connection-released listener failed for %s", self.peer)

    def pause_writing(self) -> None:
        self._writable.clear()
        if self._listener is not None:
            self._pause_reading("write_backlog")

    def resume_writing(self) -> None:
        self._writable.set()
        self._last_activity = time.monotonic()
        if self._listener is not None:
            self._resume_reading("write_backlog")

    # ---- liveness (outgoing connections) ---------------------------------

    def _arm_watch(self, delay_s: float | None = None) -> None:
        probe_ms = self.limits.liveness_probe_ms
        if self._watch is not None or self._listener is not None or probe_ms <= 0:
            return
        self._watch = asyncio.get_running_loop().call_later(
            probe_ms / 1000 if delay_s is None else max(delay_s, 0.0), self._check_liveness
        )

    def _check_liveness(self) -> None:
        """While calls are pending: probe a silent peer, abort when the probe is unheard.

        Any byte from the peer counts as an answer, so a peer busy with a long reply or a
        held pull keeps its connection; only one that sends nothing at all (frozen, cut
        off, or behind TCP's retransmission back-off) loses it."""
        self._watch = None
        if self.closed or not self._pending:
            self._probe_sent = None
            return
        now = time.monotonic()
        probe_s = self.limits.liveness_probe_ms / 1000
        if self._probe_sent is not None and self._heard_at < self._probe_sent:
            waited = now - self._probe_sent
            timeout_s = self.limits.liveness_timeout_ms / 1000
            if waited < timeout_s:
                self._arm_watch(timeout_s - waited)
                return
            silent_ms = (now - self._heard_at) * 1000
            log.warning(
                "dropping the connection to %s: nothing heard for %.0f ms with %d calls "
                "pending, a liveness probe included",
                self.dialled or self.peer,
                silent_ms,
                len(self._pending),
            )
            self._shutdown(
                ConnectionClosed(
                    f"{self.dialled or self.peer} sent nothing for {silent_ms:.0f} ms, "
                    "not even the answer to a liveness probe"
                ),
                abort=True,
            )
            return
        self._probe_sent = None
        if now - self._heard_at < probe_s:
            self._arm_watch(self._heard_at + probe_s - now)
            return
        self._probe_sent = now
        with contextlib.suppress(ConnectionClosed):
            self._write(
                envelope.encode_request(
                    self._next_serial(),
                    RequestCode.RPC_PING,
                    b"",
                    timeout_ms=self.limits.liveness_timeout_ms,
                    max_block_bytes=self.limits.max_block_bytes,
                )
            )
        self._arm_watch(self.limits.liveness_timeout_ms / 1000)

    # ---- bounds (accepted connections) -----------------------------------

    def check_deadlines(self, now: float) -> None:
        """The listener's sweep: enforce the frame deadline and the idle timeout."""
        if self.closed or self._listener is None:
            return
        limits, stats = self.limits, self._listener.stats
        started = self._frame_started
        if started is not None and (now - started) * 1000 > limits.frame_timeout_ms:
            stats.frames_timed_out += 1
            exc = FrameTimeout(
                f"frame incomplete after {limits.frame_timeout_ms} ms "
                f"({self._decoder.buffered} bytes received)"
            )
            log.warning("closing connection from %s: %s", self.peer, exc)
            self._shutdown(exc, abort=True)
            return
        if self._pending or len(self._handlers) > self._parked:
            self._last_activity = now  # busy: idle time starts when the work ends
        elif (now - self._last_activity) * 1000 > limits.idle_timeout_ms:
            stats.idle_timeouts += 1
            log.info(
                "closing connection from %s: no complete frame for %d ms",
                self.peer,
                limits.idle_timeout_ms,
            )
            self._shutdown(ConnectionClosed(f"connection from {self.peer} idle"), abort=True)

    def _rebalance(self, listener: Listener) -> None:
        """After a read: give back budget the finished frame held, or get more (or
        pause) when the incomplete frame has used up what is covered."""
        budget = listener.budget
        buffered = self._decoder.buffered
        own = self.limits.conn_frame_buffer_bytes
        held = budget.held(self)
        if held and buffered <= own:
            budget.release(self)
            held = 0
        if own + held - buffered > 0:
            return
        # 64 KiB, then doubling with what it holds up to one read: few requests per frame
        if not budget.request(self, min(READ_CHUNK, max(BUDGET_CHUNK, held))):
            self._pause_reading("assembly_budget")

    def budget_granted(self, nbytes: int) -> None:
        """The listener's budget served a queued request (``AssemblyBudget`` wake)."""
        self._resume_reading("assembly_budget")

    def _pause_reading(self, reason: str) -> None:
        if reason in self._read_paused or self.closed:
            return
        if not self._read_paused and self._transport is not None:
            self._transport.pause_reading()
        self._read_paused.add(reason)
        if self._listener is not None:
            self._listener.stats.reads_paused[reason] += 1

    def _resume_reading(self, reason: str) -> None:
        if reason not in self._read_paused:
            return
        self._read_paused.discard(reason)
        if not self._read_paused and not self.closed and self._transport is not None:
            self._transport.resume_reading()

    # ---- internals --------------------------------------------------------

    def _is_tls(self) -> bool:
        return (
            self._transport is not None and self._transport.get_extra_info("ssl_object") is not None
        )

    def _not_tls(self, exc: ProtocolError) -> None:
        """The peer opened with a TLS record and we speak plaintext."""
        if self._listener is not None:
            # a TLS client: one line of text makes its handshake fail as "wrong
            # version number", which it reports as TlsMismatch (not a reset)
            log.warning(
                "closing connection from %s: it began a TLS handshake and this listener "
                "does not speak TLS (is [tls] enabled on the servers?)",
                self.peer,
            )
            if self._transport is not None:
                with contextlib.suppress(Exception):
                    self._transport.write(NOT_TLS_REPLY)
            self._shutdown(exc)
        else:
            # a TLS server answered our plaintext frame (an alert): say so
            hint = TlsMismatch(plaintext_to_tls_hint(self.dialled or self.peer))
            hint.__cause__ = exc
            self._shutdown(hint)

    def _next_serial(self) -> int:
        self._serial = (self._serial + 1) & 0xFFFFFFFF or 1
        return self._serial

    def _write(self, data: bytes) -> None:
        """Queue a frame; every frame queued in one event-loop tick goes out in one
        write (one syscall instead of one per response: the profile's top frame)."""
        if self.closed:
            raise ConnectionClosed(f"connection to {self.peer} is closed") from self._close_reason
        self._wbuf.append(data)
        self._wbuf_bytes += len(data)
        self._last_activity = time.monotonic()
        if self._wbuf_bytes >= self.limits.write_high_water_bytes:
            self._flush()  # now, so that the transport's back-pressure starts now
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        wbuf, self._wbuf, self._wbuf_bytes = self._wbuf, [], 0
        if not wbuf or self.closed or self._transport is None:
            return
        data = wbuf[0] if len(wbuf) == 1 else b"".join(wbuf)
        try:
            self._transport.write(data)
        except (ConnectionError, RuntimeError) as exc:
            # pending calls fail with ConnectionClosed chained to this cause
            self._shutdown(exc)

    def _shutdown(self, reason: BaseException, *, abort: bool = False) -> None:
        if self._closed.is_set():
            return
        self._close_reason = reason
        self._closed.set()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self._wbuf, self._wbuf_bytes = [], 0
        # what is left of an incomplete frame is garbage now: free it at once
        self._decoder = FrameDecoder(self.limits.max_list_size, self.limits.max_frame_bytes)
        self._frame_started = None
        transport = self._transport
        if transport is not None:
            with contextlib.suppress(Exception):
                if abort:
                    transport.abort()
                else:
                    transport.close()
                    if self._listener is not None and transport.get_write_buffer_size():
                        # a peer that does not read its last replies is cut off
                        self._abort_handle = asyncio.get_running_loop().call_later(
                            self.limits.frame_timeout_ms / 1000, transport.abort
                        )
        if self._listener is not None:
            self._listener.budget.forget(self)
        self._writable.set()
        err: HaError = (
            reason
            if isinstance(reason, TlsError | TlsClosedEarly)
            else ConnectionClosed(f"connection to {self.peer} closed: {reason}")
        )
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

    def _on_request(self, req: envelope.Request) -> None:
        received = time.monotonic()
        if req.method == RequestCode.RPC_PING:
            # answered here, before any guard, limit or handler: it tells the peer only that
            # this connection and its event loop are alive
            if not req.oneway:
                with contextlib.suppress(ConnectionClosed):
                    self._write(
                        envelope.encode_response(
                            req.serial_no,
                            req.method,
                            b"",
                            max_block_bytes=self.limits.max_block_bytes,
                        )
                    )
            return
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
        task.add_done_callback(self._handler_done)

    def _handler_done(self, task: asyncio.Task[None]) -> None:
        self._handlers.discard(task)
        self._last_activity = time.monotonic()

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
        if self._listener is not None and not self._writable.is_set():
            # The peer is not reading our replies: a request read before reading
            # paused waits here instead of adding its reply to the backlog.
            # Woken together when the backlog drains, the first ones fill it again.
            self._parked += 1
            try:
                while not self._writable.is_set():
                    await self._writable.wait()
            finally:
                self._parked -= 1
            if self.closed:
                return
        handler = self._dispatcher.get(req.method) if self._dispatcher else None
        if handler is None:
            self._reply_error(req, UnknownMethod(f"unknown method {req.method}"))
            return
        ctx = RequestContext(self, req.method, received, req.timeout_ms, req.auth)
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
            frame = envelope.encode_response(
                req.serial_no,
                req.method,
                result or b"",
                max_block_bytes=self.limits.max_block_bytes,
            )
            self._write(frame)
            if len(frame) >= FLUSH_NOW_BYTES:
                self.flush()


async def connect(
    addr: str,
    *,
    dispatcher: Dispatcher | None = None,
    limits: RpcLimits | None = None,
    ssl_context: ssl.SSLContext | None = None,
    timeout_ms: int = 3000,
    on_close: Callable[[RpcConnection], None] | None = None,
) -> RpcConnection:
    """Open a connection to ``host:port`` (with TLS when ``ssl_context`` is given:
    the server's certificate must name ``host`` when the context checks names).

    Raises ``BrokerUnavailable`` when it cannot; with TLS, ``TlsMismatch`` when the
    server does not speak TLS and ``TlsError`` when the handshake or the server's
    certificate fails (each one line that says what to change)."""
    host, _, port = addr.rpartition(":")
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_ms / 1000):
            _, conn = await loop.create_connection(
                lambda: RpcConnection(
                    dispatcher=dispatcher, limits=limits, on_close=on_close, dialled=addr
                ),
                host.strip("[]"),
                int(port),
                ssl=ssl_context,
            )
    except (ssl.SSLError, ssl.CertificateError) as exc:
        raise handshake_error(addr, exc) from exc
    except (OSError, TimeoutError, ValueError) as exc:
        if ssl_context is not None and isinstance(exc, ConnectionResetError | BrokenPipeError):
            raise BrokerUnavailable(
                f"cannot connect to {addr}: the connection was reset during the TLS "
                "handshake (does the server speak TLS? does it accept this client?)"
            ) from exc
        raise BrokerUnavailable(f"cannot connect to {addr}: {exc}") from exc
    return conn
