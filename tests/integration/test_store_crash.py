"""The store against real faults: kill -9 of a writing process, and a full disk."""

from __future__ import annotations

import hashlib
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Literal

import pytest

from broker_agent.store import GetMessageStatus, MessageStore, StoreConfig
from broker_agent.store.diskspace import SpaceLevel
from ha_controller.protocol.errors import StoreFull
from ha_controller.protocol.record import BLANK, iter_records

SEG = 64 * 1024
CFG = StoreConfig(segment_size_bytes=SEG, max_message_size_bytes=16 * 1024, flush_mode="sync")

# The child acknowledges a message only after put() returned.  In sync mode put()
# fdatasyncs; in async mode the child flushes (and writes the checkpoint) now and then
# like the broker's flush loop, so a kill leaves a tail past the checkpoint (a process
# crash keeps the page cache, so every returned put() survives it in both modes).
CHILD = textwrap.dedent(
    """
    import hashlib, random, sys
    from pathlib import Path
    from broker_agent.store import MessageStore, StoreConfig

    store_dir, seed, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    rng = random.Random(seed)
    config = StoreConfig(
        segment_size_bytes=64 * 1024, max_message_size_bytes=16 * 1024, flush_mode=mode
    )
    store = MessageStore.open(store_dir, config)
    print("ready", store.recovered_from, flush=True)
    while True:
        topic, queue_id = rng.choice(["A", "B"]), rng.randrange(3)
        body = rng.randbytes(rng.randrange(0, 4000))
        r = store.put(topic, queue_id, body, {"TAGS": "t"})
        if mode == "async" and rng.random() < 0.1:
            store.flush()
        digest = hashlib.sha256(body).hexdigest()
        print(topic, queue_id, r.queue_offset, r.physical_offset, digest, flush=True)
    """
)


def verify(store: MessageStore, acked: dict[tuple[str, int, int], str]) -> int:
    """Every acknowledged message is there; queues are contiguous and agree with the log."""
    assert store.corrupt_reads == 0
    for (topic, q, qoff), digest in acked.items():
        msg = store.get_message_at(topic, q, qoff)
        assert msg is not None, (topic, q, qoff)
        assert hashlib.sha256(msg.body).hexdigest() == digest
    indexed = 0
    for topic, queues in store.topics_and_queues().items():
        for q in queues:
            lo, hi = store.min_offset(topic, q), store.max_offset(topic, q)
            got = store.get_messages(topic, q, lo, 100_000, 1 << 40)
            assert got.status is GetMessageStatus.FOUND or hi == lo
            assert [m.queue_offset for m in got.messages] == list(range(lo, hi))
            indexed += hi - lo
    records = 0
    offset = store.commitlog_min_offset
    while offset < store.commitlog_max_offset:
        data = store.read_commitlog(offset, 1 << 20)
        for pos, rec, _ in iter_records(data):
            if rec is BLANK:
                continue
            at = store.get_message_at(rec.topic, rec.queue_id, rec.queue_offset)
            assert at is not None and at.physical_offset == offset + pos
            assert at.body == rec.body
            records += 1
        offset += len(data)
    assert records == indexed
    assert store.corrupt_reads == 0
    return records


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_kill_9_never_loses_an_acknowledged_message(
    tmp_path: Path, mode: Literal["sync", "async"]
) -> None:
    rng = random.Random(20240601)
    store_dir = tmp_path / "store"
    acked: dict[tuple[str, int, int], str] = {}
    config = replace(CFG, flush_mode=mode)
    from_checkpoint = 0  # restarts that verified only a tail past the checkpoint
    for iteration in range(20):
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(store_dir), str(rng.randrange(1 << 30)), mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        try:
            ready = proc.stdout.readline()
            assert ready.startswith("ready "), proc.stderr.read() if proc.stderr else ""
            kill_after = rng.randrange(0, 120)
            for _ in range(kill_after):
                line = proc.stdout.readline()
                assert line.endswith("\n"), proc.stderr.read() if proc.stderr else line
                topic, q, qoff, _, digest = line.split()
                acked[(topic, int(q), int(qoff))] = digest
            time.sleep(rng.random() * 0.005)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            # lines printed before the kill are acknowledged too; a partial line is not
            for line in proc.stdout.read().splitlines(keepends=True):
                if line.endswith("\n"):
                    topic, q, qoff, _, digest = line.split()
                    acked[(topic, int(q), int(qoff))] = digest
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            if proc.stderr is not None:
                proc.stderr.close()
        assert proc.returncode == -signal.SIGKILL
        with MessageStore.open(store_dir, config) as store:
            from_checkpoint += store.recovered_from > store.commitlog_min_offset
            records = verify(store, acked)
        assert records >= len(acked)
        assert time.monotonic() - started < 10, f"iteration {iteration} too slow"
    assert len(acked) > 200
    if mode == "async":
        assert from_checkpoint > 5


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:
        pytest.skip(f"cannot run mount: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs (needs root/CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_disk_full_refuses_without_a_partial_record_and_recovers_when_space_returns(
    tiny_tmpfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # no reserve: the file system itself answers ENOSPC
    config = StoreConfig(
        segment_size_bytes=SEG, max_message_size_bytes=16 * 1024, min_free_disk_ratio=0.0
    )
    filler = tiny_tmpfs / "filler"
    filler.write_bytes(b"f" * 256 * 1024)
    rng = random.Random(7)
    acked: dict[tuple[str, int, int], str] = {}
    store = MessageStore.open(tiny_tmpfs / "store", config)
    try:
        with pytest.raises(StoreFull):
            for _ in range(10_000):
                body = rng.randbytes(rng.randrange(500, 3000))
                q = rng.randrange(3)
                r = store.put("T", q, body)
                acked[("T", q, r.queue_offset)] = hashlib.sha256(body).hexdigest()
        # full, not broken: refused (nothing written) until space returns
        assert not store.read_only
        assert not store.writable
        assert store.space_level is SpaceLevel.FULL
        assert "full" in (store.unwritable_reason() or "")
        with pytest.raises(StoreFull):
            store.put("T", 0, b"more" * 500)
        end = store.commitlog_max_offset
        # the failed append was cut back: the files end exactly at the last good record
        last = max((tiny_tmpfs / "store" / "commitlog").iterdir())
        assert int(last.name) + last.stat().st_size == end
        verify(store, acked)
    finally:
        store.close()
    assert len(acked) > 100
    with caplog.at_level(logging.WARNING, logger="broker_agent.store"):
        again = MessageStore.open(tiny_tmpfs / "store", config)
    try:
        assert not [r for r in caplog.records if "truncating" in r.getMessage()]
        assert again.commitlog_max_offset == end
        assert verify(again, acked) == len(acked)
        with pytest.raises(StoreFull):  # still full: refused again, nothing half-written
            for _ in range(100):
                again.put("T", 0, rng.randbytes(3000))
        assert again.commitlog_max_offset <= end + 100 * 4000
        before = again.commitlog_max_offset
        last = max((tiny_tmpfs / "store" / "commitlog").iterdir())
        assert int(last.name) + last.stat().st_size == before

        # space returns: the next sample clears the state, appends work again
        filler.unlink()
        assert again.check_space() is not SpaceLevel.FULL
        assert again.writable and not again.read_only
        for _ in range(20):
            body = rng.randbytes(2000)
            r = again.put("T", 1, body)
            acked[("T", 1, r.queue_offset)] = hashlib.sha256(body).hexdigest()
        assert verify(again, acked) == len(acked)
    finally:
        again.close()


def test_reserve_refuses_before_enospc_with_few_statvfs_calls(
    tiny_tmpfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With a reserve the store never reaches ENOSPC: LOW at the warning reserve, FULL
    (refused) at the hard one, and free space is sampled a handful of times, not per
    append."""
    config = StoreConfig(
        segment_size_bytes=SEG,
        max_message_size_bytes=16 * 1024,
        min_free_disk_ratio=0.2,
        warn_free_disk_ratio=0.4,
    )
    acked: dict[tuple[str, int, int], str] = {}
    levels: list[SpaceLevel] = []
    rng = random.Random(11)
    with caplog.at_level(logging.WARNING, logger="broker_agent.store"):
        store = MessageStore.open(tiny_tmpfs / "store", config)
        try:
            samples_at_open = store.disk_samples
            with pytest.raises(StoreFull, match="kept in reserve"):
                for _ in range(10_000):
                    body = rng.randbytes(1000)
                    r = store.put("T", 0, body)
                    acked[("T", 0, r.queue_offset)] = hashlib.sha256(body).hexdigest()
                    if not levels or levels[-1] is not store.space_level:
                        levels.append(store.space_level)
            assert levels == [SpaceLevel.OK, SpaceLevel.LOW]
            assert store.space_level is SpaceLevel.FULL and not store.read_only
            free = store.free_disk_bytes
            assert free >= 0.2 * 1024 * 1024 - 1100, free  # the reserve was kept
            samples = store.disk_samples - samples_at_open
            assert samples <= 10, f"{samples} statvfs calls for {len(acked)} appends"
            verify(store, acked)
        finally:
            store.close()
    # never reached the file system's own ENOSPC
    assert not [r for r in caplog.records if "until space returns" in r.getMessage()]
    assert len(acked) > 300


def test_replica_with_a_full_disk_refuses_whole_chunks_and_catches_up_later(
    tiny_tmpfs: Path, tmp_path: Path
) -> None:
    """A slave's store: replicated chunks that do not fit are refused whole (ENOSPC or
    the reserve), the store stays usable, and it catches up once space returns."""
    rng = random.Random(3)
    filler = tiny_tmpfs / "filler"
    filler.write_bytes(b"f" * 384 * 1024)
    acked: dict[tuple[str, int, int], str] = {}
    with MessageStore.open(tmp_path / "master", CFG) as master:
        for _ in range(400):
            body = rng.randbytes(rng.randrange(500, 3000))
            q = rng.randrange(3)
            r = master.put("T", q, body)
            acked[("T", q, r.queue_offset)] = hashlib.sha256(body).hexdigest()
        end = master.commitlog_max_offset
        for ratio in (0.0, 0.1):  # the file system's ENOSPC, then the reserve
            config = StoreConfig(
                segment_size_bytes=SEG, max_message_size_bytes=16 * 1024, min_free_disk_ratio=ratio
            )
            replica_dir = tiny_tmpfs / f"replica-{ratio}"
            with MessageStore.open(replica_dir, config) as replica:
                with pytest.raises(StoreFull):
                    while replica.commitlog_max_offset < end:
                        at = replica.commitlog_max_offset
                        replica.append_replicated(at, master.read_commitlog(at, 64 * 1024))
                        replica.reput()
                assert not replica.read_only and not replica.writable
                stopped = replica.commitlog_max_offset
                assert 0 < stopped < end
                files = sorted((replica_dir / "commitlog").iterdir())
                assert int(files[-1].name) + files[-1].stat().st_size == stopped
                # refused again while full, nothing written
                with pytest.raises(StoreFull):
                    replica.append_replicated(stopped, master.read_commitlog(stopped, 64 * 1024))
                assert replica.commitlog_max_offset == stopped

                filler.unlink()
                replica.check_space()
                assert replica.writable
                while replica.commitlog_max_offset < end:
                    at = replica.commitlog_max_offset
                    replica.append_replicated(at, master.read_commitlog(at, 64 * 1024))
                    replica.reput()
                assert verify(replica, acked) == len(acked)
            shutil.rmtree(replica_dir)
            filler.write_bytes(b"f" * 384 * 1024)
