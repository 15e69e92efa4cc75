"""Interrupted campaigns, with real processes: a campaign killed with SIGKILL in its
second drill is resumed with ``hactl drill campaign --resume`` and ends with both
drills; what the killed one left running is gone.  Ctrl-C and SIGTERM stop a campaign
with campaign.json written, no process left and the resume command as the last line.

Tiny campaigns: the ``kill`` family only, one fault per drill, short faults.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ha_controller.drills.campaign import CAMPAIGN_FILE, resume_command
from ha_controller.drills.leftovers import cleanup_stale, stale_processes
from ha_controller.testing import ProcessHandle, eventually_sync, hactl_argv, run_nameserver

#: the first run: the API, to give the campaign short faults (recorded in campaign.json,
#: so the resume through the CLI uses them too)
FIRST_RUN = """
import sys
from pathlib import Path
from ha_controller.drills.campaign import CampaignOptions, run_campaign_sync
from ha_controller.drills.generator import GeneratorSpec
run_campaign_sync(CampaignOptions(
    faults=2, families=("kill",), faults_per_drill=1, out=Path(sys.argv[1]), rate=20.0,
    drain_timeout_s=15.0,
    generator=GeneratorSpec(fault_s=(1.5, 2.5), gap_s=(0.5, 1.0), overlap_ratio=0.0),
))
"""
#: a drill cluster: one nameserver and two groups of three brokers
CLUSTER = 7


def cluster_processes(owner: int) -> dict[int, str]:
    """The processes of the drill clusters that process ``owner`` started."""
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    return stale_processes(sorted(tmp.glob(f"hacd-{owner:x}-*")))


def running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def record(out: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((out / CAMPAIGN_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def started(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process in its own session; whatever of its session is left is killed after."""
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.mark.timeout(180)
def test_a_killed_campaign_resumes(tmp_path: Path) -> None:
    out = tmp_path / "campaign"
    with started([sys.executable, "-c", FIRST_RUN, str(out)], tmp_path / "run-1.log") as first:

        def second_drill_running() -> dict[int, str]:
            assert first.poll() is None, (tmp_path / "run-1.log").read_text()[-3000:]
            doc = record(out)
            if len(doc.get("drills", ())) != 1 or doc.get("running") != "drill-001":
                return {}
            procs = cluster_processes(first.pid)
            return procs if len(procs) >= CLUSTER else {}

        eventually_sync(second_drill_running, timeout=90, interval=0.2)
        first.send_signal(signal.SIGKILL)  # the campaign process only, as kill -9 does
        first.wait(10)
        time.sleep(0.5)
        # what a SIGKILL leaves: the drill's cluster keeps running (but a broker its
        # fault had just killed)
        left = {pid: argv for pid, argv in cluster_processes(first.pid).items() if running(pid)}
        assert len(left) >= CLUSTER - 1, left

        resumed = subprocess.run(
            hactl_argv("drill", "campaign", "--resume", "--out", str(out)),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    doc = record(out)
    # exit 0 only when ok; a drill's own verdict (a rare duplicate after a kill) is the
    # cluster's finding, not the resume's: the campaign's ok must follow its drills'
    assert resumed.returncode == (0 if doc.get("ok") else 1), resumed.stdout[-3000:]
    for pid in left:
        assert f"removed what a killed drill left behind: process {pid} " in resumed.stdout
    assert "drill-001 did not finish in run 1: moved aside" in resumed.stdout
    assert not [pid for pid in left if running(pid)], "the killed run's processes live on"
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob(f"hacd-{first.pid:x}-*"))

    assert [d["drill"] for d in doc["drills"]] == ["drill-000", "drill-001"]
    assert [d["seed"] for d in doc["drills"]] == [0, 1]
    assert doc["runs"] == 2 and doc["running"] is None
    assert doc["families"]["kill"]["faults"] == 2
    assert doc["complete"] and doc["ok"] == all(d["ok"] for d in doc["drills"])
    assert doc["ok"] or all(not d["error"] for d in doc["drills"]), json.dumps(doc["drills"])
    assert doc["interrupted"] == [
        {"drill": "drill-001", "dir": "interrupted/drill-001-1", "run": 1}
    ]
    assert (out / "interrupted" / "drill-001-1" / "logs").is_dir()
    assert doc["options"]["generator"]["fault_s"] == [1.5, 2.5]  # the recorded timings


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("sig", "group"),
    [
        pytest.param(signal.SIGTERM, False, id="SIGTERM"),
        # Ctrl-C in a terminal: the whole foreground process group, brokers included
        pytest.param(signal.SIGINT, True, id="ctrl-c"),
    ],
)
def test_an_interrupted_campaign_says_how_to_resume(
    tmp_path: Path, sig: signal.Signals, group: bool
) -> None:
    out = tmp_path / "campaign"
    argv = hactl_argv(
        "drill", "campaign", "--faults", "1", "--families", "kill", "--faults-per-drill", "1"
    )
    with started([*argv, "--out", str(out)], tmp_path / "run.log") as proc:
        eventually_sync(
            lambda: proc.poll() is None and len(cluster_processes(proc.pid)) >= CLUSTER,
            timeout=60,
            interval=0.2,
        )
        left = cluster_processes(proc.pid)
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        code = proc.wait(60)
    lines = (tmp_path / "run.log").read_text().strip().splitlines()
    assert code == 128 + sig, lines[-20:]
    assert lines[-1] == f"resume with: {resume_command(out)}"
    assert f"campaign interrupted ({sig.name})" in lines[-2]
    doc = record(out)
    assert doc["drills"] == [] and doc["runs"] == 1 and doc["running"] == "drill-000"
    assert not doc["ok"]
    assert not [pid for pid in left if running(pid)]


def test_only_the_leftovers_of_a_dead_owner_are_removed(tmp_path: Path) -> None:
    """cleanup_stale: a service process in the work directory of an owner that is gone is
    killed and the directory removed; a live owner's, an untagged directory and a process
    that is not a service are left alone."""
    dead_owner = subprocess.Popen(["true"])
    dead_owner.wait()
    stale = tmp_path / f"hacd-{dead_owner.pid:x}-abcd1234"
    live = tmp_path / f"hacd-{os.getpid():x}-efgh5678"
    untagged = tmp_path / "hacd-ijkl9012"
    procs: list[ProcessHandle] = []
    bystander: subprocess.Popen[bytes] | None = None
    try:
        for workdir in (stale, live, untagged):  # each runs in its workdir, as in a drill
            procs.append(run_nameserver(workdir))
        bystander = subprocess.Popen(["sleep", "60"], cwd=stale)
        removed = cleanup_stale(tmp_path)
        victim, *others = procs
        assert any(line.startswith(f"process {victim.pid} (") for line in removed), removed
        assert f"directory {stale}" in removed
        assert not running(victim.pid) and not stale.exists()
        assert all(h.alive() for h in others) and live.is_dir() and untagged.is_dir()
        assert bystander.poll() is None
        again = cleanup_stale(tmp_path)
        assert not [x for x in again if x.startswith(("process", "directory"))], again
    finally:
        for h in procs:
            h.kill()
        if bystander is not None:
            bystander.kill()
            bystander.wait()
