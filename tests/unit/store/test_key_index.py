"""The key index: as a plain object (append, lookup, rebuild, retention, bound) and
through the store (put, replicated reput, recovery, cut back, query by key and id)."""

from __future__ import annotations

import logging
import os
import struct
import time
import zlib
from array import array
from pathlib import Path

import pytest

from broker_agent.store import MessageStore, StoreConfig
from broker_agent.store.keyindex import CHUNK_HEAD, ENTRY_SIZE, KeyIndex, key_hash, uniq_hash
from ha_controller.protocol.record import make_msg_id

SEG = 8 * 1024
HOST = "127.0.0.1:10911"
CFG = StoreConfig(
    segment_size_bytes=SEG,
    max_message_size_bytes=2048,
    file_reserved_time_ms=3_600_000,
    disk_max_used_space_ratio=1.0,
)


def index(root: Path, max_entries: int = 1000) -> KeyIndex:
    return KeyIndex(root, SEG, max_entries)


# --- the plain object -------------------------------------------------------------------


def test_append_and_lookup_one_entry_per_key(tmp_path: Path) -> None:
    ki = index(tmp_path / "i")
    assert ki.load(0, 0) == 0
    assert ki.add("T", "order-1 order-2", "U1", 0, 100) == 3
    assert ki.add("T", "order-1", None, 100, 100) == 1
    assert ki.add("T", "order-1", None, 100, 100) == 0  # seen again (reput): skipped
    ki.commit()
    assert ki.lookup(key_hash("T", "order-1")) == [0, 100]
    assert ki.lookup(key_hash("T", "order-2")) == [0]
    assert ki.lookup(uniq_hash("U1")) == [0]
    assert ki.lookup(key_hash("OTHER", "order-1")) == []
    assert (ki.entries, ki.indexed_to) == (4, 200)
    # one chunk: its head, then the four entries
    assert (tmp_path / "i" / f"{0:020d}").stat().st_size == CHUNK_HEAD.size + 4 * ENTRY_SIZE
    ki.close()


def fill(ki: KeyIndex, n: int, size: int = 1000, first: int = 0) -> None:
    for i in range(first, first + n):
        ki.add("T", f"k{i} common", None, i * size, size)
    ki.commit()


def test_reload_resumes_at_the_point_after_a_clean_close(tmp_path: Path) -> None:
    ki = index(tmp_path / "i")
    ki.load(0, 0)
    fill(ki, 20)
    ki.close()
    again = index(tmp_path / "i")
    assert again.load(0, 20_000) == 20_000
    assert again.lookup(key_hash("T", "common")) == [i * 1000 for i in range(20)]
    assert again.entries == 40


def test_reload_after_a_torn_chunk_indexes_its_records_again(tmp_path: Path) -> None:
    ki = index(tmp_path / "i")
    ki.load(0, 0)
    fill(ki, 4)  # one chunk covering records 0..3
    fill(ki, 1, first=4)  # and one for record 4; never synced: no point
    if ki._fd:
        os.close(ki._fd)  # a crash: nothing more is written
    path = tmp_path / "i" / f"{0:020d}"
    os.truncate(path, path.stat().st_size - 3)  # the last chunk is torn
    again = index(tmp_path / "i")
    # the torn chunk goes: record 4 is indexed again from its offset
    assert again.load(0, 5000) == 4000
    assert path.stat().st_size == CHUNK_HEAD.size + 8 * ENTRY_SIZE
    assert again.lookup(key_hash("T", "k4")) == []
    assert again.lookup(key_hash("T", "common")) == [0, 1000, 2000, 3000]
    assert again.add("T", "k4 common", None, 4000, 1000) == 2
    assert again.lookup(key_hash("T", "common")) == [0, 1000, 2000, 3000, 4000]


def test_a_corrupt_or_missing_file_rebuilds_from_the_log_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ki = index(tmp_path / "i")
    ki.load(0, 0)
    fill(ki, 12)  # two files: offsets 0..7999 and 8000..11999
    ki.close()
    first = tmp_path / "i" / f"{0:020d}"
    data = bytearray(first.read_bytes())
    data[CHUNK_HEAD.size + ENTRY_SIZE + 5] ^= 0xFF  # in the second entry's hash
    first.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        again = index(tmp_path / "i")
        assert again.load(0, 12_000) == 0
    assert "fails its CRC; rebuilding it from the commit log at 0" in caplog.text
    assert again.entries == 0
    assert [p.name for p in (tmp_path / "i").iterdir()] == ["point"]
    fill(again, 12)
    again.close()
    # a file gone: the point's entry count shows it
    (tmp_path / "i" / f"{SEG:020d}").unlink()
    third = index(tmp_path / "i")
    assert third.load(0, 12_000) == 0
    assert third.entries == 0


def test_retention_drops_entries_and_files_below_the_log_start(tmp_path: Path) -> None:
    ki = index(tmp_path / "i")
    ki.load(0, 0)
    fill(ki, 20)  # files at 0, 8192, 16384
    assert ki.drop_below(2 * SEG) == 2 * 17  # 17 records below 16384, two keys each
    assert ki.lookup(key_hash("T", "k0")) == []
    assert ki.lookup(key_hash("T", "common")) == [17_000, 18_000, 19_000]
    assert sorted(p.name for p in (tmp_path / "i").iterdir() if p.name.isdigit()) == [
        f"{2 * SEG:020d}"
    ]
    ki.close()
    again = index(tmp_path / "i")
    assert again.load(2 * SEG, 20_000) == 20_000
    assert again.lookup(key_hash("T", "common")) == [17_000, 18_000, 19_000]


def test_the_bound_counts_keys_not_indexed(tmp_path: Path) -> None:
    ki = index(tmp_path / "i", max_entries=5)
    ki.load(0, 0)
    fill(ki, 4)
    assert (ki.entries, ki.overflow) == (4, 4)  # two records fit, two of two keys did not
    assert ki.lookup(key_hash("T", "k3")) == []
    ki.drop_below(SEG)  # retention makes room again
    assert ki.add("T", "late", None, 9000, 10) == 1


def test_truncate_drops_entries_from_a_cut_back_on(tmp_path: Path) -> None:
    ki = index(tmp_path / "i")
    ki.load(0, 0)
    fill(ki, 12)
    ki.truncate(5000)
    assert ki.lookup(key_hash("T", "common")) == [0, 1000, 2000, 3000, 4000]
    assert ki.indexed_to == 5000
    assert ki.add("T", "new", None, 5000, 10) == 1
    ki.close()
    again = index(tmp_path / "i")
    assert again.load(0, 5010) == 5010
    assert again.lookup(key_hash("T", "common")) == [0, 1000, 2000, 3000, 4000]
    assert again.lookup(key_hash("T", "new")) == [5000]


def test_a_batch_across_segments_writes_a_chunk_to_each_file(tmp_path: Path) -> None:
    ki = index(tmp_path / "i")
    ki.load(0, 0)
    batch = [("T", f"k{i} common", f"U{i}", i * 1000, 1000) for i in range(12)]
    assert ki.add_many(batch) == 36
    assert ki.add_many(batch) == 0  # seen again (reput): skipped
    ki.close()
    sizes = {p.name: p.stat().st_size for p in (tmp_path / "i").iterdir() if p.name.isdigit()}
    # records 0..8 lie in the first segment, 9..11 in the second
    assert sizes == {
        f"{0:020d}": CHUNK_HEAD.size + 27 * ENTRY_SIZE,
        f"{SEG:020d}": CHUNK_HEAD.size + 9 * ENTRY_SIZE,
    }
    again = index(tmp_path / "i")
    assert again.load(0, 12_000) == 12_000
    assert again.lookup(key_hash("T", "common")) == [i * 1000 for i in range(12)]
    assert again.lookup(uniq_hash("U10")) == [10_000]


def test_a_lookup_does_not_match_the_bytes_between_two_hashes(tmp_path: Path) -> None:
    ki = index(tmp_path / "i")
    ki.load(0, 0)
    ki.add("T", "a b", None, 0, 100)
    raw = array("I", [key_hash("T", "a"), key_hash("T", "b")]).tobytes()
    between = array("I", raw[2:6])[0]  # the last two bytes of one, the first two of the next
    assert ki.lookup(between) == []
    assert ki.lookup(key_hash("T", "b")) == [0]


def test_files_of_the_earlier_layout_are_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "i"
    root.mkdir()
    # hash u32 | offset u64 | store time u64 | crc32 u32, big-endian, as until 2026-12-08
    body = struct.pack(">IQQ", key_hash("T", "k"), 0, 5)
    (root / f"{0:020d}").write_bytes(body + zlib.crc32(body).to_bytes(4, "big"))
    with caplog.at_level(logging.WARNING):
        ki = index(root)
        assert ki.load(0, 1000) == 0
    assert "does not start a chunk; rebuilding it from the commit log at 0" in caplog.text
    assert ki.entries == 0


# --- through the store ------------------------------------------------------------------


def put(store: MessageStore, i: int, keys: str) -> str:
    return store.put(
        "T", i % 2, b"x" * 50, {"KEYS": keys, "UNIQ_KEY": f"U{i}"}, store_host=HOST
    ).msg_id


def test_store_queries_by_key_id_and_time_across_a_restart(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path / "s", CFG) as store:
        ids = [put(store, i, f"order-{i % 3} all") for i in range(30)]
        store.put("T", 0, b"no keys")
        got = store.query_by_key("T", "order-1")
        assert [m.uniq_key for m in got] == [f"U{i}" for i in range(28, 0, -3)]
        assert len(store.query_by_key("T", "all", max_num=7)) == 7
        assert store.query_by_key("OTHER", "order-1") == []
        mid = got[4].store_ts_ms
        assert all(m.store_ts_ms >= mid for m in store.query_by_key("T", "all", begin_ms=mid))
        assert store.query_by_key("T", "all", end_ms=0) == []
        assert [m.body for m in store.query_by_id("U7")] == [b"x" * 50]
        # an offset message id reads its record, also when it was never keyed
        assert store.query_by_id(ids[3])[0].uniq_key == "U3"
        assert store.query_by_id(make_msg_id("10.0.0.9:1", 0)) == []  # another broker's
        assert store.query_by_id(make_msg_id(HOST, 7)) == []  # inside a record
        assert store.query_by_id(make_msg_id(HOST, 1 << 40)) == []  # past the log
        assert store.query_by_id("nothing") == []
    # reopened: the index is loaded (and would be rebuilt without its files)
    with MessageStore.open(tmp_path / "s", CFG) as store:
        assert len(store.query_by_key("T", "order-1")) == 10
        put(store, 99, "order-1")
        assert store.query_by_key("T", "order-1")[0].uniq_key == "U99"
    for p in (tmp_path / "s" / "index").iterdir():
        p.unlink()
    with MessageStore.open(tmp_path / "s", CFG) as store:
        assert len(store.query_by_key("T", "order-1")) == 11
        assert store.key_index_stats["entries"] == 31 * 2 + 30


def test_a_slave_indexes_replicated_records_and_forgets_cut_ones(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path / "m", CFG) as master:
        for i in range(10):
            put(master, i, f"k{i}")
        data = master.read_commitlog(0, 1 << 20)
    with MessageStore.open(tmp_path / "s", CFG) as slave:
        slave.append_replicated(0, data)
        assert slave.query_by_key("T", "k3") == []  # not dispatched yet
        slave.reput()
        assert [m.uniq_key for m in slave.query_by_key("T", "k3")] == ["U3"]
        cut = slave.query_by_key("T", "k5")[0].physical_offset
        slave.cut_back(cut)
        assert slave.query_by_key("T", "k5") == [] and slave.query_by_id("U9") == []
        assert slave.query_by_key("T", "k4") != []


def test_retention_drops_the_keys_of_deleted_segments(tmp_path: Path) -> None:
    store_dir = tmp_path / "s"
    with MessageStore.open(store_dir, CFG) as store:
        for i in range(400):
            put(store, i, "k")
        old = time.time() - 7200
        for p in sorted((store_dir / "commitlog").iterdir())[:-1]:
            os.utime(p, (old, old))
        while store.clean_expired_files(hour=4).more:
            pass
        cl_min = store.commitlog_min_offset
        assert cl_min > 0
        got = store.query_by_key("T", "k", max_num=1000)
        assert got and all(m.physical_offset >= cl_min for m in got)
        assert store.key_index_stats["entries"] == 2 * len(got)
        store.flush()  # (the newest entries are written by a flush)
        assert int(min(p.name for p in (store_dir / "index").iterdir() if p.name.isdigit())) > 0


def test_a_point_past_a_truncated_log_is_not_trusted_once_the_log_grows_again(
    tmp_path: Path,
) -> None:
    ki = index(tmp_path / "i")
    ki.load(0, 0)
    fill(ki, 10)
    ki.close()  # point 10000
    # recovery truncated the log at 6000: records 6..9 are gone
    cut = index(tmp_path / "i")
    assert cut.load(0, 6000) == 5000  # the last record left is indexed again
    if cut._fd:
        os.close(cut._fd)  # a crash before any flush
    # the log grew past the old point with other records: indexing resumes at 5000
    again = index(tmp_path / "i")
    assert again.load(0, 12_000) == 5000
    assert again.lookup(key_hash("T", "k7")) == []
