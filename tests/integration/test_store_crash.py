"""The store against real faults: kill -9 of a writing process, and a full disk."""

from __future__ import annotations

import hashlib
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_agent.store import GetMessageStatus, MessageStore, StoreConfig
from ha_controller.protocol.errors import StoreFull, StoreReadOnly
from ha_controller.protocol.record import BLANK, iter_records

SEG = 64 * 1024
CFG = StoreConfig(segment_size_bytes=SEG, max_message_size_bytes=16 * 1024, flush_mode="sync")

# The child acknowledges a message only after put() returned (sync flush).
CHILD = textwrap.dedent(
    """
    import hashlib, random, sys
    from pathlib import Path
    from broker_agent.store import MessageStore, StoreConfig

    store_dir, seed = Path(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    config = StoreConfig(
        segment_size_bytes=64 * 1024, max_message_size_bytes=16 * 1024, flush_mode="sync"
    )
    store = MessageStore.open(store_dir, config)
    print("ready", flush=True)
    while True:
        topic, queue_id = rng.choice(["A", "B"]), rng.randrange(3)
        body = rng.randbytes(rng.randrange(0, 4000))
        r = store.put(topic, queue_id, body, {"TAGS": "t"})
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


def test_kill_9_never_loses_an_acknowledged_message(tmp_path: Path) -> None:
    rng = random.Random(20240601)
    store_dir = tmp_path / "store"
    acked: dict[tuple[str, int, int], str] = {}
    for iteration in range(20):
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(store_dir), str(rng.randrange(1 << 30))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        try:
            assert proc.stdout.readline() == "ready\n", proc.stderr.read() if proc.stderr else ""
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
        with MessageStore.open(store_dir, CFG) as store:
            records = verify(store, acked)
        assert records >= len(acked)
        assert time.monotonic() - started < 10, f"iteration {iteration} too slow"
    assert len(acked) > 200


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


def test_disk_full_goes_read_only_without_a_partial_record(
    tiny_tmpfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = StoreConfig(
        segment_size_bytes=SEG, max_message_size_bytes=16 * 1024, min_free_disk_ratio=0.0
    )
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
        assert store.read_only
        with pytest.raises(StoreReadOnly):
            store.put("T", 0, b"more")
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
    finally:
        again.close()
