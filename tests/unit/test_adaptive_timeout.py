"""Adaptive per-attempt send timeouts and endpoint isolation, without sockets."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import FakeClock

from ha_controller.client.message import MessageQueue
from ha_controller.client.send_policy import AdaptiveTimeout, EndpointIsolation, QueueSelector

A, B = "127.0.0.1:1", "127.0.0.1:2"


def test_no_samples_means_the_whole_send_timeout() -> None:
    at = AdaptiveTimeout(min_samples=5)
    assert at.timeout_ms(A, 3000) == 3000
    for _ in range(4):
        at.observe(A, 2.0)
    assert at.timeout_ms(A, 3000) == 3000  # four samples are not enough to judge
    at.observe(A, 2.0)
    assert at.timeout_ms(A, 3000) == 200  # 5 x 2 ms, raised to the floor


def test_timeout_is_factor_times_p99_clamped() -> None:
    at = AdaptiveTimeout(factor=4.0, floor_ms=50, window=100, min_samples=100, refresh_every=1)
    for i in range(100):
        at.observe(A, 100.0 if i == 0 else 10.0)  # one outlier in 100: p99 is the outlier
    assert at.p99_ms(A) == 100.0
    assert at.timeout_ms(A, 3000) == 400
    assert at.timeout_ms(A, 300) == 300  # never above the ceiling
    for _ in range(100):
        at.observe(A, 1.0)  # the window forgets the old samples
    assert at.timeout_ms(A, 3000) == 50  # 4 ms, raised to the floor


def test_endpoints_are_judged_separately() -> None:
    at = AdaptiveTimeout(min_samples=1, refresh_every=1)
    at.observe(A, 1.0)
    at.observe(B, 500.0)
    assert at.timeout_ms(A, 3000) == 200
    assert at.timeout_ms(B, 3000) == 2500
    at.forget(B)
    assert at.timeout_ms(B, 3000) == 3000


def test_p99_is_refreshed_every_n_samples_only() -> None:
    at = AdaptiveTimeout(factor=1.0, floor_ms=1, window=8, min_samples=1, refresh_every=4)
    at.observe(A, 10.0)
    assert at.p99_ms(A) == 10.0  # first estimate as soon as there are enough samples
    for _ in range(3):
        at.observe(A, 99.0)
    assert at.p99_ms(A) == 10.0  # three samples since the last estimate
    at.observe(A, 99.0)
    assert at.p99_ms(A) == 99.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"factor": 0.5},
        {"floor_ms": 0},
        {"window": 0},
        {"window": 4, "min_samples": 5},
        {"min_samples": 0},
        {"refresh_every": 0},
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        AdaptiveTimeout(**kwargs)


def test_a_silent_endpoint_is_isolated_and_later_sends_go_elsewhere() -> None:
    """The producer's sequence after an attempt to A timed out: A is isolated, the
    retry and every later send pick B until the isolation lapses or is released."""
    clock = FakeClock(0.0)
    iso = EndpointIsolation(30.0, clock=clock)
    addr = {"broker-a": A, "broker-b": B}
    queues = [MessageQueue("T", g, i) for g in ("broker-a", "broker-b") for i in range(2)]

    def isolated(mq: MessageQueue) -> bool:
        return iso.is_isolated(addr[mq.broker_name])

    assert not iso.any()
    iso.isolate(A)
    assert iso.any()
    for start in range(8):
        assert QueueSelector.pick(queues, start, isolated=isolated).broker_name == "broker-b"
    # within one send the tried group is avoided even when B is isolated too
    iso.isolate(B)
    assert QueueSelector.pick(queues, 0, isolated=isolated, tried={"broker-a"}).broker_name == (
        "broker-b"
    )
    iso.release(B)
    clock.now = 31.0  # A's isolation lapsed
    assert not iso.is_isolated(A)
    assert QueueSelector.pick(queues, 0, isolated=isolated).broker_name == "broker-a"


def test_pick_walks_round_robin_from_start() -> None:
    queues = [MessageQueue("T", "g", i) for i in range(4)]
    assert [QueueSelector.pick(queues, s).queue_id for s in range(6)] == [0, 1, 2, 3, 0, 1]
