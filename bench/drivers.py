"""One driver per system, each using that system's usual Python client.

The workloads (``workloads.py``) see only this small surface:

- ``open()`` / ``aclose()``: connect a producer and a consumer connection;
- ``create(dest)`` / ``drop(dest)``: a replicated durable destination (our
  topic on the groups' masters, a quorum queue, an R3 file-storage stream);
- ``send(dest, body, timeout_s)``: one durable send, returning once the
  system acknowledged it (our SYNC send, a publisher confirm, a JetStream
  PubAck);
- ``subscribe(dest, group, on_body)``: a consumer that hands each body to
  ``on_body`` and acknowledges it (our offset commit, basic.ack, JetStream
  ack), returning an object with ``aclose()``;
- ``leader(dest)`` / ``kill_leader(index)``: for the failover workload;
  ``pause_leader(index)`` / ``resume_leader(index)``: SIGSTOP / SIGCONT of the
  leader for the pause trial.

Clients: ours (``ha_controller.client.Producer`` / ``PushConsumer``),
aio-pika (RabbitMQ) and nats-py (NATS).  Each connects to its cluster's
nodes in an order that starts with ``prefer``, so that the failover workload
can start with the client attached to the leader it then kills.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from peers import NatsCluster, OursCluster, RabbitCluster

OnBody = Callable[[bytes], None]
log = logging.getLogger("bench.drivers")


class Subscription(Protocol):
    async def aclose(self) -> None: ...


class Driver(Protocol):
    name: str

    async def open(self) -> None: ...
    async def aclose(self) -> None: ...
    async def create(self, dest: str) -> None: ...
    async def drop(self, dest: str) -> None: ...
    async def send(self, dest: str, body: bytes, timeout_s: float) -> None: ...
    async def subscribe(self, dest: str, group: str, on_body: OnBody) -> Subscription: ...
    async def leader(self, dest: str) -> int: ...
    def kill_leader(self, index: int) -> str: ...
    def pause_leader(self, index: int) -> str: ...
    def resume_leader(self, index: int) -> None: ...


# ---- ha-controller -------------------------------------------------------------------------


class _OursSub:
    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer

    async def aclose(self) -> None:
        await self._consumer.aclose()


class OursDriver:
    name = "ha-controller"

    def __init__(
        self,
        cluster: OursCluster,
        prefer: int = 0,
        send_timeout_ms: int = 3000,
        coalesce: int = 64,
    ) -> None:
        self.cluster = cluster
        self.send_timeout_ms = send_timeout_ms
        self.coalesce = coalesce
        self._producer: Any = None
        self._ns: Any = None

    async def open(self) -> None:
        from ha_controller.client import NameserverClient, Producer

        self._ns = NameserverClient([self.cluster.namesrv])
        self._producer = Producer(
            self.cluster.namesrv,
            group="bench-producer",
            send_timeout_ms=self.send_timeout_ms,
            coalesce_max_messages=self.coalesce,
        )
        await self._producer.start()

    async def aclose(self) -> None:
        if self._producer is not None:
            await self._producer.aclose()
        if self._ns is not None:
            await self._ns.aclose()

    async def create(self, dest: str) -> None:
        from ha_controller.protocol.errors import HaError
        from ha_controller.testing import eventually

        await self._ns.create_topic(dest, queues=4)

        async def routed() -> bool:
            with contextlib.suppress(HaError):
                route = await self._ns.route(dest)
                return len(route.broker_datas) == len(self.cluster.groups)
            return False

        await eventually(routed, timeout=20)

    async def drop(self, dest: str) -> None:
        """Topics stay (the client SDK has no delete); each round uses a fresh one."""

    async def send(self, dest: str, body: bytes, timeout_s: float) -> None:
        from ha_controller.client import Message

        # asyncio.timeout, not wait_for: wait_for wraps every send in a task of its own
        # (the peers' clients take the timeout as an argument and start no task either)
        async with asyncio.timeout(timeout_s):
            await self._producer.send(Message(dest, body))

    async def subscribe(self, dest: str, group: str, on_body: OnBody) -> Subscription:
        from ha_controller.client import PushConsumer

        async def listener(message: Any) -> bool:
            on_body(message.body)
            return True

        consumer = PushConsumer(
            self.cluster.namesrv,
            group,
            dest,
            listener,
            request_timeout_ms=self.send_timeout_ms,
            pull_error_backoff_s=0.1,
        )
        await consumer.start()
        return _OursSub(consumer)

    async def leader(self, dest: str) -> int:
        return 0  # the master of broker-a

    async def probe_after_kill(self, dest: str, t_kill_ns: int) -> dict[str, float]:
        """Time until the killed master's group serves a read again (its acting slave)."""
        import time

        from ha_controller.client import MessageQueue, PullConsumer
        from ha_controller.protocol.errors import HaError

        mq = MessageQueue(dest, self.cluster.groups[0], 0)
        # A reader that wants its reads back quickly: short pulls (the route watch
        # moves it to the acting slave; a frozen master would hold a long one).
        async with PullConsumer(
            self.cluster.namesrv, f"{dest}-probe", call_attempts=1, request_timeout_ms=100
        ) as pull:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    await pull.pull(mq, 0, 1, suspend_timeout_ms=0)
                except (HaError, OSError):
                    await asyncio.sleep(0.01)
                    continue
                return {
                    "acting_slave_read_s": (time.perf_counter_ns() - t_kill_ns) / 1e9,
                    "not_active_timeout_s": self.cluster.not_active_timeout_s,
                }
        return {}

    def kill_leader(self, index: int) -> str:
        handle: Any = self.cluster.broker(self.cluster.groups[0], 0)
        handle.kill()
        return f"{self.cluster.groups[0]} master (pid {handle.pid})"

    def pause_leader(self, index: int) -> str:
        handle: Any = self.cluster.broker(self.cluster.groups[0], 0)
        handle.pause()
        return f"{self.cluster.groups[0]} master (pid {handle.pid}, SIGSTOP)"

    def resume_leader(self, index: int) -> None:
        handle: Any = self.cluster.broker(self.cluster.groups[0], 0)
        handle.resume()

    async def switch_leader(self, index: int) -> str:
        """Controller mode: a planned switch of the first group's master to member 1."""
        switch = getattr(self.cluster, "switch", None)
        if switch is None:
            raise ValueError("a planned switch needs a controller-mode cluster")
        took = await switch(self.cluster.groups[0], 1)
        return f"{self.cluster.groups[0]} master to member 1 (hactl group switch, {took:.2f} s)"


# ---- RabbitMQ (aio-pika) ------------------------------------------------------------------------

QUORUM = {"x-queue-type": "quorum"}


class _RabbitSub:
    """A consumer that reconnects to the next node when its connection dies."""

    def __init__(self, driver: RabbitDriver, dest: str, on_body: OnBody, prefetch: int) -> None:
        self._driver = driver
        self._dest = dest
        self._on_body = on_body
        self._prefetch = prefetch
        self._ready = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"rabbit-sub-{dest}")
        self._conn: Any = None

    async def _run(self) -> None:
        import aio_pika

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            self._on_body(message.body)
            await message.ack()

        while True:
            closed = asyncio.Event()
            try:
                self._conn = await self._driver.connect()
                self._conn.close_callbacks.add(lambda *_, ev=closed: ev.set())
                channel = await self._conn.channel()
                await channel.set_qos(prefetch_count=self._prefetch)
                queue = await channel.declare_queue(self._dest, durable=True, arguments=QUORUM)
                await queue.consume(on_message)
                self._ready.set()
                await closed.wait()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("rabbit consumer: %r", exc)
                self._driver.rotate()
                await asyncio.sleep(0.05)
            finally:
                if self._conn is not None and not self._conn.is_closed:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(self._conn.close(), 5)

    async def started(self) -> None:
        await asyncio.wait_for(self._ready.wait(), 30)

    async def aclose(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class RabbitDriver:
    name = "RabbitMQ"

    def __init__(
        self,
        cluster: RabbitCluster,
        prefer: int = 0,
        prefetch: int = 256,
        heartbeat_s: int | None = None,
    ) -> None:
        self.cluster = cluster
        self._index = prefer
        self.prefetch = prefetch
        #: AMQP heartbeat asked of the server (None: the client's default, 60 s)
        self.heartbeat_s = heartbeat_s
        self._conn: Any = None
        self._channel: Any = None
        self._lock = asyncio.Lock()
        self._reopen_channel = False

    def rotate(self) -> None:
        self._index = (self._index + 1) % len(self.cluster.amqp_ports)

    async def connect(self) -> Any:
        """Connect to the current node, else the next ones (1 s timeout each)."""
        import aio_pika

        last: BaseException | None = None
        for _ in range(len(self.cluster.amqp_ports)):
            try:
                url = self.cluster.url(self._index)
                if self.heartbeat_s is not None:
                    url += f"?heartbeat={self.heartbeat_s}"
                return await aio_pika.connect(url, timeout=1.0)
            except Exception as exc:
                last = exc
                self.rotate()
        assert last is not None
        raise last

    async def _publisher(self) -> Any:
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed and self._reopen_channel:
                self._reopen_channel = False
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._channel.close(), 2)
                self._channel = await self._conn.channel(publisher_confirms=True)
            if self._conn is None or self._conn.is_closed or self._channel.is_closed:
                if self._conn is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(self._conn.close(), 2)
                self._conn = await self.connect()
                self._channel = await self._conn.channel(publisher_confirms=True)
            return self._channel

    async def open(self) -> None:
        await self._publisher()

    async def aclose(self) -> None:
        if self._conn is not None and not self._conn.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._conn.close(), 5)

    async def create(self, dest: str) -> None:
        channel = await self._publisher()
        await channel.declare_queue(dest, durable=True, arguments=QUORUM)

    async def drop(self, dest: str) -> None:
        channel = await self._publisher()
        with contextlib.suppress(Exception):
            await channel.queue_delete(dest)

    async def send(self, dest: str, body: bytes, timeout_s: float) -> None:
        import aio_pika

        channel = await self._publisher()
        try:
            await channel.default_exchange.publish(
                aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=dest,
                timeout=timeout_s,
            )
        except aio_pika.exceptions.DeliveryError:
            # A nack: the channel keeps nacking a quorum queue whose leader it
            # lost, even after a new one is elected; publish on a fresh channel.
            self._reopen_channel = True
            raise

    async def subscribe(self, dest: str, group: str, on_body: OnBody) -> Subscription:
        sub = _RabbitSub(self, dest, on_body, self.prefetch)
        await sub.started()
        return sub

    async def leader(self, dest: str) -> int:
        return await asyncio.to_thread(self.cluster.queue_leader, dest)

    def kill_leader(self, index: int) -> str:
        pid = self.cluster.procs[index].pid
        self.cluster.kill9(index)
        return f"{self.cluster.nodes[index]} (quorum queue leader, pid {pid})"

    def pause_leader(self, index: int) -> str:
        self.cluster.procs[index].pause()
        pid = self.cluster.procs[index].pid
        return f"{self.cluster.nodes[index]} (quorum queue leader, pid {pid}, SIGSTOP)"

    def resume_leader(self, index: int) -> None:
        self.cluster.procs[index].resume()


# ---- NATS JetStream (nats-py) ------------------------------------------------------------


class _NatsSub:
    def __init__(self, sub: Any) -> None:
        self._sub = sub

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()


class NatsDriver:
    name = "NATS JetStream"

    def __init__(
        self,
        cluster: NatsCluster,
        prefer: int = 0,
        max_ack_pending: int = 1024,
        ping_interval_s: float | None = None,
    ) -> None:
        self.cluster = cluster
        n = len(cluster.client_ports)
        self.servers = [cluster.url((prefer + i) % n) for i in range(n)]
        self.max_ack_pending = max_ack_pending
        #: client PING period (None: nats-py's default, 2 min); 2 unanswered = dead
        self.ping_interval_s = ping_interval_s
        self._pub: Any = None
        self._sub: Any = None
        self._js: Any = None
        self._sjs: Any = None

    async def _connect(self) -> Any:
        import nats

        async def quiet(exc: Exception) -> None:
            log.debug("nats: %r", exc)

        keepalive: dict[str, Any] = {}
        if self.ping_interval_s is not None:
            keepalive = {"ping_interval": self.ping_interval_s, "max_outstanding_pings": 2}
        return await nats.connect(
            servers=self.servers,
            dont_randomize=True,
            connect_timeout=1,
            reconnect_time_wait=0.1,
            max_reconnect_attempts=-1,
            error_cb=quiet,
            **keepalive,
        )

    async def open(self) -> None:
        self._pub = await self._connect()
        self._sub = await self._connect()
        self._js = self._pub.jetstream()
        self._sjs = self._sub.jetstream()

    async def aclose(self) -> None:
        for nc in (self._pub, self._sub):
            if nc is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(nc.close(), 5)

    async def create(self, dest: str) -> None:
        from nats.js.api import StorageType

        await self._js.add_stream(
            name=dest, subjects=[dest], storage=StorageType.FILE, num_replicas=3
        )

    async def drop(self, dest: str) -> None:
        with contextlib.suppress(Exception):
            await self._js.delete_stream(dest)

    async def send(self, dest: str, body: bytes, timeout_s: float) -> None:
        await self._js.publish(dest, body, timeout=timeout_s)

    async def subscribe(self, dest: str, group: str, on_body: OnBody) -> Subscription:
        from nats.js.api import ConsumerConfig, DeliverPolicy

        async def cb(msg: Any) -> None:
            on_body(msg.data)
            await msg.ack()

        sub = await self._sjs.subscribe(
            dest,
            durable=group,
            cb=cb,
            manual_ack=True,
            deliver_policy=DeliverPolicy.ALL,
            config=ConsumerConfig(max_ack_pending=self.max_ack_pending, ack_wait=30),
        )
        return _NatsSub(sub)

    async def leader(self, dest: str) -> int:
        info = await self._js.stream_info(dest)
        return self.cluster.names.index(info.cluster.leader)

    def kill_leader(self, index: int) -> str:
        pid = self.cluster.procs[index].pid
        self.cluster.kill9(index)
        return f"{self.cluster.names[index]} (stream leader, pid {pid})"

    def pause_leader(self, index: int) -> str:
        self.cluster.procs[index].pause()
        pid = self.cluster.procs[index].pid
        return f"{self.cluster.names[index]} (stream leader, pid {pid}, SIGSTOP)"

    def resume_leader(self, index: int) -> None:
        self.cluster.procs[index].resume()


# ---- the official RocketMQ 5 Python SDK (rocketmq-python-client) -------------------------------


async def _shutdown(client: Any, timeout_s: float = 20.0) -> None:
    """``client.shutdown()`` of the SDK in a daemon thread, waited for at most
    ``timeout_s``: the SDK's PushConsumer can hang in it (its consumption pool waits for
    a busy thread), and a hung call in asyncio's default executor would hold one of its
    few threads and block the interpreter's exit."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def run() -> None:
        with contextlib.suppress(Exception):
            client.shutdown()
        # (a shutdown that outlived the wait may finish after the loop closed)
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))

    threading.Thread(target=run, name="sdk-shutdown", daemon=True).start()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done, timeout_s)


class _SdkSub:
    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer

    async def aclose(self) -> None:
        await _shutdown(self._consumer)


class RmqSdkDriver:
    """The official RocketMQ 5 Python SDK (gRPC) against a gateway: RocketMQ's proxy
    (``RocketMQCluster``) or ours (``GatewayCluster``), the same client for both.

    Sends: ``Producer.send_async`` (the SDK's own future, awaited here); consumer: the
    SDK's ``PushConsumer`` (its listener runs in the SDK's threads and hands each body
    to the event loop).  The cluster gives ``endpoint``, ``create_topic`` and the
    process of each group's master."""

    name = "official RocketMQ SDK"

    def __init__(self, cluster: Any, prefer: int = 0, send_timeout_ms: int = 3000) -> None:
        self.cluster = cluster
        self.send_timeout_s = send_timeout_ms / 1000
        self._producer: Any = None

    def _config(self) -> Any:
        from rocketmq import ClientConfiguration, Credentials

        return ClientConfiguration(
            self.cluster.endpoint, Credentials(), request_timeout=max(1, round(self.send_timeout_s))
        )

    async def open(self) -> None:
        from rocketmq import Producer

        self._producer = Producer(self._config())
        await asyncio.to_thread(self._producer.startup)

    async def aclose(self) -> None:
        if self._producer is not None:
            await _shutdown(self._producer)

    async def create(self, dest: str) -> None:
        await self.cluster.create_topic(dest, queues=4)

    async def drop(self, dest: str) -> None:
        """Topics stay; each round uses a fresh one."""

    async def send(self, dest: str, body: bytes, timeout_s: float) -> None:
        from rocketmq import Message

        msg = Message()
        msg.topic = dest
        msg.body = body
        async with asyncio.timeout(timeout_s):
            await asyncio.wrap_future(self._producer.send_async(msg))

    async def subscribe(self, dest: str, group: str, on_body: OnBody) -> Subscription:
        from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer

        loop = asyncio.get_running_loop()

        class Listener(MessageListener):  # type: ignore[misc]
            def consume(self, message: Any) -> Any:
                loop.call_soon_threadsafe(on_body, message.body)
                return ConsumeResult.SUCCESS

        consumer = PushConsumer(self._config(), group, Listener(), {dest: FilterExpression()})
        await asyncio.to_thread(consumer.startup)
        return _SdkSub(consumer)

    async def leader(self, dest: str) -> int:
        """The index of the first group's master among the cluster's brokers."""
        return int(await self.cluster.master_of(self.cluster.groups[0]))

    def kill_leader(self, index: int) -> str:
        return str(self.cluster.kill(index))

    def pause_leader(self, index: int) -> str:
        return str(self.cluster.pause(index))

    def resume_leader(self, index: int) -> None:
        self.cluster.resume(index)


# ---- Kafka (aiokafka) ------------------------------------------------------------------------


class _KafkaSub:
    def __init__(self, consumer: Any, task: asyncio.Task[None]) -> None:
        self._consumer = consumer
        self._task = task

    async def aclose(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._consumer.stop(), 10)


class KafkaDriver:
    """aiokafka (asyncio, maintained by aio-libs) against ``KafkaCluster``: an idempotent
    producer with ``acks=all`` (each send awaits the leader's write to the in-sync
    replicas, min.insync.replicas=2 of 3), a group consumer committing offsets."""

    name = "Kafka"

    def __init__(self, cluster: Any, prefer: int = 0, send_timeout_ms: int = 3000) -> None:
        self.cluster = cluster
        self.prefer = prefer
        self.send_timeout_ms = send_timeout_ms
        self._producer: Any = None

    async def open(self) -> None:
        from aiokafka import AIOKafkaProducer

        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.cluster.bootstrap_from(self.prefer),
            acks="all",
            enable_idempotence=True,
            request_timeout_ms=max(1000, self.send_timeout_ms),
            retry_backoff_ms=50,
            metadata_max_age_ms=5000,
        )
        await self._producer.start()

    async def aclose(self) -> None:
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._producer.stop(), 10)

    async def _admin(self) -> Any:
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=self.cluster.bootstrap)
        await admin.start()
        return admin

    async def create(self, dest: str) -> None:
        from aiokafka.admin import NewTopic

        admin = await self._admin()
        try:
            await admin.create_topics([NewTopic(dest, num_partitions=4, replication_factor=3)])
        finally:
            await admin.close()

    async def drop(self, dest: str) -> None:
        admin = await self._admin()
        try:
            with contextlib.suppress(Exception):
                await admin.delete_topics([dest])
        finally:
            await admin.close()

    async def send(self, dest: str, body: bytes, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            await self._producer.send_and_wait(dest, body)

    async def subscribe(self, dest: str, group: str, on_body: OnBody) -> Subscription:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            dest,
            bootstrap_servers=self.cluster.bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=True,
            auto_commit_interval_ms=1000,
            request_timeout_ms=max(1000, self.send_timeout_ms * 2),
            metadata_max_age_ms=5000,
        )
        await consumer.start()

        async def run() -> None:
            while True:
                batches = await consumer.getmany(timeout_ms=100, max_records=1000)
                for records in batches.values():
                    for record in records:
                        on_body(record.value)

        task = asyncio.create_task(run(), name=f"kafka-sub-{dest}")
        return _KafkaSub(consumer, task)

    async def leader(self, dest: str) -> int:
        """The node leading partition 0 of ``dest``."""
        admin = await self._admin()
        try:
            [described] = await admin.describe_topics([dest])
        finally:
            await admin.close()
        part = next(p for p in described["partitions"] if p["partition"] == 0)
        return int(part["leader"]) - 1  # node ids are 1..3

    def kill_leader(self, index: int) -> str:
        pid = self.cluster.procs[index].pid
        self.cluster.procs[index].kill9()
        return f"kafka{index + 1} (leader of partition 0, pid {pid})"

    def pause_leader(self, index: int) -> str:
        proc = self.cluster.procs[index]
        proc.pause()
        return f"kafka{index + 1} (leader of partition 0, pid {proc.pid}, SIGSTOP)"

    def resume_leader(self, index: int) -> None:
        self.cluster.procs[index].resume()
