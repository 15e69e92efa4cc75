"""Client heartbeats, consumer lists, topics and status."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from broker_agent.core import BrokerCore
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BadRequest, NotMaster
from ha_controller.protocol.topics import (
    message_type_name_problem,
    perm_problem,
    queue_nums_problem,
    topic_name_problem,
)
from ha_controller.rpc import RequestContext
from ha_controller.wire import data_version_to_pb, topic_config_from_pb, topic_config_to_pb

log = logging.getLogger(__name__)

#: A producer seen on a connection (HEART_BEAT): the transaction service's check-back.
ProducerSeen = Callable[[RequestContext, list[str]], None]


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
        add(RequestCode.DELETE_TOPIC_IN_BROKER, broker_pb2.CreateTopicRequest, self.delete_topic)
        add(RequestCode.GET_ALL_TOPIC_CONFIG, common_pb2.Empty, self.all_topics)
        add(RequestCode.GET_BROKER_STATUS, common_pb2.Empty, self.status)

    async def client_heartbeat(
        self, ctx: RequestContext, req: broker_pb2.ClientHeartbeat
    ) -> common_pb2.Empty:
        self.core.consumers.heartbeat(ctx.conn, req.client_id, list(req.consumer_groups))
        self._producer_seen(ctx, list(req.producer_groups))
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
        """UPDATE_AND_CREATE_TOPIC (RocketMQ's semantics: create or replace the config).

        Everything is checked before anything changes: the name (the brokers' system
        prefixes are refused; a group's retry and dead-letter topics may be adjusted),
        the queue counts, the permission and the message type."""
        core = self.core
        core.check_online()
        if not core.acting.is_master:
            raise NotMaster("topics are created on masters")
        config = topic_config_from_pb(req.topic)
        problem = (
            topic_name_problem(config.topic_name, allow_group_topics=True)
            or queue_nums_problem(config.read_queue_nums)
            or queue_nums_problem(config.write_queue_nums)
            or perm_problem(config.perm)
            or message_type_name_problem(req.topic.message_type)
        )
        if problem is not None:
            raise BadRequest(problem)
        if core.topics.upsert(config):
            log.info("topic %s created/updated: %s", config.topic_name, config)
            await self._register()
        return common_pb2.Empty()

    async def delete_topic(
        self, ctx: RequestContext, req: broker_pb2.CreateTopicRequest
    ) -> common_pb2.Empty:
        """DELETE_TOPIC_IN_BROKER (RocketMQ 215); the body names the topic in
        ``topic.topic_name``.  The config goes (its messages stay in the store until
        retention removes them); a master re-registers without it.  Slaves accept it
        too, so that an operator can clear every member (their sync with the master
        only adds topics)."""
        core = self.core
        core.check_online()
        topic = req.topic.topic_name
        problem = topic_name_problem(topic, allow_group_topics=True)
        if problem is not None:
            raise BadRequest(problem)
        if core.topics.delete(topic) is not None:
            log.info("topic %s deleted", topic)
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
