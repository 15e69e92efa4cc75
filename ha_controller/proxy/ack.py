"""AckMessage, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue, and the
renewal of push consumers' invisible time.

Each goes to the group the receipt handle names.  A message a push consumer received
with auto-renew is kept invisible by the gateway (CHANGE_MESSAGE_INVISIBLETIME before
its time runs out) until the client acks it, nacks it, or is gone; a message is
*settled* first (a renewal of it in flight finishes, and none follows) so that an ack
always carries the newest broker handle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Final

import grpc

from ha_controller.proto import broker_pb2
from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import HaError, NotMaster
from ha_controller.protocol.properties import (
    PROPERTY_POP_CK,
    PROPERTY_RETRY_TOPIC,
    dlq_topic,
    now_ms,
)
from ha_controller.protocol.validation import check_invisible_ms
from ha_controller.proxy import convert
from ha_controller.proxy.core import GatewayCore, retriable
from ha_controller.proxy.handles import GatewayHandle
from ha_controller.proxy.renewal import CLIENT_GONE_S, Key, Renewal, RenewalTable, key_of

log = logging.getLogger(__name__)

__all__ = ["Acker"]

#: How often the gateway looks for push-consumer messages to renew.
RENEW_SCAN_S: Final = 0.2
#: Renewals in flight at once at most.
MAX_CONCURRENT_RENEWALS: Final = 64


class Acker:
    """Acks, invisible time and dead letters; the renewal loop."""

    def __init__(self, core: GatewayCore, renewals: RenewalTable) -> None:
        self.core = core
        self.renewals = renewals
        self._renewing: dict[Key, asyncio.Future[None]] = {}

    # ---- AckMessage ---------------------------------------------------------------------

    async def ack(
        self, request: v2s.AckMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> v2s.AckMessageResponse:
        async def work() -> v2s.AckMessageResponse:
            group, topic = request.group.name, request.topic.name
            results = []
            for e in request.entries:
                try:
                    await self._ack(group, topic, GatewayHandle.decode(e.receipt_handle))
                    st = convert.status()
                except (HaError, OSError, TimeoutError) as exc:
                    st = convert.status(convert.code_for(exc), f"{type(exc).__name__}: {exc}")
                results.append(
                    v2s.AckMessageResultEntry(
                        message_id=e.message_id, receipt_handle=e.receipt_handle, status=st
                    )
                )
            codes = {r.status.code for r in results}
            if len(codes) <= 1:
                overall = results[0].status if results else convert.status()
            else:
                overall = convert.status(v2.MULTIPLE_RESULTS, "some entries failed")
            return v2s.AckMessageResponse(status=overall, entries=results)

        return await self.core.answer("AckMessage", v2s.AckMessageResponse, work)

    async def _ack(self, group: str, topic: str, h: GatewayHandle) -> None:
        h = await self._settle(group, h)
        await self.core.call_group(
            topic,
            h.broker_name,
            RequestCode.ACK_MESSAGE,
            broker_pb2.AckMessageRequest(
                consumer_group=group, topic=h.pop_topic, receipt_handle=h.broker_handle
            ),
            broker_pb2.AckMessageResponse,
        )

    # ---- ChangeInvisibleDuration --------------------------------------------------------

    async def change_invisible(
        self,
        request: v2s.ChangeInvisibleDurationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> v2s.ChangeInvisibleDurationResponse:
        async def work() -> v2s.ChangeInvisibleDurationResponse:
            group, topic = request.group.name, request.topic.name
            h = GatewayHandle.decode(request.receipt_handle)
            invisible_ms = convert.ms_of_duration(request.invisible_duration)
            check_invisible_ms(invisible_ms, max_ms=self.core.cfg.max_invisible_ms)
            h = await self._settle(group, h)  # a nack: no more renewals
            new = await self._change(group, topic, h, invisible_ms)
            return v2s.ChangeInvisibleDurationResponse(
                status=convert.status(), receipt_handle=new.encode()
            )

        return await self.core.answer(
            "ChangeInvisibleDuration", v2s.ChangeInvisibleDurationResponse, work
        )

    async def _change(
        self, group: str, topic: str, h: GatewayHandle, invisible_ms: int
    ) -> GatewayHandle:
        """CHANGE_MESSAGE_INVISIBLETIME: the handle of the message's new invisibility."""
        started = now_ms()
        resp = await self.core.call_group(
            topic,
            h.broker_name,
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
            broker_pb2.AckMessageRequest(
                consumer_group=group,
                topic=h.pop_topic,
                receipt_handle=h.broker_handle,
                invisible_time_ms=invisible_ms,
            ),
            broker_pb2.AckMessageResponse,
        )
        return GatewayHandle(
            h.broker_name,
            h.pop_topic,
            h.queue_id,
            h.queue_offset,
            resp.receipt_handle or h.broker_handle,
            started + invisible_ms,
        )

    # ---- ForwardMessageToDeadLetterQueue ------------------------------------------------

    async def forward_to_dlq(
        self,
        request: v2s.ForwardMessageToDeadLetterQueueRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> v2s.ForwardMessageToDeadLetterQueueResponse:
        async def work() -> v2s.ForwardMessageToDeadLetterQueueResponse:
            group, topic = request.group.name, request.topic.name
            h = GatewayHandle.decode(request.receipt_handle)
            pulled = await self.core.call_group(
                topic,
                h.broker_name,
                RequestCode.PULL_MESSAGE,
                broker_pb2.PullMessageRequest(
                    topic=h.pop_topic,
                    queue_id=h.queue_id,
                    queue_offset=h.queue_offset,
                    max_msg_nums=1,
                    commit_offset=-1,
                ),
                broker_pb2.PullMessageResponse,
            )
            original = next((m for m in pulled.messages if m.queue_offset == h.queue_offset), None)
            if original is not None:
                await self._send_dlq(group, topic, original)
            else:
                log.warning(
                    "DLQ: %s@%s#%d offset %d is gone",
                    h.pop_topic,
                    h.broker_name,
                    h.queue_id,
                    h.queue_offset,
                )
            await self._ack(group, topic, h)
            return v2s.ForwardMessageToDeadLetterQueueResponse(status=convert.status())

        return await self.core.answer(
            "ForwardMessageToDeadLetterQueue", v2s.ForwardMessageToDeadLetterQueueResponse, work
        )

    async def _send_dlq(self, group: str, topic: str, m: broker_pb2.Message) -> None:
        core = self.core
        props = {k: v for k, v in m.properties.items() if k != PROPERTY_POP_CK}
        props.setdefault(PROPERTY_RETRY_TOPIC, topic)
        queues = convert.writable_queues(await core.route(topic, fresh=True))
        last: BaseException | None = None
        for addr in dict.fromkeys(q.addr for q in queues):
            try:
                await core.pool.call_pb(
                    addr,
                    RequestCode.SEND_MESSAGE,
                    broker_pb2.SendMessageRequest(
                        producer_group=group,
                        topic=dlq_topic(group),
                        queue_id=0,
                        entries=[
                            broker_pb2.SendEntry(
                                body=m.body, properties=props, born_ts_ms=m.born_ts_ms
                            )
                        ],
                        born_host=m.born_host,
                    ),
                    broker_pb2.SendMessageResponse,
                    core.cfg.broker_timeout_ms,
                )
                return
            except (HaError, OSError, TimeoutError) as exc:
                if not retriable(exc):
                    raise
                last = exc
        raise last or NotMaster(f"no writable group for {dlq_topic(group)}")

    # ---- invisible-time renewal (push consumers) ----------------------------------------

    def _client_alive(self, cid: str) -> bool:
        s = self.core.sessions.find(cid)
        if s is None:
            return False
        return s.reachable or time.monotonic() - s.last_seen < CLIENT_GONE_S

    async def _settle(self, group: str, h: GatewayHandle) -> GatewayHandle:
        """A message is done (ack, nack, DLQ): after a renewal of it in flight, the
        newest broker handle, and no renewal any more."""
        key = key_of(group, h)
        pending = self._renewing.get(key)
        if pending is not None:
            await asyncio.shield(pending)
        newest = self.renewals.take(group, h)
        self.core.metrics.renewing.set(len(self.renewals))
        return newest

    async def renew_loop(self, stop: asyncio.Event) -> None:
        limit = asyncio.Semaphore(MAX_CONCURRENT_RENEWALS)
        async with asyncio.TaskGroup() as tg:
            while not stop.is_set():
                for r in self.renewals.due(self._client_alive):
                    await limit.acquire()
                    tg.create_task(self._renew(r, limit), name="proxy-renew")
                self.core.metrics.renewing.set(len(self.renewals))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RENEW_SCAN_S):
                        await stop.wait()

    async def _renew(self, r: Renewal, limit: asyncio.Semaphore) -> None:
        key = r.key
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._renewing[key] = done
        h = r.handle
        new: GatewayHandle | None = None
        try:
            new = await self._change(r.group, r.topic, h, r.invisible_ms)
            self.core.metrics.renewals.labels(result="ok").inc()
        except (HaError, OSError, TimeoutError) as exc:
            self.core.metrics.renewals.labels(result="failed").inc()
            log.info(
                "renewal of %s#%d offset %d for %s failed: %s",
                h.pop_topic,
                h.queue_id,
                h.queue_offset,
                r.group,
                exc,
            )
        finally:
            self.renewals.renewed(r, new)
            if self._renewing.get(key) is done:
                del self._renewing[key]
            done.set_result(None)
            limit.release()
