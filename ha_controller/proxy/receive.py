"""ReceiveMessage: a long poll over POP, the group's retry topic first (last for a PRIORITY
topic, as RocketMQ has it).

The v2 queue a request names is a hint: the gateway pops any queue of the group that
holds the queue (as RocketMQ's proxy does), in slices of :data:`POLL_SLICE_MS` so that
retry-topic messages and route changes are seen during a long poll.  An orderly
group's POP is the broker's order=true POP, which keeps each queue to one batch at a
time whichever gateway pops.  Messages a push consumer asked to auto-renew are tracked
for renewal (``ha_controller.proxy.ack``).  A lite consumer's receive
(``ha_controller.proxy.lite``) is an orderly POP that lets through only the lite topics
its group subscribes, in slices of :data:`OTHER_GROUPS_SLICE_MS` so that a new
subscription is seen within about a second; while the group subscribes none, nothing
is popped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final

import grpc

from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BadRequest, HaError, TopicNotFound
from ha_controller.protocol.properties import PROPERTY_POP_CK, now_ms, retry_topic
from ha_controller.protocol.topics import TopicMessageType
from ha_controller.protocol.validation import (
    check_consumer_group,
    check_invisible_ms,
    check_topic,
)
from ha_controller.proxy import convert
from ha_controller.proxy.core import MAX_BATCH, GatewayCore
from ha_controller.proxy.handles import GatewayHandle
from ha_controller.proxy.limits import ThrottledLog, client_id
from ha_controller.proxy.lite import LiteService
from ha_controller.proxy.renewal import RenewalTable
from ha_controller.routing import Perm

log = logging.getLogger(__name__)

__all__ = ["POLL_SLICE_MS", "Receiver"]

#: POP waits at most this long per call, so retry-topic messages and route
#: changes are seen at least this often during a long poll.
POLL_SLICE_MS: Final = 5000
#: ... and this long when other groups serve the topic too, whose messages the
#: receive looks for between its waits on the group it names
OTHER_GROUPS_SLICE_MS: Final = 1000
#: what is left of the invisible time of a message popped for a receive that is gone
#: (RocketMQ's proxy ``invisibleTimeMillisWhenClear``)
RELEASE_INVISIBLE_MS: Final = 1000
#: releases under way at once; beyond, messages are left to their invisible time
MAX_RELEASES: Final = 1024


class Receiver:
    """ReceiveMessage, and whether a consumer group is orderly."""

    def __init__(
        self, core: GatewayCore, renewals: RenewalTable, lite: LiteService | None = None
    ) -> None:
        self.core = core
        self.renewals = renewals
        self.lite = lite
        self._failures = ThrottledLog(log)  # failed receives: one line per kind per 10 s
        self._orderly: dict[str, tuple[float, bool]] = {}  # group -> (until, orderly)
        #: background releases of messages popped for receives that are gone
        self._releases: set[asyncio.Task[None]] = set()

    async def receive(
        self, request: v2s.ReceiveMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        core = self.core
        messages: list[v2.Message] = []
        code: int = v2.OK
        text = "OK"
        cid = client_id(context)
        if cid:
            core.sessions.get(cid)  # a push consumer's long polls keep it alive
        core.metrics.held_receives.inc()
        try:
            messages = await self._receive(request, context)
            if messages and request.auto_renew and cid:
                self._track_for_renewal(cid, request, messages)
            if not messages:
                code, text = v2.MESSAGE_NOT_FOUND, "no new message"
        except (HaError, OSError, TimeoutError) as exc:
            code, text = convert.code_for(exc), f"{type(exc).__name__}: {exc}"
            self._failures(type(exc).__name__, logging.INFO, "ReceiveMessage failed: %s", text)
        finally:
            core.metrics.held_receives.dec()
        core.count("ReceiveMessage", code)
        written = 0
        try:
            yield v2s.ReceiveMessageResponse(status=convert.status(code, text))
            if messages:  # the SDKs measure delivery latency from it (Python's push needs it)
                yield v2s.ReceiveMessageResponse(
                    delivery_timestamp=convert.timestamp_of_ms(now_ms())
                )
            for m in messages:
                yield v2s.ReceiveMessageResponse(message=m)
                written += 1
        except BaseException:
            # the client went away: what it did not get comes back at once (below)
            left = messages[written:]
            handles = [GatewayHandle.decode(m.system_properties.receipt_handle) for m in left]
            self._release_later(request.group.name, request.message_queue.topic.name, handles)
            raise

    def _track_for_renewal(
        self, cid: str, request: v2s.ReceiveMessageRequest, messages: list[v2.Message]
    ) -> None:
        group = request.group.name
        for m in messages:
            sp = m.system_properties
            handle = GatewayHandle.decode(sp.receipt_handle)
            invisible_ms = convert.ms_of_duration(sp.invisible_duration)
            if not self.renewals.add(cid, group, m.topic.name, handle, invisible_ms):
                self.core.metrics.renewals.labels(result="dropped").inc()
        self.core.metrics.renewing.set(len(self.renewals))

    async def _receive(
        self, request: v2s.ReceiveMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> list[v2.Message]:
        cfg = self.core.cfg
        group = request.group.name
        mq = request.message_queue
        topic, broker = mq.topic.name, mq.broker.name
        check_topic(topic)
        check_consumer_group(group)
        if not broker:
            raise BadRequest("ReceiveMessage needs a message queue")
        batch = max(1, min(request.batch_size or MAX_BATCH, MAX_BATCH))
        invisible_ms = (
            convert.ms_of_duration(request.invisible_duration)
            if request.HasField("invisible_duration")
            else cfg.default_invisible_ms
        )
        # RocketMQ's bounds; a push consumer's receive (auto-renewed) has no floor
        floor = 0 if request.auto_renew else cfg.receive_min_invisible_ms
        check_invisible_ms(invisible_ms, min_ms=floor, max_ms=cfg.max_invisible_ms)
        poll_ms = (
            convert.ms_of_duration(request.long_polling_timeout)
            if request.HasField("long_polling_timeout")
            else cfg.long_polling_timeout_ms
        )
        remaining = context.time_remaining()
        if remaining is not None:  # answer before the client's deadline
            poll_ms = min(poll_ms, int(remaining * 1000) - 1000)
        tags, sql92 = convert.filter_of(request.filter_expression)
        deadline = time.monotonic() + max(0, poll_ms) / 1000
        # a lite receive: the client said it is a lite consumer, or (its session lost,
        # say, and made again by this call) its group subscribes lite topics here
        session = self.core.sessions.find(client_id(context))
        lite = None
        if self.lite is not None and (
            (session is not None and session.lite) or self.lite.group_topics(group, topic)
        ):
            lite = self.lite
        # a lite group is consumed in order: per lite topic, since each has one queue
        orderly = lite is not None or await self.group_orderly(group, topic)
        #: a lite receive's filter: the lite topics its group subscribes (None: not lite)
        names: frozenset[str] | None = None

        async def pop(name: str, pop_topic: str, wait_ms: int) -> list[v2.Message]:
            got = await pop_any(name, pop_topic, wait_ms)
            if lite is None or not got:
                return got
            # a pop held at the broker keeps the lite topics it was sent with: what the
            # group unsubscribed meanwhile goes back at once (its next pop passes over it)
            now = lite.group_topics(group, topic)
            gone = [m for m in got if m.system_properties.lite_topic not in now]
            if gone:
                handles = [GatewayHandle.decode(m.system_properties.receipt_handle) for m in gone]
                self._release_later(group, topic, handles)
                got = [m for m in got if m.system_properties.lite_topic in now]
            return got

        async def pop_any(name: str, pop_topic: str, wait_ms: int) -> list[v2.Message]:
            addr = await self.core.group_addr(topic, name)
            return await self._pop(
                addr,
                group,
                pop_topic,
                topic,
                name,
                -1,  # any queue of the group, as RocketMQ's proxy pops (the id is a hint)
                batch,
                invisible_ms,
                wait_ms,
                tags,
                sql92,
                order=orderly and pop_topic == topic,
                lite_topics=names,
            )

        # a PRIORITY topic's redeliveries come after its levels, as RocketMQ's
        # default (popFromRetryProbabilityForPriority 0) has them: last
        retry_last = await self.core.topic_type(topic) is TopicMessageType.PRIORITY
        while True:
            if lite is not None:
                names = lite.group_topics(group, topic)
                if not names:  # nothing subscribed: nothing to pop (it would pass all over)
                    left_s = deadline - time.monotonic()
                    if left_s <= 0:
                        return []
                    await lite.wait_change(group, topic, min(left_s, POLL_SLICE_MS / 1000))
                    continue
            # the group the request names, then every other group that serves the
            # topic's reads, without waiting: a client that long-polls a drained group
            # (after a failover its messages sit in the other one) still gets the
            # others' messages within a slice, not after its whole long poll
            for name in await self._groups_to_read(topic, broker):
                got = await self._pop_quietly(name, topic, pop) if retry_last else []
                if not got:
                    got = await self._pop_retry(group, topic, name, pop, quiet=name != broker)
                if not got and name != broker and not retry_last:
                    got = await self._pop_quietly(name, topic, pop)
                if got:
                    return got
            others = len(await self._groups_to_read(topic, broker)) > 1
            left_ms = int((deadline - time.monotonic()) * 1000)
            slice_ms = OTHER_GROUPS_SLICE_MS if others or lite is not None else POLL_SLICE_MS
            got = await pop(broker, topic, max(0, min(left_ms, slice_ms)))
            if got or time.monotonic() >= deadline:
                return got

    async def _groups_to_read(self, topic: str, broker: str) -> list[str]:
        """``broker`` first, then the other groups whose queues of ``topic`` are
        readable and that have an id 0 (a master or an acting slave)."""
        try:
            route = await self.core.route(topic)
        except (HaError, OSError, TimeoutError):
            return [broker]
        perms = {qd.broker_name: qd.perm for qd in route.queue_datas}
        others = sorted(
            b.broker_name
            for b in route.broker_datas
            if b.broker_name != broker
            and 0 in b.broker_addrs
            and Perm.is_readable(perms.get(b.broker_name, 0))
        )
        return [broker, *others]

    async def _pop_quietly(
        self, name: str, topic: str, pop: Callable[[str, str, int], Awaitable[list[v2.Message]]]
    ) -> list[v2.Message]:
        """Another group's messages, no wait; a group that cannot be read now (it
        lost its master a moment ago) is skipped, not the whole receive failed."""
        try:
            return await pop(name, topic, 0)
        except (HaError, OSError, TimeoutError) as exc:
            log.debug("receive from %s skipped: %s", name, exc)
            return []

    async def group_orderly(self, group: str, topic: str, *, fresh: bool = False) -> bool:
        """Whether consumer group ``group`` consumes orderly: named in ``fifo_groups``,
        or its subscription group config (``hactl group update G --orderly``) on a
        group of ``topic``'s route says so.  Cached for the route TTL (at least 1 s);
        ``fresh`` asks the broker again (a consumer's settings: an SDK keeps the answer
        for its whole life, so one started after the group changed must not be told the
        old one, and its receives then see the new one too)."""
        core = self.core
        if group in core.cfg.fifo_groups:
            return True
        now = time.monotonic()
        cached = self._orderly.get(group)
        if cached is not None and now < cached[0] and not fresh:
            return cached[1]
        orderly = cached[1] if cached is not None else False
        try:
            route = await core.route(topic)
            addrs = [a for b in route.broker_datas if (a := b.broker_addrs.get(0)) is not None]
            for addr in addrs:
                table = await core.pool.call_pb(
                    addr,
                    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
                    common_pb2.Empty(),
                    broker_pb2.SubscriptionGroupTable,
                    core.cfg.broker_timeout_ms,
                )
                orderly = any(g.consume_orderly for g in table.groups if g.group_name == group)
                break  # every master holds the same table (hactl sets it on all)
        except (HaError, OSError, TimeoutError) as exc:
            log.info("subscription group of %s not read (%s): orderly=%s kept", group, exc, orderly)
        self._orderly[group] = (now + max(1.0, core.cfg.route_ttl_ms / 1000), orderly)
        return orderly

    async def _pop_retry(
        self,
        group: str,
        topic: str,
        name: str,
        pop: Callable[[str, str, int], Awaitable[list[v2.Message]]],
        *,
        quiet: bool,
    ) -> list[v2.Message]:
        """Messages the revive service re-delivered (``%RETRY%group``) in group
        ``name``, no wait (``quiet``: a group that cannot be read now is skipped)."""
        try:
            return await pop(name, retry_topic(group), 0)
        except TopicNotFound:
            return []
        except (HaError, OSError, TimeoutError) as exc:
            if not quiet:
                raise
            log.debug("retry receive from %s skipped: %s", name, exc)
            return []

    # ---- what a gone client was handed -------------------------------------------------

    def _release_later(self, group: str, topic: str, handles: list[GatewayHandle]) -> None:
        """Make messages popped for a client that is gone visible again within about a
        second (RocketMQ's proxy: ``invisibleTimeMillisWhenClear``), in the background.
        Left alone they would come back only after their invisible time, from the retry
        topic: after later messages, out of order for a FIFO group whose consumer was
        just restarted (its old long poll still popped what arrived)."""
        if not handles:
            return
        if len(self._releases) >= MAX_RELEASES:
            log.info(
                "%d release(s) under way: %d message(s) left to their invisible time",
                len(self._releases),
                len(handles),
            )
            return

        async def release() -> None:
            for h in handles:
                h = self.renewals.take(group, h)  # the newest handle; no more renewals
                try:
                    addr = await self.core.group_addr(topic, h.broker_name)
                    await self._nack(addr, group, h.pop_topic, h.broker_handle)
                except (HaError, OSError, TimeoutError) as exc:
                    log.debug("release of %s/%d skipped: %s", h.broker_name, h.queue_offset, exc)

        self._spawn(release())

    def _release_popped(
        self, call: asyncio.Future[broker_pb2.PopMessageResponse], addr: str, group: str, topic: str
    ) -> None:
        """The broker still holds a pop whose receive is gone: release what it pops."""
        if len(self._releases) >= MAX_RELEASES:
            call.cancel()
            return

        async def release() -> None:
            try:
                resp = await call
            except (HaError, OSError, TimeoutError):
                return
            for m in resp.messages:
                try:
                    await self._nack(addr, group, topic, m.properties.get(PROPERTY_POP_CK, ""))
                except (HaError, OSError, TimeoutError) as exc:
                    log.debug("release of %s/%d skipped: %s", topic, m.queue_offset, exc)

        self._spawn(release())

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work, name="proxy-receive-release")
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _nack(self, addr: str, group: str, topic: str, broker_handle: str) -> None:
        if not broker_handle:
            return
        await self.core.pool.call_pb(
            addr,
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
            broker_pb2.AckMessageRequest(
                consumer_group=group,
                topic=topic,
                receipt_handle=broker_handle,
                invisible_time_ms=RELEASE_INVISIBLE_MS,
            ),
            broker_pb2.AckMessageResponse,
            self.core.cfg.broker_timeout_ms,
        )

    async def aclose(self) -> None:
        """Wait a little for releases under way, then cancel what is left."""
        if self._releases:
            _, pending = await asyncio.wait(list(self._releases), timeout=2.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _pop(
        self,
        addr: str,
        group: str,
        pop_topic: str,
        topic: str,
        broker: str,
        queue_id: int,
        batch: int,
        invisible_ms: int,
        poll_ms: int,
        tags: list[str],
        sql92: str,
        *,
        order: bool = False,
        lite_topics: frozenset[str] | None = None,
    ) -> list[v2.Message]:
        call = asyncio.ensure_future(
            self.core.pool.call_pb(
                addr,
                RequestCode.POP_MESSAGE,
                broker_pb2.PopMessageRequest(
                    consumer_group=group,
                    topic=pop_topic,
                    queue_id=queue_id,
                    max_msg_nums=batch,
                    invisible_time_ms=invisible_ms,
                    poll_time_ms=poll_ms,
                    tags=tags,
                    sql92=sql92,
                    order=order,
                    lite=lite_topics is not None,
                    lite_topics=lite_topics or (),
                ),
                broker_pb2.PopMessageResponse,
                poll_ms + self.core.cfg.broker_timeout_ms,
            )
        )
        try:
            resp = await asyncio.shield(call)
        except asyncio.CancelledError:
            # the receive is gone (the client left, or its deadline passed) while the
            # broker holds the pop: whatever it pops now nobody receives
            self._release_popped(call, addr, group, pop_topic)
            raise
        invisible = resp.invisible_time_ms or invisible_ms
        until = (resp.pop_time_ms or now_ms()) + invisible
        out = []
        for m in resp.messages:
            handle = GatewayHandle(
                broker_name=m.broker_name or broker,
                pop_topic=pop_topic,
                queue_id=m.queue_id,
                queue_offset=m.queue_offset,
                broker_handle=m.properties.get(PROPERTY_POP_CK, ""),
                invisible_until_ms=until,
            )
            out.append(
                convert.message_to_v2(
                    m, topic=topic, receipt_handle=handle.encode(), invisible_ms=invisible
                )
            )
        return out
