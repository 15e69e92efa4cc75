"""Consumer lag over real processes: RocketMQ 5's ``rocketmq_consumer_lag_messages`` and
``rocketmq_consumer_lag_latency`` scraped from the brokers' ``/metrics``, and ``hactl
group lag``, before and through a failover.

One group (master and one slave), a topic of two queues, N messages, a pull consumer
that commits part of each queue.  The master exports the lag and the slave does not;
the master is frozen (SIGSTOP): the slave acts and exports the same lag under its own
broker id; the master resumed exports nothing while it is not serving, and takes the
lag back once it returned through pre-online, when the slave stops."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer
from ha_controller.client.tools import body_for
from ha_controller.testing import (
    Cluster,
    ProcessHandle,
    eventually,
    hactl_argv,
    http_get,
    run_cluster,
)

TOPIC = "LagTopic"
GROUP = "lag-consumers"
N = 40
#: offset committed per queue id: the rest is the lag
COMMITTED = {0: 5, 1: 2}

Sample = tuple[dict[str, str], float]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = run_cluster(("broker-a",), 2, workdir=tmp_path)
    try:
        yield c
    finally:
        c.stop()


def scrape(broker: ProcessHandle) -> dict[str, list[Sample]]:
    status, body = http_get(broker.http, "/metrics")
    assert status == 200
    out: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def ours(samples: list[Sample]) -> list[Sample]:
    return [
        (labels, v)
        for labels, v in samples
        if labels.get("consumer_group") == GROUP and labels.get("topic") == TOPIC
    ]


def exported_lag(metrics: dict[str, list[Sample]]) -> list[Sample]:
    """Our group's ``rocketmq_consumer_lag_messages`` samples, asserting that the
    broker may export it: a serving master or an acting slave (one scrape shows both
    the series and the role, so this holds whatever the other broker does)."""
    lag = ours(metrics.get("rocketmq_consumer_lag_messages", []))
    if lag:
        role = {labels["role"]: v for labels, v in metrics["hac_broker_role"]}
        (isolated,) = metrics["hac_broker_isolated"]
        assert role["acting"] == 1 or (role["master"] == 1 and isolated[1] == 0), metrics
    return lag


def hactl_lag(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        hactl_argv("group", "lag", GROUP, "--namesrv", cluster.namesrv, *args),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def status(broker: ProcessHandle) -> dict[str, Any]:
    code, body = http_get(broker.http, "/api/v1/status")
    assert code == 200
    return dict(json.loads(body))


async def test_lag_and_latency_follow_the_acting_slave(cluster: Cluster) -> None:
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    async with NameserverClient([cluster.namesrv]) as ns:

        async def online() -> bool:
            groups = await ns.groups()
            return bool(groups) and all(g.master_online for g in groups)

        await eventually(online, timeout=30)
        await ns.create_topic(TOPIC, queues=2)
    per_queue = dict.fromkeys(COMMITTED, 0)
    async with Producer(cluster.namesrv, group="lag-producer") as producer:
        for i in range(N):
            r = await producer.send(Message(TOPIC, body_for(f"k{i}", 64), keys=(f"k{i}",)))
            per_queue[r.queue_id] = max(per_queue[r.queue_id], r.queue_offset + 1)
    assert sum(per_queue.values()) == N and min(per_queue.values()) > max(COMMITTED.values())
    expected = sum(per_queue[q] - c for q, c in COMMITTED.items())
    oldest: dict[int, int] = {}
    async with PullConsumer(cluster.namesrv, GROUP) as pull:
        for mq in await pull.queues(TOPIC):
            committed = COMMITTED[mq.queue_id]
            res = await pull.pull(mq, committed, max_msgs=1, suspend_timeout_ms=0)
            oldest[mq.queue_id] = res.messages[0].store_ts_ms  # the first one not consumed
            await pull.commit(mq, committed)

    # the master exports the lag, the slave (not acting) nothing
    before_ms = int(time.time() * 1000)
    m = scrape(master)
    after_ms = int(time.time() * 1000)
    (lag,) = exported_lag(m)
    assert lag[0]["broker_id"] == "0" and lag[0]["is_retry"] == "false"
    assert lag[1] == expected
    ((_, latency),) = ours(m["rocketmq_consumer_lag_latency"])  # milliseconds
    first = min(oldest.values())
    assert before_ms - first - 5 <= latency <= after_ms - first + 5
    queues = {
        int(labels["queue_id"]): v for labels, v in ours(m["hac_consumer_queue_lag_messages"])
    }
    assert queues == {q: per_queue[q] - c for q, c in COMMITTED.items()}
    ages = {
        int(labels["queue_id"]): v for labels, v in ours(m["hac_consumer_queue_oldest_age_seconds"])
    }
    for q, ts in oldest.items():
        assert (before_ms - ts) / 1000 - 0.01 <= ages[q] <= (after_ms - ts) / 1000 + 0.01
    assert exported_lag(scrape(slave)) == []

    # hactl group lag shows the same, per queue, from the master
    out = hactl_lag(cluster, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["lag"] == expected and doc["failed"] == {}
    assert [
        (q["queueId"], q["brokerId"], q["maxOffset"], q["consumerOffset"], q["lag"])
        for q in doc["queues"]
    ] == [(q, 0, per_queue[q], c, per_queue[q] - c) for q, c in sorted(COMMITTED.items())]
    assert all(q["topic"] == TOPIC and q["brokerName"] == "broker-a" for q in doc["queues"])
    for q in doc["queues"]:
        assert q["oldestAgeMs"] >= before_ms - oldest[q["queueId"]] - 5
    text = hactl_lag(cluster)
    assert text.returncode == 0, text.stderr
    assert f"consumer group {GROUP}: lag {expected} messages" in text.stdout
    assert "TOPIC  " in text.stdout and "CONSUMER" in text.stdout and "OLDEST" in text.stdout

    # the master freezes: the slave acts and exports the same lag, older, under its id
    master.pause()
    try:

        async def acting() -> bool:
            return bool(status(slave)["acting"])

        await eventually(acting, timeout=15)

        async def slave_exports() -> bool:
            lag = exported_lag(scrape(slave))
            return bool(lag) and lag[0][1] == expected

        await eventually(slave_exports, timeout=10)
        s = scrape(slave)
        (lag,) = exported_lag(s)
        assert lag[0]["broker_id"] == "1"
        ((_, acting_latency),) = ours(s["rocketmq_consumer_lag_latency"])
        assert acting_latency >= latency
        out = hactl_lag(cluster, "--json")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["lag"] == expected
        assert {q["brokerId"] for q in doc["queues"]} == {1}
        assert "answered by slave 1" in hactl_lag(cluster).stdout
        # a scrape that waits for the frozen master: the first thing it answers on waking
        queued = asyncio.ensure_future(asyncio.to_thread(scrape, master))
        await asyncio.sleep(0.3)
    finally:
        master.resume()

    # resumed, its lease ran out: it exports nothing until it serves again (not even
    # before it noticed), then it takes the lag back and the slave stops
    assert exported_lag(await queued) == []
    assert exported_lag(scrape(master)) == []

    async def master_back() -> bool:
        lag = exported_lag(scrape(master))
        return bool(lag) and lag[0][1] == expected and not exported_lag(scrape(slave))

    deadline = time.monotonic() + 30
    while not await master_back():
        assert time.monotonic() < deadline, "the master did not take the lag back"
        await asyncio.sleep(0.2)
    assert not status(slave)["acting"]
