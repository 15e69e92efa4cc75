"""Campaigns with real clusters and real faults (generated schedules).

The default-suite campaign is small: one fault of every process, network and disk
family this machine can fault (the loopback families; partition and loss too when
network namespaces are permitted; disk-full when tmpfs can be mounted), with short
faults and gaps, in one drill (campaigns of several drills: test_campaign_interrupt.py
and the synthetic campaigns of tests/pipeline/test_campaign_spark.py).  The durability
families (power loss, corruption, clock) are checked there by their tools
(``test_fault_tools.py``: a real power loss under the broker's store, real store
damage, a real clock step) and here by a ``slow`` campaign of their own; the ``slow``
campaign of every family runs them all with the default timings.  Each checks
campaign.json's shape and that every family got its faults; the slow ones also what
the cluster promises.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ha_controller.cli import main as hactl
from ha_controller.drills.campaign import CampaignOptions, run_campaign
from ha_controller.drills.checker import FAILING_COUNTS
from ha_controller.drills.generator import (
    CONTROLLER_FAMILIES,
    DEFAULT_FAMILIES,
    FAMILIES,
    NETNS_FAMILIES,
    GeneratorSpec,
)
from ha_controller.drills.needs import unavailable_families
from ha_controller.drills.netns import netns_available

#: the durability families (module docstring)
DURABILITY = ("power-loss", "corruption", "clock")
#: families whose faults the cluster must survive with a clean verdict in the default
#: suite (the loopback ones; see the module docstring for the netns ones)
LOOPBACK = tuple(f for f in DEFAULT_FAMILIES if f not in NETNS_FAMILIES and f not in DURABILITY)
QUICK = GeneratorSpec(fault_s=(1.5, 2.5), gap_s=(0.5, 1.0), overlap_ratio=0.6)


def families_here() -> tuple[str, ...]:
    if netns_available() is None:
        return tuple(f for f in DEFAULT_FAMILIES if f not in DURABILITY)
    return LOOPBACK


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
            faults=1,
            families=families,
            seed=11,
            out=tmp_path,
            netns=netns_available() is None,
            faults_per_drill=len(families),
            rate=20.0,
            drain_timeout_s=20.0,
            generator=QUICK,
            quiet=True,
        )
    )
    doc = json.loads((tmp_path / "campaign.json").read_text(encoding="utf-8"))
    assert doc == result.document
    assert_shape(doc, families, 1)
    assert len(doc["drills"]) == 1
    for drill in doc["drills"]:
        for name in ("history.jsonl", "verdict.json", "report.html", "schedule.json"):
            assert (tmp_path / drill["drill"] / name).is_file()
    assert (tmp_path / "campaign.html").read_text(encoding="utf-8").count("<svg") == 1
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
    assert_shape(doc, DEFAULT_FAMILIES, 3)
    assert set(doc["skipped_families"]) == set(
        unavailable_families(DEFAULT_FAMILIES, netns=bool(netns))
    )
    assert exit_.value.code == (0 if doc["ok"] else 1)
    assert doc["ok"], describe(doc)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_durability_campaign_with_sync_flush(tmp_path: Path) -> None:
    """Power losses in every scope and store damage with ``--flush-mode sync``: nothing
    acknowledged is lost, nothing corrupt is delivered (what docs/failover.md promises;
    the redeliveries and offset rollbacks after a power loss of a whole group are an
    open finding, see docs/drills.md)."""
    families = ("power-loss", "corruption")
    missing = unavailable_families(families, netns=False)
    if missing:
        pytest.skip(f"{missing}")
    argv = ["drill", "campaign", "--faults", "3", "--families", ",".join(families)]
    argv += ["--flush-mode", "sync", "--seed", "34", "--out", str(tmp_path)]
    with pytest.raises(SystemExit):
        hactl(argv)
    doc = json.loads((tmp_path / "campaign.json").read_text(encoding="utf-8"))
    assert_shape(doc, families, 3)
    assert (doc["flush_mode"], doc["families_asked"], doc["skipped_families"]) == (
        "sync",
        True,
        {},
    )
    for family in families:
        entry = doc["families"][family]
        assert (entry["lost"], entry["corrupt_deliveries"], entry["errors"]) == (0, 0, 0), doc


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_controller_campaign(tmp_path: Path) -> None:
    """Three faults of every controller family (controller-isolate with namespaces):
    no acknowledged write lost, never two masters of one group at once, never two
    switches of one group within min_switch_interval_ms, no offset rollback.  (The
    redeliveries after a switch are an open finding, see docs/drills.md.)"""
    netns = netns_available() is None
    families = tuple(sorted(f for f in CONTROLLER_FAMILIES if netns or f not in NETNS_FAMILIES))
    missing = unavailable_families(families, netns=netns)
    if missing:
        pytest.skip(f"{missing}")
    argv = ["drill", "campaign", "--faults", "3", "--families", ",".join(families)]
    argv += ["--seed", "33", "--out", str(tmp_path), *(["--netns"] if netns else [])]
    with pytest.raises(SystemExit):
        hactl(argv)
    doc = json.loads((tmp_path / "campaign.json").read_text(encoding="utf-8"))
    assert_shape(doc, tuple(f for f in FAMILIES if f in families), 3)
    for family in families:
        entry = doc["families"][family]
        counts = tuple(entry[k] for k in ("lost", "split_brain", "fast_switches", "errors"))
        assert counts == (0, 0, 0, 0), (family, describe(doc))
        assert entry["offset_rollbacks"] == 0, (family, describe(doc))


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
