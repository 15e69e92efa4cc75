"""When a returning master cuts its log back (broker_agent.membership.truncation.plan_cut),
and its held pulls are refused once it fences (broker_agent.pull_hold)."""

from __future__ import annotations

import asyncio
import time

from broker_agent.membership.truncation import plan_cut
from broker_agent.pull_hold import PullHoldService, WakeReason
from broker_agent.replication.catchup import SlaveLog

S1 = SlaveLog(1, "127.0.0.1:1", 0, 900)
S2 = SlaveLog(2, "127.0.0.1:2", 0, 700)
ACTED = "slave 1 acting for it"


def test_a_master_ahead_after_a_slave_acted_cuts_to_the_most_advanced_slave() -> None:
    plan = plan_cut(0, 1000, [S2, S1], expected_slaves=2, copies_needed=2, slave_acted=ACTED)
    assert (plan.target, plan.source) == (900, S1)
    assert "cutting the log at 900" in str(plan)


def test_the_acting_slave_is_the_source_among_equals() -> None:
    twin = SlaveLog(2, "127.0.0.1:2", 0, 900)
    plan = plan_cut(
        0, 1000, [S1, twin], expected_slaves=2, copies_needed=2, slave_acted=ACTED, acting_id=2
    )
    assert plan.source == twin


def test_a_master_simply_ahead_of_lagging_slaves_keeps_its_tail() -> None:
    plan = plan_cut(0, 1000, [S1, S2], expected_slaves=2, copies_needed=2, slave_acted=None)
    assert plan.target is None and not plan.risky
    assert "no slave acted" in str(plan)


def test_async_replication_never_cuts_and_says_what_that_costs() -> None:
    plan = plan_cut(0, 1000, [S1, S2], expected_slaves=2, copies_needed=1, slave_acted=ACTED)
    assert plan.target is None and plan.risky
    assert "may hold acknowledged messages" in str(plan)


def test_a_silent_slave_may_hold_acknowledged_bytes() -> None:
    # two copies per acknowledgement: the missing slave alone may hold one
    plan = plan_cut(0, 1000, [S2], expected_slaves=2, copies_needed=2, slave_acted=ACTED)
    assert plan.target is None and plan.risky
    # three copies: every acknowledged byte is on both slaves, one answering is enough
    plan = plan_cut(0, 1000, [S2], expected_slaves=2, copies_needed=3, slave_acted=ACTED)
    assert plan.target == 700


def test_not_ahead_or_no_slave_means_no_cut() -> None:
    for own_max, slaves in ((900, [S1]), (1000, [])):
        plan = plan_cut(0, own_max, slaves, expected_slaves=2, copies_needed=2, slave_acted=ACTED)
        assert plan.target is None and not plan.risky


def test_a_slave_that_ends_before_our_log_starts_is_no_target() -> None:
    plan = plan_cut(800, 1000, [S2], expected_slaves=1, copies_needed=2, slave_acted=ACTED)
    assert plan.target is None and plan.risky


# ---- held pulls of a master whose log may be cut back ---------------------------------


async def test_a_fence_answers_every_held_pull_at_once() -> None:
    holds = PullHoldService(8, lambda: int(time.monotonic() * 1000))
    tasks = [asyncio.create_task(holds.hold("T", q, 5, timeout_ms=60_000)) for q in range(3)]
    while holds.held_count < 3:
        await asyncio.sleep(0)
    assert holds.notify_fenced() == 3
    async with asyncio.timeout(1):
        results = await asyncio.gather(*tasks)
    assert {r.reason for r in results} == {WakeReason.FENCED}
    assert not any(r.has_data for r in results)  # the pull is refused, not re-run for data
    assert holds.held_count == 0
