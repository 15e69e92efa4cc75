"""Campaign planning and attribution without processes: quotas, families of faults,
the per-family summary, campaign.json's shape and campaign.html."""

from __future__ import annotations

from pathlib import Path

import pytest

from ha_controller.drills.campaign import (
    DrillOutcome,
    align_families,
    campaign_document,
    drill_quota,
    family_summary,
    fault_families,
    render_campaign,
    table_lines,
    unavailable_families,
)
from ha_controller.drills.checker import COUNT_NAMES, FAILING_COUNTS, FaultWindow, Verdict
from ha_controller.drills.generator import FAMILIES
from ha_controller.drills.history import Event, Fault, SendInvoke, SendOk
from ha_controller.drills.needs import NEEDS_NETNS
from ha_controller.drills.report import timeline_strip
from ha_controller.testing.etcd import etcd_missing

WINDOW = {"p50", "p99", "max", "unrecovered"}


def fw(start: int, kind: str, target: str, write: int | None, read: int = 0) -> FaultWindow:
    group = target.rpartition("/")[0] or "broker-a"
    return FaultWindow(kind, target, start, start + 1000, 0, 0, {group: write}, {group: read})


def verdict(faults: tuple[FaultWindow, ...], **nonzero: int) -> Verdict:
    counts = dict.fromkeys(COUNT_NAMES, 0)
    counts.update(nonzero)
    return Verdict("generated", counts, faults)


def test_drill_quota_round_robin_and_rotation() -> None:
    remaining = dict.fromkeys(FAMILIES, 10)
    assert drill_quota(remaining, len(FAMILIES)) == dict.fromkeys(FAMILIES, 1)
    assert drill_quota(remaining, 3, rotate=2) == dict.fromkeys(FAMILIES[2:5], 1)
    assert drill_quota({"kill": 5, "slave": 1}, 4) == {"kill": 3, "slave": 1}
    assert drill_quota({"kill": 1, "slave": 1}, 8) == {"kill": 1, "slave": 1}
    assert drill_quota({"kill": 0}, 8) == {}


def test_families_follow_the_history_and_align_with_the_verdict() -> None:
    events = [
        Event.of(100, "nemesis", "info", Fault("kill", "broker-a/0", family="kill")),
        Event.of(100, "nemesis", "info", Fault("pause", "nameserver", family="nameserver")),
        Event.of(900, "nemesis", "ok", Fault("kill", "broker-a/0", family="kill")),
        Event.of(950, "nemesis", "fail", Fault("disk", "broker-b/0", "no tmpfs", "disk-full")),
        Event.of(1000, "nemesis", "info", Fault("pause", "broker-b/0")),  # no family
    ]
    families = fault_families(events)
    assert families == {
        (100, "kill", "broker-a/0"): ["kill"],
        (100, "pause", "nameserver"): ["nameserver"],
        (1000, "pause", "broker-b/0"): [None],
    }
    faults = (
        fw(100, "kill", "broker-a/0", 5),
        fw(100, "pause", "nameserver", 0),
        fw(1000, "pause", "broker-b/0", 7),
        fw(2000, "kill", "broker-a/0", 1),  # not in the history at all
    )
    assert align_families(faults, families) == ("kill", "nameserver", None, None)


def outcomes() -> list[DrillOutcome]:
    one = DrillOutcome(
        "drill-000",
        1000,
        verdict(
            (fw(0, "kill", "broker-a/0", 4000), fw(10, "pause", "broker-b/0", 800)),
            lost=2,
            duplicated=1,
        ),
        ("kill", "pause"),
    )
    two = DrillOutcome(
        "drill-001",
        1001,
        verdict((fw(0, "kill", "broker-b/0", None), fw(5, "kill", "broker-a/0", 6000))),
        ("kill", "kill"),
    )
    three = DrillOutcome(
        "drill-002",
        1002,
        verdict((fw(0, "partition", "broker-a/0", 3000),), late_delayed=4),
        ("partition",),
        error="RuntimeError: broker-a/0 not ready within 30 s",
    )
    return [one, two, three]


def test_a_drill_counts_for_every_family_it_holds() -> None:
    summary = family_summary(outcomes(), ("kill", "pause", "partition", "slave"))
    kill, pause, partition, slave = (summary[f] for f in ("kill", "pause", "partition", "slave"))
    assert (kill["faults"], kill["drills"]) == (3, 2)
    assert (pause["faults"], pause["drills"]) == (1, 1)
    # drill-000's lost/duplicated count for both kill and pause
    assert (kill["lost"], kill["duplicated"]) == (2, 1)
    assert (pause["lost"], pause["duplicated"]) == (2, 1)
    assert partition["late_delayed"] == 4 and kill["late_delayed"] == 0
    assert (partition["errors"], kill["errors"]) == (1, 0)
    # windows over the family's faults: each fault's worst window
    assert kill["write_unavailable_ms"] == {"p50": 4000, "p99": 6000, "max": 6000, "unrecovered": 1}
    assert pause["write_unavailable_ms"] == {"p50": 800, "p99": 800, "max": 800, "unrecovered": 0}
    assert kill["read_unavailable_ms"] == {"p50": 0, "p99": 0, "max": 0, "unrecovered": 0}
    assert slave["faults"] == slave["drills"] == 0
    assert slave["write_unavailable_ms"] == {
        "p50": None,
        "p99": None,
        "max": None,
        "unrecovered": 0,
    }


def test_campaign_document_shape_ok_and_failing_seeds() -> None:
    doc = campaign_document(
        outcomes(),
        families=("kill", "pause", "partition", "loss"),
        faults_per_family=1,
        seed=1,
        skipped={"loss": "needs --netns"},
    )
    assert {"ok", "families", "failing_seeds"} <= set(doc)
    assert set(doc["families"]) == {"kill", "pause", "partition", "loss"}
    for entry in doc["families"].values():
        assert {"faults", "drills", *FAILING_COUNTS} <= set(entry)
        assert set(entry["write_unavailable_ms"]) == set(entry["read_unavailable_ms"]) == WINDOW
    assert doc["failing_seeds"] == [1000, 1002]
    assert doc["complete"] is True  # loss was skipped; the others got their one fault
    assert doc["ok"] is False
    assert [d["drill"] for d in doc["drills"]] == ["drill-000", "drill-001", "drill-002"]
    assert doc["drills"][0]["failing_counts"] == {"lost": 2, "duplicated": 1}

    clean = [o for o in outcomes() if o.seed == 1001]
    doc = campaign_document(clean, families=("kill",), faults_per_family=2, seed=1, skipped={})
    assert (doc["ok"], doc["complete"], doc["failing_seeds"]) == (True, True, [])
    doc = campaign_document(clean, families=("kill",), faults_per_family=3, seed=1, skipped={})
    assert (doc["ok"], doc["complete"]) == (False, False)


def test_a_family_asked_for_and_skipped_is_never_clean() -> None:
    """``--families kill,partition``: a partition that could not be injected (a drill
    had to skip it) leaves the campaign incomplete; with the default families the
    skipped one is only listed."""
    clean = [o for o in outcomes() if o.seed == 1001]
    skipped = {"partition": "no one-way partition here"}
    for asked, ok in ((True, False), (False, True)):
        doc = campaign_document(
            clean,
            families=("kill", "partition"),
            faults_per_family=1,
            seed=1,
            skipped=skipped,
            asked=asked,
        )
        assert (doc["ok"], doc["complete"], doc["families_asked"]) == (ok, ok, asked)
        assert doc["skipped_families"] == skipped


def test_unavailable_families_without_netns() -> None:
    skipped = unavailable_families(FAMILIES, netns=False)
    assert {"partition", "loss"} <= set(skipped)
    assert "corruption" not in skipped  # needs nothing
    assert "needs --netns" in skipped["partition"]
    assert not {"kill", "pause", "pause-past-expiry", "slave", "nameserver"} & set(skipped)


def test_table_and_page(tmp_path: Path) -> None:
    doc = campaign_document(
        outcomes(), families=("kill", "pause"), faults_per_family=1, seed=1, skipped={}
    )
    lines = table_lines(doc)
    assert lines[0].split()[:3] == ["family", "faults", "drills"]
    assert lines[1].split()[:3] == ["kill", "3", "2"]
    events = [
        Event.of(0, "p", "invoke", SendInvoke("k0", "T")),
        Event.of(5, "p", "ok", SendOk("k0", "id", "broker-a", 0, 0)),
        Event.of(100, "nemesis", "info", Fault("kill", "broker-a/0", family="kill")),
        Event.of(3000, "nemesis", "ok", Fault("kill", "broker-a/0", family="kill")),
    ]
    strip = timeline_strip(events, width=600)
    assert strip.startswith("<svg") and "broker-a/0" in strip and "kill: kill" in strip
    (tmp_path / "drill-000").mkdir()
    (tmp_path / "drill-000" / "strip.svg").write_text(strip)
    page = render_campaign(tmp_path, doc)
    assert "campaign: <span>FAILED</span>" in page
    assert page.count("<svg") == 1  # drill-000's strip; the others have none on disk
    assert "drill-002" in page and "RuntimeError" in page


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_has_a_colour(family: str) -> None:
    from ha_controller.drills.report import FAMILY_COLOURS

    assert family in FAMILY_COLOURS


def test_controller_families_refuse_without_etcd_or_netns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ha_controller.drills.generator import CONTROLLER_FAMILIES
    from ha_controller.drills.needs import refusal

    said = refusal(["controller-isolate", "controller-kill"], netns=False)
    if etcd_missing() is None:  # etcd is here: only the namespaces are missing
        assert said == "controller-isolate cannot be injected here: " + NEEDS_NETNS
    monkeypatch.setenv("HAC_ETCD_BINARY", "/nonexistent/etcd")
    said = refusal(sorted(CONTROLLER_FAMILIES), netns=False)
    assert said is not None and "\n" not in said
    assert "controller-kill cannot be injected here: needs etcd: HAC_ETCD_BINARY" in said
    assert "controller-isolate cannot be injected here" in said
    skipped = unavailable_families(FAMILIES, netns=False)
    assert set(skipped) >= CONTROLLER_FAMILIES and "kill" not in skipped


def test_a_missing_fault_tool_refuses_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from ha_controller.drills.clock import clock_available
    from ha_controller.drills.lazyfs import lazyfs_available
    from ha_controller.drills.needs import refusal

    monkeypatch.setenv("HAC_LAZYFS", "/nonexistent/hac-lazyfs")
    monkeypatch.setenv("HAC_CLOCK_SHIM", "/nonexistent/libhac-clock.so")
    for probe in (lazyfs_available, clock_available):
        probe.cache_clear()
    try:
        said = refusal(["kill", "power-loss", "clock", "corruption"], netns=False)
    finally:
        for probe in (lazyfs_available, clock_available):
            probe.cache_clear()
    assert said is not None and "\n" not in said
    assert "power-loss cannot be injected here" in said
    assert "clock cannot be injected here: needs libhac-clock.so" in said
    assert "make tools" in said and "kill" not in said and "corruption" not in said
