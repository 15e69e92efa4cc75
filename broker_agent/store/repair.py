"""Damaged records of a running broker's own commit log, and the checks a replica's copy
must pass before it is written back in their place.  No I/O.

A record below the log's end that cannot be read (a CRC mismatch, a zero or wrong
length, a short read: bits flipped on disk, a segment truncated under the running
broker) or that does not match its consume-queue entry is *damaged*.  It is never
served and never skipped: the store raises ``RecordUnderRepair`` for it (readers hold
their progress there), notes a :class:`Damage`, and the broker's repair loop
(``broker_agent.replication.repair``) asks a replica for those bytes
(``GET_COMMITLOG_RANGE``).  What comes back is written in place only when
:func:`check_copy` accepts it: whole CRC-valid records that start exactly at the
damaged offset, each claiming its own physical offset, none overrunning its segment,
ending exactly at the damage's end when that is known, and, for a record a consume
queue points at, of that topic, queue and queue offset.
"""

from __future__ import annotations

from dataclasses import dataclass

from ha_controller.protocol.errors import CorruptRecord
from ha_controller.protocol.record import BLANK, BLANK_MIN_SIZE, decode_header, decode_record

__all__ = ["Damage", "DamageTable", "Expected", "check_copy"]


@dataclass(frozen=True, slots=True)
class Expected:
    """What the consume queue says of the record at a damaged offset."""

    topic: str
    queue_id: int
    queue_offset: int
    size: int


@dataclass(slots=True)
class Damage:
    """Commit-log bytes ``[start, end)`` not to be served until a replica's copy of them
    was written back.  ``end`` is None when the damaged record's own length cannot be
    trusted (found by a raw read, not through a consume queue): the replica's first
    record then says where it ends."""

    start: int
    end: int | None
    why: str
    expected: Expected | None = None
    #: repair rounds that found no replica with an intact copy
    failures: int = 0
    #: the one ERROR line for an unrepairable range was logged
    reported: bool = False

    def covers(self, offset: int) -> bool:
        if self.end is None:
            return offset == self.start
        return self.start <= offset < self.end

    def describe(self) -> str:
        span = f"[{self.start}, {self.end})" if self.end is not None else f"at {self.start}"
        what = ""
        if self.expected is not None:
            e = self.expected
            what = f" ({e.topic}/{e.queue_id} offset {e.queue_offset})"
        return f"commit log {span}{what}: {self.why}"


class DamageTable:
    """The damaged ranges of one commit log, by start offset (plain object)."""

    def __init__(self) -> None:
        self._ranges: dict[int, Damage] = {}

    def __len__(self) -> int:
        return len(self._ranges)

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def add(self, damage: Damage) -> Damage:
        """Note ``damage`` and return the range that now holds its start: a known range
        covering it (unchanged), or ``damage`` itself, which replaces the ranges it
        swallows (a truncated tail found after single records inside it)."""
        end = damage.end
        known = self.covering(damage.start)
        if known is not None and (
            damage.end is None or (known.end is not None and known.end >= damage.end)
        ):
            return known  # already noted (the same tail, found again)
        if end is not None:
            inside = [
                d
                for d in self._ranges.values()
                if damage.start <= d.start and (d.end or d.start + 1) <= end
            ]
            for d in inside:
                del self._ranges[d.start]
        known = self.covering(damage.start)
        if known is not None and (known.end is not None or damage.end is None):
            return known
        if known is not None:
            del self._ranges[known.start]
        self._ranges[damage.start] = damage
        return damage

    def covering(self, offset: int) -> Damage | None:
        exact = self._ranges.get(offset)
        if exact is not None:
            return exact
        for damage in self._ranges.values():
            if damage.covers(offset):
                return damage
        return None

    def overlapping(self, start: int, end: int) -> Damage | None:
        """The first (lowest) range holding a byte of ``[start, end)``."""
        found: Damage | None = None
        for damage in self._ranges.values():
            stop = damage.end if damage.end is not None else damage.start + 1
            if (
                damage.start < end
                and start < stop
                and (found is None or damage.start < found.start)
            ):
                found = damage
        return found

    def pending(self) -> list[Damage]:
        return sorted(self._ranges.values(), key=lambda d: d.start)

    def repaired(self, damage: Damage, upto: int) -> None:
        """Bytes ``[damage.start, upto)`` were written back: the rest stays damaged."""
        self._ranges.pop(damage.start, None)
        for start in [
            s for s, d in self._ranges.items() if damage.start <= s and (d.end or s + 1) <= upto
        ]:
            del self._ranges[start]  # inside what was written back
        if damage.end is not None and upto < damage.end:
            damage.start = upto
            damage.expected = None
            self._ranges[upto] = damage

    def drop_from(self, offset: int) -> None:
        """The log was cut back to ``offset``: ranges there are gone with it."""
        for start in [s for s in self._ranges if s >= offset]:
            del self._ranges[start]
        for damage in self._ranges.values():
            if damage.end is not None and damage.end > offset:
                damage.end = offset

    def drop_below(self, offset: int) -> None:
        """Retention deleted everything below ``offset``."""
        for start in [s for s, d in self._ranges.items() if (d.end or s + 1) <= offset]:
            del self._ranges[start]


def check_copy(damage: Damage, data: bytes, segment_size: int) -> tuple[int, int]:
    """How many bytes (and records) of ``data`` (a replica's answer from
    ``damage.start``) may be written back: whole records only, checked as the module
    docstring says.  Raises CorruptRecord naming the first thing that is wrong; nothing
    is to be written then.
    """
    start = damage.start
    if not data:
        raise CorruptRecord(f"the replica sent no bytes at {start}")
    limit = len(data) if damage.end is None else min(len(data), damage.end - start)
    pos = 0
    records = 0
    while pos < limit:
        here = start + pos
        try:
            # the CRC covers every byte; only the first record's names are compared
            head = decode_header(data, pos)
        except CorruptRecord as exc:
            raise CorruptRecord(f"the replica's record at {here}: {exc}") from exc
        size = head.size
        in_segment = here % segment_size
        if head.blank:
            if in_segment + size != segment_size:
                raise CorruptRecord(
                    f"the replica's blank record at {here} does not end its segment"
                )
        else:
            if head.physical_offset != here:
                raise CorruptRecord(
                    f"the replica's record at {here} claims physical offset {head.physical_offset}"
                )
            if in_segment + size + BLANK_MIN_SIZE > segment_size:
                raise CorruptRecord(f"the replica's record at {here} overruns its segment")
            expected = damage.expected
            if expected is not None and pos == 0:
                try:
                    record, _ = decode_record(data, pos)
                except CorruptRecord as exc:
                    raise CorruptRecord(f"the replica's record at {here}: {exc}") from exc
                assert record is not BLANK
                got = (record.topic, record.queue_id, record.queue_offset, size)
                want = (expected.topic, expected.queue_id, expected.queue_offset, expected.size)
                if got != want:
                    raise CorruptRecord(
                        f"the replica's record at {here} is {got[0]}/{got[1]} offset {got[2]} "
                        f"({got[3]} bytes); the consume queue expects {want[0]}/{want[1]} "
                        f"offset {want[2]} ({want[3]} bytes): the logs differ"
                    )
        if pos + size > limit:
            break
        pos += size
        records += 1
        if damage.end is None:
            break  # one record: its own length says where the damage ends
    if pos == 0:
        raise CorruptRecord(
            f"the replica's first record at {start} runs past the damaged range "
            f"[{start}, {damage.end})"
        )
    if damage.end is not None and len(data) >= damage.end - start and pos != damage.end - start:
        raise CorruptRecord(
            f"the replica's records from {start} do not end at {damage.end} (at {start + pos})"
        )
    return pos, records
