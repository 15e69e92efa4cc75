"""MessageStore facade: puts, pulls, offsets, search, errors, flushing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_agent.store import GetMessageStatus, MessageStore, StoreConfig
from broker_agent.store.commitlog import CommitLog
from ha_controller.filter.sql92 import compile_filter
from ha_controller.protocol.errors import BadRequest, ConfigError, StoreError
from ha_controller.protocol.record import StoredMessage, encode_record, encoded_size, tag_hash

SEG = 64 * 1024
CFG = StoreConfig(segment_size_bytes=SEG, max_message_size_bytes=16 * 1024)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    with MessageStore.open(tmp_path / "store", CFG) as s:
        yield s


def test_put_then_get(store: MessageStore) -> None:
    r = store.put(
        "T",
        2,
        b"hello",
        {"TAGS": "a", "KEYS": "k1 k2", "UNIQ_KEY": "U1"},
        flags=3,
        born_ts_ms=1234,
        born_host="10.1.1.1:999",
        store_host="127.0.0.1:10911",
    )
    assert (r.physical_offset, r.queue_offset) == (0, 0)
    assert r.msg_id == "7F00000100002A9F0000000000000000"
    r2 = store.put("T", 2, b"world")
    assert (r2.physical_offset, r2.queue_offset) == (r.size, 1)
    assert r2.store_ts_ms >= r.store_ts_ms
    got = store.get_messages("T", 2, 0, 10)
    assert got.status is GetMessageStatus.FOUND
    assert (got.next_begin_offset, got.min_offset, got.max_offset) == (2, 0, 2)
    m = got.messages[0]
    assert (m.body, m.tags, m.keys, m.uniq_key, m.flags) == (b"hello", "a", ["k1", "k2"], "U1", 3)
    assert (m.born_ts_ms, m.born_host, m.store_host) == (1234, "10.1.1.1:999", "127.0.0.1:10911")
    assert (m.store_ts_ms, m.physical_offset, m.msg_id) == (r.store_ts_ms, 0, r.msg_id)
    assert store.get_message_at("T", 2, 1) == got.messages[1]
    assert store.get_message_at("T", 2, 2) is None
    assert store.get_message_at("nope", 0, 0) is None


def test_get_statuses(store: MessageStore) -> None:
    assert store.get_messages("T", 0, 0).status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
    for i in range(5):
        store.put("T", 0, b"%d" % i)
    assert store.get_messages("T", 0, 5).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
    bad = store.get_messages("T", 0, 9)
    assert (bad.status, bad.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_BADLY, 5)
    assert store.get_messages("T", 0, 2, max_count=2).next_begin_offset == 4


def test_max_bytes_returns_at_least_one(store: MessageStore) -> None:
    sizes = [store.put("T", 0, b"x" * 1000).size for _ in range(5)]
    got = store.get_messages("T", 0, 0, max_count=10, max_bytes=1)
    assert len(got.messages) == 1 and got.next_begin_offset == 1
    got = store.get_messages("T", 0, 0, max_count=10, max_bytes=sizes[0] * 3)
    assert len(got.messages) == 3 and got.next_begin_offset == 3


def test_tag_filter(store: MessageStore) -> None:
    for i in range(30):
        tags = ["A", "B", None][i % 3]
        store.put("T", 0, b"%d" % i, {"TAGS": tags} if tags else {})
    got = store.get_messages("T", 0, 0, 100, tag_filter={tag_hash("A")})
    assert [m.body for m in got.messages] == [b"%d" % i for i in range(0, 30, 3)]
    assert all(m.tags == "A" for m in got.messages)
    got = store.get_messages("T", 0, 0, 4, tag_filter={tag_hash("A"), tag_hash("B")})
    assert [m.queue_offset for m in got.messages] == [0, 1, 3, 4]
    assert got.next_begin_offset == 5
    none = store.get_messages("T", 0, 0, 100, tag_filter={tag_hash("C")})
    assert none.status is GetMessageStatus.NO_MATCHED_MESSAGE
    assert none.next_begin_offset == 30
    untagged = store.get_messages("T", 0, 0, 100, tag_filter={tag_hash(None)})
    assert [m.queue_offset for m in untagged.messages] == list(range(2, 30, 3))


def test_property_filter_reads_evaluates_and_moves_past(store: MessageStore) -> None:
    for i in range(30):
        props = {"n": str(i)} | ({"TAGS": "A"} if i % 2 else {})
        store.put("T", 0, b"%d" % i, props)
    odd_over_20 = compile_filter("n > 20 AND TAGS = 'A'").matches
    got = store.get_messages("T", 0, 0, 100, message_filter=odd_over_20)
    assert [m.queue_offset for m in got.messages] == [21, 23, 25, 27, 29]
    assert got.next_begin_offset == 30
    got = store.get_messages("T", 0, 0, 2, message_filter=odd_over_20)
    assert [m.queue_offset for m in got.messages] == [21, 23]
    assert got.next_begin_offset == 24  # past what was filtered out, not past 23's next
    # nothing selected: the offset moves past every message read (consumers skip them)
    none = store.get_messages("T", 0, 0, 100, message_filter=compile_filter("n IS NULL").matches)
    assert (none.status, none.next_begin_offset) == (GetMessageStatus.NO_MATCHED_MESSAGE, 30)
    # tags (unread) and properties (read) together
    both = store.get_messages(
        "T", 0, 0, 100, tag_filter={tag_hash("A")}, message_filter=compile_filter("n < 4").matches
    )
    assert [m.queue_offset for m in both.messages] == [1, 3]


def test_property_filter_reads_a_bounded_number_per_call(store: MessageStore) -> None:
    """Each message is decoded and evaluated under the store's lock: a call reads at
    most 2000 for the filter, and the consumer goes on from there."""
    for i in range(2100):
        store.put("T", 0, b"", {"n": str(i)})
    last = compile_filter("n = 2099").matches
    first = store.get_messages("T", 0, 0, 32, message_filter=last)
    assert (first.status, first.next_begin_offset) == (GetMessageStatus.NO_MATCHED_MESSAGE, 2000)
    second = store.get_messages("T", 0, 2000, 32, message_filter=last)
    assert [m.queue_offset for m in second.messages] == [2099]


def replicate_with_times(tmp_path: Path, store: MessageStore, times: list[int]) -> None:
    """Feed records with chosen store timestamps through the HA path."""
    cl = CommitLog(tmp_path / "master-log", SEG)
    cl.load()
    for i, ts in enumerate(times):
        msg = StoredMessage(topic="T", queue_id=1, body=b"m%d" % i, queue_offset=i, store_ts_ms=ts)
        off = cl.next_record_offset(encoded_size(msg))
        cl.append(
            encode_record(
                StoredMessage(
                    topic="T",
                    queue_id=1,
                    body=b"m%d" % i,
                    queue_offset=i,
                    store_ts_ms=ts,
                    physical_offset=off,
                )
            )
        )
    store.append_replicated(0, cl.read(0, 1 << 30))
    cl.close()
    store.reput()


def test_search_offset_and_time_queries(tmp_path: Path, store: MessageStore) -> None:
    assert store.search_offset("T", 1, 0) == 0
    assert store.earliest_msg_store_time("T", 1) is None
    times = [1000, 2000, 2000, 2000, 3000, 5000]
    replicate_with_times(tmp_path, store, times)
    assert store.min_offset("T", 1) == 0 and store.max_offset("T", 1) == 6
    assert store.earliest_msg_store_time("T", 1) == 1000
    assert store.search_offset("T", 1, 0) == 0
    assert store.search_offset("T", 1, 1000) == 0
    assert store.search_offset("T", 1, 1001) == 1
    assert store.search_offset("T", 1, 2000) == 1
    assert store.search_offset("T", 1, 2500) == 4
    assert store.search_offset("T", 1, 5000) == 5
    assert store.search_offset("T", 1, 9999) == 6
    # the store time of one message, what consumer lag dates its oldest by
    assert [store.store_time_at("T", 1, i) for i in range(6)] == times
    assert store.store_time_at("T", 1, 6) is None  # the queue's end
    assert store.store_time_at("T", 1, -1) is None
    assert store.store_time_at("T", 2, 0) is None


def test_bad_requests(store: MessageStore) -> None:
    for topic in ("", "a/b", "..", "x" * 128, "spaces here"):
        with pytest.raises(BadRequest):
            store.put(topic, 0, b"")
    with pytest.raises(BadRequest):
        store.put("T", -1, b"")
    with pytest.raises(BadRequest, match="max_message_size_bytes"):
        store.put("T", 0, b"x" * 16 * 1024)
    with pytest.raises(BadRequest, match="separator"):
        store.put("T", 0, b"", {"K": "a\x01b"})
    assert not store.read_only
    assert store.topics_and_queues() == {}
    store.put("T", 0, b"ok")


def test_config_validation() -> None:
    with pytest.raises(ConfigError, match="segment_size_bytes"):
        StoreConfig(segment_size_bytes=100)
    with pytest.raises(ConfigError, match="flush_mode"):
        StoreConfig(flush_mode="never")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_message_size_bytes"):
        StoreConfig(segment_size_bytes=8192, max_message_size_bytes=8190)
    with pytest.raises(ConfigError, match="min_free_disk_ratio"):
        StoreConfig(min_free_disk_ratio=1.5)
    with pytest.raises(ConfigError, match="flush_interval_ms"):
        StoreConfig(flush_interval_ms=0)


def test_close_is_idempotent_and_final(tmp_path: Path) -> None:
    store = MessageStore.open(tmp_path, CFG)
    store.put("T", 0, b"x")
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.put("T", 0, b"y")
    with pytest.raises(StoreError, match="closed"):
        store.get_messages("T", 0, 0)


def test_second_open_is_refused_while_in_use(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path, CFG), pytest.raises(StoreError, match="another process"):
        MessageStore.open(tmp_path, CFG)
    with MessageStore.open(tmp_path, CFG) as again:
        assert again.commitlog_max_offset == 0


def test_unusable_directory_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(StoreError, match="cannot open store directory"):
        MessageStore.open(blocker / "store", CFG)
    with pytest.raises(StoreError):
        MessageStore.open(blocker, CFG)


def test_flush_from_a_worker_thread_while_appending(tmp_path: Path) -> None:
    store = MessageStore.open(tmp_path, CFG)
    stop = threading.Event()
    flushed: list[int] = []
    errors: list[BaseException] = []

    def flusher() -> None:
        try:
            while not stop.is_set():
                flushed.append(store.flush())
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    worker = threading.Thread(target=flusher)
    worker.start()
    try:
        for i in range(2000):
            store.put("T", i % 4, b"%d" % i * 20)
    finally:
        stop.set()
        worker.join()
    assert not errors
    assert flushed == sorted(flushed)
    assert store.flush() == store.commitlog_max_offset == store.flushed_offset
    store.close()
    with MessageStore.open(tmp_path, CFG) as again:
        assert sum(again.max_offset("T", q) for q in range(4)) == 2000


def test_sync_mode_is_flushed_on_return(tmp_path: Path) -> None:
    config = StoreConfig(segment_size_bytes=SEG, max_message_size_bytes=4096, flush_mode="sync")
    with MessageStore.open(tmp_path, config) as store:
        for i in range(20):
            r = store.put("T", 0, b"%d" % i)
            assert store.flushed_offset == r.physical_offset + r.size


def test_put_after_replicated_bytes_dispatches_them_first(tmp_path: Path) -> None:
    with (
        MessageStore.open(tmp_path / "m", CFG) as master,
        MessageStore.open(tmp_path / "s", CFG) as slave,
    ):
        for i in range(5):
            master.put("T", 0, b"%d" % i)
        slave.append_replicated(0, master.read_commitlog(0, 1 << 30))
        r = slave.put("T", 0, b"local")
        assert r.queue_offset == 5
        assert [d.queue_offset for d in slave.reput()] == [0, 1, 2, 3, 4]
        assert [m.body for m in slave.get_messages("T", 0, 0).messages][-1] == b"local"


def test_recent_messages_with_a_property_are_read_back_after_a_reopen(tmp_path: Path) -> None:
    """What a restarted broker reads back about its latest writes (the escapes it
    stored): the messages with the property in about the last N bytes of the log, on
    every queue, across segments, oldest first; none before the window."""
    with MessageStore.open(tmp_path, CFG) as s:
        old = s.put("A", 0, b"o" * 1000, {"ESCAPE_ID": "old"})
        for i in range(200):  # several segments of other writes
            s.put("B", i % 3, b"x" * 1000)
        marked = []
        for i in range(6):
            s.put("A", 1, b"y" * 500)
            marked.append(s.put("C", i % 2, b"z" * 500, {"ESCAPE_ID": f"e{i}"}))
    assert CFG.segment_size_bytes * 3 < marked[0].physical_offset
    with MessageStore.open(tmp_path, CFG) as s:
        got = s.recent_messages_with("ESCAPE_ID", 10 * 1024)
        assert [m.properties["ESCAPE_ID"] for m in got] == [f"e{i}" for i in range(6)]
        assert [(m.topic, m.queue_id, m.queue_offset, m.physical_offset) for m in got] == [
            ("C", i % 2, r.queue_offset, r.physical_offset) for i, r in enumerate(marked)
        ]
        everything = s.recent_messages_with("ESCAPE_ID", 10 * 1024 * 1024)
        assert [m.properties["ESCAPE_ID"] for m in everything] == ["old"] + [
            f"e{i}" for i in range(6)
        ]
        assert everything[0].physical_offset == old.physical_offset
        assert s.recent_messages_with("NOPE", 10 * 1024 * 1024) == []
    with MessageStore.open(tmp_path / "empty", CFG) as s:
        assert s.recent_messages_with("ESCAPE_ID", 1024) == []
