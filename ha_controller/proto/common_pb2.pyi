from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DataVersion(_message.Message):
    __slots__ = ("state_version", "counter", "timestamp_ms")
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    state_version: int
    counter: int
    timestamp_ms: int
    def __init__(self, state_version: _Optional[int] = ..., counter: _Optional[int] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class TopicConfig(_message.Message):
    __slots__ = ("topic_name", "read_queue_nums", "write_queue_nums", "perm", "topic_sys_flag", "order", "message_type")
    TOPIC_NAME_FIELD_NUMBER: _ClassVar[int]
    READ_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    TOPIC_SYS_FLAG_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    topic_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int
    order: bool
    message_type: str
    def __init__(self, topic_name: _Optional[str] = ..., read_queue_nums: _Optional[int] = ..., write_queue_nums: _Optional[int] = ..., perm: _Optional[int] = ..., topic_sys_flag: _Optional[int] = ..., order: _Optional[bool] = ..., message_type: _Optional[str] = ...) -> None: ...

class BrokerData(_message.Message):
    __slots__ = ("cluster", "broker_name", "broker_addrs", "enable_acting_master", "acting_broker_id", "epoch")
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
    ENABLE_ACTING_MASTER_FIELD_NUMBER: _ClassVar[int]
    ACTING_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    broker_addrs: _containers.ScalarMap[int, str]
    enable_acting_master: bool
    acting_broker_id: int
    epoch: int
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_addrs: _Optional[_Mapping[int, str]] = ..., enable_acting_master: _Optional[bool] = ..., acting_broker_id: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class QueueData(_message.Message):
    __slots__ = ("broker_name", "read_queue_nums", "write_queue_nums", "perm", "topic_sys_flag")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    READ_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    TOPIC_SYS_FLAG_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int
    def __init__(self, broker_name: _Optional[str] = ..., read_queue_nums: _Optional[int] = ..., write_queue_nums: _Optional[int] = ..., perm: _Optional[int] = ..., topic_sys_flag: _Optional[int] = ...) -> None: ...

class TopicRoute(_message.Message):
    __slots__ = ("topic", "brokers", "queues")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerData]
    queues: _containers.RepeatedCompositeFieldContainer[QueueData]
    def __init__(self, topic: _Optional[str] = ..., brokers: _Optional[_Iterable[_Union[BrokerData, _Mapping]]] = ..., queues: _Optional[_Iterable[_Union[QueueData, _Mapping]]] = ...) -> None: ...
