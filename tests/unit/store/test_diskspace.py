"""DiskSpace: levels, the running estimate between samples, hysteresis, ENOSPC."""

from __future__ import annotations

import pytest
from fakes import FakeClock

from broker_agent.store.diskspace import DiskSample, DiskSpace, SpaceLevel

MiB = 1 << 20
TOTAL = 100 * MiB


class FakeDisk:
    def __init__(self, free: int) -> None:
        self.free = free
        self.calls = 0
        self.fail = False

    def __call__(self) -> DiskSample:
        self.calls += 1
        if self.fail:
            raise OSError(5, "I/O error")
        return DiskSample(self.free, TOTAL)


def space(disk: FakeDisk, clock: FakeClock) -> DiskSpace:
    s = DiskSpace(disk, min_free_ratio=0.05, warn_free_ratio=0.10, clock=clock)
    s.refresh()
    return s


def write(s: DiskSpace, disk: FakeDisk, size: int) -> bool:
    """An append of ``size`` bytes as the store does it; the fake disk loses them."""
    if not s.admit(size):
        return False
    disk.free -= size
    s.charge(size)
    return True


def test_levels_follow_the_reserves_and_are_decided_on_samples_only() -> None:
    disk, clock = FakeDisk(20 * MiB), FakeClock(0.0)
    s = space(disk, clock)
    assert (s.level, s.hard_reserve_bytes, s.warn_reserve_bytes) == (
        SpaceLevel.OK,
        5 * MiB,
        10 * MiB,
    )
    levels: list[SpaceLevel] = []
    writes = 0
    while write(s, disk, 64 * 1024):
        writes += 1
        if not levels or levels[-1] is not s.level:
            levels.append(s.level)
    assert levels == [SpaceLevel.OK, SpaceLevel.LOW]
    assert s.level is SpaceLevel.FULL
    assert 5 * MiB <= disk.free < 5 * MiB + 64 * 1024  # the hard reserve is kept
    # a sample when crossing into LOW, one when crossing into FULL: not one per append
    assert disk.calls <= 4, (disk.calls, writes)


def test_time_samples_catch_other_writers_and_returning_space() -> None:
    disk, clock = FakeDisk(20 * MiB), FakeClock(0.0)
    s = space(disk, clock)
    disk.free = 7 * MiB  # another process wrote to the file system
    # (admitted, level) in one expression: each admit may change the level
    assert (s.admit(1024), s.level) == (True, SpaceLevel.OK)  # the estimate does not know
    clock.now += 1.0
    assert (s.admit(1024), s.level) == (True, SpaceLevel.LOW)
    disk.free = 4 * MiB
    clock.now += 1.0
    assert (s.admit(1024), s.level) == (False, SpaceLevel.FULL)
    calls = disk.calls
    for _ in range(1000):  # refused cheaply, no sample until the next one is due
        assert not s.admit(1024)
    assert disk.calls == calls
    disk.free = 50 * MiB
    clock.now += 1.0
    assert (s.admit(1024), s.level) == (True, SpaceLevel.OK)


def test_leaving_a_level_needs_a_margin() -> None:
    disk, clock = FakeDisk(4 * MiB), FakeClock(0.0)
    s = space(disk, clock)
    assert s.level is SpaceLevel.FULL
    disk.free = 5 * MiB + 1  # just above the hard reserve: not enough to leave FULL
    assert s.refresh() is SpaceLevel.FULL
    disk.free = int(7.5 * MiB)  # hard + half the gap between the reserves
    assert s.refresh() is SpaceLevel.LOW
    disk.free = 10 * MiB + 1  # just above the warning reserve: still LOW
    assert s.refresh() is SpaceLevel.LOW
    disk.free = int(12.5 * MiB)
    assert s.refresh() is SpaceLevel.OK
    disk.free = 9 * MiB
    assert s.refresh() is SpaceLevel.LOW  # going down needs no margin


def test_enospc_without_a_reserve_waits_for_room_for_the_failed_append() -> None:
    disk, clock = FakeDisk(5000), FakeClock(0.0)
    s = DiskSpace(disk, min_free_ratio=0.0, warn_free_ratio=0.0, clock=clock)
    s.refresh()
    assert not s.admit(6000)  # cannot fit even without a reserve
    assert s.level is SpaceLevel.FULL
    disk.free = 4500
    clock.now += 1.0
    assert s.admit(4000)  # fits on paper; the file system decides (block rounding...)
    disk.free = 3000
    s.hit_enospc(4000)
    assert s.level is SpaceLevel.FULL and not s.admit(10)
    disk.free = 3500
    assert s.refresh() is SpaceLevel.FULL
    disk.free = 4000
    assert s.refresh() is SpaceLevel.OK
    assert s.admit(10)


def test_a_failing_sample_keeps_the_level_and_does_not_block_appends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    disk, clock = FakeDisk(20 * MiB), FakeClock(0.0)
    s = space(disk, clock)
    disk.fail = True
    clock.now += 1.0
    assert s.admit(1024)
    clock.now += 1.0
    assert s.admit(1024)
    assert s.level is SpaceLevel.OK
    assert sum("cannot sample" in r.getMessage() for r in caplog.records) == 1
