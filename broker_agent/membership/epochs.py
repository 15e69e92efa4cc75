"""The epochs of a broker's commit log (``epochs.json``), as RocketMQ's
``EpochFileCache`` and Kafka's leader-epoch checkpoint: which master wrote which part.

Each entry is ``(epoch, start offset)``: from that offset on, the log was written by the
master of that epoch.  A broker promoted to master of epoch ``E`` appends ``(E, its
end)`` before it takes a write; a slave takes its master's list once its log follows
that master's.  The log before the first entry is *epoch 0*: written before the group
had a controller, agreed by RIP-32's pre-online.

When a slave attaches to a master (or a demoted master rejoins as a slave) the two
lists say where their logs part (:func:`divergence`, Kafka's rule): the slave's last
epoch ``E``; the master's last epoch not above ``E``; where the master's log left that
epoch (the next entry's start, or its end).  The slave cuts its log back to there:
what lies beyond was written by a master the group has since replaced, and no client
was told it was stored (it never reached the sync-state set).

A file that cannot be read is set aside and the list starts over empty: a slave then
counts as epoch 0 and cuts back to the master's first entry, the safe side (it copies
the rest again).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from broker_agent.metadata.json_table import JsonTable

__all__ = ["Epoch", "EpochFile", "divergence", "end_of_epoch"]

log = logging.getLogger(__name__)

#: ``(epoch, start offset)``
Epoch = tuple[int, int]


def normalize(entries: Iterable[Epoch]) -> list[Epoch]:
    """Entries sorted by epoch, each starting no earlier than the one before (a later
    epoch that starts before an earlier one's start replaces it: the earlier one left
    no bytes in this log)."""
    out: list[Epoch] = []
    for epoch, start in sorted(set(entries)):
        while out and out[-1][1] > start:
            out.pop()
        if out and out[-1][0] == epoch:
            continue
        out.append((epoch, start))
    return out


def end_of_epoch(entries: list[Epoch], epoch: int, log_end: int) -> tuple[int, int]:
    """``(the last epoch of entries not above epoch, where the log leaves it)``: the
    next entry's start, or ``log_end`` when it is the last.  Epoch 0 (before any entry)
    ends at the first entry's start."""
    found = 0
    ends = log_end
    for i, (e, _start) in enumerate(entries):
        if e > epoch:
            break
        found = e
        ends = entries[i + 1][1] if i + 1 < len(entries) else log_end
    if found == 0:
        ends = entries[0][1] if entries else log_end
    return found, min(ends, log_end)


def divergence(
    slave: list[Epoch], slave_end: int, master: list[Epoch], master_end: int
) -> int | None:
    """Where a slave must cut its log back to follow ``master``, or None when its log
    is a prefix of the master's (Kafka's OffsetsForLeaderEpoch)."""
    last = slave[-1][0] if slave else 0
    _, ends = end_of_epoch(master, last, master_end)
    # the slave may also hold a later part of its own last epoch than the master's
    # view of it allows; and if the master does not know the slave's last epoch at all,
    # the slave's own entry for it starts where the shared history ended
    if slave and not any(e == last for e, _ in master):
        ends = min(ends, slave[-1][1])
    return ends if slave_end > ends else None


class EpochFile(JsonTable):
    what = "epoch file"
    rebuilt_from = "starting with no epochs (a slave cuts back to its master's first epoch)"

    def __init__(self, path: Path | None) -> None:
        super().__init__(path)
        self.entries: list[Epoch] = []

    # ---- JsonTable ----------------------------------------------------------------------

    def payload(self) -> dict[str, Any]:
        return {"epochs": [[e, s] for e, s in self.entries]}

    def restore(self, data: Any) -> None:
        self.entries = normalize((int(e), int(s)) for e, s in data["epochs"])

    def start_over(self) -> None:
        self.entries = []

    # ---- the list -------------------------------------------------------------------------

    @classmethod
    def open(cls, store_dir: Path) -> EpochFile:
        table = cls(store_dir / "epochs.json")
        table.load()
        return table

    @property
    def last(self) -> int:
        """The last epoch this log holds (0: none)."""
        return self.entries[-1][0] if self.entries else 0

    def begin(self, epoch: int, start: int) -> None:
        """This broker is master of ``epoch`` from ``start`` on (written at once)."""
        if epoch <= self.last and any(e == epoch and s == start for e, s in self.entries):
            return
        if epoch < self.last:
            raise ValueError(f"epoch {epoch} begins after epoch {self.last}")
        self.entries = normalize([*self.entries, (epoch, start)])
        self.mark_changed()
        self.persist()
        log.info("epoch %d begins at commit-log offset %d", epoch, start)

    def follow(self, master: list[Epoch], end: int) -> None:
        """Take the master's list for a log that now follows it up to ``end``."""
        entries = normalize(master)
        if entries != self.entries:
            self.entries = entries
            self.mark_changed()
            self.persist()

    def cut(self, offset: int) -> None:
        """The log was cut back to ``offset``: epochs that began later are gone."""
        kept = [(e, s) for e, s in self.entries if s <= offset]
        if kept != self.entries:
            self.entries = kept
            self.mark_changed()
            self.persist()
