"""Campaigns with real clusters and real faults (generated schedules).

The default-suite campaign is small: two faults of every family this machine can fault
(the loopback families; partition and loss too when network namespaces are permitted;
disk-full when tmpfs can be mounted), with short faults and gaps, in two drills.  The
``slow`` one runs every family with the default timings.  Both check campaign.json's
shape and that every family got its faults; the slow one also that the campaign is ok
(the small one, with faults overlapping on both groups, still finds redeliveries).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ha_controller.cli import main as hactl
from ha_controller.drills.campaign import CampaignOptions, run_campaign
from ha_controller.drills.checker import FAILING_COUNTS
from ha_controller.drills.generator import FAMILIES, NETNS_FAMILIES, GeneratorSpec
from ha_controller.drills.netns import netns_available

#: families whose faults the cluster must survive with a clean verdict in the default
#: suite (the loopback ones; see the module docstring for the netns ones)
LOOPBACK = tuple(f for f in FAMILIES if f not in NETNS_FAMILIES)
QUICK = GeneratorSpec(fault_s=(1.5, 2.5), gap_s=(0.5, 1.0), overlap_ratio=0.6)


def families_here() -> tuple[str, ...]:
    return FAMILIES if netns_available() is None else LOOPBACK


def assert_shape(doc: dict[str, Any], families: tuple[str, ...], per_family: int) -> None:
    assert {"ok", "families", "failing_seeds", "drills", "skipped_families"} <= set(doc)
    assert list(doc["families"]) == list(families)
    for family, entry in doc["families"].items():
        assert {"faults", "drills", *FAILING_COUNTS} <= set(entry)
        for kind in ("write_unavailable_ms", "read_unavailable_ms"):
            assert {"p50", "p99", "max"} <= set(entry[kind])
        if family not in doc["skipped_families"]:
            assert entry["faults"] >= per_family, (family, entry)
            assert entry["drills"] >= 1
            assert entry["write_unavailable_ms"]["max"] is not None


def describe(doc: dict[str, Any]) -> str:
    bad = {d["drill"]: d["failing_counts"] or d["error"] for d in doc["drills"] if not d["ok"]}
    return json.dumps({"failing": bad, "skipped": doc["skipped_families"]}, indent=1)


@pytest.mark.timeout(300)
async def test_small_campaign(tmp_path: Path) -> None:
    families = families_here()
    result = await run_campaign(
        CampaignOptions(
            faults=2,
            families=families,
            seed=11,
            out=tmp_path,
            netns=netns_available() is None,
            faults_per_drill=len(families) + 2,
            rate=20.0,
            drain_timeout_s=20.0,
            generator=QUICK,
            quiet=True,
        )
    )
    doc = json.loads((tmp_path / "campaign.json").read_text(encoding="utf-8"))
    assert doc == result.document
    assert_shape(doc, families, 2)
    assert len(doc["drills"]) == 2
    for drill in doc["drills"]:
        for name in ("history.jsonl", "verdict.json", "report.html", "schedule.json"):
            assert (tmp_path / drill["drill"] / name).is_file()
    assert (tmp_path / "campaign.html").read_text(encoding="utf-8").count("<svg") == 2
    # Every drill was judged (a verdict per drill); whether the campaign is clean is
    # the slow test's assertion: with overlapping faults on both groups this seed
    # still finds POP and delayed redeliveries (an open finding, see docs/drills.md).
    for drill in doc["drills"]:
        verdict = json.loads((tmp_path / drill["drill"] / "verdict.json").read_text())
        assert verdict["counts"]["acknowledged"] > 0, describe(doc)
        assert verdict["counts"]["lost"] == 0, describe(doc)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_campaign_command_every_family(tmp_path: Path) -> None:
    """``hactl drill campaign`` itself: three faults of every family, default timings."""
    netns = ["--netns"] if netns_available() is None else []
    with pytest.raises(SystemExit) as exit_:
        hactl(["drill", "campaign", "--faults", "3", "--seed", "5", "--out", str(tmp_path), *netns])
    doc = json.loads((tmp_path / "campaign.json").read_text(encoding="utf-8"))
    assert_shape(doc, FAMILIES, 3)
    if not netns:
        assert set(doc["skipped_families"]) == set(NETNS_FAMILIES)
    assert exit_.value.code == (0 if doc["ok"] else 1)
    assert doc["ok"], describe(doc)


def test_campaign_command_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "campaign")
    for argv, message in (
        (["drill", "campaign"], "--faults N is required"),
        (["drill", "campaign", "--faults", "2", "--families", "kill,meteor"], "unknown fault"),
        # asked for, but partitions need --netns: refused, never a clean campaign
        (
            ["drill", "campaign", "--faults", "2", "--families", "kill,pause,partition"],
            "partition cannot be injected here: needs --netns",
        ),
        (
            ["drill", "generated", "--faults", "2", "--families", "kill,loss", "--out", out],
            "loss cannot be injected here: needs --netns",
        ),
    ):
        with pytest.raises(SystemExit) as exit_:
            hactl([*argv, "--out", out] if "--out" not in argv else argv)
        assert exit_.value.code == 2, argv
        err = capsys.readouterr().err
        assert message in err, (argv, err)
        assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "campaign" / "campaign.json").exists()
