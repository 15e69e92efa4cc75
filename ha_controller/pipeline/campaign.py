"""A whole drill campaign judged on Spark (``hactl analyze DIR`` on a campaign directory).

Every drill's ``history*.jsonl`` is read in one scan (:func:`~.verdict.read_drills`: a
``hid`` column names the drill, the frame is partitioned by it) and every verdict is
computed in the same Spark jobs (:func:`~.verdict.verdicts_of`; drills judged with
different checker options, which a campaign does not have, take one pass per option
set).  The fault families come from the same frame.  The per-family summary is then
built by :func:`ha_controller.drills.campaign.campaign_document`, the function that
wrote ``campaign.json``, from the Spark verdicts; what the histories cannot tell (each
drill's seed, a drill that ended in an error, the families skipped up front) is taken
from ``campaign.json``.  Writes ``DIR/<drill>/verdict.spark.json`` and
``DIR/campaign.spark.json``; :func:`campaign_mismatches` lists what differs from
``campaign.json`` (``ok``, ``complete``, ``failing_seeds`` and every family's counts and
windows), and each drill's verdict is compared whole with its ``verdict.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from ha_controller.drills.campaign import (
    CAMPAIGN_FILE,
    DrillOutcome,
    align_families,
    campaign_document,
)
from ha_controller.drills.checker import CheckOptions, Verdict
from ha_controller.pipeline.verdict import fault_families, read_drills, verdicts_of

__all__ = [
    "SPARK_FILE",
    "CampaignAnalysis",
    "analyze_campaign",
    "campaign_mismatches",
    "is_campaign",
]

SPARK_FILE = "campaign.spark.json"
#: the campaign.json keys the Spark summary must reproduce
COMPARED = ("ok", "complete", "failing_seeds", "families")


def is_campaign(directory: Path) -> bool:
    return (directory / CAMPAIGN_FILE).is_file()


@dataclass(slots=True)
class CampaignAnalysis:
    document: dict[str, Any]
    verdicts: dict[str, Verdict]
    #: what differs from campaign.json and the drills' verdict.json (empty: equal)
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.document["ok"])


def campaign_mismatches(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """Differences between two campaign summaries in :data:`COMPARED`, one line each."""
    out = [
        f"{key}: {mine.get(key)!r} != {theirs.get(key)!r}"
        for key in COMPARED[:-1]
        if mine.get(key) != theirs.get(key)
    ]
    a, b = mine.get("families", {}), theirs.get("families", {})
    for family in sorted(set(a) | set(b)):
        fa, fb = a.get(family, {}), b.get(family, {})
        out.extend(
            f"families.{family}.{k}: {fa.get(k)!r} != {fb.get(k)!r}"
            for k in sorted(set(fa) | set(fb))
            if fa.get(k) != fb.get(k)
        )
    return out


def analyze_campaign(
    spark: SparkSession,
    directory: str | Path,
    *,
    options_for: Callable[[str], CheckOptions | None] = lambda _scenario: None,
) -> CampaignAnalysis:
    """Judge every drill of the campaign in ``directory`` (module docstring);
    ``options_for(scenario)`` gives the checker options a drill was judged with."""
    root = Path(directory)
    recorded = json.loads((root / CAMPAIGN_FILE).read_text(encoding="utf-8"))
    drills = [d for d in recorded.get("drills", []) if (root / d["drill"]).is_dir()]
    files = {
        d["drill"]: sorted((root / d["drill"]).glob("history*.jsonl"))
        for d in drills
        if any((root / d["drill"]).glob("history*.jsonl"))
    }
    scenarios = {name: _scenario(root / name) for name in files}
    verdicts: dict[str, Verdict] = {}
    families: dict[str, dict[tuple[int, str, str], list[str | None]]] = {}
    if files:
        events = read_drills(spark, files).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            by_options: dict[CheckOptions | None, list[str]] = {}
            for name, scenario in scenarios.items():
                by_options.setdefault(options_for(scenario), []).append(name)
            for options, names in by_options.items():
                part = events if len(by_options) == 1 else events.where(F.col("hid").isin(names))
                verdicts.update(verdicts_of(spark, part, names, options=options))
            families = fault_families(events)
        finally:
            events.unpersist()
    verdicts = {name: replace(v, scenario=scenarios[name]) for name, v in verdicts.items()}
    outcomes = [
        DrillOutcome(
            d["drill"],
            int(d["seed"]),
            verdicts[d["drill"]],
            align_families(verdicts[d["drill"]].faults, families.get(d["drill"], {})),
            d.get("error"),
        )
        for d in drills
        if d["drill"] in verdicts
    ]
    document = campaign_document(
        outcomes,
        families=list(recorded["families"]),
        faults_per_family=int(recorded["faults_per_family"]),
        seed=int(recorded["seed"]),
        skipped=recorded.get("skipped_families", {}),
        extra={"source": "spark"},
        asked=bool(recorded.get("families_asked", False)),
    )
    for name, verdict in verdicts.items():
        (root / name / "verdict.spark.json").write_text(verdict.to_json() + "\n", "utf-8")
    (root / SPARK_FILE).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    mismatches = campaign_mismatches(document, recorded)
    if len(outcomes) != len(recorded.get("drills", [])):
        mismatches.append(
            f"drills: {len(outcomes)} with a history != {len(recorded.get('drills', []))}"
        )
    for name, verdict in verdicts.items():
        local = root / name / "verdict.json"
        if local.is_file():
            theirs = Verdict.from_dict(json.loads(local.read_text(encoding="utf-8")))
            mismatches.extend(f"{name}: {m}" for m in verdict.mismatches(theirs))
    return CampaignAnalysis(document, verdicts, mismatches)


def _scenario(drill_dir: Path) -> str:
    local = drill_dir / "verdict.json"
    if local.is_file():
        return str(json.loads(local.read_text(encoding="utf-8")).get("scenario") or "generated")
    return "generated"
