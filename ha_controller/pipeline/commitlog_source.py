"""A PySpark Python data source over commit-log segment files, and a store audit.

    spark.dataSource.register(CommitLogDataSource)
    df = spark.read.format("hac_commitlog").load("/var/lib/hac/store")   # or .../commitlog

One partition (one Spark task) per segment file (``commitlog/<20 digits>``, see
:mod:`broker_agent.store.commitlog`); one row per message record, blanks skipped::

    segment string, physical_offset long, size long, topic string, queue_id long,
    queue_offset long, born_ts_ms long, store_ts_ms long, uniq_key string, keys string,
    crc_ok boolean, body_len long, error string

The record layout is :mod:`ha_controller.protocol.record`.  ``physical_offset`` is where
the record sits (segment start + position), not what its header claims.  A record that
fails to verify never crashes the reader: it becomes a row with ``crc_ok = false``, an
``error`` (CRC mismatch, inner lengths that disagree, a header physical offset that is not
its position, bad magic or length) and null strings.  When its length field is sane the
reader resumes right after it; otherwise it searches forward for the next record head
(message magic whose header physical offset equals its position) and resumes there.  A
zero length field ends the segment's data (unwritten tail); a blank record ends the
segment.

``read()`` walks the length fields in Python (one ``unpack_from`` and one ``zlib.crc32``
per record, both C calls) and decodes every field with numpy gathers over the whole
segment, handing Arrow record batches to Spark (per-record Python objects measured
about 2x slower with PySpark 4.3).
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from ha_controller.protocol.record import BLANK_MAGIC, HEADER_SIZE, MESSAGE_MAGIC, MIN_RECORD_SIZE

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["SCHEMA", "CommitLogDataSource", "SegmentPartition", "audit_store", "read_segment"]

SCHEMA = (
    "segment string, physical_offset long, size long, topic string, queue_id long, "
    "queue_offset long, born_ts_ms long, store_ts_ms long, uniq_key string, keys string, "
    "crc_ok boolean, body_len long, error string"
)
_SEGMENT_NAME = re.compile(r"^\d{20}$")
_PREFIX = struct.Struct(">II")
_MAGIC_BYTES = struct.pack(">I", MESSAGE_MAGIC)
_BATCH_ROWS = 65_536


class SegmentPartition(InputPartition):
    """One segment file: its path and its start offset (from the file name)."""

    def __init__(self, path: str, start: int) -> None:
        super().__init__(path)
        self.path = path
        self.start = start


def segment_files(path: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """``(start offset, file)`` of every segment under a store or commit-log directory."""
    root = Path(path)
    if (root / "commitlog").is_dir():
        root = root / "commitlog"
    if not root.is_dir():
        raise FileNotFoundError(f"no commit-log directory at {path}")
    return sorted(
        (int(p.name), str(p)) for p in root.iterdir() if _SEGMENT_NAME.match(p.name) and p.is_file()
    )


class CommitLogReader(DataSourceReader):
    def __init__(self, path: str) -> None:
        self.path = path

    def partitions(self) -> Sequence[InputPartition]:
        return [SegmentPartition(p, start) for start, p in segment_files(self.path)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SegmentPartition)
        yield from read_segment(partition.path, partition.start)


class CommitLogDataSource(DataSource):
    """``spark.read.format("hac_commitlog").load(store_or_commitlog_dir)``."""

    @classmethod
    def name(cls) -> str:
        return "hac_commitlog"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        path = self.options.get("path")
        if not path:
            raise ValueError("hac_commitlog needs a path: .load(store_dir)")
        return CommitLogReader(str(path))


# --- segment parsing ------------------------------------------------------------------


def _walk(buf: bytes, seg_start: int) -> tuple[list[int], list[int], list[int], list[str]]:
    """Find record heads: ``(positions, sizes, bad positions, bad reasons)``."""
    positions: list[int] = []
    sizes: list[int] = []
    bad_pos: list[int] = []
    bad_why: list[str] = []
    n = len(buf)
    pos = 0
    unpack = _PREFIX.unpack_from
    while pos + 8 <= n:
        total, magic = unpack(buf, pos)
        if total == 0:
            break  # unwritten tail
        if magic == BLANK_MAGIC and pos + total <= n:
            pos += total
            continue
        if magic == MESSAGE_MAGIC and MIN_RECORD_SIZE <= total <= n - pos:
            positions.append(pos)
            sizes.append(total)
            pos += total
            continue
        bad_pos.append(pos)
        bad_why.append(
            f"bad magic 0x{magic:08x}"
            if magic not in (MESSAGE_MAGIC, BLANK_MAGIC)
            else f"bad length {total}"
        )
        pos = _resync(buf, pos + 1, seg_start)
    else:
        if 0 < n - pos < 8 and any(buf[pos:]):
            bad_pos.append(pos)
            bad_why.append("torn record head")
    return positions, sizes, bad_pos, bad_why


def _resync(buf: bytes, start: int, seg_start: int) -> int:
    """Next position holding a plausible message head (its header offset matches)."""
    n = len(buf)
    find = buf.find
    cand = find(_MAGIC_BYTES, start + 4)
    while cand != -1:
        head = cand - 4
        if head + HEADER_SIZE <= n:
            total = struct.unpack_from(">I", buf, head)[0]
            physical = struct.unpack_from(">Q", buf, head + 28)[0]
            if physical == seg_start + head and MIN_RECORD_SIZE <= total <= n - head:
                return head
        cand = find(_MAGIC_BYTES, cand + 1)
    return n


def _gather_uint(
    arr: npt.NDArray[np.uint8], pos: npt.NDArray[np.int64], width: int
) -> npt.NDArray[np.int64]:
    import numpy as np

    idx = pos[:, None] + np.arange(width, dtype=np.int64)
    raw = arr[idx].astype(np.uint64)
    out = np.zeros(len(pos), dtype=np.uint64)
    for i in range(width):
        out = (out << np.uint64(8)) | raw[:, i]
    return out.astype(np.int64)


def _strings(
    arr: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    valid: npt.NDArray[np.bool_],
) -> pa.Array:
    """A UTF-8 string array sliced out of ``arr``; invalid rows are null."""
    import numpy as np
    import pyarrow as pa

    lens = np.where(valid, lengths, 0)
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    if total:
        idx = np.repeat(starts - offsets[:-1], lens) + np.arange(total, dtype=np.int64)
        data = arr[idx].tobytes()
    else:
        data = b""
    binary = pa.Array.from_buffers(
        pa.large_binary(),
        len(lens),
        [
            pa.py_buffer(np.packbits(valid, bitorder="little").tobytes()),
            pa.py_buffer(offsets.tobytes()),
            pa.py_buffer(data),
        ],
    )
    try:
        return binary.cast(pa.large_string()).cast(pa.string())
    except pa.ArrowInvalid:  # invalid UTF-8 somewhere: decode row by row, bad rows null
        return pa.array([_utf8_or_none(v) for v in binary.to_pylist()], type=pa.string())


def _utf8_or_none(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_segment(path: str, seg_start: int) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the rows of one segment file (see the module docstring)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    with open(path, "rb") as fh:
        buf = fh.read()
    positions, sizes, bad_pos, bad_why = _walk(buf, seg_start)
    arr = np.frombuffer(buf, dtype=np.uint8)
    n_buf = len(buf)
    segment = os.path.basename(path)
    for lo in range(0, len(positions), _BATCH_ROWS):
        pos = np.asarray(positions[lo : lo + _BATCH_ROWS], dtype=np.int64)
        size = np.asarray(sizes[lo : lo + _BATCH_ROWS], dtype=np.int64)
        end = pos + size
        crc_stored = _gather_uint(arr, pos + 8, 4)
        crc_ok = (
            np.fromiter(
                (
                    zlib.crc32(buf[p + 12 : e])
                    for p, e in zip(pos.tolist(), end.tolist(), strict=True)
                ),
                dtype=np.int64,
                count=len(pos),
            )
            == crc_stored
        )
        queue_id = _gather_uint(arr, pos + 16, 4)
        queue_offset = _gather_uint(arr, pos + 20, 8)
        physical = _gather_uint(arr, pos + 28, 8)
        born = _gather_uint(arr, pos + 36, 8)
        store = _gather_uint(arr, pos + 44, 8)
        # Variable part: born_host u16, store_host u16, topic u16, properties u32, body u32.
        ok = crc_ok.copy()
        starts: list[npt.NDArray[np.int64]] = []
        lengths: list[npt.NDArray[np.int64]] = []
        p = pos + HEADER_SIZE
        for width in (2, 2, 2, 4, 4):
            ok &= p + width <= end
            safe = np.where(ok, p, 0)
            length = np.where(ok, _gather_uint(arr, np.minimum(safe, n_buf - width), width), 0)
            starts.append(p + width)
            lengths.append(length)
            p = p + width + length
        ok &= p == end
        bad_offset = crc_ok & (p == end) & (physical != seg_start + pos)
        ok &= ~bad_offset
        errors = np.where(
            ~crc_ok,
            "CRC mismatch",
            np.where(
                bad_offset,
                "header physical offset differs from position",
                np.where(ok, "", "inner lengths disagree with the record length"),
            ),
        )
        topic = _strings(arr, starts[2], lengths[2], ok)
        props = _strings(arr, starts[3], lengths[3], ok)
        uniq = pc.struct_field(
            pc.extract_regex(props, r"(?:^|\x02)UNIQ_KEY\x01(?P<v>[^\x02]*)"), "v"
        )
        keys = pc.struct_field(pc.extract_regex(props, r"(?:^|\x02)KEYS\x01(?P<v>[^\x02]*)"), "v")
        null_if_bad = pa.array(~ok)
        err = pa.array(errors.tolist(), type=pa.string())
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(np.full(len(pos), segment, dtype=object), type=pa.string()),
                pa.array(seg_start + pos),
                pa.array(size),
                topic,
                pa.array(np.where(ok, queue_id, 0), mask=~ok),
                pa.array(np.where(ok, queue_offset, 0), mask=~ok),
                pa.array(born, mask=~ok),
                pa.array(store, mask=~ok),
                uniq,
                keys,
                pa.array(ok),
                pa.array(np.where(ok, lengths[4], 0), mask=~ok),
                pc.if_else(null_if_bad, err, pa.nulls(len(pos), pa.string())),
            ],
            schema=_arrow_schema(),
        )
    if bad_pos:
        k = len(bad_pos)
        nulls = pa.nulls(k, pa.int64())
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([segment] * k, type=pa.string()),
                pa.array([seg_start + b for b in bad_pos], type=pa.int64()),
                nulls,
                pa.nulls(k, pa.string()),
                nulls,
                nulls,
                nulls,
                nulls,
                pa.nulls(k, pa.string()),
                pa.nulls(k, pa.string()),
                pa.array([False] * k),
                nulls,
                pa.array(bad_why, type=pa.string()),
            ],
            schema=_arrow_schema(),
        )


def _arrow_schema() -> pa.Schema:
    import pyarrow as pa

    long = pa.int64()
    text = pa.string()
    return pa.schema(
        [
            ("segment", text),
            ("physical_offset", long),
            ("size", long),
            ("topic", text),
            ("queue_id", long),
            ("queue_offset", long),
            ("born_ts_ms", long),
            ("store_ts_ms", long),
            ("uniq_key", text),
            ("keys", text),
            ("crc_ok", pa.bool_()),
            ("body_len", long),
            ("error", text),
        ]
    )


# --- audit ------------------------------------------------------------------------------


def load_commitlog(spark: SparkSession, store_dir: str | os.PathLike[str]) -> DataFrame:
    spark.dataSource.register(CommitLogDataSource)
    return spark.read.format(CommitLogDataSource.name()).load(os.fspath(store_dir))


def audit_store(
    spark: SparkSession,
    store_dir: str | os.PathLike[str],
    acknowledged_keys: Iterable[str] | DataFrame,
    *,
    sample: int = 20,
) -> dict[str, Any]:
    """Audit a store's commit log against the keys a drill saw acknowledged.

    A key is present when a verified record carries it as ``UNIQ_KEY`` or among its
    ``KEYS``.  Every (topic, queue id) must hold contiguous queue offsets without
    repeats over its verified records.  Returns ``{"ok", "records", "corrupt",
    "corrupt_records", "acknowledged", "missing", "missing_keys", "queues",
    "non_contiguous"}`` (the lists are samples of at most ``sample`` entries).
    """
    col = F.col
    df = load_commitlog(spark, store_dir)
    if isinstance(acknowledged_keys, DataFrame):
        acked = acknowledged_keys.select(col(acknowledged_keys.columns[0]).alias("k"))
    else:
        acked = spark.createDataFrame([(k,) for k in acknowledged_keys], "k string")
    acked = acked.distinct()
    good = df.where(col("crc_ok"))
    present = (
        good.select(col("uniq_key").alias("k"))
        .unionByName(
            good.select(F.explode(F.split(F.coalesce(col("keys"), F.lit("")), " ")).alias("k"))
        )
        .where(col("k").isNotNull() & (col("k") != ""))
        .distinct()
    )
    missing = acked.join(present, "k", "left_anti")
    queues = (
        good.groupBy("topic", "queue_id")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.count_distinct("queue_offset").alias("distinct"),
            F.min("queue_offset").alias("min_offset"),
            F.max("queue_offset").alias("max_offset"),
        )
        .withColumn(
            "contiguous",
            (col("count") == col("distinct"))
            & (col("max_offset") - col("min_offset") + 1 == col("count")),
        )
    )
    totals = (
        df.agg(
            F.count(F.lit(1)).alias("records"),
            F.sum(F.when(~col("crc_ok"), 1).otherwise(0)).alias("corrupt"),
        )
        .crossJoin(acked.agg(F.count(F.lit(1)).alias("acknowledged")))
        .crossJoin(missing.agg(F.count(F.lit(1)).alias("missing")))
        .crossJoin(
            queues.agg(
                F.count(F.lit(1)).alias("queues"),
                F.sum(F.when(col("contiguous"), 0).otherwise(1)).alias("non_contiguous_count"),
            )
        )
        .collect()[0]
    )
    corrupt_rows = (
        df.where(~col("crc_ok"))
        .select("segment", "physical_offset", "size", "error")
        .orderBy("physical_offset")
        .limit(sample)
        .collect()
    )
    gaps = queues.where(~col("contiguous")).orderBy("topic", "queue_id").limit(sample).collect()
    missing_sample = [r["k"] for r in missing.orderBy("k").limit(sample).collect()]
    corrupt = int(totals["corrupt"] or 0)
    n_missing = int(totals["missing"] or 0)
    n_gaps = int(totals["non_contiguous_count"] or 0)
    return {
        "ok": corrupt == 0 and n_missing == 0 and n_gaps == 0,
        "records": int(totals["records"] or 0),
        "corrupt": corrupt,
        "corrupt_records": [r.asDict() for r in corrupt_rows],
        "acknowledged": int(totals["acknowledged"] or 0),
        "missing": n_missing,
        "missing_keys": missing_sample,
        "queues": int(totals["queues"] or 0),
        "non_contiguous": [
            {
                "topic": r["topic"],
                "queue_id": r["queue_id"],
                "count": r["count"],
                "min_offset": r["min_offset"],
                "max_offset": r["max_offset"],
            }
            for r in gaps
        ],
    }
