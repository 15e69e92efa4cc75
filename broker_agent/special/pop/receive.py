"""POP_MESSAGE (200050): RocketMQ's PopMessageProcessor.

A pop takes messages from a topic's queues for a consumer group (the pop offset is
the group's consumer offset, so it is forward-synced to slaves and reverse-synced in
pre-online like any other), returns each with a receipt handle in the ``POP_CK``
property and writes a checkpoint (CK) record (:mod:`.records`, :mod:`.revive_log`).
A pop that finds nothing is held (long polling) until a message arrives or its poll
time is over.  A pop of any queue of a PRIORITY topic, not orderly, visits the queues
highest first (:mod:`ha_controller.protocol.priority`); others go round robin.

Orderly pops (:mod:`.order`) write no CK.  An acting slave taking over has no order
locks: it gives a queue with unconsumed messages to nobody for one invisible time
first, so a batch still in a consumer's hands is popped again only once its invisible
time is over, in order.  A restarted master starts without locks: a batch in flight
before the restart can be handed out again at once (a duplicate, in order).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from broker_agent.convert import message_to_pb
from broker_agent.metadata.subscriptions import SubscriptionGroupManager
from broker_agent.special.pop.order import OrderBatch, OrderLocks
from broker_agent.special.pop.records import (
    MAX_POP_BATCH,
    MIN_INVISIBLE_MS,
    TAG_CK,
    Checkpoint,
    ReceiptHandle,
)
from broker_agent.special.pop.revive_log import ReviveLog
from broker_agent.special.ports import CorePort, WritePort
from broker_agent.store.message_store import GetMessageStatus, GetResult
from ha_controller.filter.selector import Selector
from ha_controller.proto import broker_pb2
from ha_controller.protocol.errors import BadRequest, TopicNotFound
from ha_controller.protocol.priority import pop_order
from ha_controller.protocol.properties import PROPERTY_POP_CK, PROPERTY_RECONSUME_TIME, retry_topic
from ha_controller.protocol.record import StoredMessage
from ha_controller.protocol.topics import TopicMessageType
from ha_controller.routing import Perm, TopicConfig
from ha_controller.rpc import RequestContext

__all__ = ["PopMessageProcessor"]

log = logging.getLogger(__name__)


#: Read statuses whose ``next_begin_offset`` is where the group's offset belongs: below
#: the queue's first (retention), past its end (its recovery mark, ``store.marks``).
_MOVED = frozenset({GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY})


class PopMessageProcessor:
    """POP_MESSAGE, plain and orderly, with its long polling."""

    def __init__(
        self,
        core: CorePort,
        write_path: WritePort,
        revive_log: ReviveLog,
        subscriptions: SubscriptionGroupManager,
        clock: Callable[[], int],
    ) -> None:
        self.core = core
        self.write_path = write_path
        self.revive_log = revive_log
        self.subscriptions = subscriptions
        self._clock = clock
        self.order = OrderLocks()
        self._order_wake = asyncio.Event()
        self._locks: dict[tuple[str, str, int], asyncio.Lock] = {}
        self._rr = 0

    def started(self) -> None:
        """This broker starts serving pops: an acting slave does not know the orderly
        batches the lost master handed out, so its queues wait one invisible time (a
        master starts with no lock: a batch in flight before its restart may come
        again)."""
        self.order.reset(0 if self.core.acting.is_master else self._clock())

    def order_done(self, group: str, topic: str, handle: ReceiptHandle) -> None:
        """An ack of an orderly message: the batch's queue moves on once it is all acked."""
        key = (group, topic, handle.queue_id)
        next_offset = self.order.ack(key, handle.pop_time_ms, handle.offset)
        if next_offset is None:
            return
        self.write_path.commit_offset(group, topic, handle.queue_id, next_offset)
        wake, self._order_wake = self._order_wake, asyncio.Event()
        wake.set()

    def _ensure_retry_topic(self, group: str) -> None:
        """RocketMQ creates ``%RETRY%group`` when a consumer shows up; so do we (masters)."""
        core = self.core
        topic = retry_topic(group)
        if not core.acting.is_master or core.topics.get(topic) is not None:
            return
        core.topics.upsert(TopicConfig(topic, 1, 1, Perm.READ | Perm.WRITE))
        log.info("created retry topic %s", topic)
        core.topics_changed()

    def _to_pb(self, m: StoredMessage, handle: str) -> broker_pb2.Message:
        props = dict(m.properties)
        props[PROPERTY_POP_CK] = handle
        return message_to_pb(
            m,
            self.core.cfg.broker_name,
            properties=props,
            reconsume_times=int(props.get(PROPERTY_RECONSUME_TIME, "0") or 0),
        )

    async def handle(
        self, ctx: RequestContext, req: broker_pb2.PopMessageRequest
    ) -> broker_pb2.PopMessageResponse:
        self.core.check_master_only("POP_MESSAGE")
        core = self.core
        if not req.consumer_group or not req.topic:
            raise BadRequest("POP_MESSAGE needs a consumer group and a topic")
        self._ensure_retry_topic(req.consumer_group)
        config = core.topics.get(req.topic)
        # an acting slave may not have synced a config the lost master created
        # just before it died: its replicated queues are enough to serve pops
        stored = [] if config is not None else core.store.topics_and_queues().get(req.topic, [])
        if config is None and not stored:
            raise TopicNotFound(f"topic {req.topic!r} does not exist on {core.cfg.broker_name}")
        all_qids = list(range(config.read_queue_nums)) if config is not None else stored
        # a PRIORITY topic's queues are its levels: highest first (not orderly)
        by_priority = config is not None and config.message_type is TopicMessageType.PRIORITY
        self._rr += 1
        start = self._rr
        # a bad SQL92 is refused before anything is popped (IllegalFilterExpression)
        select = Selector.of_request(req.tags, req.sql92, req.lite_topics if req.lite else None)
        max_msgs = max(1, min(req.max_msg_nums or MAX_POP_BATCH, MAX_POP_BATCH))
        invisible = max(MIN_INVISIBLE_MS, req.invisible_time_ms)
        resp = broker_pb2.PopMessageResponse(invisible_time_ms=invisible)
        deadline = time.monotonic() + max(0, req.poll_time_ms) / 1000
        while True:
            # asked again after every wait: a pop held while its group turned orderly
            # (hactl group update G --orderly) must not hand out a new message the old
            # way, behind the back of the group's new orderly consumers
            orderly = req.order or self.subscriptions.orderly(req.consumer_group)
            if req.queue_id >= 0:
                qids = [req.queue_id]
            else:
                qids = pop_order(all_qids, start, priority=by_priority and not orderly)
            pop_queue = self._pop_queue_orderly if orderly else self._pop_queue
            pop_ms = self.revive_log.pop_time()
            resp.pop_time_ms = pop_ms
            for qid in qids:
                if len(resp.messages) >= max_msgs:
                    break
                resp.messages.extend(
                    await pop_queue(
                        req.consumer_group,
                        req.topic,
                        qid,
                        max_msgs - len(resp.messages),
                        select,
                        pop_ms,
                        invisible,
                    )
                )
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if resp.messages:
                # the offsets this pop moved survive a power loss before it is answered
                # (sync flush; the CKs are synced with the commit log), or the messages
                # are popped again after one
                await self.write_path.durable(core.offsets)
                return resp
            if remaining_ms <= 0 or not core.acting.serves_master_only_ops:
                return resp
            await self._hold(
                req.consumer_group,
                req.topic,
                qids,
                remaining_ms,
                select.tag_hashes,
                orderly=orderly,
            )

    async def _hold(
        self,
        group: str,
        topic: str,
        qids: list[int],
        timeout_ms: int,
        tags: set[int] | None,
        *,
        orderly: bool = False,
    ) -> None:
        """Wait (long polling) until one of the queues gets a message, or the timeout;
        orderly: also until an orderly batch is done, or a second (a lock may expire)."""
        core = self.core
        waits: list[asyncio.Future[object]] = []
        if orderly:
            timeout_ms = min(timeout_ms, 1000)
            waits.append(asyncio.ensure_future(self._order_wake.wait()))
        waits.extend(
            asyncio.ensure_future(
                core.holds.hold(topic, qid, self._start(group, topic, qid), timeout_ms, tags)
            )
            for qid in qids
        )
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    def _start(self, group: str, topic: str, qid: int) -> int:
        """The group's offset in the queue, or the queue's first when it has none."""
        core = self.core
        offset = core.offsets.query(group, topic, qid)
        return core.store.min_offset(topic, qid) if offset < 0 else offset

    def _read(
        self, topic: str, qid: int, start: int, max_msgs: int, select: Selector
    ) -> tuple[int, GetResult]:
        """Messages from ``start`` (from the queue's first when ``start`` is below it,
        from its recovery mark when ``start`` is past its end: the group's offset is of
        a tail an unclean stop lost, see ``store.marks``)."""
        store = self.core.store
        tags, props = select.tag_hashes, select.properties
        got = store.get_messages(topic, qid, start, max_msgs, tag_filter=tags, message_filter=props)
        if got.status in _MOVED:
            start = got.next_begin_offset
            got = store.get_messages(
                topic, qid, start, max_msgs, tag_filter=tags, message_filter=props
            )
        return start, got

    def _skip_unmatched(self, group: str, topic: str, qid: int, start: int, got: GetResult) -> None:
        """Nothing to hand out, but the queue's entries up to ``got``'s end are filtered
        out or unreadable: the group's offset moves past them.  A group offset past the
        queue's end (read from its recovery mark, see :meth:`_read`) moves back to
        ``start``."""
        if self.core.offsets.query(group, topic, qid) > got.max_offset >= start:
            self.write_path.commit_offset(group, topic, qid, start)
            return
        if got.next_begin_offset > start and got.status in (
            GetMessageStatus.NO_MATCHED_MESSAGE,
            GetMessageStatus.OFFSET_FOUND_NULL,
        ):
            self.write_path.commit_offset(group, topic, qid, got.next_begin_offset)

    def _count_out(self, topic: str, group: str, n: int) -> None:
        metrics = self.core.metrics
        metrics.messages_out.labels(**metrics.ident, topic=topic, group=group).inc(n)

    async def _pop_queue(
        self,
        group: str,
        topic: str,
        qid: int,
        max_msgs: int,
        select: Selector,
        pop_ms: int,
        invisible_ms: int,
    ) -> list[broker_pb2.Message]:
        core = self.core
        lock = self._locks.setdefault((group, topic, qid), asyncio.Lock())
        async with lock:
            # served still (a pop waiting for the lock may find its acting slave held
            # for the returning master): nothing awaits from here to the step below
            core.check_master_only("POP_MESSAGE")
            start, got = self._read(topic, qid, self._start(group, topic, qid), max_msgs, select)
            if not got.messages:
                self._skip_unmatched(group, topic, qid, start, got)
                return []
            ck = Checkpoint(
                broker_name=core.cfg.broker_name,
                group=group,
                topic=topic,
                queue_id=qid,
                start_offset=start,
                offsets=tuple(m.queue_offset for m in got.messages),
                pop_time_ms=pop_ms,
                invisible_ms=invisible_ms,
                due_ms=pop_ms + invisible_ms,
            )
            # the CK and the offset it moves are one step: an acting slave answers its
            # returning master only once no step is under way, so the offsets the
            # master takes count this pop (else it pops the messages again: two CKs,
            # two revives, long campaign seed 1032)
            with core.special_steps.step():
                revive_qid, local, holder = await self.revive_log.write(
                    ck.to_json(), TAG_CK, ck.key, "pop_ck"
                )
                self.write_path.commit_offset(group, topic, qid, got.next_begin_offset)
        out = []
        for m in got.messages:
            handle = ReceiptHandle(
                start,
                pop_ms,
                invisible_ms,
                revive_qid,
                local,
                core.cfg.broker_name,
                qid,
                m.queue_offset,
                ck_group="" if local else holder,
            )
            out.append(self._to_pb(m, handle.encode()))
        self._count_out(topic, group, len(out))
        return out

    async def _pop_queue_orderly(
        self,
        group: str,
        topic: str,
        qid: int,
        max_msgs: int,
        select: Selector,
        pop_ms: int,
        invisible_ms: int,
    ) -> list[broker_pb2.Message]:
        """One batch of one queue for an orderly group, unless a batch holds the queue."""
        core = self.core
        key = (group, topic, qid)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            now = self._clock()
            if self.order.locked(key, now):
                return []
            start = self._start(group, topic, qid)
            previous = self.order.get(key)
            if (
                previous is None
                and now < self.order.started_ms + invisible_ms
                and start < core.store.max_offset(topic, qid)
            ):
                return []  # just started serving: a batch may be in flight elsewhere
            start, got = self._read(topic, qid, start, max_msgs, select)
            if not got.messages:
                self.order.release(key)
                self._skip_unmatched(group, topic, qid, start, got)
                return []
            # an expired batch comes again from the group's offset; what of it was
            # acked already is not handed out twice
            acked = previous.acked if previous is not None else set()
            attempts = previous.attempts + 1 if previous is not None else 0
            batch = OrderBatch(
                offsets=tuple(m.queue_offset for m in got.messages),
                next_offset=got.next_begin_offset,
                pop_ms=pop_ms,
                until_ms=pop_ms + invisible_ms,
                attempts=attempts,
                acked={o for o in acked if any(m.queue_offset == o for m in got.messages)},
            )
            if batch.done:  # everything acked: the group's offset moves on
                self.write_path.commit_offset(group, topic, qid, batch.next_offset)
                self.order.release(key)
                return []
            self.order.lock(key, batch)
        out = []
        for m in got.messages:
            if m.queue_offset in batch.acked:
                continue
            handle = ReceiptHandle(
                start,
                pop_ms,
                invisible_ms,
                -1,
                False,
                core.cfg.broker_name,
                qid,
                m.queue_offset,
                orderly=True,
            )
            pb = self._to_pb(m, handle.encode())
            pb.reconsume_times += attempts
            out.append(pb)
        self._count_out(topic, group, len(out))
        return out
