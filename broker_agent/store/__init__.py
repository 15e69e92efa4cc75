"""The broker's durable message store (RocketMQ CommitLog + ConsumeQueue ideas)."""

from .message_store import (
    Dispatched,
    GetMessageStatus,
    GetResult,
    MessageStore,
    PutResult,
    StoreConfig,
)

__all__ = [
    "Dispatched",
    "GetMessageStatus",
    "GetResult",
    "MessageStore",
    "PutResult",
    "StoreConfig",
]
