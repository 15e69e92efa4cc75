"""Priority messages (RocketMQ 5.4's RIP-80): a priority is a queue.

A PRIORITY message (``PROPERTY_PRIORITY``, an integer >= 0; the kind as
:func:`ha_controller.protocol.topics.message_type_of` tells it) is stored in queue
``min(priority, write queues - 1)`` of its topic, whatever queue its producer picked
(RocketMQ's ``SendMessageProcessor``): so a topic has as many levels as write queues,
a higher priority is clamped to the highest, and messages of one priority keep their
order, being one queue.  A POP of any queue of a PRIORITY topic, not orderly, visits the
queues from the highest id down (``PopMessageProcessor.popMsgFromTopic`` with
``priorityOrderAsc``, RocketMQ's default): the highest priority with a message is
served first.  A priority on a message of another kind (delayed, FIFO, transactional)
is dropped, as RocketMQ's broker drops it.

Sans-IO; the brokers, the gateway and the SDK share it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ha_controller.protocol.errors import BadRequest
from ha_controller.protocol.properties import PROPERTY_PRIORITY

__all__ = ["check_priority", "pop_order", "priority_of", "queue_for_priority"]


def check_priority(priority: int) -> None:
    """BadRequest unless ``priority`` is an integer >= 0 (RocketMQ's
    ``Message.setPriority`` refuses a negative one)."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise BadRequest(f"priority must be an integer, not {priority!r}")
    if priority < 0:
        raise BadRequest(f"priority must be >= 0, not {priority}")


def priority_of(properties: Mapping[str, str]) -> int | None:
    """A message's priority, or None when it has none; BadRequest for one that is not
    a decimal integer >= 0 (nothing is stored with it)."""
    text = properties.get(PROPERTY_PRIORITY)
    if text is None:
        return None
    if not text.isascii() or not text.isdigit():
        raise BadRequest(f"priority must be an integer >= 0, not {text!r}")
    return int(text)


def queue_for_priority(priority: int, write_queue_nums: int) -> int:
    """The queue a message of ``priority`` goes to: the priority, clamped to the
    topic's highest write queue."""
    return max(0, min(priority, write_queue_nums - 1))


def pop_order(queue_ids: Sequence[int], start: int, *, priority: bool) -> list[int]:
    """The order in which a pop of any queue visits ``queue_ids``: highest first for a
    priority pop; else round robin from position ``start`` (spreading pops)."""
    if priority:
        return sorted(queue_ids, reverse=True)
    n = len(queue_ids)
    return [queue_ids[(start + i) % n] for i in range(n)]
