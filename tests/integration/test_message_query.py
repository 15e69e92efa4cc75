"""``hactl message query`` by key and by id against a real group (master + slave): the
master answers, the acting slave answers once the master is killed, and a master
restarted without its key index files answers again from the index it rebuilt."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from typing import Any

import pytest

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message, SendReceipt
from ha_controller.client.producer import Producer
from ha_controller.testing import Cluster, eventually, hactl_argv, run_cluster

pytestmark = pytest.mark.timeout(120)

TOPIC = "QueryTopic"


def query(cluster: Cluster, *args: str) -> tuple[int, dict[str, Any]]:
    out = subprocess.run(
        hactl_argv("message", "query", "--json", *args, "--namesrv", cluster.namesrv),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode in (0, 1), out.stderr
    return out.returncode, json.loads(out.stdout)


def brokers_and_ids(found: dict[str, Any]) -> tuple[set[str], list[str]]:
    return {m["broker"] for m in found["messages"]}, sorted(m["msg_id"] for m in found["messages"])


async def test_query_by_key_and_id_on_the_master_the_acting_slave_and_after_a_rebuild(
    tmp_path: Any,
) -> None:
    cluster = run_cluster(("broker-a",), 2, workdir=tmp_path)
    try:
        await cluster.wait_ready()
        receipts: list[SendReceipt] = []
        async with Producer([cluster.namesrv], group="query-producer") as producer:
            for i in range(6):
                receipts.append(
                    await producer.send(Message(TOPIC, b"b" * (10 + i), keys=("order-7", f"m{i}")))
                )
            other = await producer.send(Message(TOPIC, b"other", keys=("order-8",)))
        ids = sorted(r.uniq_key for r in receipts)

        rc, found = query(cluster, "--topic", TOPIC, "--key", "order-7")
        assert rc == 0 and brokers_and_ids(found) == ({"broker-a/0"}, ids)
        first = found["messages"][-1]  # oldest last
        assert first["keys"] == ["order-7", "m0"] and first["body_len"] == 10
        rc, found = query(cluster, "--id", receipts[2].uniq_key)
        assert rc == 0 and [m["keys"] for m in found["messages"]] == [["order-7", "m2"]]
        async with NameserverClient([cluster.namesrv]) as ns:  # the rest in-process: faster
            got = await ns.query_messages(msg_id=other.msg_id)  # the offset message id
            assert [m.keys for _, m in got.found] == ["order-8"]
            got = await ns.query_messages(topic=TOPIC, key="order-7", end_ms=1)
            assert (got.found, got.failed) == ([], {})

        # the master goes: its acting slave answers the same
        cluster.broker("broker-a", 0).kill()
        async with NameserverClient([cluster.namesrv]) as ns:

            async def acting() -> bool:
                return [g.acting_broker_id for g in await ns.groups()] == [1]

            await eventually(acting, timeout=15)
        rc, found = query(cluster, "--topic", TOPIC, "--key", "order-7")
        assert rc == 0 and brokers_and_ids(found) == ({"broker-a/1"}, ids)
        async with NameserverClient([cluster.namesrv]) as ns:
            got = await ns.query_messages(msg_id=receipts[4].uniq_key)
            assert [(b, m.uniq_key) for b, m in got.found] == [("broker-a/1", receipts[4].uniq_key)]

        # the master comes back without its index files: it rebuilds them from its log
        index_dirs = list((tmp_path / "store" / "broker-a-0").rglob("index"))
        assert index_dirs
        for d in index_dirs:
            shutil.rmtree(d)
        cluster.restart("broker-a", 0)
        await cluster.wait_ready()

        async def master_answers() -> bool:
            rc, found = await asyncio.to_thread(
                query, cluster, "--topic", TOPIC, "--key", "order-7"
            )
            return rc == 0 and brokers_and_ids(found) == ({"broker-a/0"}, ids)

        await eventually(master_answers, timeout=15)
    finally:
        cluster.stop()
