"""The Spark verdict equals the in-process verdict, JSON for JSON.

Histories that share checker options are read in one scan and judged in one
``verdicts_of`` call (one set of Spark jobs), which keeps this module fast; each verdict
is still compared on its own.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

from ha_controller.drills.checker import CheckOptions, Verdict, check
from ha_controller.drills.history import HistoryWriter
from ha_controller.pipeline.verdict import (
    compute_dir_verdict,
    compute_verdict,
    compute_verdicts,
    read_drills,
    verdicts_of,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


handmade = _load("hac_handmade_cases", ROOT / "tests" / "unit" / "test_checker.py")
gen = _load("hac_gen_history", ROOT / "bench" / "gen_history.py")


#: the hand-made cases judged with the default options: one Spark run for all of them
DEFAULT_CASES = sorted(n for n, c in handmade.CASES.items() if c.options == CheckOptions())
#: the few cases with options of their own: a Spark run each (-m slow)
OPTION_CASES = sorted(set(handmade.CASES) - set(DEFAULT_CASES))


def _verdicts(
    spark: SparkSession, tmp: Path, names: list[str]
) -> dict[str, tuple[Verdict, Verdict]]:
    """name -> (in-process verdict, Spark verdict) for the hand-made cases ``names``.

    The cases that share options are read in one scan, as a campaign's drills are
    (``read_drills``: one directory per history; a union of one read per file would
    make every Spark job of the verdict scan each file apart)."""
    by_options: dict[CheckOptions, dict[str, Path]] = {}
    for name in names:
        case = handmade.CASES[name]
        path = tmp / name / "history.jsonl"
        path.parent.mkdir()
        with HistoryWriter(path) as writer:
            writer.write_all(case.build().events)
        by_options.setdefault(case.options, {})[name] = path
    out: dict[str, tuple[Verdict, Verdict]] = {}
    for options, paths in by_options.items():
        events = read_drills(spark, {name: [path] for name, path in paths.items()})
        got = verdicts_of(spark, events, list(paths), options=options)
        for name, path in paths.items():
            out[name] = (check(path, scenario=name, options=options), got[name])
    return out


@pytest.fixture(scope="module")
def handmade_verdicts(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Verdict, Verdict]]:
    return _verdicts(spark, tmp_path_factory.mktemp("handmade"), DEFAULT_CASES)


def _same(verdicts: dict[str, tuple[Verdict, Verdict]], name: str) -> None:
    expected, got = verdicts[name]
    assert got.to_json() == expected.to_json()
    assert dict(got.counts) == handmade.CASES[name].counts


@pytest.mark.timeout(600)  # the first case waits for every case's Spark verdicts
@pytest.mark.parametrize("name", DEFAULT_CASES)
def test_handmade_spark_equals_in_process(
    handmade_verdicts: dict[str, tuple[Verdict, Verdict]], name: str
) -> None:
    _same(handmade_verdicts, name)


@pytest.mark.slow  # a Spark run per case; the options' semantics are unit-tested
@pytest.mark.timeout(600)
def test_handmade_cases_with_their_own_options(spark: SparkSession, tmp_path: Path) -> None:
    assert OPTION_CASES, "every hand-made case uses the default options"
    verdicts = _verdicts(spark, tmp_path, OPTION_CASES)
    for name in OPTION_CASES:
        _same(verdicts, name)


GENERATED = {
    "all-anomalies": gen.Anomalies(
        lost=7,
        duplicated=5,
        unexpected=3,
        recovered=4,
        order=6,
        late=5,
        unresolved=3,
        double_locks=4,
        rollbacks=2,
        split_brain=4,
        fast_switches=2,
        faults=3,
    ),
    "clean": gen.Anomalies(faults=2),
    "lost-and-order": gen.Anomalies(lost=11, order=9, late=2),
}


def test_generated_spark_equals_in_process(spark: SparkSession, tmp_path: Path) -> None:
    paths = {name: tmp_path / f"{name}.jsonl" for name in GENERATED}
    expected = {
        name: gen.write_history(paths[name], 6_000, anomalies, seed=len(name)).counts()
        for name, anomalies in GENERATED.items()
    }
    got = compute_verdicts(spark, paths)
    for name, path in paths.items():
        in_process = check(path, scenario=name)
        assert dict(in_process.counts) == expected[name], name
        assert got[name].to_json() == in_process.to_json(), name
    assert got["clean"].ok
    assert not got["all-anomalies"].ok


def test_compute_dir_verdict_reads_many_files_as_one_history(
    spark: SparkSession, tmp_path: Path
) -> None:
    events = handmade.case_transactions().events + handmade.case_fault_recovery().events
    for i, part in enumerate(("a", "b")):
        with HistoryWriter(tmp_path / f"history-{part}.jsonl") as writer:
            writer.write_all(events[i::2])
    expected = check(events, scenario="transactions-acting")
    (tmp_path / "verdict.json").write_text(expected.to_json())
    got = compute_dir_verdict(spark, tmp_path)
    assert got.to_json() == expected.to_json()
    assert (tmp_path / "verdict.spark.json").read_text() == expected.to_json() + "\n"


def test_malformed_line_fails(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"t_ms": 1, "process": "p", "type": "ok", "f": "send"}\n{oops\n')
    with pytest.raises(Exception, match=r"(?i)malformed"):
        compute_verdict(spark, path, scenario="bad")


def test_gap_on_one_group_spark_windows(
    handmade_verdicts: dict[str, tuple[Verdict, Verdict]],
) -> None:
    """Acceptance (issue item 3) on Spark: the hand-written 3 s gap on broker-a, while
    broker-b keeps acknowledging, gives the checker's numbers."""
    expected, got = handmade_verdicts["group_gap"]
    fault = got.faults[0]
    gap = handmade.GAP_END - handmade.GAP_START
    assert fault.write_unavailable_ms["broker-a"] == pytest.approx(gap, abs=50)
    assert fault.write_unavailable_ms["broker-b"] == 0
    assert fault.read_unavailable_ms["broker-a"] == pytest.approx(gap, abs=50)
    assert fault.read_unavailable_ms["broker-b"] == 0
    assert fault.cluster_write_unavailable_ms is not None
    assert fault.cluster_write_unavailable_ms <= 2 * handmade.SEND_EVERY
    assert fault.unattributed_write_failures == 1
    assert got.faults == expected.faults == handmade.GAP_FAULTS
    assert got.availability == expected.availability
    assert got.mismatches(expected) == []
