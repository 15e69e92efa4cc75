"""A full disk over real processes and a real (tmpfs) file system.

A: a master whose store fills up withdraws the WRITE bit from its routes (it stays
readable), answers the retriable ``NotWritable`` if a send still reaches it, and takes
writes again by itself once space returns.

B: a slave whose store fills up says so (status, ``/readyz``, metric, heartbeat), and
when the master dies the nameserver has the slave that holds everything act, not the
lowest id.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from special_helpers import messages_on

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message, MessageQueue
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer, PullStatus
from ha_controller.client.send_policy import is_retriable
from ha_controller.client.tools import body_for
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import HaError, NotWritable
from ha_controller.routing import Perm
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import Cluster, ProcessHandle, eventually, run_cluster

TOPIC = "T"
MiB = 1 << 20
BODY = 1024
CONCURRENCY = 32


@contextlib.contextmanager
def tmpfs(path: Path, size_mib: int) -> Iterator[Path]:
    """A ``size_mib`` MiB tmpfs mounted at ``path`` (skips the test without mount)."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:
        pytest.skip(f"cannot run mount: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root/CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(path)], check=False)


def store_dir(workdir: Path, name: str, broker_id: int) -> Path:
    """Where ``run_cluster`` puts a broker's store (see ha_controller.testing)."""
    return workdir / "store" / f"{name}-{broker_id}"


def http(handle: ProcessHandle, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://{handle.http}{path}", timeout=5) as resp:
            body = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        body = exc.read()
        status = exc.code
    if path == "/metrics":
        return status, body.decode()
    return status, json.loads(body or b"null")


async def status_of(handle: ProcessHandle) -> dict[str, Any]:
    code, body = await asyncio.to_thread(http, handle, "/api/v1/status")
    assert code == 200
    return dict(body)


def free_bytes(path: Path) -> tuple[int, int]:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def fill(path: Path, size: int) -> None:
    with path.open("wb") as f:
        chunk = b"\xa5" * MiB
        left = size
        while left > 0:
            left -= f.write(chunk[: min(left, MiB)])


async def wait_groups(ns: NameserverClient, n: int) -> None:
    async def ok() -> bool:
        groups = await ns.groups()
        return len(groups) == n and all(g.master_online for g in groups)

    await eventually(ok, timeout=30)


async def perm_of(ns: NameserverClient, group: str) -> int:
    route = await ns.route(TOPIC)
    queue = route.queue(group)
    assert queue is not None
    return queue.perm


async def read_all(namesrv: str, group: str) -> dict[str, bytes]:
    """Every message of TOPIC, by key, through the route as clients see it now."""
    out: dict[str, bytes] = {}
    async with PullConsumer(namesrv, group) as pull:
        queues: list[MessageQueue] = await pull.queues(TOPIC)
        for mq in queues:
            offset = 0
            while True:
                res = await pull.pull(mq, offset, max_msgs=256, suspend_timeout_ms=0)
                if res.status is not PullStatus.FOUND:
                    break
                for m in res.messages:
                    assert m.key not in out, f"{m.key} stored twice"
                    out[m.key] = m.body
                offset = res.next_begin_offset
    return out


class Sender:
    """``CONCURRENCY`` sends in flight through one producer; remembers what was acked."""

    def __init__(self, producer: Producer, prefix: str) -> None:
        self.producer = producer
        self.prefix = prefix
        self.acked: dict[str, str] = {}  # key -> group
        self.failed: list[tuple[str, str]] = []
        self._next = 0

    async def _one(self, key: str) -> None:
        try:
            receipt = await self.producer.send(Message(TOPIC, body_for(key, BODY), keys=(key,)))
        except HaError as exc:
            self.failed.append((key, repr(exc)))
            return
        self.acked[key] = receipt.broker_name

    async def send(self, n: int, concurrency: int = CONCURRENCY) -> None:
        end = self._next + n

        async def worker() -> None:
            while self._next < end:
                key = f"{self.prefix}-{self._next:06d}"
                self._next += 1
                await self._one(key)

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def raw_send(addr: str, key: str) -> broker_pb2.SendMessageResponse:
    pool = ConnectionPool()
    try:
        return await pool.call_pb(
            addr,
            RequestCode.SEND_MESSAGE,
            broker_pb2.SendMessageRequest(
                producer_group="raw",
                topic=TOPIC,
                queue_id=0,
                entries=[broker_pb2.SendEntry(body=body_for(key, BODY), properties={"KEYS": key})],
            ),
            broker_pb2.SendMessageResponse,
            3000,
        )
    finally:
        await pool.aclose()


# ---------------------------------------------------------------------------- A


@pytest.mark.parametrize(
    ("fs_mib", "filler_mib", "sends", "stale_check"),
    [
        # the short run also sends through a producer whose route is stale (its 30 s
        # poll has not come yet): its sends reach the full master and move on
        pytest.param(8, 2, 12_000, True, id="8MiB-12k"),
        pytest.param(40, 8, 90_000, False, id="40MiB-90k", marks=pytest.mark.slow),
    ],
)
async def test_full_master_hands_writes_to_the_other_group_and_takes_them_back(
    tmp_path: Path, fs_mib: int, filler_mib: int, sends: int, stale_check: bool
) -> None:
    with tmpfs(store_dir(tmp_path, "broker-a", 0), fs_mib) as mnt:
        filler = mnt / "filler"
        fill(filler, filler_mib * MiB)
        cluster = run_cluster(("broker-a", "broker-b"), 2, workdir=tmp_path)
        try:
            await _full_master(cluster, mnt, filler, sends, stale_check)
        finally:
            cluster.stop()


async def _full_master(
    cluster: Cluster, mnt: Path, filler: Path, sends: int, stale_check: bool
) -> None:
    master_a = cluster.broker("broker-a", 0)
    async with NameserverClient([cluster.namesrv]) as ns:
        await wait_groups(ns, 2)
        await ns.create_topic(TOPIC, queues=4)

        async def both_writable() -> bool:
            perms = [await perm_of(ns, g) for g in ("broker-a", "broker-b")]
            return all(Perm.is_writeable(p) for p in perms)

        await eventually(both_writable, timeout=10)
        # a producer that never refreshes its route in time (30 s poll, no watch): it
        # still sends to broker-a after its disk filled up
        stale = Producer(cluster.namesrv, group="stale", route_watch=False, topics=[TOPIC])
        await stale.start()
        try:
            async with Producer(cluster.namesrv, group="fill") as producer:
                sender = Sender(producer, "k")
                t0 = time.monotonic()
                await sender.send(sends)
                elapsed = time.monotonic() - t0
                by_group = {
                    g: list(sender.acked.values()).count(g) for g in ("broker-a", "broker-b")
                }
                print(
                    f"\n{sends} sends in {elapsed:.1f} s ({sends / elapsed:.0f}/s): "
                    f"acked {len(sender.acked)} {by_group}, failed {len(sender.failed)}"
                )
                assert len(sender.acked) >= 0.99 * sends, sender.failed[:5]
                assert by_group["broker-a"] > 0 and by_group["broker-b"] > by_group["broker-a"]

                # the full master withdrew WRITE and stays readable
                perm = await perm_of(ns, "broker-a")
                assert Perm.is_readable(perm) and not Perm.is_writeable(perm)
                assert Perm.is_writeable(await perm_of(ns, "broker-b"))
                status = await status_of(master_a)
                assert status["advertisesWrites"] is False, status
                assert status["storeSpaceLevel"] in ("low", "full"), status
                tail = [sender.acked[k] for k in sorted(sender.acked)[-1000:]]
                assert set(tail) == {"broker-b"}

                # past the hard reserve: the master refuses, retriably, storing nothing
                free, total = free_bytes(mnt)
                hard = int(total * 0.05)
                fill(mnt / "filler-2", max(0, free - hard + 256 * 1024))

                async def refuses() -> bool:
                    s = await status_of(master_a)
                    return s["storeWritable"] is False

                await eventually(refuses, timeout=5)
                code, ready = await asyncio.to_thread(http, master_a, "/readyz")
                assert code == 503 and "store not writable" in ready["reason"], ready
                _, metrics = await asyncio.to_thread(http, master_a, "/metrics")
                assert 'hac_store_writable{broker_id="0"' in metrics
                with pytest.raises(NotWritable) as refused:
                    await raw_send(master_a.rpc, "raw-refused")
                assert is_retriable(refused.value)

                # a send that still goes there moves on within the same send
                stale_sender = Sender(stale, "stale")
                if stale_check:
                    stale_groups = {q.broker_name for q in stale.routes.publish_queues(TOPIC)}
                    assert "broker-a" in stale_groups
                    # one at a time: the producer coalesces the sends of one tick into
                    # one request to one queue, and the rotation over the queues must
                    # reach broker-a's before the batch is done
                    await stale_sender.send(40, concurrency=1)
                    assert len(stale_sender.acked) == 40, stale_sender.failed[:3]
                    assert set(stale_sender.acked.values()) == {"broker-b"}
                    # ... after broker-a refused them (the raw send above is one more)
                    _, metrics = await asyncio.to_thread(http, master_a, "/metrics")
                    refusals = sum(
                        float(line.rsplit(" ", 1)[1])
                        for line in metrics.splitlines()
                        if line.startswith("hac_send_errors_total{")
                        and 'reason="not_writable"' in line
                    )
                    assert refusals >= 2, refusals

                # space returns: writes come back to broker-a by themselves
                (mnt / "filler-2").unlink()
                filler.unlink()
                t_free = time.monotonic()
                back = Sender(producer, "back")
                while "broker-a" not in back.acked.values():
                    assert time.monotonic() - t_free < 5, "broker-a never took writes again"
                    await back.send(CONCURRENCY)
                    await asyncio.sleep(0.01)
                recovered = time.monotonic() - t_free
                print(f"writes back on broker-a {recovered:.2f} s after space was freed")
                assert recovered < 2.0
                assert Perm.is_writeable(await perm_of(ns, "broker-a"))
                status = await status_of(master_a)
                assert status["storeWritable"] and status["advertisesWrites"], status
                code, _ = await asyncio.to_thread(http, master_a, "/readyz")
                assert code == 200
        finally:
            await stale.aclose()

        # nothing acknowledged was lost: every acked message is readable
        stored = await read_all(cluster.namesrv, "verify")
        acked = {**sender.acked, **stale_sender.acked, **back.acked}
        missing = [k for k in acked if k not in stored]
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:3]}"
        assert all(stored[k] == body_for(k, BODY) for k in acked)
        assert "raw-refused" not in stored


# ---------------------------------------------------------------------------- B


async def ns_groups(cluster: Cluster) -> dict[str, Any]:
    code, body = await asyncio.to_thread(http, cluster.nameserver, "/api/v1/groups")
    assert code == 200
    (group,) = [g for g in body if g["brokerName"] == "broker-a"]
    return dict(group)


def member(group: dict[str, Any], broker_id: int) -> dict[str, Any]:
    (m,) = [m for m in group["members"] if m["brokerId"] == broker_id]
    return dict(m)


async def test_slave_with_a_full_disk_says_so_and_the_slave_holding_everything_acts(
    tmp_path: Path,
) -> None:
    with tmpfs(store_dir(tmp_path, "broker-a", 1), 16) as mnt:
        filler = mnt / "filler"
        fill(filler, 10 * MiB)
        cluster = run_cluster(("broker-a",), 3, workdir=tmp_path)
        try:
            await _full_slave(cluster, mnt, filler)
        finally:
            cluster.stop()


async def _full_slave(cluster: Cluster, mnt: Path, filler: Path) -> None:
    master, slave1, slave2 = (cluster.broker("broker-a", i) for i in range(3))
    async with NameserverClient([cluster.namesrv]) as ns:
        await wait_groups(ns, 1)
        await ns.create_topic(TOPIC, queues=4)
        await eventually(lambda: _writable(ns), timeout=10)
        async with Producer(cluster.namesrv, group="p") as producer:
            sender = Sender(producer, "a")

            # 1. slave 1's disk fills up: it stops replicating and says so honestly
            await sender.send(6000)
            assert not sender.failed, sender.failed[:3]  # master + slave 2 make two copies

            async def slave1_stalled() -> dict[str, Any]:
                s = await status_of(slave1)
                assert s["storeWritable"] is False and s["replicationStalled"], s
                assert s["replicationLagBytes"] > 0, s
                return s

            status = await eventually(slave1_stalled, timeout=10)
            code, ready = await asyncio.to_thread(http, slave1, "/readyz")
            assert code == 503 and "store not writable" in ready["reason"], ready
            _, metrics = await asyncio.to_thread(http, slave1, "/metrics")
            assert 'hac_store_writable{broker_id="1",broker_name="broker-a"' in metrics
            assert "hac_store_writable{" in metrics and any(
                line.startswith("hac_store_writable{") and line.endswith(" 0.0")
                for line in metrics.splitlines()
            )

            async def ns_sees_slave1_full() -> bool:
                g = await ns_groups(cluster)
                m1, m2 = member(g, 1), member(g, 2)
                assert m1["storeWritable"] is False and m2["storeWritable"] is True, g
                assert m1["maxOffset"] < m2["maxOffset"], g
                return True

            await eventually(ns_sees_slave1_full, timeout=5)
            print(f"\nslave 1 stalled: lag {status['replicationLagBytes']} bytes")

            async def master_sees_slave1_silent() -> bool:
                links = {s["brokerId"]: s for s in (await status_of(master))["slaves"]}
                # still attached, but it no longer counts as a copy for SYNC sends
                assert links[1]["confirming"] is False and links[2]["confirming"], links
                return True

            await eventually(master_sees_slave1_silent, timeout=5)

            # 2. space returns: slave 1 resumes replicating by itself and catches up
            filler.unlink()

            async def slave1_caught_up() -> bool:
                s1, m = await status_of(slave1), await status_of(master)
                assert s1["storeWritable"] and s1["replicationStalled"] is None, s1
                assert s1["commitLogMaxOffset"] == m["commitLogMaxOffset"], (s1, m)
                assert s1["replicationLagBytes"] == 0, s1
                return True

            await eventually(slave1_caught_up, timeout=15)
            code, _ = await asyncio.to_thread(http, slave1, "/readyz")
            assert code == 200

            # 3. it fills up again, further on
            free, total = free_bytes(mnt)
            fill(mnt / "filler-2", max(0, free - int(total * 0.05) - MiB))
            await sender.send(3000)
            assert not sender.failed, sender.failed[:3]
            await eventually(slave1_stalled, timeout=10)
            await eventually(ns_sees_slave1_full, timeout=5)

        # 4. the master dies: slave 2 (everything, writable) acts, not slave 1 (lowest id)
        master.kill()

        async def slave2_acts() -> bool:
            route = await ns.route(TOPIC)
            broker = route.broker("broker-a")
            assert broker is not None
            assert broker.broker_addrs == {0: slave2.rpc, 1: slave1.rpc}, broker
            group = await ns.member_group("DefaultCluster", "broker-a")
            assert group.acting_broker_id == 2, group
            s2, s1 = await status_of(slave2), await status_of(slave1)
            assert s2["acting"] is True and s2["role"] == "slave", s2
            assert s1["acting"] is False and s1["minBrokerIdInGroup"] == 2, s1
            return True

        await eventually(slave2_acts, timeout=10)
        assert (await ns_groups(cluster))["actingBrokerId"] == 2

        # every acknowledged message stays readable, through the acting slave
        stored = await read_all(cluster.namesrv, "after-failover")
        missing = [k for k in sender.acked if k not in stored]
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:3]}"
        assert all(stored[k] == body_for(k, BODY) for k in sender.acked)

        # 5. slave 1 gets space back: writable, says so, but it is behind: 2 keeps acting
        (mnt / "filler-2").unlink()

        async def slave1_writable_again() -> bool:
            s1 = await status_of(slave1)
            assert s1["storeWritable"] is True, s1
            assert member(await ns_groups(cluster), 1)["storeWritable"] is True
            return True

        await eventually(slave1_writable_again, timeout=10)
        code, _ = await asyncio.to_thread(http, slave1, "/readyz")
        assert code == 200
        await asyncio.sleep(1.0)  # a few heartbeats
        await slave2_acts()


async def _writable(ns: NameserverClient) -> bool:
    return Perm.is_writeable(await perm_of(ns, "broker-a"))


# ---------------------------------------------------------------------------- C

DELAYED_TOPIC = "DelayedOnFull"
DELAYED = 20
DELAY_LEVEL = 2  # 5 s


async def _delayed_on(pool: ConnectionPool, addrs: list[str]) -> dict[str, list[int]]:
    """Store times of every message of DELAYED_TOPIC on these brokers, by key."""
    seen: dict[str, list[int]] = {}
    for m in await messages_on(pool, addrs, DELAYED_TOPIC, 2):
        seen.setdefault(m.properties["UNIQ_KEY"], []).append(m.store_ts_ms)
    return seen


async def test_delayed_messages_of_a_full_master_fall_due_on_time(tmp_path: Path) -> None:
    """Issue 17, defect C: the master's disk fills up after delayed messages were
    stored on it.  It cannot write the deliveries and no slave acts for a live master:
    the due messages go to the other group's master through the escape bridge, on
    time, and once space returns nothing is delivered a second time."""
    with tmpfs(store_dir(tmp_path, "broker-a", 0), 8) as mnt:
        cluster = run_cluster(("broker-a", "broker-b"), 2, workdir=tmp_path)
        master_a, master_b = cluster.broker("broker-a", 0), cluster.broker("broker-b", 0)
        pool = ConnectionPool()
        try:
            async with NameserverClient([cluster.namesrv]) as ns:
                await wait_groups(ns, 2)
                await ns.create_topic(DELAYED_TOPIC, queues=2)
            due: dict[str, int] = {}
            for i in range(DELAYED):
                key = f"due-{i}"
                resp = await pool.call_pb(
                    master_a.rpc,
                    RequestCode.SEND_MESSAGE,
                    broker_pb2.SendMessageRequest(
                        producer_group="raw",
                        topic=DELAYED_TOPIC,
                        queue_id=i % 2,
                        entries=[
                            broker_pb2.SendEntry(
                                body=b"d", properties={"UNIQ_KEY": key, "DELAY": str(DELAY_LEVEL)}
                            )
                        ],
                    ),
                    broker_pb2.SendMessageResponse,
                    3000,
                )
                assert resp.results
                due[key] = int(time.time() * 1000) + 5_000
            # the disk fills up past the hard reserve: the master stores nothing more
            free, total = free_bytes(mnt)
            fill(mnt / "filler", max(0, free - int(total * 0.05) + 256 * 1024))

            async def refuses() -> bool:
                return (await status_of(master_a))["storeWritable"] is False

            await eventually(refuses, timeout=5)

            async def all_delivered() -> bool:
                got = await _delayed_on(pool, [master_a.rpc, master_b.rpc])
                return set(due) <= set(got)

            await eventually(all_delivered, timeout=15, interval=0.2)
            got = await _delayed_on(pool, [master_a.rpc, master_b.rpc])
            late = {k: t[0] - due[k] for k, t in got.items() if t[0] - due[k] > 2_000}
            assert not late, f"late by ms: {late}"
            assert not (await _delayed_on(pool, [master_a.rpc])), "stored on the full master?"
            # space returns: the master writes again and delivers nothing a second time
            (mnt / "filler").unlink()

            async def writable() -> bool:
                return (await status_of(master_a))["storeWritable"] is True

            await eventually(writable, timeout=5)
            await asyncio.sleep(2.0)
            got = await _delayed_on(pool, [master_a.rpc, master_b.rpc])
            twice = {k: len(t) for k, t in got.items() if len(t) > 1}
            assert not twice, f"delivered more than once: {twice}"
        finally:
            await pool.aclose()
            cluster.stop()
