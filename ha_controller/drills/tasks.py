"""Small task helpers the drill workloads share: cancel-and-wait, an in-flight count."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

__all__ = ["InFlight", "cancel_and_wait"]


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (when there is one) and wait until it has ended."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class InFlight:
    """Counts the operations in progress; :attr:`idle` is set while there is none."""

    def __init__(self) -> None:
        self.count = 0
        self.idle = asyncio.Event()
        self.idle.set()

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """One operation in progress for the duration of the ``with`` block."""
        self.count += 1
        self.idle.clear()
        try:
            yield
        finally:
            self.count -= 1
            if self.count == 0:
                self.idle.set()
