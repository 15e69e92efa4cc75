"""A campaign's summary for people: the per-family table (terminal) and
``campaign.html`` (the table and a timeline strip per drill, linking to its report).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ha_controller.drills.checker import (
    FAILING_COUNTS,
    REPORTED_COUNTS,
)
from ha_controller.drills.report import FAMILY_COLOURS

__all__ = ["print_table", "render_campaign", "table_lines"]


def _fmt(v: object) -> str:
    return "-" if v is None else str(v)


def table_lines(document: Mapping[str, Any]) -> list[str]:
    """The per-family table as text lines."""
    counts = [*FAILING_COUNTS, *REPORTED_COUNTS]
    short = {
        "order_violations": "order",
        "late_delayed": "late",
        "unresolved_transactions": "unres_tx",
        "double_lock_grants": "dbl_lock",
        "offset_rollbacks": "off_rb",
        "corrupt_deliveries": "corrupt",
        "unsynced_lost": "unsynced",
    }
    head = ["family", "faults", "drills", *(short.get(c, c) for c in counts)]
    head += ["write p50/p99/max ms", "read p50/p99/max ms"]
    rows = [head]
    for family, e in document["families"].items():
        w, r = e["write_unavailable_ms"], e["read_unavailable_ms"]
        rows.append(
            [
                family,
                str(e["faults"]),
                str(e["drills"]),
                *(str(e.get(c, 0)) for c in counts),
                "/".join(_fmt(w[k]) for k in ("p50", "p99", "max")),
                "/".join(_fmt(r[k]) for k in ("p50", "p99", "max")),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]


def print_table(document: Mapping[str, Any], tell: Callable[[str], None]) -> None:
    for line in table_lines(document):
        tell(line)
    if "flush_mode" in document:
        tell(
            f"stores flushed {document['flush_mode']} "
            "(unsynced: lost to a power loss, as async allows)"
        )
    for family, reason in document.get("skipped_families", {}).items():
        tell(f"skipped {family}: {reason}")


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def render_campaign(out: Path, document: Mapping[str, Any]) -> str:
    """``campaign.html``: the per-family table and one timeline strip per drill."""
    ok = bool(document["ok"])
    colour = "#2e7d32" if ok else "#c62828"
    shown = (*FAILING_COUNTS, *REPORTED_COUNTS)
    heads = "".join(f"<th>{_esc(c)}</th>" for c in shown)
    fam_rows = []
    for family, e in document["families"].items():
        swatch = FAMILY_COLOURS.get(family, "#999")
        cells = "".join(
            f"<td class='n{' bad' if e.get(c) and c in FAILING_COUNTS else ''}'>{e.get(c, 0)}</td>"
            for c in shown
        )
        windows = "".join(
            f"<td class='n'>{'/'.join(_fmt(e[kind][k]) for k in ('p50', 'p99', 'max'))}"
            f"{' (' + str(e[kind]['unrecovered']) + ' never)' if e[kind]['unrecovered'] else ''}"
            "</td>"
            for kind in ("write_unavailable_ms", "read_unavailable_ms")
        )
        fam_rows.append(
            f"<tr><td><span class='sw' style='background:{swatch}'></span>{_esc(family)}</td>"
            f"<td class='n'>{e['faults']}</td><td class='n'>{e['drills']}</td>{cells}"
            f"{windows}<td class='n'>{e.get('errors', 0)}</td></tr>"
        )
    drill_rows = []
    for d in document.get("drills", []):
        strip_path = out / str(d["drill"]) / "strip.svg"
        strip = strip_path.read_text(encoding="utf-8") if strip_path.is_file() else ""
        status = "OK" if d["ok"] else "FAILED"
        detail = ", ".join(f"{k}={v}" for k, v in d.get("failing_counts", {}).items())
        if d.get("error"):
            detail = f"{detail} error: {d['error']}".strip()
        faults = ", ".join(f"{k} x{v}" for k, v in d.get("faults", {}).items())
        drill_rows.append(
            f"<tr><td><a href='{_esc(d['drill'])}/report.html'>{_esc(d['drill'])}</a><br>"
            f"seed {d['seed']}<br><b class='{'ok' if d['ok'] else 'bad'}'>{status}</b>"
            f"<br><small>{_esc(faults)}</small><br><small>{_esc(detail)}</small></td>"
            f"<td>{strip}</td></tr>"
        )
    skipped = "".join(
        f"<li>{_esc(f)}: {_esc(r)}</li>" for f, r in document.get("skipped_families", {}).items()
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>campaign: {"OK" if ok else "FAILED"}</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; }}
h1 span {{ color: {colour}; }}
table {{ border-collapse: collapse; margin: 8px 0 16px 0; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; vertical-align: top; }}
td.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
td.bad, b.bad {{ color: #c62828; font-weight: bold; }}
b.ok {{ color: #2e7d32; }}
span.sw {{ display: inline-block; width: 10px; height: 10px; margin-right: 6px; }}
</style></head><body>
<h1>campaign: <span>{"OK" if ok else "FAILED"}</span></h1>
<p>{len(document.get("drills", []))} drills, {document.get("faults_per_family")} faults
per family wanted, seed {document.get("seed")}, stores flushed
{_esc(document.get("flush_mode", "async"))}; failing seeds:
{_esc(document.get("failing_seeds") or "none")}.  A drill's counts are attributed to every
family that had a fault in it; windows are each fault's worst (largest group or cluster)
window, p50/p99/max in ms over the family's faults.</p>
<table><tr><th>family</th><th>faults</th><th>drills</th>{heads}
<th>write unavailable ms<br>p50/p99/max</th><th>read unavailable ms<br>p50/p99/max</th>
<th>errors</th></tr>{"".join(fam_rows)}</table>
{f"<p>Skipped families:</p><ul>{skipped}</ul>" if skipped else ""}
<h2>Drills</h2>
<p>Each strip: acknowledged sends per second, failed or unknown sends as red ticks at the
top, and one bar per fault in its target's lane, coloured by family (table above).</p>
<table>{"".join(drill_rows)}</table>
</body></html>
"""
