"""Thousands of malformed inputs at a live nameserver: it keeps serving good
clients, its memory stays bounded, and it logs one line per bad connection."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

from ha_controller.client.admin import NameserverClient
from ha_controller.proto import nameserver_pb2
from ha_controller.protocol import envelope
from ha_controller.protocol.errors import UnknownMethod
from ha_controller.protocol.framing import TOKEN, encode_frame
from ha_controller.rpc import connect
from ha_controller.testing import ProcessHandle, eventually
from ha_controller.testing.simbroker import SimulatedBroker

BAD_KINDS = {
    "bad_token": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "huge_list_size": struct.pack(">III", TOKEN, 1, 0x7FFFFFFF),
    "huge_block": struct.pack(">III", TOKEN, 1, 1) + struct.pack(">I", 0x7FFFFFF0),
    "garbage_envelope": encode_frame(1, b"\xff" * 32),
    "garbage_protobuf": encode_frame(1, b"\x03\x08\x00\x00\x02\x0a\x00\x05\xfa\xfb\xfc\xfd\xfe"),
    "truncated": envelope.encode_request(1, 105, b"x" * 100)[:-7],
}
LOG_MARK = "closing connection from"


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def send_bad(port: int, payload: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        if payload is BAD_KINDS["truncated"]:
            return  # we hang up mid-frame
        await asyncio.wait_for(reader.read(), 5.0)  # the server closes on us
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionError:
            pass


async def flood(port: int, per_kind: int) -> int:
    sem = asyncio.Semaphore(64)
    count = 0

    async def one(payload: bytes) -> None:
        nonlocal count
        async with sem:
            await send_bad(port, payload)
            count += 1

    jobs = [one(p) for _ in range(per_kind) for p in BAD_KINDS.values()]
    await asyncio.gather(*jobs)
    return count


async def test_malformed_flood(nameserver: ProcessHandle) -> None:
    port = int(nameserver.rpc.rsplit(":", 1)[1])
    assert nameserver.proc is not None
    # a registered broker must survive the flood; it does not heartbeat meanwhile, so its
    # registration lasts longer than the flood takes on a loaded machine
    broker = SimulatedBroker(
        nameserver.rpc,
        "c1",
        "survivor",
        0,
        topics={"T": SimulatedBroker.topic("T")},
        heartbeat_timeout_ms=600_000,
    )
    await broker.start()
    await broker.register()
    try:
        log_start = nameserver.log_path.read_text().count(LOG_MARK)
        warm = await flood(port, 50)  # warm up allocator and caches
        # the warm-up's last lines may still be on their way (a loaded machine): count
        # the flood's lines only once all of them are in
        await eventually(
            lambda: nameserver.log_path.read_text().count(LOG_MARK) - log_start >= warm,
            timeout=10,
        )
        before = rss_kb(nameserver.pid)
        log_before = nameserver.log_path.read_text().count(LOG_MARK)

        bad_connections = await flood(port, 1000)  # 6,000 bad connections
        # 4,000 requests for unknown methods on live connections: ERROR, not disconnect
        unknown = 0
        conns = [await connect(nameserver.rpc) for _ in range(8)]
        for i in range(500):
            results = await asyncio.gather(
                *(c.call(777000 + i, b"\x01\x02", 3000) for c in conns), return_exceptions=True
            )
            assert all(isinstance(r, UnknownMethod) for r in results), results[:2]
            unknown += len(results)
        assert all(not c.closed for c in conns)
        for c in conns:
            await c.aclose()
        print("bad connections", bad_connections, "unknown-method calls", unknown)
        assert bad_connections + unknown >= 10_000

        async with NameserverClient([nameserver.rpc]) as client:
            route = await client.route("T")
            assert route.broker_datas[0].broker_addrs == {0: broker.addr}
        assert not broker.conn.closed
        resp = await broker.conn.call_pb(
            103, broker.register_request(), nameserver_pb2.RegisterBrokerResponse
        )
        assert resp.master_addr == ""

        after = rss_kb(nameserver.pid)
        assert after - before < 30_000, f"RSS grew from {before} kB to {after} kB"

        def logged() -> bool:
            return nameserver.log_path.read_text().count(LOG_MARK) - log_before >= bad_connections

        await eventually(logged, timeout=10)
        lines = nameserver.log_path.read_text().count(LOG_MARK) - log_before
        assert lines == bad_connections, f"{lines} log lines for {bad_connections} bad connections"
    finally:
        await broker.aclose()
