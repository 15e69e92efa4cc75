"""Damaged records of a running store and their repair from a replica's copy
(broker_agent.store.repair): the checks without sockets, on real files.

A "replica" here is a second store directory holding the same log (a copy taken
before the damage), as a slave holds it; its ``read_commitlog`` is what
GET_COMMITLOG_RANGE answers."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_agent.store import GetMessageStatus, MessageStore, PutResult, StoreConfig
from broker_agent.store.repair import Damage, DamageTable, Expected, check_copy
from ha_controller.protocol.errors import CorruptRecord, RecordUnderRepair
from ha_controller.protocol.record import StoredMessage, encode_record

SEG = 64 * 1024
CFG = StoreConfig(segment_size_bytes=SEG, max_message_size_bytes=16 * 1024)


def body(i: int) -> bytes:
    return (b"%06d-" % i) * 40


def record(offset: int, queue_offset: int = 0, topic: str = "T", queue_id: int = 0) -> bytes:
    return encode_record(
        StoredMessage(
            topic=topic,
            queue_id=queue_id,
            body=body(queue_offset),
            queue_offset=queue_offset,
            physical_offset=offset,
        )
    )


# ---- check_copy: what a replica's answer must be --------------------------------------


def test_a_replicas_exact_records_are_accepted() -> None:
    first = record(1000, 0)
    second = record(1000 + len(first), 1)
    damage = Damage(1000, 1000 + len(first) + len(second), "test")
    assert check_copy(damage, first + second, SEG) == (len(first) + len(second), 2)


def test_a_short_answer_repairs_a_prefix_of_whole_records() -> None:
    first = record(1000, 0)
    damage = Damage(1000, 1000 + 3 * len(first), "test")
    assert check_copy(damage, first, SEG) == (len(first), 1)


def test_an_unknown_end_takes_exactly_the_first_record() -> None:
    first = record(1000, 0)
    second = record(1000 + len(first), 1)
    assert check_copy(Damage(1000, None, "test"), first + second, SEG) == (len(first), 1)


def test_a_replica_copy_with_flipped_bits_is_refused() -> None:
    data = bytearray(record(1000, 0))
    data[len(data) // 2] ^= 0x10
    with pytest.raises(CorruptRecord, match="CRC"):
        check_copy(Damage(1000, 1000 + len(data), "test"), bytes(data), SEG)


def test_a_record_placed_elsewhere_is_refused() -> None:
    data = record(2000, 0)
    with pytest.raises(CorruptRecord, match="claims physical offset 2000"):
        check_copy(Damage(1000, 1000 + len(data), "test"), data, SEG)


def test_a_record_other_than_the_consume_queue_names_is_refused() -> None:
    data = record(1000, 7, topic="Other")
    expected = Expected("T", 0, 7, len(data))
    with pytest.raises(CorruptRecord, match="the logs differ"):
        check_copy(Damage(1000, 1000 + len(data), "test", expected), data, SEG)
    # the same bytes pass for the entry that names them
    ok = Expected("Other", 0, 7, len(data))
    assert check_copy(Damage(1000, 1000 + len(data), "test", ok), data, SEG)[1] == 1


def test_records_that_do_not_end_where_the_damage_ends_are_refused() -> None:
    first = record(1000, 0)
    second = record(1000 + len(first), 1)
    # the damage ends inside the replica's second record: the two logs differ
    damage = Damage(1000, 1000 + len(first) + 10, "test")
    with pytest.raises(CorruptRecord, match="do not end at"):
        check_copy(damage, first + second, SEG)
    with pytest.raises(CorruptRecord, match="no bytes"):
        check_copy(damage, b"", SEG)


def test_the_damage_table_merges_and_shrinks_ranges() -> None:
    table = DamageTable()
    hole = table.add(Damage(100, 500, "hole"))
    assert table.add(Damage(200, 300, "read inside it")) is hole
    assert table.covering(499) is hole and table.covering(500) is None
    assert table.overlapping(0, 101) is hole and table.overlapping(500, 600) is None
    single = table.add(Damage(600, 700, "one record"))
    tail = table.add(Damage(550, 900, "the tail after it"))
    assert table.covering(650) is tail and single not in table.pending()
    table.drop_from(500)
    table.repaired(hole, 300)
    assert [(d.start, d.end) for d in table.pending()] == [(300, 500)]
    table.drop_from(400)
    assert [(d.start, d.end) for d in table.pending()] == [(300, 400)]
    table.drop_below(400)
    assert not table


# ---- a running store and its replica -------------------------------------------------


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[MessageStore, MessageStore, list[PutResult]]]:
    primary = tmp_path / "master"
    with MessageStore.open(primary, CFG) as store:
        results = [store.put("T", 0, body(i)) for i in range(40)]
    shutil.copytree(primary, tmp_path / "slave")
    with (
        MessageStore.open(primary, CFG) as master,
        MessageStore.open(tmp_path / "slave", CFG) as slave,
    ):
        yield master, slave, results


def segment_path(store: MessageStore, offset: int) -> Path:
    return store.directory / "commitlog" / f"{offset - offset % SEG:020d}"


def flip(store: MessageStore, result: PutResult) -> None:
    """Flip a bit inside ``result``'s record, under the running store."""
    path = segment_path(store, result.physical_offset)
    with path.open("r+b") as f:
        f.seek(result.physical_offset % SEG + result.size - 20)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x04]))


def bodies(store: MessageStore, start: int = 0) -> list[bytes]:
    got = store.get_messages("T", 0, start, 1000, 1 << 30)
    return [m.body for m in got.messages]


def repair_all(master: MessageStore, slave: MessageStore) -> int:
    """What the broker's repair loop does, without the socket: ask, check, write."""
    repaired = 0
    for damage in master.damaged():
        want = damage.end - damage.start if damage.end is not None else 1
        repaired += master.repair(damage, slave.read_commitlog(damage.start, want))[1]
    return repaired


def test_flipped_bits_hold_readers_until_the_replicas_copy_is_written_back(
    stores: tuple[MessageStore, MessageStore, list[PutResult]],
) -> None:
    master, slave, results = stores
    flip(master, results[12])
    # never served, never passed: the read stops before it, and again at it
    assert bodies(master) == [body(i) for i in range(12)]
    at = master.get_messages("T", 0, 12, 1000, 1 << 30)
    assert at.status is GetMessageStatus.RECORD_UNDER_REPAIR and at.next_begin_offset == 12
    with pytest.raises(RecordUnderRepair):
        master.get_message_at("T", 0, 12)
    # and never streamed to a replica either
    with pytest.raises(RecordUnderRepair):
        master.read_commitlog(results[12].physical_offset, 1 << 20)
    assert len(master.read_commitlog(results[10].physical_offset, 1 << 20)) == 2 * results[10].size
    assert repair_all(master, slave) == 1
    assert master.damaged() == []
    assert bodies(master) == [body(i) for i in range(40)]


def test_a_segment_truncated_under_the_writer_stops_appends_until_repaired(
    stores: tuple[MessageStore, MessageStore, list[PutResult]],
) -> None:
    master, slave, results = stores
    end = results[-1].physical_offset + results[-1].size
    cut = results[30].physical_offset + 17  # inside record 30
    os.truncate(segment_path(master, cut), cut % SEG)
    # the writer does not append past a hole it did not write
    with pytest.raises(RecordUnderRepair, match="appends wait"):
        master.put("T", 0, b"after the hole")
    assert master.commitlog_max_offset == end
    assert [(d.start, d.end) for d in master.damaged()] == [(results[30].physical_offset, end)]
    assert bodies(master) == [body(i) for i in range(30)]
    assert master.get_messages("T", 0, 30).status is GetMessageStatus.RECORD_UNDER_REPAIR
    assert repair_all(master, slave) == 10
    assert segment_path(master, cut).stat().st_size == end % SEG
    later = master.put("T", 0, b"after the repair")
    assert later.physical_offset == end and later.queue_offset == 40
    assert bodies(master) == [*(body(i) for i in range(40)), b"after the repair"]


def test_a_corrupt_replica_sends_nothing_it_cannot_verify_and_nothing_is_written(
    stores: tuple[MessageStore, MessageStore, list[PutResult]],
) -> None:
    master, slave, results = stores
    flip(master, results[5])
    flip(slave, results[5])
    assert bodies(master) == [body(i) for i in range(5)]
    (damage,) = master.damaged()
    # the replica refuses to answer with the bad record ...
    with pytest.raises(RecordUnderRepair):
        slave.read_commitlog(damage.start, results[5].size)
    # ... and an answer that is corrupt anyway is refused by the repairing side
    bad = bytearray(master.read_commitlog(results[4].physical_offset, results[4].size))
    with pytest.raises(CorruptRecord):
        master.repair(damage, bytes(bad))  # record 4, not the one at the damage
    with open(segment_path(slave, damage.start), "rb") as f:
        f.seek(damage.start % SEG)
        flipped = f.read(results[5].size)
    with pytest.raises(CorruptRecord, match="CRC"):
        master.repair(damage, flipped)
    assert master.damaged() == [damage]
    assert master.get_messages("T", 0, 5).status is GetMessageStatus.RECORD_UNDER_REPAIR


def test_a_truncation_the_writer_extended_again_is_found_after_the_next_put(
    stores: tuple[MessageStore, MessageStore, list[PutResult]],
) -> None:
    """The file shrank between the writer's size check and its write, which extended it
    again: zeros where records were, and the right size.  The next put finds the record
    the previous one ended with unreadable."""
    master, slave, results = stores
    first = master.put("T", 0, body(40))  # the writer's own last record ...
    slave.append_replicated(
        first.physical_offset, master.read_commitlog(first.physical_offset, first.size)
    )  # ... replicated
    path = segment_path(master, first.physical_offset)
    size = path.stat().st_size
    os.truncate(path, results[35].physical_offset % SEG + 5)  # 5 bytes into record 35
    os.truncate(path, size)  # what the racing write did
    later = master.put("T", 0, body(41))
    assert later.queue_offset == 41
    assert [(d.start, d.end) for d in master.damaged()] == [
        (results[36].physical_offset, first.physical_offset + first.size)
    ]
    assert bodies(master) == [body(i) for i in range(35)]  # 35 fails its CRC
    assert repair_all(master, slave) == 1 + 5
    assert bodies(master) == [body(i) for i in range(42)]


def test_a_record_read_inside_a_shrunk_tail_is_repaired_with_the_whole_tail(
    stores: tuple[MessageStore, MessageStore, list[PutResult]],
) -> None:
    """A read finds one record past the truncation before anything checked the file's
    size: repairing that record alone would extend the file past the hole before it
    (zeros the size check no longer sees).  The tail is repaired whole instead."""
    master, slave, results = stores
    end = results[-1].physical_offset + results[-1].size
    os.truncate(segment_path(master, end), results[30].physical_offset % SEG + 17)
    assert master.get_messages("T", 0, 35).status is GetMessageStatus.RECORD_UNDER_REPAIR
    (single,) = master.damaged()[-1:]
    assert single.start == results[30].physical_offset  # the tail swallowed record 35
    assert repair_all(master, slave) == 10
    assert master.damaged() == []
    assert bodies(master) == [body(i) for i in range(40)]
