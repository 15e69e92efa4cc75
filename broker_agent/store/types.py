"""The store's value types: its settings, what an append takes and returns, what a
read and a dispatch return.  No I/O."""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple

from ha_controller.protocol.errors import ConfigError
from ha_controller.protocol.record import BLANK_MIN_SIZE, MIN_RECORD_SIZE, StoredMessage

from .consumequeue import DEFAULT_FILE_ENTRIES
from .retention import RetentionPolicy, parse_delete_when

__all__ = [
    "MAX_QUEUE_ID",
    "TOPIC_RE",
    "Dispatched",
    "GetMessageStatus",
    "GetResult",
    "MiB",
    "PutRequest",
    "PutResult",
    "StoreConfig",
    "now_ms",
]

MiB: Final = 1 << 20
#: what a topic name (a consume-queue directory) may be
TOPIC_RE: Final = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")
MAX_QUEUE_ID: Final = 0xFFFFFFFF
_HOUR_MS: Final = 3_600_000


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Store settings; validated on construction (ConfigError names the key)."""

    segment_size_bytes: int = 64 * MiB
    flush_mode: Literal["async", "sync"] = "async"
    flush_interval_ms: int = 500
    min_free_disk_ratio: float = 0.05
    #: below this much free space the store is LOW (the broker stops advertising
    #: writes); None = twice ``min_free_disk_ratio``
    warn_free_disk_ratio: float | None = None
    #: how often free space is sampled while appends go on (statvfs)
    disk_check_interval_ms: int = 1000
    max_message_size_bytes: int = 4 * MiB
    #: segments before the checkpoint that recovery verifies too (0: only the commit
    #: log past the checkpoint, as RocketMQ's recovery from its StoreCheckpoint)
    recovery_verify_segments: int = 0
    #: closed segments last modified longer ago than this are expired (RocketMQ
    #: fileReservedTime, 72 h)
    file_reserved_time_ms: int = 72 * _HOUR_MS
    #: hours of day (local time) expired segments are deleted in: "04", "04;05"
    delete_when: str = "04"
    #: above this much of the file system used, expired segments go at once
    disk_max_used_space_ratio: float = 0.75
    #: descriptors kept open besides the active segment's (LRU; see files)
    max_open_files: int = 256
    #: entries per consume-queue file
    consume_queue_file_entries: int = DEFAULT_FILE_ENTRIES
    #: keys the key index holds at most (0: no key index; see keyindex)
    key_index_max_entries: int = 1_000_000

    def __post_init__(self) -> None:
        if self.segment_size_bytes < 4096:
            raise ConfigError(f"segment_size_bytes must be >= 4096, got {self.segment_size_bytes}")
        if self.flush_mode not in ("async", "sync"):
            raise ConfigError(f"flush_mode must be 'async' or 'sync', got {self.flush_mode!r}")
        if self.flush_interval_ms <= 0:
            raise ConfigError(f"flush_interval_ms must be > 0, got {self.flush_interval_ms}")
        if not 0.0 <= self.min_free_disk_ratio < 1.0:
            raise ConfigError(
                f"min_free_disk_ratio must be in [0, 1), got {self.min_free_disk_ratio}"
            )
        warn = self.warn_free_disk_ratio
        if warn is not None and not self.min_free_disk_ratio <= warn < 1.0:
            raise ConfigError(
                f"warn_free_disk_ratio must be in [min_free_disk_ratio, 1), got {warn}"
            )
        if self.disk_check_interval_ms <= 0:
            raise ConfigError(
                f"disk_check_interval_ms must be > 0, got {self.disk_check_interval_ms}"
            )
        if self.max_message_size_bytes < MIN_RECORD_SIZE:
            raise ConfigError(
                f"max_message_size_bytes must be >= {MIN_RECORD_SIZE}, "
                f"got {self.max_message_size_bytes}"
            )
        if self.max_message_size_bytes + BLANK_MIN_SIZE > self.segment_size_bytes:
            raise ConfigError(
                "max_message_size_bytes must leave room for a blank record in a segment: "
                f"{self.max_message_size_bytes} + {BLANK_MIN_SIZE} > "
                f"segment_size_bytes={self.segment_size_bytes}"
            )
        if self.recovery_verify_segments < 0:
            raise ConfigError(
                f"recovery_verify_segments must be >= 0, got {self.recovery_verify_segments}"
            )
        if self.file_reserved_time_ms <= 0:
            raise ConfigError(
                f"file_reserved_time_ms must be > 0, got {self.file_reserved_time_ms}"
            )
        try:
            parse_delete_when(self.delete_when)
        except ValueError as exc:
            raise ConfigError(f"delete_when: {exc}") from None
        if not 0.0 < self.disk_max_used_space_ratio <= 1.0:
            raise ConfigError(
                f"disk_max_used_space_ratio must be in (0, 1], got {self.disk_max_used_space_ratio}"
            )
        if self.max_open_files < 1:
            raise ConfigError(f"max_open_files must be >= 1, got {self.max_open_files}")
        if self.consume_queue_file_entries < 1:
            raise ConfigError(
                f"consume_queue_file_entries must be >= 1, got {self.consume_queue_file_entries}"
            )

        if self.key_index_max_entries < 0:
            raise ConfigError(
                f"key_index_max_entries must be >= 0, got {self.key_index_max_entries}"
            )

    @property
    def warn_ratio(self) -> float:
        if self.warn_free_disk_ratio is not None:
            return self.warn_free_disk_ratio
        return min(2 * self.min_free_disk_ratio, max(self.min_free_disk_ratio, 0.5))

    @property
    def retention(self) -> RetentionPolicy:
        return RetentionPolicy(
            self.file_reserved_time_ms,
            parse_delete_when(self.delete_when),
            self.disk_max_used_space_ratio,
        )


class PutRequest(NamedTuple):
    """One message for :meth:`MessageStore.put_batch` (what :meth:`~MessageStore.put` takes;
    a tuple: built per message on the send path)."""

    topic: str
    queue_id: int
    body: bytes
    properties: Mapping[str, str] | None = None
    flags: int = 0
    #: None: the store time
    born_ts_ms: int | None = None
    born_host: str = ""
    store_host: str = ""


@dataclass(frozen=True, slots=True)
class PutResult:
    physical_offset: int
    queue_offset: int
    size: int
    store_ts_ms: int
    msg_id: str


@dataclass(frozen=True, slots=True)
class Dispatched:
    """A consume-queue entry written by dispatch; enough to wake held pulls."""

    topic: str
    queue_id: int
    queue_offset: int
    tag_hash: int
    physical_offset: int
    size: int
    store_ts_ms: int


class GetMessageStatus(enum.Enum):
    """RocketMQ's ``GetMessageStatus`` values that this store produces."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    #: ours, not RocketMQ's: the next record is damaged and waits for its repair from a
    #: replica (``store.repair``); answered like RocketMQ's MESSAGE_WAS_REMOVING (retry)
    RECORD_UNDER_REPAIR = "RECORD_UNDER_REPAIR"


@dataclass(frozen=True, slots=True)
class GetResult:
    status: GetMessageStatus
    messages: list[StoredMessage] = field(default_factory=list)
    next_begin_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0


def now_ms() -> int:
    return int(time.time() * 1000)
