"""The Parquet copy of a history: written on close, read by Spark only while current,
and judged exactly like the JSON lines."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

from ha_controller.drills.checker import check
from ha_controller.drills.history import (
    EndTx,
    HistoryWriter,
    Receive,
    SendInvoke,
    SendOk,
    Subscribe,
    columnar_copy,
    write_columnar,
)
from ha_controller.pipeline import verdict
from ha_controller.pipeline.verdict import compute_verdict, compute_verdicts, read_events

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T0 = 1_700_000_000_000


def _handmade() -> ModuleType:
    """The checker's hand-made cases (tests/unit/test_checker.py), loaded once."""
    loaded = sys.modules.get("hac_handmade_cases")
    if loaded is not None:
        return loaded
    path = Path(__file__).resolve().parents[2] / "tests" / "unit" / "test_checker.py"
    spec = importlib.util.spec_from_file_location("hac_handmade_cases", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["hac_handmade_cases"] = module
    spec.loader.exec_module(module)
    return module


def _history(path: Path, *, columnar: bool = True) -> None:
    """Two plain keys (one delivered twice), one transaction rolled back with an unknown
    outcome (``end_tx`` info, ``commit: false``), one committed."""
    with HistoryWriter(path, columnar=columnar) as h:
        h.record("c", "info", Subscribe("c", "G", "T"), t_ms=T0)
        for i, key in enumerate(("a", "b", "tx-rb", "tx-ok")):
            t = T0 + 10 * i
            h.record("p", "invoke", SendInvoke(key, "T", tx=key.startswith("tx") or None), t_ms=t)
            h.record("p", "ok", SendOk(key, f"m{i}", "broker-a", 0, i), t_ms=t + 1)
        h.record("p", "info", EndTx("tx-rb", commit=False), t_ms=T0 + 50)
        h.record("p", "ok", EndTx("tx-ok", commit=True), t_ms=T0 + 51)
        for n, key in enumerate(("a", "a", "b", "tx-ok")):
            receipt = Receive(key, f"m{n}", "broker-a", 0, n, "c", "G")
            h.record("c", "ok", receipt, t_ms=T0 + 100 + n)


def test_writer_leaves_a_current_copy_and_spark_reads_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "history.jsonl"
    _history(path)
    copy = columnar_copy(path)
    assert copy == tmp_path / "history.parquet"
    assert all(f.endswith(".parquet") for f in read_events(spark, path).inputFiles())
    expected = check(path, scenario="s")
    got = compute_verdict(spark, path, scenario="s")
    assert got.to_json() == expected.to_json()
    # the rollback with an unknown outcome is a rollback, not an unresolved transaction
    assert got.counts["unresolved_transactions"] == 0
    assert got.counts["acknowledged"] == 3
    assert got.counts["duplicated"] == 1


def test_a_stale_copy_is_not_read(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    _history(path)
    with path.open("a", encoding="utf-8") as f:  # an event the copy does not have
        event = {
            "t_ms": T0 + 500,
            "process": "c",
            "type": "ok",
            "f": "receive",
            "value": {"key": "b", "consumer": "c", "consumer_group": "G", "broker": "broker-a"},
        }
        f.write(json.dumps(event) + "\n")
    assert columnar_copy(path) is None
    got = compute_verdict(spark, path, scenario="s")
    assert got.to_json() == check(path, scenario="s").to_json()
    assert got.counts["duplicated"] == 2


def test_jsonl_and_parquet_give_the_same_verdict(spark: SparkSession, tmp_path: Path) -> None:
    plain, columnar = tmp_path / "plain" / "history.jsonl", tmp_path / "col" / "history.jsonl"
    _history(plain, columnar=False)
    _history(columnar)
    assert columnar_copy(plain) is None and columnar_copy(columnar) is not None
    got = compute_verdicts(spark, {"plain": plain, "col": columnar})
    assert got["plain"].counts == got["col"].counts
    assert got["plain"].to_json().replace('"plain"', '"col"') == got["col"].to_json()


@pytest.mark.parametrize(
    "line",
    [
        '{"t_ms": "soon", "process": "p", "type": "ok", "f": "send"}',  # mistyped
        "{oops",  # not JSON
    ],
)
def test_no_copy_of_a_history_that_does_not_fit_the_schema(tmp_path: Path, line: str) -> None:
    path = tmp_path / "history.jsonl"
    _history(path)
    assert columnar_copy(path) is not None
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")
    assert write_columnar(path) is None
    assert not (tmp_path / "history.parquet").exists()  # the stale copy is gone too
    assert columnar_copy(path) is None


@pytest.mark.parametrize("case", ["fault_recovery", "group_gap"])
def test_windows_still_open_past_the_horizon_are_closed_by_a_full_search(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    handmade = _handmade()
    events = getattr(handmade, f"case_{case}")().events
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as writer:
        writer.write_all(events)
    monkeypatch.setattr(verdict, "CLOSE_HORIZON_MS", 1)  # every window outlives it
    got = compute_verdict(spark, path, scenario=case)
    expected = check(path, scenario=case)
    assert any(v for w in expected.faults for v in w.write_unavailable_ms.values())
    assert got.to_json() == expected.to_json()
