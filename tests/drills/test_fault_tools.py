"""The durability fault tools themselves, without a cluster: hac-lazyfs loses exactly what
was not synced (checked with files and with the broker's real store), the clock shim
steps one process's wall clock and nothing else, the store damage does what it says.

Each skips with the reason where its tool cannot run (``make tools`` builds them).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest

from broker_agent.store import MessageStore, StoreConfig
from ha_controller.drills.clock import ClockControl, clock_available
from ha_controller.drills.corruption import corrupt_store, written_end
from ha_controller.drills.lazyfs import LazyMount, lazyfs_available


@pytest.fixture
def lazy(tmp_path: Path) -> Iterator[LazyMount]:
    reason = lazyfs_available()
    if reason is not None:
        pytest.skip(f"power loss: {reason}")
    mount = LazyMount(tmp_path / "backing", tmp_path / "store", tmp_path / "lazyfs.log")
    mount.mount()
    try:
        yield mount
    finally:
        mount.unmount()


def test_lazyfs_loses_what_was_not_synced(lazy: LazyMount) -> None:
    root = lazy.mountpoint
    fd = os.open(root / "seg", os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"synced", 0)
    os.fdatasync(fd)
    os.pwrite(fd, b"-unsynced", 6)
    assert os.pread(fd, 64, 0) == b"synced-unsynced"  # the process sees its writes
    assert os.fstat(fd).st_size == 15
    os.close(fd)
    (root / "table.json.tmp").write_text('{"v": 2}')  # written, renamed, never synced
    (root / "table.json.tmp").rename(root / "table.json")
    (root / "dir").mkdir()
    assert (root / "table.json").read_text() == '{"v": 2}'  # a closed file keeps it too

    lazy.power_cut()
    assert (lazy.backing / "seg").read_bytes() == b"synced"
    assert (lazy.backing / "table.json").read_bytes() == b""  # metadata at once, data not
    assert (lazy.backing / "dir").is_dir()
    lazy.mount()
    assert (root / "seg").read_bytes() == b"synced"


@pytest.mark.parametrize(("flush_mode", "kept"), [("async", 10), ("sync", 15)])
def test_the_store_after_a_power_loss(
    lazy: LazyMount, flush_mode: Literal["async", "sync"], kept: int
) -> None:
    """The broker's own store on lazyfs: async keeps what the last flush synced, sync
    keeps every acknowledged put."""
    config = StoreConfig(
        flush_mode=flush_mode, segment_size_bytes=1 << 20, max_message_size_bytes=1 << 16
    )
    store = MessageStore.open(lazy.mountpoint, config)
    for i in range(10):
        store.put("T", 0, f"m{i}".encode())
    store.flush()
    for i in range(10, 15):
        store.put("T", 0, f"m{i}".encode())
    assert store.max_offset("T", 0) == 15
    lazy.power_cut()  # no close: the process is gone with the power
    lazy.mount()
    again = MessageStore.open(lazy.mountpoint, config)
    try:
        assert again.max_offset("T", 0) == kept
    finally:
        again.close()


def test_clock_shim_steps_the_wall_clock_only(tmp_path: Path) -> None:
    reason = clock_available()
    if reason is not None:
        pytest.skip(f"clock: {reason}")
    clock = ClockControl(tmp_path / "clock")
    probe = (
        "import json, sys, time\n"
        "w, m = time.time(), time.monotonic()\n"
        "print(json.dumps([w, m]), flush=True)\n"
        "sys.stdin.readline()\n"
        "print(json.dumps([time.time() - w, time.monotonic() - m]), flush=True)\n"
    )
    env = {**os.environ, **clock.env()}
    with subprocess.Popen(
        [sys.executable, "-c", probe],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdout.readline()
        clock.step(-45.0)
        proc.stdin.write("\n")
        proc.stdin.flush()
        wall, mono = json.loads(proc.stdout.readline())
    assert -46 < wall < -44  # stepped back by 45 s, at once
    assert 0 <= mono < 5  # the monotonic clock went on
    clock.set_offset(0.0)
    assert clock.offset_s == 0.0


def _store_with_records(path: Path) -> None:
    store = MessageStore.open(
        path, StoreConfig(segment_size_bytes=1 << 20, max_message_size_bytes=1 << 16)
    )
    for i in range(200):
        store.put("T", i % 2, f"message-{i}".encode() * 4, {"KEYS": f"k{i}"})
    store.close()
    (path / "topics.json").write_text("{}")


@pytest.mark.parametrize(
    "variant", ["truncate-segment", "flip-bits", "delete-consume-queue", "delete-table"]
)
def test_store_damage_does_what_it_says(tmp_path: Path, variant: str) -> None:
    _store_with_records(tmp_path)
    segment = next((tmp_path / "commitlog").iterdir())
    end, before = written_end(segment), segment.read_bytes()
    queues = sorted(p for p in (tmp_path / "consumequeue").rglob("*") if p.is_file())
    said = corrupt_store(tmp_path, variant, random.Random(7))
    after = segment.read_bytes()
    if variant == "truncate-segment":
        assert "truncated" in said and len(after) < end
    elif variant == "flip-bits":
        differ = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
        assert 1 <= len(differ) <= 4 and all(i < end for i in differ), said
    elif variant == "delete-consume-queue":
        left = sorted(p for p in (tmp_path / "consumequeue").rglob("*") if p.is_file())
        assert len(left) == len(queues) - 1, said
    else:
        assert not (tmp_path / "topics.json").exists(), said
    # whatever was damaged, the store opens again on what is left
    MessageStore.open(
        tmp_path, StoreConfig(segment_size_bytes=1 << 20, max_message_size_bytes=1 << 16)
    ).close()


def test_damage_to_an_empty_store_says_so(tmp_path: Path) -> None:
    for variant in ("truncate-segment", "flip-bits", "delete-consume-queue", "delete-table"):
        assert corrupt_store(tmp_path, variant, random.Random(1)).startswith("no ")
    with pytest.raises(ValueError, match="unknown corruption"):
        corrupt_store(tmp_path, "meteor", random.Random(1))
