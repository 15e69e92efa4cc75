"""Delay offsets: delay level -> the next schedule-queue offset to deliver.

The table carries a DataVersion that moves every ``delay_offset_update_version_step``
updates.  It is persisted (JSON, atomic), served (GET_ALL_DELAY_OFFSET), forward-synced
to slaves while the master is online, and reverse-synced by a returning master in
pre-online when a slave's version is >= its own, so it delivers nothing again
(RocketMQ issue #7601 is that bug).  Each delivery also carries the new offset to the
slaves as a progress record in the commit log (:func:`delay_record`).  Plain object,
no I/O but its file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from broker_agent.metadata.json_table import JsonTable, oldest
from broker_agent.metadata.progress import ProgressLog, catch_up, replay
from broker_agent.metadata.versioned import TableSync
from ha_controller.dataversion import DataVersion, SteppedVersion
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.properties import DELAY_OFFSET_GROUP, SCHEDULE_TOPIC
from ha_controller.wire import data_version_from_pb, data_version_to_pb

__all__ = ["DelayOffsetTable", "delay_offset_sync", "delay_record"]

DelaySnapshot = tuple[dict[int, int], DataVersion]


def delay_record(level: int, offset: int) -> dict[str, str]:
    """The progress record of a delivery of ``level`` (replicated through the commit
    log like a consumer offset, under a pseudo group; queue id = delay level)."""
    return {"G": DELAY_OFFSET_GROUP, "T": SCHEDULE_TOPIC, "Q": str(level), "O": str(offset)}


class DelayOffsetTable(JsonTable):
    """level -> next schedule-queue offset to deliver, with a stepped DataVersion."""

    what = "delay offset table"
    rebuilt_from = (
        "rebuilt from the delay offset records in the commit log (a replica's table, newer, "
        "is adopted in pre-online and by the forward sync)"
    )
    persist_when_missing = True

    def __init__(self, path: Path | None, version_step: int = 200) -> None:
        super().__init__(path)
        self.offsets: dict[int, int] = {}
        self._version = SteppedVersion(version_step)

    @property
    def data_version(self) -> DataVersion:
        return self._version.version

    def restore(self, data: Any) -> None:
        offsets = {int(k): int(v) for k, v in data["offsets"].items()}
        self.data_version.assign(DataVersion.from_dict(data["dataVersion"]))
        self.offsets = offsets

    def start_over(self) -> None:
        self.offsets = {}
        self.data_version.assign(oldest())

    def rebuild_from_log(self, store: ProgressLog) -> int:
        """Take every delay offset record still in the commit log (after
        :meth:`start_over`); how many there were."""
        return replay(store, DELAY_OFFSET_GROUP, self.apply_record)

    def catch_up_with_log(self, store: ProgressLog) -> int:
        """After an unclean stop: take the delay offset records stored since the file
        was written (each moves its level forward only); how many there were."""
        return catch_up(store, DELAY_OFFSET_GROUP, self.apply_record, self.written_ms())

    def payload(self) -> dict[str, Any]:
        return {
            "offsets": {str(k): v for k, v in sorted(self.offsets.items())},
            "dataVersion": self.data_version.to_dict(),
        }

    def get(self, level: int) -> int:
        return self.offsets.get(level, 0)

    def update(self, level: int, offset: int) -> None:
        self.offsets[level] = offset
        self._version.touch()
        self._dirty = True

    def bump(self) -> None:
        """Move the version on (an acting slave taking over: its table is now the truth)."""
        self.data_version.take_over()
        self._dirty = True

    def assign(self, offsets: Mapping[int, int], version: DataVersion) -> bool:
        """Forward sync on a slave: take the master's version, and its offsets where
        they are ahead (replicated records may already have moved a level further)."""
        new = {lvl: max(off, self.offsets.get(lvl, 0)) for lvl, off in offsets.items()}
        new.update({lvl: off for lvl, off in self.offsets.items() if lvl not in new})
        if new == self.offsets and version.key() == self.data_version.key():
            return False
        self.offsets = new
        self.data_version.assign(version)
        self._dirty = True
        return True

    def replace(self, offsets: Mapping[int, int], version: DataVersion) -> None:
        """Take another broker's table as it is, levels ahead of it included (see
        VersionedTable.replace: long-campaign seeds 1013 and 1027 lost the messages
        stored after a cut at the offsets this table had counted before it)."""
        self.offsets = dict(offsets)
        self.data_version.assign(version)
        self._dirty = True

    def apply_replicated(self, level: int, offset: int) -> None:
        """A delivery the master made, replicated through the commit log (slave side)."""
        if offset > self.offsets.get(level, 0):
            self.offsets[level] = offset
            self._dirty = True

    def apply_record(self, record: Mapping[str, str]) -> None:
        """:meth:`apply_replicated` of a :func:`delay_record` (KeyError, ValueError)."""
        self.apply_replicated(int(record["Q"]), int(record["O"]))

    def adopt_if_newer(self, offsets: Mapping[int, int], version: DataVersion) -> bool:
        """Reverse sync in pre-online: adopt a slave's table whose version is >= ours
        (ties adopt, as RocketMQ does).  Offsets only move forward, so each level
        keeps the larger of the two: adopting never rolls a level back."""
        if self.data_version.compare(version) > 0:
            return False
        for level, offset in offsets.items():
            self.offsets[level] = max(offset, self.offsets.get(level, 0))
        self.data_version.assign(version)
        self._dirty = True
        self.persist()
        return True

    def adopt_on_promotion(self, offsets: Mapping[int, int], ends: Mapping[int, int]) -> bool:
        """Pre-online of a member just elected master: each level a member's table has
        further, whatever the versions (each slave that acted moved the version on when
        it took over: ``controller-flap``, seed 3307, the member elected kept its own
        table by its version, below what the slave that acted last had delivered, and
        delivered those messages again).  Not past ``ends`` (level -> the schedule
        queue's end here): a member's unacknowledged tail is not in this log."""
        moved = False
        for level, offset in offsets.items():
            offset = min(offset, ends.get(level, 0))
            if offset > self.offsets.get(level, 0):
                self.offsets[level] = offset
                moved = True
        if moved:
            self._dirty = True
            self.persist()
        return moved

    def to_pb(self) -> broker_pb2.DelayOffsetTable:
        return broker_pb2.DelayOffsetTable(
            offsets=self.offsets, data_version=data_version_to_pb(self.data_version)
        )


def delay_offset_sync(
    table: DelayOffsetTable,
    busy: Callable[[], bool],
    ends: Callable[[], Mapping[int, int]] = lambda: {},
) -> TableSync[broker_pb2.DelayOffsetTable, DelaySnapshot]:
    """The table for forward and reverse sync; never assigned while this broker
    delivers (``busy``: RocketMQ #7601)."""
    return TableSync(
        "delay offsets",
        RequestCode.GET_ALL_DELAY_OFFSET,
        broker_pb2.DelayOffsetTable,
        decode=lambda pb: (dict(pb.offsets), data_version_from_pb(pb.data_version)),
        take=lambda s: table.assign(*s),
        adopt=lambda s: table.adopt_if_newer(*s),
        take_as_is=lambda s: table.replace(*s),
        promote=lambda s: table.adopt_on_promotion(s[0], ends()),
        describe=lambda s: str(s[0]),
        busy=busy,
        file=table,
    )
