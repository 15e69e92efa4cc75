"""Where the Spark verdict's time goes: wall, JVM CPU and jobs per round.

    nice -n 19 .venv/bin/python bench/verdict_phases.py /tmp/hac-scale-2m/history.jsonl \\
        --repeat 2 --conf spark.sql.shuffle.partitions=4

Builds the session the way ``bench/analyze_scale.py`` does (local[*], driver 4 GiB),
then runs ``compute_verdict`` ``--repeat`` times in the same JVM (the first run is cold,
the next ones warm) and prints, per run, one JSON line with each phase: ``plan`` (building
the DataFrames up to a round's collect, analysis included) and ``round1``..``round3``
(the three collects of :func:`ha_controller.pipeline.verdict.verdicts_of`), each with
its wall time, the CPU time the JVM used (``/proc/<pid>/stat``; JIT and GC threads
included), and the Spark jobs and stages it ran (status tracker).  ``--conf`` sets a
Spark property at session start; ``--java-options`` the driver JVM's options.
Opt-in: not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("history", type=Path)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--java-options", default=None)
    p.add_argument("--local-dir", type=Path, default=Path("/tmp/hac-verdict-phases"))
    args = p.parse_args(argv)

    from ha_controller.pipeline import verdict
    from ha_controller.pipeline.session import build_session

    config = {"spark.driver.memory": "4g"}
    config.update(c.split("=", 1) for c in args.conf)
    if args.java_options:
        config["spark.driver.extraJavaOptions"] = args.java_options
    t0 = time.perf_counter()
    spark = build_session(
        "local[*]", app_name="hac-verdict-phases", config=config, local_dir=args.local_dir
    )
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.perf_counter() - t0
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    jvm_pid = sc._gateway.proc.pid  # type: ignore[union-attr]  # the spark-submit JVM

    def jvm_cpu() -> float:
        fields = Path(f"/proc/{jvm_pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    print(json.dumps({"session_s": round(session_s, 1), "jvm_cpu_s": jvm_cpu()}), flush=True)
    phases: list[dict[str, Any]] = []
    mark: dict[str, Any] = {}

    def close_phase(name: str) -> None:
        jobs = set(tracker.getJobIdsForGroup(None))
        new = jobs - mark["jobs"]
        infos = [tracker.getJobInfo(j) for j in new]
        phases.append(
            {
                "phase": name,
                "wall_s": round(time.perf_counter() - mark["t"], 2),
                "jvm_cpu_s": round(jvm_cpu() - mark["cpu"], 2),
                "jobs": len(new),
                "stages": sum(len(i.stageIds) for i in infos if i is not None),
            }
        )
        mark.update(t=time.perf_counter(), cpu=jvm_cpu(), jobs=jobs)

    collect: Callable[..., Any] = verdict._collect

    def timed_collect(*a: Any, **kw: Any) -> Any:
        close_phase("plan")
        rows = collect(*a, **kw)
        close_phase(f"round{sum(1 for ph in phases if ph['phase'].startswith('round')) + 1}")
        return rows

    verdict._collect = timed_collect  # type: ignore[assignment]
    for run in range(args.repeat):
        phases.clear()
        mark.update(t=time.perf_counter(), cpu=jvm_cpu(), jobs=set(tracker.getJobIdsForGroup(None)))
        t, cpu = time.perf_counter(), jvm_cpu()
        v = verdict.compute_verdict(spark, args.history, scenario="scale")
        close_phase("rest")
        total = {
            "wall_s": round(time.perf_counter() - t, 2),
            "jvm_cpu_s": round(jvm_cpu() - cpu, 2),
            "jobs": sum(ph["jobs"] for ph in phases),
            "stages": sum(ph["stages"] for ph in phases),
        }
        print(
            json.dumps(
                {
                    "run": run,
                    "total": total,
                    "phases": phases,
                    "ok": v.ok,
                    "load": [round(x, 2) for x in os.getloadavg()],
                }
            ),
            flush=True,
        )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
