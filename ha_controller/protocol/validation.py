"""What a message and a consumer may carry: RocketMQ 5's rules and limits, checked the
same way by our SDK (before anything is sent), the gRPC gateway (before anything is
sent to a broker) and the brokers (before anything is stored).

The limits are RocketMQ's proxy defaults (``ProxyConfig``): a body of at most
:data:`MAX_BODY_BYTES` (``maxMessageSize``), user properties, tag and keys of at most
:data:`MAX_USER_PROPERTY_BYTES` together (``maxUserPropertySize``), at most
:data:`MAX_USER_PROPERTIES` user properties (``userPropertyMaxNum``), a message group
shorter than :data:`MAX_MESSAGE_GROUP_BYTES` (``maxMessageGroupSize``), a delivery time
at most :data:`MAX_DELAY_MS` ahead (``maxDelayTimeMills``) and a receive's invisible
time of :data:`MIN_INVISIBLE_MS_FOR_RECEIVE` .. :data:`MAX_INVISIBLE_MS`
(``minInvisibleTimeMillsForRecv``, ``maxInvisibleTimeMills``).  The characters are
RocketMQ's too: no ISO control character (Java's ``Character.isISOControl``) in a tag,
key, message group or user property, no blank tag, key or message group, no ``|`` in a
tag.

Each check raises the typed error (``ha_controller.protocol.errors``) whose v2 status
the gateway answers, RocketMQ's proxy code for the same check.  Sans-IO.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from ha_controller.protocol.errors import (
    IllegalConsumerGroup,
    IllegalDeliveryTime,
    IllegalInvisibleTime,
    IllegalLiteTopic,
    IllegalMessageGroup,
    IllegalMessageKey,
    IllegalMessageTag,
    IllegalPropertyKey,
    IllegalTopic,
    MessageBodyEmpty,
    MessageTooLarge,
    PropertiesTooLarge,
)
from ha_controller.protocol.properties import (
    PROPERTY_BORN_TIMESTAMP,
    PROPERTY_DELAY,
    PROPERTY_DUE_MS,
    PROPERTY_ESCAPE_ID,
    PROPERTY_KEYS,
    PROPERTY_LITE_TOPIC,
    PROPERTY_MAX_OFFSET,
    PROPERTY_MESSAGE_GROUP,
    PROPERTY_MIN_OFFSET,
    PROPERTY_OP_RESULT,
    PROPERTY_OP_TRANSACTION_ID,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_POP_CK,
    PROPERTY_PREPARED_QUEUE_OFFSET,
    PROPERTY_PRIORITY,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRAN_MSG,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_UNIQ_KEY,
)
from ha_controller.protocol.topics import group_name_problem, topic_name_problem

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_DELAY_MS",
    "MAX_INVISIBLE_MS",
    "MAX_LITE_TOPIC_BYTES",
    "MAX_MESSAGE_GROUP_BYTES",
    "MAX_USER_PROPERTIES",
    "MAX_USER_PROPERTY_BYTES",
    "MIN_INVISIBLE_MS_FOR_RECEIVE",
    "RECORD_ALLOWANCE_BYTES",
    "RESERVED_CONSUMER_GROUPS",
    "SYSTEM_PROPERTIES",
    "DEFAULT_LIMITS",
    "MessageLimits",
    "check_body",
    "check_consumer_group",
    "check_delivery_time",
    "check_invisible_ms",
    "check_key",
    "check_lite_topic",
    "check_message",
    "check_message_group",
    "check_tag",
    "check_topic",
    "check_user_properties",
    "has_control_character",
]

#: RocketMQ's ``maxMessageSize``: the largest body of one message
MAX_BODY_BYTES: Final = 4 * 1024 * 1024
#: RocketMQ's ``maxUserPropertySize``: user properties (keys and values), the tag and
#: the keys of one message together, in UTF-8 bytes
MAX_USER_PROPERTY_BYTES: Final = 16 * 1024
#: RocketMQ's ``userPropertyMaxNum``
MAX_USER_PROPERTIES: Final = 128
#: RocketMQ's ``maxMessageGroupSize``: a message group must be shorter (UTF-8 bytes)
MAX_MESSAGE_GROUP_BYTES: Final = 64
#: RocketMQ's proxy ``maxLiteTopicSize``: a lite topic name is at most this long (UTF-8
#: bytes); the SDKs are told it in their settings (``max_lite_topic_size``)
MAX_LITE_TOPIC_BYTES: Final = 64
#: RocketMQ's ``maxDelayTimeMills``: a delivery time at most one day ahead
MAX_DELAY_MS: Final = 24 * 3600 * 1000
#: RocketMQ's ``minInvisibleTimeMillsForRecv``: the gateway's floor for a receive
MIN_INVISIBLE_MS_FOR_RECEIVE: Final = 10_000
#: RocketMQ's ``maxInvisibleTimeMills``
MAX_INVISIBLE_MS: Final = 12 * 3600 * 1000
#: what a stored record may have beyond its body (properties, names, header): a record
#: is at most the body limit plus this, as RocketMQ's store (``MessageExtEncoder``)
RECORD_ALLOWANCE_BYTES: Final = 64 * 1024
#: consumer groups RocketMQ predefines for its own clients and tools (``MixAll``); a
#: client may not consume with them (RocketMQ's e2e suite expects DEFAULT_CONSUMER to
#: be refused)
RESERVED_CONSUMER_GROUPS: Final = frozenset(
    {
        "DEFAULT_CONSUMER",
        "TOOLS_CONSUMER",
        "SCHEDULE_CONSUMER",
        "FILTERSRV_CONSUMER",
        "__MONITOR_CONSUMER",
        "SELF_TEST_C_GROUP",
        "CID_ONS-HTTP-PROXY",
        "CID_ONSAPI_PERMISSION",
        "CID_ONSAPI_OWNER",
        "CID_ONSAPI_PULL",
    }
)

#: Properties the SDKs and the brokers set (RocketMQ's ``MessageConst.STRING_HASH_SET``
#: and ours): no user property may have one of these names
#: (ILLEGAL_MESSAGE_PROPERTY_KEY).  Beyond RocketMQ's proxy, the message group and the
#: transaction id are refused too: set as user properties they would turn a message into
#: another type, or be overwritten by the broker.
SYSTEM_PROPERTIES: Final = frozenset(
    {
        PROPERTY_TAGS,
        PROPERTY_KEYS,
        PROPERTY_UNIQ_KEY,
        PROPERTY_MESSAGE_GROUP,
        PROPERTY_TRANSACTION_ID,
        PROPERTY_TIMER_DELIVER_MS,
        PROPERTY_DELAY,
        PROPERTY_TRAN_MSG,
        PROPERTY_PRODUCER_GROUP,
        PROPERTY_RECONSUME_TIME,
        PROPERTY_RETRY_TOPIC,
        PROPERTY_PREPARED_QUEUE_OFFSET,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QID,
        PROPERTY_DUE_MS,
        PROPERTY_ESCAPE_ID,
        PROPERTY_POP_CK,
        PROPERTY_ORIGIN_MESSAGE_ID,
        PROPERTY_OP_TRANSACTION_ID,
        PROPERTY_OP_RESULT,
        PROPERTY_MIN_OFFSET,
        PROPERTY_MAX_OFFSET,
        PROPERTY_BORN_TIMESTAMP,
        PROPERTY_PRIORITY,
        PROPERTY_LITE_TOPIC,
    }
)


@dataclass(frozen=True, slots=True)
class MessageLimits:
    """The limits a message is checked against (RocketMQ's defaults)."""

    max_body_bytes: int = MAX_BODY_BYTES
    max_user_property_bytes: int = MAX_USER_PROPERTY_BYTES
    max_user_properties: int = MAX_USER_PROPERTIES
    max_message_group_bytes: int = MAX_MESSAGE_GROUP_BYTES
    max_delay_ms: int = MAX_DELAY_MS
    max_lite_topic_bytes: int = MAX_LITE_TOPIC_BYTES


#: RocketMQ's defaults
DEFAULT_LIMITS: Final = MessageLimits()
_LITE_TOPIC_RE: Final = re.compile(r"[a-zA-Z0-9_-]+", re.ASCII)


def has_control_character(text: str) -> bool:
    """Whether ``text`` has an ISO control character (U+0000..U+001F, U+007F..U+009F),
    as Java's ``Character.isISOControl``."""
    return any(ch <= "\x1f" or "\x7f" <= ch <= "\x9f" for ch in text)


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", errors="surrogatepass"))


def check_topic(name: str) -> None:
    """IllegalTopic unless a client may use topic ``name``: a well-formed name and none
    of the brokers' own (a group's retry and dead-letter topics may be read, as in
    RocketMQ)."""
    problem = topic_name_problem(name, allow_group_topics=True)
    if problem is not None:
        raise IllegalTopic(problem)


def check_consumer_group(name: str) -> None:
    """IllegalConsumerGroup unless a client may consume with group ``name``: a
    well-formed name, none of the brokers' own and none of RocketMQ's predefined groups
    (:data:`RESERVED_CONSUMER_GROUPS`)."""
    problem = group_name_problem(name)
    if problem is None and name in RESERVED_CONSUMER_GROUPS:
        problem = f"group {name!r} is one of RocketMQ's built-in groups: use a group of your own"
    if problem is not None:
        raise IllegalConsumerGroup(problem)


def check_body(body: bytes, max_bytes: int = MAX_BODY_BYTES) -> None:
    """MessageBodyEmpty or MessageTooLarge (RocketMQ: "message body cannot exceed the
    max")."""
    if not body:
        raise MessageBodyEmpty("message body cannot be empty")
    if max_bytes > 0 and len(body) > max_bytes:
        raise MessageTooLarge(
            f"message body of {len(body)} bytes exceeds the max {max_bytes} (maxMessageSize)"
        )


def check_tag(tag: str) -> None:
    """IllegalMessageTag for an empty or blank tag, one with ``|`` (which separates
    tags in a subscription) or with a control character.  (RocketMQ's proxy lets an
    empty tag through; its SDKs refuse it before sending, and so does everyone here.)"""
    if not tag or tag.isspace():
        raise IllegalMessageTag("tag cannot be empty or the char sequence of whitespace")
    if "|" in tag:
        raise IllegalMessageTag("tag cannot contain '|'")
    if has_control_character(tag):
        raise IllegalMessageTag("tag cannot contain control character")


def check_key(key: str) -> None:
    """IllegalMessageKey for a blank key or one with a control character."""
    if not key or key.isspace():
        raise IllegalMessageKey("key cannot be empty or the char sequence of whitespace")
    if has_control_character(key):
        raise IllegalMessageKey("key cannot contain control character")


def check_message_group(group: str, max_bytes: int = MAX_MESSAGE_GROUP_BYTES) -> None:
    """IllegalMessageGroup for a blank message group, one of ``max_bytes`` or more
    (RocketMQ compares with ``>=``) or with a control character."""
    if not group or group.isspace():
        raise IllegalMessageGroup(
            "message group cannot be empty or the char sequence of whitespace"
        )
    if max_bytes > 0 and _utf8_len(group) >= max_bytes:
        raise IllegalMessageGroup(
            f"message group exceed the max size {max_bytes} (it has {_utf8_len(group)} bytes)"
        )
    if has_control_character(group):
        raise IllegalMessageGroup("message group cannot contain control character")


def check_lite_topic(name: str, max_bytes: int = MAX_LITE_TOPIC_BYTES) -> None:
    """IllegalLiteTopic for a blank lite topic, one longer than ``max_bytes`` or with a
    character outside ``[a-zA-Z0-9_-]`` (RocketMQ's proxy ``validateLiteTopic``)."""
    if not name or name.isspace():
        raise IllegalLiteTopic("lite topic cannot be the char sequence of whitespace")
    size = _utf8_len(name)
    if size > max_bytes:
        raise IllegalLiteTopic(f"lite topic exceed the max size {max_bytes} (it has {size})")
    if _LITE_TOPIC_RE.fullmatch(name) is None:
        raise IllegalLiteTopic(
            f"lite topic {name!r} can only contain alphanumeric characters, hyphens(-), "
            "and underscores(_)"
        )


def check_user_properties(
    properties: Mapping[str, str],
    reserved: Collection[str] = SYSTEM_PROPERTIES,
    limits: MessageLimits = DEFAULT_LIMITS,
) -> int:
    """IllegalPropertyKey for a property named in ``reserved`` (the system's) or with a
    control character in its key or value; PropertiesTooLarge for more than
    ``max_user_properties``.  Returns their size (UTF-8 bytes of keys and values)."""
    if len(properties) > limits.max_user_properties:
        raise PropertiesTooLarge(
            f"too many user properties ({len(properties)}), max is {limits.max_user_properties}"
        )
    size = 0
    for key, value in properties.items():
        if key in reserved:
            raise IllegalPropertyKey(f"property is used by system: {key}")
        if not key:
            raise IllegalPropertyKey("the key of a property cannot be empty")
        if has_control_character(key):
            raise IllegalPropertyKey("the key of property cannot contain control character")
        if has_control_character(value):
            raise IllegalPropertyKey("the value of property cannot contain control character")
        size += _utf8_len(key) + _utf8_len(value)
    return size


def check_delivery_time(deliver_ms: int, now_ms: int, max_delay_ms: int = MAX_DELAY_MS) -> None:
    """IllegalDeliveryTime for a delivery time more than ``max_delay_ms`` ahead (a time
    in the past is due at once)."""
    if max_delay_ms > 0 and deliver_ms - now_ms > max_delay_ms:
        raise IllegalDeliveryTime(
            f"the max delay time of message is too large, max is {max_delay_ms} ms "
            f"(the delivery time is {deliver_ms - now_ms} ms ahead)"
        )


def check_invisible_ms(ms: int, *, min_ms: int = 0, max_ms: int = MAX_INVISIBLE_MS) -> None:
    """IllegalInvisibleTime outside ``min_ms`` .. ``max_ms`` (``max_ms`` <= 0: no upper
    bound)."""
    if ms < min_ms:
        raise IllegalInvisibleTime(f"the invisibleTime is too small. min is {min_ms} ms, not {ms}")
    if max_ms > 0 and ms > max_ms:
        raise IllegalInvisibleTime(f"the invisibleTime is too large. max is {max_ms} ms, not {ms}")


def check_message(
    *,
    body: bytes,
    tag: str | None,
    keys: Sequence[str],
    properties: Mapping[str, str],
    reserved: Collection[str] = SYSTEM_PROPERTIES,
    message_group: str | None = None,
    deliver_ms: int | None = None,
    now_ms: int = 0,
    limits: MessageLimits = DEFAULT_LIMITS,
) -> None:
    """Every rule for one message to send, in RocketMQ's proxy's order: the body, the
    user properties, the tag, the keys, their size together, the delivery time, the
    message group.  ``tag`` None: the message has none."""
    check_body(body, limits.max_body_bytes)
    size = check_user_properties(properties, reserved, limits)
    if tag is not None:
        check_tag(tag)
        size += _utf8_len(tag)
    for key in keys:
        check_key(key)
        size += _utf8_len(key)
    if size > limits.max_user_property_bytes:
        raise PropertiesTooLarge(
            f"the total size of user property is too large, max is "
            f"{limits.max_user_property_bytes} bytes (user properties, tag and keys have {size})"
        )
    if deliver_ms is not None:
        check_delivery_time(deliver_ms, now_ms, limits.max_delay_ms)
    if message_group is not None:
        check_message_group(message_group, limits.max_message_group_bytes)
