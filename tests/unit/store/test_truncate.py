"""Cutting an open store back to an earlier record boundary (broker_agent.store.truncate)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from broker_agent.store import GetMessageStatus, MessageStore, PutResult, StoreConfig
from broker_agent.store.consumequeue import ConsumeQueue
from broker_agent.store.truncate import MARKER, pending_cut
from ha_controller.protocol.errors import OffsetOutOfRange, StoreError
from ha_controller.protocol.record import BLANK, iter_records

SEG = 64 * 1024
CFG = StoreConfig(segment_size_bytes=SEG, max_message_size_bytes=16 * 1024)
TOPICS = ("T", "U")


def body(i: int) -> bytes:
    return (b"%06d-" % i) * 40


def fill(store: MessageStore, start: int, n: int) -> list[PutResult]:
    return [
        store.put(TOPICS[i % 2], i % 3, body(i), {"TAGS": f"t{i % 2}"})
        for i in range(start, start + n)
    ]


def readable(store: MessageStore) -> dict[tuple[str, int, int], bytes]:
    """Every message the consume queues serve, checked against the commit log."""
    seen: dict[tuple[str, int, int], bytes] = {}
    for topic, queues in store.topics_and_queues().items():
        for q in queues:
            lo, hi = store.min_offset(topic, q), store.max_offset(topic, q)
            got = store.get_messages(topic, q, lo, 10_000, 1 << 30)
            if hi > lo:
                assert got.status is GetMessageStatus.FOUND
            assert [m.queue_offset for m in got.messages] == list(range(lo, hi))
            seen.update({(topic, q, m.queue_offset): m.body for m in got.messages})
    # every record of the log is indexed at its physical offset, and nothing else
    data = store.read_commitlog(store.commitlog_min_offset, 1 << 30)
    records = 0
    for pos, rec, _ in iter_records(data):
        if rec is BLANK:
            continue
        at = store.get_message_at(rec.topic, rec.queue_id, rec.queue_offset)
        assert at is not None and at.physical_offset == store.commitlog_min_offset + pos
        records += 1
    assert records == len(seen)
    assert store.corrupt_reads == 0
    return seen


def expected(results: list[PutResult], n: int) -> dict[tuple[str, int, int], bytes]:
    return {(TOPICS[i % 2], i % 3, results[i].queue_offset): body(i) for i in range(n)}


def test_cut_drops_the_tail_its_segments_and_queue_entries(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path, CFG) as store:
        results = fill(store, 0, 600)
        store.flush()
        cut = results[250].physical_offset
        assert store.commitlog_max_offset // SEG > cut // SEG + 1  # later segments go too
        result = store.cut_back(cut)
        assert (result.offset, result.dropped_entries) == (cut, 350)
        assert store.commitlog_max_offset == cut
        assert readable(store) == expected(results, 250)
        # appends go on right behind the cut, with the queue offsets that follow
        more = fill(store, 250, 50)
        assert more[0].physical_offset == cut
        assert [r.queue_offset for r in more] == [r.queue_offset for r in results[250:300]]
        assert not (tmp_path / MARKER).exists()
    # ... and a restart sees the same store
    with MessageStore.open(tmp_path, CFG) as store:
        assert readable(store) == expected(results, 300)  # same queue offsets and bodies
        assert store.recovered_from == store.commitlog_max_offset  # the checkpoint held


def test_cut_then_kill_recovers_to_the_cut(tmp_path: Path) -> None:
    live, image = tmp_path / "live", tmp_path / "image"
    with MessageStore.open(live, CFG) as store:
        results = fill(store, 0, 400)
        store.cut_back(results[123].physical_offset)
        shutil.copytree(live, image)  # the files as a kill -9 right now leaves them
    with MessageStore.open(image, CFG) as store:
        assert store.commitlog_max_offset == results[123].physical_offset
        assert readable(store) == expected(results, 123)


def test_a_cut_inside_a_record_or_outside_the_log_changes_nothing(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path, CFG) as store:
        results = fill(store, 0, 100)
        end = store.commitlog_max_offset
        for bad in (results[40].physical_offset + 7, end + 1, -1):
            with pytest.raises(OffsetOutOfRange):
                store.cut_back(bad)
        assert store.commitlog_max_offset == end
        assert readable(store) == expected(results, 100)
        assert not (tmp_path / MARKER).exists()
        store.cut_back(end)  # the end itself: nothing to drop
        assert readable(store) == expected(results, 100)


def test_crash_before_the_log_was_cut_leaves_the_intent_to_finish(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path, CFG) as store:
        results = fill(store, 0, 300)
    cut = results[200].physical_offset
    (tmp_path / MARKER).write_text(f"{cut}\n")  # step 1 done, then the crash
    with MessageStore.open(tmp_path, CFG) as store:
        assert pending_cut(tmp_path) == cut
        assert len(readable(store)) == 300  # recovery keeps the tail ...
        store.cut_back(cut)  # ... and pre-online finishes the cut
        assert pending_cut(tmp_path) is None
        assert readable(store) == expected(results, 200)


def test_crash_between_the_log_and_the_queues_recovers_consistently(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live, image = tmp_path / "live", tmp_path / "image"
    with MessageStore.open(live, CFG) as store:
        results = fill(store, 0, 500)
        store.flush()
        cut = results[310].physical_offset

        def crash(self: ConsumeQueue, queue_offset: int) -> None:
            shutil.copytree(live, image)  # the process dies here: log cut, queues not
            raise StoreError("simulated crash")

        monkeypatch.setattr(ConsumeQueue, "truncate", crash)
        with pytest.raises(StoreError, match="simulated"):
            store.cut_back(cut)
        monkeypatch.undo()
    with MessageStore.open(image, CFG) as store:
        # the checkpoint lies past the cut log, so recovery trims the queues itself
        assert store.commitlog_max_offset == cut
        assert readable(store) == expected(results, 310)
        assert pending_cut(image) == cut
        store.cut_back(cut)
        assert pending_cut(image) is None
        assert readable(store) == expected(results, 310)


def test_an_unreadable_intent_is_an_error_not_a_guess(tmp_path: Path) -> None:
    (tmp_path / MARKER).write_text("twelve\n")
    with pytest.raises(StoreError, match="not an offset"):
        pending_cut(tmp_path)
