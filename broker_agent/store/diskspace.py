"""Free space of the store's file system, tracked cheaply (a plain object, no I/O of its
own: the sampler is injected).

Three levels:

``OK``
    room to spare.
``LOW``
    free space is below the *warning* reserve (``warn_free_disk_ratio`` of the file
    system).  The store still appends; the broker stops advertising writes (its routes
    lose the WRITE bit), so producers go elsewhere before anything is refused.
``FULL``
    free space is below the *hard* reserve (``min_free_disk_ratio``), or an append hit
    ``ENOSPC``.  Appends are refused (``StoreFull``, nothing written).  The reserve is
    left for what must still be written: consume-queue entries, checkpoints, offset
    tables.

``statvfs`` costs about 2 µs and a put about 30 µs, so it is not called per append:
the free space is sampled at most every ``check_interval_s`` while appends go on, and
estimated in between as the last sample minus the bytes this store wrote since.  An
append that the estimate says would cross into a worse level takes a fresh sample
first, so a level is never made worse on an estimate alone (another process may have
freed space).  Leaving a worse level needs a margin (half the gap between the two
reserves) so that the level does not flap around a threshold; after ``ENOSPC`` it also
needs room for the append that failed.
"""

from __future__ import annotations

import enum
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


class SpaceLevel(enum.IntEnum):
    OK = 0
    LOW = 1
    FULL = 2


@dataclass(frozen=True, slots=True)
class DiskSample:
    free_bytes: int
    total_bytes: int


Sampler = Callable[[], DiskSample]


def statvfs_sampler(path: Path) -> Sampler:
    """Free (for unprivileged users) and total bytes of the file system holding ``path``."""

    def sample() -> DiskSample:
        st = os.statvfs(path)
        return DiskSample(st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)

    return sample


class DiskSpace:
    """The store's view of its file system's free space (see the module docstring)."""

    def __init__(
        self,
        sampler: Sampler,
        *,
        min_free_ratio: float,
        warn_free_ratio: float,
        check_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sampler = sampler
        self.min_free_ratio = min_free_ratio
        self.warn_free_ratio = max(warn_free_ratio, min_free_ratio)
        self.check_interval_s = check_interval_s
        self._clock = clock
        self.level = SpaceLevel.OK
        self.free_bytes = 0
        """Free bytes at the last sample."""
        self.total_bytes = 0
        self._written = 0  # bytes appended since the last sample
        self._sampled_at: float | None = None
        self._enospc_need = 0  # an append of this size failed with ENOSPC
        self._sample_failed = False
        self.samples = 0
        """Samples taken (statvfs calls), for tests and the measurements in the docs."""

    # ---- thresholds ------------------------------------------------------------------

    @property
    def hard_reserve_bytes(self) -> int:
        return int(self.total_bytes * self.min_free_ratio)

    @property
    def warn_reserve_bytes(self) -> int:
        return int(self.total_bytes * self.warn_free_ratio)

    @property
    def free_estimate(self) -> int:
        """The last sample minus what this store appended since."""
        return self.free_bytes - self._written

    @property
    def used_ratio(self) -> float | None:
        """Share of the file system not available to the store at the last sample
        (``1 - free / total``, free as for unprivileged users); None before a sample."""
        if self.total_bytes <= 0:
            return None
        return 1.0 - self.free_bytes / self.total_bytes

    def _margin(self) -> int:
        return (self.warn_reserve_bytes - self.hard_reserve_bytes) // 2

    def _level_for(self, free: int) -> SpaceLevel:
        """The level for ``free`` bytes, from the current one (with hysteresis)."""
        hard, warn, margin = self.hard_reserve_bytes, self.warn_reserve_bytes, self._margin()
        current = self.level
        if free < hard:
            return SpaceLevel.FULL
        if current is SpaceLevel.FULL and free < hard + max(margin, self._enospc_need):
            return SpaceLevel.FULL
        if free < warn or (current is not SpaceLevel.OK and free < warn + margin):
            return SpaceLevel.LOW
        return SpaceLevel.OK

    def _plain_level(self, free: int) -> SpaceLevel:
        if free < self.hard_reserve_bytes:
            return SpaceLevel.FULL
        if free < self.warn_reserve_bytes:
            return SpaceLevel.LOW
        return SpaceLevel.OK

    # ---- sampling ----------------------------------------------------------------------

    def refresh(self) -> SpaceLevel:
        """Sample now and return the (possibly new) level.  A failed sample keeps the
        level (logged once): the reserve is not checked, ``ENOSPC`` still is."""
        self._sampled_at = self._clock()
        try:
            sample = self._sampler()
        except OSError as exc:
            if not self._sample_failed:
                log.warning("cannot sample free disk space: %s", exc)
            self._sample_failed = True
            return self.level
        self._sample_failed = False
        self.samples += 1
        self.free_bytes, self.total_bytes = sample.free_bytes, sample.total_bytes
        self._written = 0
        level = self._level_for(sample.free_bytes)
        self._set(level)
        return level

    def _set(self, level: SpaceLevel) -> None:
        if level is not self.level:
            log.warning(
                "free disk space %d of %d bytes: %s -> %s (reserves: hard %d, warning %d)",
                self.free_bytes,
                self.total_bytes,
                self.level.name,
                level.name,
                self.hard_reserve_bytes,
                self.warn_reserve_bytes,
            )
            self.level = level
        if level is not SpaceLevel.FULL:
            self._enospc_need = 0

    def due(self) -> bool:
        """Whether the last sample is older than ``check_interval_s``."""
        at = self._sampled_at
        return at is None or self._clock() - at >= self.check_interval_s

    # ---- appends -----------------------------------------------------------------------

    def admit(self, size: int) -> bool:
        """Whether ``size`` more bytes may be appended now (False: refuse, nothing
        written).  Samples when the last sample is due, or when the estimate says this
        append would make the level worse."""
        if self.due() or (
            self.level is not SpaceLevel.FULL
            and self._plain_level(self.free_estimate - size) > self.level
        ):
            self.refresh()
        if self.level is SpaceLevel.FULL:
            return False
        if self._sample_failed or self.total_bytes == 0:
            return True
        if self.free_estimate - size < self.hard_reserve_bytes:
            self._set(SpaceLevel.FULL)
            return False
        return True

    def charge(self, size: int) -> None:
        """``size`` bytes were appended."""
        self._written += size

    def hit_enospc(self, size: int) -> None:
        """An append of ``size`` bytes failed with ENOSPC (and was cut back): FULL until
        the reserve plus that much is free."""
        self._enospc_need = max(self._enospc_need, size)
        self._set(SpaceLevel.FULL)
        self.refresh()
