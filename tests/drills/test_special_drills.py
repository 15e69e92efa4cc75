"""RIP-32 special-message drills: delayed, transactional and POP messages and strict
queue locks while a slave acts for its killed master (issues 4, 5, 7).

The default run keeps three short drills (strict locks, POP, delayed: about 70 s with
the Spark comparisons); strict locks off and transactions are ``slow``
(``pytest -m slow tests/drills``).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Sequence

import pytest
from drill_helpers import DrillRunner, assert_safe

from ha_controller.cli.drill import SCENARIO_NAMES, add_commands
from ha_controller.drills.history import Event, read_history
from ha_controller.drills.runner import SCENARIOS, DrillResult

pytestmark = pytest.mark.timeout(150)

SPECIAL = ("delayed-acting", "transactions-acting", "pop-acting", "strict-lock")


def events(result: DrillResult) -> list[Event]:
    return read_history(result.out / "history.jsonl")


def fault_window(evs: Sequence[Event]) -> tuple[int, int]:
    start = min(e.t_ms for e in evs if e.f == "fault" and e.type == "info")
    end = min(e.t_ms for e in evs if e.f == "fault" and e.type == "ok" and e.t_ms >= start)
    return start, end


def test_scenarios_are_wired() -> None:
    assert set(SPECIAL) <= set(SCENARIOS)
    assert set(SCENARIO_NAMES) == set(SCENARIOS)
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    args = parser.parse_args(["drill", "strict-lock", "--no-strict"])
    assert args.no_strict is True
    assert parser.parse_args(["drill", "strict-lock"]).no_strict is False
    assert SCENARIOS["pop-acting"].check.redelivery == "after_ack"


@pytest.mark.slow  # test_strict_locks.py covers it with real processes
async def test_strict_lock(run: DrillRunner) -> None:
    """B joins while the slave acts and is allotted the queues A holds: strict mode
    makes the acting slave refuse them until A let them go."""
    result = await run("strict-lock", duration_s=6.0)
    assert_safe(result)
    assert result.ok, result.verdict.counts
    evs = events(result)
    locks = [e for e in evs if e.f == "lock" and e.type == "ok"]
    refused_b = [e for e in locks if e.process == "orderly-b" and e.value["granted"] is False]
    granted_b = [e for e in locks if e.process == "orderly-b" and e.value["granted"] is True]
    assert refused_b, "B was never refused: the drill did not contend for a held queue"
    assert granted_b and min(e.t_ms for e in granted_b) > min(e.t_ms for e in refused_b)
    unlocks_a = [e for e in evs if e.f == "unlock" and e.process == "orderly-a"]
    assert unlocks_a, "A never let a queue go"


@pytest.mark.slow
async def test_strict_lock_off_grants_twice(run: DrillRunner) -> None:
    """Without strict mode the acting slave never saw A's locks and grants them to B."""
    result = await run("strict-lock", duration_s=6.0, strict_locks=False)
    assert not result.ok
    assert result.verdict.counts["double_lock_grants"] > 0, result.verdict.counts
    assert result.verdict.counts["lost"] == 0


@pytest.mark.slow  # test_pop_acting.py covers it with real processes
async def test_pop_acting(run: DrillRunner) -> None:
    result = await run("pop-acting", duration_s=8.0)
    assert_safe(result)
    assert result.ok, result.verdict.counts
    evs = events(result)
    start, end = fault_window(evs)
    pops = defaultdict(list)
    for e in evs:
        if e.f == "receive" and e.process == "pop-0":
            pops[e.value["key"]].append(e)
    nacked = {e.value["key"] for e in evs if e.f == "nack"}
    assert nacked, "no message was left un-acked"
    assert all(any(r.value["topic"].startswith("%RETRY%") for r in pops[k]) for k in nacked), (
        "an un-acked message did not come back through the retry topic"
    )
    acting_acks = [
        e
        for e in evs
        if e.f == "ack" and e.process == "pop-0" and start <= e.t_ms <= end
        if pops[e.value["key"]][-1].value["broker"] == "broker-a"
    ]
    assert acting_acks, "nothing of broker-a was acked while its slave acted"


@pytest.mark.slow  # test_delay_acting.py covers it
async def test_delayed_acting(run: DrillRunner) -> None:
    result = await run("delayed-acting", duration_s=8.0)
    assert_safe(result)
    assert result.ok, result.verdict.counts
    evs = events(result)
    stored_a = {
        e.value["key"]
        for e in evs
        if e.f == "send" and e.type == "ok" and e.value["broker"] == "broker-a"
    }
    delayed = {
        e.value["key"]
        for e in evs
        if e.f == "send"
        and e.type == "invoke"
        and ("delay_ms" in e.value or "due_ts_ms" in e.value)
    }
    escaped = {
        e.value["key"]
        for e in evs
        if e.f == "receive" and e.value["broker"] == "broker-b" and e.value["key"] in stored_a
    }
    assert escaped & delayed, "no delayed message of broker-a was escaped to broker-b"


@pytest.mark.slow
async def test_transactions_acting(run: DrillRunner) -> None:
    result = await run("transactions-acting", duration_s=8.0)
    counts = result.verdict.counts
    assert counts["unresolved_transactions"] == 0, counts
    evs = events(result)
    start, end = fault_window(evs)
    checked = [
        e
        for e in evs
        if e.f == "end_tx" and e.value.get("via") == "check" and start <= e.t_ms <= end
    ]
    assert checked, "no open transaction was checked back while the slave acted"
    assert_safe(result)
    assert result.ok, counts


@pytest.mark.slow
@pytest.mark.usefixtures("needs_netns")
async def test_strict_lock_partition_netns(run: DrillRunner) -> None:
    """The same contention with the master cut off the network instead of killed: it
    keeps running (and believes it is master) while its slave acts."""
    result = await run("strict-lock", duration_s=6.0, netns=True)
    assert_safe(result)
    assert result.ok, result.verdict.counts
    assert [f.kind for f in result.verdict.faults] == ["partition"]
