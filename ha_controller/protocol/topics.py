"""Topic and group names and topic settings that every part checks the same way.

RocketMQ's rules (``TopicValidator``): a name is 1..127 characters of
``[%|a-zA-Z0-9_-]``; names with a system prefix (``%RETRY%``, ``%DLQ%``, ``rmq_sys_``,
``SCHEDULE_TOPIC``, ``RMQ_SYS_``) and ``TBW102`` are made by the brokers themselves.
A consumer group name is 1..255 characters of the same set; ``CID_RMQ_SYS_`` and the
brokers' own ``%...%`` offset tables are reserved.  Queue counts are bounded by
:data:`MAX_QUEUE_NUMS`; a permission is a combination of READ 4, WRITE 2 and INHERIT 1
with at least READ or WRITE.

A topic has a message type (RocketMQ 5's ``message.type`` attribute,
:class:`TopicMessageType`): NORMAL, FIFO, DELAY, TRANSACTION, PRIORITY or LITE take
only their own kind of message (a LITE topic is the parent of lite topics: RocketMQ
5.5's RIP-83); MIXED takes every kind (what topics made before types
existed, and topics the brokers create on a first send, are).

Sans-IO: each ``*_problem`` function returns the reason a value is refused, or None.
``hactl`` turns a reason into a usage error before anything is sent; a broker turns it
into ``BadRequest`` before anything is created or persisted.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from typing import Final

from ha_controller.protocol.properties import (
    AUTO_CREATE_TOPIC,
    DELAY_OFFSET_GROUP,
    DLQ_PREFIX,
    PROPERTY_DELAY,
    PROPERTY_LITE_TOPIC,
    PROPERTY_MESSAGE_GROUP,
    PROPERTY_PRIORITY,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRAN_MSG,
    RETRY_PREFIX,
    REVIVE_GROUP,
    TIMER_CHECKPOINT_GROUP,
)

__all__ = [
    "GROUP_NAME_MAX_LEN",
    "GROUP_TOPIC_PREFIXES",
    "RESERVED_GROUP_PREFIXES",
    "MAX_QUEUE_NUMS",
    "SYSTEM_TOPIC_PREFIXES",
    "TOPIC_NAME_MAX_LEN",
    "VALID_PERMS",
    "TopicMessageType",
    "group_name_problem",
    "message_type_name_problem",
    "message_type_of",
    "message_type_problem",
    "perm_problem",
    "queue_nums_problem",
    "reserved_prefix",
    "topic_name_problem",
]

TOPIC_NAME_MAX_LEN: Final = 127
#: RocketMQ's ``Validators.CHARACTER_MAX_LENGTH`` for group names.
GROUP_NAME_MAX_LEN: Final = 255
#: Groups the brokers use themselves (RocketMQ's ``CID_RMQ_SYS_`` system groups, our
#: offset tables of the delay and timer services) and the retry/dead-letter prefixes.
RESERVED_GROUP_PREFIXES: Final = (
    "CID_RMQ_SYS_",
    REVIVE_GROUP,
    DELAY_OFFSET_GROUP,
    TIMER_CHECKPOINT_GROUP,
    RETRY_PREFIX,
    DLQ_PREFIX,
)
#: The most queues a topic may have on one broker (RocketMQ sets no hard limit; each
#: queue is a consume queue file and a pull loop per consumer, so we do).
MAX_QUEUE_NUMS: Final = 1024
_NAME_RE: Final = re.compile(r"[%|a-zA-Z0-9_-]+", re.ASCII)
#: A consumer group's retry and dead-letter topics: made by the brokers, and an
#: operator may still adjust them (a DLQ is made readable to drain it, as in RocketMQ).
GROUP_TOPIC_PREFIXES: Final = (RETRY_PREFIX, DLQ_PREFIX)
#: Internal topics of the brokers (schedule, timer, transactions, revive, offsets).
SYSTEM_TOPIC_PREFIXES: Final = ("rmq_sys_", "SCHEDULE_TOPIC", "RMQ_SYS_")
#: READ|WRITE|INHERIT combinations with READ or WRITE (PRIORITY 8 is not ours).
VALID_PERMS: Final = frozenset(range(2, 8))


def reserved_prefix(name: str, *, group_topics: bool = True) -> str | None:
    """The reserved prefix ``name`` starts with (``TBW102`` counts as one), or None.

    With ``group_topics=False`` the retry and dead-letter prefixes do not count."""
    if name == AUTO_CREATE_TOPIC:
        return AUTO_CREATE_TOPIC
    prefixes = (
        (*GROUP_TOPIC_PREFIXES, *SYSTEM_TOPIC_PREFIXES) if group_topics else (SYSTEM_TOPIC_PREFIXES)
    )
    for prefix in prefixes:
        if name.startswith(prefix):
            return prefix
    return None


def topic_name_problem(
    name: str, *, allow_reserved: bool = False, allow_group_topics: bool = False
) -> str | None:
    """Why ``name`` is not a topic name a client may use, or None.

    ``allow_reserved``: the broker's own topics pass (auto-create, sync from the
    master); ``allow_group_topics``: retry/dead-letter topics pass (admin requests).
    """
    if not name:
        return "a topic name must not be empty"
    if len(name) > TOPIC_NAME_MAX_LEN:
        return f"a topic name has at most {TOPIC_NAME_MAX_LEN} characters, this one {len(name)}"
    if _NAME_RE.fullmatch(name) is None:
        bad = sorted({ch for ch in name if _NAME_RE.fullmatch(ch) is None})
        return f"topic name {name!r} has characters outside [%|a-zA-Z0-9_-]: " + " ".join(
            repr(ch) for ch in bad
        )
    if not allow_reserved:
        prefix = reserved_prefix(name, group_topics=not allow_group_topics)
        if prefix is not None:
            return f"topic name {name!r} uses {prefix!r}, which is reserved for the brokers"
    return None


def queue_nums_problem(n: int) -> str | None:
    """Why ``n`` is not a queue count, or None."""
    if not 1 <= n <= MAX_QUEUE_NUMS:
        return f"a topic has 1..{MAX_QUEUE_NUMS} queues, not {n}"
    return None


def perm_problem(perm: int) -> str | None:
    """Why ``perm`` is not a topic permission, or None."""
    if perm not in VALID_PERMS:
        return (
            f"perm {perm} is not READ 4 | WRITE 2 | INHERIT 1 with READ or WRITE "
            "(2 write-only, 4 read-only, 6 read-write; +1 inherit)"
        )
    return None


def group_name_problem(name: str, *, allow_reserved: bool = False) -> str | None:
    """Why ``name`` is not a consumer group name a client may use, or None
    (RocketMQ's ``Validators.checkGroup``: ``[%|a-zA-Z0-9_-]``, at most 255).

    ``allow_reserved``: the brokers' own groups pass (a cluster member's request)."""
    if not name:
        return "a group name must not be empty"
    if len(name) > GROUP_NAME_MAX_LEN:
        return f"a group name has at most {GROUP_NAME_MAX_LEN} characters, this one {len(name)}"
    if _NAME_RE.fullmatch(name) is None:
        bad = sorted({ch for ch in name if _NAME_RE.fullmatch(ch) is None})
        return f"group name {name!r} has characters outside [%|a-zA-Z0-9_-]: " + " ".join(
            repr(ch) for ch in bad
        )
    if not allow_reserved:
        for prefix in RESERVED_GROUP_PREFIXES:
            if name.startswith(prefix):
                return f"group name {name!r} uses {prefix!r}, which is reserved for the brokers"
    return None


class TopicMessageType(enum.StrEnum):
    """The kind of messages a topic takes (RocketMQ's ``TopicMessageType``, PRIORITY as
    in RocketMQ 5.4, LITE as in 5.5); MIXED takes all."""

    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"
    PRIORITY = "PRIORITY"
    LITE = "LITE"
    MIXED = "MIXED"

    def accepts(self, kind: TopicMessageType) -> bool:
        return self is TopicMessageType.MIXED or self is kind

    @classmethod
    def parse(cls, text: str) -> TopicMessageType:
        """``text`` (any case) as a type; "" is MIXED (a topic from before types).
        ValueError naming the choices otherwise."""
        if not text:
            return cls.MIXED
        try:
            return cls(text.upper())
        except ValueError:
            choices = "|".join(t.value for t in cls)
            raise ValueError(f"message type {text!r} is not one of {choices}") from None

    @classmethod
    def from_wire(cls, text: str) -> TopicMessageType:
        """As :meth:`parse`, but a type this version does not know (a newer peer's) is
        MIXED: the topic keeps working; the topic admin request checks it first."""
        try:
            return cls.parse(text)
        except ValueError:
            return cls.MIXED


def message_type_name_problem(text: str) -> str | None:
    """Why ``text`` is not a topic message type, or None ("" is MIXED)."""
    try:
        TopicMessageType.parse(text)
    except ValueError as exc:
        return str(exc)
    return None


def message_type_of(properties: Mapping[str, str]) -> TopicMessageType:
    """A message's kind by its properties, as RocketMQ's proxy and broker tell it
    (``TopicMessageType.parseFromMessageProperty``): a prepared transaction message,
    then a delayed one (delay level or delivery time), then a FIFO one (message
    group), then a PRIORITY one, then a LITE one (a lite topic); NORMAL otherwise."""
    if properties.get(PROPERTY_TRAN_MSG, "").lower() == "true":
        return TopicMessageType.TRANSACTION
    if PROPERTY_DELAY in properties or PROPERTY_TIMER_DELIVER_MS in properties:
        return TopicMessageType.DELAY
    if PROPERTY_MESSAGE_GROUP in properties:
        return TopicMessageType.FIFO
    if PROPERTY_PRIORITY in properties:
        return TopicMessageType.PRIORITY
    if PROPERTY_LITE_TOPIC in properties:
        return TopicMessageType.LITE
    return TopicMessageType.NORMAL


def message_type_problem(
    topic: str, topic_type: TopicMessageType, kind: TopicMessageType
) -> str | None:
    """Why topic ``topic`` of type ``topic_type`` refuses a ``kind`` message, or None
    (RocketMQ's words)."""
    if topic_type.accepts(kind):
        return None
    return (
        f"TopicMessageType validate failed, the expected type is {topic_type.value}, but "
        f"actual type is {kind.value} (topic {topic!r}; hactl topic update {topic} "
        "--message-type changes it)"
    )
