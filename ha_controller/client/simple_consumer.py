"""The simple consumer: receive / ack / change_invisible_duration over POP.

Like the RocketMQ 5 clients' ``SimpleConsumer``:
``receive`` pops up to ``max_message_num`` messages, which
stay invisible to the group for ``invisible_duration_s``; ``ack`` finishes one;
a message neither acked nor made visible again comes back through the group's
retry topic ``%RETRY%{group}``, which ``receive`` reads too.  Requests go to each
group's id-0 address, which is the acting slave while the master is away.  The
receipt handle travels in the message's ``POP_CK`` property;
``change_invisible_duration`` returns the message with its new handle.
"""

from __future__ import annotations

import dataclasses
import logging
import ssl
import time
from collections.abc import Sequence
from typing import Final

from ha_controller.acl import Credentials
from ha_controller.client.admin import NameserverClient
from ha_controller.client.lifecycle import AsyncLifecycle
from ha_controller.client.message import ReceivedMessage
from ha_controller.client.routes import RouteCache, parse_namesrv_addrs
from ha_controller.filter.selector import check_subscription
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    BrokerUnavailable,
    HaError,
    IllegalFilterExpression,
    TopicNotFound,
)
from ha_controller.protocol.properties import PROPERTY_POP_CK, retry_topic
from ha_controller.protocol.validation import (
    check_consumer_group,
    check_invisible_ms,
    check_topic,
)
from ha_controller.rpc import ConnectionPool

__all__ = ["PROPERTY_POP_CK", "SimpleConsumer", "retry_topic_of"]

log = logging.getLogger(__name__)

#: A long poll asks the broker to hold at most this long per round.
MAX_POLL_ROUND_MS: Final = 1000


#: The retry topic of a consumer group (``%RETRY%{group}``); the SDK's name for it.
retry_topic_of = retry_topic


class SimpleConsumer(AsyncLifecycle):
    """``async with SimpleConsumer(ns, "group", ["topic"], invisible_duration_s=30) as c``.

    ``sql92`` (RocketMQ's ``ExpressionType.SQL92``): only the messages whose properties
    make the expression TRUE are popped (``TAGS`` is the tag; a missing property is
    NULL); the brokers filter, the group's offsets move past the others.  A bad
    expression is refused here: ``FilterSyntaxError`` (an ``IllegalFilterExpression``,
    a ``ValueError``) naming where.

    ``tls``: the ``ssl.SSLContext`` of every connection, to nameservers and brokers
    (:func:`ha_controller.rpc.tls.client_context`); None = plaintext.
    """

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str,
        topics: Sequence[str],
        invisible_duration_s: float = 30.0,
        *,
        sql92: str | None = None,
        request_timeout_ms: int = 3000,
        route_watch: bool = True,
        tls: ssl.SSLContext | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        check_consumer_group(group)  # IllegalConsumerGroup (a ValueError)
        check_subscription(None, sql92)
        if not topics:
            raise ValueError("subscribe to at least one topic")
        for topic in topics:
            check_topic(topic)
        if invisible_duration_s <= 0:
            raise ValueError(f"invisible_duration_s must be positive, got {invisible_duration_s}")
        # RocketMQ's upper bound (the gateway's 10 s floor is RocketMQ's proxy's; a POP
        # straight to the brokers, as RocketMQ's own clients do, has none)
        check_invisible_ms(int(invisible_duration_s * 1000))
        self.group = group
        self.topics = [*topics, retry_topic_of(group)]
        self.invisible_duration_s = invisible_duration_s
        self.sql92 = sql92
        self.request_timeout_ms = request_timeout_ms
        self._pool = ConnectionPool(
            ssl_context=tls, signer=credentials.sign if credentials is not None else None
        )
        self.routes = RouteCache(
            NameserverClient(parse_namesrv_addrs(namesrv_addrs), self._pool),
            watch=route_watch,
            owner=f"simple consumer {group}",
        )
        self._rr = 0
        self._closed = False

    async def start(self) -> None:
        if self._closed:
            raise RuntimeError("simple consumer is closed")

    async def aclose(self) -> None:
        """Close routes and connections; idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.routes.aclose()
        await self._pool.aclose()

    # ---- API -------------------------------------------------------------------

    async def receive(
        self, max_message_num: int = 16, wait_s: float = 0.0
    ) -> list[ReceivedMessage]:
        """Pop up to ``max_message_num`` messages from the topics and the retry topic;
        wait up to ``wait_s`` for the first one."""
        if max_message_num < 1:
            raise ValueError(f"max_message_num must be >= 1, got {max_message_num}")
        if self._closed:
            raise RuntimeError("simple consumer is closed")
        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            targets = await self._targets()
            out: list[ReceivedMessage] = []
            for topic, broker_name in targets:
                if len(out) >= max_message_num:
                    break
                out.extend(await self._pop(topic, broker_name, max_message_num - len(out), 0))
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if out or remaining_ms <= 0:
                return out
            if not targets:
                await self._refresh()
                continue
            self._rr += 1
            topic, broker_name = targets[self._rr % len(targets)]
            out = await self._pop(
                topic, broker_name, max_message_num, min(remaining_ms, MAX_POLL_ROUND_MS)
            )
            if out:
                return out

    async def ack(self, message: ReceivedMessage) -> None:
        """Finish ``message``: it will not come back."""
        await self._call_ack(RequestCode.ACK_MESSAGE, message, 0)

    async def change_invisible_duration(
        self, message: ReceivedMessage, duration_s: float
    ) -> ReceivedMessage:
        """Make ``message`` visible again after ``duration_s``; returns it with its new
        receipt handle (use that one to ack)."""
        if duration_s <= 0:
            raise ValueError(f"duration_s must be positive, got {duration_s}")
        check_invisible_ms(int(duration_s * 1000))
        resp = await self._call_ack(
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME, message, int(duration_s * 1000)
        )
        props = dict(message.properties)
        props[PROPERTY_POP_CK] = resp.receipt_handle
        return dataclasses.replace(message, properties=props)

    # ---- internals ---------------------------------------------------------------

    async def _refresh(self) -> None:
        for topic in self.topics:
            await self.routes.refresh_quietly(topic)

    async def _targets(self) -> list[tuple[str, str]]:
        """(topic, group) pairs to pop from, the topics' readable groups."""
        out: list[tuple[str, str]] = []
        for topic in self.topics:
            try:
                await self.routes.route(topic)
            except TopicNotFound:
                continue  # e.g. the retry topic before anything was retried
            names = sorted({mq.broker_name for mq in self.routes.subscribe_queues(topic)})
            out.extend((topic, name) for name in names)
        if out:
            shift = self._rr % len(out)
            out = out[shift:] + out[:shift]
        return out

    async def _pop(
        self, topic: str, broker_name: str, max_num: int, poll_ms: int
    ) -> list[ReceivedMessage]:
        addr = self.routes.broker_addr_for_subscribe(broker_name)
        if addr is None:
            return []
        request = broker_pb2.PopMessageRequest(
            consumer_group=self.group,
            topic=topic,
            queue_id=-1,
            max_msg_nums=max_num,
            invisible_time_ms=int(self.invisible_duration_s * 1000),
            poll_time_ms=poll_ms,
            sql92=self.sql92 or "",
        )
        try:
            resp = await self._pool.call_pb(
                addr,
                RequestCode.POP_MESSAGE,
                request,
                broker_pb2.PopMessageResponse,
                self.request_timeout_ms + poll_ms,
            )
        except IllegalFilterExpression:
            raise  # the subscription itself: retrying elsewhere would not help
        except (HaError, OSError) as exc:
            log.debug("pop from %s (%s) for %s failed: %s", broker_name, addr, topic, exc)
            if isinstance(exc, OSError) or (isinstance(exc, HaError) and exc.retriable):
                await self.routes.refresh_quietly(topic)
            return []
        return [
            ReceivedMessage.from_pb(
                m,
                topic=m.topic or topic,
                broker_name=m.broker_name or broker_name,
                reconsume_times=m.reconsume_times,
            )
            for m in resp.messages
        ]

    async def _call_ack(
        self, method: int, message: ReceivedMessage, invisible_ms: int
    ) -> broker_pb2.AckMessageResponse:
        handle = message.properties.get(PROPERTY_POP_CK)
        if not handle:
            raise ValueError("message has no receipt handle (was it received by receive()?)")
        request = broker_pb2.AckMessageRequest(
            consumer_group=self.group,
            topic=message.topic,
            receipt_handle=handle,
            invisible_time_ms=invisible_ms,
        )
        last: BaseException | None = None
        for attempt in range(3):
            await self.routes.route(message.topic)
            addr = self.routes.broker_addr_for_subscribe(message.broker_name)
            try:
                if addr is None:
                    raise BrokerUnavailable(f"group {message.broker_name} has no live broker")
                return await self._pool.call_pb(
                    addr, method, request, broker_pb2.AckMessageResponse, self.request_timeout_ms
                )
            except (HaError, OSError) as exc:
                retriable = isinstance(exc, OSError) or (isinstance(exc, HaError) and exc.retriable)
                if not retriable:
                    raise
                last = exc
                log.info("ack to %s failed (attempt %d): %s", addr, attempt + 1, exc)
                await self.routes.refresh_quietly(message.topic)
        assert last is not None
        raise last
