"""Progress records: the commit-log records that carry the metadata tables' changes.

A master appends one to the system offsets topic (``OFFSET_TOPIC``, queue 0) for every
consumer-offset commit and for every delivery of a delayed or timer message (its
properties: ``G`` names what it carries, see ``WritePath.replicate_record``).  They
reach the slaves with the durability of messages, and two things read them:

- a slave applies each as it is dispatched (:class:`ProgressRecords`,
  ``.forward``);
- a table whose file could not be read is rebuilt from those still in the log
  (:func:`replay`): in log order, so the newest wins;
- after an unclean stop, a special service's table catches up with the records stored
  since its file was last written (:func:`catch_up`), only moving forward: the file is
  written every interval (and, with ``flush_mode = "sync"``, after each delivery on a
  master), while the records are synced with the commit log, a slave's too.  Without
  it a slave that acts after a power loss of its whole group delivers again what its
  master had delivered since the slave's file was written.

Records older than retention are gone, but only with the segments before them: what
they counted (the messages consumed or delivered) was stored earlier still, so it is
gone too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Final, Protocol

from ha_controller.protocol.errors import RecordUnderRepair
from ha_controller.protocol.properties import (
    DELAY_OFFSET_GROUP,
    OFFSET_TOPIC,
    TIMER_CHECKPOINT_GROUP,
)
from ha_controller.protocol.record import StoredMessage

__all__ = [
    "CATCH_UP_MARGIN_MS",
    "PROGRESS_GROUPS",
    "ProgressApplier",
    "ProgressLog",
    "ProgressRecords",
    "catch_up",
    "replay",
]

log = logging.getLogger(__name__)

#: Applies one progress record (its properties); KeyError or ValueError for a malformed one.
ProgressApplier = Callable[[Mapping[str, str]], None]

#: The ``G`` of the special services' records; every other ``G`` is a consumer group.
PROGRESS_GROUPS: Final = frozenset({DELAY_OFFSET_GROUP, TIMER_CHECKPOINT_GROUP})
#: How long before its file's last write a table's catch-up starts reading records:
#: their store times are the master's clock, the file's time this broker's.
CATCH_UP_MARGIN_MS: Final = 10_000


class ProgressLog(Protocol):
    """The reads :func:`replay` makes of the store (MessageStore)."""

    def min_offset(self, topic: str, queue_id: int) -> int: ...

    def max_offset(self, topic: str, queue_id: int) -> int: ...

    def get_message_at(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None: ...

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int: ...


def replay(
    store: ProgressLog, group: str | None, apply: ProgressApplier, start: int | None = None
) -> int:
    """Apply every progress record still in the log whose ``G`` is ``group`` (None:
    every consumer group), oldest first, from queue offset ``start`` (None: the
    first); how many were applied."""
    applied = 0
    offset = store.min_offset(OFFSET_TOPIC, 0)
    if start is not None:
        offset = max(offset, start)
    end = store.max_offset(OFFSET_TOPIC, 0)
    while offset < end:
        try:
            msg = store.get_message_at(OFFSET_TOPIC, 0, offset)
        except RecordUnderRepair as exc:
            # a progress record only: a later one of the same group supersedes it, and
            # an older offset can only deliver again, never lose a message
            log.warning("progress record at %d passed over: %s", offset, exc)
            msg = None
        offset += 1
        if msg is None:
            continue
        g = msg.properties.get("G")
        if g is None or (g != group if group is not None else g in PROGRESS_GROUPS):
            continue
        try:
            apply(msg.properties)
        except (KeyError, ValueError):
            log.warning("malformed progress record at %d skipped: %s", offset - 1, msg.properties)
            continue
        applied += 1
    return applied


def catch_up(
    store: ProgressLog, group: str, apply_forward: ProgressApplier, written_ms: int | None
) -> int:
    """After an unclean stop: apply the records of ``group`` stored since about
    ``written_ms`` (when the table's file was written; None: every record), with an
    applier that only moves the table forward; how many were applied."""
    start = None
    if written_ms is not None:
        start = store.search_offset(OFFSET_TOPIC, 0, written_ms - CATCH_UP_MARGIN_MS)
    return replay(store, group, apply_forward, start)


class ProgressRecords:
    """Dispatches a replicated progress record to the table it belongs to."""

    def __init__(self, consumer: ProgressApplier, special: Mapping[str, ProgressApplier]) -> None:
        """``consumer`` applies a consumer-offset record; ``special`` the special
        services' records by their ``G``."""
        self._consumer = consumer
        self._special = dict(special)

    def apply(self, record: Mapping[str, str]) -> None:
        """KeyError or ValueError for a malformed record."""
        self._special.get(record["G"], self._consumer)(record)
