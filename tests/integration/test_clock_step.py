"""A master whose wall clock steps (the LD_PRELOAD clock shim, one process only) delivers
delayed messages when they are due by everyone else's clock: neither a delay-level
message stored during a forward step held back by the step once the clock is back,
nor a timer message delivered early while the step lasts.

Skips with the reason where the shim is not built (``make tools``).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message, MessageQueue
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer, PullStatus
from ha_controller.drills.clock import ClockControl, clock_available
from ha_controller.testing import EventuallyTimeout, eventually, run_cluster

GROUP_NAME = "broker-a"
TOPIC = "Later"
STEP_S = 30.0


async def test_delays_hold_across_a_step_of_the_masters_clock(tmp_path: Path) -> None:
    reason = clock_available()
    if reason is not None:
        pytest.skip(f"clock: {reason}")
    clock = ClockControl(tmp_path / "clock")
    cluster = run_cluster(
        (GROUP_NAME,), 1, workdir=tmp_path, broker_env={(GROUP_NAME, 0): clock.env()}
    )
    try:
        await cluster.wait_ready()
        async with NameserverClient([cluster.namesrv]) as ns:
            await eventually(lambda: ns.create_topic(TOPIC, queues=1), timeout=15)
        mq = MessageQueue(TOPIC, GROUP_NAME, 0)
        async with (
            Producer(cluster.namesrv) as producer,
            PullConsumer(cluster.namesrv, "later-readers") as pull,
        ):
            await eventually(lambda: producer.send(Message(TOPIC, b"now")), timeout=20)
            clock.step(STEP_S)  # the master runs 30 s ahead
            sent = time.monotonic()
            await producer.send(Message(TOPIC, b"level", delay_level=2))  # 5 s
            await producer.send(
                Message(TOPIC, b"timer", deliver_ts_ms=int(time.time() * 1000) + 8000)
            )
            early = time.monotonic()
            at: dict[bytes, float] = {}
            offset = 1

            async def arrived() -> bool:
                nonlocal offset
                res = await pull.pull(mq, offset, suspend_timeout_ms=1000)
                if res.status is PullStatus.FOUND:
                    for m in res.messages:
                        at[m.body] = time.monotonic() - sent
                    offset = res.next_begin_offset
                if time.monotonic() - early > 2.0:
                    clock.set_offset(0.0)  # the step is over: the clock is back
                return len(at) == 2

            with contextlib.suppress(EventuallyTimeout):  # judged below, by what came
                await eventually(arrived, timeout=20, interval=0.05)
    finally:
        cluster.stop()
    assert 4.0 < at.get(b"level", 99.0) < 12.0, at  # due 5 s after it was sent, not 35
    assert 7.0 < at.get(b"timer", 99.0) < 14.0, at  # due 8 s after it was sent, not at once
