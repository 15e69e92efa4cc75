"""Scale benchmark: the Spark verdict over a synthetic history of N operations.

    .venv/bin/python bench/analyze_scale.py --operations 10000000 --out /tmp/hac-scale

Generates ``history.jsonl`` (about N lines, anomalies injected at known counts; reused
when it already exists with the same size and seed), then times
``ha_controller.pipeline.verdict.compute_verdict`` on it and checks the counts against
the generator's.  ``--in-process`` also times the pure-Python checker.  Opt-in: not
part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gen_history import Anomalies, Expected, write_history

from ha_controller.drills.checker import check

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
    result["lines"] = lines
    result["bytes"] = history.stat().st_size

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
    result["session_s"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    verdict = compute_verdict(spark, history, scenario="scale")
    result["spark_verdict_s"] = round(time.perf_counter() - t0, 1)
    spark.stop()
    result["counts_match"] = dict(verdict.counts) == expected
    result["verdict"] = verdict.to_dict()
    if args.in_process:
        t0 = time.perf_counter()
        local = check(history, scenario="scale")
        result["in_process_s"] = round(time.perf_counter() - t0, 1)
        result["in_process_equal"] = local.to_json() == verdict.to_json()
    print(json.dumps(result, indent=2))
    return 0 if result["counts_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
