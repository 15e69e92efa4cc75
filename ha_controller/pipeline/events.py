"""Drill histories as Spark reads them: the explicit schema, the JSON-lines or Parquet
reader, and a campaign's histories in one scan (a ``hid`` column per drill)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import reduce
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from ha_controller.drills.history import VALUE_FIELDS, columnar_copy

__all__ = ["EVENT_SCHEMA", "VALUE_SCHEMA", "HistorySource", "flat", "read_drills", "read_events"]


_SPARK_TYPES: dict[str, Any] = {
    "string": StringType(),
    "long": LongType(),
    "boolean": BooleanType(),
}
_VALUE_FIELDS: tuple[tuple[str, Any], ...] = tuple(
    (name, _SPARK_TYPES[kind]) for name, kind in VALUE_FIELDS
)

#: ``value`` of every event kind the checkers read (history module docstring).
VALUE_SCHEMA = StructType([StructField(name, dtype, True) for name, dtype in _VALUE_FIELDS])

#: One history line.
EVENT_SCHEMA = StructType(
    [
        StructField("t_ms", LongType(), True),
        StructField("process", StringType(), True),
        StructField("type", StringType(), True),
        StructField("f", StringType(), True),
        StructField("value", VALUE_SCHEMA, True),
    ]
)


def read_events(spark: SparkSession, paths: str | os.PathLike[str] | Sequence[Any]) -> DataFrame:
    """Read history files with the explicit schema.

    A JSON-lines file with a current columnar copy (``history.parquet``, see
    :func:`ha_controller.drills.history.write_columnar`) is read from the copy: no JSON
    parsing, and only the columns a query uses.  Otherwise the JSON lines are read
    (FAILFAST): a line that is not JSON, or whose fields do not fit
    :data:`EVENT_SCHEMA` (a string where a number belongs), fails the job; the
    in-process reader rejects the first and treats a mistyped value field as missing.
    """
    if isinstance(paths, str | os.PathLike):
        files = [os.fspath(paths)]
    else:
        files = [os.fspath(p) for p in paths]
    columnar = {f: columnar_copy(f) for f in files}
    parquet = [os.fspath(c) for c in columnar.values() if c is not None]
    jsonl = [f for f, c in columnar.items() if c is None]
    frames = []
    if parquet:
        frames.append(spark.read.schema(EVENT_SCHEMA).parquet(*parquet))
    if jsonl or not frames:
        frames.append(spark.read.schema(EVENT_SCHEMA).option("mode", "FAILFAST").json(jsonl))
    return reduce(lambda a, b: a.unionByName(b), frames)


def flat(events: DataFrame) -> DataFrame:
    return events.where(
        F.col("t_ms").isNotNull() & F.col("type").isNotNull() & F.col("f").isNotNull()
    ).select(
        "hid",
        "t_ms",
        "type",
        "f",
        *[F.col(f"value.{name}").alias(name) for name, _ in _VALUE_FIELDS if name != "role"],
    )


HistorySource = str | os.PathLike[str] | Sequence[Any] | DataFrame


def read_drills(spark: SparkSession, files: Mapping[str, Sequence[Path]]) -> DataFrame:
    """The histories of many drills (drill -> its ``history*.jsonl`` files) read in one
    scan, with a ``hid`` column naming each event's drill (the name of the directory
    its file is in, which must be the drill's name) and partitioned by it."""
    for drill, paths in files.items():
        for path in paths:
            if Path(path).parent.name != drill:
                raise ValueError(f"{path}: a history of drill {drill!r} must be in {drill}/")
    everything = [p for paths in files.values() for p in paths]
    return (
        read_events(spark, everything)
        .withColumn("hid", F.regexp_extract(F.input_file_name(), r"([^/]+)/[^/]+$", 1))
        .repartition("hid")
    )
