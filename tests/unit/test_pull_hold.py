"""PullHoldService: long polling without sockets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from fakes import FakeClock

from broker_agent.pull_hold import HoldResult, PullHoldService, WakeReason
from ha_controller.protocol.errors import Overloaded, ServiceStopping

LONG_MS = 20_000  # a pull consumer's suspend time; never reached in these tests


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


async def eventually(predicate: Callable[[], bool], timeout: float = 1.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0)


async def started(
    svc: PullHoldService, coro: Coroutine[Any, Any, HoldResult]
) -> asyncio.Task[HoldResult]:
    """Start a hold and wait until the service counts it."""
    before = svc.held_count
    task = asyncio.create_task(coro)
    await eventually(lambda: svc.held_count > before or task.done())
    return task


@pytest.fixture
def svc() -> PullHoldService:
    return PullHoldService(max_held=8, clock=monotonic_ms)


async def test_notify_wakes_hold_within_a_few_ms(svc: PullHoldService) -> None:
    task = await started(svc, svc.hold("T", 0, 10, LONG_MS))
    assert svc.held_count == 1
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert svc.notify("T", 0, 11, tag_hash=7) == 1
    result = await task
    assert loop.time() - t0 < 0.05
    assert result.reason is WakeReason.ARRIVED
    assert result.has_data and not result.timed_out
    assert result.max_offset == 11
    assert svc.held_count == 0


async def test_notify_below_offset_keeps_holding(svc: PullHoldService) -> None:
    task = await started(svc, svc.hold("T", 0, 10, LONG_MS))
    # max_offset is exclusive: 10 means the last message sits at offset 9.
    assert svc.notify("T", 0, 10) == 0
    assert svc.notify("T", 1, 50) == 0  # other queue
    assert svc.notify("U", 0, 50) == 0  # other topic
    assert not task.done()
    assert svc.notify("T", 0, 12) == 1
    assert (await task).max_offset == 12


async def test_tag_filter_mismatch_keeps_holding(svc: PullHoldService) -> None:
    task = await started(svc, svc.hold("T", 0, 0, LONG_MS, tag_filter={101, 102}))
    assert svc.notify("T", 0, 1, tag_hash=999) == 0
    await asyncio.sleep(0.01)
    assert not task.done()
    assert svc.held_count == 1
    assert svc.notify("T", 0, 2, tag_hash=102) == 1
    result = await task
    assert result.reason is WakeReason.ARRIVED
    assert result.max_offset == 2


async def test_notify_without_tag_passes_any_filter(svc: PullHoldService) -> None:
    task = await started(svc, svc.hold("T", 0, 0, LONG_MS, tag_filter=frozenset({1})))
    assert svc.notify("T", 0, 1, tag_hash=None) == 1
    assert (await task).reason is WakeReason.ARRIVED


async def test_notify_wakes_only_the_holds_it_satisfies(svc: PullHoldService) -> None:
    low = await started(svc, svc.hold("T", 0, 5, LONG_MS))
    high = await started(svc, svc.hold("T", 0, 9, LONG_MS))
    tagged = await started(svc, svc.hold("T", 0, 5, LONG_MS, tag_filter={1}))
    assert svc.notify("T", 0, 6, tag_hash=2) == 1
    assert (await low).max_offset == 6
    assert not high.done() and not tagged.done()
    assert svc.held_count == 2
    assert svc.notify("T", 0, 10, tag_hash=1) == 2
    assert (await high).reason is WakeReason.ARRIVED
    assert (await tagged).reason is WakeReason.ARRIVED


async def test_timeout(svc: PullHoldService) -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    result = await svc.hold("T", 0, 0, timeout_ms=30)
    elapsed = loop.time() - t0
    assert result.reason is WakeReason.TIMEOUT
    assert result.timed_out and not result.has_data
    assert result.max_offset is None
    assert 0.025 <= elapsed < 1.0
    assert result.held_ms >= 25
    assert svc.held_count == 0


async def test_zero_timeout_returns_at_once(svc: PullHoldService) -> None:
    result = await svc.hold("T", 0, 0, timeout_ms=0)
    assert result.timed_out
    assert svc.held_count == 0


async def test_notify_answers_holds_past_deadline_by_clock() -> None:
    # RocketMQ's notifyMessageArriving also answers requests whose suspend time is over.
    clock = FakeClock(5_000)
    svc = PullHoldService(max_held=4, clock=clock)
    task = await started(svc, svc.hold("T", 0, 10, LONG_MS, tag_filter={1}))
    clock.now += LONG_MS
    assert svc.notify("T", 0, 11, tag_hash=2) == 1  # no match, but expired
    result = await task
    assert result.reason is WakeReason.TIMEOUT
    assert result.held_ms == LONG_MS


async def test_bound_overflow_raises_overloaded_and_counts() -> None:
    svc = PullHoldService(max_held=2, clock=monotonic_ms)
    tasks = [await started(svc, svc.hold("T", q, 0, LONG_MS)) for q in range(2)]
    assert svc.held_count == 2
    for _ in range(3):
        with pytest.raises(Overloaded):
            await svc.hold("T", 9, 0, LONG_MS)
    assert svc.rejected_count == 3
    assert svc.held_count == 2
    # Room again once one is answered.
    svc.notify("T", 0, 1)
    await tasks[0]
    third = await started(svc, svc.hold("T", 9, 0, LONG_MS))
    assert svc.close() == 2
    await asyncio.gather(tasks[1], third)


async def test_close_wakes_all_and_refuses_new_holds(svc: PullHoldService) -> None:
    tasks = [await started(svc, svc.hold("T", q % 2, 0, LONG_MS)) for q in range(3)]
    assert svc.close() == 3
    results = await asyncio.gather(*tasks)
    assert {r.reason for r in results} == {WakeReason.CLOSED}
    assert svc.held_count == 0
    assert svc.closed
    with pytest.raises(ServiceStopping):
        await svc.hold("T", 0, 0, LONG_MS)
    assert svc.close() == 0  # idempotent


async def test_notify_master_online_wakes_everything(svc: PullHoldService) -> None:
    a = await started(svc, svc.hold("T", 0, 100, LONG_MS))
    b = await started(svc, svc.hold("U", 3, 0, LONG_MS, tag_filter={5}))
    assert svc.notify_master_online() == 2
    assert (await a).reason is WakeReason.MASTER_ONLINE
    assert (await b).reason is WakeReason.MASTER_ONLINE
    assert svc.held_count == 0
    assert not svc.closed


async def test_backstop_wakes_holds_whose_queue_has_data(svc: PullHoldService) -> None:
    behind = await started(svc, svc.hold("T", 0, 10, LONG_MS, tag_filter={1}))
    caught_up = await started(svc, svc.hold("T", 1, 20, LONG_MS))
    store = {("T", 0): 12, ("T", 1): 20}
    asked: list[tuple[str, int]] = []

    def max_offset_of(topic: str, queue_id: int) -> int:
        asked.append((topic, queue_id))
        return store[(topic, queue_id)]

    assert svc.check_all(max_offset_of) == 1
    assert sorted(asked) == [("T", 0), ("T", 1)]
    result = await behind
    assert result.reason is WakeReason.CHECKED
    assert result.has_data
    assert result.max_offset == 12
    assert not caught_up.done()
    store[("T", 1)] = 21
    assert svc.check_all(max_offset_of) == 1
    assert (await caught_up).reason is WakeReason.CHECKED
    assert svc.check_all(max_offset_of) == 0


async def test_backstop_survives_a_failing_queue(
    svc: PullHoldService, caplog: pytest.LogCaptureFixture
) -> None:
    broken = await started(svc, svc.hold("gone", 0, 0, LONG_MS))
    fine = await started(svc, svc.hold("T", 0, 0, LONG_MS))

    def max_offset_of(topic: str, queue_id: int) -> int:
        if topic == "gone":
            raise KeyError(topic)
        return 1

    assert svc.check_all(max_offset_of) == 1
    assert (await fine).reason is WakeReason.CHECKED
    assert "hold check failed for gone@0" in caplog.text
    assert not broken.done()
    svc.close()
    assert (await broken).reason is WakeReason.CLOSED


async def test_backstop_times_out_expired_holds_by_clock() -> None:
    clock = FakeClock(5_000)
    svc = PullHoldService(max_held=4, clock=clock)
    task = await started(svc, svc.hold("T", 0, 10, 1_000))
    clock.now += 999
    assert svc.check_all(lambda _t, _q: 10) == 0
    clock.now += 1
    assert svc.check_all(lambda _t, _q: 10) == 1
    assert (await task).timed_out


async def test_cancelled_hold_leaves_nothing_behind(svc: PullHoldService) -> None:
    task = await started(svc, svc.hold("T", 0, 0, LONG_MS))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert svc.held_count == 0
    assert svc.notify("T", 0, 5) == 0


async def test_hold_cancelled_after_wake_is_not_double_counted(svc: PullHoldService) -> None:
    task = await started(svc, svc.hold("T", 0, 0, LONG_MS))
    svc.notify("T", 0, 1)
    task.cancel()  # the client went away before the answer was sent
    with pytest.raises(asyncio.CancelledError):
        await task
    assert svc.held_count == 0


def test_max_held_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_held"):
        PullHoldService(max_held=0, clock=monotonic_ms)


async def test_arrival_wakes_the_services_waiting_on_that_queue_only(
    svc: PullHoldService,
) -> None:
    """The schedule service's loops wait for their queue with arrival(): woken by the
    next notify of that queue, never counted as held pulls."""
    a1 = asyncio.create_task(svc.arrival("SCHEDULE", 2, 30))
    a2 = asyncio.create_task(svc.arrival("SCHEDULE", 2, 30))
    other = asyncio.create_task(svc.arrival("SCHEDULE", 3, 0.2))
    await asyncio.sleep(0.01)
    assert svc.held_count == 0
    assert svc.notify("SCHEDULE", 2, 1) == 0  # no held pull answered
    assert list(await asyncio.wait_for(asyncio.gather(a1, a2), 1)) == [True, True]
    assert not other.done()
    assert await other is False  # its own timeout; nothing arrived in queue 3


async def test_arrival_that_times_out_leaves_nothing_behind(svc: PullHoldService) -> None:
    for _ in range(50):
        assert await svc.arrival("TIMER", 0, 0.001) is False
    task = asyncio.create_task(svc.arrival("TIMER", 0, 30))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert svc._arrivals == {}
    # a notify after them finds no waiter, and a new waiter is woken by the next one
    svc.notify("TIMER", 0, 5)
    task = asyncio.create_task(svc.arrival("TIMER", 0, 30))
    await asyncio.sleep(0.01)
    svc.check_all(lambda topic, queue_id: 0)  # the backstop names only held pulls' queues
    assert not task.done()
    svc.notify("TIMER", 0, 6)
    assert await asyncio.wait_for(task, 1) is True
