"""Liveness of outgoing connections (``RpcLimits.liveness_probe_ms``), over real sockets.

A connection with calls pending that hears nothing probes its peer and is dropped when
the probe is not answered either: what a frozen peer, a partition or TCP's retransmission
back-off after a heal look like from the caller's side.  A peer that is merely slow (a
held pull) answers the probe and keeps its connection."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from ha_controller.protocol import envelope
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import ConnectionClosed, RequestTimeout
from ha_controller.protocol.framing import FrameDecoder
from ha_controller.rpc import Dispatcher, RequestContext, RpcLimits, RpcServer, connect
from ha_controller.rpc.pool import ConnectionPool
from ha_controller.testing import serving

FAST = RpcLimits(liveness_probe_ms=200, liveness_timeout_ms=300)


@contextlib.asynccontextmanager
async def silent_peer() -> AsyncIterator[tuple[str, list[bytes]]]:
    """A TCP peer that accepts and reads everything but never answers (a frozen process
    whose kernel still accepts, or a link whose replies do not get through)."""
    received: list[bytes] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            with contextlib.suppress(ConnectionError):
                while chunk := await reader.read(65536):
                    received.append(chunk)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    try:
        yield f"{host}:{port}", received
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def slow_server(hold_s: float) -> AsyncIterator[tuple[RpcServer, list[int]]]:
    """An ``RpcServer`` whose method 1 answers after ``hold_s`` (a held pull); its guard
    records the method of every request it is asked about."""
    guarded: list[int] = []

    async def held(ctx: RequestContext, body: bytes) -> bytes:
        await asyncio.sleep(hold_s)
        return b"late but here"

    def guard(ctx: RequestContext, body: bytes) -> None:
        guarded.append(ctx.method)

    d = Dispatcher(guard=guard)
    d.add_raw(1, held)
    async with serving(d, limits=FAST, name="slow") as server:
        yield server, guarded


async def test_a_call_to_a_peer_that_sends_nothing_fails_after_the_probe_not_its_timeout() -> None:
    async with silent_peer() as (addr, received):
        conn = await connect(addr, limits=FAST)
        started = time.monotonic()
        with pytest.raises(ConnectionClosed, match="liveness probe"):
            await conn.call(1, b"x", timeout_ms=20_000)
        took = time.monotonic() - started
        assert 0.45 < took < 3.0, took  # probe after 0.2 s, dropped 0.3 s later
        assert conn.closed
        # on the wire: the request, then one RPC_PING
        frames = FrameDecoder(3584, 1 << 20).feed(b"".join(received))
        methods = [envelope.decode(f.serial_no, f.payload).method for f in frames]
        assert methods == [1, RequestCode.RPC_PING]


async def test_every_pending_call_fails_together_and_the_pool_dials_afresh() -> None:
    async with silent_peer() as (addr, _):
        async with ConnectionPool(limits=FAST) as pool:
            first = await pool.get(addr)
            results = await asyncio.gather(
                *(pool.call(addr, 1, b"x", timeout_ms=20_000) for _ in range(3)),
                return_exceptions=True,
            )
            assert all(isinstance(r, ConnectionClosed) for r in results), results
            assert first.closed
            second = await pool.get(addr)
            assert second is not first and not second.closed


async def test_without_the_probe_the_call_waits_its_whole_timeout() -> None:
    async with silent_peer() as (addr, _):
        conn = await connect(addr, limits=RpcLimits(liveness_probe_ms=0))
        try:
            started = time.monotonic()
            with pytest.raises(RequestTimeout):
                await conn.call(1, b"x", timeout_ms=1_000)
            assert time.monotonic() - started >= 0.95
            assert not conn.closed
        finally:
            await conn.aclose()


async def test_a_slow_answer_keeps_its_connection_because_the_peer_answers_probes() -> None:
    """Held calls of 1.5 s with probes every 0.2 s: answered, and the connection lives.
    The probe is answered below the guard (it asks nothing of the service)."""
    async with slow_server(1.5) as (server, guarded):
        conn = await connect(server.bound, limits=FAST)
        try:
            assert await conn.call(1, b"x", timeout_ms=5_000) == b"late but here"
            assert await conn.call(1, b"again", timeout_ms=5_000) == b"late but here"
            assert not conn.closed
            assert guarded == [1, 1]
        finally:
            await conn.aclose()


async def test_an_idle_connection_is_never_probed() -> None:
    """Silence without pending calls is not a stall: nothing is sent."""
    async with silent_peer() as (addr, received):
        conn = await connect(addr, limits=FAST)
        try:
            await asyncio.sleep(0.8)
            assert not conn.closed
            assert received == []
        finally:
            await conn.aclose()


async def test_a_session_connection_is_never_dropped_by_the_probe() -> None:
    """A nameserver expires a broker whose registration connection closes: a broker's
    pool lists its nameservers as sessions, so a frozen nameserver that resumes finds
    the connection still open (its calls time out as before)."""
    async with silent_peer() as (addr, received):
        async with ConnectionPool(limits=FAST, sessions=[addr]) as pool:
            conn = await pool.get(addr)
            with pytest.raises(RequestTimeout):
                await pool.call(addr, 1, b"x", timeout_ms=1_000)
            assert not conn.closed
            frames = FrameDecoder(3584, 1 << 20).feed(b"".join(received))
            assert [envelope.decode(f.serial_no, f.payload).method for f in frames] == [1]


async def test_the_pool_says_when_it_dials_an_address_again() -> None:
    async with slow_server(0.0) as (server, _):
        redialled: list[str] = []
        async with ConnectionPool(limits=FAST, on_reconnect=redialled.append) as pool:
            first = await pool.get(server.bound)
            assert await pool.get(server.bound) is first
            assert redialled == []  # the first dial is no reconnect
            await first.aclose()
            await pool.get(server.bound)
            assert redialled == [server.bound]
