"""Every message property key, system topic name and delay-level table, in one place.

Shared by the client SDK, the gateway, the drills and the broker; values follow
RocketMQ's ``MessageConst`` and ``TopicValidator`` where RocketMQ has one.  Sans-IO
like the rest of :mod:`ha_controller.protocol`: plain constants and pure functions.
"""

from __future__ import annotations

import re
import time
from typing import Final

__all__ = [
    "AUTO_CREATE_TOPIC",
    "DEFAULT_DELAY_LEVELS",
    "DELAY_LEVELS_MS",
    "DELAY_OFFSET_GROUP",
    "DLQ_PREFIX",
    "HALF_TOPIC",
    "MAX_DELAY_LEVEL",
    "OFFSET_TOPIC",
    "OP_TOPIC",
    "PROPERTY_BORN_TIMESTAMP",
    "PROPERTY_DELAY",
    "PROPERTY_DUE_MS",
    "PROPERTY_KEYS",
    "PROPERTY_LITE_TOPIC",
    "PROPERTY_MAX_OFFSET",
    "PROPERTY_MESSAGE_GROUP",
    "PROPERTY_MIN_OFFSET",
    "PROPERTY_OP_RESULT",
    "PROPERTY_OP_TRANSACTION_ID",
    "PROPERTY_ORIGIN_MESSAGE_GROUP",
    "PROPERTY_ORIGIN_MESSAGE_ID",
    "PROPERTY_ORIGIN_QUEUE",
    "PROPERTY_ORIGIN_QUEUE_OFFSET",
    "PROPERTY_ORIGIN_UNIQ_KEY",
    "PROPERTY_POP_CK",
    "PROPERTY_POP_KEY",
    "PROPERTY_PREPARED_QUEUE_OFFSET",
    "PROPERTY_PRIORITY",
    "PROPERTY_PRODUCER_GROUP",
    "PROPERTY_REAL_QID",
    "PROPERTY_REAL_TOPIC",
    "PROPERTY_RECONSUME_TIME",
    "PROPERTY_RECONSUME_TIMES",
    "PROPERTY_RETRY_TOPIC",
    "PROPERTY_TAGS",
    "PROPERTY_TIMER_DELIVER_MS",
    "PROPERTY_TIMER_DEL_UNIQKEY",
    "PROPERTY_TRANSACTION_ID",
    "PROPERTY_TRAN_MSG",
    "PROPERTY_UNIQ_KEY",
    "RETRY_PREFIX",
    "REVIVE_GROUP",
    "REVIVE_LOG_PREFIX",
    "SCHEDULE_TOPIC",
    "SYNC_BROKER_MEMBER_GROUP_PREFIX",
    "TIMER_TOPIC",
    "dlq_topic",
    "now_ms",
    "parse_delay_levels",
    "retry_topic",
    "revive_log_topic",
]

# ---- message properties -------------------------------------------------------------
PROPERTY_TAGS: Final = "TAGS"
PROPERTY_KEYS: Final = "KEYS"
PROPERTY_UNIQ_KEY: Final = "UNIQ_KEY"
PROPERTY_DELAY: Final = "DELAY"
PROPERTY_TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"
#: a recall marker in the timer queue: the message with this UNIQ_KEY is never delivered
PROPERTY_TIMER_DEL_UNIQKEY: Final = "TIMER_DEL_UNIQKEY"
PROPERTY_TRAN_MSG: Final = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP: Final = "PGROUP"
PROPERTY_MESSAGE_GROUP: Final = "__SHARDINGKEY"
#: a half message's transaction id (its UNIQ_KEY), kept by the committed message, as
#: RocketMQ's broker sets it; clients see it as a user property, as with RocketMQ
PROPERTY_TRANSACTION_ID: Final = "__transactionId__"
#: a PRIORITY message's priority (the v2 ``priority``; the name is ours)
PROPERTY_PRIORITY: Final = "__PRIORITY"
#: a LITE message's lite topic, the key it has under its parent topic (RocketMQ 5.5's
#: ``MessageConst.PROPERTY_LITE_TOPIC``; the v2 ``lite_topic``)
PROPERTY_LITE_TOPIC: Final = "__LITE_TOPIC"
#: the sender's own born time of a message the gRPC gateway stored (RocketMQ's proxy
#: keeps it the same way; the stored born time is the gateway's)
PROPERTY_BORN_TIMESTAMP: Final = "BORN_TIMESTAMP"
#: where a delayed or half message really goes (schedule, timer, transactions)
PROPERTY_REAL_TOPIC: Final = "REAL_TOPIC"
PROPERTY_REAL_QID: Final = "REAL_QID"
PROPERTY_DUE_MS: Final = "DUE_MS"
#: set by the escape bridge on a remote escape: the source (group, kind, record) of the
#: escaped message, so that the target stores a retried escape once
PROPERTY_ESCAPE_ID: Final = "ESCAPE_ID"
#: redeliveries of a POP message (set by the broker's revive)
PROPERTY_RECONSUME_TIME: Final = "RECONSUME_TIME"
PROPERTY_RETRY_TOPIC: Final = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
PROPERTY_POP_CK: Final = "POP_CK"
PROPERTY_POP_KEY: Final = "POP_KEY"
PROPERTY_PREPARED_QUEUE_OFFSET: Final = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_OP_TRANSACTION_ID: Final = "TRAN_ID"
PROPERTY_OP_RESULT: Final = "TRAN_RESULT"
PROPERTY_MIN_OFFSET: Final = "MIN_OFFSET"
PROPERTY_MAX_OFFSET: Final = "MAX_OFFSET"
# A dead-lettered copy (the orderly consumer's DLQ) says where it came from.
PROPERTY_ORIGIN_UNIQ_KEY: Final = "ORIGIN_UNIQ_KEY"
PROPERTY_ORIGIN_QUEUE: Final = "ORIGIN_QUEUE"
PROPERTY_ORIGIN_QUEUE_OFFSET: Final = "ORIGIN_QUEUE_OFFSET"
PROPERTY_ORIGIN_MESSAGE_GROUP: Final = "ORIGIN_MESSAGE_GROUP"
#: consume attempts of a dead-lettered copy (not RocketMQ's RECONSUME_TIME)
PROPERTY_RECONSUME_TIMES: Final = "RECONSUME_TIMES"

# ---- system topics, groups and prefixes --------------------------------------------------
RETRY_PREFIX: Final = "%RETRY%"
DLQ_PREFIX: Final = "%DLQ%"
AUTO_CREATE_TOPIC: Final = "TBW102"
#: consumer and delay offset commits travel through the commit log to the slaves
OFFSET_TOPIC: Final = "rmq_sys_CONSUMER_OFFSETS"
SCHEDULE_TOPIC: Final = "SCHEDULE_TOPIC_XXXX"
TIMER_TOPIC: Final = "rmq_sys_wheel_timer"
HALF_TOPIC: Final = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC: Final = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
#: POP checkpoints and acks, one topic per cluster (``rmq_sys_REVIVE_LOG_{cluster}``)
REVIVE_LOG_PREFIX: Final = "rmq_sys_REVIVE_LOG_"
#: compatibility topic whose route carries a group's raw member ids
SYNC_BROKER_MEMBER_GROUP_PREFIX: Final = "rmq_sys_SYNC_BROKER_MEMBER_"
DELAY_OFFSET_GROUP: Final = "%DELAY_OFFSET%"
#: the timer checkpoint travels as a record of this pseudo group (``L``, ``O``)
TIMER_CHECKPOINT_GROUP: Final = "%TIMER_CHECKPOINT%"
REVIVE_GROUP: Final = "CID_RMQ_SYS_REVIVE_GROUP"


def retry_topic(group: str) -> str:
    """The retry topic of a consumer group (``%RETRY%group``)."""
    return f"{RETRY_PREFIX}{group}"


def dlq_topic(group: str) -> str:
    """The dead-letter topic of a consumer group (``%DLQ%group``)."""
    return f"{DLQ_PREFIX}{group}"


def revive_log_topic(cluster: str) -> str:
    """The POP revive log of a cluster (``rmq_sys_REVIVE_LOG_cluster``)."""
    return f"{REVIVE_LOG_PREFIX}{cluster}"


# ---- delay levels -----------------------------------------------------------------------
#: RocketMQ's default ``messageDelayLevel``.
DEFAULT_DELAY_LEVELS: Final = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNIT_MS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL_RE: Final = re.compile(r"([0-9]{1,9})(ms|s|m|h|d)", re.ASCII)


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """RocketMQ ``messageDelayLevel``: ``"1s 5s 1m"`` -> ``(1000, 5000, 60000)`` ms per level.

    Units ms, s, m, h, d; every entry positive, at least one.  ValueError names the
    first bad entry.
    """
    out: list[int] = []
    for token in text.split():
        m = _LEVEL_RE.fullmatch(token)
        if m is None or int(m.group(1)) == 0:
            raise ValueError(
                "expected space-separated positive durations such as '1s 5s 1m 2h' "
                f"(units ms, s, m, h, d); {token!r} is not one"
            )
        out.append(int(m.group(1)) * _UNIT_MS[m.group(2)])
    if not out:
        raise ValueError("expected at least one delay level such as '1s 5s 1m 2h'")
    return tuple(out)


#: ``DELAY_LEVELS_MS[level - 1]`` is the delay of a level (1-based) by default.
DELAY_LEVELS_MS: Final = parse_delay_levels(DEFAULT_DELAY_LEVELS)
MAX_DELAY_LEVEL: Final = len(DELAY_LEVELS_MS)


def now_ms() -> int:
    """Wall-clock milliseconds (store, born and due timestamps)."""
    return int(time.time() * 1000)
