"""Resuming a campaign without processes: what campaign.json records, rebuilding the
options and refusing contradicting ones, loading finished drills from their files,
quotas after loading, and a resume over hand-made drill directories (nothing is left
to run, so no cluster starts): an unrecorded drill is moved aside, runs counts, the
elapsed time accumulates, the summary equals the one the drills were recorded with."""

from __future__ import annotations

import asyncio
import fcntl
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ha_controller.cli import main as hactl
from ha_controller.drills.campaign import (
    CAMPAIGN_FILE,
    CampaignError,
    CampaignOptions,
    CampaignResult,
    DrillOutcome,
    Progress,
    campaign_document,
    load_outcome,
    recorded_options,
    resumed_options,
    run_campaign,
)
from ha_controller.drills.checker import check
from ha_controller.drills.generator import GeneratorSpec
from ha_controller.drills.history import Event, Fault, Receive, SendInvoke, SendOk

QUICK = GeneratorSpec(fault_s=(1.5, 2.5), gap_s=(0.5, 1.0), overlap_ratio=0.0)


def write_drill(
    out: Path,
    index: int,
    faults: list[tuple[str, str, str]],
    *,
    skipped: dict[str, str] | None = None,
    lost: bool = False,
) -> DrillOutcome:
    """``out/drill-<index>`` with a history (a send, its delivery unless ``lost``, and
    ``faults`` as (kind, target, family)) and its verdict; returns the outcome as the
    campaign's ``_run_one`` builds it."""
    name = f"drill-{index:03d}"
    events = [
        Event.of(0, "producer-0", "invoke", SendInvoke("k0", "T")),
        Event.of(5, "producer-0", "ok", SendOk("k0", "id0", "broker-a", 0, 0)),
    ]
    if not lost:
        events.append(
            Event.of(9, "push-T", "ok", Receive("k0", "id0", "broker-a", 0, 0, "push-T", "G"))
        )
    for i, (kind, target, family) in enumerate(faults):
        start = 100 + 1000 * i
        events.append(Event.of(start, "nemesis", "info", Fault(kind, target, family=family)))
        events.append(Event.of(start + 500, "nemesis", "ok", Fault(kind, target, family=family)))
    for family, reason in (skipped or {}).items():
        events.append(Event.of(50, "nemesis", "fail", Fault("disk", "broker-b/0", reason, family)))
    drill = out / name
    drill.mkdir(parents=True)
    history = drill / "history.jsonl"
    history.write_text("".join(e.to_line() + "\n" for e in events), encoding="utf-8")
    verdict = check(history, scenario="generated")
    (drill / "verdict.json").write_text(verdict.to_json() + "\n", encoding="utf-8")
    families = tuple(f for _, _, f in faults)
    return DrillOutcome(name, 1000 + index, verdict, families)


def write_campaign(
    out: Path, options: CampaignOptions, outcomes: list[DrillOutcome]
) -> dict[str, Any]:
    doc = campaign_document(
        outcomes,
        families=options.families,
        faults_per_family=options.faults,
        seed=options.seed,
        skipped={},
        extra={"options": options.record(), "runs": 1, "elapsed_s": 100.0, "running": None},
    )
    (out / CAMPAIGN_FILE).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return doc


def options(out: Path, **kw: Any) -> CampaignOptions:
    base = CampaignOptions(
        faults=2,
        families=("kill", "slave"),
        seed=1,
        out=out,
        faults_per_drill=2,
        rate=20.0,
        drain_timeout_s=15.0,
        generator=QUICK,
        quiet=True,
    )
    return replace(base, **kw)


def test_options_are_recorded_and_rebuilt(tmp_path: Path) -> None:
    o = options(tmp_path, max_drills=9, netns=True, flush_mode="sync", families_asked=True)
    write_campaign(tmp_path, o, [])
    assert recorded_options(tmp_path) == replace(o, quiet=False)
    # a summary from before the options were recorded: what it says, defaults otherwise
    old = {"faults_per_family": 3, "seed": 4, "families": {"kill": {}, "pause": {}}}
    old |= {"netns": False, "faults_per_drill": 2}
    (tmp_path / CAMPAIGN_FILE).write_text(json.dumps(old))
    rebuilt = recorded_options(tmp_path)
    assert (rebuilt.faults, rebuilt.seed, rebuilt.families) == (3, 4, ("kill", "pause"))
    assert (rebuilt.faults_per_drill, rebuilt.rate, rebuilt.generator) == (2, 30.0, None)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "holds no campaign to resume"),
        ("{not json", "cannot read"),
        ("[1, 2]", "not a campaign summary"),
        ('{"options": {"faults": 2, "families": ["kill", "meteor"], "seed": 1}}', "meteor"),
        ('{"options": {"families": ["kill"], "seed": 1}}', "cannot rebuild"),
    ],
)
def test_unusable_records_are_refused(tmp_path: Path, content: str | None, message: str) -> None:
    if content is not None:
        (tmp_path / CAMPAIGN_FILE).write_text(content)
    with pytest.raises(CampaignError, match=message):
        recorded_options(tmp_path)


def test_contradicting_options_are_refused_naming_flag_and_values(tmp_path: Path) -> None:
    rec = options(tmp_path)
    for given, said in (
        ({"seed": 7}, "--seed 7 contradicts the campaign in {}, recorded with --seed 1"),
        ({"netns": True}, "--netns contradicts the campaign in {}, recorded with no --netns"),
        (
            {"families": ("kill",)},
            "--families kill contradicts the campaign in {}, recorded with --families kill,slave",
        ),
        ({"rate": 30.0}, "--rate 30.0 contradicts the campaign in {}, recorded with --rate 20.0"),
        ({"drain_timeout_s": 30.0}, "--drain-timeout 30.0 contradicts"),
        ({"faults_per_drill": 8}, "--faults-per-drill 8 contradicts"),
        ({"flush_mode": "sync"}, "--flush-mode sync contradicts the campaign in {}"),
        ({"faults": 1}, "--faults 1 is below the 2 faults per family"),
    ):
        with pytest.raises(CampaignError) as exc:
            resumed_options(rec, given)
        assert said.format(tmp_path) in str(exc.value)
    # equal values, the families in another order, more faults and another drill budget
    ok = resumed_options(
        rec,
        {"seed": 1, "rate": 20.0, "families": ("slave", "kill"), "faults": 5, "max_drills": 3},
    )
    assert ok == replace(rec, faults=5, max_drills=3, resume=True)


def test_load_outcome_equals_what_the_drill_recorded(tmp_path: Path) -> None:
    two = [("kill", "broker-a/0", "kill"), ("kill", "broker-b/1", "slave")]
    written = write_drill(tmp_path, 0, two, lost=True)
    entry = {"drill": "drill-000", "seed": 1000, "error": None}
    loaded = load_outcome(tmp_path / "drill-000", entry)
    assert loaded == written
    assert loaded.family_counts() == {"kill": 1, "slave": 1}
    assert loaded.verdict.counts["lost"] == 1 and not loaded.ok
    broken = load_outcome(tmp_path / "drill-000", entry | {"error": "RuntimeError: x"})
    assert broken.error == "RuntimeError: x"


def test_quotas_after_loading() -> None:
    progress = Progress.start(("kill", "slave", "disk-full"), 3, {})
    verdict = check([], scenario="generated")
    one = DrillOutcome("drill-000", 1000, verdict, ())
    kill2 = replace(one, families=("kill", "kill"), drill="drill-002")
    progress.add(kill2, {})
    # drill-000 skipped disk-full (and injected none): skipped from then on
    assert progress.add(one, {"disk-full": "no tmpfs"}) == ["disk-full"]
    assert [o.drill for o in progress.outcomes] == ["drill-000", "drill-002"]
    assert progress.remaining == {"kill": 1, "slave": 3}
    assert progress.skipped == {"disk-full": "no tmpfs"}
    assert progress.left == 4
    assert progress.next_index() == 1  # the gap first
    assert progress.quota(1, 3) == {"kill": 1, "slave": 2}


def test_resume_moves_an_unrecorded_drill_aside(tmp_path: Path) -> None:
    o = options(tmp_path)
    done = [
        write_drill(tmp_path, 0, [("kill", "broker-a/0", "kill"), ("kill", "broker-a/1", "slave")]),
        write_drill(tmp_path, 1, [("kill", "broker-b/0", "kill"), ("kill", "broker-b/2", "slave")]),
    ]
    recorded = write_campaign(tmp_path, o, done)
    # drill-002 had started when the campaign was killed; drill-001's entry is kept
    (tmp_path / "drill-002" / "logs").mkdir(parents=True)
    (tmp_path / "drill-002" / "history.jsonl").write_text("")
    result = run_campaign_quiet(replace(o, resume=True))
    doc = json.loads((tmp_path / CAMPAIGN_FILE).read_text())
    assert doc == result.document
    for key in ("ok", "complete", "families", "failing_seeds", "drills"):
        assert doc[key] == recorded[key], key
    assert doc["ok"] and doc["runs"] == 2 and doc["running"] is None
    assert doc["elapsed_s"] >= 100.0
    assert doc["interrupted"] == [
        {"drill": "drill-002", "dir": "interrupted/drill-002-1", "run": 1}
    ]
    assert not (tmp_path / "drill-002").exists()
    assert (tmp_path / "interrupted" / "drill-002-1" / "logs").is_dir()
    assert (tmp_path / "campaign.html").read_text().count("drill-00") >= 2
    # a second resume: nothing to move, one run more
    run_campaign_quiet(replace(o, resume=True))
    doc = json.loads((tmp_path / CAMPAIGN_FILE).read_text())
    assert doc["runs"] == 3 and len(doc["interrupted"]) == 1


def test_a_recorded_drill_that_cannot_be_loaded_runs_again(tmp_path: Path) -> None:
    o = options(tmp_path, faults=2, families=("kill",), faults_per_drill=1, max_drills=1)
    done = [write_drill(tmp_path, i, [("kill", "broker-a/0", "kill")]) for i in (0, 1)]
    write_campaign(tmp_path, o, done)
    (tmp_path / "drill-001" / "verdict.json").write_text("{trunc")
    # a contradicting flag is refused before anything changes
    with pytest.raises(CampaignError, match="--seed 2 contradicts"):
        run_campaign_quiet(replace(o, seed=2, resume=True))
    assert (tmp_path / "drill-001" / "verdict.json").read_text() == "{trunc"
    assert not (tmp_path / "interrupted").exists()
    # drill-001 is moved aside to run again; the budget (max_drills 1, counted in
    # finished drills) keeps this test from starting a cluster for it
    lines: list[str] = []
    asyncio.run(run_campaign(replace(o, resume=True, quiet=False), say=lines.append))
    doc = json.loads((tmp_path / CAMPAIGN_FILE).read_text())
    assert [d["drill"] for d in doc["drills"]] == ["drill-000"]
    assert doc["families"]["kill"]["faults"] == 1 and not doc["complete"]
    assert doc["interrupted"] == [
        {"drill": "drill-001", "dir": "interrupted/drill-001-1", "run": 1}
    ]
    assert any("drill-001 is recorded but cannot be loaded (JSONDecodeError" in x for x in lines)


def run_campaign_quiet(o: CampaignOptions) -> CampaignResult:
    return asyncio.run(run_campaign(o))


def test_fresh_campaign_over_a_recorded_one_and_resume_of_nothing(tmp_path: Path) -> None:
    o = options(tmp_path)
    write_campaign(tmp_path, o, [])
    before = (tmp_path / CAMPAIGN_FILE).read_text()
    with pytest.raises(CampaignError, match="already holds a campaign"):
        run_campaign_quiet(o)
    assert (tmp_path / CAMPAIGN_FILE).read_text() == before
    with pytest.raises(CampaignError, match="holds no campaign to resume"):
        run_campaign_quiet(replace(o, out=tmp_path / "empty", resume=True))
    assert not (tmp_path / "empty").exists()


def test_resume_command_line_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_campaign(tmp_path, options(tmp_path), [])
    before = (tmp_path / CAMPAIGN_FILE).read_text()
    out = str(tmp_path)
    for argv, message in (
        (["--resume"], "--resume needs the campaign's directory: --out DIR"),
        (["--resume", "--out", str(tmp_path / "none")], "holds no campaign to resume"),
        (["--resume", "--out", out, "--seed", "0"], f"--seed 0 contradicts the campaign in {out}"),
        (
            ["--resume", "--out", out, "--faults-per-drill", "8"],
            "recorded with --faults-per-drill 2",
        ),
        (["--resume", "--out", out, "--faults", "1"], "--faults 1 is below the 2 faults"),
        (["--resume", "--out", out, "--families", "kill,meteor"], "unknown fault"),
        (["--faults", "2", "--out", out], "already holds a campaign"),
    ):
        with pytest.raises(SystemExit) as exit_:
            hactl(["drill", "campaign", *argv])
        assert exit_.value.code == 2, argv
        assert message in capsys.readouterr().err, argv
    with pytest.raises(SystemExit) as exit_:
        hactl(["drill", "kill-master", "--resume"])
    assert exit_.value.code == 2
    assert "--resume continues a campaign" in capsys.readouterr().err
    assert (tmp_path / CAMPAIGN_FILE).read_text() == before


def test_one_campaign_at_a_time_in_a_directory(tmp_path: Path) -> None:
    o = options(tmp_path)
    write_campaign(tmp_path, o, [])
    before = (tmp_path / CAMPAIGN_FILE).read_text()
    with (tmp_path / ".campaign.lock").open("w") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        held.write("4242\n")
        held.flush()
        with pytest.raises(CampaignError, match=r"in use by a running campaign \(pid 4242\)"):
            run_campaign_quiet(replace(o, resume=True))
    assert (tmp_path / CAMPAIGN_FILE).read_text() == before
