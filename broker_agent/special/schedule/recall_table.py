"""The recall table: recalled timer messages (RocketMQ 5.3 RECALL_MESSAGE).  Plain
object, no I/O but its file.

UNIQ_KEY -> (due ms, topic).  The schedule service skips a recalled message when it
comes due.  The table is persisted, forward-synced to slaves and reverse-synced in
pre-online; both directions merge (a union), so a recall made anywhere in the group
holds everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from broker_agent.metadata.json_table import JsonTable, oldest
from broker_agent.metadata.versioned import TableSync
from ha_controller.dataversion import DataVersion
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.properties import now_ms
from ha_controller.wire import data_version_from_pb, data_version_to_pb

__all__ = ["MAX_RECALLS", "RecallTable", "recall_sync"]

#: Recalled ids kept at most; the ones due earliest are forgotten first.
MAX_RECALLS: Final = 100_000

RecallSnapshot = tuple[dict[str, tuple[int, str]], DataVersion]


class RecallTable(JsonTable):
    """Recalled scheduled messages: UNIQ_KEY -> (due ms, topic), with a DataVersion
    that moves on every change.  Only grows (a recall is never undone); entries
    whose due time is older than the store's retention are forgotten, and at most
    :data:`MAX_RECALLS` are kept."""

    what = "recall table"
    rebuilt_from = (
        "starting empty: the timer loop reads the recall markers in the timer queue again, "
        "and a replica's recalls join in pre-online and by the forward sync"
    )

    def __init__(
        self,
        path: Path | None,
        retention_ms: int = 72 * 3600 * 1000,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        super().__init__(path)
        self.retention_ms = retention_ms
        self._clock = clock
        self.entries: dict[str, tuple[int, str]] = {}
        self.data_version = DataVersion()

    def __contains__(self, uniq_key: object) -> bool:
        return uniq_key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def restore(self, data: Any) -> None:
        entries = {
            str(k): (int(v["due"]), str(v.get("topic", ""))) for k, v in data["recalls"].items()
        }
        self.data_version.assign(DataVersion.from_dict(data["dataVersion"]))
        self.entries = entries

    def start_over(self) -> None:
        self.entries = {}
        self.data_version.assign(oldest())

    def payload(self) -> dict[str, Any]:
        return {
            "recalls": {k: {"due": d, "topic": t} for k, (d, t) in self.entries.items()},
            "dataVersion": self.data_version.to_dict(),
        }

    def add(self, uniq_key: str, due: int, topic: str = "") -> bool:
        """Record one recall; False when it was known already."""
        if uniq_key in self.entries:
            return False
        self.entries[uniq_key] = (due, topic)
        self._prune()
        self.data_version.next_version()
        self._dirty = True
        return True

    def _prune(self, now: int | None = None) -> None:
        now = self._clock() if now is None else now
        old = [k for k, (d, _) in self.entries.items() if d < now - self.retention_ms]
        for k in old:
            del self.entries[k]
        if len(self.entries) > MAX_RECALLS:
            by_due = sorted(self.entries, key=lambda k: self.entries[k][0])
            for k in by_due[: len(self.entries) - MAX_RECALLS]:
                del self.entries[k]

    def merge(self, entries: Mapping[str, tuple[int, str]], version: DataVersion) -> bool:
        """Take another broker's recalls (a union: a recall anywhere holds
        everywhere) and the newer of the two versions.  True when anything changed."""
        new = {k: v for k, v in entries.items() if k not in self.entries}
        newer = self.data_version.compare(version) < 0
        if not new and not newer:
            return False
        self.entries.update(new)
        self._prune()
        if newer:
            self.data_version.assign(version)
        self._dirty = True
        return True

    def bump(self) -> None:
        """An acting slave taking over: its table is the group's truth from now on."""
        self.data_version.take_over()
        self._dirty = True

    def to_pb(self) -> broker_pb2.RecallTable:
        return broker_pb2.RecallTable(
            entries=[
                broker_pb2.RecallEntry(uniq_key=k, due_ms=d, topic=t)
                for k, (d, t) in self.entries.items()
            ],
            data_version=data_version_to_pb(self.data_version),
        )


def _snapshot(pb: broker_pb2.RecallTable) -> RecallSnapshot:
    entries = {e.uniq_key: (e.due_ms, e.topic) for e in pb.entries if e.uniq_key}
    return entries, data_version_from_pb(pb.data_version)


def recall_sync(table: RecallTable) -> TableSync[broker_pb2.RecallTable, RecallSnapshot]:
    """The table for forward and reverse sync: both merge (a recall is never undone), at
    any time (a merge never loses a recall, so it is never busy)."""

    def adopt(snapshot: RecallSnapshot) -> bool:
        changed = table.merge(*snapshot)
        table.persist()
        return changed

    return TableSync(
        "recalls",
        RequestCode.GET_RECALL_TABLE,
        broker_pb2.RecallTable,
        decode=_snapshot,
        take=lambda s: table.merge(*s),
        adopt=adopt,
        describe=lambda s: f"{len(s[0])} recalled",
        busy=lambda: False,
        file=table,
    )
