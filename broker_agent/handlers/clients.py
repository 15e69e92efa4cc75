"""Client heartbeats, consumer lists, topics and status."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from broker_agent.core import BrokerCore
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BadRequest, NotMaster
from ha_controller.rpc import RequestContext, RpcConnection
from ha_controller.wire import data_version_to_pb, topic_config_from_pb, topic_config_to_pb

log = logging.getLogger(__name__)

#: A producer seen on a connection (HEART_BEAT): the transaction service's check-back.
ProducerSeen = Callable[[RpcConnection, list[str]], None]


class ClientHandlers:
    """HEART_BEAT / UNREGISTER_CLIENT / consumer list / topics / status."""

    def __init__(
        self,
        core: BrokerCore,
        producer_seen: ProducerSeen,
        register: Callable[[], Awaitable[None]],
    ) -> None:
        self.core = core
        self._producer_seen = producer_seen
        self._register = register  # membership: tell the nameservers about a new topic

    def register(self) -> None:
        add = self.core.dispatcher.add
        add(RequestCode.HEART_BEAT, broker_pb2.ClientHeartbeat, self.client_heartbeat)
        add(RequestCode.UNREGISTER_CLIENT, broker_pb2.ClientHeartbeat, self.client_unregister)
        add(RequestCode.GET_CONSUMER_LIST_BY_GROUP, broker_pb2.ConsumerListRequest, self.consumers)
        add(RequestCode.UPDATE_AND_CREATE_TOPIC, broker_pb2.CreateTopicRequest, self.create_topic)
        add(RequestCode.GET_ALL_TOPIC_CONFIG, common_pb2.Empty, self.all_topics)
        add(RequestCode.GET_BROKER_STATUS, common_pb2.Empty, self.status)

    async def client_heartbeat(
        self, ctx: RequestContext, req: broker_pb2.ClientHeartbeat
    ) -> common_pb2.Empty:
        self.core.consumers.heartbeat(ctx.conn, req.client_id, list(req.consumer_groups))
        self._producer_seen(ctx.conn, list(req.producer_groups))
        return common_pb2.Empty()

    async def client_unregister(
        self, ctx: RequestContext, req: broker_pb2.ClientHeartbeat
    ) -> common_pb2.Empty:
        self.core.consumers.unregister(req.client_id, list(req.consumer_groups))
        return common_pb2.Empty()

    async def consumers(
        self, ctx: RequestContext, req: broker_pb2.ConsumerListRequest
    ) -> broker_pb2.ConsumerListResponse:
        return broker_pb2.ConsumerListResponse(
            client_ids=self.core.consumers.clients(req.consumer_group)
        )

    async def create_topic(
        self, ctx: RequestContext, req: broker_pb2.CreateTopicRequest
    ) -> common_pb2.Empty:
        core = self.core
        core.check_online()
        if not core.acting.is_master:
            raise NotMaster("topics are created on masters")
        config = topic_config_from_pb(req.topic)
        if config.read_queue_nums < 1 or config.write_queue_nums < 1:
            raise BadRequest("a topic needs at least one queue")
        if core.topics.upsert(config):
            log.info("topic %s created/updated: %s", config.topic_name, config)
            await self._register()
        return common_pb2.Empty()

    async def all_topics(
        self, ctx: RequestContext, req: common_pb2.Empty
    ) -> broker_pb2.TopicConfigTable:
        topics = self.core.topics
        return broker_pb2.TopicConfigTable(
            topics=[topic_config_to_pb(t) for t in topics.topics.values()],
            data_version=data_version_to_pb(topics.data_version),
        )

    async def status(self, ctx: RequestContext, req: common_pb2.Empty) -> broker_pb2.BrokerStatus:
        return broker_pb2.BrokerStatus(json=json.dumps(self.core.status()))
