"""Waiting for a condition with a deadline instead of sleeping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import (
    Awaitable,
    Callable,
)
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    pass

T = TypeVar("T")


class EventuallyTimeout(AssertionError):
    """The predicate never held within the deadline."""


def eventually_sync(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02) -> T:
    """Poll ``predicate`` until it returns a truthy value; return that value."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except AssertionError as exc:
            last_exc = exc
        if time.monotonic() > deadline:
            raise EventuallyTimeout(f"condition not met within {timeout} s") from last_exc
        time.sleep(interval)


async def eventually(
    predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02
) -> Any:
    """Async poll: ``predicate`` may be sync or async; exceptions that are
    AssertionError or ha-controller errors count as "not yet"."""
    from ha_controller.protocol.errors import HaError

    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if asyncio.iscoroutine(value) or isinstance(value, Awaitable):
                value = await value
            if value:
                return value
        except (AssertionError, HaError, ConnectionError) as exc:
            last_exc = exc
        if time.monotonic() > deadline:
            raise EventuallyTimeout(f"condition not met within {timeout} s") from last_exc
        await asyncio.sleep(interval)
