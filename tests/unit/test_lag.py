"""Consumer lag as plain objects (broker_agent.lag) and its scrape-time collector."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fakes import FakeClock
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker_agent.core import BrokerCore
from broker_agent.lag import QueueLag, bound_queues, by_topic, is_system, queue_lags
from broker_agent.membership.lease import Lease
from broker_agent.metrics import ConsumerLagCollector
from ha_controller.config import BrokerConfig

NOW = 1_800_000_000_000


@dataclass
class Queues:
    """A store as the lag computation sees it: per queue, the store times of its
    messages from ``min`` on."""

    times: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    mins: dict[tuple[str, int], int] = field(default_factory=dict)

    def max_offset(self, topic: str, queue_id: int) -> int:
        return len(self.times.get((topic, queue_id), []))

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self.mins.get((topic, queue_id), 0)

    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int | None:
        ts = self.times.get((topic, queue_id), [])
        if not self.min_offset(topic, queue_id) <= offset < len(ts):
            return None
        return ts[offset]


def store() -> Queues:
    # T: queue 0 holds 10 messages stored a second apart, queue 1 holds 4, queue 2 none
    return Queues(
        times={
            ("T", 0): [NOW - 60_000 + i * 1000 for i in range(10)],
            ("T", 1): [NOW - 5000 + i * 1000 for i in range(4)],
        }
    )


def test_lag_is_max_offset_minus_committed_and_age_is_the_message_at_the_offset() -> None:
    rows = queue_lags(store(), [("G", "T", 0, 3), ("G", "T", 1, 4)], lambda t: 3)
    assert rows == [
        QueueLag("G", "T", 0, 10, 3, 7, NOW - 57_000),
        QueueLag("G", "T", 1, 4, 4, 0, None),
        # a queue without a committed offset counts nothing (RocketMQ: offset = max)
        QueueLag("G", "T", 2, 0, -1, 0, None),
    ]
    assert rows[0].age_ms(NOW) == 57_000
    assert rows[1].age_ms(NOW) == 0
    (topic,) = by_topic(rows)
    assert (topic.lag, topic.age_ms(NOW), topic.queues) == (7, 57_000, 3)
    assert not topic.is_retry and not topic.is_system


def test_the_oldest_queue_sets_the_topic_age_and_lags_add_up() -> None:
    rows = queue_lags(store(), [("G", "T", 0, 8), ("G", "T", 1, 0)], lambda t: 2)
    (topic,) = by_topic(rows)
    assert topic.lag == 2 + 4
    assert topic.oldest_store_ms == NOW - 52_000  # queue 0, offset 8
    assert topic.age_ms(NOW) == 52_000


def test_retention_past_the_offset_dates_the_first_message_left() -> None:
    s = store()
    s.mins[("T", 0)] = 6
    (row,) = queue_lags(s, [("G", "T", 0, 2)], lambda t: 1)
    assert row.lag == 8  # the deleted ones still count, as in RocketMQ
    assert row.oldest_store_ms == NOW - 54_000


def test_a_committed_offset_past_the_end_is_no_lag() -> None:
    (row,) = queue_lags(store(), [("G", "T", 1, 9)], lambda t: 0)
    assert (row.lag, row.oldest_store_ms) == (0, None)


def test_groups_and_topics_are_kept_apart_and_filtered() -> None:
    offsets = [("A", "T", 0, 5), ("B", "T", 0, 9), ("A", "%RETRY%A", 0, 0)]
    rows = queue_lags(store(), offsets, lambda t: 1)
    assert [(r.group, r.topic, r.lag) for r in rows] == [
        ("A", "%RETRY%A", 0),
        ("A", "T", 5),
        ("B", "T", 1),
    ]
    topics = {(t.group, t.topic): t for t in by_topic(rows)}
    assert topics[("A", "%RETRY%A")].is_retry
    assert [r.group for r in queue_lags(store(), offsets, lambda t: 1, group="B")] == ["B"]
    assert queue_lags(store(), offsets, lambda t: 1, topic="U") == []


def test_system_groups_and_topics() -> None:
    assert is_system("rmq_sys_REVIVE_LOG_x", "G")
    assert is_system("T", "CID_RMQ_SYS_TRANS")
    assert not is_system("%RETRY%G", "G")
    assert not is_system("T", "G")


def test_the_queue_bound_keeps_the_queues_furthest_behind() -> None:
    rows = [QueueLag("G", "T", q, 10, 10 - q, q, NOW - q) for q in range(5)]
    kept, dropped = bound_queues(rows, 2)
    assert [q.queue_id for q in kept] == [4, 3]
    assert dropped == 3
    assert bound_queues(rows, 5) == (rows, 0)
    assert bound_queues(rows, 0) == ([], 5)


def scrape(collector: ConsumerLagCollector) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry()
    registry.register(collector)
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


IDENT = {"cluster": "C", "broker_name": "b", "broker_id": "0"}


def test_the_collector_exports_rocketmq_names_and_bounded_queue_series() -> None:
    rows = queue_lags(store(), [("G", "T", 0, 3), ("G", "T", 1, 1)], lambda t: 2)
    collector = ConsumerLagCollector(lambda: rows, lambda: NOW, 1, IDENT)
    got = scrape(collector)
    labels = {**IDENT, "consumer_group": "G", "topic": "T", "is_retry": "false"}
    labels["is_system"] = "false"
    assert got["rocketmq_consumer_lag_messages"] == [(labels, 10.0)]
    assert got["rocketmq_consumer_lag_latency"] == [(labels, 57_000.0)]  # milliseconds
    queue = {**IDENT, "consumer_group": "G", "topic": "T", "queue_id": "0"}
    assert got["hac_consumer_queue_lag_messages"] == [(queue, 7.0)]
    assert got["hac_consumer_queue_oldest_age_seconds"] == [(queue, 57.0)]
    assert got["hac_consumer_lag_queues_dropped"] == [(IDENT, 1.0)]
    assert got["hac_consumer_lag_overflows_total"] == [(IDENT, 1.0)]
    assert scrape(collector)["hac_consumer_lag_overflows_total"] == [(IDENT, 2.0)]


def test_a_broker_that_does_not_export_shows_no_lag_series() -> None:
    got = scrape(ConsumerLagCollector(lambda: None, lambda: NOW, 10, IDENT))
    assert "rocketmq_consumer_lag_messages" not in got
    assert "hac_consumer_queue_lag_messages" not in got
    assert got["hac_consumer_lag_queues_dropped"] == [(IDENT, 0.0)]
    assert got["hac_consumer_lag_overflows_total"] == [(IDENT, 0.0)]


def broker_core(tmp_path: Path, broker_id: int) -> BrokerCore:
    return BrokerCore(
        BrokerConfig(
            cluster="c",
            broker_name="g1",
            broker_id=broker_id,
            namesrv_addrs=("127.0.0.1:1",),
            store_dir=str(tmp_path / f"g1-{broker_id}"),
        )
    )


async def test_only_a_serving_master_or_the_acting_slave_exports(tmp_path: Path) -> None:
    master, slave = broker_core(tmp_path, 0), broker_core(tmp_path, 1)
    try:
        clock = FakeClock(100.0)
        master.lease = Lease(2.0, clock=clock)
        master.isolated = True  # pre-online
        assert not master.exports_consumer_lag
        master.isolated = False
        master.lease.granted(100.0)
        assert master.exports_consumer_lag
        clock.now = 103.0  # frozen past its lease: a slave may act by now, not fenced yet
        assert not master.exports_consumer_lag
        slave.isolated = False  # started
        assert not slave.exports_consumer_lag  # a slave that does not act
        slave.acting.on_min_broker_change(1, "127.0.0.1:2")
        assert slave.exports_consumer_lag
        slave.acting.hold(30.0)  # its master returns through pre-online: neither exports
        assert not slave.exports_consumer_lag
    finally:
        for core in (master, slave):
            await core.pool.aclose()
            core.store.close()
