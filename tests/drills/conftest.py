"""Drill tests: real clusters with real faults, short durations.

``run`` runs one drill (quiet) into a fresh directory and, when pyspark and a JDK are
available, checks that the Spark pipeline's verdict counts equal the in-process ones on
the same history.  Network-namespace drills skip with the reason when ``ip netns add``
is not permitted here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drill_helpers import DrillRunner

from ha_controller.drills.netns import netns_available
from ha_controller.drills.runner import SCENARIOS, DrillOptions, DrillResult, run_drill
from ha_controller.testing import local_spark, spark_missing

#: Short drills: enough traffic and one or two faults each.
SHORT: dict[str, Any] = {
    "rate": 60.0,
    "fault_s": 4.0,
    "gap_s": 3.0,
    "drain_timeout_s": 20.0,
    "quiet": True,
}


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One local[2] session for the drill histories, or None without pyspark/Java."""
    if spark_missing() is not None:
        yield None
        return
    with local_spark(
        tmp_path_factory.mktemp("spark-drills"), "ha-controller-drill-tests"
    ) as session:
        yield session


@pytest.fixture
def needs_netns() -> None:
    reason = netns_available()
    if reason is not None:
        pytest.skip(f"network-namespace drill: {reason}")


@pytest.fixture
def run(tmp_path: Path, spark: Any) -> DrillRunner:
    async def go(scenario: str, **overrides: Any) -> DrillResult:
        options = DrillOptions(scenario=scenario, out=tmp_path / scenario, **{**SHORT, **overrides})
        result = await run_drill(options)
        assert (result.out / "verdict.json").is_file()
        assert (result.out / "report.html").is_file()
        if spark is not None:
            from ha_controller.pipeline.verdict import compute_verdict

            spark_verdict = compute_verdict(
                spark,
                result.out / "history.jsonl",
                scenario=scenario,
                options=SCENARIOS[scenario].check,  # as the drill judged it
            )
            assert spark_verdict.to_dict() == result.verdict.to_dict()
        return result

    return go
