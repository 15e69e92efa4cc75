"""In-process history checker: one drill history in, the DESIGN.md §10 verdict out.

The value schemas are in :mod:`ha_controller.drills.history`.  Events whose required keys
are missing (a ``send`` or ``receive`` without ``key``, a ``receive`` without
``consumer_group``, a lock without ``consumer``/``consumer_group``/``mq``...) are ignored.
:mod:`ha_controller.pipeline.verdict` computes exactly the same verdict with Spark; every
definition below is mirrored there and the two are tested for equal JSON.

Terms.  A key is *sent* when any ``send`` event names it; its topic and message group
come from its earliest ``send`` invoke (topic ``""`` when there is none; a key should
be invoked once, ties are broken arbitrarily).  A key is
*committed* when an ``end_tx`` ok with ``commit: true`` names it and *rolled back* when an
``end_tx`` ok with ``commit: false`` does and none with ``commit: true`` does.  A
*delivery* is one ``receive`` ok event.  A consumer group *subscribes* a topic when a
``subscribe`` event says so or when it received a message of that topic.

Counts (Jepsen's queue categories plus the RIP-32 checks):

``acknowledged``
    keys with a ``send`` ok that must be delivered: not rolled back, and, when the
    invoke had ``tx: true``, committed.
``delivered``
    number of deliveries (``receive`` ok events), duplicates included.
``lost``
    (acknowledged key, consumer group) pairs never delivered, over every group that
    subscribes the key's topic; a key whose topic no group subscribes counts once if
    nobody received it.
``duplicated``
    with ``redelivery="strict"`` (default): for every (consumer group, key), deliveries
    beyond the first.  With ``redelivery="after_ack"``: only deliveries strictly after
    the group's first ``ack`` ok of that key (re-delivering an un-acked message is
    at-least-once behaviour, not a defect).  Keys counted as unexpected are excluded.
``unexpected``
    deliveries of keys never sent, or rolled back.
``recovered``
    keys sent without an ok (``fail``, ``info`` or no completion) that were delivered
    (not rolled back).  Not an error.
``order_violations``
    FIFO: per (consumer group, consumer, message group) the consumer's first delivery
    of each acknowledged key with a message group, in delivery order (``t_ms``, then
    ``queue_offset``, then ``key``), must be non-decreasing in send-ok time (the key's
    earliest send ok ``t_ms``).  Each first delivery whose send-ok time is lower than an
    earlier one's counts once.  Re-deliveries are duplicates, not order violations.
``late_delayed``
    per (consumer group, delayed key) the first delivery must fall within
    ``[due - early_tolerance_ms, due + tolerance]``; each pair outside counts once
    (early deliveries are counted here too: the verdict has one field for "delivered at
    the wrong time").  ``due`` is ``due_ts_ms``, else invoke ``t_ms + delay_ms``, else
    invoke ``t_ms`` + the level's delay (levels above 18 use level 18); the tolerance is
    ``level_tolerance_ms`` for delay levels and ``timer_tolerance_ms`` otherwise.
``unresolved_transactions``
    ``tx`` keys with a send ok, neither committed nor rolled back, never delivered.
``double_lock_grants``
    granted ``lock`` oks made while a *different* consumer of the same consumer group
    held a lock on the same mq: grant ``g`` counts when some grant ``h`` of another
    consumer has ``h.t <= g.t < end(h)``; ``end`` is the lease end or the first unlock
    event, see the history module.
``offset_rollbacks``
    ``offset_probe`` oks that read an offset lower than some ``commit_offset`` ok of the
    same (consumer group, mq) recorded strictly earlier.

Faults: each ``fault`` info is one fault, ended by the first ``fault`` ok of the same
kind and target at or after it (``end_ms`` null when never healed).  ``recovery_ms`` is
``max(first send ok, first delivery) - start_ms`` over events at or after the start
(null while either never happens): the time until the cluster, as the clients see it,
takes writes and serves reads again.  Faults are listed by (start, kind, target).

``ok`` is true only when lost, duplicated, unexpected, order_violations, late_delayed,
unresolved_transactions, double_lock_grants and offset_rollbacks are all zero.
"""

from __future__ import annotations

import bisect
import json
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ha_controller.drills.history import DELAY_LEVELS_MS, Event, iter_history

__all__ = [
    "COUNT_NAMES",
    "FAILING_COUNTS",
    "CheckOptions",
    "FaultWindow",
    "UnavailabilityWindow",
    "Verdict",
    "check",
    "unavailability_windows",
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
)

Redelivery = Literal["strict", "after_ack"]


@dataclass(frozen=True, slots=True)
class CheckOptions:
    """Checker tolerances; the same object drives the Spark pipeline."""

    lock_lease_ms: int = 30_000
    timer_tolerance_ms: int = 1_000
    level_tolerance_ms: int = 4_000
    early_tolerance_ms: int = 0
    redelivery: Redelivery = "strict"

    def __post_init__(self) -> None:
        for name in ("lock_lease_ms", "timer_tolerance_ms", "level_tolerance_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.early_tolerance_ms < 0:
            raise ValueError(f"early_tolerance_ms must be >= 0, got {self.early_tolerance_ms}")
        if self.redelivery not in ("strict", "after_ack"):
            raise ValueError(f"redelivery must be 'strict' or 'after_ack', got {self.redelivery!r}")


@dataclass(frozen=True, slots=True)
class FaultWindow:
    kind: str
    target: str
    start_ms: int
    end_ms: int | None
    recovery_ms: int | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "target": self.target,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            "recovery_ms": self.recovery_ms,
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    scenario: str
    counts: Mapping[str, int]
    faults: tuple[FaultWindow, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return all(self.counts.get(name, 0) == 0 for name in FAILING_COUNTS)

    def to_dict(self) -> dict[str, Any]:
        """``{"scenario", "ok", "counts": {...}, "faults": [...]}`` (DESIGN.md §10)."""
        return {
            "scenario": self.scenario,
            "ok": self.ok,
            "counts": {name: int(self.counts.get(name, 0)) for name in COUNT_NAMES},
            "faults": [fw.to_dict() for fw in self.faults],
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> Verdict:
        counts = {name: int(obj["counts"][name]) for name in COUNT_NAMES}
        faults = tuple(
            FaultWindow(
                str(f["kind"]),
                str(f["target"]),
                int(f["start_ms"]),
                None if f["end_ms"] is None else int(f["end_ms"]),
                None if f["recovery_ms"] is None else int(f["recovery_ms"]),
            )
            for f in obj["faults"]
        )
        return cls(str(obj["scenario"]), counts, faults)


# --- value accessors (wrongly typed values read as missing, like Spark's parser) ------


def _s(value: Mapping[str, Any], key: str) -> str | None:
    v = value.get(key)
    return v if isinstance(v, str) else None


def _i(value: Mapping[str, Any], key: str) -> int | None:
    v = value.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _b(value: Mapping[str, Any], key: str) -> bool | None:
    v = value.get(key)
    return v if isinstance(v, bool) else None


def delay_due(
    invoke_t_ms: int, value: Mapping[str, Any], options: CheckOptions
) -> tuple[int, int] | None:
    """``(due_ts_ms, tolerance_ms)`` of a delayed send invoke, ``None`` if not delayed."""
    due = _i(value, "due_ts_ms")
    if due is not None:
        return due, options.timer_tolerance_ms
    delay = _i(value, "delay_ms")
    if delay is not None and delay > 0:
        return invoke_t_ms + delay, options.timer_tolerance_ms
    level = _i(value, "delay_level")
    if level is not None and level > 0:
        level = min(level, len(DELAY_LEVELS_MS))
        return invoke_t_ms + DELAY_LEVELS_MS[level - 1], options.level_tolerance_ms
    return None


@dataclass(slots=True)
class _Invoke:
    t_ms: int
    topic: str
    group: str | None
    tx: bool
    due: tuple[int, int] | None


def check(
    history: Iterable[Event] | str | os.PathLike[str],
    *,
    scenario: str,
    options: CheckOptions | None = None,
) -> Verdict:
    """Compute the verdict of one history (events, or a path to ``history.jsonl``)."""
    opts = options if options is not None else CheckOptions()
    events: Iterable[Event] = (
        iter_history(history) if isinstance(history, str | os.PathLike) else history
    )

    invokes: dict[str, _Invoke] = {}
    sent: set[str] = set()
    send_ok_t: dict[str, int] = {}
    commit_keys: set[str] = set()
    rollback_keys: set[str] = set()
    # (t_ms, consumer_group, consumer, key, queue_offset)
    receives: list[tuple[int, str, str, str, int]] = []
    first_ack: dict[tuple[str, str], int] = {}
    subscribed: set[tuple[str, str]] = set()  # (topic, consumer_group)
    grants: list[tuple[int, str, str, str]] = []  # (t_ms, cg, consumer, mq)
    unlocks: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    commits: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    probes: list[tuple[int, str, str, int]] = []
    fault_starts: list[tuple[int, str, str]] = []
    heals: dict[tuple[str, str], list[int]] = defaultdict(list)
    send_ok_times: list[int] = []

    for ev in events:
        v = ev.value
        f = ev.f
        if f == "send":
            key = _s(v, "key")
            if key is None:
                continue
            sent.add(key)
            if ev.type == "invoke":
                earliest = invokes.get(key)
                if earliest is None or ev.t_ms < earliest.t_ms:
                    invokes[key] = _Invoke(
                        ev.t_ms,
                        _s(v, "topic") or "",
                        _s(v, "group"),
                        _b(v, "tx") is True,
                        delay_due(ev.t_ms, v, opts),
                    )
            elif ev.type == "ok":
                send_ok_times.append(ev.t_ms)
                prev = send_ok_t.get(key)
                if prev is None or ev.t_ms < prev:
                    send_ok_t[key] = ev.t_ms
        elif f == "receive":
            if ev.type != "ok":
                continue
            key = _s(v, "key")
            cg = _s(v, "consumer_group")
            if key is None or cg is None:
                continue
            qo = _i(v, "queue_offset")
            receives.append((ev.t_ms, cg, _s(v, "consumer") or "", key, -1 if qo is None else qo))
        elif f == "ack":
            key = _s(v, "key")
            cg = _s(v, "consumer_group")
            if ev.type != "ok" or key is None or cg is None:
                continue
            ack_prev = first_ack.get((cg, key))
            if ack_prev is None or ev.t_ms < ack_prev:
                first_ack[(cg, key)] = ev.t_ms
        elif f == "subscribe":
            topic = _s(v, "topic")
            cg = _s(v, "consumer_group")
            if topic is not None and cg is not None:
                subscribed.add((topic, cg))
        elif f == "end_tx":
            key = _s(v, "key")
            commit = _b(v, "commit")
            if ev.type != "ok" or key is None or commit is None:
                continue
            (commit_keys if commit else rollback_keys).add(key)
        elif f in ("lock", "unlock"):
            cg = _s(v, "consumer_group")
            consumer = _s(v, "consumer")
            mq = _s(v, "mq")
            if cg is None or consumer is None or mq is None:
                continue
            if f == "unlock":
                unlocks[(cg, consumer, mq)].append(ev.t_ms)
            elif ev.type == "ok" and _b(v, "granted") is True:
                grants.append((ev.t_ms, cg, consumer, mq))
        elif f in ("commit_offset", "offset_probe"):
            cg = _s(v, "consumer_group")
            mq = _s(v, "mq")
            offset = _i(v, "offset")
            if ev.type != "ok" or cg is None or mq is None or offset is None:
                continue
            if f == "commit_offset":
                commits[(cg, mq)].append((ev.t_ms, offset))
            else:
                probes.append((ev.t_ms, cg, mq, offset))
        elif f == "fault":
            kind = _s(v, "kind")
            target = _s(v, "target")
            if kind is None or target is None:
                continue
            if ev.type == "info":
                fault_starts.append((ev.t_ms, kind, target))
            elif ev.type == "ok":
                heals[(kind, target)].append(ev.t_ms)

    rolled_back = rollback_keys - commit_keys
    acked = {
        k
        for k in send_ok_t
        if k not in rolled_back and (k in commit_keys or not (k in invokes and invokes[k].tx))
    }

    def unexpected_key(key: str) -> bool:
        return key not in sent or key in rolled_back

    # --- deliveries ---------------------------------------------------------------
    per_pair: dict[tuple[str, str], list[int]] = defaultdict(list)  # (cg, key) -> times
    unexpected = 0
    received_keys: set[str] = set()
    for t, cg, _consumer, key, _qo in receives:
        per_pair[(cg, key)].append(t)
        received_keys.add(key)
        if unexpected_key(key):
            unexpected += 1
        else:
            topic = invokes[key].topic if key in invokes else ""
            subscribed.add((topic, cg))

    duplicated = 0
    for (cg, key), times in per_pair.items():
        if unexpected_key(key):
            continue
        if opts.redelivery == "strict":
            duplicated += len(times) - 1
        else:
            ack_t = first_ack.get((cg, key))
            if ack_t is not None:
                duplicated += sum(1 for t in times if t > ack_t)

    groups_of_topic: dict[str, int] = defaultdict(int)
    for topic, _cg in subscribed:
        groups_of_topic[topic] += 1
    recv_groups: dict[str, int] = defaultdict(int)
    for _cg, key in per_pair:
        recv_groups[key] += 1
    lost = 0
    for key in acked:
        topic = invokes[key].topic if key in invokes else ""
        lost += max(groups_of_topic.get(topic, 0), 1) - recv_groups.get(key, 0)

    recovered = sum(
        1 for k in received_keys if k in sent and k not in send_ok_t and k not in rolled_back
    )
    unresolved = sum(
        1
        for k in send_ok_t
        if k in invokes
        and invokes[k].tx
        and k not in commit_keys
        and k not in rolled_back
        and k not in received_keys
    )

    late = 0
    for (_cg, key), times in per_pair.items():
        inv = invokes.get(key)
        if inv is None or inv.due is None or unexpected_key(key):
            continue
        due, tolerance = inv.due
        first = min(times)
        if first > due + tolerance or first < due - opts.early_tolerance_ms:
            late += 1

    # --- FIFO order ---------------------------------------------------------------------
    ordered = sorted(receives, key=lambda r: (r[0], r[4], r[3]))
    seen_first: set[tuple[str, str, str]] = set()
    max_rank: dict[tuple[str, str, str], int] = {}
    order_violations = 0
    for _t, cg, consumer, key, _qo in ordered:
        if (cg, consumer, key) in seen_first:
            continue
        seen_first.add((cg, consumer, key))
        inv = invokes.get(key)
        if inv is None or inv.group is None or key not in acked:
            continue
        rank = send_ok_t[key]
        stream = (cg, consumer, inv.group)
        prev_max = max_rank.get(stream)
        if prev_max is not None and rank < prev_max:
            order_violations += 1
        if prev_max is None or rank > prev_max:
            max_rank[stream] = rank

    return Verdict(
        scenario=scenario,
        counts={
            "acknowledged": len(acked),
            "delivered": len(receives),
            "lost": lost,
            "duplicated": duplicated,
            "unexpected": unexpected,
            "recovered": recovered,
            "order_violations": order_violations,
            "late_delayed": late,
            "unresolved_transactions": unresolved,
            "double_lock_grants": _double_grants(grants, unlocks, opts.lock_lease_ms),
            "offset_rollbacks": _offset_rollbacks(commits, probes),
        },
        faults=_faults(fault_starts, heals, send_ok_times, [r[0] for r in receives]),
    )


def _double_grants(
    grants: list[tuple[int, str, str, str]],
    unlocks: Mapping[tuple[str, str, str], list[int]],
    lease_ms: int,
) -> int:
    sorted_unlocks = {k: sorted(v) for k, v in unlocks.items()}
    by_mq: dict[tuple[str, str], list[tuple[int, str, int]]] = defaultdict(list)
    for t, cg, consumer, mq in grants:
        end = t + lease_ms
        times = sorted_unlocks.get((cg, consumer, mq))
        if times:
            i = bisect.bisect_left(times, t)
            if i < len(times):
                end = min(end, times[i])
        by_mq[(cg, mq)].append((t, consumer, end))
    count = 0
    for items in by_mq.values():
        items.sort()
        held_until: dict[str, int] = {}  # consumer -> max end over grants started so far
        i = 0
        while i < len(items):
            j = i
            while j < len(items) and items[j][0] == items[i][0]:
                t, consumer, end = items[j]
                held_until[consumer] = max(held_until.get(consumer, end), end)
                j += 1
            for t, consumer, _end in items[i:j]:
                if any(c != consumer and e > t for c, e in held_until.items()):
                    count += 1
            i = j
    return count


def _offset_rollbacks(
    commits: Mapping[tuple[str, str], list[tuple[int, int]]],
    probes: list[tuple[int, str, str, int]],
) -> int:
    prefix: dict[tuple[str, str], tuple[list[int], list[int]]] = {}
    for k, items in commits.items():
        items = sorted(items)
        times = [t for t, _ in items]
        maxes: list[int] = []
        best: int | None = None
        for _, off in items:
            best = off if best is None else max(best, off)
            maxes.append(best)
        prefix[k] = (times, maxes)
    count = 0
    for t, cg, mq, offset in probes:
        entry = prefix.get((cg, mq))
        if entry is None:
            continue
        times, maxes = entry
        i = bisect.bisect_left(times, t)  # commits strictly before t
        if i > 0 and maxes[i - 1] > offset:
            count += 1
    return count


def _first_at_or_after(sorted_times: list[int], t: int) -> int | None:
    i = bisect.bisect_left(sorted_times, t)
    return sorted_times[i] if i < len(sorted_times) else None


def _faults(
    starts: list[tuple[int, str, str]],
    heals: Mapping[tuple[str, str], list[int]],
    send_ok_times: list[int],
    receive_times: list[int],
) -> tuple[FaultWindow, ...]:
    sends = sorted(send_ok_times)
    recvs = sorted(receive_times)
    out: list[FaultWindow] = []
    for start, kind, target in sorted(starts):
        end = _first_at_or_after(sorted(heals.get((kind, target), [])), start)
        s = _first_at_or_after(sends, start)
        r = _first_at_or_after(recvs, start)
        recovery = None if s is None or r is None else max(s, r) - start
        out.append(FaultWindow(kind, target, start, end, recovery))
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
