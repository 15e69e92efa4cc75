"""SEND_MESSAGE and PULL_MESSAGE."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from broker_agent.convert import message_to_pb
from broker_agent.core import BrokerCore
from broker_agent.special.escape_ids import REBUILD_BYTES, Escaped, EscapedIds
from broker_agent.special.schedule import delayed_target
from broker_agent.store.message_store import GetMessageStatus, GetResult
from broker_agent.write_path import WritePath
from ha_controller.filter.selector import Selector
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    BadRequest,
    InSyncReplicasNotEnough,
    MessageTypeConflict,
    SlaveAckTimeout,
)
from ha_controller.protocol.priority import priority_of, queue_for_priority
from ha_controller.protocol.properties import (
    PROPERTY_ESCAPE_ID,
    PROPERTY_PRIORITY,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_UNIQ_KEY,
)
from ha_controller.protocol.topics import TopicMessageType, message_type_of, message_type_problem
from ha_controller.routing import TopicConfig
from ha_controller.rpc import RequestContext

log = logging.getLogger(__name__)

MAX_PULL_BATCH = 256
# statuses that mean "nothing yet at this offset": a long-poll pull waits on them
WAITABLE = frozenset(
    {
        GetMessageStatus.NO_MATCHED_LOGIC_QUEUE,
        GetMessageStatus.NO_MESSAGE_IN_QUEUE,
        GetMessageStatus.OFFSET_OVERFLOW_ONE,
        GetMessageStatus.NO_MATCHED_MESSAGE,
        GetMessageStatus.OFFSET_FOUND_NULL,
    }
)

#: how long a long-poll pull that stopped at a damaged record waits for its repair
#: before it answers NO_NEW_MSG at that offset (the consumer asks again from there)
REPAIR_WAIT_S = 0.2

#: Where a sent entry is stored: (topic, queue, properties rewritten in place).
StoreTarget = Callable[[str, int, dict[str, str]], tuple[str, int]]


def check_message_types(config: TopicConfig, entries: Sequence[broker_pb2.SendEntry]) -> None:
    """MessageTypeConflict, before anything is stored, when a message is of a kind the
    topic does not take (RocketMQ's proxy checks the same, with the same words)."""
    for entry in entries:
        kind = message_type_of(entry.properties)
        problem = message_type_problem(config.topic_name, config.message_type, kind)
        if problem is not None:
            raise MessageTypeConflict(problem)


def priority_queue(config: TopicConfig, entries: Sequence[broker_pb2.SendEntry]) -> int | None:
    """The queue of a send of priority messages (their priority, clamped to the topic's
    write queues: ``ha_controller.protocol.priority``), or None for other messages.  A
    priority on a message of another kind is dropped, as RocketMQ's broker drops it.
    One send is stored in one queue, so the messages of a batch with a priority must
    share it (BadRequest, before anything is stored)."""
    queues: set[int] = set()
    others = 0
    for entry in entries:
        priority = priority_of(entry.properties)
        if priority is not None and message_type_of(entry.properties) is TopicMessageType.PRIORITY:
            queues.add(queue_for_priority(priority, config.write_queue_nums))
            continue
        if priority is not None:
            del entry.properties[PROPERTY_PRIORITY]
        others += 1
    if not queues:
        return None
    if len(queues) > 1 or others:
        raise BadRequest(
            f"a batch to {config.topic_name!r} mixes priority levels (queues "
            f"{sorted(queues)}{' and messages without a priority' if others else ''}): "
            "send priority messages of different levels apart"
        )
    return queues.pop()


class MessageHandlers:
    """The send and pull paths of one broker."""

    def __init__(self, core: BrokerCore, write_path: WritePath, half_target: StoreTarget) -> None:
        self.core = core
        self.write_path = write_path
        self._half_target = half_target  # the transaction service: a prepared message
        #: remote escapes stored here, so that a retried one is stored once (also those
        #: stored just before a restart: read back from the commit log)
        self.escaped = EscapedIds()
        rebuilt = self.escaped.rebuild(
            core.store.recent_messages_with(PROPERTY_ESCAPE_ID, REBUILD_BYTES)
        )
        if rebuilt:
            log.info("remembered %d escape(s) stored before this start", rebuilt)

    def register(self) -> None:
        add = self.core.dispatcher.add
        add(RequestCode.SEND_MESSAGE, broker_pb2.SendMessageRequest, self.send)
        add(RequestCode.PULL_MESSAGE, broker_pb2.PullMessageRequest, self.pull)

    def _store_target(self, topic: str, queue_id: int, props: dict[str, str]) -> tuple[str, int]:
        put_topic, put_qid = self._half_target(topic, queue_id, props)
        if put_topic == topic:  # a half message is not delayed until committed
            put_topic, put_qid = delayed_target(self.core.cfg, topic, queue_id, props)
        elif props.get(PROPERTY_UNIQ_KEY):
            # a half message carries its transaction id, and so does the committed
            # message (RocketMQ's broker sets it: clients read it from the properties)
            props[PROPERTY_TRANSACTION_ID] = props[PROPERTY_UNIQ_KEY]
        return put_topic, put_qid

    def _response(self) -> broker_pb2.SendMessageResponse:
        """An empty send answer; in controller mode it names the epoch and the member
        that acknowledge (a drill's split-brain check reads them).  The role is read
        when the answer is built: a role change rebuilds the service, so the epoch
        cannot move under a send that is still running."""
        core = self.core
        resp = broker_pb2.SendMessageResponse(broker_name=core.cfg.broker_name)
        if core.role.controlled:
            resp.epoch = core.role.epoch
            resp.member_id = core.member_id
        return resp

    async def send(
        self, ctx: RequestContext, req: broker_pb2.SendMessageRequest
    ) -> broker_pb2.SendMessageResponse:
        core, wp = self.core, self.write_path
        metrics = core.metrics
        core.check_online()
        if not core.acting.is_master:
            metrics.send_errors.labels(**metrics.ident, reason="not_master").inc()
        core.check_writable_master("SEND_MESSAGE")
        if not req.entries:
            raise BadRequest("send with no messages")
        if not req.member_escape or (core.auth.enabled and not ctx.authenticated):
            # only a cluster member's escape (marked, and signed when there is a secret:
            # auth.MEMBER_DATA_CODES) carries an escape id.  A client's is dropped, not
            # refused: a consumer that sends a received message on copies its
            # properties, and an escaped message has one; honoured, its send could be
            # taken for a repeat of the escape and not stored.  Stored, it would count
            # as an escape once a restart reads the ids back from the log.
            for entry in req.entries:
                if PROPERTY_ESCAPE_ID in entry.properties:
                    del entry.properties[PROPERTY_ESCAPE_ID]
        eid = req.entries[0].properties.get(PROPERTY_ESCAPE_ID, "") if len(req.entries) == 1 else ""
        if eid:
            earlier = self.escaped.find(eid, core.store.get_message_at, req.topic)
            if earlier is not None:
                # a retried escape whose first answer was lost: answer what we stored
                # (before the disk checks: it needs no new write), once its copies are
                # there as for a first store
                log.info(
                    "escape %s stored before at %s/%d: not stored again",
                    eid,
                    earlier.store_topic,
                    earlier.queue_offset,
                )
                if not req.no_replica_wait:
                    needed = wp.check_replicas()
                    if not await wp.confirm(earlier.physical_offset + 1, needed):
                        metrics.send_errors.labels(**metrics.ident, reason="replica_timeout").inc()
                        raise SlaveAckTimeout(
                            f"escape {eid} stored before but not confirmed by "
                            f"{needed - 1} slave(s) within {core.cfg.slave_ack_timeout_ms} ms"
                        )
                resp = self._response()
                resp.results.add(
                    msg_id=earlier.msg_id,
                    uniq_key=req.entries[0].properties.get(PROPERTY_UNIQ_KEY, ""),
                    queue_id=earlier.queue_id,
                    queue_offset=earlier.queue_offset,
                    commit_log_offset=earlier.physical_offset,
                )
                return resp
        core.check_store_writable("SEND_MESSAGE")
        # a member's escape hands on a message taken in before: its topic may be read-only
        config = wp.topic_for_delivery(req.topic) if eid else wp.topic_for_write(req.topic)
        if not eid:  # a member's escape hands on a message its topic took in before
            check_message_types(config, req.entries)
        queue_id = wp.pick_queue(config, req.queue_id, strict=True)
        by_priority = priority_queue(config, req.entries)
        if by_priority is not None:  # the priority picks the queue, not the producer
            queue_id = by_priority
        try:
            needed = wp.check_replicas()
        except InSyncReplicasNotEnough:
            metrics.send_errors.labels(**metrics.ident, reason="replicas").inc()
            raise
        resp = self._response()
        born_host = req.born_host or ctx.peer
        messages = []
        uniq_keys = []
        for entry in req.entries:
            props = dict(entry.properties)
            put_topic, put_qid = self._store_target(req.topic, queue_id, props)
            messages.append(
                wp.message(
                    put_topic,
                    put_qid,
                    entry.body,
                    props,
                    flags=entry.flag,
                    born_ts_ms=entry.born_ts_ms or None,
                    born_host=born_host,
                )
            )
            uniq_keys.append(props.get(PROPERTY_UNIQ_KEY, ""))
        if not eid:  # a member's escape hands on a message already taken in
            wp.check_client_size(messages)
        # all or nothing: NotWritable (nothing stored) sends the producer to another group
        results = wp.append_batch(messages)
        add = resp.results.add
        for uniq_key, result in zip(uniq_keys, results, strict=True):
            add(
                msg_id=result.msg_id,
                uniq_key=uniq_key,
                queue_id=queue_id,
                queue_offset=result.queue_offset,
                commit_log_offset=result.physical_offset,
            )
        if eid:  # nothing awaited since the lookup: a repeat finds this one
            first = results[0]
            self.escaped.add(
                eid,
                Escaped(
                    messages[0].topic,
                    messages[0].queue_id,
                    queue_id,
                    first.queue_offset,
                    first.msg_id,
                    first.physical_offset,
                ),
            )
        end = results[-1].physical_offset + results[-1].size
        wp.replicate()
        metrics.messages_in.labels(**metrics.ident, topic=req.topic).inc(len(req.entries))
        if not req.no_replica_wait and not await wp.confirm(end, needed):
            metrics.send_errors.labels(**metrics.ident, reason="replica_timeout").inc()
            raise SlaveAckTimeout(
                f"stored but not confirmed by {needed - 1} slave(s) within "
                f"{core.cfg.slave_ack_timeout_ms} ms"
            )
        return resp

    async def pull(
        self, ctx: RequestContext, req: broker_pb2.PullMessageRequest
    ) -> broker_pb2.PullMessageResponse:
        resp = await self._pull(ctx, req)
        # which store answered and whether its queues went back since the client read
        # from it (store.marks): where to return when they did
        store = self.core.store
        resp.store_id, resp.store_rewinds = store.rewinds()
        mark = store.recovery_mark(req.topic, req.queue_id)
        if mark is not None:
            resp.recovery_mark = mark
        return resp

    async def _pull(
        self, ctx: RequestContext, req: broker_pb2.PullMessageRequest
    ) -> broker_pb2.PullMessageResponse:
        core = self.core
        core.check_online()
        # before anything is done: a bad SQL92 is refused (IllegalFilterExpression)
        select = Selector.of_request(req.tags, req.sql92)
        tags = select.tag_hashes
        max_msgs = max(1, min(req.max_msg_nums or 32, MAX_PULL_BATCH))
        max_bytes = req.max_bytes or 4 * 1024 * 1024
        if req.commit_offset >= 0 and req.consumer_group and core.acting.serves_master_only_ops:
            self.write_path.commit_offset(
                req.consumer_group, req.topic, req.queue_id, req.commit_offset
            )
        result = core.store.get_messages(
            req.topic, req.queue_id, req.queue_offset, max_msgs, max_bytes, tags, select.properties
        )
        held = req.suspend_timeout_ms > 0 and core.cfg.long_polling_enable
        # A slave asked past its end is behind (the consumer read further on the master
        # before a failover, or a partition): wait for replication, never send the
        # consumer back (RocketMQ's offsetCheckInSlave=false), or it reads twice.
        behind = (
            not core.acting.is_master
            and result.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY
            and req.queue_offset > result.max_offset
        )
        if held and (result.status in WAITABLE or behind):
            offset = req.queue_offset
            if result.status is GetMessageStatus.NO_MATCHED_MESSAGE:
                offset = result.next_begin_offset
            timeout = min(
                req.suspend_timeout_ms, max(0, ctx.timeout_ms - 1000) or req.suspend_timeout_ms
            )
            pull_held = core.metrics.pull_held.labels(**core.metrics.ident)
            pull_held.set(core.holds.held_count + 1)
            await core.holds.hold(req.topic, req.queue_id, offset, timeout, tags)
            pull_held.set(core.holds.held_count)
            core.check_online()  # fenced while held: its log may be cut back
            result = core.store.get_messages(
                req.topic, req.queue_id, offset, max_msgs, max_bytes, tags, select.properties
            )
        if held and result.status is GetMessageStatus.RECORD_UNDER_REPAIR:
            # the next record is damaged: never moved past, served once repaired
            await asyncio.sleep(REPAIR_WAIT_S)
            core.check_online()
            result = core.store.get_messages(
                req.topic,
                req.queue_id,
                req.queue_offset,
                max_msgs,
                max_bytes,
                tags,
                select.properties,
            )
        if behind and result.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY:
            return broker_pb2.PullMessageResponse(
                status=broker_pb2.NO_NEW_MSG,
                next_begin_offset=req.queue_offset,
                min_offset=result.min_offset,
                max_offset=result.max_offset,
            )
        ha = core.ha_master
        if result.status is GetMessageStatus.FOUND and ha is not None and ha.transfer_slaves():
            # A SYNC master serves only what its attached slaves hold (RocketMQ controller
            # mode's confirm offset): an answer sent into a partition arrives once it
            # heals, after the returning master cut those records away (see
            # membership.truncation).  Without any slave attached it serves its log.
            if not await self.write_path.confirm(result.messages[-1].physical_offset + 1):
                core.check_online()
                return broker_pb2.PullMessageResponse(
                    status=broker_pb2.NO_NEW_MSG,
                    next_begin_offset=req.queue_offset,
                    min_offset=result.min_offset,
                    max_offset=result.max_offset,
                )
            core.check_online()
        if result.status is GetMessageStatus.OFFSET_TOO_SMALL:
            if not core.acting.serves_master_only_ops and core.acting.master_online:
                # A slave deletes on its own clock, so its start may be later than the
                # master's: never move a consumer on a slave's word while the master
                # serves (RocketMQ's offsetCheckInSlave=false); send it to the master.
                return broker_pb2.PullMessageResponse(
                    status=broker_pb2.NO_NEW_MSG,
                    next_begin_offset=req.queue_offset,
                    min_offset=result.min_offset,
                    max_offset=result.max_offset,
                    suggest_which_broker_id=0,
                )
            self._moved_to_min(req, result.min_offset)
        elif result.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY:
            self._moved_back(req, result)
        resp = broker_pb2.PullMessageResponse(
            next_begin_offset=result.next_begin_offset,
            min_offset=result.min_offset,
            max_offset=result.max_offset,
        )
        status = result.status
        if status is GetMessageStatus.FOUND:
            resp.status = broker_pb2.FOUND
            name = core.cfg.broker_name
            resp.messages.extend(message_to_pb(m, name) for m in result.messages)
            core.metrics.messages_out.labels(
                **core.metrics.ident, topic=req.topic, group=req.consumer_group or "-"
            ).inc(len(result.messages))
        elif status is GetMessageStatus.NO_MATCHED_MESSAGE:
            resp.status = broker_pb2.NO_MATCHED_MSG
        elif status in WAITABLE or status is GetMessageStatus.RECORD_UNDER_REPAIR:
            resp.status = broker_pb2.NO_NEW_MSG
        else:
            resp.status = broker_pb2.OFFSET_ILLEGAL
        if not core.acting.is_master and core.acting.master_online:
            resp.suggest_which_broker_id = 0
        return resp

    def _moved_back(self, req: broker_pb2.PullMessageRequest, result: GetResult) -> None:
        """The pull asked past the queue's end: the consumer read a tail this broker no
        longer has (an unclean stop lost it, or a cut back removed it).  The answer
        (OFFSET_ILLEGAL, RocketMQ's PULL_OFFSET_MOVED for OFFSET_OVERFLOW_BADLY) sends
        it back to ``next_begin_offset``, the queue's recovery mark (``store.marks``):
        the messages stored since begin there, at the offsets the lost tail had held.
        The group's committed offset, if it is past the end too, moves there as well."""
        log.info(
            "pull of %s/%d at %d: past the end %d; moving %s back to %d",
            req.topic,
            req.queue_id,
            req.queue_offset,
            result.max_offset,
            req.consumer_group or "the consumer",
            result.next_begin_offset,
        )
        group = req.consumer_group
        if not group or not self.core.acting.serves_master_only_ops:
            return
        committed = self.core.offsets.query(group, req.topic, req.queue_id)
        if committed > result.max_offset:
            self.write_path.commit_offset(group, req.topic, req.queue_id, result.next_begin_offset)

    def _moved_to_min(self, req: broker_pb2.PullMessageRequest, min_offset: int) -> None:
        """The pull asked below the queue's minimum: retention deleted those messages.

        The answer (OFFSET_ILLEGAL with ``next_begin_offset`` = the minimum, RocketMQ's
        PULL_OFFSET_MOVED) moves the consumer on; here the group's committed offset, if
        it points below the minimum too, moves there as well, so that a consumer that
        restarts from it does not ask for deleted messages again."""
        log.debug(
            "pull of %s/%d at %d: below the minimum %d (deleted); moving %s there",
            req.topic,
            req.queue_id,
            req.queue_offset,
            min_offset,
            req.consumer_group or "the consumer",
        )
        group = req.consumer_group
        if not group or not self.core.acting.serves_master_only_ops:
            return
        committed = self.core.offsets.query(group, req.topic, req.queue_id)
        if 0 <= committed < min_offset:
            self.write_path.commit_offset(group, req.topic, req.queue_id, min_offset)
