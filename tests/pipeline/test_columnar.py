"""The Parquet copy of a history: written on close, read by Spark only while current,
and judged exactly like the JSON lines."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ha_controller.drills.checker import check, no_writable_master_spans
from ha_controller.drills.history import (
    EndTx,
    Event,
    Fault,
    HistoryWriter,
    Receive,
    SendInvoke,
    SendOk,
    SendOutcome,
    Subscribe,
    columnar_copy,
    write_columnar,
)
from ha_controller.pipeline.verdict import compute_verdict, compute_verdicts, read_events

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T0 = 1_700_000_000_000


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


def _random_history(path: Path, seed: int) -> None:
    """Sends, polls and faults on three groups at random, dense enough that failures and
    successes of every scope straddle the fault epochs: some sends unanswered or failing
    without a broker, faults on masters that overlap (spans without a writable master),
    two faults starting at once, one never healed; delayed keys delivered late or not."""
    rng = random.Random(seed)
    groups = ("broker-a", "broker-b", "broker-c")
    with HistoryWriter(path) as h:
        h.record("c", "info", Subscribe("c", "G", "T"), t_ms=T0)
        for i in range(300):
            t = T0 + 10 * i
            key = f"k{i}"
            broker = rng.choice(groups)
            delayed = rng.random() < 0.2
            h.record(
                "p",
                "invoke",
                SendInvoke(key, "T", delay_ms=2_000 if delayed else None),
                t_ms=t,
            )
            outcome = rng.random()
            done = t + rng.randrange(1, 400)
            if outcome < 0.6:
                h.record("p", "ok", SendOk(key, f"m{i}", broker, 0, i), t_ms=done)
                due = t + (2_000 if delayed else 0)
                h.record(
                    "c",
                    "ok",
                    Receive(key, f"m{i}", broker, 0, i, "c", "G"),
                    t_ms=due + rng.randrange(0, 2_500),
                )
            elif outcome < 0.85:
                named = broker if rng.random() < 0.5 else None
                h.record("p", rng.choice(("fail", "info")), SendOutcome(key, "x", named), t_ms=done)
            # else: never answered
            if rng.random() < 0.3:
                polled = rng.choice((*groups, None))
                h.write(
                    Event(
                        t + rng.randrange(0, 50),
                        "c",
                        rng.choice(("fail", "info")),
                        "receive",
                        {"error": "timeout"} if polled is None else {"broker": polled},
                    )
                )
        for n in range(6):
            start = T0 + rng.randrange(0, 2_000)
            target = f"{groups[n % 3]}/{rng.choice((0, 0, 0, 1))}"
            kind = rng.choice(("kill", "pause", "partition", "netem"))
            h.record("nemesis", "info", Fault(kind, target), t_ms=start)
            if n == 0:
                h.record("nemesis", "info", Fault("partition", "nameserver"), t_ms=start)
            if n != 5:
                h.record(
                    "nemesis", "ok", Fault(kind, target), t_ms=start + rng.randrange(500, 2_500)
                )


@pytest.mark.slow  # the handmade and generated parity cases cover the windows
def test_random_windows_equal_in_one_pass(spark: SparkSession, tmp_path: Path) -> None:
    """Many histories judged in the same jobs: every fault window, count and summary as
    the checker's (the windows are put together from small rows on the driver)."""
    paths = {f"r{seed}": tmp_path / f"r{seed}" / "history.jsonl" for seed in range(8)}
    for seed, path in enumerate(paths.values()):
        _random_history(path, seed)
    got = compute_verdicts(spark, paths)
    expected = {name: check(path, scenario=name) for name, path in paths.items()}
    for name in paths:
        assert got[name].mismatches(expected[name]) == [], name
        assert got[name].to_json() == expected[name].to_json(), name
    faults = [f for v in expected.values() for f in v.faults]
    assert any(f.recovery_ms is None or f.recovery_ms > 0 for f in faults)
    assert any(w for f in faults for w in f.write_unavailable_ms.values())
    assert any(no_writable_master_spans(v.faults) for v in expected.values())
