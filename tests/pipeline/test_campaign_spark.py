"""A campaign judged on Spark equals campaign.json: every drill's verdict whole, and the
per-family summary.

The campaigns here are synthetic: each drill's history is written with the history
writer from a schedule the real generator drew (faults with their families, overlapping
ones included), with traffic on two groups around them — sends that fail while their
group's master is down, consumer groups judged strictly and one after its acks, and a
few planted anomalies — then judged in-process exactly as ``hactl drill campaign``
judges a drill (``GENERATED_CHECK``, ``campaign_document``).  No cluster runs, which is
what keeps 20 drills fast.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ha_controller.cli.drill import scenario_options
from ha_controller.drills.campaign import (
    CAMPAIGN_FILE,
    DrillOutcome,
    align_families,
    campaign_document,
    fault_families,
)
from ha_controller.drills.checker import check
from ha_controller.drills.generator import FAMILIES, ScheduleGenerator
from ha_controller.drills.history import (
    Ack,
    EventType,
    Fault,
    HistoryWriter,
    Receive,
    SendInvoke,
    SendOk,
    SendOutcome,
    Subscribe,
    iter_history,
)
from ha_controller.drills.runner import GENERATED_CHECK, POP_GROUP
from ha_controller.pipeline.campaign import SPARK_FILE, analyze_campaign

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T0 = 1_700_000_000_000
GROUPS = ("broker-a", "broker-b")


def write_drill(directory: Path, seed: int) -> None:
    """One synthetic drill: history.jsonl and verdict.json as the campaign writes them."""
    rng = random.Random(seed)
    quota = {f: 1 for f in rng.sample(FAMILIES, 4)}
    schedule = ScheduleGenerator(seed).generate_quota(quota)
    directory.mkdir(parents=True)
    path = directory / "history.jsonl"
    with HistoryWriter(path) as h:
        for cg, topic in (("drill-push", "T"), (POP_GROUP, "P")):
            h.record("c", "info", Subscribe("c", cg, topic), t_ms=T0)
        # faults: (start, end, target) in ms
        down: list[tuple[int, int, str]] = []
        t = T0 + 1_000
        for step in schedule.steps:
            for f in step.faults:
                start = t + int(f.offset_s * 1000)
                end = start + int(f.duration_s * 1000)
                value = Fault(f.kind, f.target, family=f.family)
                h.record("nemesis", "info", value, t_ms=start)
                h.record("nemesis", "ok", Fault(f.kind, f.target, family=f.family), t_ms=end)
                down.append((start, end, f.target))
            t += int((step.span_s + step.gap_s) * 1000)
        end_t = t + 1_000
        n = 0
        offsets = dict.fromkeys(GROUPS, 0)
        for now in range(T0 + 200, end_t, 97):
            group = GROUPS[n % 2]
            key = f"k{n}"
            n += 1
            topic = "P" if n % 5 == 0 else "T"
            cg = POP_GROUP if topic == "P" else "drill-push"
            h.record("p", "invoke", SendInvoke(key, topic), t_ms=now)
            master_down = any(s <= now < e and tg == f"{group}/0" for s, e, tg in down)
            if master_down:
                outcome: EventType = "fail" if rng.random() < 0.5 else "info"
                h.record("p", outcome, SendOutcome(key, "down", group), t_ms=now + 40)
                continue
            qo = offsets[group]
            offsets[group] += 1
            h.record("p", "ok", SendOk(key, f"id{n}", group, 0, qo), t_ms=now + 3)
            if rng.random() < 0.003:  # planted: lost
                continue
            deliveries = 2 if rng.random() < 0.004 else 1  # planted: duplicated
            for d in range(deliveries):
                at = now + 30 + d * 500
                h.record("c", "ok", Receive(key, f"id{n}", group, 0, qo, "c", cg), t_ms=at)
                if cg == POP_GROUP and d == 0 and rng.random() < 0.5:
                    h.record("c", "ok", Ack(key, "c", cg), t_ms=at + 1)
    verdict = check(path, scenario="generated", options=GENERATED_CHECK)
    (directory / "verdict.json").write_text(verdict.to_json() + "\n", encoding="utf-8")


def write_campaign(root: Path, drills: int, seed: int = 5) -> dict[str, object]:
    outcomes = []
    for i in range(drills):
        name = f"drill-{i:03d}"
        write_drill(root / name, seed * 1000 + i)
        history = root / name / "history.jsonl"
        verdict = check(history, scenario="generated", options=GENERATED_CHECK)
        families = align_families(verdict.faults, fault_families(iter_history(history)))
        error = "RuntimeError: planted" if i == 1 else None
        outcomes.append(DrillOutcome(name, seed * 1000 + i, verdict, families, error))
    document = campaign_document(
        outcomes, families=FAMILIES, faults_per_family=1, seed=seed, skipped={}
    )
    (root / CAMPAIGN_FILE).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return document


def test_synthetic_campaign_is_not_vacuous(tmp_path: Path) -> None:
    document = write_campaign(tmp_path, 6)
    families = document["families"]
    assert isinstance(families, dict)
    assert sum(f["faults"] for f in families.values()) == 6 * 4
    assert any(f["write_unavailable_ms"]["max"] for f in families.values())
    assert document["failing_seeds"]  # the planted error at least


def test_campaign_on_spark_equals_campaign_json(spark: SparkSession, tmp_path: Path) -> None:
    recorded = write_campaign(tmp_path, 4)
    result = analyze_campaign(spark, tmp_path, options_for=scenario_options)
    assert result.mismatches == []
    assert result.document["families"] == recorded["families"]
    assert result.document["failing_seeds"] == recorded["failing_seeds"]
    written = json.loads((tmp_path / SPARK_FILE).read_text(encoding="utf-8"))
    assert written["families"] == recorded["families"]
    for i in range(4):
        drill = tmp_path / f"drill-{i:03d}"
        spark_verdict = json.loads((drill / "verdict.spark.json").read_text(encoding="utf-8"))
        assert spark_verdict == json.loads((drill / "verdict.json").read_text(encoding="utf-8"))


def test_a_changed_count_is_a_mismatch(spark: SparkSession, tmp_path: Path) -> None:
    write_campaign(tmp_path, 2)
    doc = json.loads((tmp_path / CAMPAIGN_FILE).read_text(encoding="utf-8"))
    family = next(f for f, e in doc["families"].items() if e["faults"])
    doc["families"][family]["lost"] += 1
    (tmp_path / CAMPAIGN_FILE).write_text(json.dumps(doc), encoding="utf-8")
    result = analyze_campaign(spark, tmp_path, options_for=scenario_options)
    assert any(m.startswith(f"families.{family}.lost") for m in result.mismatches)


@pytest.mark.slow  # test_hactl_analyze_on_a_campaign_directory runs hactl analyze
@pytest.mark.timeout(600)
def test_hactl_analyze_on_20_drills_equals_campaign_json(tmp_path: Path) -> None:
    """The command itself (its own Spark session) on 20 synthetic drills (about 70 s on
    two cores, so it is in the default suite)."""
    recorded = write_campaign(tmp_path, 20)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "ha_controller.cli", "analyze", str(tmp_path), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
        check=False,
    )
    # the campaign fails (planted anomalies), so the exit status is 1, not 2+
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "equals" in proc.stderr, proc.stderr[-2000:]
    written = json.loads((tmp_path / SPARK_FILE).read_text(encoding="utf-8"))
    assert written["families"] == recorded["families"]
    assert written["failing_seeds"] == recorded["failing_seeds"]


class _KeepOpen:
    """The test session for ``hactl analyze``, which stops the session it built."""

    def __init__(self, session: SparkSession) -> None:
        self._session = session

    def __getattr__(self, name: str) -> object:
        return getattr(self._session, name)

    def stop(self) -> None:
        pass


@pytest.fixture
def hactl_analyze(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[[Path], tuple[int, str]]:
    import ha_controller.pipeline.session as session_module
    from ha_controller.cli import main

    monkeypatch.setattr(session_module, "build_session", lambda *_a, **_k: _KeepOpen(spark))

    def run(directory: Path) -> tuple[int, str]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            main(["analyze", str(directory), "--no-progress"])
        return int(exit_.value.code or 0), capsys.readouterr().err

    return run


def test_hactl_analyze_compares_whole_verdicts(
    tmp_path: Path, hactl_analyze: Callable[[Path], tuple[int, str]]
) -> None:
    drill = tmp_path / "drill-000"
    write_drill(drill, 3)
    recorded = json.loads((drill / "verdict.json").read_text(encoding="utf-8"))
    code, err = hactl_analyze(drill)
    assert "verdict equals" in err, err
    assert code == (0 if recorded["ok"] else 1)
    # a window that differs (not a count) is a mismatch too
    fault = next(f for f in recorded["faults"] if f["write_unavailable_ms"])
    group = next(iter(fault["write_unavailable_ms"]))
    fault["write_unavailable_ms"][group] = 123_456
    (drill / "verdict.json").write_text(json.dumps(recorded), encoding="utf-8")
    code, err = hactl_analyze(drill)
    assert code == 1
    assert "DIFFERS" in err and "write_unavailable_ms" in err, err


def test_hactl_analyze_on_a_campaign_directory(
    tmp_path: Path, hactl_analyze: Callable[[Path], tuple[int, str]]
) -> None:
    recorded = write_campaign(tmp_path, 3)
    code, err = hactl_analyze(tmp_path)
    assert "equals" in err and "analyzed 3 drills" in err, err
    assert code == (0 if recorded["ok"] else 1)
    assert (tmp_path / SPARK_FILE).is_file()
