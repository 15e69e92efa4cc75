"""asyncio RPC server over TubeMQ framing, with phased shutdown."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

from ha_controller.rpc.connection import Dispatcher, RpcConnection
from ha_controller.rpc.limits import RpcLimits

log = logging.getLogger(__name__)


class RpcServer:
    """Accepts connections and serves them with one ``Dispatcher``.

    ``start()`` binds (port 0 = any free port) and returns the bound address.
    ``aclose()`` stops accepting, lets in-flight requests finish within the
    grace period, then closes every connection.
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
        self._server: asyncio.Server | None = None
        self.connections: set[RpcConnection] = set()
        self._close_listeners: list[Callable[[RpcConnection], None]] = []
        self.address: tuple[str, int] | None = None

    def on_connection_closed(self, callback: Callable[[RpcConnection], None]) -> None:
        self._close_listeners.append(callback)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._server = await asyncio.start_server(
            self._accept, host, port, ssl=self._ssl, limit=256 * 1024, reuse_address=True
        )
        sock = self._server.sockets[0].getsockname()
        self.address = (str(sock[0]), int(sock[1]))
        log.info("%s server listening on %s:%d", self.name, *self.address)
        return self.address

    @property
    def bound(self) -> str:
        if self.address is None:
            raise RuntimeError("server not started")
        host, port = self.address
        return f"{host}:{port}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = RpcConnection(
            reader,
            writer,
            dispatcher=self.dispatcher,
            limits=self.limits,
            on_close=self._closed,
        )
        self.connections.add(conn)

    def _closed(self, conn: RpcConnection) -> None:
        self.connections.discard(conn)
        for cb in self._close_listeners:
            try:
                cb(conn)
            except Exception:
                log.exception("connection-closed listener failed for %s", conn.peer)

    def stop_accepting(self) -> None:
        """Phase 1 of a shutdown: no new connections, no new requests (idempotent)."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.stop_accepting()

    async def aclose(self, grace_s: float = 5.0) -> None:
        """Stop accepting, drain in-flight requests, close connections; idempotent."""
        self.stop_accepting()
        conns = list(self.connections)
        if conns:
            await asyncio.gather(*(c.wait_handlers(grace_s) for c in conns))
            await asyncio.gather(*(c.drain() for c in conns))
            await asyncio.gather(*(c.aclose() for c in conns))
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
