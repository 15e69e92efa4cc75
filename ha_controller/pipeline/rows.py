"""The small rows every verdict round collects: which part of the verdict a row is,
its history, up to three names and five numbers (bounded by histories x faults x
groups x topics, never by events)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

__all__ = ["SMALL_COLUMNS", "Rows", "collect", "flag", "part", "total"]

#: the verdict a row belongs to, its history, and up to three names and five numbers
SMALL_COLUMNS = ("part", "hid", "s1", "s2", "s3", "n1", "n2", "n3", "n4", "n5", "groups")


def part(name: str, frame: DataFrame, **columns: Column | str) -> DataFrame:
    """``frame`` as rows of part ``name`` (``hid`` plus ``columns`` by small-row name)."""
    return frame.select(
        F.lit(name).alias("part"),
        "hid",
        *[
            (F.col(c) if isinstance(c, str) else c).alias(alias)
            for alias, c in sorted(columns.items())
        ],
    )


def collect(parts: Sequence[DataFrame]) -> list[Row]:
    """One ``collect`` of the union of small frames made by :func:`_part`."""
    union = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)
    return union.collect()  # small rows: bounded by histories x faults x groups x topics


class Rows:
    """Collected small rows by part and history."""

    def __init__(self, rows: Sequence[Row]) -> None:
        self._parts: dict[tuple[str, str], list[Row]] = {}
        for r in rows:
            self._parts.setdefault((str(r["part"]), str(r["hid"])), []).append(r)

    def of(self, part: str, hid: str) -> list[Row]:
        return self._parts.get((part, hid), [])

    def every(self, part: str) -> list[Row]:
        return [r for (p, _hid), rows in self._parts.items() if p == part for r in rows]

    def total(self, part: str, hid: str, column: str) -> int:
        return sum(int(r[column] or 0) for r in self.of(part, hid))

    def write_groups(self, hid: str) -> list[str]:
        return sorted({str(g) for r in self.of("keys", hid) for g in r["groups"] or ()})


def total(name: str, expr: Column) -> Column:
    return F.coalesce(F.sum(expr), F.lit(0)).cast("long").alias(name)


def flag(cond: Column) -> Column:
    return F.when(cond, 1).otherwise(0)
