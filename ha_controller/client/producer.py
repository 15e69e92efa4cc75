"""The producer: queue selection, retry with endpoint isolation, FIFO by message group.

Behaviour follows the official RocketMQ 5 Java client: at most ``max_attempts`` (3)
immediate attempts; a retriable failure isolates the endpoint and the next attempt
goes to a queue of another group; isolated endpoints are avoided until a heartbeat to
them succeeds (or ``isolation_s`` passes); a FIFO message always goes to the queue its
message group hashes to (SipHash-2-4, as Java), retried on that same queue.  Routes
come from a ``RouteCache`` and are refreshed at once on ``NotMaster`` or
``TopicNotFound`` from a broker.

Transactions follow the RocketMQ 5 clients: a producer built with a ``checker`` can
``begin_transaction()``; ``send(message, transaction=tx)`` stores a half message, and
``tx.commit()`` / ``tx.rollback()`` send END_TRANSACTION to the id-0 address of the
group holding it (the acting slave while its master is away).  A transaction left open
is resolved by the brokers' check: they call the producer back
(CHECK_TRANSACTION_STATE on its own connection) and the checker's answer is sent as
END_TRANSACTION; ``UNKNOWN`` leaves it for the next check.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Collection, Coroutine, Sequence
from typing import Any, Final

from ha_controller.acl import Credentials
from ha_controller.client.admin import NameserverClient
from ha_controller.client.lifecycle import AsyncLifecycle
from ha_controller.client.message import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Message,
    MessageQueue,
    ReceivedMessage,
    SendReceipt,
    check_message,
    check_size,
    message_size,
    new_client_id,
    new_message_id,
)
from ha_controller.client.routes import RouteCache, addr_for_publish, parse_namesrv_addrs
from ha_controller.client.send_policy import (
    AdaptiveTimeout,
    EndpointIsolation,
    InFlightSends,
    MasterMoved,
    QueueSelector,
    is_retriable,
)
from ha_controller.client.transaction import Transaction, TransactionChecker, TransactionResolution
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
from ha_controller.protocol.validation import SYSTEM_PROPERTIES
from ha_controller.routing import TopicRouteData
from ha_controller.rpc import ConnectionPool, Dispatcher, RequestContext
from ha_controller.rpc.limits import RpcLimits

__all__ = ["Producer"]

log = logging.getLogger(__name__)

#: END_TRANSACTION attempts (route refreshed between them).
END_TRANSACTION_ATTEMPTS: Final = 3


class Producer(AsyncLifecycle):
    """Sends messages to a topic's writable queues.

    ``async with Producer("127.0.0.1:9876") as producer: await producer.send(msg)``

    ``tls``: the ``ssl.SSLContext`` of every connection, to nameservers and brokers
    (:func:`ha_controller.rpc.tls.client_context`); None = plaintext.

    ``adaptive_timeout``: how long an attempt waits for a broker that has been
    fast so far when another group could take the message instead
    (:class:`AdaptiveTimeout`; by default 5 x its recent p99 RTT, at least
    200 ms).  A timed-out attempt isolates the endpoint and the next attempt
    goes to another group, so a frozen master costs a send a fraction of a
    second, not ``send_timeout_ms``.  The last attempt, a FIFO send, and an
    attempt with no other group to go to always get ``send_timeout_ms``.

    Concurrent plain sends coalesce: the ``send()`` calls of one topic made in the
    same event-loop tick (up to ``coalesce_max_messages`` messages and
    ``coalesce_max_bytes`` of bodies) travel as one SEND_MESSAGE request, and each
    caller gets its own receipt once the broker stored them all with the copies the
    group requires.  Nothing waits for company: a send alone in its tick leaves at
    the end of that tick, so a low rate adds no latency.  FIFO, delayed and
    transactional messages, and ``send_batch``, are never merged; a batch that fails
    fails (or is retried) for every caller in it, as their own send would have.
    ``coalesce_max_messages=1`` turns coalescing off.

    ``fifo_keep_queue``: a message group is hashed over the queues of every group that
    writes now or has only lost its master (:func:`~ha_controller.client.routes.fifo_queues_of`),
    so it keeps its queue through a failover: while that group has no writable master its
    sends fail (``NotMaster``, nothing stored) and the group's order holds.  False hashes
    over the writable queues only, as RocketMQ's clients do: the group's sends go on, to
    another group's queue, and a consumer may read them before older messages of the
    group still waiting on the first queue.

    In controller mode a send in flight to a group's master ends as soon as the route
    shows that group under a newer epoch with another master, and goes to the new one
    (:class:`InFlightSends`): a frozen master does not hold it until its timeout.
    ``rpc_limits``: the connections' bounds and liveness checks
    (:class:`~ha_controller.rpc.limits.RpcLimits`; its defaults when None).
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
        adaptive_timeout: AdaptiveTimeout | None = None,
        credentials: Credentials | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        coalesce_max_messages: int = 64,
        coalesce_max_bytes: int = 1024 * 1024,
        fifo_keep_queue: bool = True,
        rpc_limits: RpcLimits | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if send_timeout_ms <= 0:
            raise ValueError(f"send_timeout_ms must be positive, got {send_timeout_ms}")
        if coalesce_max_messages < 1 or coalesce_max_bytes < 1:
            raise ValueError(
                "coalesce_max_messages and coalesce_max_bytes must be >= 1, got "
                f"{coalesce_max_messages} and {coalesce_max_bytes}"
            )
        self.coalesce_max_messages = coalesce_max_messages
        self.fifo_keep_queue = fifo_keep_queue
        self.coalesce_max_bytes = coalesce_max_bytes
        #: plain sends waiting for the end of this event-loop tick, by topic
        self._coalescing: dict[str, list[tuple[Message, int, asyncio.Future[SendReceipt]]]] = {}
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
        #: the ACL user every request is signed as (None: anonymous)
        self.credentials = credentials
        #: a message (batch) larger than this is refused before anything is sent
        self.max_message_bytes = max_message_bytes
        #: property names a message may not set: the system's, except for the SDK's own
        #: senders (a dead-letter copy carries ORIGIN_* as the broker's send-back does)
        self.reserved_properties: Collection[str] = SYSTEM_PROPERTIES
        self._pool = ConnectionPool(
            dispatcher=dispatcher,
            limits=rpc_limits,
            ssl_context=tls,
            signer=credentials.sign if credentials is not None else None,
        )
        self._nameserver = NameserverClient(parse_namesrv_addrs(namesrv_addrs), self._pool)
        self.routes = RouteCache(self._nameserver, watch=route_watch, owner=f"producer {group}")
        #: controller mode: sends in flight per group, ended when a newer epoch shows
        self._in_flight = InFlightSends()
        self.routes.on_change(self._on_route)
        self.isolation = EndpointIsolation(isolation_s)
        #: per-attempt timeouts from observed RTTs; used only when the attempt has
        #: another group to fall back on (else the whole ``send_timeout_ms``)
        self.adaptive_timeout = adaptive_timeout or AdaptiveTimeout()
        self._groups_of: tuple[list[MessageQueue], frozenset[str]] = ([], frozenset())
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
            if (
                self.coalesce_max_messages > 1
                and message.message_group is None
                and not message.is_delayed
                and message.priority is None  # its level picks its queue: sent alone
            ):
                return await self._send_coalesced(message)
            receipts = await self._send([message])
            return receipts[0]
        if not transaction.ended_by(self._end_transaction):
            raise ValueError("the transaction belongs to another producer")
        if transaction.receipt is not None:
            raise RuntimeError("a transaction holds one message")
        if message.is_delayed or message.message_group is not None or message.priority is not None:
            raise ValueError("a transactional message cannot be delayed, FIFO or a priority one")
        receipt = (await self._send([message], transactional=True))[0]
        transaction._add_half(receipt)
        return receipt

    def _send_coalesced(self, message: Message) -> asyncio.Future[SendReceipt]:
        """Queue ``message`` for the batch of its topic that leaves at the end of this tick."""
        if not self._started or self._closed:
            raise RuntimeError("producer is not running (use start() or async with)")
        check_message(message, self.max_message_bytes, reserved=self.reserved_properties)
        size = message_size(message)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[SendReceipt] = loop.create_future()
        pending = self._coalescing.get(message.topic)
        if pending is None:
            pending = self._coalescing[message.topic] = []
            loop.call_soon(self._flush_coalesced, message.topic)
        pending.append((message, size, fut))
        return fut

    def _flush_coalesced(self, topic: str) -> None:
        pending = self._coalescing.pop(topic, [])
        limit = min(self.coalesce_max_bytes, self.max_message_bytes)
        batch: list[tuple[Message, asyncio.Future[SendReceipt]]] = []
        total = 0
        for message, size, fut in pending:
            if fut.done():  # the caller gave up (cancelled) before it left
                continue
            if batch and (len(batch) >= self.coalesce_max_messages or total + size > limit):
                self._spawn(self._send_for(batch), "producer-send")
                batch, total = [], 0
            batch.append((message, fut))
            total += size
        if batch:
            self._spawn(self._send_for(batch), "producer-send")

    async def _send_for(self, batch: list[tuple[Message, asyncio.Future[SendReceipt]]]) -> None:
        """Send a coalesced batch; each caller's future gets its receipt or the error."""
        try:
            receipts = await self._send([m for m, _ in batch])
        except asyncio.CancelledError:
            for _, fut in batch:
                fut.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - not swallowed: every caller gets it
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for (_, fut), receipt in zip(batch, receipts, strict=True):
            if not fut.done():
                fut.set_result(receipt)

    def begin_transaction(self) -> Transaction:
        """A new transaction; the producer needs a ``checker`` for orphaned ones."""
        if self.checker is None:
            raise RuntimeError("transactions need a producer built with a checker")
        return Transaction(self._end_transaction)

    async def send_batch(self, messages: Sequence[Message]) -> list[SendReceipt]:
        """Send messages of one topic (and one message group or priority, if any) to one
        queue."""
        if not messages:
            return []
        topics = {m.topic for m in messages}
        if len(topics) != 1:
            raise ValueError(f"a batch must have one topic, got {sorted(topics)}")
        groups = {m.message_group for m in messages}
        if len(groups) != 1:
            raise ValueError("a batch must have one message group (or none)")
        if len({m.priority for m in messages}) != 1:  # one send is stored in one queue
            raise ValueError("a batch must have one priority (or none)")
        return await self._send(list(messages))

    async def _send(
        self, messages: list[Message], *, transactional: bool = False
    ) -> list[SendReceipt]:
        if not self._started or self._closed:
            raise RuntimeError("producer is not running (use start() or async with)")
        now = now_ms()
        for m in messages:
            check_message(m, self.max_message_bytes, now, reserved=self.reserved_properties)
        check_size(messages, self.max_message_bytes)
        topic = messages[0].topic
        message_group = messages[0].message_group
        group = self.group
        born_ms = now_ms()
        uniq_keys: list[str] = []
        entries: list[broker_pb2.SendEntry] = []
        for m in messages:
            uk = m.properties.get(PROPERTY_UNIQ_KEY) or new_message_id()
            uniq_keys.append(uk)
            props = m.wire_properties(uk, group)
            if transactional:
                props[PROPERTY_TRAN_MSG] = "true"
            entries.append(broker_pb2.SendEntry(body=m.body, properties=props, born_ts_ms=born_ms))
        request = broker_pb2.SendMessageRequest(
            producer_group=group, topic=topic, entries=entries, born_host=self._born_host
        )
        start = self._selector.next_start()
        tried: set[str] = set()
        fifo_queue: MessageQueue | None = None
        last: BaseException | None = None
        for attempt in range(1, self.max_attempts + 1):
            queues = await self._publish_queues(topic)
            if fifo_queue is None and message_group is not None:
                fifo_queue = QueueSelector.for_message_group(
                    self.routes.fifo_queues(topic) if self.fifo_keep_queue else queues,
                    message_group,
                )
            if fifo_queue is not None:
                mq = fifo_queue
                if mq not in queues:
                    # the group of this message group's queue lost its master; sending
                    # elsewhere would let a consumer read this message before the older
                    # ones of the group still waiting on that queue
                    last = NotMaster(
                        f"message group {message_group!r} keeps queue {mq.broker_name}/"
                        f"{mq.queue_id} of {topic}, whose group has no writable master now"
                    )
                    last.broker_name = mq.broker_name
                    await self.routes.refresh_quietly(topic)
                    continue
            elif not tried and not self.isolation.any():
                mq = queues[start % len(queues)]  # what pick() returns when nothing is excluded
            else:
                mq = QueueSelector.pick(queues, start, isolated=self._mq_isolated, tried=tried)
            addr = self.routes.broker_addr_for_publish(mq.broker_name)
            timeout_ms = self.send_timeout_ms
            if (
                addr is not None
                and fifo_queue is None
                and attempt < self.max_attempts
                and self.adaptive_timeout.timeout_ms(addr, timeout_ms) < timeout_ms
                and self._has_other_group(queues, mq.broker_name, tried)
            ):
                timeout_ms = self.adaptive_timeout.timeout_ms(addr, timeout_ms)
            try:
                if addr is None:
                    raise NotMaster(f"group {mq.broker_name} has no master for {topic}")
                request.queue_id = mq.queue_id
                sent_at = time.perf_counter()
                response = await self._send_request(mq.broker_name, addr, request, timeout_ms)
            except (HaError, OSError) as exc:
                if isinstance(exc, HaError):
                    exc.broker_name = mq.broker_name  # which group refused (drills, logs)
                if not is_retriable(exc):
                    raise
                last = exc
                if not isinstance(exc, MasterMoved):  # (its group has a master again)
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
            assert addr is not None
            self.adaptive_timeout.observe(addr, (time.perf_counter() - sent_at) * 1000)
            if self.isolation.any():
                self.isolation.release(addr)
            return self._receipts(messages, uniq_keys, mq, response)
        assert last is not None
        raise last

    async def _send_request(
        self,
        broker_name: str,
        addr: str,
        request: broker_pb2.SendMessageRequest,
        timeout_ms: int,
    ) -> broker_pb2.SendMessageResponse:
        """One SEND_MESSAGE to ``addr``; in controller mode ended early (:class:`MasterMoved`)
        when the group's route moves to a newer epoch's master meanwhile."""
        call = self._pool.call_pb(
            addr, RequestCode.SEND_MESSAGE, request, broker_pb2.SendMessageResponse, timeout_ms
        )
        broker = self.routes.broker(broker_name)
        epoch = broker.epoch if broker is not None else None
        if epoch is None:  # RIP-32 only: no master is elected while this one is away
            return await call
        moved = asyncio.timeout(None)
        try:
            async with moved:
                key = self._in_flight.add(broker_name, epoch, addr, moved)
                try:
                    return await call
                finally:
                    self._in_flight.discard(broker_name, key)
        except TimeoutError as exc:
            if not moved.expired():
                raise
            new = self.routes.broker(broker_name)
            raise MasterMoved(
                f"group {broker_name} moved to epoch {new.epoch if new else '?'} while a send "
                f"to its epoch-{epoch} master {addr} was in flight; sent again"
            ) from exc

    def _on_route(self, topic: str, route: TopicRouteData) -> None:
        if not len(self._in_flight):
            return
        now = asyncio.get_running_loop().time()
        for broker in route.broker_datas:
            if broker.epoch is not None:
                ended = self._in_flight.superseded(
                    broker.broker_name, broker.epoch, addr_for_publish(broker), now
                )
                if ended:
                    log.info(
                        "group %s is in epoch %d now: %d send(s) in flight to its old master "
                        "ended, to be sent again",
                        broker.broker_name,
                        broker.epoch,
                        ended,
                    )

    def _mq_isolated(self, mq: MessageQueue) -> bool:
        return self.isolation.is_isolated(self.routes.broker_addr_for_publish(mq.broker_name))

    def _has_other_group(
        self, queues: list[MessageQueue], broker_name: str, tried: Collection[str]
    ) -> bool:
        """Whether a group other than ``broker_name``, untried and not isolated, has a queue."""
        if queues is not self._groups_of[0]:  # the route cache hands out one list per version
            self._groups_of = (queues, frozenset(q.broker_name for q in queues))
        return any(
            name != broker_name
            and name not in tried
            and not self.isolation.is_isolated(self.routes.broker_addr_for_publish(name))
            for name in self._groups_of[1]
        )

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
        epoch = response.epoch if response.HasField("epoch") else None
        member_id = response.member_id if response.HasField("member_id") else None
        return [
            SendReceipt(
                msg_id=r.msg_id,
                uniq_key=r.uniq_key or uk,
                topic=mq.topic,
                broker_name=broker_name,
                queue_id=r.queue_id,
                queue_offset=r.queue_offset,
                keys=tuple(m.keys),
                epoch=epoch,
                member_id=member_id,
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
