"""Producer queue selection (round robin, isolation, FIFO) and push-consumer
allocation / offset bookkeeping, without sockets."""

from __future__ import annotations

from fakes import FakeClock
from hypothesis import given
from hypothesis import strategies as st

from ha_controller.client import EndpointIsolation, MessageQueue, QueueSelector, allocate_averagely
from ha_controller.client.pull_consumer import pull_rpc_timeout_ms
from ha_controller.client.push_consumer import OffsetTracker
from ha_controller.client.send_policy import is_retriable
from ha_controller.client.siphash import queue_for_message_group
from ha_controller.protocol.errors import (
    BadRequest,
    BrokerIsolated,
    BrokerUnavailable,
    ConnectionClosed,
    InSyncReplicasNotEnough,
    NotMaster,
    NotWritable,
    RequestTimeout,
    TopicNotFound,
    Unauthorized,
)

QUEUES = [MessageQueue("T", b, i) for b in ("broker-a", "broker-b") for i in range(4)]


def test_round_robin_walks_every_queue_in_order() -> None:
    sel = QueueSelector(start=0)
    picked = [QueueSelector.pick(QUEUES, sel.next_start()) for _ in range(16)]
    assert picked == QUEUES + QUEUES


def test_isolated_broker_is_skipped() -> None:
    sel = QueueSelector(start=0)
    isolated = {"broker-a"}
    picked = [
        QueueSelector.pick(QUEUES, sel.next_start(), isolated=lambda q: q.broker_name in isolated)
        for _ in range(8)
    ]
    assert {q.broker_name for q in picked} == {"broker-b"}
    # Still round robin over the healthy group's queues.
    assert [q.queue_id for q in picked[4:]] == [0, 1, 2, 3]


def test_every_broker_isolated_still_gives_a_queue() -> None:
    q = QueueSelector.pick(QUEUES, 5, isolated=lambda q: True)
    assert q == QUEUES[5]


def test_retry_goes_to_another_group_as_java_does() -> None:
    # Attempt 1 at broker-a failed: it is isolated and tried.
    isolated: set[str] = set()
    tried: set[str] = set()
    for start in range(len(QUEUES)):
        first = QueueSelector.pick(QUEUES, start, tried=tried)
        isolated.add(first.broker_name)
        tried.add(first.broker_name)
        second = QueueSelector.pick(
            QUEUES, start, isolated=lambda q: q.broker_name in isolated, tried=tried
        )
        assert second.broker_name != first.broker_name
        isolated.clear()
        tried.clear()


def test_tried_groups_are_avoided_even_when_not_isolated() -> None:
    q = QueueSelector.pick(QUEUES, 0, tried={"broker-a"})
    assert q.broker_name == "broker-b"
    # Both tried: fall back to one not isolated.
    q = QueueSelector.pick(
        QUEUES, 0, tried={"broker-a", "broker-b"}, isolated=lambda q: q.broker_name == "broker-a"
    )
    assert q.broker_name == "broker-b"


def test_fifo_queue_is_the_siphash_queue_and_is_stable() -> None:
    for group in ["order-1", "order-2", "user-42", "ß-unicode", ""]:
        expected = QUEUES[queue_for_message_group(group, len(QUEUES))]
        assert QueueSelector.for_message_group(QUEUES, group) == expected
        assert QueueSelector.for_message_group(list(QUEUES), group) == expected


def test_fifo_spreads_groups_over_queues() -> None:
    used = {QueueSelector.for_message_group(QUEUES, f"g{i}") for i in range(200)}
    assert used == set(QUEUES)


def test_isolation_lapses_after_isolation_time_and_on_release() -> None:
    clock = FakeClock(100.0)
    iso = EndpointIsolation(30.0, clock=clock)
    iso.isolate("a:1")
    iso.isolate("b:1")
    assert iso.is_isolated("a:1") and iso.isolated() == {"a:1", "b:1"}
    assert not iso.is_isolated(None)
    iso.release("b:1")
    assert iso.isolated() == {"a:1"}
    clock.now += 29.9
    assert iso.is_isolated("a:1")
    clock.now += 0.2
    assert not iso.is_isolated("a:1")
    assert iso.isolated() == set()


def test_retriable_classification() -> None:
    for exc in [
        NotMaster("x"),
        InSyncReplicasNotEnough("x"),
        BrokerUnavailable("x"),
        ConnectionClosed("x"),
        RequestTimeout("x"),
        BrokerIsolated("x"),
        NotWritable("x"),  # a full store stored nothing: another group takes it
        TopicNotFound("x"),  # a stale route: RocketMQ retries TOPIC_NOT_EXIST
        ConnectionResetError(),
    ]:
        assert is_retriable(exc), exc
    for exc in [BadRequest("x"), Unauthorized("x"), ValueError("x")]:
        assert not is_retriable(exc), exc


def test_pull_rpc_timeout_exceeds_the_suspend_time() -> None:
    assert pull_rpc_timeout_ms(15_000) == 30_000  # RocketMQ push consumer: 15 s / 30 s
    assert pull_rpc_timeout_ms(20_000) > 20_000
    assert pull_rpc_timeout_ms(0, 3000) == 3000
    for suspend in (1, 500, 5_000, 60_000):
        assert pull_rpc_timeout_ms(suspend) > suspend


# --- AllocateMessageQueueAveragely -------------------------------------------------


def cids(n: int) -> list[str]:
    return [f"CID_PREFIX{i}" for i in range(n)]


def test_allocate_averagely_rocketmq_example_10_queues_4_consumers() -> None:
    # AllocateMessageQueueAveragelyTest: 10 queues over 4 consumers -> 3, 3, 2, 2.
    mqs = list(range(10))
    ids = cids(4)
    result = [allocate_averagely(mqs, ids, c) for c in ids]
    assert [len(r) for r in result] == [3, 3, 2, 2]
    assert result == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]


def test_allocate_averagely_more_consumers_than_queues() -> None:
    ids = cids(5)
    result = [allocate_averagely(["q0", "q1"], ids, c) for c in ids]
    assert result == [["q0"], ["q1"], [], [], []]


def test_allocate_averagely_even_split_and_unknown_client() -> None:
    mqs = [MessageQueue("T", "b", i) for i in range(8)]
    assert allocate_averagely(mqs, ["a", "b"], "a") == mqs[:4]
    assert allocate_averagely(mqs, ["a", "b"], "b") == mqs[4:]
    assert allocate_averagely(mqs, ["a", "b"], "c") == []
    assert allocate_averagely([], ["a"], "a") == []


@given(st.integers(0, 64), st.integers(1, 20))
def test_allocate_averagely_partitions_the_queues(n_queues: int, n_clients: int) -> None:
    mqs = list(range(n_queues))
    ids = cids(n_clients)
    parts = [allocate_averagely(mqs, ids, c) for c in ids]
    assert [q for part in parts for q in part] == mqs  # disjoint, contiguous, complete
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


# --- offset bookkeeping ---------------------------------------------------------------


def test_offset_tracker_commits_only_up_to_the_lowest_unfinished() -> None:
    t = OffsetTracker(10)
    assert t.committable == 10
    t.add([10, 11, 12, 13], next_offset=14)
    assert t.committable == 10 and t.inflight == 4
    t.done(12)
    t.done(13)
    assert t.committable == 10  # 10 and 11 still running
    t.done(10)
    assert t.committable == 11
    t.done(11)
    assert t.committable == 14 and t.inflight == 0
    t.done(11)  # a late duplicate is harmless
    assert t.committable == 14


def test_offset_tracker_next_offset_covers_filtered_messages_and_reset() -> None:
    t = OffsetTracker(0)
    t.add([3], next_offset=8)  # offsets 0..2 and 4..7 did not match the tags
    assert t.committable == 3
    t.done(3)
    assert t.committable == 8
    t.add([8, 9], next_offset=10)
    t.reset(5)  # OFFSET_ILLEGAL: the broker says start at 5
    assert t.committable == 5 and t.inflight == 0
