"""Offsets and the master-only queries (max/min offset, search by time, earliest, and
messages by key or id from the key index)."""

from __future__ import annotations

from broker_agent.core import BrokerCore
from broker_agent.metadata.topics import check_name
from broker_agent.write_path import WritePath
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BadRequest, NotMaster, SlaveAckTimeout
from ha_controller.protocol.properties import PROPERTY_KEYS, now_ms
from ha_controller.protocol.record import StoredMessage
from ha_controller.rpc import RequestContext
from ha_controller.wire import data_version_to_pb

#: messages one QUERY_MESSAGE / VIEW_MESSAGE_BY_ID answers by default and at most
#: (RocketMQ's defaultQueryMaxNum 32 and maxMsgsNumBatch 64)
DEFAULT_QUERY_MAX = 32
QUERY_MAX = 64


def _query_max(requested: int) -> int:
    if requested < 0:
        raise BadRequest(f"max_num must be >= 0, got {requested}")
    return min(requested or DEFAULT_QUERY_MAX, QUERY_MAX)


def queried(m: StoredMessage) -> broker_pb2.QueriedMessage:
    return broker_pb2.QueriedMessage(
        topic=m.topic,
        queue_id=m.queue_id,
        queue_offset=m.queue_offset,
        physical_offset=m.physical_offset,
        store_ts_ms=m.store_ts_ms,
        keys=m.properties.get(PROPERTY_KEYS, ""),
        uniq_key=m.uniq_key or "",
        body_size=len(m.body),
        offset_msg_id=m.msg_id,
        born_ts_ms=m.born_ts_ms,
        tags=m.tags or "",
    )


class QueryHandlers:
    """Consumer offsets and queue queries; the acting slave serves the master-only ones."""

    def __init__(self, core: BrokerCore, write_path: WritePath) -> None:
        self.core = core
        self.write_path = write_path

    def register(self) -> None:
        add = self.core.dispatcher.add
        add(RequestCode.QUERY_CONSUMER_OFFSET, broker_pb2.ConsumerOffsetRequest, self.query_offset)
        add(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            broker_pb2.ConsumerOffsetRequest,
            self.update_offset,
        )
        add(RequestCode.GET_MAX_OFFSET, broker_pb2.QueueOffsetRequest, self.max_offset)
        add(RequestCode.GET_MIN_OFFSET, broker_pb2.QueueOffsetRequest, self.min_offset)
        add(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, broker_pb2.QueueOffsetRequest, self.search)
        add(RequestCode.GET_EARLIEST_MSG_STORETIME, broker_pb2.QueueOffsetRequest, self.earliest)
        add(RequestCode.GET_ALL_CONSUMER_OFFSET, common_pb2.Empty, self.all_offsets)
        add(RequestCode.GET_CONSUME_STATS, broker_pb2.ConsumeStatsRequest, self.consume_stats)
        add(RequestCode.QUERY_MESSAGE, broker_pb2.QueryMessageRequest, self.query_message)
        add(RequestCode.VIEW_MESSAGE_BY_ID, broker_pb2.ViewMessageRequest, self.view_message)

    async def query_offset(
        self, ctx: RequestContext, req: broker_pb2.ConsumerOffsetRequest
    ) -> broker_pb2.OffsetResponse:
        self.core.check_online()
        self._check_offsets_current()
        return broker_pb2.OffsetResponse(
            offset=self.core.offsets.query(req.consumer_group, req.topic, req.queue_id)
        )

    def _check_offsets_current(self) -> None:
        """A consumer starts a queue from the offset this answers: only a broker whose
        table holds the group's last commits may answer it.  That is the master, the
        slave the nameserver chose to act (or held by a returning master), and a slave
        that follows a master; not a slave that does neither while another slave may
        act or a new master comes up.  Its table is as old as its last sync with the
        master that left: ``controller-slave-behind``, seed 3305, a slave frozen for 6
        s and then shown alone while the elected member was rebuilt answered offsets 6 s
        old, and the consumers read those messages again.  Without acting slaves
        (``enable_slave_acting_master`` off) a slave answers as RocketMQ's does."""
        core = self.core
        acting = core.acting
        if acting.is_master or acting.chosen or not acting.enabled:
            return
        if core.ha_slave is not None and core.ha_slave.replicating:
            return
        raise NotMaster(
            f"QUERY_CONSUMER_OFFSET: {core.name} is a slave that neither acts nor follows "
            "a master (its offsets may be behind the group's last commits); ask again"
        )

    async def update_offset(
        self, ctx: RequestContext, req: broker_pb2.ConsumerOffsetRequest
    ) -> common_pb2.Empty:
        self.core.check_master_only("UPDATE_CONSUMER_OFFSET")
        if req.offset < 0:
            raise BadRequest("offset must be >= 0")
        end = await self.write_path.commit_offset_durably(
            req.consumer_group, req.topic, req.queue_id, req.offset
        )
        if end is not None:
            # a committed offset should reach the slave that may act next; in controller
            # mode it must: only what every member of the sync-state set holds is
            # answered, so the member the controller elects holds the commit (a
            # repeat of it is harmless)
            confirmed = await self.write_path.confirm(end)
            if not confirmed and self.core.sync is not None:
                raise SlaveAckTimeout(
                    f"offset commit stored on {self.core.name} but not confirmed by its "
                    f"sync-state set within {self.core.cfg.slave_ack_timeout_ms} ms"
                )
        return common_pb2.Empty()

    async def max_offset(
        self, ctx: RequestContext, req: broker_pb2.QueueOffsetRequest
    ) -> broker_pb2.OffsetResponse:
        self.core.check_master_only("GET_MAX_OFFSET")
        return broker_pb2.OffsetResponse(offset=self.core.store.max_offset(req.topic, req.queue_id))

    async def min_offset(
        self, ctx: RequestContext, req: broker_pb2.QueueOffsetRequest
    ) -> broker_pb2.OffsetResponse:
        self.core.check_master_only("GET_MIN_OFFSET")
        return broker_pb2.OffsetResponse(offset=self.core.store.min_offset(req.topic, req.queue_id))

    async def search(
        self, ctx: RequestContext, req: broker_pb2.QueueOffsetRequest
    ) -> broker_pb2.OffsetResponse:
        self.core.check_master_only("SEARCH_OFFSET_BY_TIMESTAMP")
        return broker_pb2.OffsetResponse(
            offset=self.core.store.search_offset(req.topic, req.queue_id, req.timestamp_ms)
        )

    async def earliest(
        self, ctx: RequestContext, req: broker_pb2.QueueOffsetRequest
    ) -> broker_pb2.TimestampResponse:
        self.core.check_master_only("GET_EARLIEST_MSG_STORETIME")
        ts = self.core.store.earliest_msg_store_time(req.topic, req.queue_id)
        return broker_pb2.TimestampResponse(timestamp_ms=-1 if ts is None else ts)

    async def query_message(
        self, ctx: RequestContext, req: broker_pb2.QueryMessageRequest
    ) -> broker_pb2.QueryMessageResponse:
        self.core.check_master_only("QUERY_MESSAGE")
        if not req.topic or not req.key:
            raise BadRequest("QUERY_MESSAGE needs a topic and a key")
        if req.end_ms and req.end_ms < req.begin_ms:
            raise BadRequest(f"end_ms {req.end_ms} is before begin_ms {req.begin_ms}")
        found = self.core.store.query_by_key(
            req.topic,
            req.key,
            begin_ms=req.begin_ms,
            end_ms=req.end_ms or None,
            max_num=_query_max(req.max_num),
        )
        return broker_pb2.QueryMessageResponse(
            broker_name=self.core.name, messages=[queried(m) for m in found]
        )

    async def view_message(
        self, ctx: RequestContext, req: broker_pb2.ViewMessageRequest
    ) -> broker_pb2.QueryMessageResponse:
        self.core.check_master_only("VIEW_MESSAGE_BY_ID")
        if not req.msg_id:
            raise BadRequest("VIEW_MESSAGE_BY_ID needs a message id")
        found = self.core.store.query_by_id(req.msg_id, max_num=_query_max(req.max_num))
        return broker_pb2.QueryMessageResponse(
            broker_name=self.core.name, messages=[queried(m) for m in found]
        )

    async def all_offsets(
        self, ctx: RequestContext, req: common_pb2.Empty
    ) -> broker_pb2.ConsumerOffsetTable:
        offsets = self.core.offsets
        return broker_pb2.ConsumerOffsetTable(
            entries=[
                broker_pb2.ConsumerOffsetEntry(consumer_group=g, topic=t, queue_id=q, offset=o)
                for g, t, q, o in offsets.entries()
            ],
            data_version=data_version_to_pb(offsets.data_version),
        )

    async def consume_stats(
        self, ctx: RequestContext, req: broker_pb2.ConsumeStatsRequest
    ) -> broker_pb2.ConsumeStats:
        """A consumer group's lag on every queue here (``hactl group lag``): served where
        the lag metrics are exported, by the master or the acting slave."""
        self.core.check_master_only("GET_CONSUME_STATS")
        if not req.consumer_group:
            raise BadRequest("GET_CONSUME_STATS needs a consumer group")
        if req.topic:
            check_name(req.topic)
        rows = self.core.consumer_lag(req.consumer_group, req.topic or None)
        return broker_pb2.ConsumeStats(
            broker_name=self.core.cfg.broker_name,
            broker_id=self.core.cfg.broker_id,
            now_ms=now_ms(),
            queues=[
                broker_pb2.QueueLag(
                    topic=q.topic,
                    queue_id=q.queue_id,
                    broker_offset=q.broker_offset,
                    consumer_offset=q.consumer_offset,
                    lag=q.lag,
                    oldest_store_ts_ms=q.oldest_store_ms or 0,
                )
                for q in rows
            ],
        )
