"""The runner behind ``hactl drill`` (docs/drills.md).

One drill: start a cluster (:mod:`~ha_controller.drills.cluster`), start the workloads
(:mod:`~ha_controller.drills.workloads`) and the role observer, run the scenario
(:mod:`~ha_controller.drills.scenarios`, :data:`SCENARIOS`) and its faults
(:mod:`~ha_controller.drills.nemesis`), then always heal, wait for the masters, stop
the producers and drain (consumers run until every acknowledged message arrived or
``drain_timeout_s`` passed), and judge the history with the checker.  Writes
``DIR/history.jsonl``, ``DIR/verdict.json``, ``DIR/report.html`` and ``DIR/logs/`` (the
brokers' and nameservers' logs, and ``clients.log``: what the drill's own clients and
nemesis logged at INFO and above).  The drill's options and context are in
:mod:`~ha_controller.drills.drill`; this module re-exports the names scripts import.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from ha_controller.client.admin import NameserverClient
from ha_controller.drills.checker import FaultWindow, Verdict, check
from ha_controller.drills.cluster import ClusterSpec, DrillCluster, FaultUnsupported
from ha_controller.drills.drill import (
    FIFO_GROUP,
    FIFO_TOPIC,
    GROUP_A,
    PULL_GROUP,
    PUSH_GROUP,
    QUEUES,
    TOPIC,
    Consuming,
    Drill,
    DrillOptions,
    DrillResult,
    Scenario,
)
from ha_controller.drills.generator import ETCD_MEMBERS
from ha_controller.drills.history import Event, HistoryWriter, StoreMode, read_history
from ha_controller.drills.nemesis import (
    Nemesis,
    RoleObserver,
    heal_action,
)
from ha_controller.drills.report import write_report
from ha_controller.drills.scenarios import (
    DELAY_LEVELS_S,
    GENERATED_CHECK,
    ORDERLY_GROUP,
    POP_GROUP,
    SCENARIOS,
    generator_spec,
)
from ha_controller.drills.workloads import (
    ProducerWorkload,
    PullWorkload,
    PushWorkload,
)
from ha_controller.process import LOG_FORMAT
from ha_controller.protocol.errors import HaError
from ha_controller.protocol.properties import now_ms
from ha_controller.testing import EventuallyTimeout, eventually

__all__ = [
    "DELAY_LEVELS_S",
    "GENERATED_CHECK",
    "POP_GROUP",
    "SCENARIOS",
    "DrillOptions",
    "DrillResult",
    "Scenario",
    "generator_spec",
    "run_drill",
    "run_drill_sync",
]

log = logging.getLogger(__name__)

#: where a failing drill keeps its brokers' stores (a gzipped tar of ``store/``)
STORES_ARCHIVE: Final = "stores.tar.gz"


def _say_factory(quiet: bool, start_ms: int) -> Callable[[str], None]:
    """Print with the drill's one clock: seconds since ``start_ms`` (wall clock, like the
    history's ``t_ms``); the summary and report.html count from the same instant."""

    def say(text: str) -> None:
        if not quiet:
            print(f"[{(now_ms() - start_ms) / 1000:6.1f}s] {text}", flush=True)

    return say


async def run_drill(options: DrillOptions) -> DrillResult:
    """Run one drill to its verdict; the cluster is cleaned up whatever happens."""
    scenario = SCENARIOS.get(options.scenario)
    if scenario is None:
        raise ValueError(f"unknown scenario {options.scenario!r}; known: {', '.join(SCENARIOS)}")
    options = scenario.spec(options)
    if scenario.netns and not options.netns:
        raise FaultUnsupported(
            f"scenario {scenario.name} needs --netns (hosts in network namespaces)"
        )
    out = options.out or Path(tempfile.mkdtemp(prefix=f"drill-{scenario.name}-"))
    out.mkdir(parents=True, exist_ok=True)
    for name in ("history.jsonl", "verdict.json", "report.html", STORES_ARCHIVE):
        (out / name).unlink(missing_ok=True)
    t0 = time.monotonic()
    start_ms = now_ms()  # the drill start: every printed time counts from here
    say = _say_factory(options.quiet, start_ms)
    env = dict(scenario.env(options))
    if options.flush_mode is not None:
        env["HAC_FLUSH_MODE"] = options.flush_mode
    spec = ClusterSpec(
        groups=options.groups,
        replicas=options.replicas,
        replication=options.replication,
        skip_pre_online=options.skip_pre_online,
        netns=options.netns,
        env=env,
        nameservers=options.nameservers,
        tmpfs_store_mb=options.tmpfs_store_mb,
        lazyfs_stores=options.lazyfs_stores,
        clock_shim=options.clock_shim,
        etcd_members=ETCD_MEMBERS if options.controller else 0,
    )
    shutil.rmtree(out / "logs", ignore_errors=True)
    cluster = DrillCluster(spec, log_dir=out / "logs")
    history = HistoryWriter(out / "history.jsonl")
    drained = False
    client_log = _ClientLog(out / "logs" / "clients.log")
    try:
        where = "network namespaces" if options.netns else "loopback"
        say(
            f"drill {scenario.name}: {len(options.groups)} groups x {options.replicas} replicas "
            f"({options.replication}{', skip pre-online' if options.skip_pre_online else ''}) "
            f"on {where}, {options.duration_s:.0f} s, seed {options.seed}"
        )
        await _shielded_thread(cluster.start, cluster.abort_start)
        for line in cluster.describe():
            say("  " + line)
        flush_mode, flush_interval_ms = spec.store_mode()
        history.record("drill", "info", StoreMode(flush_mode, flush_interval_ms))
        say(
            f"  stores flush {flush_mode}"
            + (f" every {flush_interval_ms} ms" if flush_mode == "async" else " on every write")
            + (" through lazyfs (unsynced writes die with the power)" if spec.lazyfs_stores else "")
        )
        drained = await _drive(scenario, options, cluster, history, say)
        history.close()
        verdict = check(out / "history.jsonl", scenario=scenario.name, options=scenario.check)
        if not verdict.ok:  # what the brokers held, to read after the drill
            keep = out / STORES_ARCHIVE
            say(f"drill failed: keeping the brokers' stores in {keep}")
            await _shielded_thread(functools.partial(cluster.close, keep))
    finally:
        client_log.close()
        history.close()
        await _shielded_thread(cluster.close)
    (out / "verdict.json").write_text(verdict.to_json() + "\n", encoding="utf-8")
    events = read_history(out / "history.jsonl")
    write_report(out / "report.html", events, verdict, start_ms=start_ms)
    elapsed = time.monotonic() - t0
    _print_verdict(verdict, events, drained, out, elapsed, start_ms, say)
    return DrillResult(options, out, verdict, drained, elapsed)


class _ClientLog:
    """Copy the ``ha_controller`` loggers at INFO and above (the clients' route changes
    and failed requests, the nemesis) into ``path`` until :meth:`close`, without
    making the terminal louder than the root logger's level."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handler = logging.FileHandler(path, encoding="utf-8")
        self._handler.setLevel(logging.INFO)
        self._handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root = logging.getLogger()
        self._logger = logging.getLogger("ha_controller")
        self._level = self._logger.level
        self._quieted = [(h, h.level) for h in root.handlers]
        for h, level in self._quieted:
            h.setLevel(max(level, root.getEffectiveLevel()))
        if self._logger.getEffectiveLevel() > logging.INFO:
            self._logger.setLevel(logging.INFO)
        self._logger.addHandler(self._handler)

    def close(self) -> None:
        if self._handler not in self._logger.handlers:
            return
        self._logger.removeHandler(self._handler)
        self._handler.close()
        self._logger.setLevel(self._level)
        for h, level in self._quieted:
            h.setLevel(level)


async def _shielded_thread(
    fn: Callable[[], object], on_cancel: Callable[[], None] | None = None
) -> None:
    """Run blocking ``fn`` in a thread to completion even when cancelled (``on_cancel``
    first tells it to give up), then re-raise."""
    task = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        if on_cancel is not None:
            on_cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 120)
        raise


async def _drive(
    scenario: Scenario,
    options: DrillOptions,
    cluster: DrillCluster,
    history: HistoryWriter,
    say: Callable[[str], None],
) -> bool:
    async with RoleObserver(cluster, history) as observer:
        observe = asyncio.get_running_loop().create_task(observer.run(), name="role-observer")
        nemesis = Nemesis(cluster, history, observer, say=say)
        drill = Drill(
            options, cluster, history, observer, nemesis, random.Random(options.seed), say
        )
        try:
            return await _with_workloads(drill, scenario)
        finally:
            try:
                await nemesis.heal_all()
            finally:
                await _cancel(observe)


async def _cancel(task: asyncio.Task[None]) -> None:
    """Cancel a helper task and wait for it; our own cancellation is re-raised."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if task.cancelled():
        return
    if (current := asyncio.current_task()) is not None and current.cancelling():
        raise asyncio.CancelledError


async def _with_workloads(d: Drill, scenario: Scenario) -> bool:
    o = d.options
    await eventually(lambda: all(d.observer.master_online(g) for g in o.groups), 60, 0.1)

    async def attached() -> bool:
        return all([await d.observer.replicas_attached(g) for g in o.groups])

    await eventually(attached, 60, 0.1)
    topics = [TOPIC, *([FIFO_TOPIC] if o.fifo else []), *scenario.topics]
    async with NameserverClient(d.cluster.namesrv_addrs) as ns:
        for topic in topics:
            await ns.create_topic(topic, queues=QUEUES)

        async def routed() -> bool:
            for t in topics:
                try:
                    route = await ns.route(t)
                except HaError:
                    return False
                if len(route.broker_datas) != len(o.groups):
                    return False
            return True

        await eventually(routed, 30, 0.1)
    async with contextlib.AsyncExitStack() as stack:
        for topic in [TOPIC, *([FIFO_TOPIC] if o.fifo else [])] if o.push else []:
            d.pushers.append(
                await stack.enter_async_context(
                    PushWorkload(
                        d.cluster.namesrv,
                        topic,
                        FIFO_GROUP if topic == FIFO_TOPIC else PUSH_GROUP,
                        d.history,
                        process=f"push-{topic}",
                    )
                )
            )
        if o.pull:
            d.puller = await stack.enter_async_context(
                PullWorkload(d.cluster.namesrv, TOPIC, PULL_GROUP, d.history, process="puller-0")
            )
        d.producers.append(
            await stack.enter_async_context(
                ProducerWorkload(
                    d.cluster.namesrv,
                    TOPIC,
                    d.history,
                    process="producer-0",
                    rate=o.rate,
                    max_attempts=o.send_attempts,
                )
            )
        )
        if o.fifo:
            d.producers.append(
                await stack.enter_async_context(
                    ProducerWorkload(
                        d.cluster.namesrv,
                        FIFO_TOPIC,
                        d.history,
                        process="fifo-0",
                        rate=max(o.rate / 4, 5),
                        concurrency=1,
                        message_groups=8,
                        max_attempts=o.send_attempts,
                    )
                )
            )
        if scenario.setup is not None:
            await scenario.setup(d, stack)
        await eventually(lambda: all(p.acked for p in d.producers), 30, 0.1)
        d.say("workloads running: " + ", ".join(p.process for p in d.producers))
        d.deadline = time.monotonic() + o.duration_s
        progress = asyncio.get_running_loop().create_task(_progress(d), name="drill-progress")
        try:
            await scenario.run(d)
        finally:
            await _cancel(progress)
        await d.nemesis.heal_all()
        for g in o.groups:
            if g not in d.lost_masters:
                await d.wait_master(g)
        for p in d.producers:
            await p.stop()
        return await _drain(d)
    return False  # pragma: no cover - the exit stack does not swallow


def _consumers(d: Drill) -> list[Consuming]:
    out: list[Consuming] = [*d.pushers, *d.consumers]
    if d.puller is not None:
        out.append(d.puller)
    return out


def _missing(d: Drill) -> dict[str, int]:
    """What the drain still waits for: acknowledged keys missing per consumer group,
    and the scenario's own outstanding counts."""
    acked: dict[str, set[str]] = {}
    for p in d.producers:
        acked.setdefault(p.topic, set()).update(p.acked)
    got: dict[tuple[str, str], set[str]] = {}
    for c in _consumers(d):
        got.setdefault((c.consumer_group, c.topic), set()).update(c.delivered.keys)
    out = {
        group: len(acked.get(topic, set()) - keys)
        for (group, topic), keys in got.items()
        if acked.get(topic, set()) - keys
    }
    for name, outstanding in d.waits.items():
        if n := outstanding():
            out[name] = n
    return out


#: how long a strict queue lock can stay refused after a quorum of a group's members
#: restarted: one lock lifetime after their last vote (``lock_max_live_time_ms``, 60 s
#: by default; see broker_agent.locks.service), plus the clients' 1 s lock retry
STRICT_LOCK_FORGET_S: Final = 60.0 + 2.0


async def _drain(d: Drill) -> bool:
    timeout = d.options.drain_timeout_s
    d.say(f"healed; draining (up to {timeout:.0f} s) until every acknowledged message arrived")
    try:
        await eventually(lambda: not _missing(d), timeout, 0.2)
    except EventuallyTimeout:
        missing = _missing(d)
        if not (d.options.strict_locks and set(missing) == {ORDERLY_GROUP}):
            d.say(f"drain timed out; still missing {missing}")
            return False
        # Only the orderly group waits: with strict locks, a group whose members were
        # restarted (a quorum within one lock lifetime) grants no queue lock until every
        # lock they may have granted before expired.  That is the promise; the drill
        # waits it out instead of counting those messages lost.
        more = max(0.0, STRICT_LOCK_FORGET_S - timeout)
        d.say(
            f"drain: only {ORDERLY_GROUP} still waits ({missing[ORDERLY_GROUP]} message(s)): "
            f"strict locks refused after restarts; waiting up to {more:.0f} s more"
        )
        try:
            await eventually(lambda: not _missing(d), more, 0.2)
        except EventuallyTimeout:
            d.say(f"drain timed out; still missing {_missing(d)}")
            return False
    await asyncio.sleep(1.0)  # let late duplicates surface
    d.say("drained")
    return True


async def _progress(d: Drill) -> None:
    while True:
        await asyncio.sleep(5.0)
        sent = sum(p.sent for p in d.producers)
        acked = sum(len(p.acked) for p in d.producers)
        recv = sum(c.delivered.count for c in _consumers(d))
        roles = " ".join(
            f"{t}={r}" for t, r in sorted(d.observer.roles.items()) if t.startswith(GROUP_A)
        )
        d.say(
            f"sent {sent} acked {acked} delivered {recv} | {roles} | "
            f"{max(d.remaining(), 0):.0f} s left"
        )


def role_timings(events: Sequence[Event], fault: FaultWindow) -> tuple[int | None, int | None]:
    """(ms from the fault to an acting slave in the target's group, ms from the heal to
    the group's id 0 observed as master again); None when not observed."""
    group = fault.target.rpartition("/")[0]
    acting = back = None
    for e in events:
        if e.f != "role" or e.value.get("group") != group:
            continue
        if acting is None and e.t_ms >= fault.start_ms and e.value.get("role") == "acting":
            acting = e.t_ms - fault.start_ms
        if (
            back is None
            and fault.end_ms is not None
            and e.t_ms >= fault.end_ms
            and e.value.get("broker_id") == 0
            and e.value.get("role") == "master"
        ):
            back = e.t_ms - fault.end_ms
    return acting, back


def _windows(per_group: Mapping[str, int | None], cluster: int | None) -> str:
    def ms(w: int | None) -> str:
        return "never" if w is None else f"{w} ms"

    return ", ".join([*(f"{g} {ms(w)}" for g, w in per_group.items()), f"cluster {ms(cluster)}"])


def _print_verdict(
    verdict: Verdict,
    events: Sequence[Event],
    drained: bool,
    out: Path,
    elapsed: float,
    start_ms: int,
    say: Callable[[str], None],
) -> None:
    c = verdict.counts
    say(
        f"verdict {verdict.scenario}: {'OK' if verdict.ok else 'FAILED'}"
        f"{'' if drained else ' (drain timed out)'} in {elapsed:.0f} s"
    )
    say("  " + "  ".join(f"{k}={v}" for k, v in c.items()))
    for f in verdict.faults:
        action = heal_action(f.kind)
        healed = (
            "never healed"
            if f.end_ms is None
            else f"{action} at {(f.end_ms - start_ms) / 1000:.1f} s "
            f"(after {(f.end_ms - f.start_ms) / 1000:.1f} s)"
        )
        acting, back = role_timings(events, f)
        roles = ""
        if acting is not None:
            roles += f"; acting slave after {acting} ms"
        if back is not None:
            roles += f"; master back {back} ms after the {action}"
        say(
            f"  fault {f.kind} {f.target} at {(f.start_ms - start_ms) / 1000:.1f} s, "
            f"{healed}{roles}"
        )
        unattributed = f.unattributed_write_failures + f.unattributed_read_failures
        say(
            f"    write unavailable: {_windows(f.write_unavailable_ms, f.recovery_ms)} | "
            f"read: {_windows(f.read_unavailable_ms, f.cluster_read_unavailable_ms)}"
            + (f" | {unattributed} failures name no group" if unattributed else "")
        )
    if verdict.faults:
        parts = []
        for kind, summary in verdict.availability.items():
            p50, p99, worst = (summary[k] for k in ("p50", "p99", "max"))
            never = f", {summary['unrecovered']} never recovered" if summary["unrecovered"] else ""
            label = kind.removesuffix("_unavailable_ms")
            parts.append(f"{label} p50 {p50} / p99 {p99} / max {worst} ms{never}")
        say("  availability (worst group per fault): " + "; ".join(parts))
    say(f"  {out / 'verdict.json'}  {out / 'report.html'}  (times: s since the drill start)")


def run_drill_sync(options: DrillOptions) -> DrillResult:
    """Run a drill from synchronous code; SIGTERM cancels it like Ctrl-C (cleanup runs)."""

    async def main() -> DrillResult:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            return await run_drill(options)
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGTERM)

    return asyncio.run(main())
