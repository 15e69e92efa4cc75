"""Drill scenarios and the runner behind ``hactl drill`` (docs/drills.md).

One drill: start a cluster (:mod:`~ha_controller.drills.cluster`), start the workloads
(:mod:`~ha_controller.drills.workloads`) and the role observer, run the scenario's
faults (:mod:`~ha_controller.drills.nemesis`), then always heal, wait for the masters,
stop the producers and drain (consumers run until every acknowledged message arrived
or ``drain_timeout_s`` passed), and judge the history with the checker.  Writes
``DIR/history.jsonl``, ``DIR/verdict.json``, ``DIR/report.html`` and ``DIR/logs/`` (the
brokers' and nameservers' logs, and ``clients.log``: what the drill's own clients and
nemesis logged at INFO and above).

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

The RIP-32 special-message scenarios run the plain producer and push consumer of
``DrillTopic`` as background traffic plus their own workload; each holds the master
of ``broker-a`` down for ``fault_s`` *after* a slave was seen acting, then restarts it.
Slaves copy consumer offsets, delay offsets and the timer checkpoint from the master
every 2 s, so what the master consumed or delivered in the last 2 s before a hard kill
is served again by the acting slave (at-least-once, as in RocketMQ); ``delayed-acting``
and ``pop-acting`` keep that window empty before each kill so that the verdict judges
the acting slave itself:

``delayed-acting``
    delay-level and timer messages (short levels via ``HAC_DELAY_LEVELS``) sent before
    and during the kill; those stored on ``broker-a`` fall due while its slave acts and
    are escaped by it to ``broker-b``; judged with the checker's default tolerances
    (the slave acts within a fraction of a second, so none is late).
``transactions-acting``
    one transaction per message: committed or rolled back at once, or left open for the
    brokers' check-back; those open on ``broker-a`` at the kill are escaped by the acting
    slave and checked from ``broker-b``.
``pop-acting``
    a SimpleConsumer (POP) receives and acks through the acting slave; a share of
    messages is deliberately not acked and comes back through the retry topic (judged
    with ``redelivery="after_ack"``).
``generated``
    a generated schedule (:mod:`ha_controller.drills.generator`: kill, pause,
    pause-past-expiry, partition, loss, disk-full, slave and nameserver faults, some
    overlapping on two groups) against every workload at once: the plain, FIFO, pull
    (with offset commits), delayed, transactional, POP and two orderly consumers with
    strict locks.  After each step the drill waits for every group's master and probes
    the pull group's committed offsets.  The schedule comes from ``options.schedule``
    or is drawn from ``seed``, ``families`` and ``faults``; the cluster gets a second
    nameserver and tmpfs stores when the schedule needs them.  A fault this cluster
    cannot inject is recorded as a ``fault`` fail event (with the reason) and skipped.
    Judged with :data:`GENERATED_CHECK` (campaigns, :mod:`~ha_controller.drills.campaign`).
``strict-lock``
    two orderly consumers of one group on a FIFO topic with broker lock strict mode on
    (``--no-strict``: off).  Consumer A holds every queue; the master of ``broker-a`` is
    killed (``--netns``: partitioned) right after A renewed its locks; consumer B joins
    while the slave acts and is allotted ``broker-a``'s queues, which it must not get
    until A let them go; the master returns; B leaves.  Strict mode: no double grant.
    Without it the acting slave, which never saw A's locks, grants them to B at once:
    the verdict fails with ``double_lock_grants`` (the risk strict mode removes).
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
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final, Literal, Protocol

from ha_controller.client.admin import NameserverClient
from ha_controller.drills.checker import CheckOptions, FaultWindow, Verdict, check
from ha_controller.drills.cluster import ClusterSpec, DrillCluster, FaultUnsupported, Replication
from ha_controller.drills.generator import (
    FAMILIES,
    GeneratorSpec,
    PlannedFault,
    Schedule,
    ScheduleGenerator,
    Step,
)
from ha_controller.drills.history import Event, Fault, HistoryWriter, StoreMode, read_history
from ha_controller.drills.needs import refusal
from ha_controller.drills.nemesis import (
    ActiveFault,
    FaultKind,
    Nemesis,
    RoleObserver,
    heal_action,
)
from ha_controller.drills.report import write_report
from ha_controller.drills.workloads import (
    DelayedProducerWorkload,
    Delivered,
    OrderlyWorkload,
    PopWorkload,
    ProducerWorkload,
    PullWorkload,
    PushWorkload,
    TransactionWorkload,
    offset_probe,
)
from ha_controller.process import LOG_FORMAT
from ha_controller.protocol.errors import HaError
from ha_controller.protocol.properties import now_ms
from ha_controller.testing import EventuallyTimeout, eventually

__all__ = [
    "DELAY_LEVELS_S",
    "GENERATED_CHECK",
    "SCENARIOS",
    "DrillOptions",
    "DrillResult",
    "Scenario",
    "run_drill",
    "run_drill_sync",
]

log = logging.getLogger(__name__)

FlushMode = Literal["sync", "async"]

TOPIC: Final = "DrillTopic"
FIFO_TOPIC: Final = "DrillFifo"
PUSH_GROUP: Final = "drill-push"
FIFO_GROUP: Final = "drill-fifo"
PULL_GROUP: Final = "drill-pull"
GROUP_A: Final = "broker-a"
DELAY_TOPIC: Final = "DrillDelay"
DELAY_GROUP: Final = "drill-delay"
TX_TOPIC: Final = "DrillTx"
TX_GROUP: Final = "drill-tx"
POP_TOPIC: Final = "DrillPop"
POP_GROUP: Final = "drill-pop"
ORDERLY_TOPIC: Final = "DrillOrderly"
ORDERLY_GROUP: Final = "drill-orderly"

#: ``HAC_DELAY_LEVELS`` of ``delayed-acting``: level n delays by entry n-1 seconds.
DELAY_LEVELS_S: Final[tuple[int, ...]] = (1, 2, 3, 4, 5, 6, 8, 10)
#: ``delayed-acting`` draws levels 1..6 and timers of 1..6 s
DELAY_MAX_S: Final = 6
POP_INVISIBLE_S: Final = 3.0
#: POP offsets and the revive progress replicate through the commit log with the
#: messages, so the drill keeps popping right up to the kill (no quiet period)
POP_QUIESCE_S: Final = 0.0
#: client ids sort B before A, so B is allotted broker-a's queues (AllocateAveragely)
ORDERLY_IDS: Final = {"orderly-a": "drill-orderly-2-a", "orderly-b": "drill-orderly-1-b"}
#: queues of every drill topic in every group
QUEUES: Final = 4
#: the brokers' not-active timeout in drills (FAST_ENV), which ``pause`` stays below
#: and ``pause-past-expiry`` goes past
NOT_ACTIVE_TIMEOUT_MS: Final = 2000
#: size of each broker's tmpfs store when a schedule fills disks
TMPFS_STORE_MB: Final = 64
#: ``generated``: how late a delayed message may be.  A master frozen or cut off holds
#: its due messages until it is expired (not-active timeout 2 s, scan 0.5 s) and a
#: slave acts; 5 s covers that budget with room, a later delivery is a finding.
GENERATED_LATE_TOLERANCE_MS: Final = 5_000
#: where a failing drill keeps its brokers' stores (a gzipped tar of ``store/``)
STORES_ARCHIVE: Final = "stores.tar.gz"
#: the checker options of ``generated`` drills (and so of campaigns): the POP group's
#: duplicates count after its first ack (un-acked POP messages come back by design);
#: every other group's count strictly
GENERATED_CHECK: Final = CheckOptions(
    timer_tolerance_ms=GENERATED_LATE_TOLERANCE_MS,
    level_tolerance_ms=GENERATED_LATE_TOLERANCE_MS,
    after_ack_groups=frozenset({POP_GROUP}),
)


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
    #: ``strict-lock``: brokers lock queues in strict mode (``--no-strict``: False)
    strict_locks: bool = True
    #: nameservers to run (1 or 2)
    nameservers: int = 1
    #: each broker's store on a tmpfs of this many MiB (disk-full faults)
    tmpfs_store_mb: int | None = None
    #: ``generated``: the schedule to run (None: drawn from ``seed``, ``families``,
    #: ``faults``)
    schedule: Schedule | None = None
    families: tuple[str, ...] = ()
    faults: int = 8
    #: ``generated``: the generator's spec (None: the defaults for this cluster)
    generator: GeneratorSpec | None = None
    #: the brokers' ``flush_mode`` (None: the broker's default, ``async``)
    flush_mode: FlushMode | None = None
    #: each broker's store through the FUSE layer that loses unsynced writes
    lazyfs_stores: bool = False
    #: every process with a wall clock of its own (clock faults)
    clock_shim: bool = False


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
    #: further consumers (POP, orderly) the drain waits for, per consumer group
    consumers: list[Consuming] = field(default_factory=list)
    #: further drain conditions: name -> how many things are still outstanding
    waits: dict[str, Callable[[], int]] = field(default_factory=dict)
    #: ``_acting_cycle`` hooks: awaited before each master kill / called right after it
    before_fault: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    after_fault: list[Callable[[], None]] = field(default_factory=list)
    deadline: float = 0.0
    #: groups whose master was lost for good (not waited for at the end)
    lost_masters: set[str] = field(default_factory=set)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    async def wait_acting(self, group: str = GROUP_A, timeout: float = 30.0) -> float | None:
        """Wait until a slave of ``group`` is observed acting; the seconds waited, or None."""
        t = time.monotonic()

        def acting() -> bool:
            return any(
                role == "acting" and target.startswith(group + "/")
                for target, role in self.observer.roles.items()
            )

        try:
            await eventually(acting, timeout, interval=0.1)
        except EventuallyTimeout:
            self.say(f"WARNING: no slave of {group} acted within {timeout:.0f} s")
            return None
        return time.monotonic() - t

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
        except (HaError, OSError) as exc:  # e.g. a nameserver that lost its routes
            self.say(f"WARNING: offset probe failed: {type(exc).__name__}: {exc}")
        finally:
            self.puller.resume()


class Consuming(Protocol):
    """A consumer workload as the drain sees it."""

    @property
    def consumer_group(self) -> str: ...
    @property
    def topic(self) -> str: ...
    @property
    def delivered(self) -> Delivered: ...


ScenarioFn = Callable[[Drill], Awaitable[None]]
SetupFn = Callable[[Drill, contextlib.AsyncExitStack], Awaitable[None]]


def _no_env(_o: DrillOptions) -> Mapping[str, str]:
    return {}


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    run: ScenarioFn
    netns: bool = False
    spec: Callable[[DrillOptions], DrillOptions] = lambda o: o
    #: the checker's options for this scenario (also for ``hactl analyze``)
    check: CheckOptions = field(default_factory=CheckOptions)
    #: environment of every cluster process (broker settings the scenario needs)
    env: Callable[[DrillOptions], Mapping[str, str]] = _no_env
    #: topics to create besides DrillTopic/DrillFifo
    topics: tuple[str, ...] = ()
    #: starts the scenario's own workloads (after the standard ones) on the stack
    setup: SetupFn | None = None


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


async def _heal_master(d: Drill, fault: ActiveFault) -> None:
    await d.nemesis.heal(fault)
    waited = await d.wait_master()
    d.say(f"master of {GROUP_A} online {waited:.1f} s after the heal")


async def _acting_cycle(d: Drill) -> None:
    """Repeat: kill the master, hold it down ``fault_s`` after a slave acts, restart.
    The drill's ``before_fault`` hooks run before each kill, ``after_fault`` right after."""
    o = d.options
    await asyncio.sleep(min(4.0, max(d.remaining() * 0.1, 2.0)))
    n = 0
    while n == 0 or d.remaining() > o.fault_s + 6:
        for before in d.before_fault:
            await before()
        fault = await d.nemesis.inject("kill", d.nemesis.resolve("master", GROUP_A))
        for after in d.after_fault:
            after()
        waited = await d.wait_acting()
        if waited is not None:
            d.say(f"a slave of {GROUP_A} acts {waited:.1f} s after the fault")
        await asyncio.sleep(d.jitter(o.fault_s))
        await _heal_master(d, fault)
        n += 1
        if d.remaining() <= 0:
            break
        await asyncio.sleep(min(d.jitter(o.gap_s), max(d.remaining(), 0.0)))
    if d.remaining() > 0:
        await asyncio.sleep(d.remaining())


def _push(d: Drill, topic: str, group: str) -> PushWorkload:
    return PushWorkload(d.cluster.namesrv, topic, group, d.history, process=f"push-{topic}")


def _special_rate(o: DrillOptions) -> float:
    return max(o.rate / 4, 5.0)


async def _setup_delayed(d: Drill, stack: contextlib.AsyncExitStack) -> None:
    o = d.options
    d.pushers.append(await stack.enter_async_context(_push(d, DELAY_TOPIC, DELAY_GROUP)))
    delayed = await stack.enter_async_context(
        DelayedProducerWorkload(
            d.cluster.namesrv,
            DELAY_TOPIC,
            d.history,
            process="delay-0",
            levels_ms=[s * 1000 for s in DELAY_LEVELS_S],
            levels=range(1, DELAY_MAX_S + 1),
            timer_ms=(1000, DELAY_MAX_S * 1000),
            seed=o.seed,
            rate=_special_rate(o),
            concurrency=2,
            max_attempts=o.send_attempts,
        )
    )
    d.producers.append(delayed)


async def _setup_transactions(d: Drill, stack: contextlib.AsyncExitStack) -> None:
    o = d.options
    pusher = await stack.enter_async_context(_push(d, TX_TOPIC, TX_GROUP))
    d.pushers.append(pusher)
    tx = await stack.enter_async_context(
        TransactionWorkload(
            d.cluster.namesrv,
            TX_TOPIC,
            d.history,
            process="tx-0",
            seed=o.seed,
            rate=_special_rate(o),
            concurrency=2,
            max_attempts=o.send_attempts,
        )
    )
    d.producers.append(tx)
    d.waits["unresolved transactions"] = lambda: len(tx.unresolved() - pusher.delivered.keys)


async def _setup_pop(d: Drill, stack: contextlib.AsyncExitStack) -> None:
    o = d.options
    pop = await stack.enter_async_context(
        PopWorkload(
            d.cluster.namesrv,
            POP_TOPIC,
            POP_GROUP,
            d.history,
            process="pop-0",
            invisible_s=POP_INVISIBLE_S,
            skip_ratio=0.2,
            seed=o.seed,
        )
    )
    d.consumers.append(pop)
    d.waits["POP deliveries not acked"] = lambda: len(pop.pending())

    async def quiesce() -> None:
        # POP offsets and the revive service's progress replicate to the slaves through
        # the commit log, so nothing needs to settle before the kill: the acting slave
        # continues exactly where the master stopped (RocketMQ's slaves copy every 10 s
        # and pop again what the master popped in that window).
        if POP_QUIESCE_S:
            await pop.pause()
            await asyncio.sleep(POP_QUIESCE_S)

    d.before_fault.append(quiesce)
    d.after_fault.append(pop.resume)
    d.producers.append(
        await stack.enter_async_context(
            ProducerWorkload(
                d.cluster.namesrv,
                POP_TOPIC,
                d.history,
                process="pop-producer",
                rate=_special_rate(o),
                concurrency=2,
                max_attempts=o.send_attempts,
            )
        )
    )


def _orderly(d: Drill, process: str) -> OrderlyWorkload:
    return OrderlyWorkload(
        d.cluster.namesrv,
        ORDERLY_TOPIC,
        ORDERLY_GROUP,
        d.history,
        process=process,
        client_id=ORDERLY_IDS[process],
    )


async def _start_orderly_producer(d: Drill, stack: contextlib.AsyncExitStack) -> None:
    """The producer of the orderly topic: one sender, eight message groups."""
    d.producers.append(
        await stack.enter_async_context(
            ProducerWorkload(
                d.cluster.namesrv,
                ORDERLY_TOPIC,
                d.history,
                process="orderly-producer",
                rate=_special_rate(d.options),
                concurrency=1,
                message_groups=8,
                max_attempts=d.options.send_attempts,
            )
        )
    )


async def _setup_strict_lock(d: Drill, stack: contextlib.AsyncExitStack) -> None:
    a, b = (_orderly(d, process) for process in ORDERLY_IDS)
    for workload in (a, b):  # B starts later, in the scenario
        stack.push_async_callback(workload.aclose)
        d.consumers.append(workload)
    await a.start()
    await _start_orderly_producer(d, stack)


async def _strict_lock(d: Drill) -> None:
    o = d.options
    a, b = (c for c in d.consumers if isinstance(c, OrderlyWorkload))
    everything = QUEUES * len(o.groups)

    def holds(w: OrderlyWorkload, n: int) -> bool:
        return len(w.consumer.held_queues()) == n

    with contextlib.suppress(EventuallyTimeout):
        await eventually(lambda: holds(a, everything), 20, 0.1)
    await asyncio.sleep(min(3.0, max(d.remaining() * 0.1, 1.0)))
    # A renews now, so that its next renewal is lock_renew_interval_s (20 s) away
    outcome = await a.consumer.lock_all()
    d.say(f"{a.process} renewed {len(outcome.granted)} locks; the master of {GROUP_A} goes")
    kind: FaultKind = "partition" if o.netns else "kill"
    fault = await d.nemesis.inject(kind, d.nemesis.resolve("master", GROUP_A))
    waited = await d.wait_acting()
    if waited is not None:
        d.say(f"a slave of {GROUP_A} acts {waited:.1f} s after the fault; {b.process} joins")
    await b.start()
    t = time.monotonic()
    try:
        await eventually(lambda: holds(b, QUEUES) and holds(a, everything - QUEUES), 30, 0.1)
        d.say(f"{b.process} holds {GROUP_A}'s queues {time.monotonic() - t:.1f} s after joining")
    except EventuallyTimeout:
        d.say(f"WARNING: {b.process} did not get {GROUP_A}'s queues while the slave acts")
    await asyncio.sleep(d.jitter(o.fault_s))
    await _heal_master(d, fault)
    await asyncio.sleep(min(3.0, max(d.remaining(), 1.0)))
    d.say(f"{b.process} leaves")
    await b.aclose()
    with contextlib.suppress(EventuallyTimeout):
        await eventually(lambda: holds(a, everything), 30, 0.1)
    d.say(
        f"{a.process} holds all {everything} queues again; lock grants "
        f"a={a.locker.grants} b={b.locker.grants}, refusals a={a.locker.refusals} "
        f"b={b.locker.refusals}"
    )
    if d.remaining() > 0:
        await asyncio.sleep(d.remaining())


async def _setup_orderly(d: Drill, stack: contextlib.AsyncExitStack) -> None:
    """Two orderly consumers of one group, both running throughout (``generated``)."""
    for process in ORDERLY_IDS:
        workload = _orderly(d, process)
        stack.push_async_callback(workload.aclose)
        d.consumers.append(workload)
        await workload.start()
    await _start_orderly_producer(d, stack)


async def _setup_everything(d: Drill, stack: contextlib.AsyncExitStack) -> None:
    """Every special workload besides the standard ones (``generated``)."""
    await _setup_delayed(d, stack)
    await _setup_transactions(d, stack)
    await _setup_pop(d, stack)
    await _setup_orderly(d, stack)


def _generated_env(o: DrillOptions) -> Mapping[str, str]:
    return {
        "HAC_DELAY_LEVELS": " ".join(f"{s}s" for s in DELAY_LEVELS_S),
        "HAC_TRANSACTION_CHECK_INTERVAL_MS": "500",
        "HAC_TRANSACTION_TIMEOUT_MS": "2000",
        "HAC_TRANSACTION_CHECK_MAX": "1000",
        "HAC_POP_REVIVE_INTERVAL_MS": "200",
        "HAC_LOCK_IN_STRICT_MODE": "true" if o.strict_locks else "false",
        "HAC_BROKER_NOT_ACTIVE_TIMEOUT_MS": str(NOT_ACTIVE_TIMEOUT_MS),
    }


def generator_spec(o: DrillOptions) -> GeneratorSpec:
    """The generator spec for ``o``'s cluster (``o.generator`` when given)."""
    if o.generator is not None:
        return o.generator
    return GeneratorSpec(
        groups=o.groups, replicas=o.replicas, not_active_timeout_ms=NOT_ACTIVE_TIMEOUT_MS
    )


def _generated_spec(o: DrillOptions) -> DrillOptions:
    """Draw the schedule (unless given) and size the cluster and the duration for it."""
    schedule = o.schedule
    if schedule is not None:  # a replay asks for every family it holds
        refused = refusal(schedule.families, netns=o.netns)
        if refused is not None:
            raise FaultUnsupported(refused)
    else:
        if o.families:  # asked for: every one must run, or the drill does not start
            refused = refusal(o.families, netns=o.netns)
            if refused is not None:
                raise FaultUnsupported(refused)
            families = o.families
        else:  # the default: the families this machine can fault
            families = tuple(f for f in FAMILIES if refusal([f], netns=o.netns) is None)
        schedule = ScheduleGenerator(o.seed, generator_spec(o)).generate(families, o.faults)
    return replace(
        o,
        schedule=schedule,
        nameservers=max(o.nameservers, schedule.nameservers),
        tmpfs_store_mb=o.tmpfs_store_mb or (TMPFS_STORE_MB if schedule.needs_tmpfs else None),
        lazyfs_stores=o.lazyfs_stores or schedule.needs_lazyfs,
        clock_shim=o.clock_shim or schedule.needs_clock_shim,
        duration_s=schedule.estimated_s(),
    )


async def _generated(d: Drill) -> None:
    """Run ``d.options.schedule`` step by step (module docstring, ``generated``)."""
    schedule = d.options.schedule
    assert schedule is not None, "the generated scenario needs a schedule"
    for line in schedule.describe():
        d.say("  " + line)
    await asyncio.sleep(2.0)
    for i, step in enumerate(schedule.steps):
        d.say(f"step {i + 1}/{len(schedule.steps)}")
        await _run_step(d, step)
        for g in d.options.groups:
            waited = await d.wait_master(g)
            if waited > 0.5:
                d.say(f"master of {g} online {waited:.1f} s after the step")
        await d.probe()
        await asyncio.sleep(step.gap_s)


async def _run_step(d: Drill, step: Step) -> None:
    async def one(planned: PlannedFault) -> None:
        await asyncio.sleep(planned.offset_s)
        try:
            fault = await d.nemesis.inject(
                planned.kind,
                planned.target,
                loss_pct=planned.loss_pct,
                direction=planned.direction,
                family=planned.family,
                variant=planned.variant,
                stopped=planned.stopped,
                clock_step_s=planned.clock_step_s,
                seed=zlib.crc32(f"{d.options.seed}/{planned.describe()}".encode()),
            )
        except FaultUnsupported as exc:
            d.history.record(
                "nemesis",
                "fail",
                Fault(
                    kind=planned.kind, target=planned.target, detail=str(exc), family=planned.family
                ),
            )
            d.say(f"skipped {planned.describe()}: {exc}")
            return
        await asyncio.sleep(planned.duration_s)
        await d.nemesis.heal(fault)

    async with asyncio.TaskGroup() as tg:
        for planned in step.faults:
            tg.create_task(one(planned))


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
        Scenario(
            "delayed-acting",
            "delay-level and timer messages fall due while the slave acts; escaped to broker-b",
            _acting_cycle,
            spec=lambda o: replace(o, fifo=False, pull=False),
            env=lambda o: {"HAC_DELAY_LEVELS": " ".join(f"{s}s" for s in DELAY_LEVELS_S)},
            topics=(DELAY_TOPIC,),
            setup=_setup_delayed,
        ),
        Scenario(
            "transactions-acting",
            "transactions open at the kill are escaped by the acting slave and checked back",
            _acting_cycle,
            spec=lambda o: replace(o, fifo=False, pull=False),
            env=lambda o: {
                "HAC_TRANSACTION_CHECK_INTERVAL_MS": "500",
                "HAC_TRANSACTION_TIMEOUT_MS": "2000",
                "HAC_TRANSACTION_CHECK_MAX": "1000",
            },
            topics=(TX_TOPIC,),
            setup=_setup_transactions,
        ),
        Scenario(
            "pop-acting",
            "a SimpleConsumer receives and acks through the acting slave; un-acked ones revive",
            _acting_cycle,
            spec=lambda o: replace(o, fifo=False, pull=False),
            check=CheckOptions(redelivery="after_ack"),
            env=lambda o: {"HAC_POP_REVIVE_INTERVAL_MS": "200"},
            topics=(POP_TOPIC,),
            setup=_setup_pop,
        ),
        Scenario(
            "generated",
            "a generated fault schedule (--seed, --families, --faults) against every workload",
            _generated,
            spec=_generated_spec,
            check=GENERATED_CHECK,
            env=_generated_env,
            topics=(DELAY_TOPIC, TX_TOPIC, POP_TOPIC, ORDERLY_TOPIC),
            setup=_setup_everything,
        ),
        Scenario(
            "strict-lock",
            "two orderly consumers; one joins while the slave acts; strict locks (--no-strict)",
            _strict_lock,
            spec=lambda o: replace(o, fifo=False, pull=False),
            env=lambda o: {"HAC_LOCK_IN_STRICT_MODE": "true" if o.strict_locks else "false"},
            topics=(ORDERLY_TOPIC,),
            setup=_setup_strict_lock,
        ),
    )
}


# ---- the runner ------------------------------------------------------------------------


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
        await _shielded_thread(cluster.start)
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
