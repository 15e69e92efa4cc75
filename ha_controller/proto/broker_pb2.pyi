from ha_controller.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PullStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FOUND: _ClassVar[PullStatus]
    NO_NEW_MSG: _ClassVar[PullStatus]
    NO_MATCHED_MSG: _ClassVar[PullStatus]
    OFFSET_ILLEGAL: _ClassVar[PullStatus]
FOUND: PullStatus
NO_NEW_MSG: PullStatus
NO_MATCHED_MSG: PullStatus
OFFSET_ILLEGAL: PullStatus

class MessageQueue(_message.Message):
    __slots__ = ("topic", "broker_name", "queue_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    broker_name: str
    queue_id: int
    def __init__(self, topic: _Optional[str] = ..., broker_name: _Optional[str] = ..., queue_id: _Optional[int] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("topic", "body", "properties", "queue_id", "queue_offset", "commit_log_offset", "msg_id", "born_ts_ms", "born_host", "store_ts_ms", "store_host", "broker_name", "reconsume_times", "flag", "sys_flag")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    BORN_TS_MS_FIELD_NUMBER: _ClassVar[int]
    BORN_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_TS_MS_FIELD_NUMBER: _ClassVar[int]
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    SYS_FLAG_FIELD_NUMBER: _ClassVar[int]
    topic: str
    body: bytes
    properties: _containers.ScalarMap[str, str]
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    msg_id: str
    born_ts_ms: int
    born_host: str
    store_ts_ms: int
    store_host: str
    broker_name: str
    reconsume_times: int
    flag: int
    sys_flag: int
    def __init__(self, topic: _Optional[str] = ..., body: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., commit_log_offset: _Optional[int] = ..., msg_id: _Optional[str] = ..., born_ts_ms: _Optional[int] = ..., born_host: _Optional[str] = ..., store_ts_ms: _Optional[int] = ..., store_host: _Optional[str] = ..., broker_name: _Optional[str] = ..., reconsume_times: _Optional[int] = ..., flag: _Optional[int] = ..., sys_flag: _Optional[int] = ...) -> None: ...

class SendMessageRequest(_message.Message):
    __slots__ = ("producer_group", "topic", "queue_id", "entries", "born_host", "no_replica_wait", "member_escape")
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BORN_HOST_FIELD_NUMBER: _ClassVar[int]
    NO_REPLICA_WAIT_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ESCAPE_FIELD_NUMBER: _ClassVar[int]
    producer_group: str
    topic: str
    queue_id: int
    entries: _containers.RepeatedCompositeFieldContainer[SendEntry]
    born_host: str
    no_replica_wait: bool
    member_escape: bool
    def __init__(self, producer_group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[SendEntry, _Mapping]]] = ..., born_host: _Optional[str] = ..., no_replica_wait: _Optional[bool] = ..., member_escape: _Optional[bool] = ...) -> None: ...

class SendEntry(_message.Message):
    __slots__ = ("body", "properties", "born_ts_ms", "flag", "sys_flag")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BODY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    BORN_TS_MS_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    SYS_FLAG_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    properties: _containers.ScalarMap[str, str]
    born_ts_ms: int
    flag: int
    sys_flag: int
    def __init__(self, body: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ..., born_ts_ms: _Optional[int] = ..., flag: _Optional[int] = ..., sys_flag: _Optional[int] = ...) -> None: ...

class SendResult(_message.Message):
    __slots__ = ("msg_id", "uniq_key", "queue_id", "queue_offset", "commit_log_offset")
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    UNIQ_KEY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    msg_id: str
    uniq_key: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    def __init__(self, msg_id: _Optional[str] = ..., uniq_key: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., commit_log_offset: _Optional[int] = ...) -> None: ...

class SendMessageResponse(_message.Message):
    __slots__ = ("broker_name", "results", "transaction_id", "epoch", "member_id")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    results: _containers.RepeatedCompositeFieldContainer[SendResult]
    transaction_id: str
    epoch: int
    member_id: int
    def __init__(self, broker_name: _Optional[str] = ..., results: _Optional[_Iterable[_Union[SendResult, _Mapping]]] = ..., transaction_id: _Optional[str] = ..., epoch: _Optional[int] = ..., member_id: _Optional[int] = ...) -> None: ...

class PullMessageRequest(_message.Message):
    __slots__ = ("consumer_group", "topic", "queue_id", "queue_offset", "max_msg_nums", "suspend_timeout_ms", "commit_offset", "tags", "max_bytes", "sql92")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MSG_NUMS_FIELD_NUMBER: _ClassVar[int]
    SUSPEND_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    SQL92_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int
    suspend_timeout_ms: int
    commit_offset: int
    tags: _containers.RepeatedScalarFieldContainer[str]
    max_bytes: int
    sql92: str
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., max_msg_nums: _Optional[int] = ..., suspend_timeout_ms: _Optional[int] = ..., commit_offset: _Optional[int] = ..., tags: _Optional[_Iterable[str]] = ..., max_bytes: _Optional[int] = ..., sql92: _Optional[str] = ...) -> None: ...

class PullMessageResponse(_message.Message):
    __slots__ = ("status", "next_begin_offset", "min_offset", "max_offset", "messages", "suggest_which_broker_id", "store_id", "store_rewinds", "recovery_mark")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NEXT_BEGIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SUGGEST_WHICH_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_REWINDS_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_MARK_FIELD_NUMBER: _ClassVar[int]
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    suggest_which_broker_id: int
    store_id: int
    store_rewinds: int
    recovery_mark: int
    def __init__(self, status: _Optional[_Union[PullStatus, str]] = ..., next_begin_offset: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., suggest_which_broker_id: _Optional[int] = ..., store_id: _Optional[int] = ..., store_rewinds: _Optional[int] = ..., recovery_mark: _Optional[int] = ...) -> None: ...

class ConsumerOffsetRequest(_message.Message):
    __slots__ = ("consumer_group", "topic", "queue_id", "offset")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    queue_id: int
    offset: int
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class OffsetResponse(_message.Message):
    __slots__ = ("offset",)
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    def __init__(self, offset: _Optional[int] = ...) -> None: ...

class QueueOffsetRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "timestamp_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    timestamp_ms: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class TimestampResponse(_message.Message):
    __slots__ = ("timestamp_ms",)
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    timestamp_ms: int
    def __init__(self, timestamp_ms: _Optional[int] = ...) -> None: ...

class ConsumerOffsetEntry(_message.Message):
    __slots__ = ("consumer_group", "topic", "queue_id", "offset")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    queue_id: int
    offset: int
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class ConsumerOffsetTable(_message.Message):
    __slots__ = ("entries", "data_version")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[ConsumerOffsetEntry]
    data_version: _common_pb2.DataVersion
    def __init__(self, entries: _Optional[_Iterable[_Union[ConsumerOffsetEntry, _Mapping]]] = ..., data_version: _Optional[_Union[_common_pb2.DataVersion, _Mapping]] = ...) -> None: ...

class ConsumeStatsRequest(_message.Message):
    __slots__ = ("consumer_group", "topic")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class QueueLag(_message.Message):
    __slots__ = ("topic", "queue_id", "broker_offset", "consumer_offset", "lag", "oldest_store_ts_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    OLDEST_STORE_TS_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    lag: int
    oldest_store_ts_ms: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., broker_offset: _Optional[int] = ..., consumer_offset: _Optional[int] = ..., lag: _Optional[int] = ..., oldest_store_ts_ms: _Optional[int] = ...) -> None: ...

class ConsumeStats(_message.Message):
    __slots__ = ("broker_name", "broker_id", "now_ms", "queues")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    broker_id: int
    now_ms: int
    queues: _containers.RepeatedCompositeFieldContainer[QueueLag]
    def __init__(self, broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., now_ms: _Optional[int] = ..., queues: _Optional[_Iterable[_Union[QueueLag, _Mapping]]] = ...) -> None: ...

class DelayOffsetTable(_message.Message):
    __slots__ = ("offsets", "data_version")
    class OffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.ScalarMap[int, int]
    data_version: _common_pb2.DataVersion
    def __init__(self, offsets: _Optional[_Mapping[int, int]] = ..., data_version: _Optional[_Union[_common_pb2.DataVersion, _Mapping]] = ...) -> None: ...

class TimerCheckpoint(_message.Message):
    __slots__ = ("last_read_time_ms", "master_timer_queue_offset", "data_version", "next_ms_delivered_below")
    LAST_READ_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    MASTER_TIMER_QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    NEXT_MS_DELIVERED_BELOW_FIELD_NUMBER: _ClassVar[int]
    last_read_time_ms: int
    master_timer_queue_offset: int
    data_version: _common_pb2.DataVersion
    next_ms_delivered_below: int
    def __init__(self, last_read_time_ms: _Optional[int] = ..., master_timer_queue_offset: _Optional[int] = ..., data_version: _Optional[_Union[_common_pb2.DataVersion, _Mapping]] = ..., next_ms_delivered_below: _Optional[int] = ...) -> None: ...

class LockBatchRequest(_message.Message):
    __slots__ = ("consumer_group", "client_id", "mqs", "only_this_broker")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    MQS_FIELD_NUMBER: _ClassVar[int]
    ONLY_THIS_BROKER_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    client_id: str
    mqs: _containers.RepeatedCompositeFieldContainer[MessageQueue]
    only_this_broker: bool
    def __init__(self, consumer_group: _Optional[str] = ..., client_id: _Optional[str] = ..., mqs: _Optional[_Iterable[_Union[MessageQueue, _Mapping]]] = ..., only_this_broker: _Optional[bool] = ...) -> None: ...

class LockBatchResponse(_message.Message):
    __slots__ = ("locked",)
    LOCKED_FIELD_NUMBER: _ClassVar[int]
    locked: _containers.RepeatedCompositeFieldContainer[MessageQueue]
    def __init__(self, locked: _Optional[_Iterable[_Union[MessageQueue, _Mapping]]] = ...) -> None: ...

class EndTransactionRequest(_message.Message):
    __slots__ = ("producer_group", "topic", "commit_log_offset", "msg_id", "transaction_id", "commit", "from_check", "broker_name", "half_queue_offset")
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    FROM_CHECK_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    HALF_QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    producer_group: str
    topic: str
    commit_log_offset: int
    msg_id: str
    transaction_id: str
    commit: bool
    from_check: bool
    broker_name: str
    half_queue_offset: int
    def __init__(self, producer_group: _Optional[str] = ..., topic: _Optional[str] = ..., commit_log_offset: _Optional[int] = ..., msg_id: _Optional[str] = ..., transaction_id: _Optional[str] = ..., commit: _Optional[bool] = ..., from_check: _Optional[bool] = ..., broker_name: _Optional[str] = ..., half_queue_offset: _Optional[int] = ...) -> None: ...

class CheckTransactionStateRequest(_message.Message):
    __slots__ = ("message", "transaction_id", "commit_log_offset", "broker_name", "broker_addr")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ADDR_FIELD_NUMBER: _ClassVar[int]
    message: Message
    transaction_id: str
    commit_log_offset: int
    broker_name: str
    broker_addr: str
    def __init__(self, message: _Optional[_Union[Message, _Mapping]] = ..., transaction_id: _Optional[str] = ..., commit_log_offset: _Optional[int] = ..., broker_name: _Optional[str] = ..., broker_addr: _Optional[str] = ...) -> None: ...

class ClientHeartbeat(_message.Message):
    __slots__ = ("client_id", "producer_groups", "consumer_groups")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    producer_groups: _containers.RepeatedScalarFieldContainer[str]
    consumer_groups: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, client_id: _Optional[str] = ..., producer_groups: _Optional[_Iterable[str]] = ..., consumer_groups: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: _common_pb2.TopicConfig
    def __init__(self, topic: _Optional[_Union[_common_pb2.TopicConfig, _Mapping]] = ...) -> None: ...

class BrokerHaInfo(_message.Message):
    __slots__ = ("master_ha_addr", "master_flush_offset", "master_addr")
    MASTER_HA_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_FLUSH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    master_ha_addr: str
    master_flush_offset: int
    master_addr: str
    def __init__(self, master_ha_addr: _Optional[str] = ..., master_flush_offset: _Optional[int] = ..., master_addr: _Optional[str] = ...) -> None: ...

class BrokerStatus(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class HaReport(_message.Message):
    __slots__ = ("max_offset", "slave_addr", "broker_id", "member_id")
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SLAVE_ADDR_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    max_offset: int
    slave_addr: str
    broker_id: int
    member_id: int
    def __init__(self, max_offset: _Optional[int] = ..., slave_addr: _Optional[str] = ..., broker_id: _Optional[int] = ..., member_id: _Optional[int] = ...) -> None: ...

class EpochRequest(_message.Message):
    __slots__ = ("member_id", "epoch")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    member_id: int
    epoch: int
    def __init__(self, member_id: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class EpochEntry(_message.Message):
    __slots__ = ("epoch", "start_offset")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    start_offset: int
    def __init__(self, epoch: _Optional[int] = ..., start_offset: _Optional[int] = ...) -> None: ...

class EpochCache(_message.Message):
    __slots__ = ("epochs", "max_offset", "epoch")
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epochs: _containers.RepeatedCompositeFieldContainer[EpochEntry]
    max_offset: int
    epoch: int
    def __init__(self, epochs: _Optional[_Iterable[_Union[EpochEntry, _Mapping]]] = ..., max_offset: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class PrepareSwitchRequest(_message.Message):
    __slots__ = ("target_member", "epoch", "timeout_ms")
    TARGET_MEMBER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    target_member: int
    epoch: int
    timeout_ms: int
    def __init__(self, target_member: _Optional[int] = ..., epoch: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class PrepareSwitchResponse(_message.Message):
    __slots__ = ("caught_up", "end_offset", "detail")
    CAUGHT_UP_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    caught_up: bool
    end_offset: int
    detail: str
    def __init__(self, caught_up: _Optional[bool] = ..., end_offset: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class HaTransfer(_message.Message):
    __slots__ = ("offset", "data", "master_max_offset")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MASTER_MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    master_max_offset: int
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., master_max_offset: _Optional[int] = ...) -> None: ...

class HaHello(_message.Message):
    __slots__ = ("slave_nonce",)
    SLAVE_NONCE_FIELD_NUMBER: _ClassVar[int]
    slave_nonce: bytes
    def __init__(self, slave_nonce: _Optional[bytes] = ...) -> None: ...

class HaChallenge(_message.Message):
    __slots__ = ("challenge", "master_proof")
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    MASTER_PROOF_FIELD_NUMBER: _ClassVar[int]
    challenge: bytes
    master_proof: bytes
    def __init__(self, challenge: _Optional[bytes] = ..., master_proof: _Optional[bytes] = ...) -> None: ...

class HaAuth(_message.Message):
    __slots__ = ("broker_name", "broker_id", "slave_addr", "signature")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    SLAVE_ADDR_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    broker_id: int
    slave_addr: str
    signature: bytes
    def __init__(self, broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., slave_addr: _Optional[str] = ..., signature: _Optional[bytes] = ...) -> None: ...

class CommitLogRangeRequest(_message.Message):
    __slots__ = ("from_offset", "max_bytes")
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    from_offset: int
    max_bytes: int
    def __init__(self, from_offset: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class CommitLogRange(_message.Message):
    __slots__ = ("from_offset", "data", "min_offset", "max_offset")
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    from_offset: int
    data: bytes
    min_offset: int
    max_offset: int
    def __init__(self, from_offset: _Optional[int] = ..., data: _Optional[bytes] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class PopMessageRequest(_message.Message):
    __slots__ = ("consumer_group", "topic", "queue_id", "max_msg_nums", "invisible_time_ms", "poll_time_ms", "tags", "order", "sql92", "lite", "lite_topics")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_MSG_NUMS_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    POLL_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    SQL92_FIELD_NUMBER: _ClassVar[int]
    LITE_FIELD_NUMBER: _ClassVar[int]
    LITE_TOPICS_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    queue_id: int
    max_msg_nums: int
    invisible_time_ms: int
    poll_time_ms: int
    tags: _containers.RepeatedScalarFieldContainer[str]
    order: bool
    sql92: str
    lite: bool
    lite_topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., max_msg_nums: _Optional[int] = ..., invisible_time_ms: _Optional[int] = ..., poll_time_ms: _Optional[int] = ..., tags: _Optional[_Iterable[str]] = ..., order: _Optional[bool] = ..., sql92: _Optional[str] = ..., lite: _Optional[bool] = ..., lite_topics: _Optional[_Iterable[str]] = ...) -> None: ...

class PopMessageResponse(_message.Message):
    __slots__ = ("messages", "pop_time_ms", "invisible_time_ms")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    POP_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    pop_time_ms: int
    invisible_time_ms: int
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., pop_time_ms: _Optional[int] = ..., invisible_time_ms: _Optional[int] = ...) -> None: ...

class AckMessageRequest(_message.Message):
    __slots__ = ("consumer_group", "topic", "receipt_handle", "invisible_time_ms")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    receipt_handle: str
    invisible_time_ms: int
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., receipt_handle: _Optional[str] = ..., invisible_time_ms: _Optional[int] = ...) -> None: ...

class AckMessageResponse(_message.Message):
    __slots__ = ("receipt_handle",)
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    receipt_handle: str
    def __init__(self, receipt_handle: _Optional[str] = ...) -> None: ...

class ConsumerListRequest(_message.Message):
    __slots__ = ("consumer_group",)
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    def __init__(self, consumer_group: _Optional[str] = ...) -> None: ...

class ConsumerListResponse(_message.Message):
    __slots__ = ("client_ids",)
    CLIENT_IDS_FIELD_NUMBER: _ClassVar[int]
    client_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, client_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class TopicConfigTable(_message.Message):
    __slots__ = ("topics", "data_version")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicConfig]
    data_version: _common_pb2.DataVersion
    def __init__(self, topics: _Optional[_Iterable[_Union[_common_pb2.TopicConfig, _Mapping]]] = ..., data_version: _Optional[_Union[_common_pb2.DataVersion, _Mapping]] = ...) -> None: ...

class TransactionOffsets(_message.Message):
    __slots__ = ("half_offset", "op_offset", "resolved", "resolved_transaction_ids", "data_version")
    HALF_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OP_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_TRANSACTION_IDS_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    half_offset: int
    op_offset: int
    resolved: _containers.RepeatedScalarFieldContainer[int]
    resolved_transaction_ids: _containers.RepeatedScalarFieldContainer[str]
    data_version: _common_pb2.DataVersion
    def __init__(self, half_offset: _Optional[int] = ..., op_offset: _Optional[int] = ..., resolved: _Optional[_Iterable[int]] = ..., resolved_transaction_ids: _Optional[_Iterable[str]] = ..., data_version: _Optional[_Union[_common_pb2.DataVersion, _Mapping]] = ...) -> None: ...

class RecallMessageRequest(_message.Message):
    __slots__ = ("producer_group", "topic", "broker_name", "deliver_ms", "uniq_key")
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    DELIVER_MS_FIELD_NUMBER: _ClassVar[int]
    UNIQ_KEY_FIELD_NUMBER: _ClassVar[int]
    producer_group: str
    topic: str
    broker_name: str
    deliver_ms: int
    uniq_key: str
    def __init__(self, producer_group: _Optional[str] = ..., topic: _Optional[str] = ..., broker_name: _Optional[str] = ..., deliver_ms: _Optional[int] = ..., uniq_key: _Optional[str] = ...) -> None: ...

class RecallMessageResponse(_message.Message):
    __slots__ = ("msg_id",)
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    msg_id: str
    def __init__(self, msg_id: _Optional[str] = ...) -> None: ...

class RecallEntry(_message.Message):
    __slots__ = ("uniq_key", "due_ms", "topic")
    UNIQ_KEY_FIELD_NUMBER: _ClassVar[int]
    DUE_MS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    uniq_key: str
    due_ms: int
    topic: str
    def __init__(self, uniq_key: _Optional[str] = ..., due_ms: _Optional[int] = ..., topic: _Optional[str] = ...) -> None: ...

class RecallTable(_message.Message):
    __slots__ = ("entries", "data_version")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[RecallEntry]
    data_version: _common_pb2.DataVersion
    def __init__(self, entries: _Optional[_Iterable[_Union[RecallEntry, _Mapping]]] = ..., data_version: _Optional[_Union[_common_pb2.DataVersion, _Mapping]] = ...) -> None: ...

class PopAckEntry(_message.Message):
    __slots__ = ("ck_key", "revive_queue_id", "revive_offset", "offsets")
    CK_KEY_FIELD_NUMBER: _ClassVar[int]
    REVIVE_QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    REVIVE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    ck_key: str
    revive_queue_id: int
    revive_offset: int
    offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ck_key: _Optional[str] = ..., revive_queue_id: _Optional[int] = ..., revive_offset: _Optional[int] = ..., offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class PopAckTable(_message.Message):
    __slots__ = ("entries", "revive_offsets", "data_version")
    class ReviveOffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    REVIVE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[PopAckEntry]
    revive_offsets: _containers.ScalarMap[int, int]
    data_version: _common_pb2.DataVersion
    def __init__(self, entries: _Optional[_Iterable[_Union[PopAckEntry, _Mapping]]] = ..., revive_offsets: _Optional[_Mapping[int, int]] = ..., data_version: _Optional[_Union[_common_pb2.DataVersion, _Mapping]] = ...) -> None: ...

class SubscriptionGroupConfig(_message.Message):
    __slots__ = ("group_name", "consume_orderly")
    GROUP_NAME_FIELD_NUMBER: _ClassVar[int]
    CONSUME_ORDERLY_FIELD_NUMBER: _ClassVar[int]
    group_name: str
    consume_orderly: bool
    def __init__(self, group_name: _Optional[str] = ..., consume_orderly: _Optional[bool] = ...) -> None: ...

class UpdateSubscriptionGroupRequest(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: SubscriptionGroupConfig
    def __init__(self, config: _Optional[_Union[SubscriptionGroupConfig, _Mapping]] = ...) -> None: ...

class SubscriptionGroupTable(_message.Message):
    __slots__ = ("groups", "data_version")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[SubscriptionGroupConfig]
    data_version: _common_pb2.DataVersion
    def __init__(self, groups: _Optional[_Iterable[_Union[SubscriptionGroupConfig, _Mapping]]] = ..., data_version: _Optional[_Union[_common_pb2.DataVersion, _Mapping]] = ...) -> None: ...

class QueryMessageRequest(_message.Message):
    __slots__ = ("topic", "key", "begin_ms", "end_ms", "max_num")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    BEGIN_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: str
    begin_ms: int
    end_ms: int
    max_num: int
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[str] = ..., begin_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., max_num: _Optional[int] = ...) -> None: ...

class ViewMessageRequest(_message.Message):
    __slots__ = ("msg_id", "max_num")
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_FIELD_NUMBER: _ClassVar[int]
    msg_id: str
    max_num: int
    def __init__(self, msg_id: _Optional[str] = ..., max_num: _Optional[int] = ...) -> None: ...

class QueriedMessage(_message.Message):
    __slots__ = ("topic", "queue_id", "queue_offset", "physical_offset", "store_ts_ms", "keys", "uniq_key", "body_size", "offset_msg_id", "born_ts_ms", "tags")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PHYSICAL_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STORE_TS_MS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    UNIQ_KEY_FIELD_NUMBER: _ClassVar[int]
    BODY_SIZE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_MSG_ID_FIELD_NUMBER: _ClassVar[int]
    BORN_TS_MS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    store_ts_ms: int
    keys: str
    uniq_key: str
    body_size: int
    offset_msg_id: str
    born_ts_ms: int
    tags: str
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., physical_offset: _Optional[int] = ..., store_ts_ms: _Optional[int] = ..., keys: _Optional[str] = ..., uniq_key: _Optional[str] = ..., body_size: _Optional[int] = ..., offset_msg_id: _Optional[str] = ..., born_ts_ms: _Optional[int] = ..., tags: _Optional[str] = ...) -> None: ...

class QueryMessageResponse(_message.Message):
    __slots__ = ("broker_name", "messages")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    messages: _containers.RepeatedCompositeFieldContainer[QueriedMessage]
    def __init__(self, broker_name: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[QueriedMessage, _Mapping]]] = ...) -> None: ...
