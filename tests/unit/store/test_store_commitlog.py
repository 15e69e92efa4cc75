"""Commit-log segments, blank fill, raw reads for HA and replicated appends."""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from broker_agent.store import MessageStore, StoreConfig
from broker_agent.store.commitlog import CommitLog
from broker_agent.store.consumequeue import ConsumeQueue
from ha_controller.protocol.errors import CorruptRecord, OffsetOutOfRange, StoreError
from ha_controller.protocol.record import (
    BLANK,
    BLANK_MIN_SIZE,
    StoredMessage,
    decode_record,
    encode_record,
    encoded_size,
    iter_records,
)

SEG = 64 * 1024
CFG = StoreConfig(segment_size_bytes=SEG, max_message_size_bytes=16 * 1024)


def append_msg(cl: CommitLog, body: bytes, qoff: int = 0) -> tuple[int, int]:
    msg = StoredMessage(topic="T", queue_id=0, body=body, queue_offset=qoff)
    size = encoded_size(msg)
    offset = cl.next_record_offset(size)
    data = encode_record(replace(msg, physical_offset=offset))
    assert cl.append(data) == offset
    return offset, size


def fill(store: MessageStore, n: int, seed: int = 1, topics: int = 2, queues: int = 3) -> None:
    rng = random.Random(seed)
    for i in range(n):
        tag = rng.choice(["A", "B", ""])
        store.put(
            f"T{i % topics}",
            rng.randrange(queues),
            rng.randbytes(rng.randrange(0, 3000)),
            {"TAGS": tag, "KEYS": f"k{i}"} if tag else {"KEYS": f"k{i}"},
            born_host="10.0.0.9:1234",
            store_host="127.0.0.1:10911",
        )


def segment_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((directory / "commitlog").iterdir())}


def test_roll_over_with_blank_fill(tmp_path: Path) -> None:
    cl = CommitLog(tmp_path, SEG)
    cl.load()
    placed = [append_msg(cl, os.urandom(1000 + i * 37), i) for i in range(150)]
    assert cl.max_offset == placed[-1][0] + placed[-1][1]
    files = sorted(tmp_path.iterdir())
    assert [p.name for p in files] == [f"{i * SEG:020d}" for i in range(len(files))]
    assert len(files) >= 3
    for path in files[:-1]:
        data = path.read_bytes()
        assert len(data) == SEG
        records = list(iter_records(data))
        pos, last, size = records[-1]
        assert last is BLANK and pos + size == SEG and size >= BLANK_MIN_SIZE
        start = int(path.name)
        for p, rec, _ in records[:-1]:
            assert rec is not BLANK and rec.physical_offset == start + p
    for offset, size in placed:  # no record crosses a segment boundary
        assert offset // SEG == (offset + size + BLANK_MIN_SIZE - 1) // SEG
    cl.close()


def test_record_that_leaves_exactly_a_blank_stays_in_segment(tmp_path: Path) -> None:
    cl = CommitLog(tmp_path, 4096)
    cl.load()
    _, first = append_msg(cl, b"x" * 1000)
    probe = encoded_size(StoredMessage(topic="T", queue_id=0, body=b""))
    room = 4096 - first - BLANK_MIN_SIZE
    off, size = append_msg(cl, b"y" * (room - probe))
    assert off == first and off + size + BLANK_MIN_SIZE == 4096
    off2, size2 = append_msg(cl, b"z")
    assert off2 == 4096
    data = (tmp_path / f"{0:020d}").read_bytes()
    rec, n = decode_record(data, 4096 - BLANK_MIN_SIZE)
    assert rec is BLANK and n == BLANK_MIN_SIZE
    # one byte more than "fits with a blank after it" moves to the next segment
    room = 4096 - size2
    off3, _ = append_msg(cl, b"w" * (room - BLANK_MIN_SIZE + 1 - probe))
    assert off3 == 8192
    rec, n = decode_record((tmp_path / f"{4096:020d}").read_bytes(), size2)
    assert rec is BLANK and n == room
    cl.close()


def test_read_returns_whole_records_only(tmp_path: Path) -> None:
    cl = CommitLog(tmp_path, SEG)
    cl.load()
    placed = [append_msg(cl, os.urandom(500 + i), i) for i in range(300)]
    ends = {o + s for o, s in placed} | {o for o, _ in placed}
    offset = 0
    rng = random.Random(5)
    chunks = []
    while offset < cl.max_offset:
        data = cl.read(offset, rng.randrange(1, 5000))
        assert data
        chunks.append(data)
        offset += len(data)
        assert offset in ends or offset % SEG == 0
    assert cl.read(cl.max_offset, 100) == b""
    whole = b"".join(chunks)
    assert whole == b"".join(p.read_bytes() for p in sorted(tmp_path.iterdir()))
    # a record larger than max_bytes is returned alone
    assert len(cl.read(0, 1)) == placed[0][1]
    with pytest.raises(OffsetOutOfRange):
        cl.read(cl.max_offset + 1, 10)
    cl.close()


def replicate(master: MessageStore, slave: MessageStore, seed: int) -> None:
    rng = random.Random(seed)
    while slave.commitlog_max_offset < master.commitlog_max_offset:
        data = master.read_commitlog(slave.commitlog_max_offset, rng.randrange(1, 20000))
        slave.append_replicated(slave.commitlog_max_offset, data)
        if rng.random() < 0.3:
            slave.reput(max_bytes=rng.randrange(1, 50000))


def cq_files(directory: Path) -> dict[str, bytes]:
    root = directory / "consumequeue"
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_append_raw_continuing_master_bytes_gives_identical_files(tmp_path: Path) -> None:
    with (
        MessageStore.open(tmp_path / "m", CFG) as master,
        MessageStore.open(tmp_path / "s", CFG) as slave,
    ):
        fill(master, 120, seed=2)
        replicate(master, slave, seed=3)
        fill(master, 80, seed=4)
        replicate(master, slave, seed=5)
        while slave.dispatch_behind_bytes:
            slave.reput(max_bytes=30000)
        assert slave.commitlog_max_offset == master.commitlog_max_offset
        assert slave.topics_and_queues() == master.topics_and_queues()
        for topic, queues in master.topics_and_queues().items():
            for q in queues:
                got_m = master.get_messages(topic, q, 0, 1000, 1 << 30)
                got_s = slave.get_messages(topic, q, 0, 1000, 1 << 30)
                assert got_m == got_s
    assert segment_files(tmp_path / "m") == segment_files(tmp_path / "s")
    assert cq_files(tmp_path / "m") == cq_files(tmp_path / "s")


def test_reput_reports_each_dispatched_entry(tmp_path: Path) -> None:
    with (
        MessageStore.open(tmp_path / "m", CFG) as master,
        MessageStore.open(tmp_path / "s", CFG) as slave,
    ):
        results = [master.put("T", i % 2, b"b%d" % i, {"TAGS": "x"}) for i in range(40)]
        slave.append_replicated(0, master.read_commitlog(0, 1 << 30))
        assert slave.get_messages("T", 0, 0).messages == []
        got = slave.reput()
        assert [(d.queue_id, d.queue_offset, d.physical_offset) for d in got] == [
            (i % 2, r.queue_offset, r.physical_offset) for i, r in enumerate(results)
        ]
        assert slave.reput() == []
        assert slave.max_offset("T", 0) == 20


def test_a_failed_queue_write_in_reput_is_dispatched_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reput writes runs of entries per queue; when one queue's write fails, the
    next reput starts again at its first unwritten record and the queues end up as the
    master's (entries already written are found in place, not doubled)."""
    real = ConsumeQueue.append_many
    failures: list[int] = []

    def failing_once(cq: ConsumeQueue, entries: Sequence[tuple[int, int, int]]) -> None:
        if cq.topic == "T1" and cq.queue_id == 2 and not failures:
            failures.append(len(entries))
            raise StoreError("injected: no space left on device")
        real(cq, entries)

    with (
        MessageStore.open(tmp_path / "m", CFG) as master,
        MessageStore.open(tmp_path / "s", CFG) as slave,
    ):
        fill(master, 200, seed=8)
        slave.append_replicated(0, master.read_commitlog(0, 1 << 30))
        monkeypatch.setattr(ConsumeQueue, "append_many", failing_once)
        with pytest.raises(StoreError, match="injected"):
            slave.reput(max_bytes=1 << 30)
        assert failures and slave.dispatch_behind_bytes > 0
        while slave.dispatch_behind_bytes:
            slave.reput(max_bytes=30000)
        assert slave.reput() == []
        assert slave.topics_and_queues() == master.topics_and_queues()
    assert cq_files(tmp_path / "m") == cq_files(tmp_path / "s")


def test_a_failed_write_where_a_queue_breaks_off_loses_no_other_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record that does not continue its queue's run (here a gap: queue offset 7
    after 3) has the runs written before it is dispatched.  When that write fails, the
    reput must go back to the first unwritten record of every run, also of a queue whose
    run began earlier (T/1 here), or those entries are never written."""
    layout = [("T", 1, 0), ("T", 1, 1), *[("T", 0, q) for q in range(4)], ("T", 0, 7), ("T", 1, 2)]
    raw = bytearray()
    for topic, qid, qoff in layout:
        msg = StoredMessage(topic=topic, queue_id=qid, body=b"x" * 100, queue_offset=qoff)
        raw += encode_record(replace(msg, physical_offset=len(raw)))
    real = ConsumeQueue.append_many
    failures: list[int] = []

    def failing_once(cq: ConsumeQueue, entries: Sequence[tuple[int, int, int]]) -> None:
        if cq.queue_id == 0 and not failures:
            failures.append(len(entries))
            raise StoreError("injected: no space left on device")
        real(cq, entries)

    with MessageStore.open(tmp_path / "s", CFG) as slave:
        slave.append_replicated(0, bytes(raw))
        monkeypatch.setattr(ConsumeQueue, "append_many", failing_once)
        with pytest.raises(StoreError, match="injected"):
            slave.reput()
        while slave.dispatch_behind_bytes:
            slave.reput()
        assert failures == [4]
        assert (slave.min_offset("T", 1), slave.max_offset("T", 1)) == (0, 3)
        assert (slave.min_offset("T", 0), slave.max_offset("T", 0)) == (0, 4)


def test_slave_can_start_at_a_master_segment_start(tmp_path: Path) -> None:
    with (
        MessageStore.open(tmp_path / "m", CFG) as master,
        MessageStore.open(tmp_path / "s", CFG) as slave,
    ):
        fill(master, 150, seed=7, topics=1, queues=1)
        start = (master.commitlog_max_offset // SEG) * SEG
        assert start > 0
        data = master.read_commitlog(start, 1 << 30)
        slave.append_replicated(start, data)
        slave.reput()
        assert slave.commitlog_min_offset == start
        lo = slave.min_offset("T0", 0)
        assert lo > 0 and slave.max_offset("T0", 0) == master.max_offset("T0", 0)
        got = slave.get_messages("T0", 0, lo, 1000, 1 << 30)
        assert got.messages == master.get_messages("T0", 0, lo, 1000, 1 << 30).messages
        assert slave.get_messages("T0", 0, 0).status.name == "OFFSET_TOO_SMALL"
    reopened = MessageStore.open(tmp_path / "s", CFG)
    try:
        assert reopened.commitlog_min_offset == start
        assert reopened.min_offset("T0", 0) == lo
    finally:
        reopened.close()


def test_append_raw_rejects_bad_input_and_writes_nothing(tmp_path: Path) -> None:
    with (
        MessageStore.open(tmp_path / "m", CFG) as master,
        MessageStore.open(tmp_path / "s", CFG) as slave,
    ):
        fill(master, 30, seed=8)
        data = master.read_commitlog(0, 1 << 30)
        first = decode_record(data)[1]
        with pytest.raises(OffsetOutOfRange):
            slave.append_replicated(first, data[first:])
        with pytest.raises(CorruptRecord):
            slave.append_replicated(0, data[:-1])
        broken = bytearray(data)
        broken[len(data) // 2] ^= 0xFF
        with pytest.raises(CorruptRecord):
            slave.append_replicated(0, bytes(broken))
        assert slave.commitlog_max_offset == 0
        assert not slave.read_only
        slave.append_replicated(0, data)
        assert slave.commitlog_max_offset == len(data)
