"""Retention: the decision, segment deletion, consume queues that follow, and reopening."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from broker_agent.core import store_config
from broker_agent.store import GetMessageStatus, MessageStore, PutResult, StoreConfig
from broker_agent.store.commitlog import SegmentInfo
from broker_agent.store.retention import RetentionPolicy, decide, parse_delete_when
from ha_controller.config import load_broker_config
from ha_controller.protocol.errors import ConfigError

SEG = 8 * 1024
HOUR_MS = 3_600_000
CFG = StoreConfig(
    segment_size_bytes=SEG,
    max_message_size_bytes=2048,
    file_reserved_time_ms=HOUR_MS,
    delete_when="04",
    disk_max_used_space_ratio=1.0,  # space never triggers; the hour does
    consume_queue_file_entries=8,
)
POLICY = RetentionPolicy(HOUR_MS, frozenset({4}), 0.75)


def seg(i: int, mtime_ms: int) -> SegmentInfo:
    return SegmentInfo(i * SEG, (i + 1) * SEG, mtime_ms, Path(f"{i * SEG:020d}"))


# --- the decision -----------------------------------------------------------------------


def test_delete_when_parses_rocketmq_hour_lists() -> None:
    assert parse_delete_when("04") == {4}
    assert parse_delete_when("4;05; 23") == {4, 5, 23}
    for bad in ("", "24", "04;", "4h", "-1"):
        with pytest.raises(ValueError, match="hours of day"):
            parse_delete_when(bad)
    with pytest.raises(ConfigError, match="delete_when"):
        StoreConfig(delete_when="25")


def test_nothing_is_due_outside_the_hours_with_room_on_disk() -> None:
    old = [seg(i, 0) for i in range(5)]
    d = decide(POLICY, old, now_ms=10 * HOUR_MS, hour=3, used_ratio=0.5, replica_limit=None)
    assert d.segments == 0 and "not due" in d.reason


def test_expired_segments_go_oldest_first_and_stop_at_the_first_kept() -> None:
    now = 10 * HOUR_MS
    infos = [seg(0, 0), seg(1, now - HOUR_MS), seg(2, now - HOUR_MS + 1), seg(3, 0)]
    d = decide(POLICY, infos, now_ms=now, hour=4, used_ratio=0.1, replica_limit=None)
    # segment 3 is expired too, but deletion only ever moves the start of the log
    assert d.segments == 2 and "expires in" in d.reason and not d.more


def test_a_full_disk_deletes_expired_segments_at_any_hour_but_never_unexpired_ones() -> None:
    now = 10 * HOUR_MS
    infos = [seg(0, 0), seg(1, now)]
    d = decide(POLICY, infos, now_ms=now, hour=13, used_ratio=0.8, replica_limit=None)
    assert d.segments == 1 and "80% used" in d.reason
    d = decide(POLICY, infos, now_ms=now, hour=13, used_ratio=None, replica_limit=None)
    assert d.segments == 0


def test_a_slave_that_has_not_received_a_segment_holds_it_back() -> None:
    infos = [seg(i, 0) for i in range(6)]
    d = decide(POLICY, infos, now_ms=HOUR_MS * 5, hour=4, used_ratio=0, replica_limit=3 * SEG)
    assert d.segments == 3 and "slave" in d.reason
    d = decide(POLICY, infos, now_ms=HOUR_MS * 5, hour=4, used_ratio=0, replica_limit=SEG - 1)
    assert d.segments == 0


def test_a_full_batch_says_there_is_more() -> None:
    infos = (seg(i, 0) for i in range(100))
    d = decide(POLICY, infos, now_ms=HOUR_MS * 5, hour=4, used_ratio=0, replica_limit=None)
    assert d.segments == 32 and d.more


# --- the store --------------------------------------------------------------------------


def fill(store: MessageStore, n: int, queues: int = 4, seed: int = 3) -> list[PutResult]:
    rng = random.Random(seed)
    return [
        store.put("T", i % queues, b"%06d" % i + rng.randbytes(rng.randrange(100, 900)))
        for i in range(n)
    ]


def age_files(directory: Path, older_than_ms: int) -> None:
    """Make every file in ``directory`` look last written ``older_than_ms`` ago."""
    when = time.time() - older_than_ms / 1000
    for p in directory.iterdir():
        os.utime(p, (when, when))


def clean_all(
    store: MessageStore, *, hour: int, replica_limit: int | None = None
) -> tuple[int, int]:
    segments = files = 0
    while True:
        r = store.clean_expired_files(hour=hour, replica_limit=replica_limit)
        segments += r.segments
        files += r.queue_files
        if not r.more:
            return segments, files


def readable(store: MessageStore, queues: int = 4) -> dict[tuple[int, int], bytes]:
    out: dict[tuple[int, int], bytes] = {}
    for q in range(queues):
        lo, hi = store.min_offset("T", q), store.max_offset("T", q)
        got = store.get_messages("T", q, lo, 100_000, 1 << 30)
        assert [m.queue_offset for m in got.messages] == list(range(lo, hi))
        out.update({(q, m.queue_offset): m.body for m in got.messages})
    return out


def test_expired_segments_are_deleted_and_queues_follow(tmp_path: Path) -> None:
    store_dir = tmp_path / "s"
    with MessageStore.open(store_dir, CFG) as store:
        results = fill(store, 600)
        total_segments = len(list((store_dir / "commitlog").iterdir()))
        assert total_segments > 40
        # outside delete_when nothing goes, however old
        age_files(store_dir / "commitlog", 2 * HOUR_MS)
        assert clean_all(store, hour=3) == (0, 0)
        # keep the last 10 segments young: everything stored in them must survive
        young = sorted((store_dir / "commitlog").iterdir())[-10:]
        for p in young:
            os.utime(p)
        deleted, queue_files = clean_all(store, hour=4)
        assert deleted == total_segments - 10 and queue_files > 0
        cl_min = store.commitlog_min_offset
        assert cl_min == int(young[0].name)
        kept = {
            (i % 4, r.queue_offset) for i, r in enumerate(results) if r.physical_offset >= cl_min
        }
        assert set(readable(store)) == kept
        for q in range(4):
            lo = store.min_offset("T", q)
            assert lo > 0
            got = store.get_messages("T", q, 0)
            assert (got.status, got.next_begin_offset) == (GetMessageStatus.OFFSET_TOO_SMALL, lo)
            assert store.get_message_at("T", q, lo - 1) is None
            assert store.search_offset("T", q, 0) == lo
            # the queue's files holding only deleted entries are gone
            names = sorted(int(p.name) for p in (store_dir / "consumequeue/T" / str(q)).iterdir())
            assert names[0] <= lo < names[0] + 8
        assert store.corrupt_reads == 0
        before = readable(store)
    # reopening (recovery) finds the same start and the same messages
    with MessageStore.open(store_dir, CFG) as store:
        assert store.commitlog_min_offset == cl_min
        assert readable(store) == before
        assert store.corrupt_reads == 0
        fill(store, 50, seed=9)  # and takes appends after them
        assert len(readable(store)) == len(before) + 50


def test_the_active_segment_and_what_a_slave_lacks_are_never_deleted(tmp_path: Path) -> None:
    store_dir = tmp_path / "s"
    with MessageStore.open(store_dir, CFG) as store:
        fill(store, 200)
        age_files(store_dir / "commitlog", 2 * HOUR_MS)
        limit = 5 * SEG + 100
        assert clean_all(store, hour=4, replica_limit=limit)[0] == 5
        assert store.commitlog_min_offset == 5 * SEG
        clean_all(store, hour=4)
        assert store.commitlog_min_offset == store.commitlog_max_offset - (
            store.commitlog_max_offset % SEG
        )
        assert len(list((store_dir / "commitlog").iterdir())) == 1
        assert len(readable(store)) > 0


def test_a_queue_whose_messages_are_all_deleted_moves_consumers_to_its_end(
    tmp_path: Path,
) -> None:
    store_dir = tmp_path / "s"
    with MessageStore.open(store_dir, CFG) as store:
        for i in range(30):
            store.put("OLD", 0, b"x" * 500 + b"%d" % i)
        fill(store, 200)
        age_files(store_dir / "commitlog", 2 * HOUR_MS)
        for p in sorted((store_dir / "commitlog").iterdir())[-3:]:
            os.utime(p)
        clean_all(store, hour=4)
        assert (store.min_offset("OLD", 0), store.max_offset("OLD", 0)) == (30, 30)
        got = store.get_messages("OLD", 0, 3)
        assert (got.status, got.next_begin_offset) == (GetMessageStatus.OFFSET_TOO_SMALL, 30)
        assert store.get_messages("OLD", 0, 30).status is GetMessageStatus.NO_MESSAGE_IN_QUEUE
        assert store.put("OLD", 0, b"new").queue_offset == 30
        assert store.get_messages("OLD", 0, 30).messages[0].body == b"new"


def test_a_crash_between_segment_and_queue_deletion_recovers(tmp_path: Path) -> None:
    store_dir = tmp_path / "s"
    with MessageStore.open(store_dir, CFG) as store:
        results = fill(store, 400)
    # segments removed, consume queues untouched (as if the process died in between)
    segments = sorted((store_dir / "commitlog").iterdir())
    for p in segments[:20]:
        p.unlink()
    cl_min = int(segments[20].name)
    with MessageStore.open(store_dir, CFG) as store:
        assert store.commitlog_min_offset == cl_min
        kept = {
            (i % 4, r.queue_offset) for i, r in enumerate(results) if r.physical_offset >= cl_min
        }
        assert set(readable(store)) == kept
        assert store.corrupt_reads == 0
        # the next round removes the dead consume-queue files
        assert store.clean_expired_files(hour=3).queue_files > 0
        assert set(readable(store)) == kept


def test_open_files_stay_bounded_with_many_queues(tmp_path: Path) -> None:
    cfg = StoreConfig(
        segment_size_bytes=SEG,
        max_message_size_bytes=2048,
        max_open_files=16,
        consume_queue_file_entries=2,
    )

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = fds()
    with MessageStore.open(tmp_path / "s", cfg) as store:
        for i in range(1500):  # 300 queues of 5 entries: 3 files each
            store.put(f"T{i % 3}", i % 100, b"m%d" % i)
        assert fds() - before <= 16 + 3
        for t in range(3):
            for q in range(100):
                got = store.get_messages(f"T{t}", q, 0, 100)
                assert [m.queue_offset for m in got.messages] == list(range(5))
        assert store.open_files <= 16 + 3
        assert fds() - before <= 16 + 3
        store.flush()  # dirty queues beyond the cache are synced one by one
        assert fds() - before <= 16 + 3
    with MessageStore.open(tmp_path / "s", cfg) as store:
        assert fds() - before <= 16 + 3
        assert store.get_message_at("T2", 99, 4) is not None
    assert fds() == before


def test_broker_config_reaches_the_store() -> None:
    env = {
        "HAC_BROKER_NAME": "b",
        "HAC_BROKER_ID": "0",
        "HAC_NAMESRV_ADDRS": "127.0.0.1:9876",
        "HAC_MIN_FREE_DISK_RATIO": "0.1",
        "HAC_WARN_FREE_DISK_RATIO": "0.2",
        "HAC_DISK_CHECK_INTERVAL_MS": "250",
        "HAC_FILE_RESERVED_TIME_MS": "1500",
        "HAC_DELETE_WHEN": "01;13",
        "HAC_DISK_MAX_USED_SPACE_RATIO": ".9",
        "HAC_MAX_OPEN_FILES": "32",
        "HAC_CONSUME_QUEUE_FILE_ENTRIES": "1000",
    }
    sc = store_config(load_broker_config(None, {}, env))
    assert (sc.min_free_disk_ratio, sc.warn_free_disk_ratio, sc.disk_check_interval_ms) == (
        0.1,
        0.2,
        250,
    )
    assert sc.retention == RetentionPolicy(1500, frozenset({1, 13}), 0.9)
    assert (sc.max_open_files, sc.consume_queue_file_entries) == (32, 1000)
    defaults = store_config(load_broker_config(None, {}, {k: env[k] for k in list(env)[:3]}))
    assert defaults.retention == RetentionPolicy(72 * HOUR_MS, frozenset({4}), 0.75)
    assert (defaults.min_free_disk_ratio, defaults.warn_free_disk_ratio) == (0.05, None)
    for key, bad, why in [
        ("HAC_DELETE_WHEN", "4am", "hours of day"),
        ("HAC_MIN_FREE_DISK_RATIO", "1.5", r"\[0, 1\)"),
        ("HAC_MIN_FREE_DISK_RATIO", "lots", "a number"),
        ("HAC_DISK_MAX_USED_SPACE_RATIO", "0", r"\(0, 1\]"),
        ("HAC_WARN_FREE_DISK_RATIO", "0.01", "cannot be below the hard reserve"),
    ]:
        with pytest.raises(ConfigError, match=why):
            load_broker_config(None, {}, {**env, key: bad})


def test_an_empty_replica_starts_where_the_master_now_starts(tmp_path: Path) -> None:
    with (
        MessageStore.open(tmp_path / "master", CFG) as master,
        MessageStore.open(tmp_path / "slave", CFG) as slave,
    ):
        fill(master, 300)
        age_files(tmp_path / "master" / "commitlog", 2 * HOUR_MS)
        for p in sorted((tmp_path / "master" / "commitlog").iterdir())[-4:]:
            os.utime(p)
        clean_all(master, hour=4)
        start = master.commitlog_min_offset
        assert start > 0 and not slave.can_start_replica_at(start + 1)
        assert slave.can_start_replica_at(start)
        offset = start
        while offset < master.commitlog_max_offset:
            data = master.read_commitlog(offset, 1 << 20)
            slave.append_replicated(offset, data)
            offset += len(data)
        slave.reput()
        assert slave.commitlog_min_offset == start
        assert readable(slave) == readable(master)
        assert not slave.can_start_replica_at(offset + SEG)  # not empty any more
