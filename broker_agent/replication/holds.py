"""What a master's retention keeps for slaves that are away.  Plain object, no I/O
but its file (``slave_holds.json``).

An attached slave holds deletion back by its link (``HaMaster.links``).  When a link
closes (the slave froze and dialled again, restarted, was rescheduled) the slave is
*away*: for ``hold_ms`` after it was last seen, retention keeps what it had not
acknowledged, so it continues where it was when it comes back.  Without that, one
retention round in the gap deleted what it lacked and it could never continue.

- A slave that comes back and gets further than its hold ends it; one that comes back
  and goes away again without getting further keeps the time it was first seen away
  (a crash-looping slave does not hold retention for ever).
- A hold below the log's start is dropped: what that slave needs next is gone anyway.
- Under disk pressure the holds are ignored (attached links still count), as RocketMQ
  deletes expired files when the disk fills, whoever lacks them.
- The positions are saved with every retention round (:meth:`SlaveHolds.keep`), so a
  master that restarts while a slave is away keeps holding for it: its attached slaves
  are away from when they were last seen.  A file that cannot be read is set aside:
  no slave holds retention back until it attaches again (what it lacks may be deleted
  meanwhile; it then copies again what it needs from the master's oldest segment).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from broker_agent.metadata.json_table import JsonTable


class SlaveHolds(JsonTable):
    what = "slave hold table"
    rebuilt_from = "no slave that is away holds retention back until it attaches again"

    def __init__(self, path: Path | None = None) -> None:
        super().__init__(path)
        #: broker id -> (acknowledged offset, wall-clock ms it was last seen attached)
        self.away: dict[int, tuple[int, int]] = {}
        self._kept: dict[str, list[int]] = {}

    def detached(self, broker_id: int, acked: int, now_ms: int) -> None:
        """A link of ``broker_id`` closed and no other link of it is open."""
        held = self.away.get(broker_id)
        if held is None or acked > held[0]:
            self.away[broker_id] = (acked, now_ms)

    def progressed(self, broker_id: int, acked: int) -> None:
        """An attached link of ``broker_id`` acknowledged ``acked``: a hold below it ends."""
        held = self.away.get(broker_id)
        if held is not None and acked > held[0]:
            del self.away[broker_id]

    def floor(
        self,
        attached: Iterable[int],
        *,
        now_ms: int,
        hold_ms: int,
        log_start: int,
        pressed: bool,
    ) -> int | None:
        """The offset retention must not delete up to (None: no slave to wait for):
        the smallest of the attached links' ``attached`` offsets and, unless the disk
        is ``pressed``, of the holds still running."""
        for broker_id, (acked, seen_ms) in list(self.away.items()):
            if now_ms - seen_ms >= hold_ms or acked < log_start:
                del self.away[broker_id]
        offsets = list(attached)
        if not pressed:
            offsets.extend(acked for acked, _ in self.away.values())
        return min(offsets, default=None)

    def snapshot(self, attached: dict[int, int], now_ms: int) -> dict[str, list[int]]:
        """What the file holds: the holds, and each attached slave (``attached``: broker
        id -> the smallest offset of its links) as seen now."""
        out = {str(bid): [acked, seen] for bid, (acked, seen) in self.away.items()}
        for bid, acked in attached.items():
            out[str(bid)] = [acked, now_ms]
        return out

    def keep(self, attached: dict[int, int], now_ms: int) -> None:
        """Take the :meth:`snapshot` the next :meth:`persist` writes (when it moved)."""
        snapshot = self.snapshot(attached, now_ms)
        if snapshot != self._kept:
            self._kept = snapshot
            self._dirty = True

    def payload(self) -> dict[str, Any]:
        return dict(self._kept)

    def restore(self, data: Any) -> None:
        away = {int(bid): (int(acked), int(seen)) for bid, (acked, seen) in data.items()}
        self.away = away

    def start_over(self) -> None:
        self.away = {}
        self._kept = {}
