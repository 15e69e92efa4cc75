"""Power loss of a whole group with the stores on hac-lazyfs (what was not synced is
gone): what ``flush_mode = "sync"`` promises about metadata, and what an asynchronous
power loss may take (its unsynced tail) and may not (the messages acknowledged after).

Each test skips with the reason where the FUSE layer cannot run (root, /dev/fuse,
``make tools``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker_agent.metadata.offsets import ConsumerOffsetManager
from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message, MessageQueue, ReceivedMessage
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer, PullStatus
from ha_controller.client.push_consumer import PushConsumer
from ha_controller.client.simple_consumer import SimpleConsumer
from ha_controller.drills.lazyfs import LazyMount, lazyfs_available
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import Cluster, eventually, run_cluster

GROUP_NAME = "broker-a"
TOPIC = "Durable"
CONSUMERS = "durable-consumers"
#: the periodic flush never runs within a test: what survives is what a commit synced
NO_PERIODIC_FLUSH = {"HAC_FLUSH_MODE": "sync", "HAC_FLUSH_INTERVAL_MS": "600000"}
#: async, and the periodic flush never runs within a test: what was written since the
#: last orderly stop is the unsynced tail a power loss takes
ASYNC_NO_FLUSH = {"HAC_FLUSH_MODE": "async", "HAC_FLUSH_INTERVAL_MS": "600000"}


class PoweredCluster:
    """A cluster whose brokers' stores are lazyfs mounts under ``workdir/store``."""

    def __init__(self, workdir: Path, replicas: int, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.ids = [*range(1, replicas), 0]  # slaves first, as power comes back
        self.mounts = {
            bid: LazyMount(
                workdir / "backing" / f"{GROUP_NAME}-{bid}",
                workdir / "store" / f"{GROUP_NAME}-{bid}",
                workdir / f"lazyfs-{bid}.log",
            )
            for bid in self.ids
        }
        for mount in self.mounts.values():
            mount.mount()
        self.cluster: Cluster = run_cluster((GROUP_NAME,), replicas, workdir=workdir, env=env)

    def store(self, bid: int) -> Path:
        return self.workdir / "store" / f"{GROUP_NAME}-{bid}"

    def power_cycle(self, while_off: Callable[[], None] | None = None) -> None:
        """kill -9 every broker of the group, drop what they had not synced, start them
        again (slaves first); ``while_off`` runs before they start."""
        for bid in self.ids:
            self.cluster.broker(GROUP_NAME, bid).kill()
        for mount in self.mounts.values():
            mount.power_cut()
        for mount in self.mounts.values():
            mount.mount()
        if while_off is not None:
            while_off()
        for bid in self.ids:
            self.cluster.restart(GROUP_NAME, bid)

    def restart_orderly(self) -> None:
        """Stop every broker of the group (each writes its tables), start them again."""
        for bid in reversed(self.ids):
            self.cluster.broker(GROUP_NAME, bid).stop()
        for bid in self.ids:
            self.cluster.restart(GROUP_NAME, bid)

    def stop(self) -> None:
        self.cluster.stop()
        for mount in self.mounts.values():
            mount.unmount()


@pytest.fixture
def powered(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[PoweredCluster]:
    reason = lazyfs_available()
    if reason is not None:
        pytest.skip(f"power loss: {reason}")
    replicas, env = request.param
    group = PoweredCluster(tmp_path, replicas, env)
    try:
        yield group
    finally:
        group.stop()


async def commit_all(pull: PullConsumer, queues: list[MessageQueue], upto: int) -> None:
    """Acknowledged commits of offsets up to ``upto``, alternating between the queues."""
    for step in range(1, upto + 1):
        await pull.commit(queues[step % len(queues)], step)


async def slave_offsets(
    cluster: Cluster, pool: ConnectionPool, slaves: list[int], mq: MessageQueue
) -> list[int]:
    """What each slave's table holds for ``mq``."""
    request = broker_pb2.ConsumerOffsetRequest(
        consumer_group=CONSUMERS, topic=mq.topic, queue_id=mq.queue_id
    )
    return [
        (
            await pool.call_pb(
                cluster.broker(GROUP_NAME, bid).rpc,
                RequestCode.QUERY_CONSUMER_OFFSET,
                request,
                broker_pb2.OffsetResponse,
                2000,
            )
        ).offset
        for bid in slaves
    ]


@pytest.mark.parametrize("powered", [(1, NO_PERIODIC_FLUSH), (3, NO_PERIODIC_FLUSH)], indirect=True)
async def test_an_acknowledged_offset_commit_survives_a_power_loss(
    powered: PoweredCluster,
) -> None:
    """Every broker of the group loses power after 40 acknowledged commits, none of which a
    periodic flush wrote: each comes back.  The slaves hold an older table on disk (an
    orderly restart wrote it after the first 20), which the master's pre-online must not
    take over its own."""
    cluster = powered.cluster
    await cluster.wait_ready()
    async with NameserverClient([cluster.namesrv]) as ns:
        await eventually(lambda: ns.create_topic(TOPIC, queues=2), timeout=15)
    async with Producer(cluster.namesrv) as producer:
        await eventually(lambda: producer.send(Message(TOPIC, b"m")), timeout=20)
        for _ in range(89):  # the offsets committed lie within the queues (a broker
            await producer.send(Message(TOPIC, b"m"))  # corrects those past the end)
    queues = [MessageQueue(TOPIC, GROUP_NAME, q) for q in range(2)]
    async with PullConsumer(cluster.namesrv, CONSUMERS) as pull, ConnectionPool() as pool:
        assert min([await pull.max_offset(mq) for mq in queues]) >= 40
        await commit_all(pull, queues, 20)
        slaves = [bid for bid in powered.ids if bid != 0]

        async def slaves_have_them() -> bool:
            return all(o == 19 for o in await slave_offsets(cluster, pool, slaves, queues[1]))

        await eventually(slaves_have_them, timeout=15)
    powered.restart_orderly()
    await cluster.wait_ready()
    async with PullConsumer(cluster.namesrv, CONSUMERS) as pull:
        await commit_all(pull, queues, 40)
        assert [await pull.committed_offset(mq) for mq in queues] == [40, 39]

    powered.power_cycle()
    await cluster.wait_ready()
    async with PullConsumer(cluster.namesrv, CONSUMERS) as pull:
        await eventually(lambda: pull.committed_offset(queues[0]), timeout=20)  # it serves
        assert [await pull.committed_offset(mq) for mq in queues] == [40, 39]


async def read_from(pull: PullConsumer, mq: MessageQueue, offset: int) -> list[ReceivedMessage]:
    """What a pull consumer that holds ``offset`` reads, following the broker's
    ``next_begin_offset`` (as every client does on OFFSET_ILLEGAL), until nothing is new."""
    out: list[ReceivedMessage] = []
    for _ in range(20):
        res = await pull.pull(mq, offset, max_msgs=32, suspend_timeout_ms=0)
        out.extend(res.messages)
        if res.status not in (PullStatus.FOUND, PullStatus.OFFSET_ILLEGAL):
            break
        offset = res.next_begin_offset
    return out


@pytest.mark.parametrize("powered", [(1, ASYNC_NO_FLUSH), (3, ASYNC_NO_FLUSH)], indirect=True)
async def test_messages_acknowledged_after_an_async_power_loss_reach_the_consumers(
    powered: PoweredCluster,
) -> None:
    """Ten messages synced (an orderly restart), ten more read by a push group and a pull
    consumer, then a power loss of the whole group with ``flush_mode = "async"``: the
    second ten are the unsynced tail, gone, and the queue ends at 10 again.  The push
    group's committed offset (20) is on disk (the periodic flush wrote the offset table
    after the commit log: the window a power loss may hit), the pull consumer holds 20
    itself.  Messages acknowledged after the power came back take queue offsets from
    10 on, which both had read past: each must still reach both, a pull consumer that
    asks at 20 only once the queue refilled past it too."""
    cluster = powered.cluster
    await cluster.wait_ready()
    async with NameserverClient([cluster.namesrv]) as ns:
        await eventually(lambda: ns.create_topic(TOPIC, queues=1), timeout=15)
    mq = MessageQueue(TOPIC, GROUP_NAME, 0)
    received: dict[str, int] = {}

    async def listener(m: ReceivedMessage) -> bool:
        received[m.key] = received.get(m.key, 0) + 1
        return True

    def push_group() -> PushConsumer:
        return PushConsumer(cluster.namesrv, "push-g", TOPIC, listener, commit_interval_s=0.2)

    async def send(producer: Producer, prefix: str, n: int) -> list[str]:
        keys = [f"{prefix}-{i}" for i in range(n)]
        for key in keys:
            message = Message(TOPIC, b"m", keys=(key,))
            await eventually(lambda: producer.send(message), 20)  # noqa: B023 (awaited here)
        return keys

    async with (
        Producer(cluster.namesrv) as producer,
        PullConsumer(cluster.namesrv, "pull-g") as pull,
    ):
        before = await send(producer, "before", 10)
        async with push_group():
            await eventually(lambda: all(k in received for k in before), timeout=15)
    powered.restart_orderly()
    await cluster.wait_ready()

    def offsets_synced_ahead() -> None:
        table = ConsumerOffsetManager(powered.store(0) / "consumer_offsets.json")
        table.load()
        table.commit("push-g", TOPIC, 0, 20)
        table.persist()

    # ``keeper`` reads the tail and goes on through the power loss
    async with PullConsumer(cluster.namesrv, "pull-keeper") as keeper:
        async with Producer(cluster.namesrv) as producer:
            tail = await send(producer, "tail", 10)
            assert {m.key for m in await read_from(keeper, mq, 10)} == set(tail)
            async with push_group():
                await eventually(lambda: all(k in received for k in tail), timeout=15)
            assert await keeper.max_offset(mq) == 20

        powered.power_cycle(offsets_synced_ahead)
        await cluster.wait_ready()
        async with (
            Producer(cluster.namesrv) as producer,
            PullConsumer(cluster.namesrv, "pull-g") as pull,
        ):
            await eventually(lambda: pull.max_offset(mq), timeout=20)  # it serves
            assert await pull.max_offset(mq) == 10, "the unsynced tail was not lost"
            after = await send(producer, "after", 5)
            assert await pull.max_offset(mq) == 15
            # a pull consumer that holds offset 20, past the queue's end
            assert {m.key for m in await read_from(pull, mq, 20)} == set(after)
            # the queue refills past 20 before ``keeper`` asks there
            after += await send(producer, "later", 7)
            assert {m.key for m in await read_from(keeper, mq, 20)} == set(after)
    async with push_group():
        await eventually(lambda: all(k in received for k in after), timeout=10)


async def create_topic(cluster: Cluster, topic: str) -> None:
    async with NameserverClient([cluster.namesrv]) as ns:
        await eventually(lambda: ns.create_topic(topic, queues=1), timeout=15)


@pytest.mark.parametrize("powered", [(1, NO_PERIODIC_FLUSH), (3, NO_PERIODIC_FLUSH)], indirect=True)
async def test_an_acknowledged_pop_is_not_delivered_again_after_a_power_loss(
    powered: PoweredCluster,
) -> None:
    """Ten messages popped and acked with ``flush_mode = "sync"``, then a power loss of the
    whole group before any periodic write: none comes again (a probe sent after the power
    came back is popped first)."""
    cluster = powered.cluster
    await cluster.wait_ready()
    await create_topic(cluster, TOPIC)
    async with Producer(cluster.namesrv) as producer:
        await eventually(lambda: producer.send(Message(TOPIC, b"m", keys=("m-0",))), timeout=20)
        for i in range(1, 10):
            await producer.send(Message(TOPIC, b"m", keys=(f"m-{i}",)))
    async with SimpleConsumer(cluster.namesrv, "pop-g", [TOPIC], 60) as pop:
        got: list[ReceivedMessage] = []
        while len(got) < 10:
            got += await pop.receive(16, wait_s=2)
        for m in got:
            await pop.ack(m)
    powered.power_cycle()
    await cluster.wait_ready()
    async with Producer(cluster.namesrv) as producer:
        await eventually(lambda: producer.send(Message(TOPIC, b"p", keys=("probe",))), 20)
    async with SimpleConsumer(cluster.namesrv, "pop-g", [TOPIC], 60) as pop:
        again: list[str] = []

        async def probe_popped() -> bool:
            for m in await pop.receive(16, wait_s=1):
                again.append(m.key)
                await pop.ack(m)
            return "probe" in again

        await eventually(probe_popped, timeout=20)
        assert again == ["probe"], "acknowledged POP messages came again"


def delayed(key: str, kind: str, due_ms: int) -> Message:
    """A message due at ``due_ms``: of delay level 1 (one second after it is stored),
    or a timer message."""
    if kind == "delay":
        return Message(TOPIC, b"d", keys=(key,), delay_level=1)
    return Message(TOPIC, b"t", keys=(key,), deliver_ts_ms=due_ms)


@pytest.mark.parametrize("kind", ["delay", "timer"])
@pytest.mark.parametrize("powered", [(1, NO_PERIODIC_FLUSH), (3, NO_PERIODIC_FLUSH)], indirect=True)
async def test_a_delivered_delayed_message_is_not_delivered_again_after_a_power_loss(
    powered: PoweredCluster, kind: str
) -> None:
    """Two delay-level (or timer) messages due together, delivered with ``flush_mode =
    "sync"``, then a power loss of the whole group as soon as the second is delivered:
    the first is not delivered again (the level, or the timer, went on to the second
    only once the first's progress was on disk; the second's may be delivered again:
    its progress is written just after it is delivered).  A probe of the same kind sent
    after the power came back is delivered once the level has been read again."""
    cluster = powered.cluster
    await cluster.wait_ready()
    await create_topic(cluster, TOPIC)
    mq = MessageQueue(TOPIC, GROUP_NAME, 0)
    async with Producer(cluster.namesrv) as producer, PullConsumer(cluster.namesrv, "g") as pull:
        due = int(time.time() * 1000) + 1500
        await eventually(lambda: producer.send(delayed("first", kind, due)), timeout=20)
        await producer.send(delayed("second", kind, due))

        async def both_delivered() -> bool:
            return await pull.max_offset(mq) == 2

        await eventually(both_delivered, timeout=10)
    powered.power_cycle()
    await cluster.wait_ready()
    async with Producer(cluster.namesrv) as producer, PullConsumer(cluster.namesrv, "g") as pull:
        probe = delayed("probe", kind, int(time.time() * 1000) + 1000)
        await eventually(lambda: producer.send(probe), timeout=20)

        async def probe_delivered() -> list[str]:
            keys = [m.key for m in await read_from(pull, mq, 0)]
            return keys if "probe" in keys else []

        keys = await eventually(probe_delivered, timeout=20)
        assert keys.count("first") == 1, f"delivered again after the power loss: {keys}"
