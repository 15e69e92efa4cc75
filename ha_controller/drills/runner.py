"""Drill scenarios and the runner behind ``hactl drill`` (DESIGN.md §10).

One drill: start a cluster (:mod:`~ha_controller.drills.cluster`), start the workloads
(:mod:`~ha_controller.drills.workloads`) and the role observer, run the scenario's
faults (:mod:`~ha_controller.drills.nemesis`), then always heal, wait for the masters,
stop the producers and drain (consumers run until every acknowledged message arrived
or ``drain_timeout_s`` passed), and judge the history with the checker.  Writes
``DIR/history.jsonl``, ``DIR/verdict.json``, ``DIR/report.html`` and ``DIR/logs/``.

Scenarios (:data:`SCENARIOS`):

``kill-master``, ``pause-master``, ``partition-master`` (netns), ``loss-master`` (netns)
    repeat: fault on the current master of ``broker-a`` for ``fault_s``, heal, wait for
    the master, probe committed offsets, pause; until ``duration_s`` runs out.
``kill-slave``, ``pause-nameserver``
    the same cycle aimed at a slave or at the nameserver.
``master-return``
    the pull consumer stops, a backlog builds up, the master is killed, the backlog is
    consumed (and committed) through the acting slave, the master returns (through
    pre-online unless ``skip_pre_online``) and the committed offsets are probed.  With
    ``--skip-pre-online`` the returning master serves its stale offsets: the verdict
    must fail with ``offset_rollbacks``.
``kill-after-ack``
    both slaves of ``broker-a`` are killed, a burst is acknowledged by the master alone
    (possible only with ``--replication async``), the master is killed right after the
    last ack and its host is lost for good (not restarted), the slaves come back and
    one acts as master.  With async replication the verdict must fail with ``lost``;
    with sync replication the burst is refused by ``broker-a`` and nothing is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shutil
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from ha_controller.client.admin import NameserverClient
from ha_controller.drills.checker import FaultWindow, Verdict, check
from ha_controller.drills.cluster import ClusterSpec, DrillCluster, FaultUnsupported, Replication
from ha_controller.drills.history import Event, HistoryWriter, read_history
from ha_controller.drills.nemesis import FaultKind, Nemesis, RoleObserver
from ha_controller.drills.report import write_report
from ha_controller.drills.workloads import (
    ProducerWorkload,
    PullWorkload,
    PushWorkload,
    offset_probe,
)
from ha_controller.protocol.errors import HaError
from ha_controller.testing import EventuallyTimeout, eventually

__all__ = [
    "SCENARIOS",
    "DrillOptions",
    "DrillResult",
    "Scenario",
    "run_drill",
    "run_drill_sync",
]

log = logging.getLogger(__name__)

TOPIC: Final = "DrillTopic"
FIFO_TOPIC: Final = "DrillFifo"
PUSH_GROUP: Final = "drill-push"
FIFO_GROUP: Final = "drill-fifo"
PULL_GROUP: Final = "drill-pull"
GROUP_A: Final = "broker-a"


@dataclass(frozen=True, slots=True)
class DrillOptions:
    scenario: str
    duration_s: float = 60.0
    seed: int = 0
    out: Path | None = None
    netns: bool = False
    replication: Replication = "sync"
    skip_pre_online: bool = False
    rate: float = 100.0
    fault_s: float = 8.0
    gap_s: float = 6.0
    drain_timeout_s: float = 30.0
    fifo: bool = True
    push: bool = True
    pull: bool = True
    #: attempts per send: 1 records each attempt's outcome (Jepsen style); the client's
    #: default 3 retries an unknown outcome elsewhere, so duplicates become expected.
    send_attempts: int = 1
    groups: tuple[str, ...] = ("broker-a", "broker-b")
    replicas: int = 3
    quiet: bool = False


@dataclass(slots=True)
class DrillResult:
    options: DrillOptions
    out: Path
    verdict: Verdict
    drained: bool
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.verdict.ok


@dataclass
class Drill:
    """What a scenario works with."""

    options: DrillOptions
    cluster: DrillCluster
    history: HistoryWriter
    observer: RoleObserver
    nemesis: Nemesis
    rng: random.Random
    say: Callable[[str], None]
    producers: list[ProducerWorkload] = field(default_factory=list)
    pushers: list[PushWorkload] = field(default_factory=list)
    puller: PullWorkload | None = None
    deadline: float = 0.0
    #: groups whose master was lost for good (not waited for at the end)
    lost_masters: set[str] = field(default_factory=set)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def jitter(self, seconds: float) -> float:
        return seconds * self.rng.uniform(0.8, 1.2)

    async def wait_master(self, group: str = GROUP_A, timeout: float = 45.0) -> float:
        """Wait until the nameserver lists ``group``'s master; returns the seconds waited."""
        t = time.monotonic()
        try:
            await eventually(lambda: self.observer.master_online(group), timeout, interval=0.1)
        except EventuallyTimeout:
            self.say(f"WARNING: {group} has no master after {timeout:.0f} s")
        return time.monotonic() - t

    async def probe(self) -> None:
        """Offset probe of the pull group with the pull consumer paused (resumed after)."""
        if self.puller is None:
            return
        await self.puller.pause()  # returns at once when it is paused already
        try:
            found = await offset_probe(
                self.cluster.namesrv, TOPIC, PULL_GROUP, self.history, process="prober"
            )
            self.say(f"offset probe: {len(found)} queues read")
        finally:
            self.puller.resume()


ScenarioFn = Callable[[Drill], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    run: ScenarioFn
    netns: bool = False
    spec: Callable[[DrillOptions], DrillOptions] = lambda o: o


def _cycle(kind: FaultKind, role: str, *, loss_pct: float = 0) -> ScenarioFn:
    async def run(d: Drill) -> None:
        o = d.options
        await asyncio.sleep(min(5.0, max(d.remaining() * 0.1, 1.0)))
        n = 0
        while d.remaining() > o.fault_s + 2 or n == 0:
            target = d.nemesis.resolve(role, GROUP_A)
            fault = await d.nemesis.inject(kind, target, loss_pct=loss_pct)
            await asyncio.sleep(d.jitter(o.fault_s))
            await d.nemesis.heal(fault)
            n += 1
            if role == "master":
                waited = await d.wait_master()
                d.say(f"master of {GROUP_A} online {waited:.1f} s after the heal")
                await d.probe()
            if d.remaining() <= 0:
                break
            await asyncio.sleep(min(d.jitter(o.gap_s), max(d.remaining(), 0.0)))
        if d.remaining() > 0:  # traffic goes on, fault-free, until the duration is over
            await asyncio.sleep(d.remaining())

    return run


async def _master_return(d: Drill) -> None:
    await asyncio.sleep(min(4.0, max(d.remaining() * 0.1, 1.0)))
    assert d.puller is not None, "master-return needs the pull workload"
    await d.puller.pause()
    d.say("pull consumer paused: a backlog builds up on both groups")
    await asyncio.sleep(2.0)
    target = d.nemesis.resolve("master", GROUP_A)
    fault = await d.nemesis.inject("kill", target)
    d.puller.resume()
    d.say("pull consumer resumed: it consumes the backlog through the acting slave")
    acked = set().union(*(p.acked for p in d.producers if p.topic == TOPIC))
    with contextlib.suppress(EventuallyTimeout):
        await eventually(lambda: acked <= d.puller.delivered.keys if d.puller else True, 20, 0.1)
    await asyncio.sleep(1.5)  # the commits after the last batch
    # No commit may reach the returning master before the probe reads what it serves.
    await d.puller.pause()
    await d.nemesis.heal(fault)
    waited = await d.wait_master()
    d.say(f"master of {GROUP_A} online {waited:.1f} s after its restart")
    await d.probe()
    if d.remaining() > 0:
        await asyncio.sleep(d.remaining())


async def _kill_after_ack(d: Drill) -> None:
    await asyncio.sleep(min(4.0, max(d.remaining() * 0.1, 1.0)))
    assert d.puller is not None, "kill-after-ack needs the pull workload"
    for p in d.producers:
        p.pause()
    # The consumer must not read the burst from the master before it is lost.
    await d.puller.pause()
    slaves = [t for t in d.cluster.broker_targets(GROUP_A) if not t.endswith("/0")]
    killed = [await d.nemesis.inject("kill", t) for t in slaves]
    await asyncio.sleep(0.5)
    burst = d.producers[0]
    n = max(50, int(d.options.rate * 2))
    acked = await burst.burst(n)
    d.say(f"burst of {n}: {acked} acknowledged with {GROUP_A}'s slaves down")
    await d.nemesis.inject("kill", d.nemesis.resolve("master", GROUP_A), restart=False)
    d.lost_masters.add(GROUP_A)
    for fault in killed:
        await d.nemesis.heal(fault)
    d.puller.resume()
    for p in d.producers:
        p.resume()
    with contextlib.suppress(EventuallyTimeout):
        await eventually(lambda: d.observer.groups.get(GROUP_A, {}).get("members"), 30, 0.2)
    if d.remaining() > 0:
        await asyncio.sleep(d.remaining())


SCENARIOS: Final[dict[str, Scenario]] = {
    s.name: s
    for s in (
        Scenario(
            "kill-master", "kill -9 the master of broker-a, restart it", _cycle("kill", "master")
        ),
        Scenario(
            "pause-master", "SIGSTOP the master of broker-a, SIGCONT", _cycle("pause", "master")
        ),
        Scenario(
            "partition-master",
            "cut the master of broker-a off the network, heal",
            _cycle("partition", "master"),
            netns=True,
        ),
        Scenario(
            "loss-master",
            "drop 30% of the master's packets (netem or iptables)",
            _cycle("netem", "master", loss_pct=30),
            netns=True,
        ),
        Scenario(
            "kill-slave",
            "kill -9 the lowest slave of broker-a, restart it",
            _cycle("kill", "slave"),
        ),
        Scenario(
            "pause-nameserver", "SIGSTOP the nameserver, SIGCONT", _cycle("pause", "nameserver")
        ),
        Scenario(
            "master-return",
            "kill the master while the acting slave serves a backlog; it returns; probe offsets",
            _master_return,
        ),
        Scenario(
            "kill-after-ack",
            "slaves down, burst acked by the master alone, master lost right after",
            _kill_after_ack,
            spec=lambda o: replace(
                o, push=False, fifo=False, pull=True, drain_timeout_s=min(o.drain_timeout_s, 15.0)
            ),
        ),
    )
}


# ---- the runner ------------------------------------------------------------------------


def _say_factory(quiet: bool, t0: float) -> Callable[[str], None]:
    def say(text: str) -> None:
        if not quiet:
            print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

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
    for name in ("history.jsonl", "verdict.json", "report.html"):
        (out / name).unlink(missing_ok=True)
    t0 = time.monotonic()
    say = _say_factory(options.quiet, t0)
    spec = ClusterSpec(
        groups=options.groups,
        replicas=options.replicas,
        replication=options.replication,
        skip_pre_online=options.skip_pre_online,
        netns=options.netns,
    )
    shutil.rmtree(out / "logs", ignore_errors=True)
    cluster = DrillCluster(spec, log_dir=out / "logs")
    history = HistoryWriter(out / "history.jsonl")
    drained = False
    try:
        where = "network namespaces" if options.netns else "loopback"
        say(
            f"drill {scenario.name}: {len(options.groups)} groups x {options.replicas} replicas "
            f"({options.replication}{', skip pre-online' if options.skip_pre_online else ''}) "
            f"on {where}, {options.duration_s:.0f} s, seed {options.seed}"
        )
        await _shielded_thread(cluster.start)
        for line in cluster.describe():
            say("  " + line)
        drained = await _drive(scenario, options, cluster, history, say)
    finally:
        history.close()
        await _shielded_thread(cluster.close)
    verdict = check(out / "history.jsonl", scenario=scenario.name)
    (out / "verdict.json").write_text(verdict.to_json() + "\n", encoding="utf-8")
    events = read_history(out / "history.jsonl")
    write_report(out / "report.html", events, verdict)
    elapsed = time.monotonic() - t0
    _print_verdict(verdict, events, drained, out, elapsed, say)
    return DrillResult(options, out, verdict, drained, elapsed)


async def _shielded_thread(fn: Callable[[], object]) -> None:
    """Run blocking ``fn`` in a thread to completion even when cancelled, then re-raise."""
    task = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
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
    topics = [TOPIC, *([FIFO_TOPIC] if o.fifo else [])]
    async with NameserverClient([d.cluster.namesrv]) as ns:
        for topic in topics:
            await ns.create_topic(topic, queues=4)

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
        for topic in topics if o.push else []:
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


def _consumers(d: Drill) -> list[tuple[str, str, set[str]]]:
    out = [(w.process, w.topic, w.delivered.keys) for w in d.pushers]
    if d.puller is not None:
        out.append((d.puller.process, d.puller.topic, d.puller.delivered.keys))
    return out


def _missing(d: Drill) -> dict[str, int]:
    acked: dict[str, set[str]] = {}
    for p in d.producers:
        acked.setdefault(p.topic, set()).update(p.acked)
    return {
        name: len(acked.get(topic, set()) - keys)
        for name, topic, keys in _consumers(d)
        if acked.get(topic, set()) - keys
    }


async def _drain(d: Drill) -> bool:
    timeout = d.options.drain_timeout_s
    d.say(f"healed; draining (up to {timeout:.0f} s) until every acknowledged message arrived")
    try:
        await eventually(lambda: not _missing(d), timeout, 0.2)
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
        recv = sum(w.delivered.count for w in d.pushers) + (
            d.puller.delivered.count if d.puller else 0
        )
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


def _print_verdict(
    verdict: Verdict,
    events: Sequence[Event],
    drained: bool,
    out: Path,
    elapsed: float,
    say: Callable[[str], None],
) -> None:
    c = verdict.counts
    say(
        f"verdict {verdict.scenario}: {'OK' if verdict.ok else 'FAILED'}"
        f"{'' if drained else ' (drain timed out)'} in {elapsed:.0f} s"
    )
    say("  " + "  ".join(f"{k}={v}" for k, v in c.items()))
    if verdict.faults:
        t0 = min(f.start_ms for f in verdict.faults)
        for f in verdict.faults:
            healed = "never" if f.end_ms is None else f"{(f.end_ms - f.start_ms) / 1000:.1f} s"
            rec = "-" if f.recovery_ms is None else f"{f.recovery_ms} ms"
            acting, back = role_timings(events, f)
            roles = ""
            if acting is not None:
                roles += f"  acting slave after {acting} ms"
            if back is not None:
                roles += f"  master back {back} ms after the heal"
            say(
                f"  fault {f.kind:<9} {f.target:<11} at +{(f.start_ms - t0) / 1000:5.1f} s  "
                f"healed after {healed:<7}  recovery {rec}{roles}"
            )
    say(f"  {out / 'verdict.json'}  {out / 'report.html'}")


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
