"""Generated fault schedules (a Jepsen-style nemesis generator, without I/O).

:class:`ScheduleGenerator` is a plain object seeded by an int: the same seed, spec and
quota give the same :class:`Schedule`, fault for fault (targets, durations, offsets,
gaps), so a failing drill is reproduced from its seed.  Nothing here starts a process;
:mod:`ha_controller.drills.runner` (scenario ``generated``) executes a schedule and
:mod:`ha_controller.drills.campaign` runs many.

Fault families (:data:`FAMILIES`), each a kind of fault on a kind of target:

=================== ========================================= ===========================
family              fault                                     target
=================== ========================================= ===========================
kill                kill -9, restart on the same store        a group's master (id 0)
pause               SIGSTOP, SIGCONT before the not-active    a group's master
                    timeout (0.15-0.5 of it)
pause-past-expiry   SIGSTOP longer than the not-active        a group's master
                    timeout (at least 1.5 of it): the master
                    is expired, fences itself and must come
                    back through pre-online
partition           the host cut off (netns); one in three    a group's master
                    one-way (``in``: it hears nothing,
                    ``out``: it sends nothing)
loss                20-40 % packet loss (netns)               a group's master
disk-full           its tmpfs store filled, then freed        a master (3 in 4) or slave
slave               kill -9 + restart, or SIGSTOP + SIGCONT   a group's slave
nameserver          kill -9 + restart, or SIGSTOP + SIGCONT   one of the two nameservers
power-loss          power off: every write since the last     one broker (a master or a
                    fsync is lost, the processes die; power   slave), every broker of a
                    on: restart on what was synced            group, or the whole cluster
corruption          truncate a commit-log segment, flip bits  a master or a slave,
                    in a stored record, delete a consume-     running or stopped
                    queue file or a metadata table; the
                    broker restarts on what is left
clock               the process's wall clock steps forward    a nameserver, a master or
                    or back by 10-60 s; stepped back at the   a slave
                    heal (its monotonic clock never moves)
=================== ========================================= ===========================

Controller-mode families (:data:`CONTROLLER_FAMILIES`: the cluster runs three etcd
members and its nameservers the controller); each step is the family's faults alone,
aimed at whoever holds the role when the fault starts (``role``: the group's current
master, a slave that is not master, the nameserver leading the controller):

======================== ============================================================
controller-kill          kill -9 the master, restart it (it rejoins as a slave)
controller-leader-kill   kill -9 the controller leader and the master together
                         (apache/rocketmq#7689); two nameservers
controller-isolate       the master and one etcd member cut off from every other host
                         while the clients still reach the master (#7017; netns)
controller-slave-behind  SIGSTOP a slave, then kill -9 the master about when the slave
                         resumes, behind (#5663)
etcd-down                kill -9 every etcd member, and the master meanwhile: no switch
                         can be decided, RIP-32 acting keeps the reads
controller-flap          the master killed and restarted three times in a row, a
                         second or so apart (at most one switch per
                         ``min_switch_interval_ms``)
======================== ============================================================

Each fault of such a step counts as one of its family's quota; when the quota runs out
mid-step, the step keeps its first faults only (the master kill of
``controller-leader-kill``/``controller-slave-behind``/``etcd-down`` comes second).
The rule "never two faults on one group at once" does not hold inside these steps: a
slave and the master of one group is the point of ``controller-slave-behind``.

Power-loss targets name their scope: ``"broker-a/0"`` (one broker), ``"broker-a"`` (every
broker of the group) or ``"cluster"`` (every broker and nameserver); a corruption's
``variant`` says what is damaged (:data:`CORRUPTIONS`) and ``stopped`` whether the
broker was stopped first; a clock fault's ``clock_step_s`` is the step.

A schedule is a sequence of :class:`Step`: one fault, or — with probability
``overlap_ratio`` — two overlapping faults (the second starts while the first is in
effect), then a quiet gap.  Rules the generator keeps, which the unit tests check:

- never two faults on the same target at once, and never two on the same broker group
  at once: the two faults of a step are on two different groups, or one is on a
  nameserver;
- never both nameservers at once (a step holds at most one nameserver fault);
- a power loss of the whole cluster holds everything: it never overlaps another fault;
- the executor heals every fault of a step, waits for every group's master and probes
  the committed offsets before the gap: steps never overlap each other.

The quota (family -> number of faults) decides how many faults of each family the
schedule holds; their order is a seeded shuffle.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, cast

from ha_controller.drills.cluster import broker_target, nameserver_target, parse_target
from ha_controller.drills.nemesis import FaultKind
from ha_controller.drills.netns import Direction

__all__ = [
    "CLUSTER",
    "CONTROLLER_FAMILIES",
    "CORRUPTIONS",
    "DEFAULT_FAMILIES",
    "DISK_FAMILIES",
    "ETCD_MEMBERS",
    "FAMILIES",
    "FLAP_KILLS",
    "NETNS_FAMILIES",
    "POWER_SCOPES",
    "GeneratorSpec",
    "PlannedFault",
    "Schedule",
    "ScheduleGenerator",
    "Step",
    "families_needing",
    "parse_families",
    "power_scope",
    "target_group_of",
]

#: the controller-mode families, in FAMILIES order
_CONTROLLER: Final = (
    "controller-kill",
    "controller-leader-kill",
    "controller-isolate",
    "controller-slave-behind",
    "etcd-down",
    "controller-flap",
)
FAMILIES: Final[tuple[str, ...]] = (
    "kill",
    "pause",
    "pause-past-expiry",
    "partition",
    "loss",
    "disk-full",
    "slave",
    "nameserver",
    "power-loss",
    "corruption",
    "clock",
    *_CONTROLLER,
)
#: families that need controller mode (etcd and the nameservers' controller)
CONTROLLER_FAMILIES: Final = frozenset(_CONTROLLER)
#: the families a campaign or a ``generated`` drill runs when none are asked for: the
#: controller families change the cluster (controller mode), so they run only when asked
DEFAULT_FAMILIES: Final = tuple(f for f in FAMILIES if f not in CONTROLLER_FAMILIES)
#: etcd members of a controller-mode cluster
ETCD_MEMBERS: Final = 3
#: kills of one ``controller-flap`` step
FLAP_KILLS: Final = 3
#: families that need hosts in network namespaces
NETNS_FAMILIES: Final = frozenset({"partition", "loss", "controller-isolate"})
#: families that need tmpfs stores
DISK_FAMILIES: Final = frozenset({"disk-full"})
#: what else a family needs from the machine (see :mod:`ha_controller.drills.needs`)
_NEEDS: Final[Mapping[str, frozenset[str]]] = {
    "tmpfs": DISK_FAMILIES,
    "lazyfs": frozenset({"power-loss"}),
    "clock-shim": frozenset({"clock"}),
    "etcd": CONTROLLER_FAMILIES,
}
#: the target of a power loss of every broker and nameserver
CLUSTER: Final = "cluster"
#: power-loss scopes, as :func:`power_scope` names them
POWER_SCOPES: Final[tuple[str, ...]] = ("broker", "group", "cluster")
#: what a corruption damages
CORRUPTIONS: Final[tuple[str, ...]] = (
    "truncate-segment",
    "flip-bits",
    "delete-consume-queue",
    "delete-table",
)
#: families whose target is a group's master
_MASTER_FAMILIES: Final = frozenset({"kill", "pause", "pause-past-expiry", "partition", "loss"})


def parse_families(text: str | Sequence[str]) -> tuple[str, ...]:
    """``"kill,pause"`` (or a list) -> known families in :data:`FAMILIES` order."""
    items = text.split(",") if isinstance(text, str) else list(text)
    names = [n.strip() for n in items if n.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown fault families {unknown}; known: {', '.join(FAMILIES)}")
    if not names:
        raise ValueError("at least one fault family is needed")
    return tuple(f for f in FAMILIES if f in names)


def families_needing(need: str) -> frozenset[str]:
    """The families that need ``need`` (``tmpfs``, ``lazyfs``, ``clock-shim``, ``etcd``)."""
    return _NEEDS.get(need, frozenset())


def target_group_of(target: str) -> str | None:
    """The broker group of a target, None for a nameserver or the cluster."""
    try:
        return parse_target(target)[0]
    except ValueError:
        return None


def power_scope(target: str) -> str:
    """A power loss's scope by its target: ``broker``, ``group`` or ``cluster``."""
    if target == CLUSTER:
        return "cluster"
    return "broker" if target_group_of(target) is not None else "group"


@dataclass(frozen=True, slots=True)
class PlannedFault:
    """One fault of a step: injected ``offset_s`` after the step starts, healed
    ``duration_s`` later."""

    family: str
    kind: FaultKind
    target: str
    offset_s: float
    duration_s: float
    direction: Direction = "both"
    loss_pct: float = 0.0
    #: corruption: what is damaged (:data:`CORRUPTIONS`)
    variant: str = ""
    #: corruption: the broker is stopped (kill -9) before the damage, else it runs
    stopped: bool = False
    #: clock: the step of the wall clock in seconds (negative: back)
    clock_step_s: float = 0.0
    #: controller families: the target is whoever holds this role when the fault starts
    #: (``master``, ``slave``, ``leader``; ``target`` names the group, or the nameserver)
    role: str = ""

    @property
    def end_s(self) -> float:
        return self.offset_s + self.duration_s

    def describe(self) -> str:
        extra = ""
        if self.kind == "partition" and self.direction != "both":
            extra = f" one-way {self.direction}"
        if self.loss_pct:
            extra = f" {self.loss_pct:g}%"
        if self.variant and self.kind == "corrupt":
            extra = f" {self.variant}{' (stopped)' if self.stopped else ' (running)'}"
        if self.clock_step_s:
            extra = f" {self.clock_step_s:+g} s"
        if self.role:
            with_etcd = f" with {self.variant}" if self.kind == "isolate" else ""
            extra += f" (the {self.role}{with_etcd})"
        return (
            f"{self.family}: {self.kind}{extra} {self.target} at +{self.offset_s:.1f} s "
            f"for {self.duration_s:.1f} s"
        )


@dataclass(frozen=True, slots=True)
class Step:
    faults: tuple[PlannedFault, ...]
    #: quiet seconds after the faults are healed and the masters are back
    gap_s: float

    @property
    def span_s(self) -> float:
        return max(f.end_s for f in self.faults)


@dataclass(frozen=True, slots=True)
class Schedule:
    seed: int
    steps: tuple[Step, ...]

    def faults(self) -> list[PlannedFault]:
        return [f for step in self.steps for f in step.faults]

    def family_counts(self) -> Counter[str]:
        return Counter(f.family for f in self.faults())

    @property
    def families(self) -> tuple[str, ...]:
        present = {f.family for f in self.faults()}
        return tuple(f for f in FAMILIES if f in present)

    @property
    def needs_netns(self) -> bool:
        return any(f in NETNS_FAMILIES for f in self.families)

    @property
    def needs_tmpfs(self) -> bool:
        return any(f in DISK_FAMILIES for f in self.families)

    @property
    def needs_lazyfs(self) -> bool:
        return "power-loss" in self.families

    @property
    def needs_clock_shim(self) -> bool:
        return "clock" in self.families

    @property
    def needs_controller(self) -> bool:
        """Controller mode: etcd members and the nameservers' controller."""
        return any(f in CONTROLLER_FAMILIES for f in self.families)

    @property
    def nameservers(self) -> int:
        """Nameservers the cluster must run: two when a nameserver is faulted (the
        controller leader is one)."""
        return 2 if {"nameserver", "controller-leader-kill"} & set(self.families) else 1

    def estimated_s(self, settle_s: float = 2.0) -> float:
        """Seconds the executor needs: fault spans, gaps, ``settle_s`` per step."""
        return sum(step.span_s + step.gap_s + settle_s for step in self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "steps": [
                {"gap_s": step.gap_s, "faults": [asdict(f) for f in step.faults]}
                for step in self.steps
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> Schedule:
        steps = tuple(
            Step(
                tuple(
                    PlannedFault(
                        str(f["family"]),
                        cast(FaultKind, str(f["kind"])),
                        str(f["target"]),
                        float(f["offset_s"]),
                        float(f["duration_s"]),
                        cast(Direction, str(f.get("direction", "both"))),
                        float(f.get("loss_pct", 0.0)),
                        str(f.get("variant", "")),
                        bool(f.get("stopped", False)),
                        float(f.get("clock_step_s", 0.0)),
                        str(f.get("role", "")),
                    )
                    for f in step["faults"]
                ),
                float(step["gap_s"]),
            )
            for step in obj["steps"]
        )
        return cls(int(obj["seed"]), steps)

    def describe(self) -> list[str]:
        out: list[str] = []
        for i, step in enumerate(self.steps):
            faults = "; ".join(f.describe() for f in step.faults)
            out.append(f"step {i + 1}: {faults}; then {step.gap_s:.1f} s quiet")
        return out


@dataclass(frozen=True, slots=True)
class GeneratorSpec:
    """What the generator may aim at and how long faults last (seconds)."""

    groups: tuple[str, ...] = ("broker-a", "broker-b")
    replicas: int = 3
    #: the brokers' not-active timeout: ``pause`` stays below it, ``pause-past-expiry``
    #: goes well past it
    not_active_timeout_ms: int = 2000
    #: probability that a step holds two overlapping faults
    overlap_ratio: float = 0.3
    #: how long kill/partition/loss/disk/slave/nameserver faults last
    fault_s: tuple[float, float] = (3.0, 8.0)
    #: quiet time between steps
    gap_s: tuple[float, float] = (2.0, 5.0)
    loss_pct: tuple[float, float] = (20.0, 40.0)
    #: share of partitions that are one-way (``in`` or ``out``)
    one_way_ratio: float = 1 / 3
    #: share of disk-full faults aimed at a master (the rest at a slave)
    disk_master_ratio: float = 0.75
    #: how far a clock fault steps the wall clock (seconds, either way)
    clock_step_s: tuple[float, float] = (10.0, 60.0)

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("the generator needs at least one broker group")
        if self.replicas < 2:
            raise ValueError("slave faults need replicas >= 2")
        for name in ("fault_s", "gap_s", "loss_pct", "clock_step_s"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                raise ValueError(f"{name} must be 0 < low <= high, got {(lo, hi)}")
        for name in ("overlap_ratio", "one_way_ratio", "disk_master_ratio"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be within [0, 1]")


def _r(x: float) -> float:
    return round(x, 1)


class ScheduleGenerator:
    """Draws schedules from ``random.Random(seed)``; see the module docstring."""

    def __init__(self, seed: int, spec: GeneratorSpec | None = None) -> None:
        self.seed = seed
        self.spec = spec if spec is not None else GeneratorSpec()
        self._rng = random.Random(seed)

    def generate(self, families: Sequence[str], faults: int) -> Schedule:
        """``faults`` faults spread over ``families`` as evenly as possible."""
        if faults < 1:
            raise ValueError(f"faults must be >= 1, got {faults}")
        order = list(parse_families(families))
        self._rng.shuffle(order)
        quota: Counter[str] = Counter()
        for i in range(faults):
            quota[order[i % len(order)]] += 1
        return self.generate_quota(quota)

    def generate_quota(self, quota: Mapping[str, int]) -> Schedule:
        """Exactly ``quota[family]`` faults of each family, in a seeded order."""
        parse_families([f for f, n in quota.items() if n > 0] or list(FAMILIES))
        tokens = [f for f in FAMILIES for _ in range(max(quota.get(f, 0), 0))]
        if not tokens:
            raise ValueError("the quota holds no fault")
        rng = self._rng
        rng.shuffle(tokens)
        steps: list[Step] = []
        while tokens:
            if tokens[0] in CONTROLLER_FAMILIES:  # a step of the family's faults alone
                family = tokens.pop(0)
                budget = 1 + tokens.count(family)
                step_faults = self._controller_step(family)[:budget]
                for _ in step_faults[1:]:  # each fault of the step is one of the quota
                    tokens.remove(family)
                steps.append(Step(step_faults, _r(rng.uniform(*self.spec.gap_s))))
                continue
            first = self._fault(tokens.pop(0), offset_s=0.0, avoid=frozenset())
            faults = [first]
            if tokens and rng.random() < self.spec.overlap_ratio:
                partner = self._partner(tokens, first)
                if partner is not None:
                    family = tokens.pop(partner)
                    offset = _r(first.duration_s * rng.uniform(0.2, 0.8))
                    faults.append(self._fault(family, offset_s=offset, avoid=self._held(first)))
            steps.append(Step(tuple(faults), _r(rng.uniform(*self.spec.gap_s))))
        return Schedule(self.seed, tuple(steps))

    def _held(self, fault: PlannedFault) -> frozenset[str]:
        """What a fault holds: its group, ``"nameserver"``, or everything (a power loss
        of the cluster)."""
        if fault.target == CLUSTER:
            return frozenset({*self.spec.groups, "nameserver"})
        if fault.family == "power-loss" and fault.target in self.spec.groups:
            return frozenset({fault.target})
        return frozenset({target_group_of(fault.target) or "nameserver"})

    def _partner(self, tokens: list[str], first: PlannedFault) -> int | None:
        """Index of the first token that can overlap ``first`` (another group, or not two
        nameservers), None when none can."""
        held = self._held(first)
        free_groups = [g for g in self.spec.groups if g not in held]
        if first.target == CLUSTER:
            return None
        for i, family in enumerate(tokens):
            if family in CONTROLLER_FAMILIES:
                continue
            if family == "nameserver":
                if "nameserver" in held:
                    continue
            elif family != "clock" and not free_groups:
                continue  # every other family needs a group of its own
            return i
        return None

    def _group(self, avoid: frozenset[str]) -> str:
        choices = [g for g in self.spec.groups if g not in avoid]
        return self._rng.choice(choices or list(self.spec.groups))

    def _slave(self, group: str) -> str:
        return broker_target(group, self._rng.randrange(1, self.spec.replicas))

    def _fault(self, family: str, *, offset_s: float, avoid: frozenset[str]) -> PlannedFault:
        """One fault of ``family`` on a target outside ``avoid`` (groups / nameserver)."""
        rng = self._rng
        spec = self.spec
        timeout_s = spec.not_active_timeout_ms / 1000
        duration = _r(rng.uniform(*spec.fault_s))
        if family == "nameserver":
            kind: FaultKind = rng.choice(("kill", "pause"))
            target = nameserver_target(rng.randrange(2))
            return PlannedFault(family, kind, target, offset_s, duration)
        group = self._group(avoid)
        master = broker_target(group, 0)
        if family == "kill":
            return PlannedFault(family, "kill", master, offset_s, duration)
        if family == "pause":
            short = _r(max(rng.uniform(0.15, 0.5) * timeout_s, 0.1))
            return PlannedFault(family, "pause", master, offset_s, short)
        if family == "pause-past-expiry":
            lo = max(spec.fault_s[0], 1.5 * timeout_s)
            hi = max(spec.fault_s[1], 2 * timeout_s)
            return PlannedFault(family, "pause", master, offset_s, _r(rng.uniform(lo, hi)))
        if family == "partition":
            direction: Direction = "both"
            if rng.random() < spec.one_way_ratio:
                direction = rng.choice(("in", "out"))
            return PlannedFault(family, "partition", master, offset_s, duration, direction)
        if family == "loss":
            pct = float(round(rng.uniform(*spec.loss_pct)))
            return PlannedFault(family, "netem", master, offset_s, duration, loss_pct=pct)
        if family == "disk-full":
            target = master if rng.random() < spec.disk_master_ratio else self._slave(group)
            return PlannedFault(family, "disk", target, offset_s, duration)
        if family == "slave":
            kind = rng.choice(("kill", "pause"))
            return PlannedFault(family, kind, self._slave(group), offset_s, duration)
        if family == "power-loss":
            scopes = POWER_SCOPES if not avoid else POWER_SCOPES[:2]
            scope = rng.choice(scopes)
            target = {
                "broker": rng.choice((master, self._slave(group))),
                "group": group,
                "cluster": CLUSTER,
            }[scope]
            return PlannedFault(family, "power", target, offset_s, duration)
        if family == "corruption":
            target = rng.choice((master, self._slave(group)))
            variant = rng.choice(CORRUPTIONS)
            stopped = rng.random() < 0.5
            return PlannedFault(
                family, "corrupt", target, offset_s, duration, variant=variant, stopped=stopped
            )
        if family == "clock":
            step = _r(rng.uniform(*spec.clock_step_s)) * rng.choice((1, -1))
            groups_free = any(g not in avoid for g in spec.groups)
            if "nameserver" not in avoid and (not groups_free or rng.random() < 1 / 3):
                target = nameserver_target(0)
            else:
                target = rng.choice((master, self._slave(group)))
            return PlannedFault(family, "clock", target, offset_s, duration, clock_step_s=step)
        raise ValueError(f"unknown fault family {family!r}")

    def _controller_step(self, family: str) -> tuple[PlannedFault, ...]:
        """The faults of one step of a controller family (module docstring)."""
        rng = self._rng
        spec = self.spec
        group = self._group(frozenset())
        master = broker_target(group, 0)
        duration = _r(rng.uniform(*spec.fault_s))

        def kill(offset: float, length: float) -> PlannedFault:
            return PlannedFault(family, "kill", master, offset, length, role="master")

        if family == "controller-kill":
            return (kill(0.0, duration),)
        if family == "controller-leader-kill":
            leader = PlannedFault(
                family, "kill", nameserver_target(0), 0.0, duration, role="leader"
            )
            return (leader, kill(0.0, _r(rng.uniform(*spec.fault_s))))
        if family == "controller-isolate":
            member = f"etcd-{rng.randrange(ETCD_MEMBERS)}"
            return (
                PlannedFault(
                    family, "isolate", master, 0.0, duration, variant=member, role="master"
                ),
            )
        if family == "controller-slave-behind":
            slave = PlannedFault(family, "pause", self._slave(group), 0.0, duration, role="slave")
            at = _r(max(duration + rng.uniform(-1.0, 0.5), 0.5))
            return (slave, kill(at, _r(rng.uniform(*spec.fault_s))))
        if family == "etcd-down":
            etcd = PlannedFault(family, "etcd", "etcd", 0.0, duration)
            at = _r(duration * rng.uniform(0.1, 0.4))
            return (etcd, kill(at, _r(duration * rng.uniform(0.3, 1.2))))
        if family == "controller-flap":
            faults: list[PlannedFault] = []
            at = 0.0
            for _ in range(FLAP_KILLS):
                down = _r(rng.uniform(0.5, 1.5))
                faults.append(kill(at, down))
                at = _r(at + down + rng.uniform(0.5, 1.5))
            return tuple(faults)
        raise ValueError(f"unknown controller family {family!r}")
