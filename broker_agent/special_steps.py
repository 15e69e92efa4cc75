"""Special-service steps that finish once started.

A step is one hand-on of special work and the progress it earns: escape a due delayed
message and move the delay offset, escape a half message and mark it resolved, revive
a POP message and mark it acked, pop messages (their checkpoint) and move the group's
offset.  Cancelled in the middle, a step leaves a message
handed on (or maybe handed on: the escape's answer never came) without its progress,
and whoever serves next hands it on again.  So a service that stops waits for the
steps under way (:meth:`SpecialSteps.idle`) before it cancels its loops, and an acting
slave answers its returning master only once no step is under way (see
``membership.group``): the tables the master then takes count every message the slave
handed on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


class SpecialSteps:
    """Counts the steps under way on one broker (every special service shares it)."""

    def __init__(self) -> None:
        self._under_way = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def under_way(self) -> int:
        return self._under_way

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """One step: the escape and the progress it earns, without a cancel between."""
        self._under_way += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._under_way -= 1
            if self._under_way == 0:
                self._idle.set()

    async def idle(self) -> None:
        """Return once no step is under way (checked again after every wake-up: a loop
        may start a step between the wake-up and the caller's turn)."""
        while self._under_way:
            await self._idle.wait()
