"""The POP ack table: progress on checkpoints (CKs) that has no record in the revive
queue holding them.

A master writes an ACK record for every ack next to the CK in its own revive queue,
and that queue is replicated.  An acting slave cannot write to its replicated revive
queue: an ack of a CK the lost master wrote there (``L`` receipt handle) and a CK it
revived are kept here instead, with where each CK sits (revive queue, offset) and how
far each revive queue is finished.  The table carries a DataVersion, is persisted
(``pop_acks.json``), forward-synced to slaves and reverse-synced in pre-online, so a
returning master (and the slave itself after a restart) never revives what was acked.

Bound: an entry whose CK lies below its queue's finished offset is dropped (nobody
reads that CK again), and at most ``MAX_ENTRIES`` are kept (the oldest go first).
Plain object, no I/O but its file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from broker_agent.metadata.json_table import JsonTable, oldest
from ha_controller.dataversion import DataVersion
from ha_controller.proto import broker_pb2
from ha_controller.wire import data_version_from_pb, data_version_to_pb

__all__ = ["MAX_ENTRIES", "PopAckEntry", "PopAckTable"]

log = logging.getLogger(__name__)

#: Entries kept at most (RocketMQ bounds its in-memory ack map likewise).
MAX_ENTRIES: Final = 100_000
#: The revive offset of a CK not read yet.
UNKNOWN: Final = -1


@dataclass
class PopAckEntry:
    revive_qid: int = UNKNOWN
    revive_offset: int = UNKNOWN
    offsets: set[int] = field(default_factory=set)


@dataclass
class PopAckSnapshot:
    """A fetched table (from the wire), not applied yet."""

    entries: dict[str, PopAckEntry]
    revive_offsets: dict[int, int]
    version: DataVersion

    @classmethod
    def from_pb(cls, pb: broker_pb2.PopAckTable) -> PopAckSnapshot:
        return cls(
            {
                e.ck_key: PopAckEntry(e.revive_queue_id, e.revive_offset, set(e.offsets))
                for e in pb.entries
                if e.ck_key
            },
            {int(q): int(o) for q, o in pb.revive_offsets.items()},
            data_version_from_pb(pb.data_version),
        )


class PopAckTable(JsonTable):
    """CK key -> offsets done (acked or revived) and where the CK is; the finished
    offset of each revive queue; a DataVersion that moves on every change."""

    what = "POP ack table"
    rebuilt_from = (
        "starting empty: a master's acks are ACK records in its revive queues, and a "
        "replica's acks join in pre-online and by the forward sync"
    )

    def __init__(self, path: Path | None) -> None:
        super().__init__(path)
        self.entries: dict[str, PopAckEntry] = {}
        self.revive_offsets: dict[int, int] = {}
        self.data_version = DataVersion()

    # ---- changes -------------------------------------------------------------------

    def _changed(self) -> None:
        self.data_version.next_version()
        self._dirty = True

    def _entry(self, key: str) -> PopAckEntry:
        """The entry of ``key``, a new one if needed (the oldest goes when full)."""
        entry = self.entries.get(key)
        if entry is None:
            if len(self.entries) >= MAX_ENTRIES:
                dropped = next(iter(self.entries))
                del self.entries[dropped]
                log.warning("pop ack table full: dropped the acks of %s", dropped)
            entry = self.entries[key] = PopAckEntry()
        return entry

    def record(
        self, key: str, offsets: set[int] | tuple[int, ...], where: tuple[int, int] | None = None
    ) -> None:
        """Offsets of the CK ``key`` are done (acked or revived); ``where`` (revive
        queue, offset) when the CK was read already."""
        if not offsets and key not in self.entries:
            return
        entry = self._entry(key)
        new = set(offsets) - entry.offsets
        moved = where is not None and (entry.revive_qid, entry.revive_offset) != where
        if not new and not moved:
            return
        entry.offsets |= new
        if where is not None:
            entry.revive_qid, entry.revive_offset = where
        self._changed()

    def locate(self, key: str, revive_qid: int, revive_offset: int) -> None:
        """The CK ``key`` was read at (queue, offset): it can be dropped once passed."""
        entry = self.entries.get(key)
        if entry is not None and (entry.revive_qid, entry.revive_offset) != (
            revive_qid,
            revive_offset,
        ):
            entry.revive_qid, entry.revive_offset = revive_qid, revive_offset
            self._changed()

    def finished(self, revive_qid: int, offset: int) -> None:
        """The revive queue is finished below ``offset``: CKs there are never read
        again, their entries go."""
        if offset <= self.revive_offsets.get(revive_qid, UNKNOWN):
            return
        self.revive_offsets[revive_qid] = offset
        for key in [
            k
            for k, e in self.entries.items()
            if e.revive_qid == revive_qid and UNKNOWN < e.revive_offset < offset
        ]:
            del self.entries[key]
        self._changed()

    def clamp(self, revive_qid: int, end: int) -> None:
        """The revive queue ends at ``end`` (its log was cut back, or lost): nothing
        from there on is finished."""
        if self.revive_offsets.get(revive_qid, UNKNOWN) > end:
            log.info("pop ack table: revive queue %d finished at its end %d", revive_qid, end)
            self.revive_offsets[revive_qid] = end
            self._changed()

    def start_offset(self, revive_qid: int) -> int:
        """Where reading the revive queue may start at the earliest (-1: anywhere)."""
        return self.revive_offsets.get(revive_qid, UNKNOWN)

    # ---- sync ------------------------------------------------------------------------

    def to_pb(self) -> broker_pb2.PopAckTable:
        return broker_pb2.PopAckTable(
            entries=[
                broker_pb2.PopAckEntry(
                    ck_key=k,
                    revive_queue_id=e.revive_qid,
                    revive_offset=e.revive_offset,
                    offsets=sorted(e.offsets),
                )
                for k, e in self.entries.items()
            ],
            revive_offsets=self.revive_offsets,
            data_version=data_version_to_pb(self.data_version),
        )

    def assign(self, snapshot: PopAckSnapshot) -> bool:
        """Forward sync: the master's table as it is."""
        if snapshot.version.compare(self.data_version) == 0:
            return False
        self.entries = {
            k: PopAckEntry(e.revive_qid, e.revive_offset, set(e.offsets))
            for k, e in snapshot.entries.items()
        }
        self.revive_offsets = dict(snapshot.revive_offsets)
        self.data_version.assign(snapshot.version)
        self._dirty = True
        return True

    def merge(self, snapshot: PopAckSnapshot) -> bool:
        """Reverse sync: a slave's acks join ours (an ack is never undone, so the union
        is right whichever version is newer); True when anything changed."""
        changed = False
        for key, theirs in snapshot.entries.items():
            ours = self._entry(key)
            if not theirs.offsets <= ours.offsets:
                ours.offsets |= theirs.offsets
                changed = True
            if ours.revive_offset == UNKNOWN and theirs.revive_offset != UNKNOWN:
                ours.revive_qid, ours.revive_offset = theirs.revive_qid, theirs.revive_offset
                changed = True
        for qid, offset in snapshot.revive_offsets.items():
            if offset > self.revive_offsets.get(qid, UNKNOWN):
                self.finished(qid, offset)
                changed = True
        if snapshot.version.compare(self.data_version) > 0:
            self.data_version.assign(snapshot.version)
            changed = True
        elif changed:
            self.data_version.next_version()
        if changed:
            self._dirty = True
        return changed

    # ---- file ------------------------------------------------------------------------

    def restore(self, data: Any) -> None:
        entries = {
            str(e["k"]): PopAckEntry(int(e["q"]), int(e["ro"]), {int(o) for o in e["o"]})
            for e in data["entries"]
        }
        revive_offsets = {int(q): int(o) for q, o in data["reviveOffsets"].items()}
        self.data_version.assign(DataVersion.from_dict(data["dataVersion"]))
        self.entries, self.revive_offsets = entries, revive_offsets

    def start_over(self) -> None:
        self.entries, self.revive_offsets = {}, {}
        self.data_version.assign(oldest())

    def payload(self) -> dict[str, Any]:
        return {
            "entries": [
                {"k": k, "q": e.revive_qid, "ro": e.revive_offset, "o": sorted(e.offsets)}
                for k, e in self.entries.items()
            ],
            "reviveOffsets": {str(q): o for q, o in self.revive_offsets.items()},
            "dataVersion": self.data_version.to_dict(),
        }
