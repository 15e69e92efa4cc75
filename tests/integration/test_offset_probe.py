"""The drills' offset probe counts a broker that forgot a group's offsets as a rollback.

A master that comes back without the offsets a consumer committed answers "no offset"
(-1). The probe used to skip such queues, so a master that never stored (or lost) the
offsets went unnoticed; a consumer asking it starts over at the queue's first message,
which is a rollback to 0.
"""

from __future__ import annotations

from pathlib import Path

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message, MessageQueue
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer
from ha_controller.drills.checker import check
from ha_controller.drills.history import HistoryWriter, OffsetCommit, read_history
from ha_controller.drills.workloads import mq_name, offset_probe
from ha_controller.testing import eventually, run_cluster

TOPIC = "Probed"
GROUP = "probed-consumers"


async def test_a_master_without_the_committed_offset_is_a_rollback(tmp_path: Path) -> None:
    cluster = run_cluster(("g1",), 1, workdir=tmp_path)
    path = tmp_path / "history.jsonl"
    try:
        async with NameserverClient([cluster.namesrv]) as ns:
            await ns.create_topic(TOPIC, queues=1)
        async with Producer(cluster.namesrv) as producer:  # once the route is there
            await eventually(lambda: producer.send(Message(TOPIC, b"m", keys=("k",))), 20)
        mq = MessageQueue(TOPIC, "g1", 0)
        with HistoryWriter(path) as history:
            async with PullConsumer(cluster.namesrv, GROUP) as pull:
                value = OffsetCommit(consumer_group=GROUP, mq=mq_name(mq), offset=3)
                history.record("puller-0", "invoke", value)
                await pull.commit(mq, 3)
                history.record("puller-0", "ok", value)
                assert await pull.committed_offset(mq) == 3
            # the same broker, but without its offsets (a volume lost, or a master killed
            # before it ever stored them)
            cluster.broker("g1", 0).stop()
            (tmp_path / "store" / "g1-0" / "consumer_offsets.json").unlink()
            cluster.restart("g1", 0)
            found = await eventually(
                lambda: offset_probe(cluster.namesrv, TOPIC, GROUP, history), timeout=20
            )
    finally:
        cluster.stop()
    assert found[mq_name(mq)] == 0
    verdict = check(read_history(path), scenario="offset-probe")
    assert verdict.counts["offset_rollbacks"] == 1, verdict.counts
