"""A campaign's summary, ``campaign.json``: faults attributed to families, per-family
counts and windows (the rules: :mod:`ha_controller.drills.campaign`).  Shared with the
Spark analysis (:mod:`ha_controller.pipeline.campaign`), which builds the same document
from Spark verdicts.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ha_controller.drills.campaign_options import WINDOW_KEYS, DrillOutcome, FaultKey
from ha_controller.drills.checker import (
    FAILING_COUNTS,
    REPORTED_COUNTS,
    FaultWindow,
    availability_summary,
)
from ha_controller.drills.history import Event

__all__ = ["align_families", "campaign_document", "family_summary", "fault_families"]


def fault_families(events: Iterable[Event]) -> dict[FaultKey, list[str | None]]:
    """``(start_ms, kind, target)`` -> the families of the faults that started so, from
    the ``fault`` info events of a history."""
    out: dict[FaultKey, list[str | None]] = defaultdict(list)
    for e in events:
        if e.f != "fault" or e.type != "info":
            continue
        kind, target, family = (e.value.get(k) for k in ("kind", "target", "family"))
        if isinstance(kind, str) and isinstance(target, str):
            out[(e.t_ms, kind, target)].append(family if isinstance(family, str) else None)
    return out


def align_families(
    faults: Sequence[FaultWindow], families: Mapping[FaultKey, Sequence[str | None]]
) -> tuple[str | None, ...]:
    """The family of each fault of a verdict (faults with one key take theirs in turn)."""
    taken: Counter[FaultKey] = Counter()
    out: list[str | None] = []
    for fw in faults:
        key = (fw.start_ms, fw.kind, fw.target)
        found = sorted(families.get(key, ()), key=lambda f: f or "")
        i = taken[key]
        out.append(found[i] if i < len(found) else None)
        taken[key] += 1
    return tuple(out)


def _windows(faults: Sequence[FaultWindow]) -> dict[str, dict[str, int | None]]:
    summary = availability_summary(faults)
    return {
        kind: {k: summary[kind][k] for k in WINDOW_KEYS}
        for kind in ("write_unavailable_ms", "read_unavailable_ms")
    }


def family_summary(
    outcomes: Sequence[DrillOutcome], families: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """``campaign.json``'s ``families`` (the attribution rule: module docstring)."""
    out: dict[str, dict[str, Any]] = {}
    for family in families:
        drills = [o for o in outcomes if family in o.families]
        faults = [
            fw
            for o in outcomes
            for fw, f in zip(o.verdict.faults, o.families, strict=True)
            if f == family
        ]
        entry: dict[str, Any] = {"faults": len(faults), "drills": len(drills)}
        for name in (*FAILING_COUNTS, *REPORTED_COUNTS):
            entry[name] = sum(int(o.verdict.counts.get(name, 0)) for o in drills)
        entry.update(_windows(faults))
        entry["errors"] = sum(1 for o in drills if o.error is not None)
        out[family] = entry
    return out


def campaign_document(
    outcomes: Sequence[DrillOutcome],
    *,
    families: Sequence[str],
    faults_per_family: int,
    seed: int,
    skipped: Mapping[str, str],
    extra: Mapping[str, Any] | None = None,
    asked: bool = False,
) -> dict[str, Any]:
    """``campaign.json``: ``{"ok", "families", "failing_seeds", ...}`` (module docstring);
    ``asked``: the families were asked for, so a skipped one leaves it incomplete."""
    summary = family_summary(outcomes, families)
    complete = all(
        summary[f]["faults"] >= faults_per_family for f in families if asked or f not in skipped
    )
    return {
        "ok": complete and all(o.ok for o in outcomes),
        "families": summary,
        "failing_seeds": sorted({o.seed for o in outcomes if not o.ok}),
        "complete": complete,
        "faults_per_family": faults_per_family,
        "seed": seed,
        "skipped_families": dict(skipped),
        "families_asked": asked,
        "drills": [
            {
                "drill": o.drill,
                "seed": o.seed,
                "ok": o.ok,
                "error": o.error,
                "faults": dict(sorted(o.family_counts().items())),
                "failing_counts": {
                    k: int(o.verdict.counts[k]) for k in FAILING_COUNTS if o.verdict.counts.get(k)
                },
            }
            for o in outcomes
        ],
        **(extra or {}),
    }
