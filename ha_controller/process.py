"""Running a service process: event loop, logging, signals, phased shutdown.

SIGTERM (or SIGINT) asks for a graceful stop; a second one forces exit.

The event loop is uvloop when it is installed (``pip install 'ha-controller[uvloop]'``)
and the standard asyncio loop otherwise; ``HAC_EVENT_LOOP`` chooses: ``auto``
(the default), ``uvloop`` (an error when it is missing) or ``asyncio``.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, TypeVar

from ha_controller.protocol.errors import ConfigError
from ha_controller.rpc.bounds import Throttle

T = TypeVar("T")

#: the environment variable that chooses the event loop
EVENT_LOOP_ENV: Final = "HAC_EVENT_LOOP"
EVENT_LOOPS: Final = ("auto", "uvloop", "asyncio")

log = logging.getLogger(__name__)

#: what asyncio's own accept loop (aiohttp's admin HTTP listener) reports on EMFILE & co.
_ACCEPT_OUT_OF_RESOURCES = "socket.accept() out of system resource"


def event_loop_choice(choice: str | None = None) -> str:
    """The loop to run: "uvloop" or "asyncio", from ``choice`` or ``HAC_EVENT_LOOP``.

    ``auto`` (or unset) means uvloop when it can be imported.  Raises
    ``ConfigError`` for an unknown value or for ``uvloop`` when it is not installed.
    """
    raw = choice if choice is not None else os.environ.get(EVENT_LOOP_ENV, "auto")
    value = raw.strip().lower() or "auto"
    if value not in EVENT_LOOPS:
        raise ConfigError(f"{EVENT_LOOP_ENV}: {raw!r} is not one of {', '.join(EVENT_LOOPS)}")
    if value == "asyncio":
        return value
    try:
        importlib.import_module("uvloop")
    except ImportError as exc:
        if value == "uvloop":
            raise ConfigError(
                f"{EVENT_LOOP_ENV}=uvloop but uvloop is not installed "
                "(pip install 'ha-controller[uvloop]')"
            ) from exc
        return "asyncio"
    return "uvloop"


def loop_factory(choice: str | None = None) -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory of new event loops of the chosen kind (see :func:`event_loop_choice`)."""
    if event_loop_choice(choice) == "uvloop":
        factory: Callable[[], asyncio.AbstractEventLoop] = importlib.import_module(
            "uvloop"
        ).new_event_loop
        return factory
    return asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T], *, choice: str | None = None) -> T:
    """``asyncio.run(main)`` on the chosen event loop."""
    try:
        factory = loop_factory(choice)
    except ConfigError:
        main.close()  # never awaited: no "coroutine was never awaited" warning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


#: One line of every process log (brokers, nameservers, a drill's clients.log)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), format=LOG_FORMAT)


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
        log.info("event loop: %s", type(loop).__module__.split(".")[0])
        await main(stop)

    run(runner())
