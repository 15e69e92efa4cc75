from ha_controller.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterBrokerRequest(_message.Message):
    __slots__ = ("cluster", "broker_addr", "broker_name", "broker_id", "ha_addr", "heartbeat_timeout_ms", "enable_acting_master", "topic_configs", "data_version", "timestamp_ms", "signature", "pre_online_done", "max_offset", "store_writable", "acl_revision", "acl_digest", "member_id", "epoch")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_ADDR_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    HA_ADDR_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ENABLE_ACTING_MASTER_FIELD_NUMBER: _ClassVar[int]
    TOPIC_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    PRE_ONLINE_DONE_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STORE_WRITABLE_FIELD_NUMBER: _ClassVar[int]
    ACL_REVISION_FIELD_NUMBER: _ClassVar[int]
    ACL_DIGEST_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_addr: str
    broker_name: str
    broker_id: int
    ha_addr: str
    heartbeat_timeout_ms: int
    enable_acting_master: bool
    topic_configs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicConfig]
    data_version: _common_pb2.DataVersion
    timestamp_ms: int
    signature: bytes
    pre_online_done: bool
    max_offset: int
    store_writable: bool
    acl_revision: int
    acl_digest: str
    member_id: int
    epoch: int
    def __init__(self, cluster: _Optional[str] = ..., broker_addr: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., ha_addr: _Optional[str] = ..., heartbeat_timeout_ms: _Optional[int] = ..., enable_acting_master: _Optional[bool] = ..., topic_configs: _Optional[_Iterable[_Union[_common_pb2.TopicConfig, _Mapping]]] = ..., data_version: _Optional[_Union[_common_pb2.DataVersion, _Mapping]] = ..., timestamp_ms: _Optional[int] = ..., signature: _Optional[bytes] = ..., pre_online_done: _Optional[bool] = ..., max_offset: _Optional[int] = ..., store_writable: _Optional[bool] = ..., acl_revision: _Optional[int] = ..., acl_digest: _Optional[str] = ..., member_id: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class RegisterBrokerResponse(_message.Message):
    __slots__ = ("master_addr", "master_ha_addr", "controller")
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_HA_ADDR_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    master_addr: str
    master_ha_addr: str
    controller: ControllerView
    def __init__(self, master_addr: _Optional[str] = ..., master_ha_addr: _Optional[str] = ..., controller: _Optional[_Union[ControllerView, _Mapping]] = ...) -> None: ...

class GroupState(_message.Message):
    __slots__ = ("epoch", "master_member", "sync_state_set", "master_addr", "unclean")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MASTER_MEMBER_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    UNCLEAN_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    master_member: int
    sync_state_set: _containers.RepeatedScalarFieldContainer[int]
    master_addr: str
    unclean: bool
    def __init__(self, epoch: _Optional[int] = ..., master_member: _Optional[int] = ..., sync_state_set: _Optional[_Iterable[int]] = ..., master_addr: _Optional[str] = ..., unclean: _Optional[bool] = ...) -> None: ...

class ControllerView(_message.Message):
    __slots__ = ("enabled", "state", "has_state", "route_id", "confirmed_age_ms")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HAS_STATE_FIELD_NUMBER: _ClassVar[int]
    ROUTE_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIRMED_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    state: GroupState
    has_state: bool
    route_id: int
    confirmed_age_ms: int
    def __init__(self, enabled: _Optional[bool] = ..., state: _Optional[_Union[GroupState, _Mapping]] = ..., has_state: _Optional[bool] = ..., route_id: _Optional[int] = ..., confirmed_age_ms: _Optional[int] = ...) -> None: ...

class GetReplicaInfoRequest(_message.Message):
    __slots__ = ("cluster", "broker_name", "member_id", "broker_addr", "max_offset", "epoch")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    member_id: int
    broker_addr: str
    max_offset: int
    epoch: int
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., member_id: _Optional[int] = ..., broker_addr: _Optional[str] = ..., max_offset: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class AlterSyncStateSetRequest(_message.Message):
    __slots__ = ("cluster", "broker_name", "master_member", "epoch", "sync_state_set")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    MASTER_MEMBER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    master_member: int
    epoch: int
    sync_state_set: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., master_member: _Optional[int] = ..., epoch: _Optional[int] = ..., sync_state_set: _Optional[_Iterable[int]] = ...) -> None: ...

class ElectMasterRequest(_message.Message):
    __slots__ = ("cluster", "broker_name", "target_member", "timeout_ms")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_MEMBER_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    target_member: int
    timeout_ms: int
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., target_member: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ElectMasterResponse(_message.Message):
    __slots__ = ("controller", "paused_ms", "detail")
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    PAUSED_MS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    controller: ControllerView
    paused_ms: int
    detail: str
    def __init__(self, controller: _Optional[_Union[ControllerView, _Mapping]] = ..., paused_ms: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class NotifyBrokerRoleChangedRequest(_message.Message):
    __slots__ = ("cluster", "broker_name", "state", "route_id", "fence_wait_ms")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ROUTE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    state: GroupState
    route_id: int
    fence_wait_ms: int
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., state: _Optional[_Union[GroupState, _Mapping]] = ..., route_id: _Optional[int] = ..., fence_wait_ms: _Optional[int] = ...) -> None: ...

class UnregisterBrokerRequest(_message.Message):
    __slots__ = ("cluster", "broker_addr", "broker_name", "broker_id", "timestamp_ms", "signature")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_ADDR_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_addr: str
    broker_name: str
    broker_id: int
    timestamp_ms: int
    signature: bytes
    def __init__(self, cluster: _Optional[str] = ..., broker_addr: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., signature: _Optional[bytes] = ...) -> None: ...

class BrokerHeartbeatRequest(_message.Message):
    __slots__ = ("cluster", "broker_addr", "broker_name", "max_offset", "store_writable", "acl_revision", "acl_digest", "member_id", "epoch")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_ADDR_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STORE_WRITABLE_FIELD_NUMBER: _ClassVar[int]
    ACL_REVISION_FIELD_NUMBER: _ClassVar[int]
    ACL_DIGEST_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_addr: str
    broker_name: str
    max_offset: int
    store_writable: bool
    acl_revision: int
    acl_digest: str
    member_id: int
    epoch: int
    def __init__(self, cluster: _Optional[str] = ..., broker_addr: _Optional[str] = ..., broker_name: _Optional[str] = ..., max_offset: _Optional[int] = ..., store_writable: _Optional[bool] = ..., acl_revision: _Optional[int] = ..., acl_digest: _Optional[str] = ..., member_id: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class BrokerHeartbeatResponse(_message.Message):
    __slots__ = ("controller",)
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    controller: ControllerView
    def __init__(self, controller: _Optional[_Union[ControllerView, _Mapping]] = ...) -> None: ...

class QueryDataVersionRequest(_message.Message):
    __slots__ = ("cluster", "broker_addr", "broker_name", "broker_id", "data_version")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_ADDR_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_addr: str
    broker_name: str
    broker_id: int
    data_version: _common_pb2.DataVersion
    def __init__(self, cluster: _Optional[str] = ..., broker_addr: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., data_version: _Optional[_Union[_common_pb2.DataVersion, _Mapping]] = ...) -> None: ...

class QueryDataVersionResponse(_message.Message):
    __slots__ = ("changed", "data_version")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    data_version: _common_pb2.DataVersion
    def __init__(self, changed: _Optional[bool] = ..., data_version: _Optional[_Union[_common_pb2.DataVersion, _Mapping]] = ...) -> None: ...

class GetRouteInfoRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class ClusterEntry(_message.Message):
    __slots__ = ("cluster", "broker_names")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAMES_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cluster: _Optional[str] = ..., broker_names: _Optional[_Iterable[str]] = ...) -> None: ...

class ClusterInfo(_message.Message):
    __slots__ = ("clusters", "brokers", "controller")
    class ControllerEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: GroupState
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[GroupState, _Mapping]] = ...) -> None: ...
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedCompositeFieldContainer[ClusterEntry]
    brokers: _containers.RepeatedCompositeFieldContainer[_common_pb2.BrokerData]
    controller: _containers.MessageMap[str, GroupState]
    def __init__(self, clusters: _Optional[_Iterable[_Union[ClusterEntry, _Mapping]]] = ..., brokers: _Optional[_Iterable[_Union[_common_pb2.BrokerData, _Mapping]]] = ..., controller: _Optional[_Mapping[str, GroupState]] = ...) -> None: ...

class GetBrokerMemberGroupRequest(_message.Message):
    __slots__ = ("cluster", "broker_name")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ...) -> None: ...

class BrokerMemberGroup(_message.Message):
    __slots__ = ("cluster", "broker_name", "broker_addrs", "acting_broker_id", "master_heard_ms_ago", "max_offset_seen")
    class BrokerAddrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: str
        def __init__(self, key: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ADDRS_FIELD_NUMBER: _ClassVar[int]
    ACTING_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_HEARD_MS_AGO_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_SEEN_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    broker_addrs: _containers.ScalarMap[int, str]
    acting_broker_id: int
    master_heard_ms_ago: int
    max_offset_seen: int
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_addrs: _Optional[_Mapping[int, str]] = ..., acting_broker_id: _Optional[int] = ..., master_heard_ms_ago: _Optional[int] = ..., max_offset_seen: _Optional[int] = ...) -> None: ...

class NotifyMinBrokerIdChangeRequest(_message.Message):
    __slots__ = ("min_broker_id", "min_broker_addr", "offline_broker_addr", "ha_broker_addr", "broker_name", "cluster")
    MIN_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_BROKER_ADDR_FIELD_NUMBER: _ClassVar[int]
    OFFLINE_BROKER_ADDR_FIELD_NUMBER: _ClassVar[int]
    HA_BROKER_ADDR_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    min_broker_id: int
    min_broker_addr: str
    offline_broker_addr: str
    ha_broker_addr: str
    broker_name: str
    cluster: str
    def __init__(self, min_broker_id: _Optional[int] = ..., min_broker_addr: _Optional[str] = ..., offline_broker_addr: _Optional[str] = ..., ha_broker_addr: _Optional[str] = ..., broker_name: _Optional[str] = ..., cluster: _Optional[str] = ...) -> None: ...

class WatchRouteRequest(_message.Message):
    __slots__ = ("topic", "known_version", "max_wait_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    known_version: str
    max_wait_ms: int
    def __init__(self, topic: _Optional[str] = ..., known_version: _Optional[str] = ..., max_wait_ms: _Optional[int] = ...) -> None: ...

class WatchRouteResponse(_message.Message):
    __slots__ = ("found", "version", "route")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    found: bool
    version: str
    route: _common_pb2.TopicRoute
    def __init__(self, found: _Optional[bool] = ..., version: _Optional[str] = ..., route: _Optional[_Union[_common_pb2.TopicRoute, _Mapping]] = ...) -> None: ...
