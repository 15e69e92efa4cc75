"""Recovery marks: the queue ends an unclean stop left, where a read past a queue's end
is sent back to (store.marks)."""

from __future__ import annotations

import shutil
from pathlib import Path

from broker_agent.metadata.offsets import ConsumerOffsetManager
from broker_agent.store import GetMessageStatus, MessageStore, StoreConfig

CFG = StoreConfig(segment_size_bytes=64 * 1024, max_message_size_bytes=16 * 1024)


def power_loss_image(tmp_path: Path, synced: int, unsynced: int) -> Path:
    """The store as a power loss leaves it: ``synced`` messages of queue 0 flushed, the
    ``unsynced`` written after them gone (the files as they were at the flush)."""
    live, image = tmp_path / "live", tmp_path / "image"
    with MessageStore.open(live, CFG) as store:
        for i in range(synced):
            store.put("T", 0, b"old-%d" % i, {})
        store.flush()
        shutil.copytree(live, image)
        for i in range(unsynced):
            store.put("T", 0, b"lost-%d" % i, {})
    return image


def test_a_read_past_the_end_goes_back_to_the_mark_after_an_unclean_stop(
    tmp_path: Path,
) -> None:
    image = power_loss_image(tmp_path, 10, 10)  # a consumer had read up to 20
    with MessageStore.open(image, CFG) as store:
        assert store.max_offset("T", 0) == 10
        assert store.recovery_mark("T", 0) == 10
        assert store.take_recovery_marks() == {("T", 0): 10}
        assert store.take_recovery_marks() == {}  # once
        for i in range(5):  # offsets 10-14, which the lost tail had held
            store.put("T", 0, b"new-%d" % i, {})
        got = store.get_messages("T", 0, 20)
        assert (got.status, got.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_BADLY, 10)
        assert [m.body for m in store.get_messages("T", 0, 10).messages] == [
            b"new-%d" % i for i in range(5)
        ]
    # the mark outlives a clean restart, which records none of its own
    with MessageStore.open(image, CFG) as store:
        assert store.take_recovery_marks() == {}
        assert store.get_messages("T", 0, 20).next_begin_offset == 10


def test_an_empty_queue_after_an_unclean_stop_sends_a_consumer_past_it_to_its_start(
    tmp_path: Path,
) -> None:
    image = power_loss_image(tmp_path, 0, 10)  # the queue itself is gone
    with MessageStore.open(image, CFG) as store:
        assert store.take_recovery_marks() == {}
        store.put("T", 0, b"new", {})
        assert store.recovery_mark("T", 0) == 0  # every record it holds came after
        got = store.get_messages("T", 0, 7)
        assert (got.status, got.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_BADLY, 0)


def test_without_an_unclean_stop_a_read_past_the_end_moves_to_the_end(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path, CFG) as store:
        for _ in range(3):
            store.put("T", 0, b"m", {})
    with MessageStore.open(tmp_path, CFG) as store:
        assert store.recovery_mark("T", 0) is None
        got = store.get_messages("T", 0, 9)
        assert (got.status, got.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_BADLY, 3)


def test_a_cut_back_lowers_the_mark(tmp_path: Path) -> None:
    image = power_loss_image(tmp_path, 10, 0)
    with MessageStore.open(image, CFG) as store:
        for _ in range(10):
            store.put("T", 0, b"y", {})
        assert store.recovery_mark("T", 0) == 10
        at = store.get_message_at("T", 0, 5)
        assert at is not None
        store.cut_back(at.physical_offset)
        assert store.recovery_mark("T", 0) == 5
        got = store.get_messages("T", 0, 12)
        assert (got.status, got.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_BADLY, 5)


def test_committed_offsets_past_a_recovered_end_are_corrected(tmp_path: Path) -> None:
    table = ConsumerOffsetManager(tmp_path / "offsets.json")
    table.commit("g", "T", 0, 20)
    table.commit("g", "T", 1, 4)
    table.commit("g", "U", 0, 30)  # no mark: left alone
    version = table.data_version.key()
    corrected = table.correct_past({("T", 0): 10, ("T", 1): 8})
    assert corrected == [(("g", "T", 0), 20, 10)]
    assert [table.query("g", "T", q) for q in (0, 1)] == [10, 4]
    assert table.query("g", "U", 0) == 30
    assert table.data_version.key() == version
    again = ConsumerOffsetManager(tmp_path / "offsets.json")
    again.load()
    assert again.query("g", "T", 0) == 10  # written at once


def test_the_store_keeps_its_id_and_counts_how_often_its_queues_went_back(
    tmp_path: Path,
) -> None:
    image = power_loss_image(tmp_path, 10, 0)
    with MessageStore.open(image, CFG) as store:
        store_id, rewinds = store.rewinds()
        assert store_id > 0 and rewinds == 1  # the unclean recovery
        at = store.get_message_at("T", 0, 5)
        assert at is not None
        store.cut_back(at.physical_offset)
        assert store.rewinds() == (store_id, 2)
    with MessageStore.open(image, CFG) as store:  # a clean restart: nothing went back
        assert store.rewinds() == (store_id, 2)
    (image / "recovery_marks.json").write_text("{not json")
    with MessageStore.open(image, CFG) as store:  # a new id: no client has read it
        assert store.rewinds()[0] not in (0, store_id)
        assert store.recovery_mark("T", 0) is None


def test_a_tail_copied_back_from_a_replica_lifts_the_mark(tmp_path: Path) -> None:
    """Corruption campaign seed 3401: a master that recovered short (a flipped record in
    its last segment) caught up from its slave the very records it had held; the marks
    stayed at the short end, so every consumer past it went back and read thousands of
    messages twice.  Going online after that catch-up, the master lifts the marks to
    the queue ends it holds again; the rewinds count does not move."""
    image = power_loss_image(tmp_path, 10, 10)
    with MessageStore.open(tmp_path / "live", CFG) as live:  # the replica's copy
        live.put("T", 1, b"lost-too", {})  # a queue the short log does not hold at all
        start = live.get_messages("T", 0, 10).messages[0].physical_offset
        tail = live.read_commitlog(start, 1 << 20)
    with MessageStore.open(image, CFG) as store:
        assert store.recovery_mark("T", 0) == 10
        rewinds = store.rewinds()
        store.append_replicated(start, tail)  # what pre-online's catch-up does
        store.reput()
        assert store.max_offset("T", 0) == 20
        assert store.lift_recovery_marks()
        assert store.recovery_mark("T", 0) == 20 and store.rewinds() == rewinds
        got = store.get_messages("T", 0, 20)  # the consumer that had read up to 20
        assert got.status is not GetMessageStatus.OFFSET_OVERFLOW_BADLY
        assert got.next_begin_offset == 20
        # the queue the copy brought back holds records from before the stop: no mark
        assert store.max_offset("T", 1) == 1 and store.recovery_mark("T", 1) is None
        assert not store.lift_recovery_marks()  # nothing more to lift
