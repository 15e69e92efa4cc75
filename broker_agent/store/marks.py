"""Recovery marks: where each consume queue ended when the store last recovered from an
unclean stop, kept on disk.

An unclean stop of a whole group with ``flush_mode = "async"`` (a power loss) loses
the commit log's unsynced tail, so the queues end earlier than before, and the next
messages take the queue offsets the lost tail had held.  A consumer that had read past
the recovered end must come back to it, not to wherever the queue ends when it next
asks, or it skips the messages stored since.  The mark is that place: recorded for every
queue at each unclean recovery (a kill -9 too: the store cannot tell whether it lost
anything), replacing the marks of the one before, lowered when a cut back ends a queue
earlier, and answered as ``next_begin_offset`` to a read past a queue's end
(RocketMQ's OFFSET_OVERFLOW_BADLY: a client moves to that offset).  A queue the
recovery did not find (its files were lost with its messages) has no mark; when its
first record lies past the commit-log end that recovery found (``since``), every
message it holds came after, and its start serves as its mark.

Pulls are answered with the store's id (random, made with the file) and how often its
queues went back (``rewinds``: unclean recoveries and cut backs), so that a client that
read from this store before it went back and asks past the mark returns to the mark
even when the queue has refilled past its offset meanwhile (``client.pull_consumer``).

The file (``recovery_marks.json``) is written whole, atomically and synced
(``metadata.json_table.write_json_atomic``), before the store serves; an unreadable
one is a warning and no marks (a read past the end then moves to the end, as before)
under a new store id (clients take it for a store they never read from).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from pathlib import Path

from broker_agent.metadata.json_table import TableUnreadable, read_json_checked, write_json_atomic
from ha_controller.protocol.errors import StoreError

from .commitlog import store_error

__all__ = ["RecoveryMarks"]

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]


class RecoveryMarks:
    """The marks of one store (not thread-safe: the store's lock guards it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._marks: dict[QueueKey, int] = {}
        #: the commit-log end the last unclean recovery found (None: never one)
        self.since: int | None = None
        #: the marks this open's recovery recorded (empty after a clean stop)
        self.recorded: dict[QueueKey, int] = {}
        #: this store's id (random, kept in the file) and how often its queues went back
        self.store_id = 0
        self.rewinds = 0

    def load(self) -> None:
        """Read the file; without one (or an unreadable one) the store gets a new id,
        written at once."""
        try:
            data = read_json_checked(self.path)
            marks = data["marks"]
            self._marks = {(str(e["topic"]), int(e["queueId"])): int(e["end"]) for e in marks}
            since = data.get("since")
            self.since = None if since is None else int(since)
            self.store_id, self.rewinds = int(data["storeId"]), int(data["rewinds"])
            return
        except FileNotFoundError:
            pass
        except (OSError, TableUnreadable, KeyError, ValueError, TypeError) as exc:
            log.warning("recovery marks %s cannot be read (%s): none kept", self.path, exc)
        self._marks, self.since, self.rewinds = {}, None, 0
        self.store_id = secrets.randbits(62) + 1
        try:
            self._save()
        except StoreError as exc:  # a full disk: the next start has another id
            log.warning("%s", exc)

    def get(self, topic: str, queue_id: int) -> int | None:
        return self._marks.get((topic, queue_id))

    def record(self, ends: Mapping[QueueKey, int], since: int) -> None:
        """An unclean recovery ended the queues at ``ends`` and the commit log at
        ``since``: they are the marks now."""
        self._marks = dict(ends)
        self.since = since
        self.recorded = dict(ends)
        self.rewinds += 1
        self._save()

    def lower(self, ends: Mapping[QueueKey, int]) -> None:
        """A cut back ended these queues at ``ends``: a mark above its queue's new end
        comes down to it (a queue without a mark gets one)."""
        changed = False
        for key, end in ends.items():
            mark = self._marks.get(key)
            if mark is None or mark > end:
                self._marks[key] = end
                changed = True
        if changed:
            self.rewinds += 1
            self._save()

    def lift(self, ends: Mapping[QueueKey, int], log_end: int) -> bool:
        """A master's pre-online copied from its slaves what they held beyond its
        recovered log (the very records it held before, at the same offsets): each mark
        below its queue's end ``ends`` comes up to it, and the log up to ``log_end`` no
        longer counts as stored after the recovery.  A consumer that read up to there
        before the stop then finds its place again instead of going back to a mark the
        copy has passed (corruption campaign seed 3401: a master restarted on a flipped
        record recovered short, caught up from its slave, and every consumer past the
        short end went back to it and read thousands of messages twice).  Whether
        anything moved; the rewinds count stays (nothing went back)."""
        changed = False
        for key, end in ends.items():
            mark = self._marks.get(key)
            if mark is not None and end > mark:
                self._marks[key] = end
                changed = True
        if self.since is not None and log_end > self.since:
            self.since = log_end
            changed = True
        if changed:
            self._save()
        return changed

    def _save(self) -> None:
        marks = [{"topic": t, "queueId": q, "end": e} for (t, q), e in sorted(self._marks.items())]
        try:
            write_json_atomic(
                self.path,
                {
                    "marks": marks,
                    "since": self.since,
                    "storeId": self.store_id,
                    "rewinds": self.rewinds,
                },
            )
        except OSError as exc:
            raise store_error(exc, f"cannot write recovery marks {self.path}") from exc
