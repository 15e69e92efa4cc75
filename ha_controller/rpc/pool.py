"""A pool of client connections keyed by address, with reconnect."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
import time
from collections.abc import Callable, Collection

from google.protobuf.message import Message

from ha_controller.protocol.errors import ConnectionClosed, ServiceStopping
from ha_controller.rpc.connection import Dispatcher, M, RpcConnection, Signer, connect
from ha_controller.rpc.limits import RpcLimits


class ConnectionPool:
    """One live connection per address, made on demand and replaced when it dies.

    A connection unused for ``idle_close_s`` is recycled.  ``dispatcher`` lets
    the peer send requests back on our connections (e.g. a broker asking a
    producer to check a transaction).  ``signer`` signs the requests of every
    connection the pool makes (a cluster member's control-plane requests).

    ``sessions`` are addresses whose peer binds state to our connection and drops it
    when the connection closes (a nameserver expires a broker whose registration
    connection closes): their connections never probe a silent peer
    (``RpcLimits.liveness_probe_ms``), so a frozen nameserver that resumes finds them
    open; a call on them still times out as usual.

    ``on_reconnect(addr)`` is called when the pool dials an address whose earlier
    connection closed (the peer restarted, the probe dropped it, it idled out): a peer
    that forgets a client with its connection (a broker's consumer list) hears from the
    client again at once instead of at its next periodic heartbeat.
    """

    def __init__(
        self,
        *,
        limits: RpcLimits | None = None,
        ssl_context: ssl.SSLContext | None = None,
        dispatcher: Dispatcher | None = None,
        connect_timeout_ms: int = 3000,
        idle_close_s: float = 300.0,
        signer: Signer | None = None,
        sessions: Collection[str] = (),
        on_reconnect: Callable[[str], None] | None = None,
    ) -> None:
        self._on_reconnect = on_reconnect
        self.limits = limits or RpcLimits()
        self._sessions = frozenset(sessions)
        self._session_limits = dataclasses.replace(self.limits, liveness_probe_ms=0)
        self._ssl = ssl_context
        self._dispatcher = dispatcher
        self._connect_timeout_ms = connect_timeout_ms
        self._idle_close_s = idle_close_s
        self._conns: dict[str, RpcConnection] = {}
        self._last_used: dict[str, float] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._closed = False
        self._signer = signer

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """TLS of every connection the pool makes (None: plaintext)."""
        return self._ssl

    async def get(self, addr: str) -> RpcConnection:
        if self._closed:
            raise ServiceStopping("connection pool is closed")
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            self._last_used[addr] = time.monotonic()
            return conn
        lock = self._locks.setdefault(addr, asyncio.Lock())
        async with lock:
            conn = self._conns.get(addr)
            if conn is None or conn.closed:
                conn = await connect(
                    addr,
                    dispatcher=self._dispatcher,
                    limits=self._session_limits if addr in self._sessions else self.limits,
                    ssl_context=self._ssl,
                    timeout_ms=self._connect_timeout_ms,
                )
                conn.signer = self._signer
                again = addr in self._conns
                self._conns[addr] = conn
                if again and self._on_reconnect is not None:
                    self._on_reconnect(addr)
            self._last_used[addr] = time.monotonic()
            return conn

    async def call(
        self, addr: str, method: int, body: bytes, timeout_ms: int | None = None
    ) -> bytes:
        conn = await self.get(addr)
        return await conn.call(method, body, timeout_ms)

    async def call_pb(
        self,
        addr: str,
        method: int,
        request: Message,
        response_type: type[M],
        timeout_ms: int | None = None,
    ) -> M:
        conn = await self.get(addr)
        return await conn.call_pb(method, request, response_type, timeout_ms)

    async def oneway(self, addr: str, method: int, request: Message) -> None:
        conn = await self.get(addr)
        try:
            conn.oneway(method, request.SerializeToString())
        except ConnectionClosed:
            conn = await self.get(addr)
            conn.oneway(method, request.SerializeToString())

    async def discard(self, addr: str) -> None:
        conn = self._conns.pop(addr, None)
        if conn is not None:
            await conn.aclose()

    async def recycle_idle(self) -> int:
        """Close connections idle longer than ``idle_close_s``; returns how many."""
        now = time.monotonic()
        stale = [a for a, t in self._last_used.items() if now - t > self._idle_close_s]
        for addr in stale:
            self._last_used.pop(addr, None)
            await self.discard(addr)
        return len(stale)

    async def aclose(self) -> None:
        self._closed = True
        conns = list(self._conns.values())
        self._conns.clear()
        for conn in conns:
            with contextlib.suppress(Exception):
                await conn.aclose()

    async def __aenter__(self) -> ConnectionPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
