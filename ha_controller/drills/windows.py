"""The fault windows of a verdict: unavailability per fault, group and kind of
operation, the spans without a writable master, and the report's send-failure spans
(definitions: :mod:`ha_controller.drills.checker`, "Availability").
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from ha_controller.drills.history import Event
from ha_controller.drills.verdict import POWER_CLUSTER, FaultWindow

__all__ = [
    "TARGET_BROKER_RE",
    "UNWRITABLE_KINDS",
    "Ops",
    "SpanOverlap",
    "UnavailabilityWindow",
    "fault_windows",
    "no_writable_master_spans",
    "target_group",
    "unavailability_windows",
]

#: fault kinds that leave their target group without a writable master while they last
#: (when they target the master, id 0): clients cannot write there, and an acting slave
#: is read-only
UNWRITABLE_KINDS: Final[frozenset[str]] = frozenset({"kill", "pause", "partition", "disk", "power"})
#: the end of a fault that was never healed
_OPEN_END: Final = 2**62


def _merge(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def no_writable_master_spans(faults: Iterable[FaultWindow]) -> list[tuple[int, int]]:
    """Disjoint ``[start, end)`` spans (ms) during which every broker group of the
    history had a fault of :data:`UNWRITABLE_KINDS` on its master (``"<group>/0"``),
    so nothing could be written anywhere: a delayed message falling due then waits for
    the first master to take writes again.  The groups are those the faults name
    (targets and the groups of their write windows); a never-healed fault lasts for
    ever.  A power loss of a group (target ``"<group>"``) takes that group's master down
    too, one of the cluster (``"cluster"``) every group's.  Empty when some group never
    lost its master."""
    faults = list(faults)
    groups: set[str] = set()
    down: dict[str, list[tuple[int, int]]] = defaultdict(list)
    whole: list[FaultWindow] = []  # power losses of a group or of the cluster
    for fw in faults:
        groups.update(fw.write_unavailable_ms)
        group = target_group(fw.target)
        if group is None:
            if fw.kind == "power":
                whole.append(fw)
            continue
        groups.add(group)
        if fw.kind in UNWRITABLE_KINDS and fw.target == f"{group}/0":
            end = _OPEN_END if fw.end_ms is None else fw.end_ms
            if end > fw.start_ms:
                down[group].append((fw.start_ms, end))
    for fw in whole:
        hit = set(groups) if fw.target == POWER_CLUSTER else {fw.target}
        groups.update(hit)
        end = _OPEN_END if fw.end_ms is None else fw.end_ms
        if end > fw.start_ms:
            for g in hit:
                down[g].append((fw.start_ms, end))
    if not groups or any(g not in down for g in groups):
        return []
    common = _merge(down[next(iter(groups))])
    for g in groups:
        spans = _merge(down[g])
        common = [
            (max(a, c), min(b, d)) for a, b in common for c, d in spans if max(a, c) < min(b, d)
        ]
    return common


class SpanOverlap:
    """``(a, b)`` -> how much of ``[a, b]`` the (disjoint, sorted) spans cover."""

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        self._spans = spans

    def __call__(self, a: int, b: int) -> int:
        return sum(max(0, min(b, end) - max(a, start)) for start, end in self._spans)


@dataclass(frozen=True, slots=True)
class _Op:
    t_ms: int  # outcome recorded (the invoke, for an unanswered send)
    issued_ms: int
    group: str | None


_CLUSTER: Final = object()  # the scope of every operation, whatever its group
_NO_GROUP: Final = object()  # the scope of the operations that name no group


class Ops:
    """The failures and successes of one kind (writes or reads); windows per scope."""

    def __init__(self) -> None:
        self.failures: list[_Op] = []
        self.successes: list[_Op] = []
        self._index: dict[object, tuple[list[_Op], list[int], list[_Op], list[int]]] = {}

    def add(self, ok: bool, t_ms: int, issued_ms: int, group: str | None) -> None:
        (self.successes if ok else self.failures).append(_Op(t_ms, issued_ms, group))

    @property
    def groups(self) -> list[str]:
        named = {op.group for op in (*self.failures, *self.successes)}
        return sorted(g for g in named if g is not None)

    def _scope(self, scope: object) -> tuple[list[_Op], list[int], list[_Op], list[int]]:
        """Failures and successes of ``scope`` (a group, or a marker), sorted by time."""
        found = self._index.get(scope)
        if found is None:
            want = None if scope is _NO_GROUP else scope

            def sort(ops: list[_Op]) -> list[_Op]:
                return sorted(
                    (op for op in ops if scope is _CLUSTER or op.group == want),
                    key=lambda op: op.t_ms,
                )

            fails, oks = sort(self.failures), sort(self.successes)
            found = (fails, [op.t_ms for op in fails], oks, [op.t_ms for op in oks])
            self._index[scope] = found
        return found

    def window(
        self, group: str | None, start: int, until: int | None, *, targeted: bool = False
    ) -> int | None:
        """The unavailability window of ``group`` (None: the cluster) for a fault that
        started at ``start`` and whose epoch ends at ``until``; ``targeted``: the window
        opens at ``start`` whether or not an operation failed (module docstring)."""
        fails, fail_t, oks, ok_t = self._scope(_CLUSTER if group is None else group)
        lo, hi = _span(fail_t, start, until)
        if targeted:
            opened = start  # every failure in the epoch is at or after it
        elif lo < hi:
            opened = min(max(op.issued_ms, start) for op in fails[lo:hi])
        else:
            return 0
        for op in oks[bisect.bisect_left(ok_t, opened) :]:
            if op.issued_ms >= opened:
                return op.t_ms - opened
        return None

    def unattributed(self, start: int, until: int | None) -> int:
        """Failures that name no group recorded in ``[start, until)``."""
        lo, hi = _span(self._scope(_NO_GROUP)[1], start, until)
        return max(hi - lo, 0)


def _span(sorted_times: list[int], start: int, until: int | None) -> tuple[int, int]:
    """Index range of the times in ``[start, until)`` (``until`` None: no end)."""
    hi = len(sorted_times) if until is None else bisect.bisect_left(sorted_times, until)
    return bisect.bisect_left(sorted_times, start), hi


#: a fault target naming a broker: ``"<group>/<broker id>"`` (Spark uses the same regex)
TARGET_BROKER_RE: Final = r"^(.+)/[0-9]+$"


def target_group(target: str) -> str | None:
    """The broker group a fault ``target`` names (``"broker-a/0"`` -> ``"broker-a"``);
    None for a nameserver, a link or anything else."""
    m = re.fullmatch(TARGET_BROKER_RE[1:-1], target)
    return m.group(1) if m else None


def fault_windows(
    starts: list[tuple[int, str, str]],
    heals: Mapping[tuple[str, str], list[int]],
    writes: Ops,
    reads: Ops,
) -> tuple[FaultWindow, ...]:
    epochs = sorted({start for start, _kind, _target in starts})
    targeted: dict[int, set[str]] = defaultdict(set)  # start -> groups faults there target
    for start, _kind, target in starts:
        group = target_group(target)
        if group is not None:
            targeted[start].add(group)
    write_groups, read_groups = writes.groups, reads.groups
    out: list[FaultWindow] = []
    for start, kind, target in sorted(starts):
        healed = sorted(heals.get((kind, target), []))
        i = bisect.bisect_left(healed, start)
        end = healed[i] if i < len(healed) else None
        j = bisect.bisect_right(epochs, start)
        until = epochs[j] if j < len(epochs) else None
        out.append(
            FaultWindow(
                kind,
                target,
                start,
                end,
                writes.window(None, start, until),
                reads.window(None, start, until),
                {
                    g: writes.window(g, start, until, targeted=g in targeted[start])
                    for g in write_groups
                },
                {g: reads.window(g, start, until) for g in read_groups},
                writes.unattributed(start, until),
                reads.unattributed(start, until),
            )
        )
    return tuple(out)


# --- unavailability windows (report material; not part of verdict.json) -------------------


@dataclass(frozen=True, slots=True)
class UnavailabilityWindow:
    """A span during which sends failed: first failed/unknown send to the next send ok."""

    start_ms: int
    end_ms: int | None

    @property
    def duration_ms(self) -> int | None:
        return None if self.end_ms is None else self.end_ms - self.start_ms


def unavailability_windows(
    history: Iterable[Event], *, merge_gap_ms: int = 2_000
) -> list[UnavailabilityWindow]:
    """OpenChaos ``RecoveryChecker`` windows over ``send`` outcomes.

    A window opens at the first ``fail``/``info`` send and closes at the next send ok;
    a window that opens less than ``merge_gap_ms`` after the previous one closed is
    merged into it.  The last window has ``end_ms=None`` when no ok followed.
    """
    outcomes = sorted(
        (ev.t_ms, ev.type == "ok")
        for ev in history
        if ev.f == "send" and ev.type in ("ok", "fail", "info")
    )
    windows: list[list[int | None]] = []
    open_at: int | None = None
    for t, ok in outcomes:
        if not ok and open_at is None:
            open_at = t
        elif ok and open_at is not None:
            last = windows[-1] if windows else None
            if last is not None and last[1] is not None and open_at - last[1] < merge_gap_ms:
                last[1] = t
            else:
                windows.append([open_at, t])
            open_at = None
    if open_at is not None:
        windows.append([open_at, None])
    return [UnavailabilityWindow(int(w[0] or 0), w[1]) for w in windows]
