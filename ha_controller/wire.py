"""Conversions between protobuf wire types and domain dataclasses.

Wire types stay at the edge: services convert once here and domain code
works with ``ha_controller.routing`` / ``ha_controller.dataversion`` types.
"""

from __future__ import annotations

from ha_controller.dataversion import DataVersion
from ha_controller.proto import common_pb2, nameserver_pb2
from ha_controller.protocol.topics import TopicMessageType
from ha_controller.routing import (
    BrokerData,
    BrokerMemberGroup,
    QueueData,
    TopicConfig,
    TopicRouteData,
)


def data_version_to_pb(v: DataVersion) -> common_pb2.DataVersion:
    return common_pb2.DataVersion(
        state_version=v.state_version, counter=v.counter, timestamp_ms=v.timestamp_ms
    )


def data_version_from_pb(pb: common_pb2.DataVersion) -> DataVersion:
    return DataVersion(pb.state_version, pb.counter, pb.timestamp_ms)


def topic_config_to_pb(tc: TopicConfig) -> common_pb2.TopicConfig:
    return common_pb2.TopicConfig(
        topic_name=tc.topic_name,
        read_queue_nums=tc.read_queue_nums,
        write_queue_nums=tc.write_queue_nums,
        perm=tc.perm,
        topic_sys_flag=tc.topic_sys_flag,
        order=tc.order,
        message_type=tc.message_type.value,
    )


def topic_config_from_pb(pb: common_pb2.TopicConfig) -> TopicConfig:
    return TopicConfig(
        pb.topic_name,
        pb.read_queue_nums,
        pb.write_queue_nums,
        pb.perm,
        pb.topic_sys_flag,
        pb.order,
        TopicMessageType.from_wire(pb.message_type),
    )


def route_to_pb(route: TopicRouteData) -> common_pb2.TopicRoute:
    return common_pb2.TopicRoute(
        topic=route.topic,
        brokers=[
            common_pb2.BrokerData(
                cluster=b.cluster,
                broker_name=b.broker_name,
                broker_addrs=b.broker_addrs,
                enable_acting_master=b.enable_acting_master,
                epoch=b.epoch,
            )
            for b in route.broker_datas
        ],
        queues=[
            common_pb2.QueueData(
                broker_name=q.broker_name,
                read_queue_nums=q.read_queue_nums,
                write_queue_nums=q.write_queue_nums,
                perm=q.perm,
                topic_sys_flag=q.topic_sys_flag,
            )
            for q in route.queue_datas
        ],
    )


def route_from_pb(pb: common_pb2.TopicRoute) -> TopicRouteData:
    return TopicRouteData(
        pb.topic,
        [
            BrokerData(
                b.cluster,
                b.broker_name,
                dict(b.broker_addrs),
                b.enable_acting_master,
                b.epoch if b.HasField("epoch") else None,
            )
            for b in pb.brokers
        ],
        [
            QueueData(
                q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm, q.topic_sys_flag
            )
            for q in pb.queues
        ],
    )


def member_group_to_pb(group: BrokerMemberGroup) -> nameserver_pb2.BrokerMemberGroup:
    pb = nameserver_pb2.BrokerMemberGroup(
        cluster=group.cluster, broker_name=group.broker_name, broker_addrs=group.broker_addrs
    )
    if group.acting_broker_id is not None:
        pb.acting_broker_id = group.acting_broker_id
    if group.master_heard_ms_ago is not None:
        pb.master_heard_ms_ago = group.master_heard_ms_ago
    if group.max_offset_seen is not None:
        pb.max_offset_seen = group.max_offset_seen
    return pb


def member_group_from_pb(pb: nameserver_pb2.BrokerMemberGroup) -> BrokerMemberGroup:
    return BrokerMemberGroup(
        pb.cluster,
        pb.broker_name,
        dict(pb.broker_addrs),
        pb.acting_broker_id if pb.HasField("acting_broker_id") else None,
        pb.master_heard_ms_ago if pb.HasField("master_heard_ms_ago") else None,
        pb.max_offset_seen if pb.HasField("max_offset_seen") else None,
    )
