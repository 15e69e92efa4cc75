"""report.html from hand-written histories: role lanes, heal labels, one clock, legend."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from ha_controller.drills.checker import COUNT_NAMES, check
from ha_controller.drills.history import (
    Event,
    Fault,
    HistoryWriter,
    Receive,
    Role,
    SendInvoke,
    SendOk,
    read_history,
)
from ha_controller.drills.nemesis import HEAL_ACTIONS
from ha_controller.drills.report import COUNT_DEFINITIONS, render_report, timeline_svg

T0 = 1_700_000_000_000  # the drill start (wall-clock ms)


def _history(kind: str, *, observed_after: bool = True) -> list[Event]:
    """broker-a/0 is master, suffers ``kind`` at +10 s, healed at +14 s; traffic on
    broker-b throughout; a slave of broker-a acts meanwhile."""
    ev = [
        Event.of(T0 + 2_000, "observer", "info", Role("broker-a", 0, "master")),
        Event.of(T0 + 2_000, "observer", "info", Role("broker-a", 1, "slave")),
        Event.of(T0 + 10_000, "nemesis", "info", Fault(kind, "broker-a/0", "x")),
        Event.of(T0 + 10_500, "observer", "info", Role("broker-a", 1, "acting")),
        Event.of(T0 + 14_000, "nemesis", "ok", Fault(kind, "broker-a/0")),
    ]
    if observed_after:
        ev.append(Event.of(T0 + 15_000, "observer", "info", Role("broker-a", 0, "master")))
        ev.append(Event.of(T0 + 15_200, "observer", "info", Role("broker-a", 1, "slave")))
    for i in range(40):
        t = T0 + 3_000 + i * 500
        ev.append(Event.of(t, "producer", "invoke", SendInvoke(f"k{i}", "T")))
        ev.append(Event.of(t + 3, "producer", "ok", SendOk(f"k{i}", "id", "broker-b", 0, i)))
        ev.append(Event.of(t + 20, "c", "ok", Receive(f"k{i}", "id", "broker-b", 0, i, "c", "G")))
    return sorted(ev, key=lambda e: e.t_ms)


def _lane(svg: str, lane: str) -> list[tuple[str, str, str]]:
    """(state, from s, to s) of the lane's segments, from their tooltips."""
    return re.findall(rf"<title>{re.escape(lane)} (\S+) from (\S+) s to (\S+) s</title>", svg)


def test_killed_master_is_down_then_unknown_until_observed() -> None:
    svg = timeline_svg(_history("kill"), start_ms=T0)
    assert _lane(svg, "broker-a/0") == [
        ("master", "2.0", "10.0"),
        ("down", "10.0", "14.0"),
        ("unknown", "14.0", "15.0"),
        ("master", "15.0", "22.5"),
    ]
    assert ("acting", "10.5", "15.2") in _lane(svg, "broker-a/1")
    assert "restart broker-a/0" in svg


@pytest.mark.parametrize(("kind", "state"), [("pause", "down"), ("partition", "partitioned")])
def test_paused_or_cut_off_master_is_not_green(kind: str, state: str) -> None:
    svg = timeline_svg(_history(kind, observed_after=False), start_ms=T0)
    # the same process comes back: its last observed role resumes at the heal
    assert _lane(svg, "broker-a/0") == [
        ("master", "2.0", "10.0"),
        (state, "10.0", "14.0"),
        ("master", "14.0", "22.5"),
    ]
    assert f"{HEAL_ACTIONS[kind]} broker-a/0" in svg


@pytest.mark.parametrize("target", ["broker-a", "cluster"])
def test_power_loss_of_a_group_or_the_cluster_takes_every_lane_down(target: str) -> None:
    events = [
        Event.of(e.t_ms, e.process, e.type, Fault("power", target, "x")) if e.f == "fault" else e
        for e in _history("kill")
    ]
    svg = timeline_svg(events, start_ms=T0)
    for lane in ("broker-a/0", "broker-a/1"):
        assert ("down", "10.0", "14.0") in _lane(svg, lane), lane
    assert f"power on {target}" in svg


def test_lost_host_stays_down() -> None:
    events = [e for e in _history("kill", observed_after=False) if e.type != "ok" or e.f != "fault"]
    svg = timeline_svg(events, start_ms=T0)
    assert _lane(svg, "broker-a/0")[-1] == ("down", "10.0", "22.5")
    assert "(not healed)" in svg


def test_heal_labels_say_what_the_heal_does() -> None:
    assert HEAL_ACTIONS == {
        "kill": "restart",
        "pause": "resume",
        "partition": "heal partition",
        "netem": "clear loss",
        "disk": "free disk",
        "power": "power on",
        "corrupt": "restart",
        "clock": "reset clock",
        "etcd": "start etcd",
        "isolate": "heal isolation",
    }


def test_one_clock_legend_and_definitions(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as writer:
        writer.write_all(_history("kill"))
    events = read_history(path)
    verdict = check(path, scenario="kill-master")
    page = render_report(events, verdict, start_ms=T0)
    # the fault table, the timeline tooltips and the header all count from the drill start
    assert "<td class='n'>10.0</td><td>restart</td><td class='n'>14.0</td>" in page
    assert "kill broker-a/0 from 10.0 s to 14.0 s" in page
    assert "events from 2.0 s to 22.5 s" in page
    assert "seconds since the drill start (2023-11-14 22:13:20.000 UTC" in page
    assert ">10s</text>" in page  # axis ticks on the same clock
    # without the drill start, the first event is 0
    assert "kill broker-a/0 from 8.0 s to 12.0 s" in render_report(events, verdict)
    # legend and definitions
    for state in ("master", "acting", "slave", "isolated", "down", "partitioned", "unknown"):
        assert f"</span>{state}</td>" in page
    assert set(COUNT_DEFINITIONS) == set(COUNT_NAMES)
    for name in COUNT_NAMES:
        assert f"<td>{name}</td>" in page
        assert html.escape(COUNT_DEFINITIONS[name].split(" (")[0]) in page
    for term in ("write unavailable (group)", "read unavailable (group)", "unattributed"):
        assert f"<dt>{term}</dt>" in page
    # the windows: broker-b kept everything going
    assert "broker-b: 0" in page
