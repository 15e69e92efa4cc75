"""Topic and group names and topic settings that every part checks the same way.

RocketMQ's rules (``TopicValidator``): a name is 1..127 characters of
``[%|a-zA-Z0-9_-]``; names with a system prefix (``%RETRY%``, ``%DLQ%``, ``rmq_sys_``,
``SCHEDULE_TOPIC``, ``RMQ_SYS_``) and ``TBW102`` are made by the brokers themselves.
A consumer group name is 1..255 characters of the same set; ``CID_RMQ_SYS_`` and the
brokers' own ``%...%`` offset tables are reserved.  Queue counts are bounded by
:data:`MAX_QUEUE_NUMS`; a permission is a combination of READ 4, WRITE 2 and INHERIT 1
with at least READ or WRITE.

Sans-IO: each ``*_problem`` function returns the reason a value is refused, or None.
``hactl`` turns a reason into a usage error before anything is sent; a broker turns it
into ``BadRequest`` before anything is created or persisted.
"""

from __future__ import annotations

import re
from typing import Final

from ha_controller.protocol.properties import (
    AUTO_CREATE_TOPIC,
    DELAY_OFFSET_GROUP,
    DLQ_PREFIX,
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
    "group_name_problem",
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
