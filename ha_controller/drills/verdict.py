"""What a drill's verdict holds (``verdict.json``): its counts, its faults with their
unavailability windows, the availability summary and the durability section, and the
checker's options.  Every field is defined in :mod:`ha_controller.drills.checker`'s
docstring; the in-process checker and the Spark pipeline both build these.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast

__all__ = [
    "AVAILABILITY_KINDS",
    "COUNT_NAMES",
    "FAILING_COUNTS",
    "POWER_CLUSTER",
    "REPORTED_COUNTS",
    "UNSYNCED_SLACK_MS",
    "CheckOptions",
    "Durability",
    "FaultWindow",
    "Redelivery",
    "Verdict",
    "WindowMs",
    "availability_summary",
    "unsynced_losses",
]

COUNT_NAMES: Final[tuple[str, ...]] = (
    "acknowledged",
    "delivered",
    "lost",
    "duplicated",
    "unexpected",
    "recovered",
    "order_violations",
    "late_delayed",
    "unresolved_transactions",
    "double_lock_grants",
    "offset_rollbacks",
    "corrupt_deliveries",
    "split_brain",
    "fast_switches",
    "unsynced_lost",
)
FAILING_COUNTS: Final[tuple[str, ...]] = (
    "lost",
    "duplicated",
    "unexpected",
    "order_violations",
    "late_delayed",
    "unresolved_transactions",
    "double_lock_grants",
    "offset_rollbacks",
    "corrupt_deliveries",
    "split_brain",
    "fast_switches",
)
#: counts that do not fail a drill but that campaigns add up per family as well
REPORTED_COUNTS: Final[tuple[str, ...]] = ("unsynced_lost",)
#: how long after the flush interval an acknowledged write may still be unsynced (the
#: flusher sleeps the interval, then syncs: the sync itself takes time)
UNSYNCED_SLACK_MS: Final = 1_000
#: the target of a power loss of the whole cluster
POWER_CLUSTER: Final = "cluster"

Redelivery = Literal["strict", "after_ack"]

#: operation kinds of the availability windows, as named in verdict.json
AVAILABILITY_KINDS: Final[tuple[str, ...]] = ("write", "read")


@dataclass(frozen=True, slots=True)
class CheckOptions:
    """Checker tolerances; the same object drives the Spark pipeline."""

    lock_lease_ms: int = 30_000
    timer_tolerance_ms: int = 1_000
    level_tolerance_ms: int = 4_000
    early_tolerance_ms: int = 0
    redelivery: Redelivery = "strict"
    #: consumer groups judged with ``redelivery="after_ack"`` whatever ``redelivery`` says
    after_ack_groups: frozenset[str] = frozenset()
    #: controller mode: the least time between two epochs of a group (the nameservers'
    #: ``min_switch_interval_ms``)
    min_switch_interval_ms: int = 5_000

    def after_ack(self, consumer_group: str) -> bool:
        """Whether ``consumer_group``'s duplicates count only after its first ack."""
        return self.redelivery == "after_ack" or consumer_group in self.after_ack_groups

    def __post_init__(self) -> None:
        for name in (
            "lock_lease_ms",
            "timer_tolerance_ms",
            "level_tolerance_ms",
            "min_switch_interval_ms",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.early_tolerance_ms < 0:
            raise ValueError(f"early_tolerance_ms must be >= 0, got {self.early_tolerance_ms}")
        if self.redelivery not in ("strict", "after_ack"):
            raise ValueError(f"redelivery must be 'strict' or 'after_ack', got {self.redelivery!r}")


WindowMs = int | None  # an unavailability window in ms; None: it never closed


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """One fault and its unavailability windows (module docstring, "Availability")."""

    kind: str
    target: str
    start_ms: int
    end_ms: int | None
    #: the cluster-wide write window (``cluster_write_unavailable_ms``; the old name)
    recovery_ms: WindowMs
    cluster_read_unavailable_ms: WindowMs = 0
    #: group -> write window, sorted by group
    write_unavailable_ms: Mapping[str, WindowMs] = field(default_factory=dict)
    #: group -> read window, sorted by group
    read_unavailable_ms: Mapping[str, WindowMs] = field(default_factory=dict)
    unattributed_write_failures: int = 0
    unattributed_read_failures: int = 0

    @property
    def cluster_write_unavailable_ms(self) -> WindowMs:
        return self.recovery_ms

    def worst_ms(self, kind: str) -> WindowMs:
        """The largest ``kind`` window (groups and cluster); None when one never closed."""
        if kind == "write":
            windows = [self.recovery_ms, *self.write_unavailable_ms.values()]
        elif kind == "read":
            windows = [self.cluster_read_unavailable_ms, *self.read_unavailable_ms.values()]
        else:
            raise ValueError(f"kind must be one of {AVAILABILITY_KINDS}, got {kind!r}")
        closed = [w for w in windows if w is not None]
        return max(closed) if len(closed) == len(windows) else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "target": self.target,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            "recovery_ms": self.recovery_ms,
            "cluster_write_unavailable_ms": self.recovery_ms,
            "cluster_read_unavailable_ms": self.cluster_read_unavailable_ms,
            "write_unavailable_ms": dict(sorted(self.write_unavailable_ms.items())),
            "read_unavailable_ms": dict(sorted(self.read_unavailable_ms.items())),
            "unattributed_write_failures": self.unattributed_write_failures,
            "unattributed_read_failures": self.unattributed_read_failures,
        }

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> FaultWindow:
        """Parse :meth:`to_dict`'s output; a verdict.json from before the availability
        fields reads as windows of 0 with no groups."""

        def window(value: object) -> WindowMs:
            return None if value is None else int(cast(int, value))

        def groups(name: str) -> dict[str, WindowMs]:
            return {str(g): window(w) for g, w in (obj.get(name) or {}).items()}

        return cls(
            str(obj["kind"]),
            str(obj["target"]),
            int(obj["start_ms"]),
            window(obj["end_ms"]),
            window(obj.get("cluster_write_unavailable_ms", obj["recovery_ms"])),
            window(obj.get("cluster_read_unavailable_ms", 0)),
            groups("write_unavailable_ms"),
            groups("read_unavailable_ms"),
            int(obj.get("unattributed_write_failures", 0)),
            int(obj.get("unattributed_read_failures", 0)),
        )


def _nearest_rank(ordered: list[int], pct: int) -> int | None:
    if not ordered:
        return None
    return ordered[max(math.ceil(pct * len(ordered) / 100), 1) - 1]


def availability_summary(faults: Iterable[FaultWindow]) -> dict[str, dict[str, int | None]]:
    """verdict.json's ``availability``: per kind, p50/p99/max of the faults' worst windows
    (those that closed), how many faults, how many never closed."""
    faults = list(faults)
    out: dict[str, dict[str, int | None]] = {}
    for kind in AVAILABILITY_KINDS:
        worst = [f.worst_ms(kind) for f in faults]
        closed = sorted(w for w in worst if w is not None)
        out[f"{kind}_unavailable_ms"] = {
            "p50": _nearest_rank(closed, 50),
            "p99": _nearest_rank(closed, 99),
            "max": closed[-1] if closed else None,
            "faults": len(worst),
            "unrecovered": len(worst) - len(closed),
        }
    return out


@dataclass(frozen=True, slots=True)
class Durability:
    """verdict.json's ``durability`` (module docstring, "Durability")."""

    flush_mode: str | None = None
    flush_interval_ms: int | None = None
    power_losses: int = 0
    unsynced_lost: int = 0
    loss_window_ms: int = 0

    @property
    def bound_ms(self) -> int:
        """How long before a power loss an acknowledgement may be lost (async)."""
        return (self.flush_interval_ms or 0) + UNSYNCED_SLACK_MS

    def to_dict(self) -> dict[str, Any]:
        return {
            "flush_mode": self.flush_mode,
            "flush_interval_ms": self.flush_interval_ms,
            "power_losses": self.power_losses,
            "unsynced_lost": self.unsynced_lost,
            "loss_window_ms": self.loss_window_ms,
        }

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any] | None) -> Durability:
        if not obj:
            return cls()
        mode, interval = obj.get("flush_mode"), obj.get("flush_interval_ms")
        return cls(
            None if mode is None else str(mode),
            None if interval is None else int(interval),
            int(obj.get("power_losses", 0)),
            int(obj.get("unsynced_lost", 0)),
            int(obj.get("loss_window_ms", 0)),
        )


def unsynced_losses(
    lost: Iterable[tuple[int, str | None, int]],
    power: Iterable[tuple[int, str]],
    bound_ms: int,
) -> tuple[int, int]:
    """``(unsynced_lost, loss_window_ms)`` of lost keys ``(ok_t, ok group, lost pairs)``
    against power losses ``(start_ms, target)``: a key counts when a power loss of its
    group (or the cluster) started within ``bound_ms`` after its acknowledgement; the
    window is the longest such acknowledgement-to-loss time (the earliest matching
    loss of each key).  Shared with the Spark pipeline."""
    starts = sorted(power)
    count = window = 0
    for ok_t, group, pairs in lost:
        if pairs <= 0 or group is None:
            continue
        match = [
            t
            for t, target in starts
            if target in (group, POWER_CLUSTER) and ok_t <= t <= ok_t + bound_ms
        ]
        if match:
            count += pairs
            window = max(window, match[0] - ok_t)
    return count, window


@dataclass(frozen=True, slots=True)
class Verdict:
    scenario: str
    counts: Mapping[str, int]
    faults: tuple[FaultWindow, ...] = field(default=())
    durability: Durability = field(default_factory=Durability)

    @property
    def ok(self) -> bool:
        return all(self.counts.get(name, 0) == 0 for name in FAILING_COUNTS)

    @property
    def availability(self) -> dict[str, dict[str, int | None]]:
        return availability_summary(self.faults)

    def to_dict(self) -> dict[str, Any]:
        """``{"scenario", "ok", "counts": {...}, "faults": [...], "availability": {...},
        "durability": {...}}`` (the module docstring defines every field)."""
        return {
            "scenario": self.scenario,
            "ok": self.ok,
            "counts": {name: int(self.counts.get(name, 0)) for name in COUNT_NAMES},
            "faults": [fw.to_dict() for fw in self.faults],
            "availability": self.availability,
            "durability": self.durability.to_dict(),
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> Verdict:
        """Parse :meth:`to_dict`'s output; a verdict.json from before a count was added
        reads it as 0, one without ``durability`` as the defaults."""
        counts = {name: int(obj["counts"].get(name, 0)) for name in COUNT_NAMES}
        faults = tuple(FaultWindow.from_dict(f) for f in obj["faults"])
        durability = Durability.from_dict(obj.get("durability"))
        return cls(str(obj["scenario"]), counts, faults, durability)

    def mismatches(self, other: Verdict) -> list[str]:
        """What differs from ``other`` (counts, faults and their windows, availability),
        one line each; empty when both judge the history alike (``hactl analyze``)."""
        mine, theirs = self.to_dict(), other.to_dict()
        out = [
            f"{key}: {mine[key]!r} != {theirs[key]!r}"
            for key in ("scenario", "ok", "availability", "durability")
            if mine[key] != theirs[key]
        ]
        out.extend(
            f"counts.{name}: {mine['counts'][name]} != {theirs['counts'][name]}"
            for name in COUNT_NAMES
            if mine["counts"][name] != theirs["counts"][name]
        )
        if len(mine["faults"]) != len(theirs["faults"]):
            out.append(f"faults: {len(mine['faults'])} != {len(theirs['faults'])}")
        for i, (a, b) in enumerate(zip(mine["faults"], theirs["faults"], strict=False)):
            out.extend(f"faults[{i}].{k}: {a[k]!r} != {b.get(k)!r}" for k in a if a[k] != b.get(k))
        return out
