"""The three workloads, written once against the ``Driver`` surface.

Every message body starts with a 16-byte header (sequence number, then the
send time from ``time.perf_counter_ns()``, the intended send time for the
fixed-rate workload so that queueing in the client counts: no coordinated
omission) and is padded to the message size.  Producer and consumer run in
this one process, so the clock is shared.  Every loop is bounded in count and
time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import struct
import time
from collections import Counter
from typing import Any

from drivers import Driver

HEADER = struct.Struct(">Qq")


def body(seq: int, t_ns: int, size: int) -> bytes:
    head = HEADER.pack(seq, t_ns)
    return head + b"x" * max(0, size - len(head))


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


async def _wait_for(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


async def throughput(
    driver: Driver, dest: str, n: int, size: int, window: int, timeout_s: float = 180
) -> dict[str, Any]:
    """Durable produce of ``n`` messages with ``window`` sends in flight, then consume all."""
    await driver.create(dest)
    counter = iter(range(n))
    errors = 0

    async def sender() -> None:
        nonlocal errors
        for seq in counter:
            try:
                await driver.send(dest, body(seq, time.perf_counter_ns(), size), 10.0)
            except Exception:
                errors += 1

    t0 = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(sender() for _ in range(window))), timeout_s)
    produce_s = time.perf_counter() - t0
    received = 0

    def on_body(_: bytes) -> None:
        nonlocal received
        received += 1

    t1 = time.perf_counter()
    sub = await driver.subscribe(dest, f"{dest}-g", on_body)
    try:
        complete = await _wait_for(lambda: received >= n - errors, timeout_s)
        consume_s = time.perf_counter() - t1
    finally:
        await sub.aclose()
    await driver.drop(dest)
    mb = n * size / 1e6
    return {
        "n": n,
        "size": size,
        "window": window,
        "send_errors": errors,
        "received": received,
        "complete": complete,
        "produce_s": produce_s,
        "consume_s": consume_s,
        "produce_msgs_s": (n - errors) / produce_s,
        "produce_mb_s": mb / produce_s,
        "consume_msgs_s": received / consume_s,
        "consume_mb_s": received * size / 1e6 / consume_s,
    }


async def latency(
    driver: Driver, dest: str, rate: float, duration_s: float, size: int, max_inflight: int = 2000
) -> dict[str, Any]:
    """Open-loop sends at ``rate`` msg/s for ``duration_s``; end-to-end latency at the consumer."""
    await driver.create(dest)
    samples: list[float] = []

    def on_body(data: bytes) -> None:
        _, t_ns = HEADER.unpack_from(data)
        samples.append((time.perf_counter_ns() - t_ns) / 1e6)

    sub = await driver.subscribe(dest, f"{dest}-g", on_body)
    n = int(rate * duration_s)
    errors = skipped = 0
    inflight = asyncio.Semaphore(max_inflight)
    tasks: set[asyncio.Task[None]] = set()

    async def one(seq: int, t_ns: int) -> None:
        nonlocal errors
        try:
            await driver.send(dest, body(seq, t_ns, size), 10.0)
        except Exception:
            errors += 1
        finally:
            inflight.release()

    try:
        # A short warm-up so connection set-up and the first route look-ups do not count.
        for i in range(20):
            await driver.send(dest, body(1 << 40 | i, time.perf_counter_ns(), size), 10.0)
        await _wait_for(lambda: len(samples) >= 20, 30)
        samples.clear()
        start_ns = time.perf_counter_ns()
        period_ns = 1e9 / rate
        for seq in range(n):
            due = start_ns + int(seq * period_ns)
            delay = (due - time.perf_counter_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            if inflight.locked():
                skipped += 1
                continue
            await inflight.acquire()
            task = asyncio.create_task(one(seq, due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=30)
        await _wait_for(lambda: len(samples) >= n - errors - skipped, 30)
    finally:
        for task in tasks:
            task.cancel()
        await sub.aclose()
    await driver.drop(dest)
    ordered = sorted(samples)
    return {
        "rate": rate,
        "duration_s": duration_s,
        "sent": n - skipped,
        "send_errors": errors,
        "skipped_overload": skipped,
        "received": len(samples),
        "p50_ms": percentile(ordered, 0.50),
        "p99_ms": percentile(ordered, 0.99),
        "p999_ms": percentile(ordered, 0.999),
        "max_ms": ordered[-1] if ordered else math.nan,
    }


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def failover(
    driver: Driver,
    dest: str,
    leader: int,
    rate: float,
    size: int,
    before_s: float = 3.0,
    limit_s: float = 60.0,
    send_timeout_s: float = 1.0,
    fault: str = "kill",
    count_loss: bool = False,
) -> dict[str, Any]:
    """A steady stream of awaited sends; then ``fault`` the leader: ``"kill"`` (kill -9),
    ``"pause"`` (SIGSTOP, resumed with SIGCONT once both times are known or the limit
    passed) or ``"switch"`` (a planned handover, ``driver.switch_leader``, with the
    stream running one second past its end); time the next send and receive.

    ``next_send_s``: from the fault to the completion of the first successful
    send that was started after it.  ``next_receive_s``: from the fault to the
    first delivery of a message whose send started after it.  ``max_send_s``:
    the longest single awaited send (failed ones included) started after the fault.
    ``unavailable_s``: the longest time without a successful send completing, from
    the fault to the end of the stream (the writes' outage as a producer sees it).
    With ``count_loss`` the consumer gets 20 s after the stream to receive every
    acknowledged message: ``lost`` acknowledged sequence numbers never received,
    ``duplicated`` ones received more than once.
    """
    if fault not in ("kill", "pause", "switch"):
        raise ValueError(f"fault must be 'kill', 'pause' or 'switch', got {fault!r}")
    state: dict[str, Any] = {"t_kill": None, "send": None, "recv": None}
    received = 0
    slowest_after = 0.0
    acked: set[int] = set()
    seen: Counter[int] = Counter()
    done_after: list[int] = []  # completion times of successful sends after the fault

    def on_body(data: bytes) -> None:
        nonlocal received
        received += 1
        seq, t_ns = HEADER.unpack_from(data)
        seen[seq] += 1
        t_kill = state["t_kill"]
        if t_kill is not None and t_ns >= t_kill and state["recv"] is None:
            state["recv"] = time.perf_counter_ns()

    sub = await driver.subscribe(dest, f"{dest}-g", on_body)
    sent = errors = 0
    stop = asyncio.Event()

    async def stream() -> None:
        nonlocal sent, errors, slowest_after
        period = 1.0 / rate
        seq = 0
        while not stop.is_set():
            started = time.perf_counter_ns()
            try:
                await driver.send(dest, body(seq, started, size), send_timeout_s)
            except (Exception, asyncio.CancelledError) as exc:
                # aiormq fails a publish with CancelledError when its connection
                # dies; only a cancellation of this task itself ends the stream.
                if isinstance(exc, asyncio.CancelledError) and _cancelling():
                    raise
                errors += 1
                await asyncio.sleep(0.01)
            else:
                sent += 1
                acked.add(seq)
                t_kill = state["t_kill"]
                if t_kill is not None:
                    done_after.append(time.perf_counter_ns())
                if t_kill is not None and started >= t_kill and state["send"] is None:
                    state["send"] = time.perf_counter_ns()
            t_kill = state["t_kill"]
            if t_kill is not None and started >= t_kill:
                slowest_after = max(slowest_after, (time.perf_counter_ns() - started) / 1e9)
            seq += 1
            elapsed = (time.perf_counter_ns() - started) / 1e9
            if elapsed < period:
                await asyncio.sleep(period - elapsed)

    probe = getattr(driver, "probe_after_kill", None)
    extra: dict[str, Any] = {}
    streamer = asyncio.create_task(stream())
    paused = False
    try:
        await asyncio.sleep(before_s)
        if streamer.done():
            streamer.result()
        sent_before, recv_before = sent, received
        state["t_kill"] = time.perf_counter_ns()
        switch_s = math.nan
        if fault == "kill":
            killed = driver.kill_leader(leader)
        elif fault == "pause":
            killed = driver.pause_leader(leader)
            paused = True
        else:
            t0 = time.perf_counter()
            switch = getattr(driver, "switch_leader", None)
            if switch is None:
                raise ValueError(f"{type(driver).__name__} has no planned switch")
            killed = await asyncio.wait_for(switch(leader), limit_s)
            switch_s = time.perf_counter() - t0
            await asyncio.sleep(1.0)  # the stream runs on past the handover
        probe_task = None
        if probe is not None and fault != "switch":
            probe_task = asyncio.create_task(probe(dest, state["t_kill"]))
        await _wait_for(lambda: state["send"] is not None and state["recv"] is not None, limit_s)
        t_end = time.perf_counter_ns()
        # what happened while the fault lasted (a resumed leader may answer afterwards)
        t_send, t_recv = state["send"], state["recv"]
        if probe_task is not None:
            with contextlib.suppress(TimeoutError):
                extra = await asyncio.wait_for(probe_task, limit_s)
    finally:
        if paused:
            driver.resume_leader(leader)
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(streamer, 10)
        if count_loss and state["t_kill"] is not None:
            await _wait_for(lambda: acked <= seen.keys(), 20.0)
        await sub.aclose()

    def since_kill(t: int | None) -> float:
        return math.nan if t is None else (t - state["t_kill"]) / 1e9

    marks = [state["t_kill"], *(t for t in done_after if t <= t_end)]
    gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(marks)]
    if count_loss:
        extra["lost"] = len(acked - seen.keys())
        extra["duplicated"] = sum(1 for n in seen.values() if n > 1)
        extra["acknowledged"] = len(acked)
    if fault == "switch":
        extra["switch_call_s"] = switch_s

    return {
        "fault": fault,
        "rate": rate,
        "killed": killed,
        "sent_before_kill": sent_before,
        "received_before_kill": recv_before,
        "sent": sent,
        "send_errors": errors,
        "received": received,
        "next_send_s": since_kill(t_send),
        "next_receive_s": since_kill(t_recv),
        "max_send_s": slowest_after,
        "unavailable_s": max(gaps) if gaps else math.nan,
        "send_timeout_s": send_timeout_s,
        "limit_s": limit_s,
        **extra,
    }
