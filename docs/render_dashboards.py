"""Draw the Grafana dashboards from the data of tests/integration/test_prometheus.py.

    HA_CONTROLLER_DASHBOARD_SNAPSHOT=/tmp/dashboards.json \\
        .venv/bin/pytest tests/integration/test_prometheus.py
    .venv/bin/python docs/render_dashboards.py /tmp/dashboards.json

writes docs/dashboard-groups.png and docs/dashboard-flow.png. The layout
follows each panel's gridPos; series come from the test's query_range over
its window (a master killed, its slave acting, the master back); stats show
the value at the end of the window, as Grafana's instant query would, over a
sparkline of the window. Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

DOCS = Path(__file__).resolve().parent
# Grafana's dark theme and its named colours.
BG, PANEL, TEXT, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
NAMED = {
    "green": "#73bf69",
    "orange": "#ff9830",
    "red": "#f2495c",
    "yellow": "#fade2a",
    "blue": "#5794f2",
    "purple": "#b877d9",
}
PALETTE = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#705da0"]
ROW_UNIT_IN = 0.42  # inches per gridPos height unit
WIDTH_IN = 20.0


def color(name: str | None) -> str:
    return NAMED.get(name or "", name or NAMED["blue"])


def legend(fmt: str, metric: dict[str, str]) -> str:
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt)
    return text or ", ".join(f"{k}={v}" for k, v in metric.items()) or "value"


def points(series: dict[str, Any], t0: float) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for ts, value in series["values"]:
        v = float(value)
        if math.isfinite(v):
            xs.append(float(ts) - t0)
            ys.append(v)
    return xs, ys


def with_gaps(xs: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    """Break the line where samples are missing (a killed broker), as Grafana does."""
    gx: list[float] = []
    gy: list[float] = []
    for x, y in zip(xs, ys, strict=True):
        if gx and x - gx[-1] > 1.5:
            gx.append(gx[-1] + 1)
            gy.append(math.nan)
        gx.append(x)
        gy.append(y)
    return gx, gy


def fmt_value(v: float, unit: str | None) -> str:
    if unit == "percentunit":
        return f"{v * 100:.1f}%"
    if unit == "s":
        return f"{v:.0f} s" if v < 120 else f"{v / 60:.1f} min"
    if unit == "bytes":
        return f"{v:.0f} B" if v < 1024 else f"{v / 1024:.1f} KiB"
    return f"{v:.3g}"


def mapped(value: float, mappings: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(text, colour) of a value mapping that matches ``value``."""
    for m in mappings:
        opts = m["options"]
        if m["type"] == "value":
            for key, res in opts.items():
                if float(key) == value:
                    return res.get("text", key), color(res.get("color"))
        elif m["type"] == "range" and opts["from"] <= value <= opts["to"]:
            res = opts["result"]
            text = res.get("text", "").replace("${__value.raw}", f"{value:g}")
            return text, color(res.get("color"))
    return None


def threshold_color(value: float, defaults: dict[str, Any]) -> str:
    chosen = NAMED["green"]
    for step in defaults.get("thresholds", {}).get("steps", []):
        if step["value"] is None or value >= step["value"]:
            chosen = color(step["color"])
    return chosen


def style(ax: Axes, title: str, span: float) -> None:
    ax.set_facecolor(PANEL)
    ax.set_title(title, color=TEXT, fontsize=9, loc="left", pad=4)
    ax.tick_params(colors=TEXT, labelsize=7, length=2)
    for side in ax.spines.values():
        side.set_color(GRID)
    ax.grid(color=GRID, linewidth=0.5)
    ax.set_xlim(0, span)


def mark(ax: Axes, marks: list[float]) -> None:
    for x in marks:
        ax.axvline(x, color=NAMED["red"], linewidth=1, linestyle="--", alpha=0.8)


def draw_timeseries(ax: Axes, panel: dict[str, Any], t0: float, span: float) -> None:
    defaults = panel["defaults"]
    bars = defaults.get("custom", {}).get("drawStyle") == "bars"
    fixed = defaults.get("color", {}).get("fixedColor")
    n = 0
    for target in panel["targets"]:
        for series in target["result"]:
            xs, ys = points(series, t0)
            c = color(fixed) if fixed else PALETTE[n % len(PALETTE)]
            label = legend(target["legendFormat"], series["metric"])
            if bars:
                ax.bar(xs, ys, width=0.9, color=c, alpha=0.7, label=label)
            else:
                ax.plot(*with_gaps(xs, ys), color=c, linewidth=1.2, label=label)
            n += 1
    if defaults.get("min") == 0:
        ax.set_ylim(bottom=0)
    unit = defaults.get("unit")
    if unit and unit not in ("short", "none"):
        ax.set_ylabel(unit, color=TEXT, fontsize=7)
    if n:
        ax.legend(
            loc="upper left",
            fontsize=6,
            ncol=3 if n > 4 else 1,
            facecolor=PANEL,
            edgecolor=GRID,
            labelcolor=TEXT,
            framealpha=0.8,
        )


def draw_state_timeline(ax: Axes, panel: dict[str, Any], t0: float, span: float) -> None:
    defaults = panel["defaults"]
    mappings = defaults.get("mappings", [])
    rows = [
        (legend(t["legendFormat"], s["metric"]), s) for t in panel["targets"] for s in t["result"]
    ]
    rows.sort(key=lambda r: r[0], reverse=True)
    for i, (_, series) in enumerate(rows):
        xs, ys = points(series, t0)
        # Merge equal consecutive values; a gap over 1.5 steps is "no data".
        j = 0
        while j < len(xs):
            k = j
            while k + 1 < len(xs) and ys[k + 1] == ys[j] and xs[k + 1] - xs[k] < 1.5:
                k += 1
            end = xs[k] + 1
            hit = mapped(ys[j], mappings)
            text, c = hit if hit else (f"{ys[j]:g}", threshold_color(ys[j], defaults))
            ax.broken_barh([(xs[j], end - xs[j])], (i + 0.1, 0.8), color=c, alpha=0.85)
            show = panel["options"].get("showValue", "auto") != "never"
            if show and end - xs[j] > span * 0.08:
                ax.text(xs[j] + 0.5, i + 0.5, text, va="center", fontsize=6.5, color="#111217")
            j = k + 1
    ax.set_yticks([i + 0.5 for i in range(len(rows))], [r[0] for r in rows], fontsize=6.5)
    ax.set_ylim(0, max(len(rows), 1))
    ax.grid(False)


def draw_stat(ax: Axes, panel: dict[str, Any], t0: float, span: float, end: float) -> None:
    defaults = panel["defaults"]
    mappings = defaults.get("mappings", [])
    items = []
    for target in panel["targets"]:
        for series in target["result"]:
            xs, ys = points(series, t0)
            at_end = ys[-1] if xs and xs[-1] >= end - t0 - 1.5 else None
            items.append((legend(target["legendFormat"], series["metric"]), xs, ys, at_end))
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    shown = [i for i in items if i[3] is not None]
    if not shown:
        ax.text(0.5, 0.5, defaults.get("noValue", "No data"), ha="center", va="center",
                fontsize=14, color=TEXT)  # fmt: skip
    width = 1 / max(len(shown), 1)
    for n, (label, _, _, value) in enumerate(shown):
        assert value is not None
        hit = mapped(value, mappings)
        text, c = hit if hit else (fmt_value(value, defaults.get("unit")), None)
        c = c or threshold_color(value, defaults)
        x0 = n * width
        background = panel["options"].get("colorMode") == "background"
        if background:
            ax.add_patch(Rectangle((x0 + 0.01, 0.04), width - 0.02, 0.92, color=c, alpha=0.85))
        ink = "#111217" if background else c
        ax.text(x0 + width / 2, 0.72, label, ha="center", fontsize=8, color=ink)
        ax.text(x0 + width / 2, 0.4, text, ha="center", fontsize=15, color=ink, weight="bold")
    # Sparkline of the whole window under the values (each series scaled to its band).
    spark = ax.inset_axes((0.0, 0.02, 1.0, 0.22))
    spark.set_axis_off()
    spark.set_xlim(0, span)
    for n, (_, xs, ys, _) in enumerate(items):
        spark.plot(*with_gaps(xs, ys), color=PALETTE[n % len(PALETTE)], linewidth=0.8)


def render(dashboard: dict[str, Any], window: tuple[float, float], out: Path) -> None:
    t0, end = window
    span = end - t0
    panels = dashboard["panels"]
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    header = 1.2
    fig: Figure = plt.figure(figsize=(WIDTH_IN, height * ROW_UNIT_IN + header), facecolor=BG)
    total_in = height * ROW_UNIT_IN + header
    # The annotation query is a count of changes over a trailing window: mark
    # where it goes up (Grafana shades the whole window).
    marks: list[float] = []
    for ann in dashboard["annotations"]:
        for series in ann["result"]:
            before = 0.0
            for x, v in zip(*with_gaps(*points(series, t0)), strict=True):
                if v > before:
                    marks.append(x)
                before = 0.0 if math.isnan(v) else v
    vars_text = "   ".join(f"{k}: {', '.join(v)}" for k, v in dashboard["variables"].items())
    fig.text(0.01, 1 - 0.35 / total_in, dashboard["title"], color=TEXT, fontsize=15, va="top")
    fig.text(
        0.01,
        1 - 0.8 / total_in,
        f"{vars_text}   |   last {span:.0f} s, 1 s scrapes; dashed red lines: annotation "
        "'Min broker id changes' (a master lost, then back)",
        color="#8e8e8e",
        fontsize=8.5,
        va="top",
    )
    for panel in panels:
        g = panel["gridPos"]
        left, width = g["x"] / 24 * 0.98 + 0.02, g["w"] / 24 * 0.98 - 0.022
        top_in = header + g["y"] * ROW_UNIT_IN
        if panel["type"] == "row":
            fig.text(left, 1 - (top_in + 0.3) / total_in, panel["title"], color=TEXT,
                     fontsize=11, weight="bold")  # fmt: skip
            continue
        # leave room for the title above and tick labels below
        bottom_in = top_in + g["h"] * ROW_UNIT_IN - 0.35
        box = (left, 1 - bottom_in / total_in, width, (g["h"] * ROW_UNIT_IN - 0.7) / total_in)
        if panel["type"] == "state-timeline":
            box = (left + 0.07, box[1], width - 0.07, box[3])  # room for row labels
        ax = fig.add_axes(box)
        style(ax, panel["title"], span)
        if panel["type"] == "stat":
            draw_stat(ax, panel, t0, span, end)
            continue
        if panel["type"] == "state-timeline":
            draw_state_timeline(ax, panel, t0, span)
        else:
            draw_timeseries(ax, panel, t0, span)
        mark(ax, marks)
        ax.set_xlabel("seconds", color=TEXT, fontsize=6.5, labelpad=1)
    fig.savefig(out, dpi=80, facecolor=BG)
    plt.close(fig)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    snapshot = json.loads(Path(argv[1]).read_text())
    window = (snapshot["window"][0], snapshot["window"][1])
    for dashboard in snapshot["dashboards"]:
        name = dashboard["file"].removeprefix("ha-controller-").removesuffix(".json")
        out = DOCS / f"dashboard-{name}.png"
        render(dashboard, window, out)
        print(f"wrote {out.relative_to(DOCS.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
