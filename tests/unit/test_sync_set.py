"""The controller-mode master's sync-state set as a plain object
(:mod:`broker_agent.replication.sync_set`): who every write waits for.

The ``controller-slave-behind`` campaign (seed 3305) froze a slave (SIGSTOP): the
master dropped it from the set after ``lag_ms`` as it should, and at the next check
required it again as a joining member (it was still within ``JOIN_GAP_BYTES`` of the
end), so every write waited for the frozen slave until its link closed: seconds
without writes, and the timer's delivery stuck in its replica wait meanwhile.
"""

from __future__ import annotations

from broker_agent.replication.sync_set import SyncSet

LAG_MS = 2000


def run(s: SyncSet, acked_of: dict[int, int], end: int, now_ms: float) -> None:
    """One observation, answered at once as the controller would."""
    proposal = s.observe(acked_of, end, now_ms)
    if proposal is not None:
        s.answered(proposal.members)


def writes(
    s: SyncSet, acked: dict[int, int], *, start_ms: int, until_ms: int, frozen: set[int]
) -> int:
    """Writes of 100 bytes every 100 ms; the members not ``frozen`` keep up.  Returns
    the master's end."""
    end = max(acked.values(), default=0)
    t = start_ms
    while t <= until_ms:
        end += 100
        for m in acked:
            if m not in frozen:
                acked[m] = end
        run(s, dict(acked), end, t)
        t += 100
    return end


def test_a_frozen_member_dropped_for_lag_is_not_required_again() -> None:
    s = SyncSet(2, frozenset({0, 1, 2}), lag_ms=LAG_MS)
    acked = {0: 1000, 1: 1000}
    run(s, dict(acked), 1000, 0)
    writes(s, acked, start_ms=100, until_ms=2500, frozen={0})
    assert s.confirmed == {1, 2}, "the frozen member was not dropped"
    # it is still attached and well within the join gap of the end
    writes(s, acked, start_ms=2600, until_ms=6000, frozen={0})
    assert 0 not in s.required, "writes wait for the frozen member again"
    assert s.confirmed == {1, 2}


def test_a_joining_member_that_freezes_before_its_mark_is_no_longer_required() -> None:
    s = SyncSet(2, frozenset({1, 2}), lag_ms=LAG_MS)
    acked = {0: 900, 1: 1000}
    run(s, dict(acked), 1000, 0)  # member 0 close behind: required until it holds 1000
    assert 0 in s.required
    writes(s, acked, start_ms=100, until_ms=3000, frozen={0})
    assert 0 not in s.required
    assert s.confirmed == {1, 2}


def test_a_member_that_keeps_up_still_joins() -> None:
    s = SyncSet(2, frozenset({1, 2}), lag_ms=LAG_MS)
    acked = {0: 0, 1: 1000}
    run(s, dict(acked), 1000, 0)
    for t in range(100, 3000, 100):
        acked[0] = min(acked[0] + 300, 1000 + t)  # catching up, faster than the writes
        acked[1] = 1000 + t
        run(s, dict(acked), 1000 + t, t)
    assert s.confirmed == {0, 1, 2}


def test_a_member_asked_for_stays_required_though_it_froze() -> None:
    """Once the controller may add it, the master must not acknowledge without it."""
    s = SyncSet(2, frozenset({1, 2}), lag_ms=LAG_MS)
    proposal = s.observe({0: 1000, 1: 1000}, 1000, 0)
    assert proposal is not None and 0 in proposal.members
    for t in range(100, 4000, 100):  # no answer yet; member 0 froze
        assert s.observe({0: 1000, 1: 1000 + t}, 1000 + t, t) is None
        assert 0 in s.required
