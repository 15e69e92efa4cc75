"""The pull consumer: assign queues yourself, long-poll pull, commit offsets.

Every request of a queue goes to its group's id-0 address, which is the
acting slave while the master is away (docs/failover.md), or to the
lowest live id when a group shows no id 0 at all.  A request that fails on a
connection error, a timeout or ``NotMaster`` refreshes the route and is
retried against the (possibly new) address.  Long polls carry an RPC timeout
longer than the suspend time (RocketMQ: 15-20 s suspend, 30 s RPC timeout).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import ssl
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Final

from google.protobuf.message import Message as PbMessage

from ha_controller.acl import Credentials
from ha_controller.client.admin import NameserverClient
from ha_controller.client.lifecycle import AsyncLifecycle
from ha_controller.client.message import MessageQueue, ReceivedMessage
from ha_controller.client.routes import RouteCache, parse_namesrv_addrs
from ha_controller.filter.selector import check_subscription
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BrokerUnavailable, HaError
from ha_controller.rpc import ConnectionPool
from ha_controller.rpc.connection import M

__all__ = [
    "DEFAULT_SUSPEND_TIMEOUT_MS",
    "PULL_RPC_MARGIN_MS",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "pull_rpc_timeout_ms",
]

log = logging.getLogger(__name__)

DEFAULT_SUSPEND_TIMEOUT_MS: Final = 15_000
#: How much longer than the suspend time a long poll's RPC may take (15 s + 15 s = 30 s).
PULL_RPC_MARGIN_MS: Final = 15_000


def pull_rpc_timeout_ms(suspend_timeout_ms: int, request_timeout_ms: int = 3000) -> int:
    """The RPC timeout of a pull: always longer than the time the broker may hold it."""
    if suspend_timeout_ms <= 0:
        return request_timeout_ms
    return suspend_timeout_ms + max(PULL_RPC_MARGIN_MS, request_timeout_ms)


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


_STATUS_FROM_PB: Final = {
    broker_pb2.FOUND: PullStatus.FOUND,
    broker_pb2.NO_NEW_MSG: PullStatus.NO_NEW_MSG,
    broker_pb2.NO_MATCHED_MSG: PullStatus.NO_MATCHED_MSG,
    broker_pb2.OFFSET_ILLEGAL: PullStatus.OFFSET_ILLEGAL,
}


@dataclass(frozen=True, slots=True)
class PullResult:
    status: PullStatus
    messages: list[ReceivedMessage]
    next_begin_offset: int
    min_offset: int
    max_offset: int


def _received(pb: broker_pb2.Message, mq: MessageQueue) -> ReceivedMessage:
    return ReceivedMessage.from_pb(
        pb,
        topic=pb.topic or mq.topic,
        broker_name=pb.broker_name or mq.broker_name,
        reconsume_times=pb.reconsume_times,
    )


def _retry_elsewhere(exc: BaseException) -> bool:
    """Errors after which the route is refreshed and the request sent again."""
    if isinstance(exc, HaError):
        return exc.retriable
    return isinstance(exc, OSError)


class PullConsumer(AsyncLifecycle):
    """Pulls the queues you choose and keeps the group's offsets on the brokers.

    ``routes`` and ``pool`` may be shared with another client (the push
    consumer does); shared ones are not closed by ``aclose()``.
    """

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str,
        *,
        request_timeout_ms: int = 3000,
        call_attempts: int = 3,
        retry_backoff_s: float = 0.2,
        route_watch: bool = True,
        routes: RouteCache | None = None,
        pool: ConnectionPool | None = None,
        tls: ssl.SSLContext | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        if not group:
            raise ValueError("consumer group must not be empty")
        if call_attempts < 1:
            raise ValueError(f"call_attempts must be >= 1, got {call_attempts}")
        self.group = group
        self.request_timeout_ms = request_timeout_ms
        self.call_attempts = call_attempts
        self.retry_backoff_s = retry_backoff_s
        if pool is not None and (tls is not None or credentials is not None):
            raise ValueError(
                "give tls and credentials to the ConnectionPool passed as pool, not to both"
            )
        self._own_pool = pool is None
        self._pool = pool or ConnectionPool(
            ssl_context=tls, signer=credentials.sign if credentials is not None else None
        )
        self._own_routes = routes is None
        if routes is None:
            nameserver = NameserverClient(parse_namesrv_addrs(namesrv_addrs), self._pool)
            routes = RouteCache(nameserver, watch=route_watch, owner=f"pull consumer {group}")
        self.routes = routes
        self._closed = False
        #: per queue, the stores read from and how often each had gone back then
        self._rewinds: dict[MessageQueue, dict[int, int]] = {}

    # ---- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        if self._closed:
            raise RuntimeError("pull consumer is closed")

    async def aclose(self) -> None:
        """Close what this consumer owns; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._own_routes:
            await self.routes.aclose()
        if self._own_pool:
            await self._pool.aclose()

    # ---- API ------------------------------------------------------------------------

    async def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, sorted by (broker_name, queue_id)."""
        await self.routes.route(topic)
        return self.routes.subscribe_queues(topic)

    async def pull(
        self,
        mq: MessageQueue,
        offset: int,
        max_msgs: int = 32,
        suspend_timeout_ms: int = DEFAULT_SUSPEND_TIMEOUT_MS,
        tags: Sequence[str] | None = None,
        commit_offset: int = -1,
        *,
        sql92: str | None = None,
    ) -> PullResult:
        """Pull from ``offset``; the broker holds the request up to ``suspend_timeout_ms``
        when nothing is there yet (0 = answer at once).  ``tags`` filters by tag.

        ``sql92`` filters instead by an SQL92 expression over the messages' properties
        (RocketMQ's ``ExpressionType.SQL92``; ``TAGS`` is the tag), e.g.
        ``"region IN ('eu', 'us') AND amount > 100"``: the broker evaluates it, so only
        the messages it selects come back, and ``next_begin_offset`` moves past the
        others.  A property a message lacks is NULL: a comparison with it is not TRUE,
        ``x IS NULL`` is.  A bad expression (or one given with ``tags``) is refused
        before anything is sent: ``FilterSyntaxError`` (an ``IllegalFilterExpression``,
        a ``ValueError``), naming where.

        ``commit_offset`` >= 0 also stores the group's offset of ``mq`` (RocketMQ's
        ``commitOffset`` in the pull header): the master or the acting slave applies it
        before it reads; any other broker ignores it, so it is no substitute for
        :meth:`commit` when the commit must be known to have landed.

        An answer from a store whose queues went back since this consumer read ``mq``
        from it (a power loss took its unsynced tail), to an ``offset`` past where the
        queue ended then, comes back as OFFSET_ILLEGAL with that place as
        ``next_begin_offset``: the messages stored since took the offsets from there."""
        if max_msgs < 1:
            raise ValueError(f"max_msgs must be >= 1, got {max_msgs}")
        check_subscription(tags, sql92)
        wanted = None if tags is None or "*" in tags else frozenset(tags)
        request = broker_pb2.PullMessageRequest(
            consumer_group=self.group,
            topic=mq.topic,
            queue_id=mq.queue_id,
            queue_offset=offset,
            max_msg_nums=max_msgs,
            suspend_timeout_ms=max(0, suspend_timeout_ms),
            commit_offset=commit_offset,
            tags=sorted(wanted or ()),
            sql92=sql92 or "",
        )
        response = await self._call(
            mq,
            RequestCode.PULL_MESSAGE,
            request,
            broker_pb2.PullMessageResponse,
            pull_rpc_timeout_ms(suspend_timeout_ms, self.request_timeout_ms),
        )
        back = self._went_back(mq, offset, response)
        if back is not None:
            log.warning(
                "%s went back since this consumer read it (an unclean stop): offset %d is "
                "past where the queue ended then; moving to %d",
                mq,
                offset,
                back,
            )
            return PullResult(
                PullStatus.OFFSET_ILLEGAL, [], back, response.min_offset, response.max_offset
            )
        messages = [_received(m, mq) for m in response.messages]
        if wanted is not None:
            # The broker filters by tag hash; re-check the tag itself, as RocketMQ does.
            messages = [m for m in messages if m.tags in wanted]
        return PullResult(
            status=_STATUS_FROM_PB.get(response.status, PullStatus.NO_NEW_MSG),
            messages=messages,
            next_begin_offset=response.next_begin_offset,
            min_offset=response.min_offset,
            max_offset=response.max_offset,
        )

    def _went_back(
        self, mq: MessageQueue, offset: int, response: broker_pb2.PullMessageResponse
    ) -> int | None:
        """Where to go instead of ``offset`` when the answering store's queues went back
        since this consumer last read ``mq`` from it (its rewinds count moved) and
        ``offset`` lies past the queue's recovery mark: an offset read before a power
        loss took the tail, whose queue offsets went to the messages stored since (see
        broker_agent.store.marks).  A store first met, or one that does not say, is
        trusted: the group's committed offsets were corrected when it recovered."""
        if not response.store_id:
            return None
        seen = self._rewinds.setdefault(mq, {})
        before = seen.get(response.store_id)
        seen[response.store_id] = response.store_rewinds
        if before is None or response.store_rewinds <= before:
            return None
        if not response.HasField("recovery_mark") or offset <= response.recovery_mark:
            return None
        return response.recovery_mark

    async def committed_offset(self, mq: MessageQueue) -> int:
        """The group's committed offset of ``mq``; -1 when there is none."""
        response = await self._call(
            mq,
            RequestCode.QUERY_CONSUMER_OFFSET,
            broker_pb2.ConsumerOffsetRequest(
                consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id
            ),
            broker_pb2.OffsetResponse,
            self.request_timeout_ms,
        )
        return response.offset

    async def commit(self, mq: MessageQueue, offset: int) -> None:
        """Store the group's offset of ``mq`` (the next offset to consume)."""
        await self._call(
            mq,
            RequestCode.UPDATE_CONSUMER_OFFSET,
            broker_pb2.ConsumerOffsetRequest(
                consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id, offset=offset
            ),
            broker_pb2.OffsetResponse,
            self.request_timeout_ms,
        )

    async def max_offset(self, mq: MessageQueue) -> int:
        return await self._queue_offset(mq, RequestCode.GET_MAX_OFFSET)

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self._queue_offset(mq, RequestCode.GET_MIN_OFFSET)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The offset of the first message stored at or after ``timestamp_ms``."""
        return await self._queue_offset(mq, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, timestamp_ms)

    async def earliest_msg_store_time(self, mq: MessageQueue) -> int:
        response = await self._call(
            mq,
            RequestCode.GET_EARLIEST_MSG_STORETIME,
            broker_pb2.QueueOffsetRequest(topic=mq.topic, queue_id=mq.queue_id),
            broker_pb2.TimestampResponse,
            self.request_timeout_ms,
        )
        return response.timestamp_ms

    # ---- internals ----------------------------------------------------------------------

    async def _unless_moved(self, call: Awaitable[M], mq: MessageQueue, addr: str) -> M:
        """Await ``call`` (a long poll held by ``addr``) unless the route moves the
        group's reads elsewhere first: its master is gone and a slave acts (or it
        returned).  A poll held by a frozen or cut-off master gets no answer until the
        fault heals or its RPC timeout (30 s) runs out, so the queue's consumer would
        read nothing meanwhile, though the acting slave serves it; instead the poll is
        dropped (``BrokerUnavailable``, retried at the new address)."""
        moved = asyncio.Event()

        def listener(topic: str, _route: object) -> None:
            if topic == mq.topic and self.routes.broker_addr_for_subscribe(mq.broker_name) != addr:
                moved.set()

        unsubscribe = self.routes.on_change(listener)
        polling = asyncio.ensure_future(call)
        watching = asyncio.ensure_future(moved.wait())
        try:
            await asyncio.wait({polling, watching}, return_when=asyncio.FIRST_COMPLETED)
            if polling.done():
                return polling.result()
            raise BrokerUnavailable(f"{addr} no longer serves the reads of {mq.broker_name}")
        finally:
            unsubscribe()
            watching.cancel()
            polling.cancel()

    async def _queue_offset(self, mq: MessageQueue, method: int, timestamp_ms: int = 0) -> int:
        response = await self._call(
            mq,
            method,
            broker_pb2.QueueOffsetRequest(
                topic=mq.topic, queue_id=mq.queue_id, timestamp_ms=timestamp_ms
            ),
            broker_pb2.OffsetResponse,
            self.request_timeout_ms,
        )
        return response.offset

    async def _call(
        self,
        mq: MessageQueue,
        method: int,
        request: PbMessage,
        response_type: type[M],
        timeout_ms: int,
    ) -> M:
        """Send to the group's id-0 (else lowest) address; on a retriable failure
        refresh the route and try again, up to ``call_attempts`` times."""
        last: BaseException | None = None
        for attempt in range(self.call_attempts):
            if self._closed:
                raise RuntimeError("pull consumer is closed")
            if attempt:
                await asyncio.sleep(self.retry_backoff_s * attempt)
            await self.routes.route(mq.topic)
            addr = self.routes.broker_addr_for_subscribe(mq.broker_name)
            try:
                if addr is None:
                    raise BrokerUnavailable(f"group {mq.broker_name} has no live broker")
                call = self._pool.call_pb(addr, method, request, response_type, timeout_ms)
                if timeout_ms > self.request_timeout_ms:  # a long poll: follow the route
                    return await self._unless_moved(call, mq, addr)
                return await call
            except (HaError, OSError) as exc:
                if not _retry_elsewhere(exc):
                    raise
                last = exc
                log.warning(
                    "request to %s for %s failed (attempt %d/%d): %s",
                    addr,
                    mq,
                    attempt + 1,
                    self.call_attempts,
                    exc,
                )
                await self.routes.refresh_quietly(mq.topic)
        assert last is not None
        raise last
