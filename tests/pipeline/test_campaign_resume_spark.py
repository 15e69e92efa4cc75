"""``hactl analyze`` on a resumed campaign equals its campaign.json: the drills loaded
on resume are judged, the one moved aside to ``interrupted/`` is not.

Synthetic drills (no cluster), written by ``tests/campaign_helpers.py``."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from campaign_helpers import write_campaign, write_drill

from ha_controller.cli.drill import scenario_options
from ha_controller.drills.campaign import (
    CAMPAIGN_FILE,
    recorded_options,
    resumed_options,
    run_campaign,
)
from ha_controller.pipeline.campaign import analyze_campaign

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.mark.slow  # test_campaign_interrupt.py resumes a campaign
def test_a_resumed_campaign_on_spark_equals_campaign_json(
    spark: SparkSession, tmp_path: Path
) -> None:
    recorded = write_campaign(tmp_path, 3)
    # killed in drill-003: its files are complete, but campaign.json does not list it
    write_drill(tmp_path / "drill-003", 99)
    # a budget of the three drills done: the resume runs nothing, it only takes stock
    options = resumed_options(recorded_options(tmp_path), {"max_drills": 3})
    asyncio.run(run_campaign(replace(options, quiet=True)))
    resumed = json.loads((tmp_path / CAMPAIGN_FILE).read_text(encoding="utf-8"))
    assert resumed["runs"] == 2
    assert [d["drill"] for d in resumed["interrupted"]] == ["drill-003"]
    assert resumed["families"] == recorded["families"]
    assert resumed["drills"] == recorded["drills"]

    result = analyze_campaign(spark, tmp_path, options_for=scenario_options)
    assert result.mismatches == []
    assert sorted(result.verdicts) == ["drill-000", "drill-001", "drill-002"]
    assert result.document["families"] == resumed["families"]
    assert (result.document["ok"], result.document["complete"]) == (
        resumed["ok"],
        resumed["complete"],
    )
