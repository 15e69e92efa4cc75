"""A recall accepted by an acting slave survives that slave (issue 34, item 4).

Group ``ra`` has a master and two slaves, ``rb`` a master and a slave.  Timer messages
are sent to ``ra``; its master is killed, slave 1 acts and accepts the recall of some
of them; then slave 1 is killed too and slave 2 acts.  When they fall due, slave 2
delivers (through the escape to ``rb``) every message but the recalled ones: before
this, it had never heard of the recall and delivered them on time.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.rpc import connect
from ha_controller.testing import Cluster, eventually, http_get, run_cluster, stored_messages

pytestmark = pytest.mark.timeout(180)

TOPIC = "RecallActing"
DUE_IN_MS = 14_000


async def acting_id(ns: NameserverClient, group: str) -> int | None:
    for g in await ns.groups():
        if g.broker_name == group:
            return g.acting_broker_id
    return None


async def test_a_recall_accepted_by_an_acting_slave_outlives_it() -> None:
    c = run_cluster(("ra", "rb"), 3)
    try:
        await c.wait_ready(60)
        async with NameserverClient([c.namesrv]) as ns:
            await ns.create_topic(TOPIC, queues=2)
        due = int(time.time() * 1000) + DUE_IN_MS
        sent: dict[str, tuple[str, int]] = {}
        async with Producer(c.namesrv, "recall-p") as p:
            for i in range(16):
                r = await p.send(Message(TOPIC, f"t-{i}".encode(), deliver_ts_ms=due + i))
                sent[r.uniq_key] = (r.broker_name, due + i)
        on_ra = [k for k, (b, _) in sent.items() if b == "ra"]
        assert len(on_ra) >= 4, sent
        recalled = set(on_ra[::2])

        c.broker("ra", 0).kill()
        async with NameserverClient([c.namesrv]) as ns:
            await eventually(lambda: _is(ns, "ra", 1, c), timeout=20)
            slave1 = c.broker("ra", 1).rpc
            conn = await connect(slave1)
            try:
                for uniq in recalled:
                    await conn.call_pb(
                        RequestCode.RECALL_MESSAGE,
                        broker_pb2.RecallMessageRequest(
                            producer_group="recall-p",
                            topic=TOPIC,
                            broker_name="ra",
                            deliver_ms=sent[uniq][1],
                            uniq_key=uniq,
                        ),
                        broker_pb2.RecallMessageResponse,
                        timeout_ms=8000,
                    )
            finally:
                await conn.aclose()
            c.broker("ra", 1).kill()
            await eventually(lambda: _is(ns, "ra", 2, c), timeout=20)
        assert time.time() * 1000 < due, "the kills took longer than the delay"

        want = set(sent) - recalled
        await asyncio.sleep(max(0.0, (due - time.time() * 1000) / 1000))

        async def all_due_delivered() -> bool:
            got = await delivered_ids(c)
            return want <= got

        await eventually(all_due_delivered, timeout=40)
        got = await delivered_ids(c)
        assert not got & recalled, f"recalled messages delivered: {sorted(got & recalled)}"
        log = c.broker("ra", 2).log_path.read_text()
        assert "recall(s) of the acting slave kept" in log
    finally:
        c.stop()


async def _is(ns: NameserverClient, group: str, broker_id: int, c: Cluster | None = None) -> bool:
    """The nameserver shows ``broker_id`` acting for ``group``, and it knows it acts."""
    if await acting_id(ns, group) != broker_id:
        return False
    if c is None:
        return True
    status, body = await asyncio.to_thread(
        http_get, c.broker(group, broker_id).http, "/api/v1/status"
    )
    return status == 200 and bool(json.loads(body).get("acting"))


async def delivered_ids(c: Cluster) -> set[str]:
    """UNIQ_KEYs of the messages stored in the topic itself (delivered when due)."""
    async with PullConsumer(c.namesrv, "recall-check") as pull:
        return {m.uniq_key async for m in stored_messages(pull, await pull.queues(TOPIC))}
