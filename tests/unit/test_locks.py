"""RebalanceLockManager and the strict-mode quorum count (after RocketMQ's
RebalanceLockManagerTest)."""

from __future__ import annotations

import pytest
from fakes import FakeClock

from broker_agent.locks.manager import (
    DEFAULT_LOCK_MAX_LIVE_TIME_MS,
    MessageQueueKey,
    RebalanceLockManager,
    quorum_grant,
    quorum_size,
)
from ha_controller.protocol.errors import BadRequest

GROUP = "CID_order"
C1 = "10.0.0.1@1"
C2 = "10.0.0.2@1"
MQ1 = MessageQueueKey("TopicTest", "broker-a", 0)
MQ2 = MessageQueueKey("TopicTest", "broker-a", 1)
MQ3 = MessageQueueKey("TopicTest", "broker-a", 2)
LIVE = DEFAULT_LOCK_MAX_LIVE_TIME_MS


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def mgr(clock: FakeClock) -> RebalanceLockManager:
    return RebalanceLockManager(clock)


# --- mirrors RocketMQ RebalanceLockManagerTest --------------------------------------------


def test_is_lock_all_expired_group_not_exist(mgr: RebalanceLockManager) -> None:
    assert mgr.is_lock_all_expired("no-such-group")


def test_is_lock_all_expired_group_exist(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock_batch(GROUP, [MQ1, MQ2], C1)
    assert not mgr.is_lock_all_expired(GROUP)
    clock.advance(LIVE + 1)
    assert mgr.is_lock_all_expired(GROUP)


def test_is_lock_all_expired_some_expired(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock(GROUP, MQ1, C1)
    clock.advance(LIVE)
    mgr.try_lock(GROUP, MQ2, C1)
    clock.advance(1)  # MQ1 now expired, MQ2 live
    assert not mgr.is_lock_all_expired(GROUP)


def test_try_lock_not_locked(mgr: RebalanceLockManager) -> None:
    assert mgr.try_lock(GROUP, MQ1, C1)
    assert mgr.is_locked(GROUP, MQ1, C1)


def test_try_lock_same_client(mgr: RebalanceLockManager) -> None:
    assert mgr.try_lock(GROUP, MQ1, C1)
    assert mgr.try_lock(GROUP, MQ1, C1)


def test_try_lock_different_client(mgr: RebalanceLockManager) -> None:
    assert mgr.try_lock(GROUP, MQ1, C1)
    assert not mgr.try_lock(GROUP, MQ1, C2)
    assert mgr.is_locked(GROUP, MQ1, C1)
    assert not mgr.is_locked(GROUP, MQ1, C2)


def test_try_lock_with_expired_lock(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    assert mgr.try_lock(GROUP, MQ1, C1)
    clock.advance(LIVE + 1)
    assert mgr.try_lock(GROUP, MQ1, C2)
    assert mgr.is_locked(GROUP, MQ1, C2)
    assert not mgr.is_locked(GROUP, MQ1, C1)


def test_try_lock_batch_all_locked(mgr: RebalanceLockManager) -> None:
    assert mgr.try_lock_batch(GROUP, [MQ1, MQ2, MQ3], C1) == {MQ1, MQ2, MQ3}


def test_try_lock_batch_none_locked(mgr: RebalanceLockManager) -> None:
    mgr.try_lock_batch(GROUP, [MQ1, MQ2], C2)
    assert mgr.try_lock_batch(GROUP, [MQ1, MQ2], C1) == set()


def test_try_lock_batch_some_locked(mgr: RebalanceLockManager) -> None:
    mgr.try_lock(GROUP, MQ1, C2)
    assert mgr.try_lock_batch(GROUP, [MQ1, MQ2, MQ3], C1) == {MQ2, MQ3}


def test_unlock_batch_by_owner(mgr: RebalanceLockManager) -> None:
    mgr.try_lock_batch(GROUP, [MQ1, MQ2], C1)
    assert mgr.unlock_batch(GROUP, [MQ1], C1) == {MQ1}
    assert mgr.holders(GROUP) == {MQ2: C1}


def test_unlock_batch_by_other_client(mgr: RebalanceLockManager) -> None:
    mgr.try_lock_batch(GROUP, [MQ1, MQ2], C1)
    assert mgr.unlock_batch(GROUP, [MQ1, MQ2], C2) == set()
    assert mgr.holders(GROUP) == {MQ1: C1, MQ2: C1}


# --- expiry, renewal, steal, housekeeping -------------------------------------------------


def test_lock_lives_exactly_max_live_time(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock(GROUP, MQ1, C1)
    clock.advance(LIVE)  # expiry is strictly "older than" the max live time
    assert mgr.is_locked(GROUP, MQ1, C1)
    assert not mgr.try_lock(GROUP, MQ1, C2)
    clock.advance(1)
    assert not mgr.is_locked(GROUP, MQ1, C1)
    assert mgr.holders(GROUP) == {}


def test_renewal_extends_the_lock(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock_batch(GROUP, [MQ1], C1)
    for _ in range(5):  # a client renews every 20 s
        clock.advance(20_000)
        assert mgr.try_lock_batch(GROUP, [MQ1], C1) == {MQ1}
    clock.advance(LIVE)
    assert mgr.try_lock_batch(GROUP, [MQ1], C2) == set()
    assert mgr.is_locked(GROUP, MQ1, C1)


def test_is_locked_does_not_renew(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock(GROUP, MQ1, C1)
    clock.advance(LIVE)
    assert mgr.is_locked(GROUP, MQ1, C1)
    clock.advance(1)
    assert not mgr.is_locked(GROUP, MQ1, C1)


def test_owner_relocks_own_expired_lock(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock(GROUP, MQ1, C1)
    clock.advance(LIVE + 1)
    assert mgr.try_lock_batch(GROUP, [MQ1], C1) == {MQ1}
    assert mgr.is_locked(GROUP, MQ1, C1)


def test_steal_after_expiry_then_old_holder_is_refused(
    mgr: RebalanceLockManager, clock: FakeClock
) -> None:
    mgr.try_lock_batch(GROUP, [MQ1, MQ2], C1)
    clock.advance(LIVE + 1)
    assert mgr.try_lock_batch(GROUP, [MQ1], C2) == {MQ1}
    # C1 comes back: MQ1 is now C2's, MQ2 (expired, untaken) is C1's again.
    assert mgr.try_lock_batch(GROUP, [MQ1, MQ2], C1) == {MQ2}
    assert mgr.holders(GROUP) == {MQ1: C2, MQ2: C1}
    # The old holder cannot unlock what was stolen from it.
    assert mgr.unlock_batch(GROUP, [MQ1], C1) == set()
    assert mgr.is_locked(GROUP, MQ1, C2)


def test_groups_are_independent(mgr: RebalanceLockManager) -> None:
    assert mgr.try_lock(GROUP, MQ1, C1)
    assert mgr.try_lock("other-group", MQ1, C2)
    assert mgr.holders(GROUP) == {MQ1: C1}
    assert mgr.holders("other-group") == {MQ1: C2}


def test_expire_housekeeping(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock_batch(GROUP, [MQ1, MQ2], C1)
    mgr.try_lock("other-group", MQ1, C2)
    clock.advance(LIVE)
    mgr.try_lock(GROUP, MQ2, C1)
    clock.advance(1)
    assert mgr.expire() == 2  # GROUP/MQ1 and other-group/MQ1
    assert mgr.groups() == [GROUP]
    assert mgr.holders(GROUP) == {MQ2: C1}
    assert mgr.expire() == 0


def test_unlocking_last_lock_forgets_group(mgr: RebalanceLockManager) -> None:
    mgr.try_lock(GROUP, MQ1, C1)
    mgr.unlock_batch(GROUP, [MQ1], C1)
    assert mgr.groups() == []
    assert mgr.try_lock_batch(GROUP, [], C1) == set()
    assert mgr.groups() == []
    assert mgr.unlock_batch("no-such-group", [MQ1], C1) == set()


def test_release_only_removes_holders_lock(mgr: RebalanceLockManager) -> None:
    mgr.try_lock(GROUP, MQ1, C1)
    mgr.try_lock(GROUP, MQ2, C2)
    assert mgr.release(GROUP, [MQ1, MQ2], C1) == {MQ1}
    assert mgr.holders(GROUP) == {MQ2: C2}


def test_max_live_time_is_configurable(clock: FakeClock) -> None:
    mgr = RebalanceLockManager(clock, lock_max_live_time_ms=1_000)
    assert mgr.lock_max_live_time_ms == 1_000
    mgr.try_lock(GROUP, MQ1, C1)
    clock.advance(1_001)
    assert mgr.try_lock(GROUP, MQ1, C2)
    with pytest.raises(ValueError, match="lock_max_live_time_ms"):
        RebalanceLockManager(clock, lock_max_live_time_ms=0)


# --- MessageQueueKey -------------------------------------------------------------------


def test_message_queue_key_dict_round_trip() -> None:
    d = MQ2.to_dict()
    assert d == {"topic": "TopicTest", "brokerName": "broker-a", "queueId": 1}
    assert MessageQueueKey.from_dict(d) == MQ2
    assert hash(MessageQueueKey.from_dict(d)) == hash(MQ2)
    assert len({MQ1, MessageQueueKey("TopicTest", "broker-a", 0)}) == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"brokerName": "b", "queueId": 0},
        {"topic": "", "brokerName": "b", "queueId": 0},
        {"topic": "t", "queueId": 0},
        {"topic": "t", "brokerName": "b", "queueId": "0"},
        {"topic": "t", "brokerName": "b", "queueId": True},
        {"topic": "t", "brokerName": "b", "queueId": -1},
    ],
)
def test_message_queue_key_from_bad_dict(bad: dict[str, object]) -> None:
    with pytest.raises(BadRequest):
        MessageQueueKey.from_dict(bad)


def test_message_queue_key_is_frozen() -> None:
    with pytest.raises(AttributeError):
        MQ1.queue_id = 5  # type: ignore[misc]


# --- strict mode quorum -------------------------------------------------------------------


@pytest.mark.parametrize(("total", "quorum"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
def test_quorum_size(total: int, quorum: int) -> None:
    assert quorum_size(total) == quorum


def test_quorum_three_replicas_self_and_one_peer() -> None:
    assert quorum_grant({MQ1, MQ2}, [{MQ1, MQ2}, set()], 3) == {MQ1, MQ2}


def test_quorum_three_replicas_self_alone_fails() -> None:
    assert quorum_grant({MQ1, MQ2}, [set(), set()], 3) == set()
    assert quorum_grant({MQ1, MQ2}, [], 3) == set()  # no peer answered in time


def test_quorum_three_replicas_per_queue() -> None:
    assert quorum_grant({MQ1, MQ2, MQ3}, [{MQ1}, {MQ1, MQ2}], 3) == {MQ1, MQ2}


def test_quorum_one_replica_self_is_enough() -> None:
    assert quorum_grant({MQ1}, [], 1) == {MQ1}
    assert quorum_grant(set(), [], 1) == set()


def test_quorum_two_replicas_needs_the_peer() -> None:
    assert quorum_grant({MQ1, MQ2}, [{MQ2}], 2) == {MQ2}


def test_quorum_ignores_queues_not_locked_locally() -> None:
    # Peers are only asked for self_locked; a stray peer answer never grants a queue.
    assert quorum_grant({MQ1}, [{MQ1, MQ3}, {MQ3}], 3) == {MQ1}


def test_quorum_result_is_a_new_set() -> None:
    mine = {MQ1}
    granted = quorum_grant(mine, [], 1)
    granted.add(MQ2)
    assert mine == {MQ1}


def test_strict_mode_flow_releases_what_missed_quorum(
    mgr: RebalanceLockManager,
) -> None:
    # What the broker does: lock locally, count peers, release the rest locally.
    mine = mgr.try_lock_batch(GROUP, [MQ1, MQ2], C1)
    granted = quorum_grant(mine, [{MQ1}, set()], 3)
    assert granted == {MQ1}
    assert mgr.release(GROUP, mine - granted, C1) == {MQ2}
    assert mgr.holders(GROUP) == {MQ1: C1}
