"""Crash recovery: torn tails, corrupt records, consume queues out of step."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from broker_agent.store import GetMessageStatus, MessageStore, PutResult, StoreConfig
from ha_controller.protocol.record import BLANK, iter_records

SEG = 64 * 1024
CFG = StoreConfig(segment_size_bytes=SEG, max_message_size_bytes=16 * 1024)


def body(i: int, size: int = 300) -> bytes:
    return (b"%06d-" % i) * (size // 7 + 1)


def populate(path: Path, n: int, size: int = 300, config: StoreConfig = CFG) -> list[PutResult]:
    with MessageStore.open(path, config) as store:
        return [store.put("T", i % 3, body(i, size), {"TAGS": f"t{i % 2}"}) for i in range(n)]


def segment_of(path: Path, offset: int) -> Path:
    return path / "commitlog" / f"{offset - offset % SEG:020d}"


def assert_consistent(store: MessageStore, expected: dict[tuple[int, int], bytes]) -> None:
    """Exactly ``expected`` (queue, offset) -> body is readable; queues agree with the log."""
    seen: dict[tuple[int, int], bytes] = {}
    for q in store.topics_and_queues().get("T", []):
        lo, hi = store.min_offset("T", q), store.max_offset("T", q)
        got = store.get_messages("T", q, lo, 10_000, 1 << 30)
        if hi > lo:
            assert got.status is GetMessageStatus.FOUND
        assert [m.queue_offset for m in got.messages] == list(range(lo, hi))
        for m in got.messages:
            seen[(q, m.queue_offset)] = m.body
    assert seen == expected
    # every commit-log record is indexed by its consume queue at its physical offset
    data = store.read_commitlog(store.commitlog_min_offset, 1 << 30)
    count = 0
    for pos, rec, _ in iter_records(data):
        if rec is BLANK:
            continue
        at = store.get_message_at(rec.topic, rec.queue_id, rec.queue_offset)
        assert at is not None and at.physical_offset == store.commitlog_min_offset + pos
        count += 1
    assert count == len(expected)
    assert store.corrupt_reads == 0


def expected_of(results: list[PutResult], n: int, size: int = 300) -> dict[tuple[int, int], bytes]:
    return {(i % 3, results[i].queue_offset): body(i, size) for i in range(n)}


def test_torn_tail_at_every_byte_of_the_last_record(tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    results = populate(pristine, 600, size=60)
    last = results[-1]
    seg = segment_of(pristine, last.physical_offset)
    assert int(seg.name) > 0  # the tail is not in the first segment
    for cut in range(last.physical_offset, last.physical_offset + last.size):
        work = tmp_path / f"cut{cut}"
        shutil.copytree(pristine, work)
        os.truncate(segment_of(work, cut), cut - int(seg.name))
        with MessageStore.open(work, CFG) as store:
            assert store.commitlog_max_offset == last.physical_offset
            assert store.max_offset("T", 599 % 3) == last.queue_offset
            assert store.get_message_at("T", 599 % 3, last.queue_offset) is None
            assert_consistent(store, expected_of(results, 599, size=60))
            again = store.put("T", 599 % 3, b"again")
            assert (again.physical_offset, again.queue_offset) == (
                last.physical_offset,
                last.queue_offset,
            )
        shutil.rmtree(work)


def test_zero_filled_tail_is_dropped(tmp_path: Path) -> None:
    results = populate(tmp_path, 20)
    seg = segment_of(tmp_path, results[-1].physical_offset)
    with seg.open("ab") as f:
        f.write(bytes(5000))
    with MessageStore.open(tmp_path, CFG) as store:
        assert store.commitlog_max_offset == results[-1].physical_offset + results[-1].size
        assert_consistent(store, expected_of(results, 20))


def test_flipped_byte_in_a_middle_record_truncates_from_it(tmp_path: Path) -> None:
    results = populate(tmp_path, 400)
    victim = results[150]
    assert victim.physical_offset // SEG < results[-1].physical_offset // SEG
    seg = segment_of(tmp_path, victim.physical_offset)
    with seg.open("r+b") as f:
        f.seek(victim.physical_offset - int(seg.name) + victim.size - 3)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x40]))
    with MessageStore.open(tmp_path, CFG) as store:
        assert store.commitlog_max_offset == victim.physical_offset
        assert store.get_message_at("T", 150 % 3, victim.queue_offset) is None
        assert_consistent(store, expected_of(results, 150))
        # later segments are gone
        names = sorted(p.name for p in (tmp_path / "commitlog").iterdir())
        assert names[-1] == seg.name


def test_corrupt_record_outside_the_verified_window_is_never_served(tmp_path: Path) -> None:
    config = StoreConfig(
        segment_size_bytes=SEG, max_message_size_bytes=16 * 1024, recovery_verify_segments=1
    )
    results = populate(tmp_path, 400, config=config)
    victim = results[10]
    seg = segment_of(tmp_path, victim.physical_offset)
    with seg.open("r+b") as f:
        f.seek(victim.physical_offset - int(seg.name) + victim.size - 1)
        f.write(b"\xee")
    with MessageStore.open(tmp_path, config) as store:
        # recovery trusted the checkpoint and did not walk that segment ...
        assert store.commitlog_max_offset == results[-1].physical_offset + results[-1].size
        # ... but reads verify the CRC and skip the record rather than serve it
        q = 10 % 3
        assert store.get_message_at("T", q, victim.queue_offset) is None
        got = store.get_messages("T", q, 0, 1000, 1 << 30)
        assert victim.queue_offset not in [m.queue_offset for m in got.messages]
        assert len(got.messages) == store.max_offset("T", q) - 1
        assert store.corrupt_reads >= 2


def test_consume_queue_entries_past_the_log_end_are_removed(tmp_path: Path) -> None:
    results = populate(tmp_path, 100)
    keep = results[59]
    end = keep.physical_offset + keep.size
    seg = segment_of(tmp_path, end)
    os.truncate(seg, end - int(seg.name))
    for later in sorted((tmp_path / "commitlog").iterdir()):
        if int(later.name) > int(seg.name):
            later.unlink()
    with MessageStore.open(tmp_path, CFG) as store:
        assert store.commitlog_max_offset == end
        assert_consistent(store, expected_of(results, 60))
        assert sum(store.max_offset("T", q) for q in range(3)) == 60


def test_missing_and_torn_consume_queues_are_rebuilt(tmp_path: Path) -> None:
    results = populate(tmp_path, 900)
    assert results[-1].physical_offset > 4 * SEG  # more segments than the verify window
    cq_root = tmp_path / "consumequeue" / "T"
    shutil.rmtree(cq_root / "1")
    q2 = next((cq_root / "2").iterdir())
    os.truncate(q2, q2.stat().st_size - 27)  # one whole entry and a torn one
    with MessageStore.open(tmp_path, CFG) as store:
        assert_consistent(store, expected_of(results, 900))


def test_corrupt_consume_queue_entry_is_rewritten(tmp_path: Path) -> None:
    results = populate(tmp_path, 50)
    q0 = next((tmp_path / "consumequeue" / "T" / "0").iterdir())
    data = bytearray(q0.read_bytes())
    data[-20:] = bytes(20)
    q0.write_bytes(bytes(data))
    with MessageStore.open(tmp_path, CFG) as store:
        assert_consistent(store, expected_of(results, 50))


def test_broken_checkpoint_falls_back_to_a_full_walk(tmp_path: Path) -> None:
    results = populate(tmp_path, 300)
    (tmp_path / "checkpoint").write_bytes(os.urandom(1100))
    with MessageStore.open(tmp_path, CFG) as store:
        assert_consistent(store, expected_of(results, 300))


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_reopen_many_times_keeps_everything(tmp_path: Path, mode: str) -> None:
    config = StoreConfig(
        segment_size_bytes=SEG,
        max_message_size_bytes=16 * 1024,
        flush_mode=mode,  # type: ignore[arg-type]
    )
    expected: dict[tuple[int, int], bytes] = {}
    i = 0
    for _ in range(4):
        with MessageStore.open(tmp_path, config) as store:
            assert_consistent(store, expected)
            for _ in range(40):
                r = store.put("T", i % 3, body(i))
                expected[(i % 3, r.queue_offset)] = body(i)
                i += 1
            store.flush()
