"""``report.html``: a self-contained page with the drill's timeline as inline SVG.

One clock: every time on the page (axis, fault table, windows, tooltips) is in seconds
since the drill start, the wall-clock ms the runner passes as ``start_ms`` (the terminal
prints the same seconds); without it, since the first event of the history.

Three stacked panels share the time axis: throughput (acknowledged sends and deliveries
per second), send latency (each completed send as a dot, log scale; failed/unknown sends
in red at the top) and broker roles (one lane per broker, coloured by the role the drill
observed; ``down`` while the broker is killed or paused, ``partitioned`` while cut off,
``unknown`` from a restart until its role is observed).  Fault windows are shaded
across all panels and labelled with the fault at the start and the heal action at the
end; role changes are ticks in the role lanes.  Below the picture: a legend, the
verdict counts with their definitions, the faults with their unavailability windows,
the availability summary and the send failure spans.  No scripts, no external resources.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from ha_controller.drills.checker import (
    AVAILABILITY_KINDS,
    COUNT_NAMES,
    FAILING_COUNTS,
    FaultWindow,
    Verdict,
    unavailability_windows,
)
from ha_controller.drills.history import Event
from ha_controller.drills.nemesis import heal_action

__all__ = [
    "COUNT_DEFINITIONS",
    "FAMILY_COLOURS",
    "LANE_COLOURS",
    "ROLE_COLOURS",
    "render_report",
    "timeline_strip",
    "timeline_svg",
    "write_report",
]

ROLE_COLOURS: Final = {
    "master": "#2f7d32",
    "acting": "#f0a020",
    "slave": "#7aa7d6",
    "isolated": "#9c6ade",
}
#: role-lane states that are not observed roles, derived from the fault events
STATE_COLOURS: Final = {
    "down": "#424242",
    "partitioned": "#8e2420",
    "unknown": "#d6d6d6",
}
LANE_COLOURS: Final = {**ROLE_COLOURS, **STATE_COLOURS}
#: what a fault of each kind makes of its target broker's lane until it is healed
FAULT_STATES: Final = {
    "kill": "down",
    "pause": "down",
    "partition": "partitioned",
    "power": "down",
}
LANE_MEANING: Final = {
    "master": "observed master (takes writes)",
    "acting": "slave observed acting as master (RIP-32: serves reads, no writes)",
    "slave": "observed slave",
    "isolated": "observed isolated (pre-online, or cut off from the controller)",
    "down": "killed, paused or without power by the drill (kill -9 / SIGSTOP / power "
    "loss), until the heal",
    "partitioned": "cut off the network by the drill, until the heal",
    "unknown": "restarted; no role observed yet",
}
FAULT_COLOUR: Final = "#e53935"
#: fault family -> colour of its bars in the campaign strips
FAMILY_COLOURS: Final = {
    "kill": "#c62828",
    "pause": "#ef6c00",
    "pause-past-expiry": "#8e24aa",
    "partition": "#6d4c41",
    "loss": "#00897b",
    "disk-full": "#3949ab",
    "slave": "#7cb342",
    "nameserver": "#546e7a",
    "power-loss": "#212121",
    "corruption": "#d81b60",
    "clock": "#fdd835",
    "controller-kill": "#b71c1c",
    "controller-leader-kill": "#4a148c",
    "controller-isolate": "#3e2723",
    "controller-slave-behind": "#33691e",
    "etcd-down": "#0d47a1",
    "controller-flap": "#e65100",
}
W: Final = 1000
LEFT: Final = 70
RIGHT: Final = 20

#: one line per count of the verdict (the checker's module docstring is the reference)
COUNT_DEFINITIONS: Final = {
    "acknowledged": "keys whose send was acknowledged (and, for transactions, committed)",
    "delivered": "deliveries (receive ok events), duplicates included",
    "lost": "(acknowledged key, subscribing consumer group) pairs never delivered",
    "duplicated": "deliveries of a key to a consumer group beyond the first "
    "(with redelivery=after_ack: only those after the group's first ack)",
    "unexpected": "deliveries of keys never sent, or rolled back",
    "recovered": "keys whose send failed or had an unknown outcome but that were "
    "delivered (not an error)",
    "order_violations": "FIFO: first deliveries of a message group's keys, per consumer, "
    "that arrived after a key acknowledged later",
    "late_delayed": "delayed messages first delivered outside their due window "
    "(early ones included)",
    "unresolved_transactions": "transactional keys stored but never committed, rolled "
    "back or delivered",
    "double_lock_grants": "queue locks granted while another consumer of the group "
    "still held the queue",
    "offset_rollbacks": "offset probes that read an offset lower than one committed before",
    "corrupt_deliveries": "deliveries whose body is not the one its key's sender wrote",
    "unsynced_lost": "lost pairs acknowledged within the flush interval (+1 s) before a "
    "power loss of their whole group or the cluster: what flush_mode=async may lose "
    "(not in lost then; with sync they are lost too)",
    "split_brain": "acknowledgements another writer of the same group (another epoch or "
    "member) made around them, or made by a member that does not own the epoch: two "
    "masters at once",
    "fast_switches": "switches of a group that came less than min_switch_interval_ms "
    "after its previous one (a flapping master)",
}

WINDOW_DEFINITIONS: Final = (
    (
        "write unavailable (group)",
        "from the first send to the group that failed, timed out or went unanswered "
        "after the fault started (timed from when that send was issued) — or from the "
        "fault's start when the fault hit one of the group's brokers — to the first "
        "send to the group issued after that which was acknowledged; 0: nothing failed; "
        "never: the group never took a write again",
    ),
    (
        "read unavailable (group)",
        "the same for reads: from the first failed poll (receive fail/info) of the group "
        "to the first delivery (or answered poll) from it after that",
    ),
    (
        "cluster",
        "the same over every group at once: a failure anywhere closed by a success "
        "anywhere; ~0 while another group keeps taking writes (this is recovery_ms)",
    ),
    (
        "epoch",
        "a failure counts for the latest fault started at or before it; windows may "
        "end after the next fault starts",
    ),
    (
        "unattributed",
        "failures that name no group (the history did not record the target broker): "
        "the cluster windows see them, the group windows cannot",
    ),
    (
        "availability p50/p99/max",
        "over the faults, each fault's worst window (its largest group or cluster "
        "window), nearest rank; unrecovered: faults with a window that never closed",
    ),
)


@dataclass(frozen=True, slots=True)
class _Fault:
    kind: str
    target: str
    start: float
    end: float | None
    family: str | None = None


@dataclass(slots=True)
class _Timeline:
    """The history reduced to what the picture draws; times in s since the drill start."""

    lo: float
    hi: float
    acks: list[float] = field(default_factory=list)
    recvs: list[float] = field(default_factory=list)
    lat_ok: list[tuple[float, float]] = field(default_factory=list)
    lat_bad: list[float] = field(default_factory=list)
    faults: list[_Fault] = field(default_factory=list)
    #: lane -> observed (time, role)
    roles: dict[str, list[tuple[float, str]]] = field(default_factory=dict)

    @property
    def span(self) -> float:
        return max(self.hi - self.lo, 1.0)


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _secs(t_ms: int | None, start_ms: int) -> str:
    return "-" if t_ms is None else f"{(t_ms - start_ms) / 1000:.1f}"


def _ms(window: int | None) -> str:
    return "never" if window is None else str(window)


def _collect(events: Sequence[Event], start_ms: int) -> _Timeline:
    def rel(t_ms: int) -> float:
        return (t_ms - start_ms) / 1000

    d = _Timeline(rel(min(e.t_ms for e in events)), rel(max(e.t_ms for e in events)))
    invokes: dict[str, int] = {}
    open_faults: dict[tuple[str, str], list[int]] = defaultdict(list)
    roles: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for e in events:
        v = e.value
        t = rel(e.t_ms)
        if e.f == "send":
            key = v.get("key")
            if not isinstance(key, str):
                continue
            if e.type == "invoke":
                invokes[key] = e.t_ms
            elif e.type == "ok":
                d.acks.append(t)
                if key in invokes:
                    d.lat_ok.append((t, max(e.t_ms - invokes[key], 0.5)))
            else:
                d.lat_bad.append(t)
        elif e.f == "receive" and e.type == "ok":
            d.recvs.append(t)
        elif e.f == "fault":
            k = (str(v.get("kind")), str(v.get("target")))
            if e.type == "info":
                open_faults[k].append(len(d.faults))
                family = v.get("family")
                d.faults.append(
                    _Fault(k[0], k[1], t, None, family if isinstance(family, str) else None)
                )
            elif e.type == "ok" and open_faults[k]:
                i = open_faults[k].pop(0)
                f = d.faults[i]
                d.faults[i] = _Fault(f.kind, f.target, f.start, t, f.family)
        elif e.f == "role" and e.type == "info":
            lane = f"{v.get('group')}/{v.get('broker_id')}"
            roles[lane].append((t, str(v.get("role"))))
    for f in d.faults:  # a faulted broker gets a lane even if no role was observed
        if f.kind in FAULT_STATES and _is_broker(f.target):
            roles.setdefault(f.target, [])
    d.roles = dict(sorted(roles.items()))
    return d


def _is_broker(target: str) -> bool:
    group, _, bid = target.rpartition("/")
    return bool(group) and bid.isdigit()


def _hits(fault: _Fault, lane: str) -> bool:
    """Whether ``fault`` holds the broker of ``lane`` (a power loss of its group or of
    the cluster does too)."""
    if fault.target == lane:
        return True
    return fault.kind == "power" and (
        fault.target == "cluster" or lane.rpartition("/")[0] == fault.target
    )


def _lane_states(
    observed: Sequence[tuple[float, str]], faults: Iterable[_Fault], lane: str, hi: float
) -> list[tuple[float, float, str]]:
    """``(from, to, state)`` segments of one role lane: the observed role, overridden by
    ``down``/``partitioned`` while a fault holds the broker, ``unknown`` after a restart
    until a role is observed."""
    # (time, order, action, arg): heals before starts before observations at one instant
    changes: list[tuple[float, int, str, str]] = [(t, 2, "role", r) for t, r in observed]
    for f in faults:
        state = FAULT_STATES.get(f.kind)
        if state is None or not _hits(f, lane):
            continue
        changes.append((f.start, 1, "start", f.kind))
        if f.end is not None:
            changes.append((f.end, 0, "heal", f.kind))
    changes.sort()
    role: str | None = None
    held: list[str] = []  # kinds of the faults holding the broker now
    out: list[tuple[float, float, str]] = []

    def shown() -> str | None:
        states = {FAULT_STATES[k] for k in held}
        if states:
            return "down" if "down" in states else "partitioned"
        return role

    for t, _order, action, arg in changes:
        if action == "role":
            role = arg
        elif action == "start":
            held.append(arg)
            if arg in ("kill", "power"):
                role = "unknown"  # the restarted process has no role until observed
        else:
            held.remove(arg)
        state = shown()
        if out and out[-1][1] == math.inf:
            t0, _, s0 = out[-1]
            if s0 == state:
                continue
            out[-1] = (t0, t, s0)
        if state is not None:
            out.append((t, math.inf, state))
    return [(a, min(b, hi), s) for a, b, s in out if min(b, hi) > a or b == math.inf]


def _per_second(times: Iterable[float], lo: float, n: int) -> list[int]:
    buckets = [0] * n
    for t in times:
        buckets[max(0, min(int(t - lo), n - 1))] += 1
    return buckets


def timeline_svg(events: Sequence[Event], *, start_ms: int | None = None) -> str:
    """The timeline picture as an ``<svg>`` element (empty history: a note); times in s
    since ``start_ms`` (default: the first event)."""
    if not events:
        return (
            '<svg xmlns="http://www.w3.org/2000/svg" width="400" height="40">'
            '<text x="10" y="25">empty history</text></svg>'
        )
    d = _collect(events, min(e.t_ms for e in events) if start_ms is None else start_ms)
    span = d.span
    plot_w = W - LEFT - RIGHT

    def x(t: float) -> float:
        return LEFT + plot_w * max(0.0, min(t - d.lo, span)) / span

    fault_y, heal_y = 14, 28
    tp_top, tp_h = 60, 160
    lat_top, lat_h = tp_top + tp_h + 52, 160
    role_top = lat_top + lat_h + 52
    lane_h = 16
    height = role_top + max(len(d.roles), 1) * (lane_h + 4) + 40
    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
        f'viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="11">',
        f'<rect x="0" y="0" width="{W}" height="{height}" fill="white"/>',
    ]
    # fault shading across every panel: the fault at its start, the heal action at its end
    for f in d.faults:
        x0 = x(f.start)
        x1 = x(f.end if f.end is not None else d.hi)
        out.append(
            f'<rect x="{x0:.1f}" y="{tp_top}" width="{max(x1 - x0, 1.5):.1f}" '
            f'height="{height - tp_top - 30}" fill="{FAULT_COLOUR}" fill-opacity="0.12">'
            f"<title>{_esc(f.kind)} {_esc(f.target)} from {f.start:.1f} s"
            f"{'' if f.end is None else f' to {f.end:.1f} s'}</title></rect>"
        )
        out.append(
            f'<text x="{x0 + 2:.1f}" y="{fault_y}" fill="{FAULT_COLOUR}">'
            f"{_esc(f.kind)} {_esc(f.target)}{'' if f.end is not None else ' (not healed)'}</text>"
        )
        if f.end is not None:
            out.append(
                f'<line x1="{x1:.1f}" x2="{x1:.1f}" y1="{heal_y + 3}" y2="{height - 30}" '
                f'stroke="{FAULT_COLOUR}" stroke-dasharray="3,3" stroke-width="0.8"/>'
                f'<text x="{x1 + 2:.1f}" y="{heal_y}" fill="#555">'
                f"{_esc(heal_action(f.kind))} {_esc(f.target)}</text>"
            )
    # throughput
    n_buckets = int(span) + 1
    acks = _per_second(d.acks, d.lo, n_buckets)
    recvs = _per_second(d.recvs, d.lo, n_buckets)
    peak = max([*acks, *recvs, 1])
    out.append(_axes(tp_top, tp_h, f"msgs/s (max {peak})", d.lo, d.hi, x))

    def series(values: list[int], colour: str) -> str:
        pts = " ".join(
            f"{x(d.lo + i + 0.5):.1f},{tp_top + tp_h - tp_h * v / peak:.1f}"
            for i, v in enumerate(values)
        )
        return f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="1.6"/>'

    out.append(series(acks, "#1565c0"))
    out.append(series(recvs, "#2e7d32"))
    out.append(
        f'<text x="{LEFT + 6}" y="{tp_top + 12}" fill="#1565c0">acknowledged sends/s</text>'
        f'<text x="{LEFT + 150}" y="{tp_top + 12}" fill="#2e7d32">deliveries/s</text>'
    )
    # latency (log scale 1 ms .. 10 s)
    lo_log, hi_log = 0.0, 4.0

    def y_lat(ms: float) -> float:
        v = (math.log10(max(ms, 1.0)) - lo_log) / (hi_log - lo_log)
        return lat_top + lat_h - lat_h * max(0.0, min(v, 1.0))

    out.append(_axes(lat_top, lat_h, "send latency (ms, log)", d.lo, d.hi, x))
    for grid_ms in (1, 10, 100, 1000, 10000):
        yy = y_lat(grid_ms)
        out.append(
            f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>'
            f'<text x="{LEFT - 4}" y="{yy + 3:.1f}" text-anchor="end">{grid_ms}</text>'
        )
    step = max(1, len(d.lat_ok) // 4000)  # keep the page small
    out.extend(
        f'<circle cx="{x(t):.1f}" cy="{y_lat(ms):.1f}" r="1.3" fill="#1565c0"/>'
        for t, ms in d.lat_ok[::step]
    )
    out.extend(
        f'<rect x="{x(t) - 1:.1f}" y="{lat_top + 1}" width="2" height="6" fill="{FAULT_COLOUR}"/>'
        for t in d.lat_bad
    )
    # roles
    out.append(f'<text x="{LEFT}" y="{role_top - 8}" font-weight="bold">roles</text>')
    for i, (lane, observed) in enumerate(d.roles.items()):
        y0 = role_top + i * (lane_h + 4)
        out.append(f'<text x="{LEFT - 4}" y="{y0 + 12}" text-anchor="end">{_esc(lane)}</text>')
        for t0, t1, state in _lane_states(observed, d.faults, lane, d.hi):
            colour = LANE_COLOURS.get(state, "#999")
            out.append(
                f'<rect x="{x(t0):.1f}" y="{y0}" width="{max(x(t1) - x(t0), 1):.1f}" '
                f'height="{lane_h}" fill="{colour}"><title>{_esc(lane)} {_esc(state)} '
                f"from {t0:.1f} s to {t1:.1f} s</title></rect>"
            )
        for t, _role in observed[1:]:  # observed role changes
            out.append(
                f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{y0 - 2}" y2="{y0 + lane_h + 2}" '
                'stroke="black" stroke-width="1.2"/>'
            )
    legend_y = height - 14
    lx = LEFT
    for state, colour in LANE_COLOURS.items():
        out.append(
            f'<rect x="{lx}" y="{legend_y - 9}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{lx + 14}" y="{legend_y}">{state}</text>'
        )
        lx += 92
    out.append(
        f'<rect x="{lx}" y="{legend_y - 9}" width="10" height="10" fill="{FAULT_COLOUR}" '
        f'fill-opacity="0.3"/><text x="{lx + 14}" y="{legend_y}">fault</text>'
    )
    out.append("</svg>")
    return "\n".join(out)


def timeline_strip(events: Sequence[Event], *, start_ms: int | None = None, width: int = W) -> str:
    """A one-line timeline of a drill for the campaign page (an ``<svg>``): acknowledged
    sends per second as a line, failed or unknown sends as red ticks, and one bar per
    fault (a lane per target, coloured by its family, :data:`FAMILY_COLOURS`); the same
    clock and collection as :func:`timeline_svg`."""
    if not events:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="20">'
            '<text x="4" y="14" font-size="11">empty history</text></svg>'
        )
    d = _collect(events, min(e.t_ms for e in events) if start_ms is None else start_ms)
    span = d.span
    left, right = 110, 10
    plot_w = width - left - right

    def x(t: float) -> float:
        return left + plot_w * max(0.0, min(t - d.lo, span)) / span

    lanes = sorted({f.target for f in d.faults})
    lane_h, tp_h = 9, 28
    height = tp_h + 6 + max(len(lanes), 1) * (lane_h + 2) + 14
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="9">',
        f'<rect x="{left}" y="0" width="{plot_w}" height="{tp_h}" fill="#fafafa" stroke="#ccc"/>',
        f'<text x="{left - 4}" y="{tp_h - 8}" text-anchor="end">acked/s</text>',
    ]
    n_buckets = int(span) + 1
    acks = _per_second(d.acks, d.lo, n_buckets)
    peak = max([*acks, 1])
    pts = " ".join(
        f"{x(d.lo + i + 0.5):.1f},{tp_h - 2 - (tp_h - 4) * v / peak:.1f}"
        for i, v in enumerate(acks)
    )
    out.append(f'<polyline points="{pts}" fill="none" stroke="#1565c0" stroke-width="1"/>')
    out.extend(
        f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="0" y2="5" stroke="{FAULT_COLOUR}"/>'
        for t in d.lat_bad
    )
    for i, lane in enumerate(lanes):
        y0 = tp_h + 6 + i * (lane_h + 2)
        out.append(f'<text x="{left - 4}" y="{y0 + 8}" text-anchor="end">{_esc(lane)}</text>')
        for f in d.faults:
            if f.target != lane:
                continue
            x0, x1 = x(f.start), x(f.end if f.end is not None else d.hi)
            colour = FAMILY_COLOURS.get(f.family or "", FAULT_COLOUR)
            label = f.family or f.kind
            out.append(
                f'<rect x="{x0:.1f}" y="{y0}" width="{max(x1 - x0, 1.5):.1f}" '
                f'height="{lane_h}" fill="{colour}"><title>{_esc(label)}: {_esc(f.kind)} '
                f"{_esc(f.target)} from {f.start:.1f} s"
                f"{'' if f.end is None else f' to {f.end:.1f} s'}</title></rect>"
            )
    axis_y = height - 3
    tick = max(1, int(span / 10) or 1)
    out.extend(
        f'<text x="{x(float(s)):.1f}" y="{axis_y}" text-anchor="middle">{s}s</text>'
        for s in range(math.ceil(d.lo / tick) * tick, int(d.hi) + 1, tick)
    )
    out.append("</svg>")
    return "\n".join(out)


def _axes(top: int, h: int, label: str, lo: float, hi: float, x: Callable[[float], float]) -> str:
    parts = [
        f'<rect x="{LEFT}" y="{top}" width="{W - LEFT - RIGHT}" height="{h}" '
        'fill="none" stroke="#888"/>',
        f'<text x="{LEFT}" y="{top - 18}" font-weight="bold">{_esc(label)}</text>',
    ]
    tick = max(1, int((hi - lo) / 10) or 1)
    for s in range(math.ceil(lo / tick) * tick, int(hi) + 1, tick):
        xx = x(float(s))
        parts.append(
            f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{top + h}" y2="{top + h + 4}" stroke="#888"/>'
            f'<text x="{xx:.1f}" y="{top + h + 15}" text-anchor="middle">{s}s</text>'
        )
    return "\n".join(parts)


def _groups(windows: Mapping[str, int | None]) -> str:
    return "<br>".join(f"{_esc(g)}: {_ms(w)}" for g, w in sorted(windows.items())) or "-"


def _fault_row(f: FaultWindow, start_ms: int) -> str:
    healed = "not healed" if f.end_ms is None else heal_action(f.kind)
    return (
        f"<tr><td>{_esc(f.kind)}</td><td>{_esc(f.target)}</td>"
        f"<td class='n'>{_secs(f.start_ms, start_ms)}</td>"
        f"<td>{_esc(healed)}</td><td class='n'>{_secs(f.end_ms, start_ms)}</td>"
        f"<td class='n'>{_groups(f.write_unavailable_ms)}</td>"
        f"<td class='n'>{_ms(f.cluster_write_unavailable_ms)}</td>"
        f"<td class='n'>{_groups(f.read_unavailable_ms)}</td>"
        f"<td class='n'>{_ms(f.cluster_read_unavailable_ms)}</td>"
        f"<td class='n'>{f.unattributed_write_failures} / {f.unattributed_read_failures}</td>"
        "</tr>"
    )


def _durability(verdict: Verdict) -> str:
    """One sentence: how the stores synced and what the power losses took."""
    d = verdict.durability
    if d.flush_mode is None:
        return "The history does not say how the stores synced."
    how = "on every write" if d.flush_mode == "sync" else f"every {d.flush_interval_ms} ms"
    text = f"Stores flushed {_esc(d.flush_mode)} ({how}); {d.power_losses} power losses"
    if d.power_losses:
        text += (
            f": {d.unsynced_lost} acknowledged pairs lost within the flush window "
            f"(longest {d.loss_window_ms} ms from acknowledgement to power loss)"
        )
    return text + "."


def _legend() -> str:
    lanes = "".join(
        f"<tr><td><span class='sw' style='background:{colour}'></span>{state}</td>"
        f"<td>{_esc(LANE_MEANING[state])}</td></tr>"
        for state, colour in LANE_COLOURS.items()
    )
    marks = (
        f"<tr><td><span class='sw' style='background:{FAULT_COLOUR};opacity:.3'></span>fault"
        "</td><td>from the fault taking effect to its heal (label: fault, then the heal "
        "action: restart, resume, heal partition, clear loss, free disk)</td></tr>"
        "<tr><td>red ticks</td><td>sends that failed or had an unknown outcome "
        "(latency panel, top)</td></tr>"
        "<tr><td>black ticks</td><td>a role change observed in a lane</td></tr>"
    )
    return f"<table><tr><th>mark</th><th>meaning</th></tr>{lanes}{marks}</table>"


def render_report(
    events: Sequence[Event], verdict: Verdict, *, title: str = "", start_ms: int | None = None
) -> str:
    """The whole HTML page; times in s since ``start_ms`` (the drill start the terminal
    counts from; default: the first event)."""
    status = "OK" if verdict.ok else "FAILED"
    colour = "#2e7d32" if verdict.ok else "#c62828"
    first = min((e.t_ms for e in events), default=0)
    last = max((e.t_ms for e in events), default=0)
    t0 = first if start_ms is None else start_ms
    wall = datetime.fromtimestamp(t0 / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    origin = "the drill start" if start_ms is not None else "the first event"

    def cls(name: str) -> str:
        return "n bad" if name in FAILING_COUNTS and verdict.counts.get(name, 0) else "n"

    rows = "".join(
        f"<tr><td>{name}</td><td class='{cls(name)}'>{verdict.counts.get(name, 0)}</td>"
        f"<td>{_esc(COUNT_DEFINITIONS.get(name, ''))}"
        f"{'' if name in FAILING_COUNTS else ' <i>(does not fail the drill)</i>'}</td></tr>"
        for name in COUNT_NAMES
    )
    fault_rows = "".join(_fault_row(f, t0) for f in verdict.faults)
    avail_rows = ""
    for kind in AVAILABILITY_KINDS:
        summary = verdict.availability[f"{kind}_unavailable_ms"]
        cells = "".join(
            f"<td class='n'>{'-' if summary[k] is None else summary[k]}</td>"
            for k in ("p50", "p99", "max", "faults", "unrecovered")
        )
        avail_rows += f"<tr><td>{kind}</td>{cells}</tr>"
    window_defs = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in WINDOW_DEFINITIONS)
    spans = unavailability_windows(events)
    span_rows = "".join(
        f"<tr><td class='n'>{_secs(w.start_ms, t0)}</td><td class='n'>{_secs(w.end_ms, t0)}</td>"
        f"<td class='n'>{'-' if w.duration_ms is None else w.duration_ms}</td></tr>"
        for w in spans
    )
    name = title or verdict.scenario
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>drill {_esc(name)}: {status}</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; }}
h1 span {{ color: {colour}; }}
table {{ border-collapse: collapse; margin: 8px 24px 16px 0; display: inline-table;
         vertical-align: top; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; }}
td.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
td.bad {{ color: #c62828; font-weight: bold; }}
span.sw {{ display: inline-block; width: 10px; height: 10px; margin-right: 6px; }}
dt {{ font-weight: bold; margin-top: 6px; }}
</style></head><body>
<h1>drill {_esc(name)}: <span>{status}</span></h1>
<p>{len(events)} events from {_secs(first, t0)} s to {_secs(last, t0)} s.
All times on this page are seconds since {origin} ({wall} UTC, wall clock);
the terminal counts from the same instant.</p>
{timeline_svg(events, start_ms=t0)}
<h2>Legend</h2>
{_legend()}
<h2>Verdict</h2>
<table><tr><th>count</th><th>value</th><th>definition</th></tr>{rows}</table>
<p>{_durability(verdict)}</p>
<h2>Faults and unavailability (ms)</h2>
<table><tr><th>fault</th><th>target</th><th>start s</th><th>heal</th><th>healed s</th>
<th>write unavailable<br>per group</th><th>write unavailable<br>cluster</th>
<th>read unavailable<br>per group</th><th>read unavailable<br>cluster</th>
<th>unattributed failures<br>write / read</th></tr>{fault_rows}</table>
<table><tr><th>availability</th><th>p50 ms</th><th>p99 ms</th><th>max ms</th>
<th>faults</th><th>unrecovered</th></tr>{avail_rows}</table>
<dl>{window_defs}</dl>
<h2>Send failure spans (all groups)</h2>
<p>From a failed or unknown send to the next acknowledged send to any group (spans less
than 2 s apart merged): when sends failed at all, not how long a group was down.</p>
<table><tr><th>from s</th><th>to s</th><th>ms</th></tr>{span_rows}</table>
</body></html>
"""


def write_report(
    path: Path,
    events: Sequence[Event],
    verdict: Verdict,
    *,
    title: str = "",
    start_ms: int | None = None,
) -> Path:
    path.write_text(
        render_report(events, verdict, title=title, start_ms=start_ms), encoding="utf-8"
    )
    return path
