"""What a drill scenario works with: its options, its running drill, its result.

:class:`DrillOptions` is what ``hactl drill`` asks for; :class:`Drill` is the running
drill a scenario function drives (cluster, history, role observer, nemesis, workloads,
deadline, and the waits every scenario uses: an acting slave, a group's master, the
offset probe); :class:`Scenario` names a scenario function with its cluster needs and
checker options (the scenarios themselves: :mod:`ha_controller.drills.scenarios`; the
runner: :mod:`ha_controller.drills.runner`).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, Protocol

from ha_controller.drills.checker import CheckOptions, Verdict
from ha_controller.drills.cluster import DrillCluster, Replication
from ha_controller.drills.generator import (
    GeneratorSpec,
    Schedule,
)
from ha_controller.drills.history import HistoryWriter
from ha_controller.drills.nemesis import (
    Nemesis,
    RoleObserver,
)
from ha_controller.drills.workloads import (
    Delivered,
    ProducerWorkload,
    PullWorkload,
    PushWorkload,
    offset_probe,
)
from ha_controller.protocol.errors import HaError
from ha_controller.testing import EventuallyTimeout, eventually

__all__ = [
    "QUEUES",
    "Consuming",
    "Drill",
    "DrillOptions",
    "DrillResult",
    "FlushMode",
    "Scenario",
    "ScenarioFn",
    "SetupFn",
]

FlushMode = Literal["sync", "async"]

TOPIC: Final = "DrillTopic"
FIFO_TOPIC: Final = "DrillFifo"
PUSH_GROUP: Final = "drill-push"
FIFO_GROUP: Final = "drill-fifo"
PULL_GROUP: Final = "drill-pull"
GROUP_A: Final = "broker-a"
#: queues of every drill topic in every group
QUEUES: Final = 4


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
    #: controller mode: three etcd members, the nameservers run the controller
    controller: bool = False


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
