"""In-process history checker: one drill history in, its verdict out (docs/drills.md).

The value schemas are in :mod:`ha_controller.drills.history`.  Events whose required keys
are missing (a ``send`` or ``receive`` without ``key``, a ``receive`` without
``consumer_group``, a lock without ``consumer``/``consumer_group``/``mq``...) are ignored.
:mod:`ha_controller.pipeline.verdict` computes exactly the same verdict with Spark; every
definition below is mirrored there and the two are tested for equal JSON.  The verdict's
types are in :mod:`ha_controller.drills.verdict`, the fault windows in
:mod:`ha_controller.drills.windows`; this module defines them all and re-exports them.

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

Split brain.  In controller mode a send ok names the ``epoch`` under which its group's
master acknowledged and the ``member_id`` of that master; a *writer* is one (group,
epoch, member), the group being the ok's ``broker``.  Send oks without all three are not
judged.  An acknowledgement happened somewhere between the key's *issue* (its earliest
send invoke ``t_ms``; the ok's own ``t_ms`` without an invoke) and its ok ``t_ms``.

``split_brain``
    acknowledgements (send oks) that another writer of the same group surrounds — that
    writer has an ok recorded strictly before this one's issue and an issue strictly
    after this one's ok, so both brokers took writes at the same time — or that a
    member other than the epoch's *owner* made (the member of the group's earliest ok
    in that epoch, ties by the lower member id): one epoch, one master.  Each ok counts
    once.  A late answer of an old master (a reply it had sent before it was frozen)
    is issued before the new master's first write and is not counted; a write an old
    master took in after the new one began is.

``fast_switches``
    per group, the ``epoch`` info events (the epochs the drill saw, each with the
    ``since_ms`` its controller began it) in epoch order: consecutive epochs after the
    first (each began with a switch) that began less than ``min_switch_interval_ms``
    apart (a flapping master switched the group again too soon).  The first switch may
    come at any time after the group's initial epoch 1.  An epoch seen without
    ``since_ms`` is not judged; events of one epoch take the smallest ``since_ms``.

``durability`` (top level) states ``flush_mode`` and ``flush_interval_ms`` (null when
the history does not say), ``power_losses`` (faults of kind ``power``),
``unsynced_lost`` and ``loss_window_ms``: over the unsynced lost keys, the longest time
from the acknowledgement to the power loss (0 when none).

``ok`` is true only when lost, duplicated, unexpected, order_violations, late_delayed,
unresolved_transactions, double_lock_grants, offset_rollbacks, corrupt_deliveries,
split_brain and fast_switches are all zero.
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ha_controller.drills.history import DELAY_LEVELS_MS, Event, iter_history
from ha_controller.drills.verdict import (
    AVAILABILITY_KINDS,
    COUNT_NAMES,
    FAILING_COUNTS,
    POWER_CLUSTER,
    REPORTED_COUNTS,
    UNSYNCED_SLACK_MS,
    CheckOptions,
    Durability,
    FaultWindow,
    Verdict,
    availability_summary,
    unsynced_losses,
)
from ha_controller.drills.windows import (
    Ops,
    SpanOverlap,
    UnavailabilityWindow,
    fault_windows,
    no_writable_master_spans,
    target_group,
    unavailability_windows,
)

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
    reads = Ops()
    # durability: the first ``store`` event's settings, the earliest send ok's broker
    # per key (ties by name), deliveries marked corrupt
    store_mode: tuple[int, str | None, int | None] | None = None
    ok_broker: dict[str, tuple[int, str]] = {}
    corrupt = 0
    # split brain: send oks that name their writer (t_ms, key, group, epoch, member)
    writer_oks: list[tuple[int, str, str, int, int]] = []
    # fast switches: (group, epoch) -> the smallest since_ms seen
    epoch_since: dict[tuple[str, int], int] = {}

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
                    group, epoch, member = _s(v, "broker"), _i(v, "epoch"), _i(v, "member_id")
                    if group is not None and epoch is not None and member is not None:
                        writer_oks.append((ev.t_ms, key, group, epoch, member))
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
        elif f == "epoch":
            group, epoch, since = _s(v, "group"), _i(v, "epoch"), _i(v, "since_ms")
            if ev.type == "info" and group is not None and epoch is not None and since is not None:
                seen = epoch_since.get((group, epoch))
                epoch_since[(group, epoch)] = since if seen is None else min(since, seen)
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

    faults = fault_windows(
        fault_starts,
        heals,
        _writes(send_outcomes, invokes, invoke_broker),
        reads,
    )
    held = SpanOverlap(no_writable_master_spans(faults))
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
            "split_brain": _split_brain(
                [(t, _issue(invokes, k, t), g, e, m) for t, k, g, e, m in writer_oks]
            ),
            "fast_switches": _fast_switches(epoch_since, opts.min_switch_interval_ms),
            "unsynced_lost": unsynced,
        },
        faults=faults,
        durability=durability,
    )


def _fast_switches(since: Mapping[tuple[str, int], int], min_interval_ms: int) -> int:
    """Consecutive seen epochs of a group, the earlier past epoch 1, that began less
    than ``min_interval_ms`` apart."""
    by_group: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for (group, epoch), t in since.items():
        by_group[group].append((epoch, t))
    count = 0
    for items in by_group.values():
        items.sort()
        count += sum(
            1
            for (epoch, a), (_, b) in itertools.pairwise(items)
            if epoch > 1 and b - a < min_interval_ms
        )
    return count


def _issue(invokes: Mapping[str, _Invoke], key: str, ok_t: int) -> int:
    """When an acknowledgement of ``key`` was asked for: its earliest invoke, else the ok."""
    inv = invokes.get(key)
    return ok_t if inv is None else inv.t_ms


def _split_brain(oks: list[tuple[int, int, str, int, int]]) -> int:
    """Acknowledgements ``(ok_t, issue_t, group, epoch, member)`` made while another
    writer of the group was acknowledging too, or by a member that does not own the
    epoch (module docstring, "Split brain")."""
    # writer -> (earliest ok, latest issue); (group, epoch) -> its owner's (ok_t, member)
    spans: dict[tuple[str, int, int], tuple[int, int]] = {}
    owners: dict[tuple[str, int], tuple[int, int]] = {}
    for ok_t, issue, group, epoch, member in oks:
        w = (group, epoch, member)
        first_ok, last_issue = spans.get(w, (ok_t, issue))
        spans[w] = (min(first_ok, ok_t), max(last_issue, issue))
        owner = owners.get((group, epoch))
        if owner is None or (ok_t, member) < owner:
            owners[(group, epoch)] = (ok_t, member)
    by_group: dict[str, list[tuple[tuple[int, int], int, int]]] = defaultdict(list)
    for (group, epoch, member), (first_ok, last_issue) in spans.items():
        by_group[group].append(((epoch, member), first_ok, last_issue))
    count = 0
    for ok_t, issue, group, epoch, member in oks:
        if owners[(group, epoch)][1] != member or any(
            w != (epoch, member) and first_ok < issue and last_issue > ok_t
            for w, first_ok, last_issue in by_group[group]
        ):
            count += 1
    return count


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


def _writes(
    outcomes: list[tuple[int, bool, str, str | None]],
    invokes: Mapping[str, _Invoke],
    invoke_broker: Mapping[str, tuple[int, str]],
) -> Ops:
    ops = Ops()
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
