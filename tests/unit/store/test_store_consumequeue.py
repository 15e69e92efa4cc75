"""Consume-queue files and their agreement with the commit log."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from broker_agent.store import MessageStore, StoreConfig
from broker_agent.store.consumequeue import ENTRY_SIZE, ConsumeQueue
from broker_agent.store.files import FileCache
from ha_controller.protocol.record import tag_hash

CFG = StoreConfig(segment_size_bytes=64 * 1024, max_message_size_bytes=16 * 1024)


def test_entries_append_truncate_and_search(tmp_path: Path) -> None:
    cq = ConsumeQueue(tmp_path, "T", 1)
    assert (cq.min_offset, cq.max_offset, cq.entries(0, 10)) == (0, 0, [])
    for i in range(100):
        cq.append(i * 100, 50 + i, i % 7)
    assert cq.max_offset == 100
    assert cq.entries(10, 3) == [(1000, 60, 3), (1100, 61, 4), (1200, 62, 5)]
    assert cq.entries(98, 10) == [(9800, 148, 0), (9900, 149, 1)]
    assert cq.entries(100, 10) == [] and cq.entries(-1, 1) == []
    assert cq.first_at_or_after(0) == 0
    assert cq.first_at_or_after(1050) == 11
    assert cq.first_at_or_after(10**9) == 100
    cq.truncate(40)
    assert cq.max_offset == 40 and cq.entry(40) is None
    path = tmp_path / "T" / "1" / f"{0:020d}"
    assert path.stat().st_size == 40 * ENTRY_SIZE
    cq.close()
    with path.open("ab") as f:
        f.write(b"\x00" * 7)  # torn entry
    again = ConsumeQueue.load(tmp_path, "T", 1)
    assert again.max_offset == 40 and path.stat().st_size == 40 * ENTRY_SIZE
    assert again.entry(39) == (3900, 89, 39 % 7)
    again.close()


def test_rebase_names_file_by_first_offset(tmp_path: Path) -> None:
    cq = ConsumeQueue(tmp_path, "T", 0)
    cq.rebase(500)
    cq.append(7, 8, 9)
    assert (cq.min_offset, cq.max_offset) == (500, 501)
    assert cq.entry(500) == (7, 8, 9) and cq.entry(0) is None
    cq.close()
    assert [p.name for p in (tmp_path / "T" / "0").iterdir()] == [f"{500:020d}"]
    loaded = ConsumeQueue.load(tmp_path, "T", 0)
    assert (loaded.min_offset, loaded.max_offset) == (500, 501)
    loaded.close()


def test_queue_offsets_are_contiguous_per_queue_and_match_the_log(tmp_path: Path) -> None:
    rng = random.Random(11)
    placed: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    with MessageStore.open(tmp_path, CFG) as store:
        for i in range(500):
            topic, q = rng.choice(["A", "B", "%RETRY%g1"]), rng.randrange(4)
            tags = rng.choice(["x", "y", None])
            r = store.put(topic, q, b"%d" % i, {"TAGS": tags} if tags else None)
            entries = placed.setdefault((topic, q), [])
            assert r.queue_offset == len(entries)
            entries.append((r.physical_offset, r.size, tag_hash(tags)))
    with MessageStore.open(tmp_path, CFG) as store:
        assert store.topics_and_queues() == {
            t: sorted(q for (t2, q) in placed if t2 == t) for t in {t for t, _ in placed}
        }
    for (topic, q), entries in placed.items():
        cq = ConsumeQueue.load(tmp_path / "consumequeue", topic, q)
        assert cq.entries(0, 10_000) == entries
        cq.close()


def test_queue_spans_files_of_a_fixed_number_of_entries(tmp_path: Path) -> None:
    cq = ConsumeQueue(tmp_path, "T", 0, file_entries=10)
    for i in range(35):
        cq.append(i * 100, 10, i)
    names = sorted(p.name for p in (tmp_path / "T" / "0").iterdir())
    assert names == [f"{s:020d}" for s in (0, 10, 20, 30)]
    assert cq.entries(8, 5) == [(i * 100, 10, i) for i in range(8, 13)]  # across a file end
    assert cq.first_at_or_after(2050) == 21
    cq.truncate(12)  # drops whole files, cuts the one holding 12
    assert cq.max_offset == 12 and cq.file_count == 2
    cq.append(1, 2, 3)
    cq.close()
    again = ConsumeQueue.load(tmp_path, "T", 0, file_entries=10)
    assert (again.min_offset, again.max_offset) == (0, 13)
    assert again.entry(12) == (1, 2, 3) and again.entry(9) == (900, 10, 9)
    again.close()


def test_queue_min_moves_past_entries_below_the_commit_log_start(tmp_path: Path) -> None:
    cq = ConsumeQueue(tmp_path, "T", 0, file_entries=10)
    for i in range(35):
        cq.append(i * 100, 10, i)
    assert cq.correct_min(0) == 0
    assert cq.correct_min(2450) == 25  # entries 0..24 point below 2450
    assert cq.min_offset == 25 and cq.entry(24) is None and cq.entries(20, 10)[:1] == []
    assert cq.entries(25, 2) == [(2500, 10, 25), (2600, 10, 26)]
    gone = cq.detach_expired()
    assert [p.name for p, _ in gone] == [f"{0:020d}", f"{10:020d}"]
    assert all(size == 10 * ENTRY_SIZE for _, size in gone)
    for p, _ in gone:
        p.unlink()
    assert cq.correct_min(10**9) == 10  # every entry is dead now ...
    assert (cq.min_offset, cq.max_offset) == (35, 35)
    assert [p.name for p, _ in cq.detach_expired()] == [f"{20:020d}"]  # ... the last file stays
    cq.close()
    loaded = ConsumeQueue.load(tmp_path, "T", 0, file_entries=10)
    assert (loaded.min_offset, loaded.max_offset, len(loaded)) == (20, 35, 15)
    loaded.close()


def test_load_keeps_the_contiguous_files_and_an_old_single_file(tmp_path: Path) -> None:
    old = ConsumeQueue(tmp_path, "T", 0)  # one big file, as before queues had several
    for i in range(25):
        old.append(i, 1, 0)
    old.close()
    cq = ConsumeQueue.load(tmp_path, "T", 0, file_entries=10)
    cq.append(25, 1, 0)  # the big file is full for the new size: a second file starts
    assert [p.name for p in sorted((tmp_path / "T" / "0").iterdir())] == [
        f"{0:020d}",
        f"{25:020d}",
    ]
    assert cq.entries(20, 10) == [(i, 1, 0) for i in range(20, 26)]
    cq.close()
    # a stray file that does not lead into the others (an interrupted rebase) goes
    (tmp_path / "T" / "0" / f"{3:020d}").write_bytes(b"\0" * ENTRY_SIZE)
    (tmp_path / "T" / "0" / f"{0:020d}").rename(tmp_path / "T" / "0" / f"{1:020d}")
    cq = ConsumeQueue.load(tmp_path, "T", 0, file_entries=10)
    assert (cq.min_offset, cq.max_offset) == (25, 26)
    assert sorted(p.name for p in (tmp_path / "T" / "0").iterdir()) == [f"{25:020d}"]
    cq.close()


def test_file_cache_closes_the_least_recently_used(tmp_path: Path) -> None:
    paths = [tmp_path / f"f{i}" for i in range(5)]
    for p in paths:
        p.write_bytes(b"x")
    cache = FileCache(3)
    fds = [cache.fd(p) for p in paths[:3]]
    assert cache.fd(paths[0]) == fds[0]  # a hit, now most recent
    cache.fd(paths[3])  # evicts f1
    assert paths[1] not in cache and paths[0] in cache and len(cache) == 3
    with pytest.raises(OSError):
        os.fstat(fds[1])
    own = os.open(paths[4], os.O_RDONLY)
    cache.adopt(paths[4], own)  # evicts f2
    assert cache.take(paths[4]) == own and paths[4] not in cache
    os.close(own)
    cache.forget(paths[0])
    assert len(cache) == 1 and cache.opens == 4
    cache.close()
    assert len(cache) == 0
