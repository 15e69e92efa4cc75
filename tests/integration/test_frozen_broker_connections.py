"""A consumer's connection to a frozen broker (SIGSTOP, shorter than the not-active
timeout, so nobody fails over) over real processes.

The held pull on the frozen master hears nothing, not even the liveness probe, and the
consumer drops the connection (``RpcLimits.liveness_probe_ms``).  The broker forgets the
consumers of a closed connection, so once it resumes it would list this consumer only
after its next heartbeat (every 10 s, or when its own rebalance, every 5 s, finds itself
missing), and another consumer's rebalance could hand this one's queues out twice
meanwhile; the consumer says hello on the new connection at once."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import ReceivedMessage
from ha_controller.client.push_consumer import PushConsumer
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.rpc.pool import ConnectionPool
from ha_controller.testing import eventually, run_cluster

TOPIC = "FrozenConn"
GROUP = "frozen-c"


async def test_a_consumer_is_listed_again_at_once_after_its_connection_to_a_frozen_broker_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ha_controller.rpc.connection")
    # the freeze (4 s) stays below the not-active timeout: the master is not expired
    cluster = run_cluster(
        ("broker-a",), 2, workdir=tmp_path, env={"HAC_BROKER_NOT_ACTIVE_TIMEOUT_MS": "10000"}
    )
    master = cluster.broker("broker-a", 0)
    try:
        async with NameserverClient([cluster.namesrv]) as ns:

            async def online() -> bool:
                groups = await ns.groups()
                return len(groups) == 1 and groups[0].master_online

            await eventually(online, timeout=30)
            await ns.create_topic(TOPIC, queues=2)

        async def listener(m: ReceivedMessage) -> bool:
            return True

        async with (
            # periodic heartbeats and rebalances out of the way: only the hello counts
            PushConsumer(
                cluster.namesrv,
                GROUP,
                TOPIC,
                listener,
                heartbeat_interval_s=60.0,
                rebalance_interval_s=60.0,
            ) as consumer,
            ConnectionPool() as pool,
        ):

            async def listed() -> bool:
                answer = await pool.call_pb(
                    master.rpc,
                    RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                    broker_pb2.ConsumerListRequest(consumer_group=GROUP),
                    broker_pb2.ConsumerListResponse,
                    timeout_ms=1000,
                )
                return consumer.client_id in answer.client_ids

            await eventually(lambda: len(consumer.assigned_queues()) == 2, timeout=20)
            await eventually(listed, timeout=10)
            master.pause()
            try:
                await eventually(
                    lambda: "dropping the connection to" in caplog.text, timeout=10, interval=0.1
                )
            finally:
                master.resume()
            resumed = time.monotonic()
            await pool.discard(master.rpc)  # ours went through the freeze too
            await eventually(listed, timeout=8, interval=0.1)
            waited = time.monotonic() - resumed
            assert waited < 2.0, waited
    finally:
        cluster.stop()
