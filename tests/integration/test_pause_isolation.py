"""A frozen master (SIGSTOP) costs a producer a fraction of a second, not its send
timeout: the attempt to the silent broker times out adaptively, the broker is
isolated, and sends go on through the other group (real processes)."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message
from ha_controller.client.producer import Producer
from ha_controller.testing import eventually, run_cluster

TOPIC = "P"


async def test_producer_keeps_acknowledging_within_half_a_second_of_a_sigstop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ha_controller.client.producer")
    cluster = run_cluster(("broker-a", "broker-b"), 2, workdir=tmp_path)
    master = cluster.broker("broker-a", 0)
    try:
        async with NameserverClient([cluster.namesrv]) as ns:

            async def masters_online() -> bool:
                groups = await ns.groups()
                return len(groups) == 2 and all(g.master_online for g in groups)

            async def routed() -> bool:
                return len((await ns.route(TOPIC)).broker_datas) == 2

            await eventually(masters_online, timeout=30)
            await ns.create_topic(TOPIC, queues=2)
            await eventually(routed, timeout=10)
        # the send timeout a producer would otherwise wait out on the frozen master
        async with Producer(cluster.namesrv, group="pause-p", send_timeout_ms=3000) as producer:
            groups_seen = set()
            for i in range(120):  # enough round trips to both masters to judge them
                receipt = await producer.send(Message(TOPIC, b"warm-%d" % i))
                groups_seen.add(receipt.broker_name)
            assert groups_seen == {"broker-a", "broker-b"}
            a_addr = producer.routes.broker_addr_for_publish("broker-a")
            assert a_addr is not None and producer.adaptive_timeout.p99_ms(a_addr) is not None

            acks: list[tuple[float, float, str]] = []  # (started, acked, group)
            stop = asyncio.Event()

            async def stream() -> None:
                i = 0
                while not stop.is_set():
                    started = time.monotonic()
                    receipt = await producer.send(Message(TOPIC, b"run-%d" % i))
                    acks.append((started, time.monotonic(), receipt.broker_name))
                    i += 1
                    await asyncio.sleep(0.005)

            task = asyncio.create_task(stream())
            try:
                await asyncio.sleep(0.3)
                t_pause = time.monotonic()
                master.pause()
                await eventually(lambda: sum(1 for a in acks if a[0] >= t_pause) >= 60, timeout=10)
            finally:
                stop.set()
                await asyncio.wait_for(task, 10)
            after = [a for a in acks if a[0] >= t_pause]  # sends started after the freeze
            first_ack_s = after[0][1] - t_pause
            assert first_ack_s <= 0.5, f"first ack {first_ack_s:.3f} s after the SIGSTOP"
            # Isolation: later sends do not go back to the silent broker (each would
            # cost an adaptive timeout); the next 50 all land on broker-b quickly.
            later = [a for a in acks if a[0] >= after[0][1]][:50]
            assert {g for _, _, g in later} == {"broker-b"}
            # ... and none of them first waited out an attempt on the frozen master: the
            # one attempt that timed out is the one that found the freeze
            timed_out = [r for r in caplog.records if "timed out" in r.getMessage()]
            assert len(timed_out) == 1, [r.getMessage() for r in timed_out]
            slowest = max(acked - started for started, acked, _ in later)
            assert slowest < 1.0, f"a send after the isolation took {slowest:.3f} s"
    finally:
        master.resume()
        cluster.stop()
