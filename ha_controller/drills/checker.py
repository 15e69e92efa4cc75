"""In-process history checker: one drill history in, its verdict out (docs/drills.md).

The value schemas are in :mod:`ha_controller.drills.history`.  Events whose required keys
are missing (a ``send`` or ``receive`` without ``key``, a ``receive`` without
``consumer_group``, a lock without ``consumer``/``consumer_group``/``mq``...) are ignored.
:mod:`ha_controller.pipeline.verdict` computes exactly the same verdict with Spark; every
definition below is mirrored there and the two are tested for equal JSON.

Terms.  A key is *sent* when any ``send`` event names it; its topic and message group
come from its earliest ``send`` invoke (topic ``""`` when there is none; a key should
be invoked once, ties are broken arbitrarily).  A key is
*committed* when an ``end_tx`` ok with ``commit: true`` names it and *rolled back* when an
``end_tx`` ok or info (outcome unknown) with ``commit: false`` does and no ``end_tx`` ok
with ``commit: true`` does.  (A rollback whose outcome the client never learnt was
either applied, and then the broker has nothing to check back, or lost, and then the
check back rolls it back too: either way the message must never be delivered, and the
history cannot show more.  An unknown *commit* stays unresolved until the check back
commits it.)  A
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
    at-least-once behaviour, not a defect).  ``after_ack_groups`` judges the consumer
    groups it names with ``after_ack`` and the others with ``redelivery`` (a drill
    that runs a POP consumer beside pull consumers, which record no acks).  Keys
    counted as unexpected are excluded.
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
    per (consumer group, acknowledged delayed key) the first delivery ``first`` must
    not come before ``due - early_tolerance_ms``, nor later than ``due + tolerance`` once
    the time between ``due`` and ``first`` during which *no group had a writable master*
    (:func:`no_writable_master_spans`) is left out; each pair outside counts once (early
    deliveries are counted here too: the verdict has one field for "delivered at the
    wrong time").  ``due`` is ``due_ts_ms``, else invoke ``t_ms + delay_ms``, else
    invoke ``t_ms`` + the level's delay (levels above 18 use level 18); the tolerance is
    ``level_tolerance_ms`` for delay levels and ``timer_tolerance_ms`` otherwise.  While
    no master anywhere takes writes a due message has nowhere to go, so its clock stops:
    a message due in such a span is judged from the span's end, and one due while its
    own master was being expired (the tolerance covers the expiry and the acting slave
    taking over) gets the span that began meanwhile on top.  Keys without a send ok are
    not judged (as for ``lost``: an unacknowledged send promised nothing).
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
kind and target at or after it (``end_ms`` null when never healed).  Faults are listed by
(start, kind, target).

Availability.  Every fault gets unavailability windows measured from the operations the
clients recorded, per broker group and for the whole cluster, for writes and for reads:

*Write operations* are sends.  A *failure* is a ``send`` fail or info event, or a key
with a send invoke and no ok/fail/info at all (unanswered); a *success* is a ``send`` ok.
An operation's time ``t`` is its outcome's ``t_ms`` (the invoke's for an unanswered
send); it was *issued* at the key's earliest invoke ``t_ms`` (``t`` without an invoke).
Its *group* is the ``broker`` of the outcome event; for a failure without one, the
``broker`` of the key's send invokes (the earliest invoke naming one, ties by name);
otherwise none.  *Read operations* are ``receive`` events: ok is a success (a delivery,
or a ``receive`` ok without ``key``: an empty poll), fail/info a failed poll; both are
issued at their own ``t_ms`` and belong to their ``broker``.  The groups of a kind are
every group one of its operations names.

A fault's *epoch* runs from its start to the next later fault start (the end of the
history for the last).  For one scope (a group's operations, or all of them for the
cluster) the window *opens* at ``min(max(issued, start))`` over the scope's failures
with ``start <= t < epoch end``; a group's *write* window also opens at ``start`` when a
fault starting then targets one of its brokers (``target`` ``"<group>/<id>"``): clients
route away from a group that lost its master, so the group takes no writes without any
send failing, and it must show a success to count as available.  (Reads do not get this:
a consumer that receives nothing from a group may have nothing to read.)  The window
*closes* at the earliest ``t`` of a success of the scope issued at or after the opening
(and recorded at or after it): a reply to a request made before the trouble proves
nothing.  Timing a failure by its issue, not its outcome,
keeps a send that hung for its whole timeout (a paused broker) from shortening the
window by that timeout.  The window is ``close - open`` in ms, ``0`` when no failure fell
in the epoch, ``null`` when it never closed.  Per fault:

``write_unavailable_ms`` / ``read_unavailable_ms``
    ``{group: window}`` for every group of that kind; a targeted group's write window is
    at least the time to its next acknowledged send.
``cluster_write_unavailable_ms`` / ``cluster_read_unavailable_ms``
    the window over every operation of that kind, whatever its group (a failure on one
    group is closed by a success on any): how long until *some* client got through
    again.  ~0 while another group keeps taking the traffic.
``recovery_ms``
    the cluster-wide write window (the old name, kept for compatibility).
``unattributed_write_failures`` / ``unattributed_read_failures``
    failures in the epoch that name no group: the cluster windows include them, the
    group windows cannot.

``availability`` (top level) summarises, for writes and reads, each fault's *worst*
window (the largest of its group windows and its cluster window; ``null`` when one of
them never closed): ``p50``/``p99`` (nearest rank) and ``max`` over the faults whose
worst window closed, ``faults`` (how many faults) and ``unrecovered`` (how many never
closed).

Durability.  A ``store`` info event says how the brokers' stores sync
(``flush_mode`` ``sync``: before every acknowledgement; ``async``: every
``flush_interval_ms``).  A power loss (a ``fault`` of kind ``power``) of a whole group
(target ``"<group>"``) or of the cluster (``"cluster"``) loses, with ``async``, what
that group's stores had not synced yet:

``unsynced_lost``
    lost pairs (as ``lost`` counts them) of acknowledged keys whose earliest send ok
    came from a group (its ``broker``) at most ``flush_interval_ms +``
    :data:`UNSYNCED_SLACK_MS` before a power loss of that group or of the cluster
    started.  With ``flush_mode`` ``async`` they are reported here and left out of
    ``lost``: the loss the asynchronous mode allows.  With ``sync``, or when the
    history does not say, they count in ``lost`` as well (sync promises no loss).
``corrupt_deliveries``
    deliveries (``receive`` ok) marked ``corrupt: true``: a body that is not the one
    its key's sender wrote.

``durability`` (top level) states ``flush_mode`` and ``flush_interval_ms`` (null when
the history does not say), ``power_losses`` (faults of kind ``power``),
``unsynced_lost`` and ``loss_window_ms``: over the unsynced lost keys, the longest time
from the acknowledgement to the power loss (0 when none).

``ok`` is true only when lost, duplicated, unexpected, order_violations, late_delayed,
unresolved_transactions, double_lock_grants, offset_rollbacks and corrupt_deliveries
are all zero.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, cast

from ha_controller.drills.history import DELAY_LEVELS_MS, Event, iter_history

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
    "UnavailabilityWindow",
    "Verdict",
    "availability_summary",
    "check",
    "no_writable_master_spans",
    "target_group",
    "unavailability_windows",
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

    def after_ack(self, consumer_group: str) -> bool:
        """Whether ``consumer_group``'s duplicates count only after its first ack."""
        return self.redelivery == "after_ack" or consumer_group in self.after_ack_groups

    def __post_init__(self) -> None:
        for name in ("lock_lease_ms", "timer_tolerance_ms", "level_tolerance_ms"):
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
    # availability: send outcomes (t_ms, ok, key, broker), the first invoke naming a
    # broker per key (t_ms, broker), and read operations
    send_outcomes: list[tuple[int, bool, str, str | None]] = []
    invoke_broker: dict[str, tuple[int, str]] = {}
    reads = _Ops()
    # durability: the first ``store`` event's settings, the earliest send ok's broker
    # per key (ties by name), deliveries marked corrupt
    store_mode: tuple[int, str | None, int | None] | None = None
    ok_broker: dict[str, tuple[int, str]] = {}
    corrupt = 0

    for ev in events:
        v = ev.value
        f = ev.f
        if f == "send":
            key = _s(v, "key")
            if key is None:
                continue
            sent.add(key)
            if ev.type == "invoke":
                broker = _s(v, "broker")
                if broker is not None and (ev.t_ms, broker) < invoke_broker.get(
                    key, (ev.t_ms + 1, "")
                ):
                    invoke_broker[key] = (ev.t_ms, broker)
                earliest = invokes.get(key)
                if earliest is None or ev.t_ms < earliest.t_ms:
                    invokes[key] = _Invoke(
                        ev.t_ms,
                        _s(v, "topic") or "",
                        _s(v, "group"),
                        _b(v, "tx") is True,
                        delay_due(ev.t_ms, v, opts),
                    )
            else:
                send_outcomes.append((ev.t_ms, ev.type == "ok", key, _s(v, "broker")))
                if ev.type == "ok":
                    prev = send_ok_t.get(key)
                    if prev is None or ev.t_ms < prev:
                        send_ok_t[key] = ev.t_ms
                    by = (ev.t_ms, _s(v, "broker") or "")
                    if key not in ok_broker or by < ok_broker[key]:
                        ok_broker[key] = by
        elif f == "receive":
            if ev.type != "invoke":
                reads.add(ev.type == "ok", ev.t_ms, ev.t_ms, _s(v, "broker"))
            if ev.type != "ok":
                continue
            if _b(v, "corrupt") is True:
                corrupt += 1
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
            if key is None or commit is None:
                continue
            if ev.type == "ok" or (ev.type == "info" and not commit):
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
        elif f == "store":
            if ev.type == "info" and (store_mode is None or ev.t_ms < store_mode[0]):
                store_mode = (ev.t_ms, _s(v, "flush_mode"), _i(v, "flush_interval_ms"))
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
        if not opts.after_ack(cg):
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
    lost_keys: list[tuple[int, str | None, int]] = []  # (ok_t, ok group, lost pairs)
    for key in acked:
        topic = invokes[key].topic if key in invokes else ""
        pairs = max(groups_of_topic.get(topic, 0), 1) - recv_groups.get(key, 0)
        lost += pairs
        if pairs > 0:
            lost_keys.append((send_ok_t[key], ok_broker[key][1] or None, pairs))
    durability = Durability(
        None if store_mode is None else store_mode[1],
        None if store_mode is None else store_mode[2],
        sum(1 for _t, kind, _target in fault_starts if kind == "power"),
    )
    unsynced, window = unsynced_losses(
        lost_keys,
        [(t, target) for t, kind, target in fault_starts if kind == "power"],
        durability.bound_ms,
    )
    durability = replace(durability, unsynced_lost=unsynced, loss_window_ms=window)
    if durability.flush_mode == "async":
        lost -= unsynced

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

    faults = _faults(
        fault_starts,
        heals,
        _writes(send_outcomes, invokes, invoke_broker),
        reads,
    )
    held = _SpanOverlap(no_writable_master_spans(faults))
    late = 0
    for (_cg, key), times in per_pair.items():
        inv = invokes.get(key)
        if inv is None or inv.due is None or key not in acked:
            continue
        due, tolerance = inv.due
        first = min(times)
        if first - held(due, first) > due + tolerance or first < due - opts.early_tolerance_ms:
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
            "corrupt_deliveries": corrupt,
            "unsynced_lost": unsynced,
        },
        faults=faults,
        durability=durability,
    )


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


class _SpanOverlap:
    """``(a, b)`` -> how much of ``[a, b]`` the (disjoint, sorted) spans cover."""

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        self._spans = spans

    def __call__(self, a: int, b: int) -> int:
        return sum(max(0, min(b, end) - max(a, start)) for start, end in self._spans)


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


@dataclass(frozen=True, slots=True)
class _Op:
    t_ms: int  # outcome recorded (the invoke, for an unanswered send)
    issued_ms: int
    group: str | None


_CLUSTER: Final = object()  # the scope of every operation, whatever its group
_NO_GROUP: Final = object()  # the scope of the operations that name no group


class _Ops:
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


def _writes(
    outcomes: list[tuple[int, bool, str, str | None]],
    invokes: Mapping[str, _Invoke],
    invoke_broker: Mapping[str, tuple[int, str]],
) -> _Ops:
    ops = _Ops()
    answered: set[str] = set()
    for t, ok, key, broker in outcomes:
        answered.add(key)
        inv = invokes.get(key)
        group = broker
        if group is None and not ok and key in invoke_broker:
            group = invoke_broker[key][1]
        ops.add(ok, t, t if inv is None else inv.t_ms, group)
    for key, inv in invokes.items():
        if key not in answered:  # unanswered: a failure at its invoke
            named = invoke_broker.get(key)
            ops.add(False, inv.t_ms, inv.t_ms, None if named is None else named[1])
    return ops


def _faults(
    starts: list[tuple[int, str, str]],
    heals: Mapping[tuple[str, str], list[int]],
    writes: _Ops,
    reads: _Ops,
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
