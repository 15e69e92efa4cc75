"""The clock the special services read and wait on.

Due times (delay levels, timer messages, invisible times) are wall-clock
milliseconds (:func:`ha_controller.protocol.properties.now_ms`), as the store's
timestamps are.  A service that waits for a due time sleeps on the same clock, so a
unit test can pass a clock it moves by hand instead of sleeping.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from typing import Final, Protocol

from ha_controller.protocol.properties import now_ms

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


class SystemClock:
    """The real clock: :func:`now_ms`, ``asyncio.sleep`` and ``asyncio.timeout``."""

    def now_ms(self) -> int:
        return now_ms()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def timeout(self, seconds: float) -> AbstractAsyncContextManager[object]:
        return asyncio.timeout(seconds)


SYSTEM_CLOCK: Final = SystemClock()
