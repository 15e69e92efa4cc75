"""Public message types of the client SDK and the client message-id generator.

These dataclasses are what applications see; the generated protobuf types stay
inside the producer and consumers.  Property names are
RocketMQ's, so that a message looks the same to anyone used to RocketMQ.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from ha_controller.protocol.errors import MessageTooLarge

# Re-exported: the property names (and MAX_DELAY_LEVEL) are part of the SDK's API.
from ha_controller.protocol.properties import (
    MAX_DELAY_LEVEL,
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_MESSAGE_GROUP,
    PROPERTY_PRIORITY,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_UNIQ_KEY,
)
from ha_controller.protocol.validation import (
    SYSTEM_PROPERTIES,
    MessageLimits,
    check_body,
    check_topic,
)
from ha_controller.protocol.validation import check_message as validate

if TYPE_CHECKING:
    from ha_controller.proto import broker_pb2

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "PROPERTY_DELAY",
    "PROPERTY_KEYS",
    "PROPERTY_MESSAGE_GROUP",
    "PROPERTY_PRIORITY",
    "PROPERTY_PRODUCER_GROUP",
    "PROPERTY_TAGS",
    "PROPERTY_TIMER_DELIVER_MS",
    "PROPERTY_UNIQ_KEY",
    "MAX_DELAY_LEVEL",
    "RESERVED_PROPERTIES",
    "Message",
    "MessageIdGenerator",
    "MessageQueue",
    "ReceivedMessage",
    "SendReceipt",
    "check_message",
    "check_size",
    "new_client_id",
    "new_message_id",
]

#: RocketMQ's ``maxMessageSize`` (the producer's and the broker's ``max_message_bytes``
#: default): the largest body, and the most a batch's bodies and properties weigh.
DEFAULT_MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024

#: Properties the SDK sets from a message's fields; not allowed as user properties.
RESERVED_PROPERTIES: Final = frozenset(
    {
        PROPERTY_TAGS,
        PROPERTY_KEYS,
        PROPERTY_UNIQ_KEY,
        PROPERTY_DELAY,
        PROPERTY_TIMER_DELIVER_MS,
        PROPERTY_MESSAGE_GROUP,
        PROPERTY_PRIORITY,
        PROPERTY_PRODUCER_GROUP,
    }
)


@dataclass(frozen=True, order=True, slots=True)
class MessageQueue:
    """One queue of a topic in one broker group (RocketMQ's ``MessageQueue``).

    Ordering is (topic, broker_name, queue_id), as RocketMQ sorts queues before
    it allocates them to consumers.
    """

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}#{self.queue_id}"


@dataclass(slots=True)
class Message:
    """A message to send.

    ``keys`` are the business keys (sent space separated in ``KEYS``), so a key
    may not contain white space.  A message is either FIFO (``message_group``),
    delayed (``delay_level`` 1..18 or an absolute ``deliver_ts_ms``), a priority
    message (``priority`` >= 0, for a PRIORITY topic: the broker stores it in queue
    ``min(priority, queues - 1)``, and POP serves the highest first) or normal: the
    kinds are mutually exclusive, as in RocketMQ 5.  ``properties`` are user
    properties; the reserved names are set from the fields.
    """

    topic: str
    body: bytes
    tags: str | None = None
    keys: Sequence[str] = ()
    properties: dict[str, str] = field(default_factory=dict)
    message_group: str | None = None
    delay_level: int = 0
    deliver_ts_ms: int | None = None
    priority: int | None = None

    def __post_init__(self) -> None:
        if not self.topic:
            raise ValueError("message topic must not be empty")
        if not isinstance(self.body, bytes | bytearray | memoryview):
            raise TypeError(f"message body must be bytes, not {type(self.body).__name__}")
        self.body = bytes(self.body)
        if isinstance(self.keys, str):
            self.keys = (self.keys,)
        self.keys = tuple(self.keys)
        for key in self.keys:
            if not key or any(ch.isspace() for ch in key):
                raise ValueError(f"message key {key!r} is empty or contains white space")
        if self.tags is not None and (not self.tags or "||" in self.tags):
            raise ValueError(f"bad message tag {self.tags!r}")
        if not 0 <= self.delay_level <= MAX_DELAY_LEVEL:
            raise ValueError(f"delay_level must be 0..{MAX_DELAY_LEVEL}, got {self.delay_level}")
        if self.deliver_ts_ms is not None and self.deliver_ts_ms <= 0:
            raise ValueError(f"deliver_ts_ms must be positive, got {self.deliver_ts_ms}")
        if self.delay_level and self.deliver_ts_ms is not None:
            raise ValueError("set either delay_level or deliver_ts_ms, not both")
        if self.message_group is not None:
            if not self.message_group:
                raise ValueError("message_group must not be empty")
            if self.is_delayed:
                raise ValueError("a FIFO message (message_group) cannot also be delayed")
        if self.priority is not None:
            if isinstance(self.priority, bool) or not isinstance(self.priority, int):
                raise TypeError(f"priority must be an int, not {type(self.priority).__name__}")
            if self.priority < 0:
                raise ValueError(f"priority must be >= 0, got {self.priority}")
            if self.message_group is not None or self.is_delayed:
                raise ValueError("a priority message cannot also be FIFO or delayed")
        reserved = RESERVED_PROPERTIES.intersection(self.properties)
        if reserved:
            raise ValueError(f"reserved property names in properties: {sorted(reserved)}")

    @property
    def is_delayed(self) -> bool:
        return bool(self.delay_level) or self.deliver_ts_ms is not None

    def wire_properties(self, uniq_key: str, producer_group: str) -> dict[str, str]:
        """User properties plus the reserved ones, as they go on the wire."""
        props = dict(self.properties)
        props[PROPERTY_UNIQ_KEY] = uniq_key
        props[PROPERTY_PRODUCER_GROUP] = producer_group
        if self.tags is not None:
            props[PROPERTY_TAGS] = self.tags
        if self.keys:
            props[PROPERTY_KEYS] = " ".join(self.keys)
        if self.message_group is not None:
            props[PROPERTY_MESSAGE_GROUP] = self.message_group
        if self.delay_level:
            props[PROPERTY_DELAY] = str(self.delay_level)
        if self.deliver_ts_ms is not None:
            props[PROPERTY_TIMER_DELIVER_MS] = str(self.deliver_ts_ms)
        if self.priority is not None:
            props[PROPERTY_PRIORITY] = str(self.priority)
        return props


@dataclass(frozen=True, slots=True)
class SendReceipt:
    """What the broker acknowledged for one message.

    ``msg_id`` is the broker's offset message id; ``uniq_key`` is the client
    message id (``UNIQ_KEY``), shared by duplicates that internal retries may
    create.  ``key`` is the first business key, or the ``uniq_key`` when the
    message had none.  In controller mode the broker also names the ``epoch`` under
    which it acknowledged and its ``member_id`` (the group member it is, whatever id it
    serves as); both are None otherwise.
    """

    msg_id: str
    uniq_key: str
    topic: str
    broker_name: str
    queue_id: int
    queue_offset: int
    keys: tuple[str, ...] = ()
    epoch: int | None = None
    member_id: int | None = None

    @property
    def key(self) -> str:
        return self.keys[0] if self.keys else self.uniq_key

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A consumed message."""

    msg_id: str
    uniq_key: str
    topic: str
    broker_name: str
    queue_id: int
    queue_offset: int
    body: bytes
    properties: Mapping[str, str] = field(hash=False)
    tags: str | None
    keys: tuple[str, ...]
    born_ts_ms: int
    store_ts_ms: int
    reconsume_times: int = 0

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)

    @property
    def message_group(self) -> str | None:
        return self.properties.get(PROPERTY_MESSAGE_GROUP)

    @property
    def priority(self) -> int | None:
        """A priority message's priority (None for other messages)."""
        text = self.properties.get(PROPERTY_PRIORITY, "")
        return int(text) if text.isascii() and text.isdigit() else None

    @property
    def key(self) -> str:
        """The first business key, else the client message id."""
        return self.keys[0] if self.keys else self.uniq_key

    @classmethod
    def from_properties(
        cls,
        *,
        msg_id: str,
        topic: str,
        broker_name: str,
        queue_id: int,
        queue_offset: int,
        body: bytes,
        properties: Mapping[str, str],
        born_ts_ms: int,
        store_ts_ms: int,
        reconsume_times: int = 0,
    ) -> ReceivedMessage:
        """Build a message, deriving tags, keys and ``uniq_key`` from the properties."""
        props = dict(properties)
        return cls(
            msg_id=msg_id,
            uniq_key=props.get(PROPERTY_UNIQ_KEY) or msg_id,
            topic=topic,
            broker_name=broker_name,
            queue_id=queue_id,
            queue_offset=queue_offset,
            body=body,
            properties=props,
            tags=props.get(PROPERTY_TAGS) or None,
            keys=tuple(props.get(PROPERTY_KEYS, "").split()),
            born_ts_ms=born_ts_ms,
            store_ts_ms=store_ts_ms,
            reconsume_times=reconsume_times,
        )

    @classmethod
    def from_pb(
        cls, pb: broker_pb2.Message, *, topic: str, broker_name: str, reconsume_times: int = 0
    ) -> ReceivedMessage:
        """A broker's message; ``topic``, ``broker_name`` and ``reconsume_times`` are the
        caller's (each knows which of the wire fields, or its own, to trust)."""
        return cls.from_properties(
            msg_id=pb.msg_id,
            topic=topic,
            broker_name=broker_name,
            queue_id=pb.queue_id,
            queue_offset=pb.queue_offset,
            body=pb.body,
            properties=pb.properties,
            born_ts_ms=pb.born_ts_ms,
            store_ts_ms=pb.store_ts_ms,
            reconsume_times=reconsume_times,
        )


# --- ids ---------------------------------------------------------------------

#: 2021-01-01T00:00:00Z, the epoch of RocketMQ 5 message ids.
_ID_EPOCH_S: Final = 1_609_459_200


class MessageIdGenerator:
    """Client message ids in RocketMQ 5's layout (``docs/message_id.md``).

    17 bytes written as 34 upper-case hex digits: version ``01``, the low 6
    bytes of the MAC address, the low 2 bytes of the pid, the low 4 bytes of
    the seconds since 2021-01-01, and a 4-byte sequence.  The sequence wraps
    at 2**32 (as Java's ``AtomicInteger`` does, unlike the Python client) and
    starts at a random value, so two generators in one process (or a pid
    reused within a second) do not collide.  Thread-safe.
    """

    def __init__(self, *, node: int | None = None, pid: int | None = None) -> None:
        node = uuid.getnode() if node is None else node
        pid = os.getpid() if pid is None else pid
        self._prefix = "01" + f"{node & 0xFFFFFFFFFFFF:012X}" + f"{pid & 0xFFFF:04X}"
        self._seq = itertools.count(int.from_bytes(os.urandom(4), "big"))
        self._lock = threading.Lock()

    def next_id(self, now_s: float | None = None) -> str:
        seconds = int(time.time() if now_s is None else now_s) - _ID_EPOCH_S
        with self._lock:
            seq = next(self._seq) & 0xFFFFFFFF
        return f"{self._prefix}{seconds & 0xFFFFFFFF:08X}{seq:08X}"


_GENERATOR = MessageIdGenerator()
_CLIENT_INDEX = itertools.count()


def new_message_id() -> str:
    """A new unique client message id (``UNIQ_KEY``)."""
    return _GENERATOR.next_id()


def new_client_id() -> str:
    """A client id like the RocketMQ 5 clients': ``hostname@pid@index@random``."""
    rand = uuid.uuid4().hex[:9]
    return f"{socket.gethostname()}@{os.getpid()}@{next(_CLIENT_INDEX)}@{rand}"


def message_size(message: Message) -> int:
    """What a message weighs in a batch: its body and its user properties."""
    props = sum(len(k.encode()) + len(v.encode()) for k, v in message.properties.items())
    return len(message.body) + props


def check_message(
    message: Message,
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    now: int | None = None,
    *,
    reserved: Collection[str] = SYSTEM_PROPERTIES,
) -> None:
    """Refuse, before anything is sent, what RocketMQ refuses
    (``ha_controller.protocol.validation``, the same rules as the gateway's and the
    brokers'): a topic a client may not use, an empty body or one over ``max_bytes``, a
    tag, key, message group or user property RocketMQ would not take, user properties,
    tag and keys over 16 KiB together, a delivery time more than a day ahead.  Each is
    its typed error (not retriable)."""
    check_topic(message.topic)
    props = {k: v for k, v in message.properties.items() if k != PROPERTY_UNIQ_KEY}
    validate(
        body=message.body,
        tag=message.tags,
        keys=message.keys,
        properties=props,
        reserved=reserved,
        message_group=message.message_group,
        deliver_ms=message.deliver_ts_ms,
        now_ms=int(time.time() * 1000) if now is None else now,
        limits=MessageLimits(max_body_bytes=max_bytes),
    )


def check_size(messages: Sequence[Message], max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
    """Refuse (``MessageTooLarge``, not retriable) a send before anything is sent
    (RocketMQ's ``Validators.checkMessage``: no attempt, no retry, nothing on the wire):
    a message whose body is over ``max_bytes``, or a batch whose bodies and properties
    weigh more than ``max_bytes`` together (as RocketMQ's encoded batch)."""
    if len(messages) == 1:
        check_body(messages[0].body, max_bytes)
        return
    total = 0
    for message in messages:
        total += message_size(message)
    if total > max_bytes:
        raise MessageTooLarge(
            f"the batch of {len(messages)} messages to {messages[0].topic!r} has {total} bytes "
            f"of bodies and properties; the limit is {max_bytes} (the producer's "
            "max_message_bytes, RocketMQ's maxMessageSize)"
        )
