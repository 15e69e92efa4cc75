"""Retention: which commit-log segments to delete (RocketMQ's ``CleanCommitLogService``).

A plain decision, no I/O (the store hands in what it knows): a closed segment whose file
was last modified more than ``file_reserved_time_ms`` ago is *expired*.  Expired
segments are deleted, oldest first, while

* the local hour is one of ``delete_when`` (RocketMQ ``deleteWhen``, ``"04"`` or
  ``"04;05"``), or
* the store's file system is more than ``disk_max_used_space_ratio`` used (RocketMQ
  ``diskMaxUsedSpaceRatio``): then at once, whatever the hour.

Never deleted: the active (last) segment, any segment after the first one that has not
expired (deletion only ever moves the start of the log), and, on a master, anything its
slowest live slave has not received yet (``replica_limit``, the smallest acknowledged
offset of the attached slaves and of those detached less than ``detached_slave_hold_ms``
ago; a slave deletes by time and space alone).  Unexpired data
is never deleted, whatever the disk says: a store that still fills up refuses appends
(see ``diskspace``) and the cluster sends elsewhere.  (RocketMQ's
``diskSpaceCleanForciblyRatio``, which deletes unexpired files, is not implemented.)

A segment's modification time is when its last byte (the blank fill that closed it) was
written, so it is never earlier than the store time of any message in it: a message
stored within the last ``file_reserved_time_ms`` is never deleted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .commitlog import SegmentInfo

#: segments deleted per round at most (RocketMQ's deleteFileBatchMax is 10); a full
#: batch says so (``Decision.more``) and the caller goes again at once
DELETE_BATCH_MAX = 32


def parse_delete_when(text: str) -> frozenset[int]:
    """``"04"`` / ``"04;05"`` -> the hours of day (0..23); ValueError names the problem."""
    hours: set[int] = set()
    for part in text.split(";"):
        word = part.strip()
        if not word.isdigit() or not 0 <= int(word) <= 23:
            raise ValueError(
                f'expected hours of day 0..23 separated by \';\' (like "04" or "04;05"), '
                f"got {text!r}"
            )
        hours.add(int(word))
    return frozenset(hours)


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    file_reserved_time_ms: int
    delete_hours: frozenset[int]
    disk_max_used_space_ratio: float


@dataclass(frozen=True, slots=True)
class Decision:
    """How many of the oldest segments to delete now, and why (one line, for the log)."""

    segments: int
    reason: str
    more: bool = False
    """The batch was full: more may be deletable right away."""


def decide(
    policy: RetentionPolicy,
    segments: Iterable[SegmentInfo],
    *,
    now_ms: int,
    hour: int,
    used_ratio: float | None,
    replica_limit: int | None,
    max_segments: int = DELETE_BATCH_MAX,
) -> Decision:
    """The retention decision over the closed ``segments`` (oldest first, the active one
    left out).  ``segments`` is consumed lazily: it stops at the first one kept."""
    timely = hour in policy.delete_hours
    full = used_ratio is not None and used_ratio >= policy.disk_max_used_space_ratio
    disk = "disk use unknown" if used_ratio is None else f"disk {used_ratio:.0%} used"
    if not (timely or full):
        return Decision(
            0,
            f"not due: hour {hour:02d} is not in delete_when and {disk} "
            f"< {policy.disk_max_used_space_ratio:.0%}",
        )
    why = f"hour {hour:02d} is in delete_when" if timely else f"{disk}"
    count = 0
    end = 0
    stop = "no closed segment left"
    more = False
    for info in segments:
        if count >= max_segments:
            stop, more = f"batch of {max_segments} done", True
            break
        age = now_ms - info.mtime_ms
        if age < policy.file_reserved_time_ms:
            stop = (
                f"segment {info.start} expires in "
                f"{(policy.file_reserved_time_ms - age) / 1000:.1f} s"
            )
            break
        if replica_limit is not None and info.end > replica_limit:
            stop = (
                f"segment {info.start} is not on every slave, attached or away "
                f"(slowest at {replica_limit})"
            )
            break
        count += 1
        end = info.end
    if not count:
        return Decision(0, f"{why}; nothing to delete: {stop}")
    return Decision(count, f"{why}: deleting {count} segment(s) below {end}; {stop}", more)


@dataclass(frozen=True, slots=True)
class CleanResult:
    """What one retention round removed."""

    reason: str
    segments: int = 0
    segment_bytes: int = 0
    queue_files: int = 0
    queue_bytes: int = 0
    more: bool = False
    commitlog_min_offset: int = 0
