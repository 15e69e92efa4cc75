"""Where a delayed message waits, and where it goes when it is due.  Plain, no I/O.

A send whose properties carry ``DELAY`` (level 1..N of ``delay_levels``) or
``TIMER_DELIVER_MS`` (absolute ms) is stored not in its topic but in a system
topic: ``SCHEDULE_TOPIC_XXXX`` queue ``level - 1``, or the timer topic
``rmq_sys_wheel_timer`` queue 0, with the real topic and queue in
``REAL_TOPIC`` / ``REAL_QID`` and the due time in ``DUE_MS``.
"""

from __future__ import annotations

from typing import Final

from broker_agent.special.clock import SYSTEM_CLOCK
from ha_controller.config import BrokerConfig
from ha_controller.protocol.errors import BadRequest
from ha_controller.protocol.properties import (
    PROPERTY_DELAY,
    PROPERTY_DUE_MS,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DELIVER_MS,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
)
from ha_controller.protocol.record import StoredMessage

__all__ = ["SCHEDULE_PROPERTIES", "TIMER_QUEUE_ID", "delayed_target", "due_ms", "restored"]

TIMER_QUEUE_ID: Final = 0
#: Properties that only mean something while a message waits; dropped on delivery.
SCHEDULE_PROPERTIES: Final = frozenset(
    {
        PROPERTY_DELAY,
        PROPERTY_TIMER_DELIVER_MS,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QID,
        PROPERTY_DUE_MS,
    }
)


def delayed_target(
    cfg: BrokerConfig,
    topic: str,
    queue_id: int,
    props: dict[str, str],
    now: int | None = None,
) -> tuple[str, int]:
    """Where a sent message is stored: its own (topic, queue) or, for a delayed
    one, the schedule/timer queue; ``props`` is rewritten in place for the latter.

    Raises BadRequest for a malformed DELAY / TIMER_DELIVER_MS.
    """
    level_text = props.get(PROPERTY_DELAY)
    deliver_text = props.get(PROPERTY_TIMER_DELIVER_MS)
    if level_text is None and deliver_text is None:
        return topic, queue_id
    now = SYSTEM_CLOCK.now_ms() if now is None else now
    if level_text is not None:
        try:
            level = int(level_text)
        except ValueError:
            raise BadRequest(f"{PROPERTY_DELAY}={level_text!r} is not a delay level") from None
        if level <= 0:
            props.pop(PROPERTY_DELAY)
            return topic, queue_id
        level = min(level, cfg.max_delay_level)
        props[PROPERTY_DELAY] = str(level)
        due = now + cfg.delay_level_ms(level)
        target = (SCHEDULE_TOPIC, level - 1)
    else:
        assert deliver_text is not None
        try:
            deliver = int(deliver_text)
        except ValueError:
            raise BadRequest(
                f"{PROPERTY_TIMER_DELIVER_MS}={deliver_text!r} is not a timestamp"
            ) from None
        if deliver <= now:
            props.pop(PROPERTY_TIMER_DELIVER_MS)  # already due: a normal message
            return topic, queue_id
        if deliver - now > cfg.timer_max_delay_ms:
            raise BadRequest(
                f"{PROPERTY_TIMER_DELIVER_MS}={deliver} is {deliver - now} ms ahead, more "
                f"than timer_max_delay_ms={cfg.timer_max_delay_ms}"
            )
        due = deliver
        target = (TIMER_TOPIC, TIMER_QUEUE_ID)
    props[PROPERTY_REAL_TOPIC] = topic
    props[PROPERTY_REAL_QID] = str(queue_id)
    props[PROPERTY_DUE_MS] = str(due)
    return target


def due_ms(cfg: BrokerConfig, msg: StoredMessage) -> int:
    text = msg.properties.get(PROPERTY_DUE_MS)
    if text is not None:
        try:
            return int(text)
        except ValueError:
            pass
    if msg.topic == SCHEDULE_TOPIC:
        return msg.store_ts_ms + cfg.delay_level_ms(msg.queue_id + 1)
    return int(msg.properties.get(PROPERTY_TIMER_DELIVER_MS, msg.store_ts_ms))


def restored(msg: StoredMessage) -> tuple[str, int | None, dict[str, str]] | None:
    """(real topic, real queue id, properties without the schedule ones), or None
    for a message that does not say where it belongs."""
    topic = msg.properties.get(PROPERTY_REAL_TOPIC)
    if not topic:
        return None
    try:
        qid: int | None = int(msg.properties.get(PROPERTY_REAL_QID, ""))
    except ValueError:
        qid = None
    props = {k: v for k, v in msg.properties.items() if k not in SCHEDULE_PROPERTIES}
    return topic, qid, props
