"""The producer: queue selection, retry with endpoint isolation, FIFO by message group.

Behaviour follows the official RocketMQ 5 Java client (reference/rpc_clients.md
B6): at most ``max_attempts`` (3) immediate attempts; a retriable failure
isolates the endpoint and the next attempt goes to a queue of another group;
isolated endpoints are avoided until a heartbeat to them succeeds (or
``isolation_s`` passes); a FIFO message always goes to the queue its message
group hashes to (SipHash-2-4, as Java), retried on that same queue.  Routes
come from a ``RouteCache`` and are refreshed at once on ``NotMaster`` or
``TopicNotFound`` from a broker.

Transactions follow the RocketMQ 5 clients (reference/rpc_clients.md
"Transactions"): a producer built with a ``checker`` can ``begin_transaction()``;
``send(message, transaction=tx)`` stores a half message, and ``tx.commit()`` /
``tx.rollback()`` send END_TRANSACTION to the id-0 address of the group holding
it (the acting slave while its master is away).  A transaction left open is
resolved by the brokers' check: they call the producer back
(CHECK_TRANSACTION_STATE on its own connection) and the checker's answer is
sent as END_TRANSACTION; ``UNKNOWN`` leaves it for the next check.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from typing import Any, Final

from ha_controller.client.admin import NameserverClient
from ha_controller.client.lifecycle import AsyncLifecycle
from ha_controller.client.message import (
    Message,
    MessageQueue,
    ReceivedMessage,
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
from ha_controller.protocol.properties import PROPERTY_TRAN_MSG, PROPERTY_UNIQ_KEY, now_ms
from ha_controller.rpc import ConnectionPool, Dispatcher, RequestContext

__all__ = [
    "EndpointIsolation",
    "Producer",
    "QueueSelector",
    "Transaction",
    "TransactionChecker",
    "TransactionResolution",
    "is_retriable",
]

log = logging.getLogger(__name__)

#: END_TRANSACTION attempts (route refreshed between them).
END_TRANSACTION_ATTEMPTS: Final = 3


class TransactionResolution(enum.Enum):
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


TransactionChecker = Callable[[ReceivedMessage], Awaitable[TransactionResolution]]
"""Asked by the brokers about an open transaction's half message."""


class Transaction:
    """One transaction holding one half message (as the RocketMQ 5 Python client).

    ``async with producer.begin_transaction() as tx``: an exception inside the block
    rolls back a sent half message; leaving the block without ``commit()`` or
    ``rollback()`` leaves the decision to the checker.
    """

    def __init__(self, producer: Producer) -> None:
        self._producer = producer
        self._receipt: SendReceipt | None = None
        self._resolution: TransactionResolution | None = None

    @property
    def receipt(self) -> SendReceipt | None:
        """The half message's receipt, once sent."""
        return self._receipt

    @property
    def message_id(self) -> str | None:
        """The transaction id: the half message's client message id (UNIQ_KEY)."""
        return None if self._receipt is None else self._receipt.uniq_key

    @property
    def resolution(self) -> TransactionResolution | None:
        return self._resolution

    def _add_half(self, receipt: SendReceipt) -> None:
        if self._receipt is not None:
            raise RuntimeError("a transaction holds one message")
        self._receipt = receipt

    def _check_open(self) -> SendReceipt:
        if self._receipt is None:
            raise RuntimeError("no message was sent in this transaction")
        if self._resolution is not None:
            raise RuntimeError(f"transaction already ended ({self._resolution.value})")
        return self._receipt

    async def commit(self) -> None:
        receipt = self._check_open()
        await self._producer._end_transaction(receipt, commit=True)
        self._resolution = TransactionResolution.COMMIT

    async def rollback(self) -> None:
        receipt = self._check_open()
        await self._producer._end_transaction(receipt, commit=False)
        self._resolution = TransactionResolution.ROLLBACK

    async def __aenter__(self) -> Transaction:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None and self._receipt is not None and self._resolution is None:
            try:
                await self.rollback()
            except (HaError, OSError) as err:
                log.warning("rollback of transaction %s failed: %s", self.message_id, err)


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


class Producer(AsyncLifecycle):
    """Sends messages to a topic's writable queues.

    ``async with Producer("127.0.0.1:9876") as producer: await producer.send(msg)``

    ``tls``: the ``ssl.SSLContext`` of every connection, to nameservers and brokers
    (:func:`ha_controller.rpc.tls.client_context`); None = plaintext.
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
        checker: TransactionChecker | None = None,
        tls: ssl.SSLContext | None = None,
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
        self.checker = checker
        dispatcher = Dispatcher()
        dispatcher.add(
            RequestCode.CHECK_TRANSACTION_STATE,
            broker_pb2.CheckTransactionStateRequest,
            self._on_check_transaction,
        )
        self.tls = tls
        self._pool = ConnectionPool(dispatcher=dispatcher, ssl_context=tls)
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
        if self.checker is not None:
            await self.heartbeat()  # brokers learn at once where to send checks

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

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("producer task %s died", task.get_name(), exc_info=task.exception())

    # ---- sending ---------------------------------------------------------------------

    async def send(self, message: Message, transaction: Transaction | None = None) -> SendReceipt:
        """Send one message; raises the last error when every attempt failed.

        With ``transaction`` the message is stored as a half message that
        consumers see only once the transaction commits."""
        if transaction is None:
            receipts = await self._send([message])
            return receipts[0]
        if transaction._producer is not self:
            raise ValueError("the transaction belongs to another producer")
        if transaction.receipt is not None:
            raise RuntimeError("a transaction holds one message")
        if message.is_delayed or message.message_group is not None:
            raise ValueError("a transactional message cannot be delayed or FIFO")
        receipt = (await self._send([message], transactional=True))[0]
        transaction._add_half(receipt)
        return receipt

    def begin_transaction(self) -> Transaction:
        """A new transaction; the producer needs a ``checker`` for orphaned ones."""
        if self.checker is None:
            raise RuntimeError("transactions need a producer built with a checker")
        return Transaction(self)

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

    async def _send(
        self, messages: list[Message], *, transactional: bool = False
    ) -> list[SendReceipt]:
        if not self._started or self._closed:
            raise RuntimeError("producer is not running (use start() or async with)")
        topic = messages[0].topic
        message_group = messages[0].message_group
        uniq_keys = [m.properties.get(PROPERTY_UNIQ_KEY) or new_message_id() for m in messages]
        born_ms = now_ms()
        extra = {PROPERTY_TRAN_MSG: "true"} if transactional else {}
        request = broker_pb2.SendMessageRequest(
            producer_group=self.group,
            topic=topic,
            entries=[
                broker_pb2.SendEntry(
                    body=m.body,
                    properties={**m.wire_properties(uk, self.group), **extra},
                    born_ts_ms=born_ms,
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
                if isinstance(exc, HaError):
                    exc.broker_name = mq.broker_name  # which group refused (drills, logs)
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

    # ---- transactions -------------------------------------------------------------

    async def _end_transaction(
        self,
        receipt: SendReceipt,
        *,
        commit: bool,
        from_check: bool = False,
        addr: str | None = None,
    ) -> None:
        """END_TRANSACTION to ``addr`` (a check's broker), else to the id-0 address of
        the group holding the half message, refreshing the route between attempts."""
        request = broker_pb2.EndTransactionRequest(
            producer_group=self.group,
            topic=receipt.topic,
            msg_id=receipt.msg_id,
            transaction_id=receipt.uniq_key,
            commit=commit,
            from_check=from_check,
            broker_name=receipt.broker_name,
            half_queue_offset=receipt.queue_offset,
        )
        last: BaseException | None = None
        for attempt in range(1, END_TRANSACTION_ATTEMPTS + 1):
            target = addr
            if target is None:
                await self.routes.route(receipt.topic, allow_default=True)
                target = self.routes.broker_addr_for_publish(receipt.broker_name)
            try:
                if target is None:
                    raise BrokerUnavailable(f"group {receipt.broker_name} shows no id 0")
                await self._pool.call(
                    target,
                    RequestCode.END_TRANSACTION,
                    request.SerializeToString(),
                    self.send_timeout_ms,
                )
            except (HaError, OSError) as exc:
                if not is_retriable(exc) or addr is not None:
                    raise
                last = exc
                log.warning(
                    "END_TRANSACTION for %s to %s failed (attempt %d/%d): %s",
                    receipt.uniq_key,
                    target,
                    attempt,
                    END_TRANSACTION_ATTEMPTS,
                    exc,
                )
                await self.routes.refresh_quietly(receipt.topic)
                continue
            return
        assert last is not None
        raise last

    async def _on_check_transaction(
        self, ctx: RequestContext, req: broker_pb2.CheckTransactionStateRequest
    ) -> None:
        """A broker asks about an open transaction: run the checker, answer with
        END_TRANSACTION to that broker (nothing for UNKNOWN)."""
        if self.checker is None or self._closed:
            return
        pb = req.message
        message = ReceivedMessage.from_pb(pb, topic=pb.topic, broker_name=req.broker_name)
        try:
            resolution = await self.checker(message)
        except Exception:
            log.exception("transaction checker failed for %s", req.transaction_id)
            return
        if resolution is TransactionResolution.UNKNOWN:
            return
        receipt = SendReceipt(
            msg_id=pb.msg_id,
            uniq_key=req.transaction_id or message.uniq_key,
            topic=pb.topic,
            broker_name=req.broker_name,
            queue_id=pb.queue_id,
            queue_offset=pb.queue_offset,
        )
        try:
            await self._end_transaction(
                receipt,
                commit=resolution is TransactionResolution.COMMIT,
                from_check=True,
                addr=req.broker_addr or ctx.peer,
            )
        except (HaError, OSError) as exc:
            log.warning("answering the check of %s failed: %s", req.transaction_id, exc)
