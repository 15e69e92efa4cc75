"""Connection bounds: the assembly budget and the log throttle as plain objects, the
limits as config keys, and an in-process ``RpcServer`` on loopback (real sockets)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from ha_controller.config import (
    KIB,
    MIB,
    ConfigError,
    NameserverConfig,
    config_keys,
    load_broker_config,
    load_nameserver_config,
)
from ha_controller.protocol import envelope
from ha_controller.protocol.framing import TOKEN
from ha_controller.rpc import Dispatcher, RequestContext, RpcLimits, RpcServer, connect
from ha_controller.rpc.bounds import AssemblyBudget, Throttle
from ha_controller.rpc.metrics import RPC_METRICS, RpcCollector
from ha_controller.testing import serving

# --- AssemblyBudget --------------------------------------------------------------------


def budget(limit: int) -> tuple[AssemblyBudget[str], list[tuple[str, int]]]:
    woken: list[tuple[str, int]] = []
    return AssemblyBudget(limit, lambda who, n: woken.append((who, n))), woken


def test_budget_grants_what_is_left_then_queues_first_come_first_served() -> None:
    b, woken = budget(100)
    assert b.request("a", 60) == 60
    assert b.request("b", 60) == 40  # what is left
    assert b.request("c", 10) == 0
    assert b.request("d", 10) == 0
    assert (b.used, b.waiting, woken) == (100, 2, [])
    b.release("a", 15)
    assert woken == [("c", 10), ("d", 5)]  # in order; d gets the 5 that are left
    assert (b.used, b.waiting) == (100, 0)
    b.release("a")
    assert b.used == 55


def test_budget_breaks_a_stall_with_one_overdraft() -> None:
    b, woken = budget(100)
    assert b.request("a", 50) == 50
    assert b.request("b", 50) == 50
    assert b.request("a", 50) == 0  # a waits; b is still active
    assert woken == []
    # b waits too: every holder waits, nobody can finish: the oldest waiter overdraws
    assert b.request("b", 50) == 0
    assert woken == [("a", 50)]
    assert b.overdrawn_by == "a" and b.used == 150
    assert b.request("a", 50) == 50  # an overdraft holder is never refused
    b.release("a")  # its frame is complete
    assert b.overdrawn_by is None
    assert woken[-1] == ("b", 50)
    assert b.used == 100


def test_budget_stall_check_counts_the_requester_itself() -> None:
    b, woken = budget(10)
    assert b.request("a", 10) == 10
    assert b.request("a", 10) == 10  # the only holder: it overdraws at once
    assert b.overdrawn_by == "a" and woken == []


def test_budget_forget_drops_the_request_and_frees_the_bytes() -> None:
    b, woken = budget(100)
    b.request("a", 100)
    assert b.request("b", 10) == 0
    assert b.request("c", 10) == 0
    b.forget("b")
    assert b.waiting == 1
    b.forget("a")
    assert woken == [("c", 10)]
    assert b.used == 10 and b.held("a") == 0


@pytest.mark.parametrize("seed", range(20))
def test_budget_random_walk_stays_bounded_and_never_deadlocks(seed: int) -> None:
    """Connections assemble frames of random sizes (<= max_frame) in random order."""
    rng = random.Random(seed)
    limit, max_frame, chunk = 1000, 400, 50
    woken: list[tuple[int, int]] = []
    b: AssemblyBudget[int] = AssemblyBudget(limit, lambda who, n: woken.append((who, n)))
    remaining = {i: rng.randint(1, max_frame) for i in range(30)}
    waiting: set[int] = set()
    done = 0
    for _ in range(100_000):
        for who, _n in woken:
            waiting.discard(who)
        woken.clear()
        runnable = [i for i in remaining if i not in waiting]
        if not runnable:
            break
        who = rng.choice(runnable)
        if b.held(who) >= remaining[who]:  # its frame is complete
            b.release(who)
            del remaining[who]
            done += 1
            continue
        if not b.request(who, chunk):
            waiting.add(who)
        assert b.used <= limit + max_frame + chunk
    assert done == 30, f"stalled with {len(remaining)} frames waiting"


def test_throttle_lets_one_line_through_per_interval_and_counts_the_rest() -> None:
    t = Throttle(10.0)
    assert t.hit(0.0) == 1
    assert [t.hit(x) for x in (1.0, 2.0, 9.9)] == [0, 0, 0]
    assert t.hit(10.0) == 4  # this one and the three it held back
    assert t.hit(10.5) == 0


# --- limits as config keys -------------------------------------------------------------


def test_connection_bounds_defaults() -> None:
    limits = RpcLimits()
    assert (
        limits.max_connections,
        limits.idle_timeout_ms,
        limits.frame_timeout_ms,
        limits.conn_frame_buffer_bytes,
        limits.assembly_budget_bytes,
        limits.write_high_water_bytes,
        limits.write_low_water_bytes,
        limits.accept_backoff_ms,
        limits.accept_backoff_max_ms,
    ) == (4096, 120_000, 30_000, 16 * KIB, 64 * MIB, 256 * KIB, 64 * KIB, 100, 1000)
    assert limits.assembly_bound_bytes == 160 * MIB


def test_every_bound_is_a_config_key_and_an_environment_variable() -> None:
    keys = set(config_keys(NameserverConfig))
    for name in (
        "max_connections",
        "idle_timeout_ms",
        "frame_timeout_ms",
        "conn_frame_buffer_bytes",
        "assembly_budget_bytes",
        "write_high_water_bytes",
        "accept_backoff_ms",
        "accept_backoff_max_ms",
    ):
        assert f"limits.{name}" in keys
    cfg = load_nameserver_config(
        None, {}, env={"HAC_LIMITS_MAX_CONNECTIONS": "50", "HAC_LIMITS_IDLE_TIMEOUT_MS": "900"}
    )
    assert (cfg.limits.max_connections, cfg.limits.idle_timeout_ms) == (50, 900)
    broker = load_broker_config(
        None,
        {"broker_name": "b", "broker_id": 0, "namesrv_addrs": ("127.0.0.1:9876",)},
        env={"HAC_LIMITS_FRAME_TIMEOUT_MS": "5000"},
    )
    assert broker.limits.frame_timeout_ms == 5000


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"HAC_LIMITS_MAX_CONNECTIONS": "0"}, "limits.max_connections"),
        ({"HAC_LIMITS_ACCEPT_BACKOFF_MS": "5000"}, "limits.accept_backoff_ms"),
        ({"HAC_LIMITS_WRITE_HIGH_WATER_BYTES": "10"}, "limits.write_high_water_bytes"),
    ],
)
def test_bad_bounds_name_their_key(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_nameserver_config(None, {}, env=env)


# --- an RpcServer on loopback ----------------------------------------------------------


async def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


def address(server: RpcServer) -> tuple[str, int]:
    assert server.address is not None
    return server.address


@contextlib.asynccontextmanager
async def serving_lengths(
    limits: RpcLimits, reply_bytes: int = 0
) -> AsyncIterator[tuple[RpcServer, list[int]]]:
    """A server whose method 1 answers the request's length (and ``reply_bytes`` more)."""
    calls = [0]

    async def handler(ctx: RequestContext, body: bytes) -> bytes:
        calls[0] += 1
        return len(body).to_bytes(8, "big") + b"r" * reply_bytes

    d = Dispatcher()
    d.add_raw(1, handler)
    async with serving(d, limits=limits) as server:
        yield server, calls


async def test_the_connection_cap_closes_one_more_at_once() -> None:
    async with serving_lengths(RpcLimits(max_connections=3)) as (server, _):
        conns = [await connect(server.bound) for _ in range(3)]
        reader, writer = await asyncio.open_connection(*address(server))
        try:
            with contextlib.suppress(ConnectionError):
                assert await asyncio.wait_for(reader.read(), 2) == b""
            assert server.stats.refused["max_connections"] == 1
            assert server.open_connections == 3
            assert [await c.call(1, b"x") for c in conns] == [(1).to_bytes(8, "big")] * 3
        finally:
            writer.close()
            for c in conns:
                await c.aclose()
        await eventually(lambda: server.open_connections == 0)
        async with await connect(server.bound) as again:
            assert await again.call(1, b"yy") == (2).to_bytes(8, "big")


async def test_a_peer_that_does_not_read_its_replies_stops_being_read_until_it_does() -> None:
    limits = RpcLimits(write_high_water_bytes=64 * KIB)
    async with serving_lengths(limits, reply_bytes=32 * KIB) as (server, calls):
        reader, writer = await asyncio.open_connection(*address(server))
        try:
            total = 2000  # 64 MiB of replies if they were all produced
            writer.write(b"".join(envelope.encode_request(s, 1, b"q") for s in range(1, total + 1)))
            await eventually(lambda: server.stats.reads_paused["write_backlog"] >= 1)
            await asyncio.sleep(0.3)
            conn = next(iter(server.connections))
            assert conn.reading_paused
            assert calls[0] < total // 4, calls[0]  # a bounded part was served
            # the peer reads now: everything is answered
            got = 0
            async with asyncio.timeout(20):
                while got < total:
                    header = await reader.readexactly(12)
                    token, _, blocks = struct.unpack(">III", header)
                    assert token == TOKEN
                    for _ in range(blocks):
                        (length,) = struct.unpack(">I", await reader.readexactly(4))
                        await reader.readexactly(length)
                    got += 1
            assert calls[0] == total
        finally:
            writer.close()


async def test_large_frames_share_the_budget_without_deadlock() -> None:
    """Eight 512 KiB requests at once through a 64 KiB budget with 1 KiB per
    connection: they queue for the budget (one overdraft breaks the stall) and all
    complete, and the listener never holds more than its bound."""
    limits = RpcLimits(
        conn_frame_buffer_bytes=1 * KIB, assembly_budget_bytes=64 * KIB, max_frame_bytes=1 * MIB
    )
    async with serving_lengths(limits) as (server, _):
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, server.assembly_bytes)
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        conns = [await connect(server.bound, limits=limits) for _ in range(8)]
        try:
            body = b"b" * (512 * KIB)
            replies = await asyncio.gather(*(c.call(1, body, 20_000) for c in conns))
            assert replies == [len(body).to_bytes(8, "big")] * 8
        finally:
            watcher.cancel()
            for c in conns:
                await c.aclose()
        assert server.stats.reads_paused["assembly_budget"] >= 1
        bound = 8 * 1 * KIB + 64 * KIB + 1 * MIB + 256 * KIB  # + one request
        assert peak <= bound, peak
        assert server.budget.used == 0


async def test_rpc_metrics_are_exported_per_listener() -> None:
    async with serving_lengths(RpcLimits()) as (server, _):
        registry = CollectorRegistry()
        registry.register(RpcCollector(lambda: [server], {"cluster": "c"}))
        async with await connect(server.bound) as conn:
            await conn.call(1, b"")
            text = generate_latest(registry).decode()
    for name in RPC_METRICS:
        assert f"\n{name}{{" in text, name
    assert 'hac_rpc_connections{cluster="c",listener="test"} 1.0' in text
    assert (
        'hac_rpc_connections_refused_total{cluster="c",listener="test",reason="max_connections"}'
        in text
    )
