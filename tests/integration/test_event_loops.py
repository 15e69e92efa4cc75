"""The servers and the client work on both event loops: the standard asyncio loop and
uvloop (used when installed; ``HAC_EVENT_LOOP`` chooses); and the producer's
coalescing of the sends of one tick.  Real processes."""

from __future__ import annotations

import asyncio
import importlib.util
import time
from pathlib import Path

import pytest

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message, ReceivedMessage
from ha_controller.client.producer import Producer
from ha_controller.client.push_consumer import PushConsumer
from ha_controller.process import EVENT_LOOP_ENV, event_loop_choice, run
from ha_controller.protocol.errors import ConfigError
from ha_controller.testing import eventually, run_cluster

TOPIC = "L"
N = 200

LOOPS = [
    "asyncio",
    pytest.param(
        "uvloop",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("uvloop") is None, reason="uvloop not installed"
        ),
    ),
]


async def produce_and_consume(namesrv: str) -> tuple[str, dict[str, bytes], set[str]]:
    loop_module = type(asyncio.get_running_loop()).__module__.split(".")[0]
    async with NameserverClient([namesrv]) as ns:

        async def routed() -> bool:
            groups = await ns.groups()
            if not groups or not all(g.master_online for g in groups):
                return False
            await ns.create_topic(TOPIC, queues=2)
            return bool((await ns.route(TOPIC)).broker_datas)

        await eventually(routed, timeout=30)
    sent: dict[str, bytes] = {}
    got: set[str] = set()

    async def listener(m: ReceivedMessage) -> bool:
        if sent.get(m.key) == m.body:
            got.add(m.key)
        return True

    async with Producer(namesrv, group="loop-p") as producer:
        sends = []
        for i in range(N):
            key = f"k{i:03d}"
            sent[key] = b"%d" % i * (1 + i % 7)
            sends.append(producer.send(Message(TOPIC, sent[key], keys=(key,))))
        await asyncio.gather(*sends)  # concurrent: many frames per tick both ways
    async with PushConsumer(namesrv, "loop-g", TOPIC, listener):
        await eventually(lambda: len(got) == N, timeout=20)
    return loop_module, sent, got


@pytest.mark.parametrize("loop", LOOPS)
def test_produce_and_consume_on_each_event_loop(tmp_path: Path, loop: str) -> None:
    cluster = run_cluster(("broker-a",), 2, workdir=tmp_path, env={EVENT_LOOP_ENV: loop})
    try:
        for handle in (cluster.nameserver, *cluster.brokers.values()):
            assert f"event loop: {loop}" in handle.log_tail(400), handle.name
        loop_module, sent, got = run(produce_and_consume(cluster.namesrv), choice=loop)
        assert loop_module == loop
        assert got == set(sent)
    finally:
        cluster.stop()


def test_a_bad_event_loop_choice_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EVENT_LOOP_ENV, "tokio")
    with pytest.raises(ConfigError, match="HAC_EVENT_LOOP: 'tokio' is not one of"):
        event_loop_choice()
    monkeypatch.setenv(EVENT_LOOP_ENV, "ASYNCIO")
    assert event_loop_choice() == "asyncio"
    monkeypatch.delenv(EVENT_LOOP_ENV)
    expected = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    assert event_loop_choice() == expected


async def test_sends_of_one_tick_travel_together_and_fail_alone(tmp_path: Path) -> None:
    """Coalescing: the concurrent sends of one event-loop tick go as one request (one
    queue, consecutive offsets, each caller its own receipt); a message too large
    fails alone, a caller that gives up does not take the others with it; a send
    alone in its tick is not held back."""
    from ha_controller.protocol.errors import MessageTooLarge

    cluster = run_cluster(("broker-a",), 2, workdir=tmp_path)
    try:
        async with NameserverClient([cluster.namesrv]) as ns:

            async def routed() -> bool:
                groups = await ns.groups()
                if not groups or not all(g.master_online for g in groups):
                    return False
                await ns.create_topic(TOPIC, queues=4)
                return bool((await ns.route(TOPIC)).broker_datas)

            await eventually(routed, timeout=30)
        async with Producer(cluster.namesrv, group="co-p", max_message_bytes=4096) as producer:
            await producer.send(Message(TOPIC, b"warm"))
            cancelled = asyncio.ensure_future(producer.send(Message(TOPIC, b"gone")))
            sends = [producer.send(Message(TOPIC, b"m%d" % i, keys=(f"k{i}",))) for i in range(40)]
            too_big = producer.send(Message(TOPIC, b"x" * 5000))
            cancelled.cancel()
            results = await asyncio.gather(*sends, too_big, return_exceptions=True)
            error = results[40]
            assert isinstance(error, MessageTooLarge)
            receipts = [r for r in results[:40] if not isinstance(r, BaseException)]
            assert len(receipts) == 40, results[:40]
            assert [r.keys for r in receipts] == [(f"k{i}",) for i in range(40)]
            assert len({r.queue_id for r in receipts}) == 1
            offsets = [r.queue_offset for r in receipts]
            assert offsets == list(range(offsets[0], offsets[0] + 40))
            assert cancelled.cancelled()
            # more than coalesce_max_messages in one tick: split, every caller answered
            many = await asyncio.gather(*(producer.send(Message(TOPIC, b"n")) for _ in range(150)))
            assert len({(r.queue_id, r.queue_offset) for r in many}) == 150
            started = time.monotonic()
            for _ in range(20):  # alone in its tick: no waiting for company
                await producer.send(Message(TOPIC, b"solo"))
            assert time.monotonic() - started < 2.0
    finally:
        cluster.stop()
