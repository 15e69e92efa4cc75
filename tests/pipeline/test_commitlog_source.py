"""The hac_commitlog data source over a real store, with corrupted records on disk."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from broker_agent.store import MessageStore, PutResult, StoreConfig
from ha_controller.pipeline.commitlog_source import (
    audit_store,
    load_commitlog,
    read_segment,
    segment_files,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SEGMENT = 8192
N = 120


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[PutResult]]:
    """A closed store of N messages over several small segments."""
    path = tmp_path_factory.mktemp("store")
    config = StoreConfig(segment_size_bytes=SEGMENT, max_message_size_bytes=4096)
    with MessageStore.open(path, config) as st:
        puts = [
            st.put(
                f"T{i % 2}",
                i % 3,
                bytes([i % 251]) * (i * 7 % 300),
                {"UNIQ_KEY": f"u{i}", "KEYS": f"k{i} alt{i}"},
                store_host="127.0.0.1:10911",
            )
            for i in range(N)
        ]
    return path, puts


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _poke(store_dir: Path, physical_offset: int, data: bytes) -> None:
    start = physical_offset - physical_offset % SEGMENT
    seg = store_dir / "commitlog" / f"{start:020d}"
    with seg.open("r+b") as fh:
        fh.seek(physical_offset - start)
        fh.write(data)


def _rows(spark: SparkSession, store_dir: Path) -> list[dict[str, Any]]:
    df = load_commitlog(spark, store_dir).orderBy("physical_offset")
    return [r.asDict() for r in df.collect()]


def test_reads_every_record(spark: SparkSession, store: tuple[Path, list[PutResult]]) -> None:
    path, puts = store
    assert len(segment_files(path)) > 2
    rows = _rows(spark, path)
    assert [r["physical_offset"] for r in rows] == [p.physical_offset for p in puts]
    assert all(r["crc_ok"] and r["error"] is None for r in rows)
    first = rows[5]
    assert first["topic"] == "T1"
    assert first["queue_id"] == 2
    assert first["queue_offset"] == puts[5].queue_offset
    assert first["uniq_key"] == "u5"
    assert first["keys"] == "k5 alt5"
    assert first["body_len"] == 35
    assert first["size"] == puts[5].size
    assert first["store_ts_ms"] == puts[5].store_ts_ms
    assert first["segment"] == f"{0:020d}"


def test_crc_corruption_flags_exactly_that_record(
    spark: SparkSession, store: tuple[Path, list[PutResult]], tmp_path: Path
) -> None:
    path, puts = store
    broken = _copy(path, tmp_path / "s")
    victim = puts[40]
    _poke(broken, victim.physical_offset + victim.size - 1, b"\xff")  # last body byte
    rows = _rows(spark, broken)
    assert len(rows) == N
    bad = [r for r in rows if not r["crc_ok"]]
    assert [(r["physical_offset"], r["error"]) for r in bad] == [
        (victim.physical_offset, "CRC mismatch")
    ]
    assert bad[0]["topic"] is None and bad[0]["uniq_key"] is None
    assert bad[0]["size"] == victim.size


def test_bad_length_resyncs_to_the_next_record(
    spark: SparkSession, store: tuple[Path, list[PutResult]], tmp_path: Path
) -> None:
    path, puts = store
    broken = _copy(path, tmp_path / "s")
    victim = puts[70]
    _poke(broken, victim.physical_offset, struct.pack(">I", 0x7FFFFFF0))  # insane length
    rows = _rows(spark, broken)
    bad = [r for r in rows if not r["crc_ok"]]
    assert [(r["physical_offset"], r["error"]) for r in bad] == [
        (victim.physical_offset, "bad length 2147483632")
    ]
    good = [r["physical_offset"] for r in rows if r["crc_ok"]]
    assert good == [p.physical_offset for p in puts if p is not victim]


def test_torn_tail_and_zero_tail(store: tuple[Path, list[PutResult]], tmp_path: Path) -> None:
    path, puts = store
    broken = _copy(path, tmp_path / "s")
    start, seg = segment_files(broken)[-1]
    with open(seg, "ab") as fh:
        fh.write(bytes(64))  # pre-allocated zero tail: end of data, not an error
    rows = [r for b in read_segment(seg, start) for r in b.to_pylist()]
    assert rows and all(r["crc_ok"] for r in rows)
    assert rows[-1]["physical_offset"] == puts[-1].physical_offset


def test_audit_store(
    spark: SparkSession, store: tuple[Path, list[PutResult]], tmp_path: Path
) -> None:
    path, puts = store
    keys = [f"u{i}" for i in range(N)]
    clean = audit_store(spark, path, [*keys[:-1], "alt119"])  # business keys count too
    assert clean["ok"], clean
    assert (clean["records"], clean["corrupt"], clean["missing"]) == (N, 0, 0)
    assert clean["queues"] == 6

    broken = _copy(path, tmp_path / "s")
    victim = puts[33]  # T1, queue 0
    _poke(broken, victim.physical_offset + 60, b"\x00\x01\x02")
    report = audit_store(spark, broken, [*keys, "never-stored"])
    assert not report["ok"]
    assert report["corrupt"] == 1
    assert report["corrupt_records"][0]["physical_offset"] == victim.physical_offset
    assert report["missing"] == 2
    assert report["missing_keys"] == ["never-stored", "u33"]
    assert [(q["topic"], q["queue_id"]) for q in report["non_contiguous"]] == [("T1", 0)]


async def test_audit_of_a_store_written_by_a_broker_process(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A real broker (through hactl) writes the store; the audit finds every
    acknowledged message, then exactly the record we corrupt on disk."""
    from ha_controller.client.admin import NameserverClient
    from ha_controller.client.message import Message
    from ha_controller.client.producer import Producer
    from ha_controller.testing import eventually, run_cluster

    cluster = run_cluster(
        ("audit",),
        1,
        workdir=tmp_path,
        env={"HAC_TOTAL_REPLICAS": "1", "HAC_IN_SYNC_REPLICAS": "1"},
    )
    try:
        async with NameserverClient([cluster.namesrv]) as ns:

            async def online() -> bool:
                return any(g.master_online for g in await ns.groups())

            await eventually(online, timeout=30)
        receipts = []
        async with Producer(cluster.namesrv, group="audit-p") as producer:
            for i in range(40):
                receipts.append(
                    await producer.send(Message("Audited", bytes(100 + i), keys=(f"a{i}",)))
                )
    finally:
        cluster.stop()  # SIGTERM: the broker flushes and closes its store
    store_dir = tmp_path / "store" / "audit-0"
    keys = [r.uniq_key for r in receipts]
    clean = audit_store(spark, store_dir, keys)
    assert clean["ok"] and clean["missing"] == 0 and clean["corrupt"] == 0, clean

    victim = next(
        r.physical_offset
        for r in load_commitlog(spark, store_dir).orderBy("physical_offset").collect()
        if r["uniq_key"] == receipts[17].uniq_key
    )
    ((start, segment),) = segment_files(store_dir)
    with open(segment, "r+b") as fh:  # flip a byte inside that record's body
        fh.seek(victim - start + 80)
        byte = fh.read(1)
        fh.seek(victim - start + 80)
        fh.write(bytes([byte[0] ^ 0xFF]))
    report = audit_store(spark, store_dir, keys)
    assert not report["ok"]
    assert report["corrupt"] == 1
    assert report["corrupt_records"][0]["physical_offset"] == victim
    assert report["missing_keys"] == [receipts[17].uniq_key]
