"""Every message property key, system topic name and delay-level table, in one place.

Shared by the client SDK, the gateway, the drills and the broker; values follow
RocketMQ's ``MessageConst`` and ``TopicValidator`` where RocketMQ has one.
"""

from __future__ import annotations

import time
from typing import Final

# ---- message properties -------------------------------------------------------------
PROPERTY_TAGS: Final = "TAGS"
PROPERTY_KEYS: Final = "KEYS"
PROPERTY_UNIQ_KEY: Final = "UNIQ_KEY"
PROPERTY_DELAY: Final = "DELAY"
PROPERTY_TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"
PROPERTY_TRAN_MSG: Final = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP: Final = "PGROUP"
PROPERTY_MESSAGE_GROUP: Final = "__SHARDINGKEY"
PROPERTY_REAL_TOPIC: Final = "REAL_TOPIC"
PROPERTY_REAL_QID: Final = "REAL_QID"
PROPERTY_DUE_MS: Final = "DUE_MS"
PROPERTY_RECONSUME_TIME: Final = "RECONSUME_TIME"
PROPERTY_RETRY_TOPIC: Final = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
PROPERTY_POP_CK: Final = "POP_CK"
PROPERTY_PREPARED_QUEUE_OFFSET: Final = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_OP_TRANSACTION_ID: Final = "TRAN_ID"
PROPERTY_OP_RESULT: Final = "TRAN_RESULT"

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
DELAY_OFFSET_GROUP: Final = "%DELAY_OFFSET%"
REVIVE_GROUP: Final = "CID_RMQ_SYS_REVIVE_GROUP"


def retry_topic(group: str) -> str:
    """The retry topic of a consumer group (``%RETRY%group``)."""
    return f"{RETRY_PREFIX}{group}"


def dlq_topic(group: str) -> str:
    """The dead-letter topic of a consumer group (``%DLQ%group``)."""
    return f"{DLQ_PREFIX}{group}"


# ---- delay levels -----------------------------------------------------------------------
#: RocketMQ's default ``messageDelayLevel``.
DEFAULT_DELAY_LEVELS: Final = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNIT_MS: Final = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """``"1s 5s 1m"`` -> ``(1000, 5000, 60000)``; ValueError on a bad entry."""
    out = []
    for item in text.split():
        unit = item[-1:]
        if unit not in _UNIT_MS or not item[:-1].isdigit():
            raise ValueError(f"bad delay level {item!r} (want e.g. 5s, 1m, 2h)")
        out.append(int(item[:-1]) * _UNIT_MS[unit])
    return tuple(out)


DELAY_LEVELS_MS: Final = parse_delay_levels(DEFAULT_DELAY_LEVELS)
MAX_DELAY_LEVEL: Final = len(DELAY_LEVELS_MS)


def now_ms() -> int:
    """Wall-clock milliseconds (store, born and due timestamps)."""
    return int(time.time() * 1000)
