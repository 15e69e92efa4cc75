"""The unavailability windows on Spark: operations as the windows see them, the
earliest success per scope and bucket (the closes), and the fault windows put
together on the driver (definitions: :mod:`ha_controller.drills.checker`)."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from ha_controller.drills.checker import (
    AVAILABILITY_KINDS,
    FaultWindow,
    target_group,
)
from ha_controller.pipeline.rows import part

__all__ = ["Windows", "closes", "operations"]


def operations(ev: DataFrame, keys: DataFrame) -> DataFrame:
    """Writes and reads as the availability windows see them (checker docstring):
    ``hid, op ("write"|"read"), ok, t, issued, grp`` (``grp`` null: no group named).
    Writes come from the per-key rows (:mod:`ha_controller.pipeline.verdict`), reads
    from the events."""
    col = F.col
    sends = keys.where(col("t_inv").isNotNull() | (F.size("outcomes") > 0))
    answered = sends.select("hid", "t_inv", "inv_broker", F.explode("outcomes").alias("o")).select(
        "hid",
        F.lit("write").alias("op"),
        (col("o.type") == "ok").alias("ok"),
        col("o.t_ms").alias("t"),
        F.coalesce(col("t_inv"), col("o.t_ms")).alias("issued"),
        F.when(col("o.type") == "ok", col("o.broker"))
        .otherwise(F.coalesce(col("o.broker"), col("inv_broker")))
        .alias("grp"),
    )
    unanswered = sends.where(F.size("outcomes") == 0).select(
        "hid",
        F.lit("write").alias("op"),
        F.lit(False).alias("ok"),
        col("t_inv").alias("t"),
        col("t_inv").alias("issued"),
        col("inv_broker").alias("grp"),
    )
    reads = ev.where((col("f") == "receive") & col("type").isin("ok", "fail", "info")).select(
        "hid",
        F.lit("read").alias("op"),
        (col("type") == "ok").alias("ok"),
        col("t_ms").alias("t"),
        col("t_ms").alias("issued"),
        col("broker").alias("grp"),
    )
    return answered.unionByName(unanswered).unionByName(reads)


#: an availability scope: (history, "write"|"read", group, or None for the cluster)
_Scope = tuple[str, str, str | None]


def closes(
    spark: SparkSession,
    ev: DataFrame,
    keys: DataFrame,
    scopes: Mapping[_Scope, Sequence[int]],
) -> DataFrame:
    """The earliest success closing each window, as small rows.

    ``scopes``: the distinct openings of every scope, sorted.  A success closes a window
    opened at ``w`` when it was issued and recorded at or after ``w``, i.e. when
    ``least(issued, t) >= w``; it is put in the bucket of the last opening at or before
    that, and the earliest ``t`` of each (scope, bucket) comes back: the window opened
    at the ``k``-th opening closes at the earliest of the buckets ``k`` and after
    (:meth:`Windows.close`).  At most one row per opening and scope."""
    col = F.col
    table = spark.createDataFrame(
        [(hid, op, grp, list(ws)) for (hid, op, grp), ws in scopes.items()],
        "w_hid string, w_op string, w_grp string, ws array<long>",
    )
    reached = F.least(col("issued"), col("t"))
    return part(
        "close",
        operations(ev, keys)
        .where(col("ok"))
        .join(
            F.broadcast(table),
            (col("hid") == col("w_hid"))
            & (col("op") == col("w_op"))
            & (col("w_grp").isNull() | (col("grp") == col("w_grp"))),
        )
        .select(
            col("w_hid").alias("hid"),
            "w_op",
            "w_grp",
            F.size(F.filter("ws", lambda w: w <= reached)).alias("bucket"),
            "t",
        )
        .where(col("bucket") > 0)
        .groupBy("hid", "w_op", "w_grp", "bucket")
        .agg(F.min("t").alias("t")),
        s1="w_op",
        s2="w_grp",
        n1="bucket",
        n2="t",
    )


class Windows:
    """The faults of every history and their unavailability windows, put together on
    the driver from the collected rows, as the checker defines them (its ``_faults``):
    the fault events (:meth:`__init__`), the failures per (scope, epoch)
    (:meth:`open`), and the earliest success per (scope, bucket) (:meth:`close`)."""

    def __init__(self, fault_rows: Sequence[Row]) -> None:
        self._starts: dict[str, list[tuple[int, str, str]]] = {}
        self._heals: dict[tuple[str, str, str], list[int]] = {}
        for r in fault_rows:
            hid, t, kind, target = str(r["hid"]), int(r["n1"]), str(r["s2"]), str(r["s3"])
            if r["s1"] == "info":
                self._starts.setdefault(hid, []).append((t, kind, target))
            else:
                self._heals.setdefault((hid, kind, target), []).append(t)
        for starts in self._starts.values():
            starts.sort()
        for heals in self._heals.values():
            heals.sort()
        #: each history's distinct fault starts, sorted (epoch k starts at the k-th)
        self.epochs = {hid: sorted({s for s, _, _ in v}) for hid, v in self._starts.items()}
        self._groups: dict[tuple[str, str], set[str]] = {}
        self._opened: dict[tuple[_Scope, int], int] = {}  # (scope, start) -> opening
        self._unattributed: dict[tuple[str, str, int], int] = {}  # (hid, op, epoch)
        self._closed: dict[tuple[_Scope, int], int] = {}  # (scope, opening) -> close

    @property
    def hids(self) -> list[str]:
        return sorted(self._starts)

    def _end(self, hid: str, start: int, kind: str, target: str) -> int | None:
        healed = self._heals.get((hid, kind, target), [])
        i = bisect.bisect_left(healed, start)
        return healed[i] if i < len(healed) else None

    def stubs(self, hid: str, write_groups: Sequence[str]) -> list[FaultWindow]:
        """The faults of ``hid`` without their windows (every write group at 0): what
        :func:`no_writable_master_spans` reads."""
        return [
            FaultWindow(
                kind,
                target,
                start,
                self._end(hid, start, kind, target),
                0,
                write_unavailable_ms=dict.fromkeys(write_groups, 0),
            )
            for start, kind, target in self._starts.get(hid, [])
        ]

    def open(self, rows: Sequence[Row]) -> None:
        """The openings, from one row per (history, kind, group, epoch) with the number
        of failures and their earliest issue (``_second_round``'s ``ops``)."""
        failed: dict[tuple[_Scope, int], tuple[int, int | None]] = {}
        for r in rows:
            hid, op, grp = str(r["hid"]), str(r["s1"]), r["s2"]
            if grp is not None:
                self._groups.setdefault((hid, op), set()).add(str(grp))
            e, n, issued = int(r["n1"]), int(r["n2"]), r["n3"]
            if e == 0 or n == 0:
                continue
            if grp is None:
                self._unattributed[(hid, op, e)] = n
            for scope in ((hid, op, None), *(((hid, op, str(grp)),) if grp is not None else ())):
                was_n, was_t = failed.get((scope, e), (0, None))
                t = int(issued) if was_t is None else min(was_t, int(issued))
                failed[(scope, e)] = (was_n + n, t)
        for hid, starts in self._starts.items():
            targeted: dict[int, set[str]] = {}
            for start, _kind, target in starts:
                group = target_group(target)
                if group is not None:
                    targeted.setdefault(start, set()).add(group)
            for e, start in enumerate(self.epochs[hid], 1):
                for op in AVAILABILITY_KINDS:
                    for grp in (None, *sorted(self._groups.get((hid, op), ()))):
                        scope = (hid, op, grp)
                        if op == "write" and grp is not None and grp in targeted.get(start, ()):
                            self._opened[(scope, start)] = start
                        elif (scope, e) in failed:
                            issued = failed[(scope, e)][1]
                            assert issued is not None
                            self._opened[(scope, start)] = max(issued, start)

    def scopes(self) -> dict[_Scope, list[int]]:
        """Every scope with an opened window -> its distinct openings, sorted."""
        out: dict[_Scope, set[int]] = {}
        for (scope, _start), opened in self._opened.items():
            out.setdefault(scope, set()).add(opened)
        return {scope: sorted(ws) for scope, ws in out.items()}

    def close(self, rows: Sequence[Row]) -> None:
        """The closes, from the earliest success per (scope, bucket) (:func:`_closes`)."""
        scopes = self.scopes()
        earliest: dict[_Scope, dict[int, int]] = {}
        for r in rows:
            scope = (str(r["hid"]), str(r["s1"]), None if r["s2"] is None else str(r["s2"]))
            earliest.setdefault(scope, {})[int(r["n1"])] = int(r["n2"])
        for scope, ws in scopes.items():
            found = earliest.get(scope, {})
            best: int | None = None
            for k in range(len(ws), 0, -1):  # bucket k holds successes from ws[k - 1] on
                t = found.get(k)
                if t is not None and (best is None or t < best):
                    best = t
                if best is not None:
                    self._closed[(scope, ws[k - 1])] = best

    def _window(self, scope: _Scope, start: int) -> int | None:
        opened = self._opened.get((scope, start))
        if opened is None:
            return 0  # no failure in the epoch
        closed = self._closed.get((scope, opened))
        return None if closed is None else closed - opened

    def faults(self) -> dict[str, tuple[FaultWindow, ...]]:
        out: dict[str, tuple[FaultWindow, ...]] = {}
        for hid, starts in self._starts.items():
            epoch = {start: e for e, start in enumerate(self.epochs[hid], 1)}
            write_groups = sorted(self._groups.get((hid, "write"), ()))
            read_groups = sorted(self._groups.get((hid, "read"), ()))
            out[hid] = tuple(
                FaultWindow(
                    kind,
                    target,
                    start,
                    self._end(hid, start, kind, target),
                    self._window((hid, "write", None), start),
                    self._window((hid, "read", None), start),
                    {g: self._window((hid, "write", g), start) for g in write_groups},
                    {g: self._window((hid, "read", g), start) for g in read_groups},
                    self._unattributed.get((hid, "write", epoch[start]), 0),
                    self._unattributed.get((hid, "read", epoch[start]), 0),
                )
                for start, kind, target in starts
            )
        return out
