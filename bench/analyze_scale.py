"""Scale benchmark: the Spark verdict over a synthetic history of N operations.

    .venv/bin/python bench/analyze_scale.py --operations 10000000 --out /tmp/hac-scale

Generates ``history.jsonl`` (about N lines, anomalies injected at known counts; reused
when it already exists with the same size and seed) and its Parquet copy the way a
drill's history writer does (``write_columnar``; timed as ``columnar_s`` when written),
then times ``ha_controller.pipeline.verdict.compute_verdict`` on it and checks the counts
against the generator's.  ``--format jsonl`` makes Spark read the JSON lines instead (the
copy is moved aside for the run).  ``--in-process`` also times the pure-Python checker
(which reads the JSON lines) and prints ``spark_vs_in_process``: the in-process time over
Spark's (above 1.0: Spark is faster).  ``end_to_end_s`` is session start plus verdict.
Opt-in: not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gen_history import Anomalies, Expected, write_history

from ha_controller.drills.checker import check
from ha_controller.drills.history import columnar_copy, write_columnar

ANOMALIES = Anomalies(
    lost=100,
    duplicated=100,
    unexpected=50,
    recovered=50,
    order=100,
    late=100,
    unresolved=20,
    double_locks=10,
    rollbacks=10,
    split_brain=20,
    fast_switches=5,
    faults=8,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--operations", type=int, default=10_000_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("/tmp/hac-scale"))
    p.add_argument("--master", default="local[*]")
    p.add_argument("--driver-memory", default="4g")
    p.add_argument("--in-process", action="store_true", help="also time the Python checker")
    p.add_argument(
        "--format",
        choices=("parquet", "jsonl"),
        default="parquet",
        help="what Spark reads: the Parquet copy (default) or the JSON lines",
    )
    args = p.parse_args(argv)

    history = args.out / "history.jsonl"
    meta = args.out / "expected.json"
    key = {"operations": args.operations, "seed": args.seed}
    result: dict[str, object] = {"operations": args.operations, "master": args.master}
    if history.exists() and meta.exists() and json.loads(meta.read_text())["key"] == key:
        expected = json.loads(meta.read_text())["counts"]
        lines = json.loads(meta.read_text())["lines"]
    else:
        t0 = time.perf_counter()
        exp: Expected = write_history(history, args.operations, ANOMALIES, seed=args.seed)
        result["generate_s"] = round(time.perf_counter() - t0, 1)
        expected, lines = exp.counts(), exp.lines
        meta.write_text(json.dumps({"key": key, "counts": expected, "lines": lines}))
    if columnar_copy(history) is None:
        t0 = time.perf_counter()
        write_columnar(history)
        result["columnar_s"] = round(time.perf_counter() - t0, 1)
    parquet = history.with_suffix(".parquet")
    result["lines"] = lines
    result["bytes"] = history.stat().st_size
    result["parquet_bytes"] = parquet.stat().st_size if parquet.exists() else None
    result["format"] = args.format
    aside = parquet.with_name(parquet.name + ".aside")
    if args.format == "jsonl" and parquet.exists():
        parquet.rename(aside)

    from ha_controller.pipeline.session import build_session
    from ha_controller.pipeline.verdict import compute_verdict

    t0 = time.perf_counter()
    spark = build_session(
        args.master,
        app_name="hac-analyze-scale",
        config={"spark.driver.memory": args.driver_memory},
        local_dir=args.out / "spark",
    )
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.perf_counter() - t0
    result["session_s"] = round(session_s, 1)
    t0 = time.perf_counter()
    try:
        verdict = compute_verdict(spark, history, scenario="scale")
    finally:
        if aside.exists():
            aside.rename(parquet)
    spark_s = time.perf_counter() - t0
    result["spark_verdict_s"] = round(spark_s, 1)
    result["end_to_end_s"] = round(session_s + spark_s, 1)
    spark.stop()
    result["counts_match"] = dict(verdict.counts) == expected
    result["verdict"] = verdict.to_dict()
    if args.in_process:
        t0 = time.perf_counter()
        local = check(history, scenario="scale")
        local_s = time.perf_counter() - t0
        result["in_process_s"] = round(local_s, 1)
        result["in_process_equal"] = local.to_json() == verdict.to_json()
        result["spark_vs_in_process"] = round(local_s / spark_s, 2)
    result["load"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))
    return 0 if result["counts_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
