"""Escape ids: a remote escape that is retried is stored once.

A remote escape is a SEND_MESSAGE to another group's master.  When its answer is lost
(a timeout, a connection cut after the request left) the escaping broker does not know
whether the target stored it.  Giving up leaves the message's fate unknown, and the
returning master may deliver it again; retrying elsewhere may store it twice.  So the
escaping broker names every remote escape by its source, sets that name in the
``ESCAPE_ID`` property, and retries to the same target until it gets an answer; the
target remembers the ids it stored (:class:`EscapedIds`) and answers a repeat with the
first result instead of storing it again.

The id is the source record: the escaping group, the kind of work, and the commit-log
position and store time of the record that produced the message (a delayed message in
the schedule queue, a half message, a POP checkpoint's message).  Master and slaves
hold the same records at the same positions, so the id does not depend on who escapes.

The target's memory is bounded (:data:`CAPACITY` ids) and kept in memory; the id is
also in the stored message's properties, so a restarted target rebuilds the memory from
the last :data:`REBUILD_BYTES` of its commit log (:meth:`EscapedIds.rebuild`) before it
serves: a target killed between storing an escape and answering it still stores the
retry once.  An id whose stored message is gone (the target cut its log back on a
return) counts as never stored.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, TypeAlias

from ha_controller.protocol.properties import (
    HALF_TOPIC,
    PROPERTY_ESCAPE_ID,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
)
from ha_controller.protocol.record import StoredMessage

#: ids a master remembers; the oldest are forgotten first.  An escape is retried for
#: seconds to minutes, and a busy acting slave escapes a few thousand messages a second.
CAPACITY: Final = 200_000

#: how much of its commit log's end a restarted master reads for the escapes it stored:
#: a retry follows its lost answer within seconds, and the escape it repeats was stored
#: just before the restart, so the newest records are the ones that matter
REBUILD_BYTES: Final = 64 * 1024 * 1024

#: ``store.get_message_at``: (topic, queue id, queue offset) -> the message or None
StoreReader: TypeAlias = Callable[[str, int, int], StoredMessage | None]


def escape_id(group: str, kind: str, source: StoredMessage, part: str = "") -> str:
    """The id of the escape of ``source``'s message by ``group`` (``part`` tells apart
    several messages produced from one record, e.g. the offsets of a POP checkpoint)."""
    base = f"{group}/{kind}/{source.physical_offset}/{source.store_ts_ms}"
    return f"{base}/{part}" if part else base


@dataclass(frozen=True, slots=True)
class Escaped:
    """Where a target master stored an escaped message, and what it answered."""

    store_topic: str  # where the record lies (a half message's topic, ...)
    store_queue_id: int
    queue_id: int  # the queue the send asked for (the answer's queue id)
    queue_offset: int
    msg_id: str
    physical_offset: int


class EscapedIds:
    """A target master's escapes by id (plain object: the send handler asks and adds)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[str, Escaped] = OrderedDict()
        self.repeats = 0

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, eid: str, escaped: Escaped) -> None:
        """Remember the first store of ``eid``: a later message that carries the same
        id for another topic (a consumer sending a received one on) does not replace it."""
        if eid in self._ids:
            return
        self._ids[eid] = escaped
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def rebuild(self, messages: Iterable[StoredMessage]) -> int:
        """Remember the escapes among ``messages`` (stored ones, oldest first), as the
        sends that stored them did; returns how many."""
        count = 0
        for msg in messages:
            eid = msg.properties.get(PROPERTY_ESCAPE_ID)
            if not eid:
                continue
            # a delayed or half message lies in another queue than the send asked for
            queue_id = msg.queue_id
            real_qid = msg.properties.get(PROPERTY_REAL_QID, "")
            if sent_topic(msg) != msg.topic and real_qid.isdigit():
                queue_id = int(real_qid)
            self.add(
                eid,
                Escaped(
                    msg.topic,
                    msg.queue_id,
                    queue_id,
                    msg.queue_offset,
                    msg.msg_id,
                    msg.physical_offset,
                ),
            )
            count += 1
        return count

    def find(self, eid: str, read: StoreReader, topic: str) -> Escaped | None:
        """The earlier store of ``eid`` when its message is still there and was sent to
        ``topic`` (a repeat sends the same message again), else None."""
        escaped = self._ids.get(eid)
        if escaped is None:
            return None
        msg = read(escaped.store_topic, escaped.store_queue_id, escaped.queue_offset)
        if msg is None or msg.properties.get(PROPERTY_ESCAPE_ID) != eid:
            del self._ids[eid]  # cut away since: store it again
            return None
        if sent_topic(msg) != topic:
            return None  # another message carrying the id: not a repeat
        self.repeats += 1
        return escaped


#: where a send's message lies when it is not in the topic the send named
_HELD_TOPICS: Final = frozenset({SCHEDULE_TOPIC, TIMER_TOPIC, HALF_TOPIC})


def sent_topic(msg: StoredMessage) -> str:
    """The topic the send that stored ``msg`` named (a delayed or half message lies in
    a topic of the broker's own and names its real one)."""
    if msg.topic in _HELD_TOPICS:
        return msg.properties.get(PROPERTY_REAL_TOPIC) or msg.topic
    return msg.topic
