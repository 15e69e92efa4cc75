"""The drill scenarios (:data:`SCENARIOS`) that ``hactl drill SCENARIO`` runs.

Each is a coroutine driving a :class:`~ha_controller.drills.drill.Drill`; the runner
(:mod:`ha_controller.drills.runner`) starts the cluster and the workloads around it.

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
    pause-past-expiry, partition, loss, disk-full, slave, nameserver, power-loss,
    corruption and clock faults, some overlapping on two groups) against every workload
    at once: the plain, FIFO, pull
    (with offset commits), delayed, transactional, POP and two orderly consumers with
    strict locks.  After each step the drill waits for every group's master and probes
    the pull group's committed offsets.  The schedule comes from ``options.schedule``
    or is drawn from ``seed``, ``families`` and ``faults``; the cluster gets a second
    nameserver, tmpfs stores, lazyfs stores and the clock shim when the schedule needs
    them.  Families asked for (``families``, or a given schedule's) that this machine
    cannot fault refuse the drill (:class:`FaultUnsupported`, one line); a fault that
    fails to inject once it runs is recorded as a ``fault`` fail event (with the reason)
    and skipped.
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
import time
import zlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Final

from ha_controller.drills.checker import CheckOptions
from ha_controller.drills.cluster import FaultUnsupported
from ha_controller.drills.drill import (
    GROUP_A,
    QUEUES,
    TOPIC,
    Drill,
    DrillOptions,
    Scenario,
    ScenarioFn,
)
from ha_controller.drills.generator import (
    DEFAULT_FAMILIES,
    GeneratorSpec,
    PlannedFault,
    ScheduleGenerator,
    Step,
)
from ha_controller.drills.history import Fault
from ha_controller.drills.needs import refusal
from ha_controller.drills.nemesis import (
    ActiveFault,
    FaultKind,
)
from ha_controller.drills.workloads import (
    DelayedProducerWorkload,
    OrderlyWorkload,
    PopWorkload,
    ProducerWorkload,
    PushWorkload,
    TransactionWorkload,
)
from ha_controller.testing import EventuallyTimeout, eventually

__all__ = [
    "DELAY_LEVELS_S",
    "GENERATED_CHECK",
    "NOT_ACTIVE_TIMEOUT_MS",
    "POP_GROUP",
    "SCENARIOS",
    "generator_spec",
]

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
#: the brokers' not-active timeout in drills (FAST_ENV), which ``pause`` stays below
#: and ``pause-past-expiry`` goes past
NOT_ACTIVE_TIMEOUT_MS: Final = 2000
#: size of each broker's tmpfs store when a schedule fills disks
TMPFS_STORE_MB: Final = 64
#: ``generated``: how late a delayed message may be.  A master frozen or cut off holds
#: its due messages until it is expired (not-active timeout 2 s, scan 0.5 s) and a
#: slave acts; 5 s covers that budget with room, a later delivery is a finding.
GENERATED_LATE_TOLERANCE_MS: Final = 5_000
#: the checker options of ``generated`` drills (and so of campaigns): the POP group's
#: duplicates count after its first ack (un-acked POP messages come back by design);
#: every other group's count strictly
GENERATED_CHECK: Final = CheckOptions(
    timer_tolerance_ms=GENERATED_LATE_TOLERANCE_MS,
    level_tolerance_ms=GENERATED_LATE_TOLERANCE_MS,
    after_ack_groups=frozenset({POP_GROUP}),
)


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
            families = tuple(f for f in DEFAULT_FAMILIES if refusal([f], netns=o.netns) is None)
        schedule = ScheduleGenerator(o.seed, generator_spec(o)).generate(families, o.faults)
    return replace(
        o,
        schedule=schedule,
        nameservers=max(o.nameservers, schedule.nameservers),
        tmpfs_store_mb=o.tmpfs_store_mb or (TMPFS_STORE_MB if schedule.needs_tmpfs else None),
        lazyfs_stores=o.lazyfs_stores or schedule.needs_lazyfs,
        clock_shim=o.clock_shim or schedule.needs_clock_shim,
        controller=o.controller or schedule.needs_controller,
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
        target = planned.target
        if planned.role:  # a controller family: whoever holds the role now
            target = await d.nemesis.resolve_role(planned.role, target)
            # a flapping master killed again while its restart still runs: wait for it
            with contextlib.suppress(EventuallyTimeout):
                await eventually(lambda: all(f.target != target for f in d.nemesis.active), 30, 0.1)
        try:
            fault = await d.nemesis.inject(
                planned.kind,
                target,
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
