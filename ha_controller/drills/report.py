"""``report.html``: a self-contained page with the drill's timeline as inline SVG.

Three stacked panels share the time axis (seconds since the first event):
throughput (acknowledged sends and deliveries per second), send latency (each
completed send as a dot, log scale; failed/unknown sends in red at the top) and
broker roles (one lane per broker, coloured by the role the drill observed).
Fault windows are shaded across all panels and labelled; role changes are ticks in
the role lanes.  Below the picture: the verdict counts, the faults with their recovery
times and the unavailability windows.  No scripts, no external resources.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ha_controller.drills.checker import (
    COUNT_NAMES,
    FAILING_COUNTS,
    Verdict,
    unavailability_windows,
)
from ha_controller.drills.history import Event

__all__ = ["render_report", "timeline_svg", "write_report"]

ROLE_COLOURS: Final = {
    "master": "#2f7d32",
    "acting": "#f0a020",
    "slave": "#7aa7d6",
    "isolated": "#9c6ade",
}
FAULT_COLOUR: Final = "#e53935"
W: Final = 1000
LEFT: Final = 70
RIGHT: Final = 20


@dataclass(frozen=True, slots=True)
class _Fault:
    kind: str
    target: str
    start: float
    end: float | None


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _collect(events: Sequence[Event]) -> dict[str, object]:
    t0 = min(e.t_ms for e in events)
    t1 = max(e.t_ms for e in events)
    invokes: dict[str, int] = {}
    acks: list[float] = []
    recvs: list[float] = []
    lat_ok: list[tuple[float, float]] = []
    lat_bad: list[float] = []
    faults: list[_Fault] = []
    open_faults: dict[tuple[str, str], list[int]] = defaultdict(list)
    roles: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for e in events:
        v = e.value
        t = (e.t_ms - t0) / 1000
        if e.f == "send":
            key = v.get("key")
            if not isinstance(key, str):
                continue
            if e.type == "invoke":
                invokes[key] = e.t_ms
            elif e.type == "ok":
                acks.append(t)
                if key in invokes:
                    lat_ok.append((t, max(e.t_ms - invokes[key], 0.5)))
            else:
                lat_bad.append(t)
        elif e.f == "receive" and e.type == "ok":
            recvs.append(t)
        elif e.f == "fault":
            k = (str(v.get("kind")), str(v.get("target")))
            if e.type == "info":
                open_faults[k].append(len(faults))
                faults.append(_Fault(k[0], k[1], t, None))
            elif e.type == "ok" and open_faults[k]:
                i = open_faults[k].pop(0)
                f = faults[i]
                faults[i] = _Fault(f.kind, f.target, f.start, t)
        elif e.f == "role" and e.type == "info":
            lane = f"{v.get('group')}/{v.get('broker_id')}"
            roles[lane].append((t, str(v.get("role"))))
    return {
        "span": max((t1 - t0) / 1000, 1.0),
        "acks": acks,
        "recvs": recvs,
        "lat_ok": lat_ok,
        "lat_bad": lat_bad,
        "faults": faults,
        "roles": dict(sorted(roles.items())),
    }


def _per_second(times: Iterable[float], span: float) -> list[int]:
    buckets = [0] * (int(span) + 1)
    for t in times:
        buckets[min(int(t), len(buckets) - 1)] += 1
    return buckets


def timeline_svg(events: Sequence[Event]) -> str:
    """The timeline picture as an ``<svg>`` element (empty history: a note)."""
    if not events:
        return (
            '<svg xmlns="http://www.w3.org/2000/svg" width="400" height="40">'
            '<text x="10" y="25">empty history</text></svg>'
        )
    d = _collect(events)
    span = float(d["span"])  # type: ignore[arg-type]
    roles: dict[str, list[tuple[float, str]]] = d["roles"]  # type: ignore[assignment]
    faults: list[_Fault] = d["faults"]  # type: ignore[assignment]
    plot_w = W - LEFT - RIGHT

    def x(t: float) -> float:
        return LEFT + plot_w * max(0.0, min(t, span)) / span

    tp_top, tp_h = 30, 160
    lat_top, lat_h = tp_top + tp_h + 52, 160
    role_top = lat_top + lat_h + 52
    lane_h = 16
    height = role_top + max(len(roles), 1) * (lane_h + 4) + 40
    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
        f'viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="11">',
        f'<rect x="0" y="0" width="{W}" height="{height}" fill="white"/>',
    ]
    # fault shading across every panel
    for f in faults:
        x0 = x(f.start)
        x1 = x(f.end if f.end is not None else span)
        out.append(
            f'<rect x="{x0:.1f}" y="{tp_top}" width="{max(x1 - x0, 1.5):.1f}" '
            f'height="{height - tp_top - 30}" fill="{FAULT_COLOUR}" fill-opacity="0.12"/>'
        )
        out.append(
            f'<text x="{x0 + 2:.1f}" y="{tp_top - 4}" fill="{FAULT_COLOUR}">'
            f"{_esc(f.kind)} {_esc(f.target)}{'' if f.end is not None else ' (not healed)'}</text>"
        )
    # throughput
    acks = _per_second(d["acks"], span)  # type: ignore[arg-type]
    recvs = _per_second(d["recvs"], span)  # type: ignore[arg-type]
    peak = max([*acks, *recvs, 1])
    out.append(_axes(tp_top, tp_h, f"msgs/s (max {peak})", span, x))

    def series(values: list[int], colour: str) -> str:
        pts = " ".join(
            f"{x(i + 0.5):.1f},{tp_top + tp_h - tp_h * v / peak:.1f}" for i, v in enumerate(values)
        )
        return f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="1.6"/>'

    out.append(series(acks, "#1565c0"))
    out.append(series(recvs, "#2e7d32"))
    out.append(
        f'<text x="{LEFT + 6}" y="{tp_top + 12}" fill="#1565c0">acknowledged sends/s</text>'
        f'<text x="{LEFT + 150}" y="{tp_top + 12}" fill="#2e7d32">deliveries/s</text>'
    )
    # latency (log scale 1 ms .. 10 s)
    lat_ok: list[tuple[float, float]] = d["lat_ok"]  # type: ignore[assignment]
    lo, hi = 0.0, 4.0

    def y_lat(ms: float) -> float:
        v = (math.log10(max(ms, 1.0)) - lo) / (hi - lo)
        return lat_top + lat_h - lat_h * max(0.0, min(v, 1.0))

    out.append(_axes(lat_top, lat_h, "send latency (ms, log)", span, x))
    for grid_ms in (1, 10, 100, 1000, 10000):
        yy = y_lat(grid_ms)
        out.append(
            f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>'
            f'<text x="{LEFT - 4}" y="{yy + 3:.1f}" text-anchor="end">{grid_ms}</text>'
        )
    step = max(1, len(lat_ok) // 4000)  # keep the page small
    out.extend(
        f'<circle cx="{x(t):.1f}" cy="{y_lat(ms):.1f}" r="1.3" fill="#1565c0"/>'
        for t, ms in lat_ok[::step]
    )
    bad: list[float] = d["lat_bad"]  # type: ignore[assignment]
    out.extend(
        f'<rect x="{x(t) - 1:.1f}" y="{lat_top + 1}" width="2" height="6" fill="{FAULT_COLOUR}"/>'
        for t in bad
    )
    # roles
    out.append(f'<text x="{LEFT}" y="{role_top - 8}" font-weight="bold">roles</text>')
    for i, (lane, changes) in enumerate(roles.items()):
        y0 = role_top + i * (lane_h + 4)
        out.append(f'<text x="{LEFT - 4}" y="{y0 + 12}" text-anchor="end">{_esc(lane)}</text>')
        for j, (t, role) in enumerate(changes):
            t_end = changes[j + 1][0] if j + 1 < len(changes) else span
            colour = ROLE_COLOURS.get(role, "#999")
            out.append(
                f'<rect x="{x(t):.1f}" y="{y0}" width="{max(x(t_end) - x(t), 1):.1f}" '
                f'height="{lane_h}" fill="{colour}"><title>{_esc(lane)} {_esc(role)} '
                f"from {t:.1f}s</title></rect>"
            )
            if j:
                out.append(
                    f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{y0 - 2}" y2="{y0 + lane_h + 2}" '
                    'stroke="black" stroke-width="1.2"/>'
                )
    legend_y = height - 14
    lx = LEFT
    for role, colour in ROLE_COLOURS.items():
        out.append(
            f'<rect x="{lx}" y="{legend_y - 9}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{lx + 14}" y="{legend_y}">{role}</text>'
        )
        lx += 80
    out.append(
        f'<rect x="{lx}" y="{legend_y - 9}" width="10" height="10" fill="{FAULT_COLOUR}" '
        f'fill-opacity="0.3"/><text x="{lx + 14}" y="{legend_y}">fault</text>'
    )
    out.append("</svg>")
    return "\n".join(out)


def _axes(top: int, h: int, label: str, span: float, x: object) -> str:
    assert callable(x)
    parts = [
        f'<rect x="{LEFT}" y="{top}" width="{W - LEFT - RIGHT}" height="{h}" '
        'fill="none" stroke="#888"/>',
        f'<text x="{LEFT}" y="{top - 18}" font-weight="bold">{_esc(label)}</text>',
    ]
    tick = max(1, int(span / 10) or 1)
    for s in range(0, int(span) + 1, tick):
        xx = x(float(s))
        parts.append(
            f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{top + h}" y2="{top + h + 4}" stroke="#888"/>'
            f'<text x="{xx:.1f}" y="{top + h + 15}" text-anchor="middle">{s}s</text>'
        )
    return "\n".join(parts)


def render_report(events: Sequence[Event], verdict: Verdict, *, title: str = "") -> str:
    """The whole HTML page."""
    status = "OK" if verdict.ok else "FAILED"
    colour = "#2e7d32" if verdict.ok else "#c62828"
    t0 = min((e.t_ms for e in events), default=0)

    def cls(name: str) -> str:
        return "n bad" if name in FAILING_COUNTS and verdict.counts.get(name, 0) else "n"

    rows = "".join(
        f"<tr><td>{name}</td><td class='{cls(name)}'>{verdict.counts.get(name, 0)}</td></tr>"
        for name in COUNT_NAMES
    )
    fault_rows = "".join(
        f"<tr><td>{_esc(f.kind)}</td><td>{_esc(f.target)}</td>"
        f"<td class='n'>{(f.start_ms - t0) / 1000:.1f}</td>"
        f"<td class='n'>{'-' if f.end_ms is None else f'{(f.end_ms - t0) / 1000:.1f}'}</td>"
        f"<td class='n'>{'-' if f.recovery_ms is None else f.recovery_ms}</td></tr>"
        for f in verdict.faults
    )
    windows = unavailability_windows(events)
    window_rows = "".join(
        f"<tr><td class='n'>{(w.start_ms - t0) / 1000:.1f}</td>"
        f"<td class='n'>{'-' if w.end_ms is None else f'{(w.end_ms - t0) / 1000:.1f}'}</td>"
        f"<td class='n'>{'-' if w.duration_ms is None else w.duration_ms}</td></tr>"
        for w in windows
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
</style></head><body>
<h1>drill {_esc(name)}: <span>{status}</span></h1>
<p>{len(events)} events over {(max((e.t_ms for e in events), default=0) - t0) / 1000:.1f} s.
Times are seconds since the first event.</p>
{timeline_svg(events)}
<h2>Verdict</h2>
<table><tr><th>count</th><th>value</th></tr>{rows}</table>
<table><tr><th>fault</th><th>target</th><th>start s</th><th>healed s</th>
<th>recovery ms</th></tr>{fault_rows}</table>
<table><tr><th>unavailable from s</th><th>to s</th><th>ms</th></tr>{window_rows}</table>
</body></html>
"""


def write_report(path: Path, events: Sequence[Event], verdict: Verdict, *, title: str = "") -> Path:
    path.write_text(render_report(events, verdict, title=title), encoding="utf-8")
    return path
