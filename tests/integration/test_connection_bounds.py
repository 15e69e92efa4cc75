"""Connection bounds of real service processes (RpcLimits), attacked over loopback.

Each test starts ``hactl nameserver`` (or a one-broker cluster), misbehaves at it with
raw sockets, and checks the bound from outside: descriptors and RSS in /proc, the log,
and the ``hac_rpc_*`` metrics.  Every attack is a bounded loop with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import struct
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ha_controller.client import Message, Producer
from ha_controller.proto import broker_pb2, nameserver_pb2
from ha_controller.protocol import envelope
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import UnknownMethod
from ha_controller.protocol.framing import TOKEN
from ha_controller.rpc import connect
from ha_controller.testing import ProcessHandle, eventually, run_cluster, run_nameserver

KIB = 1024
MIB = 1024 * KIB
#: 6 of the 12 header bytes: a frame that has begun and never goes on
HALF_HEADER = struct.pack(">III", TOKEN, 1, 1)[:6]


# --- helpers -------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def socket_fds(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd).startswith("socket:")
    return count


def port_of(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1])


def metrics(handle: ProcessHandle) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://{handle.http}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(handle: ProcessHandle, name: str, **labels: str) -> float:
    """The sum of ``name`` over the series that carry ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lbl), v in metrics(handle).items() if n == name and want <= lbl)


def log_lines(handle: ProcessHandle, since: int = 0) -> list[str]:
    return handle.log_path.read_text(errors="replace").splitlines()[since:]


async def open_raw(
    port: int, sndbuf: int | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if sndbuf is not None:
        # keep the kernel from queueing megabytes per attacking connection
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sndbuf)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), 5)
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)


async def close_all(conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
    for _, writer in conns:
        writer.close()
    for _, writer in conns:
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), 2)


async def closed_by_peer(reader: asyncio.StreamReader, within_s: float) -> bool:
    """Whether the server closes (EOF or reset) within ``within_s``; data is discarded."""
    deadline = time.monotonic() + within_s
    try:
        while (left := deadline - time.monotonic()) > 0:
            if not await asyncio.wait_for(reader.read(64 * KIB), left):
                return True
    except TimeoutError:
        return False
    except OSError:
        return True
    return False


async def served(rpc: str) -> bool:
    """One RPC round trip: an unknown method must come back as an error reply."""
    try:
        conn = await connect(rpc, timeout_ms=1000)
    except OSError:
        return False
    try:
        await conn.call(777_001, b"", 1000)
    except UnknownMethod:
        return True
    except OSError:
        return False
    finally:
        await conn.aclose()
    raise AssertionError("an unknown method succeeded")


@contextlib.asynccontextmanager
async def rss_monitor(pid: int, limit_kib: int) -> AsyncIterator[Callable[[], int]]:
    """Samples the process's RSS every 50 ms; the peak growth so far is ``peak()``.

    Exceeding ``limit_kib`` cancels the body at once (so an unbounded server fails the
    test quickly instead of exhausting the machine)."""
    before = rss_kib(pid)
    peak = 0
    body = asyncio.current_task()
    assert body is not None
    over = False

    async def sample() -> None:
        nonlocal peak, over
        while True:
            peak = max(peak, rss_kib(pid) - before)
            if peak > limit_kib:
                over = True
                body.cancel()
                return
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    try:
        yield lambda: peak
    except asyncio.CancelledError:
        if not over:
            raise
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    assert not over, f"RSS grew by {peak} KiB, more than {limit_kib} KiB"


@pytest.fixture
def procs() -> Iterator[list[ProcessHandle]]:
    handles: list[ProcessHandle] = []
    yield handles
    for handle in handles:
        handle.stop()


# --- the bounds ----------------------------------------------------------------------


async def test_connections_beyond_the_cap_are_closed_at_once(
    tmp_path: Path, procs: list[ProcessHandle]
) -> None:
    cap, total = 100, 400
    ns = run_nameserver(tmp_path, env={"HAC_LIMITS_MAX_CONNECTIONS": str(cap)})
    procs.append(ns)
    port, start = port_of(ns.rpc), len(log_lines(ns))
    sockets_before = socket_fds(ns.pid)
    conns = []
    reset_at_connect = 0
    try:
        for _ in range(total):
            try:
                conn = await open_raw(port)
            except ConnectionResetError:
                reset_at_connect += 1  # refused before our connect() even returned
                continue
            conns.append(conn)
            conn[1].write(HALF_HEADER)  # a slowloris header on every one
        results = await asyncio.gather(*(closed_by_peer(r, 3.0) for r, _ in conns))
        held = results.count(False)
        print(f"{total} half headers: {held} held, {total - held} closed; cap {cap}")
        assert held <= cap
        assert socket_fds(ns.pid) - sockets_before <= cap
        assert metric(ns, "hac_rpc_connections", listener="nameserver") == held
        refused = metric(ns, "hac_rpc_connections_refused_total", reason="max_connections")
        assert refused == total - held
        refusals = [line for line in log_lines(ns, start) if "refused" in line]
        assert 1 <= len(refusals) <= 2, refusals  # once per 10 s, not once per connection
        assert not await served(ns.rpc)  # full: a client is refused too
    finally:
        await close_all(conns)
    await eventually(lambda: served(ns.rpc), timeout=10)


async def test_slow_frames_are_closed_after_the_frame_deadline(
    tmp_path: Path, procs: list[ProcessHandle]
) -> None:
    ns = run_nameserver(tmp_path, env={"HAC_LIMITS_FRAME_TIMEOUT_MS": "1000"})
    procs.append(ns)
    port, start = port_of(ns.rpc), len(log_lines(ns))
    # a frame announcing one 1 MiB block, then its bytes one at a time every 100 ms
    frame = struct.pack(">III", TOKEN, 7, 1) + struct.pack(">I", MIB) + b"x" * 64
    good = await connect(ns.rpc)

    async def slowloris() -> float:
        reader, writer = await open_raw(port)
        began = time.monotonic()
        try:
            for i in range(len(frame)):  # at most 8 s
                writer.write(frame[i : i + 1])
                if await closed_by_peer(reader, 0.1):
                    return time.monotonic() - began
            return float("inf")
        except OSError:
            return time.monotonic() - began
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def keep_calling() -> None:  # a good client on its own connection, meanwhile
        for _ in range(20):
            with contextlib.suppress(UnknownMethod):
                await good.call(777_002, b"", 1000)
            await asyncio.sleep(0.1)

    try:
        lifetimes, _ = await asyncio.gather(
            asyncio.gather(*(slowloris() for _ in range(20))), keep_calling()
        )
        print("slow frames closed after", sorted(round(t, 2) for t in lifetimes), "s")
        assert all(0.9 <= t <= 3.0 for t in lifetimes), lifetimes
        assert not good.closed
    finally:
        await good.aclose()
    timeouts = [line for line in log_lines(ns, start) if "frame incomplete after 1000 ms" in line]
    assert len(timeouts) == 20, timeouts
    assert metric(ns, "hac_rpc_frames_timed_out_total", listener="nameserver") == 20


async def test_idle_connections_are_closed_but_held_requests_are_not(
    tmp_path: Path, procs: list[ProcessHandle]
) -> None:
    ns = run_nameserver(tmp_path, env={"HAC_LIMITS_IDLE_TIMEOUT_MS": "1000"})
    procs.append(ns)
    port, start = port_of(ns.rpc), len(log_lines(ns))
    silent = [await open_raw(port) for _ in range(10)]
    watcher = await connect(ns.rpc)
    try:
        watch = nameserver_pb2.WatchRouteRequest(topic="T", max_wait_ms=2500)
        resp = nameserver_pb2.WatchRouteResponse
        first = await watcher.call_pb(RequestCode.WATCH_ROUTE, watch, resp)
        watch.known_version = first.version  # now the watch is held until max_wait_ms
        began = time.monotonic()
        held = asyncio.create_task(watcher.call_pb(RequestCode.WATCH_ROUTE, watch, resp, 5000))
        results = await asyncio.gather(*(closed_by_peer(r, 3.0) for r, _ in silent))
        assert all(results)
        assert time.monotonic() - began >= 0.9
        # the watch is held 2.5 s, longer than the idle timeout: it is busy, not idle
        assert (await held).version == first.version
        assert time.monotonic() - began >= 2.4
        assert not watcher.closed
    finally:
        await watcher.aclose()
        await close_all(silent)
    idle = [line for line in log_lines(ns, start) if "no complete frame for 1000 ms" in line]
    assert len(idle) == 10, idle
    assert metric(ns, "hac_rpc_idle_timeouts_total", listener="nameserver") >= 10


async def test_announced_huge_blocks_do_not_grow_the_server(
    tmp_path: Path, procs: list[ProcessHandle]
) -> None:
    """300 connections each announce a 16 MiB block and send what the server reads.

    Default limits.  The bytes of incomplete frames are bounded by
    ``connections * conn_frame_buffer_bytes + assembly_budget_bytes`` plus one overdraft
    of at most one frame (16 MiB here): 300 * 16 KiB + 64 MiB + 16 MiB = 85 MiB.
    Asserted: RSS grows by less than that plus 40 MiB for 300 connections' objects
    and the allocator (125 MiB), where an unbounded server would take 4.8 GB."""
    conns_n, block = 300, 16 * MIB
    # the defaults: conn_frame_buffer_bytes 16 KiB, assembly_budget_bytes 64 MiB
    bound_kib = (conns_n * 16 * KIB + 64 * MIB + block + 40 * MIB) // KIB
    ns = run_nameserver(tmp_path)
    procs.append(ns)
    port = port_of(ns.rpc)
    assert await served(ns.rpc)  # warm up
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    sent = 0

    async def announce_and_push(writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        writer.write(struct.pack(">III", TOKEN, 9, 1) + struct.pack(">I", block))
        chunk = b"\xab" * (64 * KIB)
        for _ in range(block // len(chunk) - 1):  # never the last byte
            writer.write(chunk)
            try:
                await asyncio.wait_for(writer.drain(), 1.0)
            except TimeoutError:
                return  # the server stopped reading us
            sent += len(chunk)

    try:
        async with rss_monitor(ns.pid, bound_kib) as peak:
            for _ in range(conns_n):
                conns.append(await open_raw(port, sndbuf=64 * KIB))
            async with asyncio.timeout(60):
                await asyncio.gather(*(announce_and_push(w) for _, w in conns))
            await asyncio.sleep(0.5)
            grown = peak()
        print(
            f"{conns_n} x {block >> 20} MiB announced, {sent >> 20} MiB sent: RSS grew "
            f"{grown >> 10} MiB (bound {bound_kib >> 10} MiB); assembly "
            f"{metric(ns, 'hac_rpc_assembly_bytes') / MIB:.1f} MiB, budget used "
            f"{metric(ns, 'hac_rpc_assembly_budget_used_bytes') / MIB:.1f} MiB"
        )
        assert metric(ns, "hac_rpc_reads_paused_total", reason="assembly_budget") > 0
        assert await served(ns.rpc)  # small frames still get through
    finally:
        await close_all(conns)
    await eventually(lambda: metric(ns, "hac_rpc_assembly_budget_used_bytes") == 0, timeout=10)


async def test_pipelined_pulls_whose_replies_are_not_read_stop_being_read(
    tmp_path: Path,
) -> None:
    """A client pipelines 40,000 pulls of ~64 KiB replies and never reads: the broker
    stops reading it, its RSS grows by less than 40 MiB (an unbounded broker queues
    ~2.6 GB of replies), and another client is served meanwhile."""
    cluster = run_cluster(("bp",), 1, workdir=tmp_path)
    try:
        broker = cluster.broker("bp", 0)
        await cluster.wait_ready()
        async with Producer([cluster.namesrv], group="bp-producer") as producer:
            for i in range(64):
                await producer.send(Message("BP", body=b"m" * (4 * KIB), keys=[f"k{i}"]))
        pulls = b"".join(
            envelope.encode_request(
                serial,
                RequestCode.PULL_MESSAGE,
                broker_pb2.PullMessageRequest(
                    consumer_group="bp", topic="BP", queue_id=serial % 4, max_msg_nums=32
                ).SerializeToString(),
                timeout_ms=60_000,
            )
            for serial in range(1, 40_001)
        )
        pulled = 40_000 * 16  # 64 messages in 4 queues
        port = port_of(broker.rpc)
        _, writer = await open_raw(port, sndbuf=64 * KIB)
        try:
            async with rss_monitor(broker.pid, 40 * MIB // KIB) as peak:
                writer.write(pulls)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(writer.drain(), 5.0)  # it stops reading us
                unread = writer.transport.get_write_buffer_size()
                await asyncio.sleep(1.0)
                grown = peak()
                paused = metric(broker, "hac_rpc_reads_paused_total", reason="write_backlog")
                returned = metric(broker, "hac_messages_out_total", group="bp")
                # meanwhile another client is served
                async with Producer([cluster.namesrv], group="bp-other") as other:
                    await other.send(Message("BP", body=b"still served"))
            print(
                f"{len(pulls)} bytes of pulls, {unread} never read by the broker, "
                f"{returned:.0f} messages returned (of {pulled} asked for); "
                f"RSS grew {grown >> 10} MiB; reads paused {paused:.0f} times"
            )
            assert unread > len(pulls) // 4
            assert returned < pulled // 20  # a bounded part was served
            assert paused >= 1
        finally:
            writer.transport.abort()  # close() would wait to send what the broker never reads
    finally:
        cluster.stop()


async def test_out_of_descriptors_backs_off_quietly_and_recovers(
    tmp_path: Path, procs: list[ProcessHandle]
) -> None:
    ns = run_nameserver(tmp_path)
    procs.append(ns)
    port, start = port_of(ns.rpc), len(log_lines(ns))
    open_fds = len(os.listdir(f"/proc/{ns.pid}/fd"))
    hard = resource.prlimit(ns.pid, resource.RLIMIT_NOFILE)[1]
    resource.prlimit(ns.pid, resource.RLIMIT_NOFILE, (open_fds + 20, hard))
    conns = []
    try:
        for _ in range(100):  # 5x what it can accept: the rest waits in the backlog
            conns.append(await open_raw(port))
        for _ in range(5):  # and the admin HTTP listener (asyncio's accept loop) too
            conns.append(await open_raw(port_of(ns.http)))
        await asyncio.sleep(3.0)  # several back-off rounds
        assert ns.alive()
        lines = log_lines(ns, start)
        print(f"{len(lines)} log lines while out of descriptors:", *lines[:5], sep="\n  ")
        assert not [line for line in lines if "Traceback" in line]
        assert len(lines) <= 5
        assert [line for line in lines if "nameserver: accept out of resources" in line]
        assert not await served(ns.rpc)
    finally:
        await close_all(conns)
    await eventually(lambda: served(ns.rpc), timeout=15)
    assert metric(ns, "hac_rpc_accept_errors_total", listener="nameserver") >= 1
    assert len(log_lines(ns, start)) <= 8
