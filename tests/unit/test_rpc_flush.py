"""When a server's answers leave, over real sockets.

Answers made in one event-loop tick go out in one write, except a large one, which
leaves as soon as it is made: requests read together (a consumer's pulls of its queues
on one connection) are handled one after the other, and before, the first answer waited
for the last handler, the client then worked through all of them while the server
idled, and sent its next requests together again (a convoy: consuming ran at half the
speed either side could go).

The client is a plain blocking socket in a thread of its own, so that it sees each
answer when the kernel has it, whatever the server's event loop is doing."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable

from ha_controller.protocol import envelope
from ha_controller.protocol.framing import FrameDecoder
from ha_controller.rpc import Dispatcher, RequestContext
from ha_controller.rpc.connection import FLUSH_NOW_BYTES
from ha_controller.testing import serving

WORK_S = 0.15  # each handler holds the server's event loop this long (CPU work)
LARGE, SMALL = 1, 2


def answers_after(addr: str, method: int, n: int) -> list[float]:
    """Send ``n`` requests of ``method`` in one write; seconds until each answer."""
    host, _, port = addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        frames = b"".join(envelope.encode_request(i + 1, method, b"") for i in range(n))
        decoder = FrameDecoder()
        started = time.monotonic()
        sock.sendall(frames)
        arrived: list[float] = []
        while len(arrived) < n:
            chunk = sock.recv(1 << 20)
            assert chunk, "server closed the connection"
            now = time.monotonic() - started
            arrived.extend(now for _ in decoder.feed(chunk))
        return arrived


async def test_a_large_answer_leaves_before_the_next_request_is_handled() -> None:
    def working(size: int) -> Callable[[RequestContext, bytes], Awaitable[bytes]]:
        async def handler(ctx: RequestContext, body: bytes) -> bytes:
            time.sleep(WORK_S)  # the point: the event loop is busy
            return b"m" * size

        return handler

    d = Dispatcher()
    d.add_raw(LARGE, working(FLUSH_NOW_BYTES))
    d.add_raw(SMALL, working(100))
    async with serving(d, name="flush") as server:
        large = await asyncio.to_thread(answers_after, server.bound, LARGE, 3)
        small = await asyncio.to_thread(answers_after, server.bound, SMALL, 3)
    # each large answer left when its handler ended, one handler's work apart
    assert large[1] - large[0] > WORK_S * 0.6, large
    assert large[2] - large[1] > WORK_S * 0.6, large
    # small answers of one tick still leave together, in one write
    assert small[2] - small[0] < WORK_S * 0.5, small
