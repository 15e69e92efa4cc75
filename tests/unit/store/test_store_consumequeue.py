"""Consume-queue files and their agreement with the commit log."""

from __future__ import annotations

import random
from pathlib import Path

from broker_agent.store import MessageStore, StoreConfig
from broker_agent.store.consumequeue import ENTRY_SIZE, ConsumeQueue
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
