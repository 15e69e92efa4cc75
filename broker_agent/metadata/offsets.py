"""Consumer offsets with a DataVersion, persisted as JSON (atomic replace + fsync).

The version moves every ``consumer_offset_update_version_step`` commits
(500), as RocketMQ's ConsumerOffsetManager does, so that a returning master
can tell in pre-online whether its acting slave's table is newer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from broker_agent.metadata.json_table import JsonTable, oldest
from broker_agent.metadata.progress import ProgressLog, replay
from broker_agent.metadata.versioned import TableSync
from ha_controller.dataversion import DataVersion, SteppedVersion
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.wire import data_version_from_pb

__all__ = ["ConsumerOffsetManager", "OffsetKey", "consumer_offset_sync"]

log = logging.getLogger(__name__)

OffsetKey = tuple[str, str, int]  # (consumer group, topic, queue id)


class ConsumerOffsetManager(JsonTable):
    what = "consumer offset table"
    rebuilt_from = (
        "rebuilt from the offset records in the commit log (a replica's table, newer, is "
        "adopted in pre-online and by the forward sync)"
    )

    def __init__(self, path: Path | None, version_step: int = 500) -> None:
        super().__init__(path)
        self.table: dict[OffsetKey, int] = {}
        # A table that has never moved is the oldest of all (timestamp 0), so a
        # returning master that lost its file never outranks its acting slave.
        self._version = SteppedVersion(version_step, oldest())
        self._bump_next = False

    def bump_on_next_commit(self) -> None:
        """The next commit moves the version at once: an acting slave marks its table
        newer than anything the absent master could have, whatever the step."""
        self._bump_next = True

    @property
    def data_version(self) -> DataVersion:
        return self._version.version

    def restore(self, data: Any) -> None:
        table = {
            (str(e["group"]), str(e["topic"]), int(e["queueId"])): int(e["offset"])
            for e in data["offsets"]
        }
        self._version.version.assign(DataVersion.from_dict(data["dataVersion"]))
        self.table = table

    def start_over(self) -> None:
        self.table = {}
        self._version.version.assign(oldest())

    def rebuild_from_log(self, store: ProgressLog) -> int:
        """Take every consumer-offset record still in the commit log (after
        :meth:`start_over`); how many there were."""
        return replay(store, None, self.apply_record)

    def payload(self) -> dict[str, Any]:
        return {
            "offsets": [
                {"group": g, "topic": t, "queueId": q, "offset": o}
                for (g, t, q), o in sorted(self.table.items())
            ],
            "dataVersion": self.data_version.to_dict(),
        }

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.table[(group, topic, queue_id)] = offset
        if self._bump_next:
            self._bump_next = False
            self._version.version.take_over()
        else:
            self._version.touch()
        self._dirty = True

    def correct_past(self, ends: Mapping[tuple[str, int], int]) -> list[tuple[OffsetKey, int, int]]:
        """Bring every entry past its queue's end in ``ends`` back to that end (the
        queue ends an unclean recovery found: the commits past them were of a lost
        tail, and the next messages take those offsets); (key, was, now) of each, the
        table written at once.  The version does not move: no consumer committed."""
        corrected = []
        for key, offset in self.table.items():
            end = ends.get((key[1], key[2]))
            if end is not None and offset > end:
                corrected.append((key, offset, end))
        for key, _, end in corrected:
            self.table[key] = end
        if corrected:
            self._dirty = True
            self.persist()
        return corrected

    def query(self, group: str, topic: str, queue_id: int) -> int:
        return self.table.get((group, topic, queue_id), -1)

    def entries(self) -> list[tuple[str, str, int, int]]:
        return [(g, t, q, o) for (g, t, q), o in sorted(self.table.items())]

    def assign_from_master(
        self, entries: Iterable[tuple[str, str, int, int]], version: DataVersion
    ) -> None:
        """Forward sync on a slave: take the master's version and fill in entries.

        Commits also arrive as replicated commit-log records (``apply_replicated``),
        which may be newer than this periodic snapshot, so an entry only moves forward
        here."""
        for g, t, q, o in entries:
            if self.table.get((g, t, q), -1) < o:
                self.table[(g, t, q)] = o
        self.data_version.assign(version)
        self._dirty = True

    def apply_replicated(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """A commit the master made, replicated through the commit log (slave side)."""
        self.table[(group, topic, queue_id)] = offset
        self._dirty = True

    def apply_record(self, record: Mapping[str, str]) -> None:
        """:meth:`apply_replicated` of an offset record (KeyError, ValueError)."""
        self.apply_replicated(record["G"], record["T"], int(record["Q"]), int(record["O"]))

    def adopt_if_newer(
        self, entries: Iterable[tuple[str, str, int, int]], version: DataVersion
    ) -> bool:
        """Reverse sync in pre-online: adopt a slave's table whose version is >= ours
        (ties adopt, as RocketMQ does), merging it over our own entries.

        On a tie neither table moved on its own (an acting slave moves the version with
        its first commit): they differ only by what one of them had not written yet, and
        a group's offsets only move forward, so the higher offset of an entry is kept.  A
        slave whose table was synced before this master's last commits (a power loss of
        the whole group, where the master's were synced with each commit) must not take
        them back."""
        order = self.data_version.compare(version)
        if order > 0:
            return False
        for g, t, q, o in entries:
            if order < 0 or self.table.get((g, t, q), -1) < o:
                self.table[(g, t, q)] = o
        self.data_version.assign(version)
        self._dirty = True
        self.persist()
        return True

    def apply_replicated_forward(self, record: Mapping[str, str]) -> None:
        """A replicated offset record received while this slave acts or is held by the
        master that contacted it: applied only where it moves the entry forward.  The
        stream may carry the old tail of a returning master (commits older than the ones
        this slave took while acting) but also the commits that master (or a newly
        elected one) takes once online, before this slave's view of the group says it is
        online: dropped, they were missing from the table this slave would hand on at
        the next switch, which outranks by its version the members that have them."""
        key = (record["G"], record["T"], int(record["Q"]))
        offset = int(record["O"])
        if self.table.get(key, -1) < offset:
            self.table[key] = offset
            self._dirty = True

    def merge_highest(
        self,
        entries: Iterable[tuple[str, str, int, int]],
        version: DataVersion,
        queue_end: Callable[[str, int], int] | None = None,
    ) -> int:
        """Pre-online of a member just elected master (controller mode): take every
        entry of a member's table that is ahead of ours, whatever the versions; how
        many were taken.

        Within an epoch only its master moves the table; every other member holds a
        copy that lags by what it has not applied yet (the replicated records it missed,
        the periodic sync), and an acting slave's commits come after the master's and
        from them.  So no member's entry below ours is newer than ours, and a member's
        higher entry is a commit this member lacks.  The version comparison of the
        RIP-32 return is not enough here: a table whose version moved on (an acting
        slave took it over, or the old master's counter stepped) may still lack the
        last commits of a later master.  An entry is capped at ``queue_end`` (the
        queue's end in this store): a commit past what this master holds (an
        unreplicated tail under async replication) would skip the messages stored there
        next."""
        taken = 0
        for g, t, q, o in entries:
            if queue_end is not None:
                o = min(o, queue_end(t, q))
            if self.table.get((g, t, q), -1) < o:
                self.table[(g, t, q)] = o
                taken += 1
        if self.data_version.compare(version) < 0:
            self.data_version.assign(version)
        self._dirty = True
        self.persist()
        return taken


OffsetSnapshot = tuple[list[tuple[str, str, int, int]], DataVersion]


def _snapshot(pb: broker_pb2.ConsumerOffsetTable) -> OffsetSnapshot:
    entries = [(e.consumer_group, e.topic, e.queue_id, e.offset) for e in pb.entries]
    return entries, data_version_from_pb(pb.data_version)


def consumer_offset_sync(
    offsets: ConsumerOffsetManager,
    queue_end: Callable[[str, int], int] | None = None,
) -> TableSync[broker_pb2.ConsumerOffsetTable, OffsetSnapshot]:
    """Consumer offsets for forward and reverse sync (GET_ALL_CONSUMER_OFFSET).  Taken
    as they are after a cut only forward, as a sync: a commit the master took in its
    lease was consumed (moving it back would deliver again); clamping an offset left
    past a cut queue's end is still to do.  A member elected master takes every higher
    entry of each member (:meth:`ConsumerOffsetManager.merge_highest`, capped at
    ``queue_end``)."""

    def promote(s: OffsetSnapshot) -> bool:
        return offsets.merge_highest(*s, queue_end=queue_end) > 0

    return TableSync(
        "consumer offsets",
        RequestCode.GET_ALL_CONSUMER_OFFSET,
        broker_pb2.ConsumerOffsetTable,
        decode=_snapshot,
        take=lambda s: offsets.assign_from_master(*s),
        adopt=lambda s: offsets.adopt_if_newer(*s),
        describe=lambda s: f"{len(s[0])} entries, version {s[1].key()}",
        busy=lambda: False,
        file=offsets,
        promote=promote,
    )
