"""Crash recovery: torn tails, corrupt records, consume queues out of step."""

from __future__ import annotations

import os
import shutil
import struct
import zlib
from pathlib import Path
from typing import Literal

import pytest

from broker_agent.store import GetMessageStatus, MessageStore, PutResult, StoreConfig
from broker_agent.store.checkpoint import CheckpointFile
from ha_controller.protocol.errors import RecordUnderRepair
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
    # the record is below the checkpoint: only a verify window reaching back to it walks it
    config = StoreConfig(
        segment_size_bytes=SEG, max_message_size_bytes=16 * 1024, recovery_verify_segments=3
    )
    results = populate(tmp_path, 400, config=config)
    victim = results[150]
    assert victim.physical_offset // SEG < results[-1].physical_offset // SEG
    seg = segment_of(tmp_path, victim.physical_offset)
    with seg.open("r+b") as f:
        f.seek(victim.physical_offset - int(seg.name) + victim.size - 3)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x40]))
    with MessageStore.open(tmp_path, config) as store:
        assert store.commitlog_max_offset == victim.physical_offset
        assert store.get_message_at("T", 150 % 3, victim.queue_offset) is None
        assert_consistent(store, expected_of(results, 150))
        # later segments are gone
        names = sorted(p.name for p in (tmp_path / "commitlog").iterdir())
        assert names[-1] == seg.name


def test_corrupt_record_outside_the_verified_window_is_never_served_nor_passed(
    tmp_path: Path,
) -> None:
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
        # ... but reads verify the CRC: the record is refused, and readers stop at it
        # (it waits for a replica's copy, see store.repair) instead of moving past it
        q = 10 % 3
        with pytest.raises(RecordUnderRepair):
            store.get_message_at("T", q, victim.queue_offset)
        got = store.get_messages("T", q, 0, 1000, 1 << 30)
        assert got.status is GetMessageStatus.FOUND
        assert [m.queue_offset for m in got.messages] == list(range(victim.queue_offset))
        assert got.next_begin_offset == victim.queue_offset
        again = store.get_messages("T", q, victim.queue_offset, 1000, 1 << 30)
        assert again.status is GetMessageStatus.RECORD_UNDER_REPAIR
        assert again.next_begin_offset == victim.queue_offset
        assert [(d.start, d.end) for d in store.damaged()] == [
            (victim.physical_offset, victim.physical_offset + victim.size)
        ]
        assert store.corrupt_reads >= 1


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
        assert store.recovered_from == 0
        assert_consistent(store, expected_of(results, 300))


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_reopen_many_times_keeps_everything(tmp_path: Path, mode: Literal["async", "sync"]) -> None:
    config = StoreConfig(
        segment_size_bytes=SEG,
        max_message_size_bytes=16 * 1024,
        flush_mode=mode,
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


def flip_byte(path: Path, offset: int, size: int) -> None:
    """Flip a byte near the end of the record at ``offset`` (its body: the CRC fails)."""
    seg = segment_of(path, offset)
    with seg.open("r+b") as f:
        f.seek(offset - int(seg.name) + size - 3)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x40]))


def crash_image(tmp_path: Path, flushed: int, tail: int) -> tuple[Path, list[PutResult], int]:
    """A store as a kill -9 leaves it: ``flushed`` records under a checkpoint, then
    ``tail`` more written but not flushed; returns (copy, results, checkpoint offset)."""
    live, image = tmp_path / "live", tmp_path / "image"
    with MessageStore.open(live, CFG) as store:
        results = [store.put("T", i % 3, body(i), {"TAGS": "t"}) for i in range(flushed)]
        checkpoint = store.flush()
        results += [store.put("T", i % 3, body(i), {"TAGS": "t"}) for i in range(flushed, tail)]
        shutil.copytree(live, image)  # the files as they are while the process runs
    return image, results, checkpoint


def test_clean_restart_verifies_nothing(tmp_path: Path) -> None:
    results = populate(tmp_path, 800)
    with MessageStore.open(tmp_path, CFG) as store:
        assert store.recovered_from == store.commitlog_max_offset > 3 * SEG
        assert_consistent(store, expected_of(results, 800))


def test_only_the_tail_past_the_checkpoint_is_verified_and_a_corrupt_record_there_cut(
    tmp_path: Path,
) -> None:
    image, results, checkpoint = crash_image(tmp_path, 500, 560)
    assert checkpoint == results[500].physical_offset and checkpoint // SEG >= 2
    below, bad = results[450], results[530]  # one under the checkpoint, one past it
    flip_byte(image, below.physical_offset, below.size)
    flip_byte(image, bad.physical_offset, bad.size)
    with MessageStore.open(image, CFG) as store:
        assert store.recovered_from == checkpoint
        # the tail is cut at its corrupt record ...
        assert store.commitlog_max_offset == bad.physical_offset
        assert store.get_message_at("T", 530 % 3, bad.queue_offset) is None
        assert store.max_offset("T", 530 % 3) == bad.queue_offset
        # ... the log under the checkpoint was not walked (a full walk would cut it at
        # 450), and reads still refuse the record that fails its CRC
        with pytest.raises(RecordUnderRepair):
            store.get_message_at("T", 450 % 3, below.queue_offset)
        assert store.corrupt_reads == 1
        for i in (*range(440, 450), *range(451, 530)):
            msg = store.get_message_at("T", i % 3, results[i].queue_offset)
            assert msg is not None and msg.body == body(i)
        assert sum(store.max_offset("T", q) for q in range(3)) == 530


def test_torn_record_past_the_checkpoint_is_truncated(tmp_path: Path) -> None:
    image, results, checkpoint = crash_image(tmp_path, 200, 230)
    torn = results[220]
    os.truncate(segment_of(image, torn.physical_offset), torn.physical_offset % SEG + 9)
    with MessageStore.open(image, CFG) as store:
        assert store.recovered_from == checkpoint
        assert store.commitlog_max_offset == torn.physical_offset
        assert_consistent(store, expected_of(results, 220))


@pytest.mark.parametrize("where", ["past-the-end", "mid-record", "wrong-count", "random"])
def test_stale_or_corrupt_checkpoint_falls_back_to_a_full_walk(tmp_path: Path, where: str) -> None:
    results = populate(tmp_path, 400)
    end = results[-1].physical_offset + results[-1].size
    inside = results[300].physical_offset + 10  # not a record boundary
    path = tmp_path / "checkpoint"
    if where == "random":
        path.write_bytes(os.urandom(1100))
    else:
        cp = CheckpointFile(path)
        last = cp.load()
        assert last is not None and last.queue_entries == 400
        offset, entries = {
            "past-the-end": (end + 4096, 400),
            "mid-record": (inside, 301),  # as many entries as lie below it
            "wrong-count": (end, 399),  # a consume queue lost an entry meanwhile
        }[where]
        cp.write(offset, offset, entries, clean=True)
        cp.close()
    with MessageStore.open(tmp_path, CFG) as store:
        assert store.recovered_from == 0
        assert_consistent(store, expected_of(results, 400))


def test_version_1_checkpoint_is_read_and_recovers_with_the_old_window(tmp_path: Path) -> None:
    results = populate(tmp_path, 800)
    end = results[-1].physical_offset + results[-1].size
    body_v1 = struct.pack(">IHHQQQQ", 0x4841434B, 1, 1, 99, end, end, 0)
    (tmp_path / "checkpoint").write_bytes(body_v1 + struct.pack(">I", zlib.crc32(body_v1)))
    with MessageStore.open(tmp_path, CFG) as store:
        starts = sorted(int(p.name) for p in (tmp_path / "commitlog").iterdir())
        assert len(starts) > 3
        assert store.recovered_from == starts[-3]
        assert_consistent(store, expected_of(results, 800))
