"""The producer: queue selection, retry with endpoint isolation, FIFO by message group.

Behaviour follows the official RocketMQ 5 Java client (reference/rpc_clients.md
B6): at most ``max_attempts`` (3) immediate attempts; a retriable failure
isolates the endpoint and the next attempt goes to a queue of another group;
isolated endpoints are avoided until a heartbeat to them succeeds (or
``isolation_s`` passes); a FIFO message always goes to the queue its message
group hashes to (SipHash-2-4, as Java), retried on that same queue.  Routes
come from a ``RouteCache`` and are refreshed at once on ``NotMaster`` or
``TopicNotFound`` from a broker.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections.abc import Callable, Collection, Coroutine, Sequence
from typing import Any

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import (
    Message,
    MessageQueue,
    SendReceipt,
    new_client_id,
    new_message_id,
)
from ha_controller.client.routes import RouteCache, parse_namesrv_addrs
from ha_controller.client.siphash import queue_for_message_group
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    BrokerUnavailable,
    HaError,
    NotMaster,
    RemoteError,
    TopicNotFound,
)
from ha_controller.rpc import ConnectionPool

__all__ = [
    "EndpointIsolation",
    "Producer",
    "QueueSelector",
    "is_retriable",
]

log = logging.getLogger(__name__)


def is_retriable(exc: BaseException) -> bool:
    """Whether a send that failed with ``exc`` may be retried on another queue.

    Retriable errors plus ``TopicNotFound`` from a broker (a stale route; RocketMQ's
    producer retries TOPIC_NOT_EXIST too) and plain socket errors.
    """
    if isinstance(exc, HaError):
        return exc.retriable or isinstance(exc, TopicNotFound)
    return isinstance(exc, OSError)


class EndpointIsolation:
    """Endpoints (broker addresses) that recently failed, each for ``isolation_s``.

    The Java client keeps an endpoint isolated until a heartbeat to it succeeds;
    we do that too and also let the isolation lapse after ``isolation_s``.
    """

    def __init__(self, isolation_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.isolation_s = isolation_s
        self._clock = clock
        self._until: dict[str, float] = {}

    def isolate(self, addr: str) -> None:
        self._until[addr] = self._clock() + self.isolation_s

    def release(self, addr: str) -> None:
        self._until.pop(addr, None)

    def is_isolated(self, addr: str | None) -> bool:
        if addr is None:
            return False
        until = self._until.get(addr)
        if until is None:
            return False
        if self._clock() >= until:
            del self._until[addr]
            return False
        return True

    def isolated(self) -> set[str]:
        return {addr for addr in list(self._until) if self.is_isolated(addr)}


class QueueSelector:
    """Round robin over the publish queues (Java ``PublishingLoadBalancer``).

    Each send takes the next start index (the first one is random); within a
    send, ``pick`` walks the queues from there and prefers, in order: a queue of
    a group not yet tried in this send whose endpoint is not isolated; any
    queue of an untried group; any queue not isolated; the first queue.
    """

    def __init__(self, start: int | None = None) -> None:
        self._index = random.randrange(1 << 16) if start is None else start

    def next_start(self) -> int:
        index = self._index
        self._index += 1
        return index

    @staticmethod
    def pick(
        queues: Sequence[MessageQueue],
        start: int,
        *,
        isolated: Callable[[MessageQueue], bool] = lambda mq: False,
        tried: Collection[str] = (),
    ) -> MessageQueue:
        if not queues:
            raise ValueError("no queue to pick from")
        n = len(queues)
        ordered = [queues[(start + i) % n] for i in range(n)]
        rules: list[Callable[[MessageQueue], bool]] = [
            lambda mq: mq.broker_name not in tried and not isolated(mq),
            lambda mq: mq.broker_name not in tried,
            lambda mq: not isolated(mq),
        ]
        for rule in rules:
            for mq in ordered:
                if rule(mq):
                    return mq
        return ordered[0]

    @staticmethod
    def for_message_group(queues: Sequence[MessageQueue], message_group: str) -> MessageQueue:
        """The queue of a FIFO message group: ``queues[siphash(group) mod n]``."""
        if not queues:
            raise ValueError("no queue to pick from")
        return queues[queue_for_message_group(message_group, len(queues))]


class Producer:
    """Sends messages to a topic's writable queues.

    ``async with Producer("127.0.0.1:9876") as producer: await producer.send(msg)``
    """

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str = "DEFAULT_PRODUCER",
        *,
        max_attempts: int = 3,
        send_timeout_ms: int = 3000,
        isolation_s: float = 30.0,
        topics: Sequence[str] = (),
        heartbeat_interval_s: float = 10.0,
        client_id: str | None = None,
        route_watch: bool = True,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if send_timeout_ms <= 0:
            raise ValueError(f"send_timeout_ms must be positive, got {send_timeout_ms}")
        self.group = group
        self.max_attempts = max_attempts
        self.send_timeout_ms = send_timeout_ms
        self.client_id = client_id or new_client_id()
        self.heartbeat_interval_s = heartbeat_interval_s
        self._topics = list(topics)
        self._pool = ConnectionPool()
        self._nameserver = NameserverClient(parse_namesrv_addrs(namesrv_addrs), self._pool)
        self.routes = RouteCache(self._nameserver, watch=route_watch)
        self.isolation = EndpointIsolation(isolation_s)
        self._selector = QueueSelector()
        self._born_host = socket.gethostname()
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False
        self._closed = False

    # ---- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Fetch the routes of ``topics`` (failing if one cannot be had) and start heartbeats."""
        if self._closed:
            raise RuntimeError("producer is closed")
        if self._started:
            return
        for topic in self._topics:
            await self.routes.route(topic, allow_default=True)
        self._spawn(self._heartbeat_loop(), "producer-heartbeat")
        self._started = True

    async def aclose(self) -> None:
        """Stop heartbeats and route watches and close connections; idempotent."""
        if self._closed:
            return
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        await self.routes.aclose()
        await self._pool.aclose()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("producer task %s died", task.get_name(), exc_info=task.exception())

    # ---- sending ---------------------------------------------------------------------

    async def send(self, message: Message) -> SendReceipt:
        """Send one message; raises the last error when every attempt failed."""
        receipts = await self._send([message])
        return receipts[0]

    async def send_batch(self, messages: Sequence[Message]) -> list[SendReceipt]:
        """Send messages of one topic (and one message group, if any) to one queue."""
        if not messages:
            return []
        topics = {m.topic for m in messages}
        if len(topics) != 1:
            raise ValueError(f"a batch must have one topic, got {sorted(topics)}")
        groups = {m.message_group for m in messages}
        if len(groups) != 1:
            raise ValueError("a batch must have one message group (or none)")
        return await self._send(list(messages))

    async def _send(self, messages: list[Message]) -> list[SendReceipt]:
        if not self._started or self._closed:
            raise RuntimeError("producer is not running (use start() or async with)")
        topic = messages[0].topic
        message_group = messages[0].message_group
        uniq_keys = [m.properties.get("UNIQ_KEY") or new_message_id() for m in messages]
        now_ms = int(time.time() * 1000)
        request = broker_pb2.SendMessageRequest(
            producer_group=self.group,
            topic=topic,
            entries=[
                broker_pb2.SendEntry(
                    body=m.body,
                    properties=m.wire_properties(uk, self.group),
                    born_ts_ms=now_ms,
                )
                for m, uk in zip(messages, uniq_keys, strict=True)
            ],
            born_host=self._born_host,
        )
        start = self._selector.next_start()
        tried: set[str] = set()
        fifo_queue: MessageQueue | None = None
        last: BaseException | None = None
        for attempt in range(1, self.max_attempts + 1):
            queues = await self._publish_queues(topic)
            if fifo_queue is None and message_group is not None:
                fifo_queue = QueueSelector.for_message_group(queues, message_group)
            mq = fifo_queue or QueueSelector.pick(
                queues,
                start,
                isolated=lambda q: self.isolation.is_isolated(
                    self.routes.broker_addr_for_publish(q.broker_name)
                ),
                tried=tried,
            )
            addr = self.routes.broker_addr_for_publish(mq.broker_name)
            try:
                if addr is None:
                    raise NotMaster(f"group {mq.broker_name} has no master for {topic}")
                request.queue_id = mq.queue_id
                response = await self._pool.call_pb(
                    addr,
                    RequestCode.SEND_MESSAGE,
                    request,
                    broker_pb2.SendMessageResponse,
                    self.send_timeout_ms,
                )
            except (HaError, OSError) as exc:
                if not is_retriable(exc):
                    raise
                last = exc
                tried.add(mq.broker_name)
                if addr is not None:
                    self.isolation.isolate(addr)
                log.warning(
                    "send to %s (%s) failed, attempt %d/%d: %s",
                    mq,
                    addr,
                    attempt,
                    self.max_attempts,
                    exc,
                )
                if isinstance(exc, NotMaster | TopicNotFound):
                    await self.routes.refresh_quietly(topic)
                continue
            if addr is not None:
                self.isolation.release(addr)
            return self._receipts(messages, uniq_keys, mq, response)
        assert last is not None
        raise last

    async def _publish_queues(self, topic: str) -> list[MessageQueue]:
        await self.routes.route(topic, allow_default=True)
        queues = self.routes.publish_queues(topic)
        if not queues:
            await self.routes.refresh_quietly(topic)
            queues = self.routes.publish_queues(topic)
        if not queues:
            raise BrokerUnavailable(f"no writable queue for topic {topic} (no group has a master)")
        return queues

    @staticmethod
    def _receipts(
        messages: list[Message],
        uniq_keys: list[str],
        mq: MessageQueue,
        response: broker_pb2.SendMessageResponse,
    ) -> list[SendReceipt]:
        if len(response.results) != len(messages):
            raise RemoteError(
                f"broker {mq.broker_name} answered {len(response.results)} results "
                f"for {len(messages)} messages"
            )
        broker_name = response.broker_name or mq.broker_name
        return [
            SendReceipt(
                msg_id=r.msg_id,
                uniq_key=r.uniq_key or uk,
                topic=mq.topic,
                broker_name=broker_name,
                queue_id=r.queue_id,
                queue_offset=r.queue_offset,
                keys=tuple(m.keys),
            )
            for m, uk, r in zip(messages, uniq_keys, response.results, strict=True)
        ]

    # ---- heartbeat ------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            await self.heartbeat()

    async def heartbeat(self) -> None:
        """HEART_BEAT to every known master; a success ends that endpoint's isolation."""
        body = broker_pb2.ClientHeartbeat(
            client_id=self.client_id, producer_groups=[self.group]
        ).SerializeToString()
        for broker in self.routes.brokers():
            addr = broker.master_addr
            if addr is None:
                continue
            try:
                await self._pool.call(addr, RequestCode.HEART_BEAT, body, self.send_timeout_ms)
            except (HaError, OSError) as exc:
                log.debug("heartbeat to %s failed: %s", addr, exc)
                continue
            self.isolation.release(addr)
