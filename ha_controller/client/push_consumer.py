"""The push consumer: heartbeats, rebalance, one long-poll loop per owned queue.

Like RocketMQ's ``DefaultMQPushConsumer`` in clustering mode:
- HEART_BEAT to every broker address of the topic every 10 s (and at start),
  so every broker (slaves included) knows the group's clients;
- a rebalance every 5 s, and at once when the topic's route changes: ask one
  broker for the group's client ids, sort them and the readable queues, and
  allocate with ``AllocateMessageQueueAveragely``;
- per owned queue a loop that starts from the committed offset (or 0: consume
  from the first offset), long-polls, hands each message to the listener
  (concurrently within a batch), retries a failed message after a short
  backoff a bounded number of times, and commits offsets — only up to the
  lowest unfinished message, like ``ProcessQueue.removeMessage`` — in the next
  pull after each batch (``commit_offset`` in the pull request, as RocketMQ's
  consumer does with the master: no request of its own, so a slow commit never
  holds up the next pull; every pull carries it until a request has stored it)
  and with a request of its own every 5 s and when a queue is stopped.

Pulls and commits go to the group's id-0 address, which is the acting slave
while the master is away, so consumption goes on through a failover.  All
loops run in one ``asyncio.TaskGroup`` owned by the consumer; ``aclose()``
stops them, commits the offsets and closes the connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import ssl
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

from ha_controller.acl import Credentials
from ha_controller.client.admin import NameserverClient
from ha_controller.client.lifecycle import AsyncLifecycle
from ha_controller.client.message import MessageQueue, ReceivedMessage, new_client_id
from ha_controller.client.pull_consumer import DEFAULT_SUSPEND_TIMEOUT_MS, PullConsumer, PullStatus
from ha_controller.client.routes import RouteCache, addr_for_subscribe, parse_namesrv_addrs
from ha_controller.filter.selector import check_subscription
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import HaError, TopicNotFound
from ha_controller.protocol.validation import check_consumer_group, check_topic
from ha_controller.routing import TopicRouteData
from ha_controller.rpc import ConnectionPool

__all__ = [
    "MessageListener",
    "OffsetTracker",
    "PushConsumer",
    "allocate_averagely",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

MessageListener = Callable[[ReceivedMessage], Awaitable[bool]]
"""Returns True when the message was consumed; False (or raising) asks for a retry."""


def allocate_averagely(queues: Sequence[T], client_ids: Sequence[str], client_id: str) -> list[T]:
    """RocketMQ's ``AllocateMessageQueueAveragely``: a contiguous block per client.

    Both lists must be sorted the same way on every client.  The first
    ``len(queues) % len(client_ids)`` clients get one queue more; a client not
    in ``client_ids`` gets nothing.
    """
    if client_id not in client_ids or not queues:
        return []
    index = list(client_ids).index(client_id)
    n, clients = len(queues), len(client_ids)
    mod = n % clients
    if n <= clients:
        average = 1
    elif mod > 0 and index < mod:
        average = n // clients + 1
    else:
        average = n // clients
    start = index * average if mod > 0 and index < mod else index * average + mod
    count = min(average, n - start)
    return [queues[start + i] for i in range(max(0, count))]


class OffsetTracker:
    """Offsets of one queue in flight; what may be committed.

    The committable offset is the lowest unfinished message's offset, or, when
    nothing is in flight, the next offset to pull (``ProcessQueue``).
    """

    def __init__(self, next_offset: int = 0) -> None:
        self._inflight: set[int] = set()
        self._next = next_offset

    def add(self, offsets: Iterable[int], next_offset: int) -> None:
        """A pulled batch: its offsets are in flight; ``next_offset`` follows it."""
        self._inflight.update(offsets)
        self._next = next_offset

    def done(self, offset: int) -> None:
        self._inflight.discard(offset)

    def reset(self, next_offset: int) -> None:
        self._inflight.clear()
        self._next = next_offset

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    @property
    def committable(self) -> int:
        return min(self._inflight) if self._inflight else self._next


@dataclasses.dataclass(eq=False)
class _QueueState:
    mq: MessageQueue
    tracker: OffsetTracker = dataclasses.field(default_factory=OffsetTracker)
    last_committed: int | None = None
    ready: bool = False
    commit_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    task: asyncio.Task[None] | None = None
    #: the commit the pull loop started in the background (never awaited by it)
    committing: asyncio.Task[None] | None = None


class PushConsumer(AsyncLifecycle):
    """Consumes one topic for a consumer group and calls ``listener`` per message.

    ``async with PushConsumer(ns, "G", "T", listener) as consumer: ...``

    ``tags`` (``["a", "b"]``, None = all) or ``sql92`` (RocketMQ's
    ``ExpressionType.SQL92``: an expression over the messages' properties, ``TAGS``
    the tag, e.g. ``"region = 'eu' AND amount > 100"``) choose the messages; the
    brokers filter, and the group's offsets move past what is filtered out.  A bad
    expression is refused here: ``FilterSyntaxError`` (an ``IllegalFilterExpression``,
    a ``ValueError``) naming where.

    ``tls``: the ``ssl.SSLContext`` of every connection, to nameservers and brokers
    (:func:`ha_controller.rpc.tls.client_context`); None = plaintext.
    """

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str,
        topic: str,
        listener: MessageListener,
        *,
        tags: Sequence[str] | None = None,
        sql92: str | None = None,
        client_id: str | None = None,
        batch: int = 32,
        suspend_timeout_ms: int = DEFAULT_SUSPEND_TIMEOUT_MS,
        heartbeat_interval_s: float = 10.0,
        rebalance_interval_s: float = 5.0,
        commit_interval_s: float = 5.0,
        max_consume_attempts: int = 5,
        consume_retry_backoff_s: float = 0.2,
        pull_error_backoff_s: float = 1.0,
        consume_concurrency: int = 64,
        request_timeout_ms: int = 3000,
        route_watch: bool = True,
        tls: ssl.SSLContext | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        check_consumer_group(group)  # IllegalConsumerGroup (a ValueError)
        check_topic(topic)
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if max_consume_attempts < 1:
            raise ValueError(f"max_consume_attempts must be >= 1, got {max_consume_attempts}")
        if consume_concurrency < 1:
            raise ValueError(f"consume_concurrency must be >= 1, got {consume_concurrency}")
        self.group = group
        self.topic = topic
        check_subscription(tags, sql92)  # a bad SQL92 is refused here, not later
        self.tags = None if tags is None else list(tags)
        self.sql92 = sql92
        self.client_id = client_id or new_client_id()
        self.batch = batch
        self.suspend_timeout_ms = suspend_timeout_ms
        self.heartbeat_interval_s = heartbeat_interval_s
        self.rebalance_interval_s = rebalance_interval_s
        self.commit_interval_s = commit_interval_s
        self.max_consume_attempts = max_consume_attempts
        self.consume_retry_backoff_s = consume_retry_backoff_s
        self.pull_error_backoff_s = pull_error_backoff_s
        self.request_timeout_ms = request_timeout_ms
        self._listener = listener
        self.tls = tls
        self.credentials = credentials
        self._pool = ConnectionPool(
            ssl_context=tls,
            signer=credentials.sign if credentials is not None else None,
            on_reconnect=self._reconnected,
        )
        self._nameserver = NameserverClient(parse_namesrv_addrs(namesrv_addrs), self._pool)
        self.routes = RouteCache(self._nameserver, watch=route_watch, owner=f"consumer {group}")
        self._pull = PullConsumer(
            namesrv_addrs,
            group,
            request_timeout_ms=request_timeout_ms,
            routes=self.routes,
            pool=self._pool,
        )
        self._consume_slots = asyncio.Semaphore(consume_concurrency)
        self._queues: dict[MessageQueue, _QueueState] = {}
        self._rebalance_now = asyncio.Event()
        self._ready = asyncio.Event()
        self._tg: asyncio.TaskGroup | None = None
        self._main: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._closing = False
        self._closed = asyncio.Event()
        self.consumed = 0
        self.given_up = 0

    # ---- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        """Fetch the route, heartbeat, do the first rebalance and start the loops.

        A topic the nameserver does not know yet is watched: consumption starts
        when it appears.
        """
        if self._closing:
            raise RuntimeError("push consumer is closed")
        if self._main is not None:
            return
        try:
            self.routes.watch(self.topic)
            try:
                await self.routes.route(self.topic)
            except TopicNotFound:
                log.warning("topic %s does not exist yet; waiting for it", self.topic)
            self._unsubscribe = self.routes.on_change(self._route_changed)
            self._main = asyncio.get_running_loop().create_task(
                self._run(), name=f"push-consumer-{self.group}"
            )
            self._main.add_done_callback(self._main_done)
            ready = asyncio.ensure_future(self._ready.wait())
            try:
                await asyncio.wait({ready, self._main}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
            if self._main.done() and not self._main.cancelled():
                self._main.result()
        except BaseException:
            await self.aclose()
            raise

    def _main_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("push consumer %s stopped", self.group, exc_info=task.exception())

    async def aclose(self) -> None:
        """Stop the queue loops, commit their offsets, stop everything; idempotent."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        try:
            if self._unsubscribe is not None:
                self._unsubscribe()
            states = list(self._queues.values())
            self._queues.clear()
            await self._stop_states(states)
            if self._main is not None:
                self._main.cancel()
                await asyncio.wait({self._main}, timeout=5.0)
            await self._pull.aclose()
            await self.routes.aclose()
            await self._pool.aclose()
        finally:
            self._closed.set()

    def assigned_queues(self) -> list[MessageQueue]:
        """The queues this client consumes now."""
        return sorted(self._queues)

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            try:
                await self._heartbeat_once()
                await self._rebalance_once()
                self._ready.set()
                tg.create_task(self._heartbeat_loop(), name="push-heartbeat")
                tg.create_task(self._rebalance_loop(), name="push-rebalance")
                tg.create_task(self._commit_loop(), name="push-commit")
            finally:
                self._ready.set()

    # ---- heartbeat -----------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            await self._heartbeat_once()

    async def _heartbeat_once(self) -> None:
        body = broker_pb2.ClientHeartbeat(
            client_id=self.client_id, consumer_groups=[self.group]
        ).SerializeToString()
        addrs = self.routes.topic_broker_addrs(self.topic)
        await asyncio.gather(*(self._heartbeat_to(addr, body) for addr in addrs))

    def _reconnected(self, addr: str) -> None:
        """A new connection to ``addr`` replaced one that closed: a broker forgets the
        consumers of a closed connection, and the others' rebalance would leave this
        client out until its next periodic heartbeat; say hello at once."""
        if (
            self._tg is None
            or self._closing
            or addr not in self.routes.topic_broker_addrs(self.topic)
        ):
            return
        body = broker_pb2.ClientHeartbeat(
            client_id=self.client_id, consumer_groups=[self.group]
        ).SerializeToString()
        self._tg.create_task(self._heartbeat_to(addr, body), name=f"push-hello-{addr}")

    async def _heartbeat_to(self, addr: str, body: bytes) -> None:
        try:
            await self._pool.call(addr, RequestCode.HEART_BEAT, body, self.request_timeout_ms)
        except (HaError, OSError) as exc:
            log.debug("heartbeat to %s failed: %s", addr, exc)

    # ---- rebalance ------------------------------------------------------------------------

    def _route_changed(self, topic: str, route: TopicRouteData) -> None:
        if topic == self.topic:
            self._rebalance_now.set()

    async def _rebalance_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.rebalance_interval_s):
                    await self._rebalance_now.wait()
            if self._rebalance_now.is_set():
                self._rebalance_now.clear()
                await self._heartbeat_once()  # new addresses must know us before we ask
            await self._rebalance_once()

    async def _consumer_ids(self) -> list[str] | None:
        route = self.routes.cached(self.topic)
        if route is None:
            return None
        addrs = [a for b in route.broker_datas if (a := addr_for_subscribe(b)) is not None]
        random.shuffle(addrs)
        request = broker_pb2.ConsumerListRequest(consumer_group=self.group)
        for addr in addrs:
            try:
                response = await self._pool.call_pb(
                    addr,
                    RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                    request,
                    broker_pb2.ConsumerListResponse,
                    self.request_timeout_ms,
                )
            except (HaError, OSError) as exc:
                log.debug("consumer list from %s failed: %s", addr, exc)
                continue
            return sorted(set(response.client_ids))
        return None

    async def _rebalance_once(self) -> None:
        if self._closing:
            return
        try:
            await self.routes.route(self.topic)
        except (HaError, OSError) as exc:
            log.debug("no route for %s yet: %s", self.topic, exc)
            return
        queues = sorted(self.routes.subscribe_queues(self.topic))
        client_ids = await self._consumer_ids()
        if client_ids is None:
            log.warning("no broker of %s answered the consumer list; keeping queues", self.topic)
            return
        if self.client_id not in client_ids:
            log.info("brokers do not know client %s yet; keeping queues", self.client_id)
            self._rebalance_now.set()
            return
        owned = set(allocate_averagely(queues, client_ids, self.client_id))
        if self._closing:
            return
        dropped = [self._queues.pop(mq) for mq in list(self._queues) if mq not in owned]
        added = sorted(mq for mq in owned if mq not in self._queues)
        for mq in added:
            self._start_queue(mq)
        if dropped or added:
            log.info(
                "rebalance %s/%s: %d clients, %d queues; owns %d (+%d -%d)",
                self.group,
                self.topic,
                len(client_ids),
                len(queues),
                len(owned),
                len(added),
                len(dropped),
            )
        await self._stop_states(dropped)

    def _start_queue(self, mq: MessageQueue) -> None:
        assert self._tg is not None
        state = _QueueState(mq)
        state.task = self._tg.create_task(self._queue_loop(state), name=f"push-pull-{mq}")
        self._queues[mq] = state

    async def _stop_states(self, states: list[_QueueState]) -> None:
        """Stop the loops of ``states`` and commit what they finished."""
        tasks = [s.task for s in states if s.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        if states:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await asyncio.gather(*(self._commit_state(s) for s in states))
        background = [s.committing for s in states if s.committing is not None]
        for task in background:
            task.cancel()
        if background:
            await asyncio.wait(background)

    # ---- offsets --------------------------------------------------------------------------

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.commit_interval_s)
            # concurrently: a broker that answers slowly delays only its own queues
            await asyncio.gather(*(self._commit_state(s) for s in list(self._queues.values())))

    def _commit_soon(self, state: _QueueState) -> None:
        """Commit ``state``'s offset in the background, unless a commit of it is under
        way.  The pull loop never waits for a commit: one to a broker that answers
        slowly (packet loss, a frozen master) would stop the queue's reads for up to
        the commit's attempts times its timeout, though the reads may go elsewhere."""
        if state.committing is not None and not state.committing.done():
            return
        state.committing = asyncio.get_running_loop().create_task(
            self._commit_state(state), name=f"commit-{state.mq}"
        )

    def _offset_to_carry(self, state: _QueueState) -> int:
        """The offset the next pull of ``state`` carries, or -1.

        Every pull carries the committable offset until a commit request of its own has
        stored it (``last_committed``): the broker that took a carried offset may die
        before its slaves have it, and a pull retried on the acting slave must carry it
        again; a broker that is neither master nor acting slave ignores it.  Nothing is
        carried while a commit request is on its way, which a pull could overtake."""
        if not state.ready or state.commit_lock.locked():
            return -1
        offset = state.tracker.committable
        return -1 if offset < 0 or offset == state.last_committed else offset

    async def _commit_settled(self, state: _QueueState) -> None:
        """Wait until the background commit of ``state`` (if any) has ended."""
        if state.committing is not None:
            await asyncio.wait([state.committing])

    async def _commit_state(self, state: _QueueState) -> None:
        async with state.commit_lock:
            if not state.ready:
                return
            offset = state.tracker.committable
            if offset < 0 or offset == state.last_committed:
                return
            try:
                await self._pull.commit(state.mq, offset)
            except (HaError, OSError, RuntimeError) as exc:
                log.warning("commit of %s at %d failed: %s", state.mq, offset, exc)
                return
            state.last_committed = offset

    async def _initial_offset(self, mq: MessageQueue) -> int:
        while True:
            try:
                committed = await self._pull.committed_offset(mq)
            except (HaError, OSError) as exc:
                log.warning("cannot read the offset of %s: %s", mq, exc)
                await asyncio.sleep(self.pull_error_backoff_s)
                continue
            return committed

    # ---- the per-queue loop -------------------------------------------------------------

    async def _queue_loop(self, state: _QueueState) -> None:
        mq = state.mq
        committed = await self._initial_offset(mq)
        offset = max(committed, 0)  # no offset yet: consume from the first message
        state.tracker.reset(offset)
        state.last_committed = committed if committed >= 0 else None
        state.ready = True

        async def consume_batch(messages: list[ReceivedMessage]) -> bool:
            async with asyncio.TaskGroup() as tg:
                for message in messages:
                    tg.create_task(self._consume(state, message))
            return True

        await self._pull_loop(state, offset, consume_batch, lambda: True)

    async def _pull_loop(
        self,
        state: _QueueState,
        offset: int,
        consume_batch: Callable[[list[ReceivedMessage]], Awaitable[bool]],
        keep_going: Callable[[], bool],
    ) -> None:
        """Long-poll ``state``'s queue from ``offset`` while ``keep_going()``: hand each
        batch to ``consume_batch`` (False stops the loop), commit what is done, back off
        on errors and follow the broker when it calls an offset illegal."""
        mq = state.mq
        loop = asyncio.get_running_loop()
        while keep_going():
            started = loop.time()
            carry = self._offset_to_carry(state)
            try:
                result = await self._pull.pull(
                    mq,
                    offset,
                    self.batch,
                    self.suspend_timeout_ms,
                    self.tags,
                    carry,
                    sql92=self.sql92,
                )
            except (HaError, OSError) as exc:
                log.warning("pull of %s at %d failed: %s", mq, offset, exc)
                await asyncio.sleep(self.pull_error_backoff_s)
                continue
            if result.status is PullStatus.OFFSET_ILLEGAL:
                log.warning(
                    "offset %d of %s is illegal (min %d, max %d); moving to %d",
                    offset,
                    mq,
                    result.min_offset,
                    result.max_offset,
                    result.next_begin_offset,
                )
                offset = result.next_begin_offset
                state.tracker.reset(offset)
                self._commit_soon(state)
                continue
            if result.messages:
                state.tracker.add(
                    (m.queue_offset for m in result.messages), result.next_begin_offset
                )
                if not await consume_batch(result.messages):
                    return
            elif state.tracker.inflight == 0:
                state.tracker.reset(result.next_begin_offset)
            offset = result.next_begin_offset  # the next pull carries the commit
            if not result.messages and loop.time() - started < 0.01:
                await asyncio.sleep(0.05)  # the broker did not hold the pull: do not spin

    async def _consume(self, state: _QueueState, message: ReceivedMessage) -> None:
        async with self._consume_slots:
            for attempt in range(self.max_consume_attempts):
                if await self._call_listener(state, message, attempt):
                    break
                if attempt + 1 < self.max_consume_attempts:
                    await asyncio.sleep(self._retry_delay_s(attempt))
            else:
                self._count_given_up(state, message, self.max_consume_attempts)
        state.tracker.done(message.queue_offset)

    async def _call_listener(
        self, state: _QueueState, message: ReceivedMessage, attempt: int
    ) -> bool:
        """Hand ``message`` to the listener (attempt 0, or a redelivery counted in its
        ``reconsume_times``); True when it was consumed (counted), False when the
        listener declined or raised (logged)."""
        current = (
            message
            if attempt == 0
            else dataclasses.replace(message, reconsume_times=message.reconsume_times + attempt)
        )
        try:
            ok = await self._listener(current)
        except Exception:
            log.exception("listener failed on %s offset %d", state.mq, message.queue_offset)
            ok = False
        if ok:
            self.consumed += 1
        return ok

    def _retry_delay_s(self, failed_attempt: int) -> float:
        """The backoff before the attempt after ``failed_attempt`` (0-based): doubling,
        at most 10 s."""
        return min(self.consume_retry_backoff_s * 2.0**failed_attempt, 10.0)

    def _count_given_up(self, state: _QueueState, message: ReceivedMessage, attempts: int) -> None:
        self.given_up += 1
        log.error(
            "giving up on message %s (%s offset %d) after %d attempts",
            message.uniq_key,
            state.mq,
            message.queue_offset,
            attempts,
        )
