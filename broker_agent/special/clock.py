"""The clock the special services read and wait on.

Due times (delay levels, timer messages, invisible times) are wall-clock
milliseconds, but read from this process's steady wall clock
(:class:`ha_controller.auth.SteadyWallClock`: the wall time at start, moved on by the
monotonic clock): a step of the process's wall clock (an NTP step, a VM restored)
neither stamps a delay-level message due that much later nor lets a timer message
(due at an absolute time of the sender's clock) go early while the step lasts; the step
is logged once.  A service that waits for a due time sleeps on the same clock, so a
unit test can pass a clock it moves by hand instead of sleeping.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from typing import Final, Protocol

from ha_controller.auth import SteadyWallClock

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds`` of this clock."""
        ...

    def timeout(self, seconds: float) -> AbstractAsyncContextManager[object]:
        """Like ``asyncio.timeout``: TimeoutError once ``seconds`` of this clock are over."""
        ...


_steady_ms = SteadyWallClock(keeps="due times of delayed, timer and POP messages")


class SystemClock:
    """The real clock: the steady wall clock, ``asyncio.sleep`` and ``asyncio.timeout``."""

    def now_ms(self) -> int:
        return _steady_ms()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def timeout(self, seconds: float) -> AbstractAsyncContextManager[object]:
        return asyncio.timeout(seconds)


SYSTEM_CLOCK: Final = SystemClock()
