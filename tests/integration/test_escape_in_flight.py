"""An escape whose answer is lost when the master returns is neither lost nor doubled
(issue 17, long-campaign seeds 1016, 7001, 7002).

g1's master is frozen past its expiry and its slave acts.  Just before timer messages
fall due, g2's master (the only escape target) freezes for less than its expiry: the
acting slave's first escape times out, its fate unknown, and its retries queue up in
g2's socket.  g1's master is resumed while that escape is still unanswered.  It must
not take the slave's tables before the slave knows where the message went (or it
delivers it again), and g2 must store the queued retries once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

from special_helpers import create_topic_on, masters_online, messages_on, send_raw

from ha_controller.auth import ClusterAuth
from ha_controller.client.admin import NameserverClient
from ha_controller.proto import broker_pb2
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import Cluster, eventually, run_cluster

TOPIC = "EscapeInFlight"
QUEUES = 2
COUNT = 6
NOT_ACTIVE_MS = 6000
DUE_AFTER_S = 10.0  # the slave acts about 7 s after the freeze


async def _send_timers(pool: ConnectionPool, master: str, due_ms: int) -> list[str]:
    keys = [f"t-{i}" for i in range(COUNT)]
    for i, key in enumerate(keys):
        props = {"UNIQ_KEY": key, "TIMER_DELIVER_MS": str(due_ms)}
        await send_raw(pool, master, TOPIC, i % QUEUES, props, body=b"timer")
    return keys


async def _lead_is(namesrv: str, group: str, addr: str) -> bool:
    async with NameserverClient([namesrv]) as ns:
        members = await ns.member_group("DefaultCluster", group)
    return members.broker_addrs.get(0) == addr or (
        members.acting_broker_id is not None
        and members.broker_addrs.get(members.acting_broker_id) == addr
    )


async def _at(start: float, offset_s: float) -> None:
    await asyncio.sleep(max(0.0, start + offset_s - time.monotonic()))


async def test_escape_unanswered_at_the_return_is_delivered_once(tmp_path: Path) -> None:
    slave_env = {
        "HAC_ESCAPE_SEND_TIMEOUT_MS": "500",
        "HAC_ESCAPE_BACKOFF_INITIAL_MS": "100",
        "HAC_ESCAPE_BACKOFF_MAX_MS": "400",
        "HAC_ESCAPE_MAX_ATTEMPTS": "40",
    }
    cluster: Cluster = run_cluster(
        ("g1", "g2"),
        2,
        workdir=tmp_path,
        env={"HAC_BROKER_NOT_ACTIVE_TIMEOUT_MS": str(NOT_ACTIVE_MS)},
        broker_env={("g1", 1): slave_env},
    )
    g1, slave, g2 = cluster.broker("g1", 0), cluster.broker("g1", 1), cluster.broker("g2", 0)
    try:
        await masters_online(cluster.namesrv, ("g1", "g2"))
        for g in ("g1", "g2"):
            await create_topic_on(cluster.broker(g, 0).rpc, TOPIC, QUEUES)
        async with ConnectionPool() as pool:
            start = time.monotonic()
            keys = await _send_timers(pool, g1.rpc, int(time.time() * 1000 + DUE_AFTER_S * 1000))
            g1.pause()
            await eventually(lambda: _lead_is(cluster.namesrv, "g1", slave.rpc), timeout=15)
            assert time.monotonic() - start < DUE_AFTER_S - 0.6, "the slave acted too late"
            await _at(start, DUE_AFTER_S - 0.4)
            g2.pause()  # shorter than its expiry (its lease holds): it stores on resume
            await _at(start, DUE_AFTER_S + 0.7)  # the first escape has timed out
            g1.resume()
            # the master asks the acting slave at once; the slave's answer waits 2.5 s
            # for the escape, then says EscapesUnresolved, and the master asks again
            await _at(start, DUE_AFTER_S + 4.0)
            g2.resume()
            await eventually(lambda: _lead_is(cluster.namesrv, "g1", g1.rpc), timeout=30)

            async def all_there() -> bool:
                got = {
                    m.properties["UNIQ_KEY"]
                    for m in await messages_on(pool, [g1.rpc, g2.rpc], TOPIC, QUEUES)
                }
                return set(keys) <= got

            await eventually(all_there, timeout=20, interval=0.2)
            await asyncio.sleep(1.0)  # time for a wrong second delivery
            seen = Counter(
                m.properties["UNIQ_KEY"]
                for m in await messages_on(pool, [g1.rpc, g2.rpc], TOPIC, QUEUES)
            )
        twice = {k: n for k, n in seen.items() if n > 1}
        assert not twice, (
            f"delivered more than once: {twice}\n--- g1\n{g1.log_tail(60)}\n"
            f"--- slave\n{slave.log_tail(60)}\n--- g2\n{g2.log_tail(30)}"
        )
        # the race happened: the master asked while the escape was unanswered
        assert "awaiting its answer" in g1.log_path.read_text(), g1.log_tail(60)
    finally:
        for b in (g1, g2):
            b.resume()
        cluster.stop()


async def test_a_master_stores_a_repeated_escape_once(tmp_path: Path) -> None:
    """The target side, over real TCP to a broker process with a cluster secret: a
    member's (signed) SEND_MESSAGE with an ESCAPE_ID it stored before is answered with
    the first store, also after the master was killed (-9) and restarted in between
    (the ids are read back from its commit log); a client's (unsigned) send is stored
    without its ESCAPE_ID, so a forged id (or one a consumer copied from a received
    message) can neither make a real escape count as a repeat nor be read back as one."""
    secret = "escape-ids-test-secret"
    cluster: Cluster = run_cluster(("g1",), 1, workdir=tmp_path, env={"HAC_CLUSTER_SECRET": secret})
    master = cluster.broker("g1", 0)
    try:
        await masters_online(cluster.namesrv, ("g1",))
        await create_topic_on(master.rpc, TOPIC, QUEUES)
        async with (
            ConnectionPool(signer=ClusterAuth(secret).sign) as member,
            ConnectionPool() as client,
        ):

            async def send(
                pool: ConnectionPool, escape_id: str, queue_id: int = 0
            ) -> broker_pb2.SendResult:
                props = {"UNIQ_KEY": escape_id, "ESCAPE_ID": escape_id}
                return await send_raw(
                    pool,
                    master.rpc,
                    TOPIC,
                    queue_id,
                    props,
                    no_replica_wait=True,
                    member_escape=True,  # a client may set it too: the signature counts
                )

            first = await send(member, "g9/delay/100/5", 0)
            again = await send(member, "g9/delay/100/5", 1)  # a retry may ask another queue
            other = await send(member, "g9/delay/200/5", 0)
            forged = await send(client, "g9/delay/300/5")  # a client's, stored first
            real = await send(member, "g9/delay/300/5")
            replayed = await send(client, "g9/delay/100/5")  # as a forwarding consumer
            master = cluster.restart("g1", 0)  # kill -9, then start on the same store
            await masters_online(cluster.namesrv, ("g1",))
            after = await send(member, "g9/delay/100/5", 0)
            real_after = await send(member, "g9/delay/300/5", 1)
            stored = await messages_on(client, [master.rpc], TOPIC, QUEUES)
        assert (again.msg_id, again.queue_id, again.queue_offset) == (
            first.msg_id,
            first.queue_id,
            first.queue_offset,
        )
        assert other.msg_id != first.msg_id
        assert real.msg_id != forged.msg_id  # the real escape is stored
        assert replayed.msg_id != first.msg_id  # and the client's send too
        assert (after.msg_id, after.queue_offset) == (first.msg_id, first.queue_offset)
        assert (real_after.msg_id, real_after.queue_offset) == (real.msg_id, real.queue_offset)
        assert sorted(m.properties.get("ESCAPE_ID", "-") for m in stored) == [
            "-",  # the clients' two, without the id
            "-",
            "g9/delay/100/5",
            "g9/delay/200/5",
            "g9/delay/300/5",
        ]
        log = master.log_path.read_text()
        assert "remembered 3 escape(s) stored before this start" in log
        assert "not stored again" in log
    finally:
        cluster.stop()


async def test_without_a_secret_a_message_sent_on_with_its_escape_id_is_stored(
    tmp_path: Path,
) -> None:
    """No cluster secret: a consumer that sends a received, once escaped, message on
    copies its ESCAPE_ID.  The broker stores it, to another topic or to the same one (it
    is not a repeat of the escape: the send is not marked as a broker's escape), and a
    repeat of the escape is still answered with its first store."""
    other = "EscapeForwarded"
    cluster: Cluster = run_cluster(("g1",), 1, workdir=tmp_path)
    master = cluster.broker("g1", 0)
    try:
        await masters_online(cluster.namesrv, ("g1",))
        await create_topic_on(master.rpc, TOPIC, QUEUES)
        await create_topic_on(master.rpc, other, 1)
        async with ConnectionPool() as pool:
            props = {"UNIQ_KEY": "u1", "ESCAPE_ID": "g9/delay/100/5"}
            first = await send_raw(
                pool, master.rpc, TOPIC, 0, props, no_replica_wait=True, member_escape=True
            )
            sent_on = await send_raw(pool, master.rpc, other, 0, props, no_replica_wait=True)
            same_topic = await send_raw(pool, master.rpc, TOPIC, 0, props, no_replica_wait=True)
            again = await send_raw(
                pool, master.rpc, TOPIC, 1, props, no_replica_wait=True, member_escape=True
            )
            forwarded = await messages_on(pool, [master.rpc], other, 1)
            stored = await messages_on(pool, [master.rpc], TOPIC, QUEUES)
        assert sent_on.msg_id != first.msg_id
        assert [m.msg_id for m in forwarded] == [sent_on.msg_id]
        assert forwarded[0].properties.get("ESCAPE_ID") is None  # dropped: not an escape
        assert same_topic.msg_id != first.msg_id
        assert (again.msg_id, again.queue_offset) == (first.msg_id, first.queue_offset)
        assert sorted(m.msg_id for m in stored) == sorted([first.msg_id, same_topic.msg_id])
    finally:
        cluster.stop()
