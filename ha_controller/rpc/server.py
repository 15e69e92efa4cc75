"""asyncio RPC server over TubeMQ framing, with connection bounds and phased shutdown.

The server runs its own accept loop instead of ``asyncio.start_server`` so that it can
bound what a listener takes (``RpcLimits``):

* a connection beyond ``max_connections`` is accepted and closed at once (RST),
  counted, and logged once per 10 s;
* when ``accept()`` fails for lack of descriptors or memory the loop backs off
  (``accept_backoff_ms`` doubling to ``accept_backoff_max_ms``) and logs once per
  10 s; asyncio's own loop logs a traceback per attempt, up to a hundred a tick;
* a sweep applies each connection's frame deadline and idle timeout;
* the connections share the listener's assembly budget (see ``RpcConnection``);
* with TLS, the first bytes of a connection are peeked at before the handshake: a
  plaintext frame gets a plaintext ``TlsMismatch`` answer naming the fix instead of a
  silent close (:mod:`ha_controller.rpc.tls`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
import ssl
import struct
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ha_controller.protocol import envelope
from ha_controller.protocol.errors import TlsMismatch
from ha_controller.protocol.framing import TOKEN
from ha_controller.rpc.bounds import AssemblyBudget, RpcStats, Throttle
from ha_controller.rpc.connection import Dispatcher, Listener, RpcConnection
from ha_controller.rpc.limits import RpcLimits
from ha_controller.rpc.tls import TLS_HANDSHAKE, plaintext_to_tls_hint

log = logging.getLogger(__name__)

#: accept() errors that mean "out of descriptors or memory": back off and retry
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: descriptors a process needs besides its accepted connections (store, HTTP, peers)
FD_RESERVE = 256
LOG_INTERVAL_S = 10.0
#: accepts in a row before the accept loop lets other work run
ACCEPT_BURST = 64
_LINGER_RESET = struct.pack("ii", 1, 0)
_FRAME_START = struct.Struct(">II")  # token, serial number
#: how long a plaintext client of a TLS listener gets to read the answer and close
PLAINTEXT_ANSWER_LINGER_S = 1.0


class RpcServer:
    """Accepts connections and serves them with one ``Dispatcher``.

    ``start()`` binds (port 0 = any free port) and returns the bound address.
    ``aclose()`` stops accepting, lets in-flight requests finish within the
    grace period, then closes every connection.  ``stats`` and the properties
    below are what the services export as ``hac_rpc_*`` metrics.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        limits: RpcLimits | None = None,
        ssl_context: ssl.SSLContext | None = None,
        name: str = "rpc",
    ) -> None:
        self.dispatcher = dispatcher
        self.limits = limits or RpcLimits()
        self._ssl = ssl_context
        self.name = name
        self.stats = RpcStats()
        self.budget: AssemblyBudget[RpcConnection] = AssemblyBudget(
            self.limits.assembly_budget_bytes, lambda conn, n: conn.budget_granted(n)
        )
        self._listener = Listener(name, self.limits, self.stats, self.budget, self._released)
        self.connections: set[RpcConnection] = set()
        self._close_listeners: list[Callable[[RpcConnection], None]] = []
        self.address: tuple[str, int] | None = None
        self._sockets: list[socket.socket] = []
        self._accept_tasks: set[asyncio.Task[None]] = set()
        self._setup_tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._open = 0
        self._stopping = False
        self._refused_log = Throttle(LOG_INTERVAL_S)
        self._accept_error_log = Throttle(LOG_INTERVAL_S)
        self._plaintext_log = Throttle(LOG_INTERVAL_S)
        self._handshake_log = Throttle(LOG_INTERVAL_S)

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The listener's TLS context (None: plaintext); settable until ``start()``."""
        return self._ssl

    @ssl_context.setter
    def ssl_context(self, ctx: ssl.SSLContext | None) -> None:
        if self.address is not None:
            raise RuntimeError(f"{self.name}: TLS must be set before the listener starts")
        self._ssl = ctx

    def on_connection_closed(self, callback: Callable[[RpcConnection], None]) -> None:
        self._close_listeners.append(callback)

    @property
    def open_connections(self) -> int:
        """Accepted connections whose descriptor is still open (what max_connections caps)."""
        return self._open

    @property
    def assembly_bytes(self) -> int:
        """Bytes of incomplete frames held by this listener's connections."""
        return sum(c.buffered_bytes for c in self.connections)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        seen: set[tuple[int, str]] = set()
        try:
            for family, type_, proto, _, sockaddr in infos:
                addr = str(sockaddr[0])
                if (family, addr) in seen:
                    continue
                seen.add((family, addr))
                # with port 0, every address gets the port the first one was given
                bind_port = self.address[1] if self.address else port
                sock = self._listen_socket(family, type_, proto, (addr, bind_port))
                self._sockets.append(sock)
                if self.address is None:
                    bound = sock.getsockname()
                    self.address = (str(bound[0]), int(bound[1]))
        except OSError:
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()
            self.address = None
            raise
        if self.address is None:
            raise OSError(f"{host}:{port} resolves to no address")
        for sock in self._sockets:
            self._spawn(self._accept_tasks, self._accept_loop(sock), "accept")
        self._sweeper = loop.create_task(self._sweep(), name=f"{self.name}-sweep")
        self._check_fd_limit()
        log.info("%s server listening on %s:%d", self.name, *self.address)
        return self.address

    @property
    def bound(self) -> str:
        if self.address is None:
            raise RuntimeError("server not started")
        host, port = self.address
        return f"{host}:{port}"

    def stop_accepting(self) -> None:
        """Phase 1 of a shutdown: no new connections, no new requests (idempotent)."""
        self._stopping = True
        for task in self._accept_tasks:
            task.cancel()
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            # unregister before closing, so that the number is not unregistered
            # later for whatever socket reuses it
            loop.remove_reader(sock.fileno())
            sock.close()
        self._sockets.clear()
        for conn in list(self.connections):
            conn.stop_accepting()

    async def aclose(self, grace_s: float = 5.0) -> None:
        """Stop accepting, drain in-flight requests, close connections; idempotent."""
        self.stop_accepting()
        for task in self._setup_tasks:
            task.cancel()
        conns = list(self.connections)
        if conns:
            await asyncio.gather(*(c.wait_handlers(grace_s) for c in conns))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_s):  # a peer that does not read
                    await asyncio.gather(*(c.drain() for c in conns))
            await asyncio.gather(*(c.aclose() for c in conns))
        if self._sweeper is not None:
            self._sweeper.cancel()
        tasks = {*self._accept_tasks, *self._setup_tasks}
        if self._sweeper is not None:
            tasks.add(self._sweeper)
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        self._sweeper = None

    # ---- accepting ----------------------------------------------------------------

    def _listen_socket(
        self, family: int, type_: int, proto: int, addr: tuple[str, int]
    ) -> socket.socket:
        sock = socket.socket(family, type_, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(socket.SOMAXCONN)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return sock

    def _check_fd_limit(self) -> None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = self.limits.max_connections + FD_RESERVE
        if soft != resource.RLIM_INFINITY and soft < wanted:
            log.warning(
                "%s: the open-file limit (%d) is below limits.max_connections (%d) + %d; "
                "accepts will back off when descriptors run out",
                self.name,
                soft,
                self.limits.max_connections,
                FD_RESERVE,
            )

    def _spawn(
        self, tasks: set[asyncio.Task[None]], coro: Coroutine[Any, Any, None], what: str
    ) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}-{what}")
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        limits = self.limits
        backoff_s = limits.accept_backoff_ms / 1000
        failures = 0  # in a row
        burst = 0
        while True:
            try:
                conn_sock, addr = await loop.sock_accept(sock)
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue
            except OSError as exc:
                failures += 1
                self._accept_failed(exc, backoff_s)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, limits.accept_backoff_max_ms / 1000)
                continue
            if failures:
                log.warning("%s: accepting again after %d failed accept(s)", self.name, failures)
                failures = 0
                backoff_s = limits.accept_backoff_ms / 1000
            self._admit(conn_sock, addr)
            burst += 1
            if burst >= ACCEPT_BURST:
                burst = 0
                await asyncio.sleep(0)

    def _accept_failed(self, exc: OSError, backoff_s: float) -> None:
        self.stats.accept_errors += 1
        count = self._accept_error_log.hit(time.monotonic())
        if not count:
            return
        kind = "out of resources" if exc.errno in RESOURCE_ERRNOS else "failed"
        log.warning(
            "%s: accept %s (%s; %d connections open), %d time(s) since the last such line; "
            "backing off %d ms (up to %d ms), logged at most every %.0f s",
            self.name,
            kind,
            exc,
            self._open,
            count,
            backoff_s * 1000,
            self.limits.accept_backoff_max_ms,
            LOG_INTERVAL_S,
        )

    def _admit(self, sock: socket.socket, addr: object) -> None:
        if self._open >= self.limits.max_connections:
            self.stats.refused["max_connections"] += 1
            count = self._refused_log.hit(time.monotonic())
            if count:
                log.warning(
                    "%s: refused %d connection(s) since the last such line (latest from %s): "
                    "%d open, limits.max_connections = %d; logged at most every %.0f s",
                    self.name,
                    count,
                    addr,
                    self._open,
                    self.limits.max_connections,
                    LOG_INTERVAL_S,
                )
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            sock.close()
            return
        self._open += 1
        self.stats.accepted += 1
        self._spawn(self._setup_tasks, self._setup(sock), "setup")

    async def _setup(self, sock: socket.socket) -> None:
        """Wrap an accepted socket in a connection (after the TLS handshake, if any)."""
        made: list[RpcConnection] = []

        def factory() -> RpcConnection:
            conn = RpcConnection(
                dispatcher=self.dispatcher,
                limits=self.limits,
                on_close=self._closed,
                listener=self._listener,
            )
            made.append(conn)
            return conn

        loop = asyncio.get_running_loop()
        handshake_s = self.limits.frame_timeout_ms / 1000 if self._ssl is not None else None
        try:
            if self._ssl is not None and not await self._starts_tls(sock, handshake_s or 1.0):
                self._setup_failed(sock, made)
                return
            await loop.connect_accepted_socket(
                factory, sock, ssl=self._ssl, ssl_handshake_timeout=handshake_s
            )
        except (OSError, ValueError) as exc:  # a failed TLS handshake, a reset
            self._setup_failed(sock, made)
            if isinstance(exc, ssl.SSLError):
                self._handshake_failed(exc)
            else:
                log.debug("%s: connection setup failed: %s", self.name, exc)
            return
        except BaseException:
            self._setup_failed(sock, made)
            raise
        conn = made[0]
        if conn.closed:
            return
        self.connections.add(conn)
        if self._stopping:
            conn.stop_accepting()

    async def _starts_tls(self, sock: socket.socket, timeout_s: float) -> bool:
        """Peek at what a client of this TLS listener sends first: True for a TLS
        handshake record (go on with the handshake; anything else not a frame fails
        it as before), False once a plaintext frame was answered with ``TlsMismatch``
        (or the client sent nothing in time, or closed): the caller closes."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    await _readable(loop, sock)
                    try:
                        head = sock.recv(_FRAME_START.size, socket.MSG_PEEK)
                    except (BlockingIOError, InterruptedError):
                        continue  # a spurious wake-up
                    if not head:
                        return False
                    if head[0] == TLS_HANDSHAKE:
                        return True
                    token = TOKEN.to_bytes(4, "big")
                    if not token.startswith(head[:4]):
                        return True  # neither TLS nor a frame: let the handshake fail it
                    if len(head) == _FRAME_START.size:
                        break
                    await asyncio.sleep(0.01)  # a frame's first bytes: wait for the rest
        except TimeoutError:
            return False
        _, serial = _FRAME_START.unpack(head)
        self.stats.refused["tls_required"] += 1
        count = self._plaintext_log.hit(time.monotonic())
        peer = _addr_text(sock.getpeername())
        if count:
            log.warning(
                "%s: %d plaintext connection(s) to this TLS listener since the last such "
                "line (latest from %s), answered with TlsMismatch; logged at most every %.0f s",
                self.name,
                count,
                peer,
                LOG_INTERVAL_S,
            )
        hint = TlsMismatch(plaintext_to_tls_hint(_addr_text(sock.getsockname())))
        await _answer_and_close(loop, sock, envelope.encode_error(serial, hint))
        return False

    def _handshake_failed(self, exc: ssl.SSLError) -> None:
        """A client failed the TLS handshake (its certificate, most likely): counted,
        and logged at most once per interval."""
        self.stats.refused["tls_handshake"] += 1
        count = self._handshake_log.hit(time.monotonic())
        if count:
            log.warning(
                "%s: %d TLS handshake(s) failed since the last such line (latest: %s); "
                "logged at most every %.0f s",
                self.name,
                count,
                exc.reason or exc,
                LOG_INTERVAL_S,
            )

    def _setup_failed(self, sock: socket.socket, made: list[RpcConnection]) -> None:
        sock.close()
        if not (made and made[0].made):
            self._open -= 1  # else its connection_lost() releases it

    # ---- connection life ---------------------------------------------------------

    async def _sweep(self) -> None:
        limits = self.limits
        interval_s = min(limits.frame_timeout_ms, limits.idle_timeout_ms) / 10_000
        interval_s = min(1.0, max(0.05, interval_s))
        while True:
            await asyncio.sleep(interval_s)
            now = time.monotonic()
            for conn in list(self.connections):
                conn.check_deadlines(now)

    def _released(self, conn: RpcConnection) -> None:
        self._open -= 1

    def _closed(self, conn: RpcConnection) -> None:
        self.connections.discard(conn)
        for cb in self._close_listeners:
            try:
                cb(conn)
            except Exception:
                log.exception("connection-closed listener failed for %s", conn.peer)


def _addr_text(addr: object) -> str:
    if isinstance(addr, tuple):
        host = str(addr[0])
        return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"
    return str(addr)


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Wait until ``sock`` has something to read (or EOF)."""
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


async def _answer_and_close(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, data: bytes
) -> None:
    """Send ``data`` to a client we will not serve and close gracefully: read (and drop)
    what it sent, so that the close is a FIN and not a reset that could discard our
    answer before the client reads it; wait a moment for the client to close first."""
    with contextlib.suppress(OSError):
        while sock.recv(65536):
            pass
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(PLAINTEXT_ANSWER_LINGER_S):
            await loop.sock_sendall(sock, data)
            sock.shutdown(socket.SHUT_WR)
            while True:
                await _readable(loop, sock)
                if not sock.recv(65536):
                    break
