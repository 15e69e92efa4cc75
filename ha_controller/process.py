"""Running a service process: logging, signals, phased shutdown.

SIGTERM (or SIGINT) asks for a graceful stop; a second one forces exit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ha_controller.rpc.bounds import Throttle

log = logging.getLogger(__name__)

#: what asyncio's own accept loop (aiohttp's admin HTTP listener) reports on EMFILE & co.
_ACCEPT_OUT_OF_RESOURCES = "socket.accept() out of system resource"


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, interval_s: float = 10.0) -> None:
    """Log asyncio's "accept() out of system resource" once per interval, one line.

    Our RPC listeners back off by themselves (``RpcServer``); the admin HTTP listener
    uses asyncio's accept loop, which logs a traceback per attempt (up to a hundred a
    tick) while descriptors are exhausted, and retries after 1 s by itself.
    """
    throttle = Throttle(interval_s)

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != _ACCEPT_OUT_OF_RESOURCES:
            loop.default_exception_handler(context)
            return
        count = throttle.hit(time.monotonic())
        if count:
            log.warning(
                "accept out of resources on %s (%s), %d time(s) since the last such line; "
                "logged at most every %.0f s",
                context.get("socket"),
                context.get("exception"),
                count,
                interval_s,
            )

    loop.set_exception_handler(handler)


def run_until_signalled(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``main(stop_event)``; signals set the event, a second one exits at once."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        quiet_accept_errors(loop)

        def on_signal(signum: int) -> None:
            if stop.is_set():
                log.warning("second signal %d: forcing exit", signum)
                os._exit(1)
            log.info("signal %d: shutting down", signum)
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        await main(stop)

    asyncio.run(runner())
