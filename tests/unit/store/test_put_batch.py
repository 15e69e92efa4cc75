"""MessageStore.put_batch: one encode, one write per segment, one fsync; all or nothing."""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_agent.store import GetMessageStatus, MessageStore, StoreConfig
from broker_agent.store.diskspace import SpaceLevel
from broker_agent.store.message_store import PutRequest, PutResult
from ha_controller.protocol.errors import BadRequest, StoreFull
from ha_controller.protocol.record import BLANK, decode_record, iter_records, tag_hash

SEG = 64 * 1024
CFG = StoreConfig(segment_size_bytes=SEG, max_message_size_bytes=16 * 1024)
_STORE_TS = slice(44, 52)  # the store time differs between runs; the CRC covers it
_CRC = slice(8, 12)


def request(i: int, size: int = 700, queue_id: int | None = None) -> PutRequest:
    body = (b"%06d-" % i) * (size // 7 + 1)
    props = {"TAGS": f"t{i % 2}", "KEYS": f"k{i}"}
    qid = i % 3 if queue_id is None else queue_id
    return PutRequest("T", qid, body, props, born_ts_ms=1_000 + i, born_host="10.0.0.1:1")


def log_bytes(store_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((store_dir / "commitlog").iterdir()))


def records_by_queue(store: MessageStore) -> dict[tuple[int, int], bytes]:
    out: dict[tuple[int, int], bytes] = {}
    for q in store.topics_and_queues().get("T", []):
        if not store.max_offset("T", q):
            continue
        got = store.get_messages("T", q, 0, 10_000, 1 << 30)
        assert got.status is GetMessageStatus.FOUND
        assert [m.queue_offset for m in got.messages] == list(range(store.max_offset("T", q)))
        out.update({(q, m.queue_offset): m.body for m in got.messages})
    assert store.corrupt_reads == 0
    return out


def test_batch_is_readable_by_queue_and_offset_across_a_segment_roll(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path, CFG) as store:
        first = store.put("T", 0, b"before")
        batch = [request(i) for i in range(200)]  # about 160 KiB: two segment rolls
        results = store.put_batch(batch)
        assert len(results) == len(batch)
        # queue offsets continue per queue, in batch order
        assert [r.queue_offset for r in results[:4]] == [1, 0, 0, 2]
        assert results[0].physical_offset == first.physical_offset + first.size
        assert len({r.physical_offset // SEG for r in results}) == 3
        for req, res in zip(batch, results, strict=True):
            msg = store.get_message_at("T", req.queue_id, res.queue_offset)
            assert msg is not None
            assert msg.body == req.body and msg.properties == req.properties
            assert msg.physical_offset == res.physical_offset
            assert (msg.born_ts_ms, msg.born_host) == (req.born_ts_ms, req.born_host)
            assert msg.store_ts_ms == res.store_ts_ms
            raw = store.read_commitlog(res.physical_offset, res.size)
            record, size = decode_record(raw)  # verifies the CRC
            assert size == res.size and record is not BLANK
        tagged = store.get_messages("T", 1, 0, 1000, 1 << 30, tag_filter={tag_hash("t1")})
        assert {m.body for m in tagged.messages} == {
            batch[i].body for i in range(200) if i % 3 == 1 and i % 2 == 1
        }
        expected = records_by_queue(store)
        end = store.commitlog_max_offset
    # a full walk of the log verifies every record and rebuilds the same queues
    (tmp_path / "checkpoint").unlink()
    shutil.rmtree(tmp_path / "consumequeue")
    with MessageStore.open(tmp_path, CFG) as store:
        assert store.recovered_from == 0 and store.commitlog_max_offset == end
        assert records_by_queue(store) == expected


@pytest.mark.parametrize("seed", range(6))
def test_put_batch_and_a_loop_of_put_write_the_same_log(tmp_path: Path, seed: int) -> None:
    """Byte for byte (store times and CRCs aside), with blanks and rolls, and every
    record's CRC right in both."""
    rng = random.Random(seed)
    requests = [
        request(i, rng.choice([1, 300, 5000, 16_000 - 200]), rng.randrange(4))
        for i in range(rng.randrange(40, 120))
    ]
    with MessageStore.open(tmp_path / "loop", CFG) as store:
        looped = [
            store.put(
                r.topic,
                r.queue_id,
                r.body,
                r.properties,
                born_ts_ms=r.born_ts_ms,
                born_host=r.born_host,
            )
            for r in requests
        ]
        end = store.commitlog_max_offset
    cuts = sorted(rng.sample(range(1, len(requests)), 3))
    batched: list[PutResult] = []
    with MessageStore.open(tmp_path / "batch", CFG) as store:
        for lo, hi in zip([0, *cuts], [*cuts, len(requests)], strict=True):
            batched += store.put_batch(requests[lo:hi])
        assert store.commitlog_max_offset == end
    strip = [(r.physical_offset, r.queue_offset, r.size) for r in looped]
    assert [(r.physical_offset, r.queue_offset, r.size) for r in batched] == strip
    logs = []
    for name in ("loop", "batch"):
        data = bytearray(log_bytes(tmp_path / name))
        count = 0
        for pos, rec, size in iter_records(data):  # raises on a CRC mismatch
            if rec is BLANK:
                continue
            assert rec.physical_offset == pos
            count += 1
            for field in (_STORE_TS, _CRC):
                start = pos + field.start
                data[start : pos + field.stop] = bytes(field.stop - field.start)
            assert size == looped[count - 1].size
        assert count == len(requests)
        logs.append(bytes(data))
    assert logs[0] == logs[1]
    # and the same consume queues
    queues = {}
    for name in ("loop", "batch"):
        root = tmp_path / name / "consumequeue"
        queues[name] = {
            str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()
        }
    assert len(queues["loop"]) == len({r.queue_id for r in requests})
    assert queues["loop"] == queues["batch"]


@pytest.mark.parametrize("keep", ["half", "all-but-one-byte", "one-record-and-a-bit"])
def test_torn_batch_is_truncated_by_recovery(tmp_path: Path, keep: str) -> None:
    live, image = tmp_path / "live", tmp_path / "image"
    with MessageStore.open(live, CFG) as store:
        before = [store.put("T", i % 3, request(i).body) for i in range(20)]
        checkpoint = store.flush()
        batch = [request(i) for i in range(20, 60)]
        results = store.put_batch(batch)
        assert len({r.physical_offset // SEG for r in results}) == 1
        start = results[0].physical_offset
        end = results[-1].physical_offset + results[-1].size
        shutil.copytree(live, image)  # a kill -9 while the batch's write was half done
    cut = {
        "half": start + (end - start) // 2,
        "all-but-one-byte": end - 1,
        "one-record-and-a-bit": results[1].physical_offset + 30,
    }[keep]
    seg_start = start - start % SEG
    with (image / "commitlog" / f"{seg_start:020d}").open("r+b") as f:
        f.truncate(cut - seg_start)
    torn = max(i for i, r in enumerate(results) if r.physical_offset <= cut)
    with MessageStore.open(image, CFG) as store:
        assert store.recovered_from == checkpoint
        assert store.commitlog_max_offset == results[torn].physical_offset
        whole = before + results[:torn]
        bodies = [request(i).body for i in range(20)] + [r.body for r in batch[:torn]]
        got = records_by_queue(store)
        assert sorted(got.values()) == sorted(bodies)
        assert len(got) == len(whole)
        # the store takes the next batch where the whole records end
        again = store.put_batch([request(99, queue_id=0)])
        assert again[0].physical_offset == results[torn].physical_offset
        assert store.get_message_at("T", 0, again[0].queue_offset) is not None


def test_bad_batch_changes_nothing(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path, CFG) as store:
        store.put("T", 0, b"x")
        end = store.commitlog_max_offset
        good = request(1)
        for bad in (
            PutRequest("bad topic", 0, b"x"),
            PutRequest("T", -1, b"x"),
            PutRequest("T", 0, b"x" * 20_000),
            PutRequest("T", 0, b"x" * (16 * 1024 - 66)),  # the body fits, the record not
            PutRequest("T", 0, b"x", {"A\x01": "v"}),
        ):
            with pytest.raises(BadRequest):
                store.put_batch([good, bad])
            assert store.commitlog_max_offset == end
            assert store.max_offset("T", 0) == 1 and store.max_offset("T", 1) == 0
        assert store.put_batch([]) == []
        assert store.put_batch([good])[0].physical_offset == end


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:
        pytest.skip(f"cannot run mount: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs (needs root/CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def _file_sizes(store_dir: Path) -> dict[str, int]:
    return {
        str(p.relative_to(store_dir)): p.stat().st_size
        for p in store_dir.rglob("*")
        if p.is_file() and p.name not in ("checkpoint", "lock")
    }


@pytest.mark.parametrize("where", ["reserve", "enospc-in-the-log", "enospc-in-the-queues"])
def test_batch_that_does_not_fit_is_refused_whole(tiny_tmpfs: Path, where: str) -> None:
    """Refused by the reserve check before anything is written, or by the file system
    (ENOSPC) in the middle of the batch's commit-log write or of its consume-queue
    writes (new queues each take a page): the batch is refused whole, no byte of it
    stays, and it goes in whole once space returns."""
    reserve = 0.1 if where == "reserve" else 0.0
    config = StoreConfig(
        segment_size_bytes=SEG,
        max_message_size_bytes=16 * 1024,
        min_free_disk_ratio=reserve,
        disk_check_interval_ms=600_000,  # no sample but the ones this test asks for
    )
    store_dir = tiny_tmpfs / "store"
    with MessageStore.open(store_dir, config) as store:
        kept = [store.put("T", i % 3, request(i).body) for i in range(10)]
        queues = range(3, 23) if where == "enospc-in-the-queues" else range(3)
        batch = [request(i, 1000, queues[i % len(queues)]) for i in range(64)]  # ~70 KiB
        room = {"reserve": 40, "enospc-in-the-log": 40, "enospc-in-the-queues": 76}[where]
        store.check_space()
        filler = store.free_disk_bytes - int(reserve * (1 << 20)) - room * 1024
        (tiny_tmpfs / "filler").write_bytes(b"f" * filler)
        if where == "reserve":
            store.check_space()  # else the store's estimate still sees the space
        end = store.commitlog_max_offset
        sizes = _file_sizes(store_dir)
        with pytest.raises(StoreFull) as refused:
            store.put_batch(batch)
        assert not store.read_only
        what = {
            "reserve": "kept in reserve",
            "enospc-in-the-log": "cannot write segment",
            "enospc-in-the-queues": "cannot write consume queue",
        }[where]
        assert what in str(refused.value)
        assert store.commitlog_max_offset == end
        after = _file_sizes(store_dir)
        assert {k: v for k, v in after.items() if k in sizes} == sizes
        assert not [v for k, v in after.items() if k not in sizes and v]  # new ones empty
        assert [store.max_offset("T", q) for q in range(23)] == [4, 3, 3] + [0] * 20
        # space returns: the same batch goes in whole
        (tiny_tmpfs / "filler").unlink()
        assert store.check_space() is not SpaceLevel.FULL
        results = store.put_batch(batch)
        assert results[0].physical_offset == end
        got = records_by_queue(store)
        assert len(got) == len(kept) + len(batch)
    with MessageStore.open(store_dir, config) as store:
        assert records_by_queue(store) == got


def test_store_ts_field_offset_matches_the_record_layout() -> None:
    """The masks above must hit the store time: guard against a layout change."""
    from ha_controller.protocol.record import StoredMessage, encode_record

    raw = encode_record(StoredMessage("T", 0, b"x", store_ts_ms=0x0102030405060708))
    assert struct.unpack(">Q", raw[_STORE_TS])[0] == 0x0102030405060708


def test_sync_mode_makes_the_whole_batch_durable_with_one_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = StoreConfig(segment_size_bytes=1 << 20, max_message_size_bytes=4096, flush_mode="sync")
    with MessageStore.open(tmp_path, config) as store:
        store.put("T", 0, b"first")  # creates the segment and the queue's directory
        calls: list[int] = []
        real = os.fdatasync

        def counting(fd: int) -> None:
            calls.append(fd)
            real(fd)

        monkeypatch.setattr(os, "fdatasync", counting)
        results = store.put_batch([request(i, 1000, 0) for i in range(64)])
        assert len(calls) == 1
        end = results[-1].physical_offset + results[-1].size
        assert store.flushed_offset == store.commitlog_max_offset == end
