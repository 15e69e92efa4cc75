"""A campaign judged on Spark equals campaign.json: every drill's verdict whole, and the
per-family summary.

The campaigns here are synthetic: each drill's history is written with the history
writer from a schedule the real generator drew (faults with their families, overlapping
ones included), with traffic on two groups around them — sends that fail while their
group's master is down, consumer groups judged strictly and one after its acks, and a
few planted anomalies — then judged in-process exactly as ``hactl drill campaign``
judges a drill (``GENERATED_CHECK``, ``campaign_document``): tests/campaign_helpers.py.
No cluster runs, which is what keeps 20 drills fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from campaign_helpers import write_campaign, write_drill

from ha_controller.cli.drill import scenario_options
from ha_controller.drills.campaign import CAMPAIGN_FILE
from ha_controller.pipeline.campaign import SPARK_FILE, analyze_campaign

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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
