"""The drill verdict computed with Spark DataFrame transforms, for histories of any size.

Every definition mirrors :mod:`ha_controller.drills.checker` (read its docstring); the
two produce the same ``Verdict.to_dict()`` for the same history, which the pipeline tests
assert.  Several history files are read as one history; a file with a current Parquet
copy (written by the drill's history writer) is read from the copy.

Only DataFrame APIs are used (no RDDs, no ``sparkContext``), so the job runs in local
mode, under ``spark-submit`` and over Spark Connect.  Nothing proportional to the history
reaches the driver: the counts come back as one row per history, the fault list (small)
is collected, and the unavailability windows come back as one row per (fault start,
write/read, group) plus the cluster: failures are joined with the broadcast fault epochs
to open the windows, successes with the broadcast openings to close them (first only
successes issued within ``CLOSE_HORIZON_MS`` of an opening, then, for windows still
open, all of them).  The
``availability`` summary is derived from the fault list by :class:`Verdict` itself, as in
the checker.

:func:`compute_verdicts` judges many histories in the same jobs (a ``hid`` column keys
every grouping and join), which keeps a campaign of small drills, or the tests, cheap;
:func:`read_drills` reads a campaign's histories in one scan with that column taken from
each file's drill directory, and :func:`verdicts_of` judges such a frame.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from functools import reduce
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from ha_controller.drills.checker import (
    TARGET_BROKER_RE,
    CheckOptions,
    FaultWindow,
    Verdict,
    no_writable_master_spans,
)
from ha_controller.drills.history import DELAY_LEVELS_MS, VALUE_FIELDS, columnar_copy

__all__ = [
    "EVENT_SCHEMA",
    "VALUE_SCHEMA",
    "compute_dir_verdict",
    "compute_verdict",
    "compute_verdicts",
    "fault_families",
    "main",
    "read_drills",
    "read_events",
    "verdicts_of",
]

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


def _flat(events: DataFrame) -> DataFrame:
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

#: an unavailability window is first closed by a success issued within this long of its
#: opening; windows still open after that are closed by an unbounded search
CLOSE_HORIZON_MS = 60_000


def compute_verdict(
    spark: SparkSession,
    history: HistorySource,
    *,
    scenario: str,
    options: CheckOptions | None = None,
) -> Verdict:
    """The verdict of one history: JSON-lines file(s) read as one history, or a DataFrame
    with :data:`EVENT_SCHEMA`'s columns."""
    return compute_verdicts(spark, {scenario: history}, options=options)[scenario]


def compute_verdicts(
    spark: SparkSession,
    histories: Mapping[str, HistorySource],
    *,
    options: CheckOptions | None = None,
) -> dict[str, Verdict]:
    """Verdicts of several independent histories (scenario name -> source) in one pass.

    Each history is judged on its own, exactly as :func:`compute_verdict` would; sharing
    the Spark jobs makes many small histories (a drill campaign, the tests) cheap.
    """
    if not histories:
        return {}
    frames = [
        (src if isinstance(src, DataFrame) else read_events(spark, src))
        .select(*EVENT_SCHEMA.fieldNames())
        .withColumn("hid", F.lit(name))
        for name, src in histories.items()
    ]
    events = reduce(lambda a, b: a.unionByName(b), frames)
    return verdicts_of(spark, events, list(histories), options=options)


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


def verdicts_of(
    spark: SparkSession,
    events: DataFrame,
    names: Sequence[str],
    *,
    options: CheckOptions | None = None,
) -> dict[str, Verdict]:
    """The verdict of every history in ``events`` (:data:`EVENT_SCHEMA`'s columns plus
    ``hid``, the history's name), judged on its own, in one pass; ``names`` lists the
    histories (one without events gets an empty verdict).

    The events that name a key are grouped by (history, key) once (:func:`_keys`, the
    one shuffle of the whole history); everything per key, per (key, consumer group)
    and the write operations of the availability windows is derived from those rows
    (cached), without joining events back.  The other event kinds are small.  Events
    read from JSON lines are cached once (each further scan would parse the JSON
    again); Parquet is scanned again instead, column by column.
    """
    opts = options if options is not None else CheckOptions()
    ev = _flat(events)
    cache_events = any(not f.endswith(".parquet") for f in events.inputFiles())
    if cache_events:
        ev = ev.persist(StorageLevel.MEMORY_AND_DISK)
    keys = _keys(ev, opts).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        # build the cache in a job of its own: the jobs below read it from several
        # stages at once, and each would otherwise compute the rows it finds missing
        keys.count()
        hids = spark.createDataFrame([(name,) for name in names], "hid string")
        faults = _faults(ev, keys)
        # the spans without a writable master, per history (few rows, from the faults)
        held = spark.createDataFrame(
            [
                (hid, a, b)
                for hid, windows in faults.items()
                for a, b in no_writable_master_spans(windows)
            ],
            "hid string, held_from long, held_until long",
        )
        counts = _counts(ev, keys, hids, held, opts)
    finally:
        keys.unpersist()
        if cache_events:
            ev.unpersist()
    return {
        name: Verdict(scenario=name, counts=counts[name], faults=faults.get(name, ()))
        for name in names
    }


def fault_families(events: DataFrame) -> dict[str, dict[tuple[int, str, str], list[str | None]]]:
    """hid -> ``(start_ms, kind, target)`` -> families, from the ``fault`` info events
    (as :func:`ha_controller.drills.campaign.fault_families` reads one history)."""
    col = F.col
    rows = (
        events.where(
            (col("f") == "fault")
            & (col("type") == "info")
            & col("t_ms").isNotNull()
            & col("value.kind").isNotNull()
            & col("value.target").isNotNull()
        )
        .select("hid", "t_ms", col("value.kind").alias("kind"), "value.target", "value.family")
        .collect()  # one row per fault
    )
    out: dict[str, dict[tuple[int, str, str], list[str | None]]] = {}
    for r in rows:
        key = (int(r["t_ms"]), str(r["kind"]), str(r["target"]))
        family = None if r["family"] is None else str(r["family"])
        out.setdefault(str(r["hid"]), {}).setdefault(key, []).append(family)
    return out


def _keys(ev: DataFrame, opts: CheckOptions) -> DataFrame:
    """One row per (history, key) with everything its events say: the send invoke's
    attributes, send outcomes, transaction resolution, and its receipts (and acks) as
    arrays; hash-partitioned by (hid, key), which later groupings that include both
    columns reuse without a shuffle."""
    col = F.col
    is_send = col("f") == "send"
    is_invoke = is_send & (col("type") == "invoke")
    is_outcome = is_send & col("type").isin("ok", "fail", "info")
    is_end = (col("f") == "end_tx") & col("commit").isNotNull()
    is_recv = (col("f") == "receive") & (col("type") == "ok") & col("consumer_group").isNotNull()
    is_ack = (col("f") == "ack") & (col("type") == "ok") & col("consumer_group").isNotNull()
    with_acks = opts.redelivery == "after_ack" or bool(opts.after_ack_groups)
    wanted = is_send | is_end | is_recv
    if with_acks:
        wanted = wanted | is_ack
    levels = F.array(*[F.lit(ms) for ms in DELAY_LEVELS_MS])
    level_idx = F.least(col("i.delay_level"), F.lit(len(DELAY_LEVELS_MS))).cast("int")
    aggs = [
        F.min_by(
            F.struct(
                col("t_ms").alias("t_inv"),
                "topic",
                "group",
                "tx",
                "delay_level",
                "delay_ms",
                "due_ts_ms",
            ),
            F.when(is_invoke, col("t_ms")),
        ).alias("i"),
        # the earliest invoke naming a broker, ties by name
        F.min(F.when(is_invoke & col("broker").isNotNull(), F.struct("t_ms", "broker"))).alias(
            "named"
        ),
        F.bool_or(is_send).alias("sent"),
        F.min(F.when(is_send & (col("type") == "ok"), col("t_ms"))).alias("ok_t"),
        F.coalesce(
            F.bool_or(F.when(is_end & (col("type") == "ok"), col("commit"))), F.lit(False)
        ).alias("committed"),
        F.coalesce(
            F.bool_or(F.when(is_end & col("type").isin("ok", "info"), ~col("commit"))),
            F.lit(False),
        ).alias("has_rb"),
        F.collect_list(F.when(is_outcome, F.struct("t_ms", "type", "broker"))).alias("outcomes"),
        F.collect_list(
            F.when(
                is_recv,
                F.struct(
                    col("consumer_group").alias("cg"),
                    F.coalesce(col("consumer"), F.lit("")).alias("consumer"),
                    "t_ms",
                    F.coalesce(col("queue_offset"), F.lit(-1)).alias("qo"),
                ),
            )
        ).alias("receipts"),
    ]
    if with_acks:
        aggs.append(
            F.collect_list(
                F.when(is_ack, F.struct(col("consumer_group").alias("cg"), "t_ms"))
            ).alias("acks")
        )
    per_key = ev.where(col("key").isNotNull() & wanted).groupBy("hid", "key").agg(*aggs)
    return (
        per_key.select(
            "hid",
            "key",
            "sent",
            "ok_t",
            "committed",
            "outcomes",
            "receipts",
            *(["acks"] if with_acks else []),
            F.size("receipts").alias("n_recv"),
            col("i.t_inv").alias("t_inv"),
            col("named.broker").alias("inv_broker"),
            F.coalesce(col("i.topic"), F.lit("")).alias("topic"),
            col("i.group").alias("group"),
            F.coalesce(col("i.tx"), F.lit(False)).alias("is_tx"),
            F.when(col("i.due_ts_ms").isNotNull(), col("i.due_ts_ms"))
            .when(col("i.delay_ms") > 0, col("i.t_inv") + col("i.delay_ms"))
            .when(col("i.delay_level") > 0, col("i.t_inv") + F.element_at(levels, level_idx))
            .alias("due"),
            F.when(col("i.due_ts_ms").isNotNull(), F.lit(opts.timer_tolerance_ms))
            .when(col("i.delay_ms") > 0, F.lit(opts.timer_tolerance_ms))
            .when(col("i.delay_level") > 0, F.lit(opts.level_tolerance_ms))
            .alias("tol"),
            (col("has_rb") & ~col("committed")).alias("rolled_back"),
        )
        .withColumn("unexpected", ~col("sent") | col("rolled_back"))
        .withColumn(
            "acked",
            col("ok_t").isNotNull() & ~col("rolled_back") & (col("committed") | ~col("is_tx")),
        )
    )


def _counts(
    ev: DataFrame, keys: DataFrame, hids: DataFrame, held: DataFrame, opts: CheckOptions
) -> dict[str, dict[str, int]]:
    col = F.col

    def total(name: str, expr: Column) -> Column:
        return F.coalesce(F.sum(expr), F.lit(0)).cast("long").alias(name)

    def flag(cond: Column) -> Column:
        return F.when(cond, 1).otherwise(0)

    key_counts = keys.groupBy("hid").agg(
        total("acknowledged", flag(col("acked"))),
        total("delivered", col("n_recv")),
        total("unexpected", F.when(col("unexpected"), col("n_recv"))),
        total(
            "recovered",
            flag(col("sent") & col("ok_t").isNull() & ~col("rolled_back") & (col("n_recv") > 0)),
        ),
        total(
            "unresolved_transactions",
            flag(
                col("is_tx")
                & col("ok_t").isNotNull()
                & ~col("committed")
                & ~col("rolled_back")
                & (col("n_recv") == 0)
            ),
        ),
    )

    # every receipt of a key that is not unexpected, with the key's attributes (no join
    # with the key rows; grouping the exploded receipts still shuffles them, about one
    # row per key: computing the pairs inside each key's row with array functions
    # instead measured slower)
    with_acks = "acks" in keys.columns
    rec = keys.where(~col("unexpected") & (col("n_recv") > 0)).select(
        "hid",
        "key",
        "topic",
        "group",
        "acked",
        "ok_t",
        "due",
        "tol",
        *(["acks"] if with_acks else []),
        F.explode("receipts").alias("r"),
    )
    pair_aggs = [
        F.count(F.lit(1)).alias("n"),
        F.min("r.t_ms").alias("first_t"),
        F.first("topic").alias("topic"),
        F.first("acked").alias("acked"),
        F.first("due").alias("due"),
        F.first("tol").alias("tol"),
    ]
    if with_acks:
        ack_t = F.array_min(
            F.transform(F.filter("acks", lambda a: a["cg"] == col("r.cg")), lambda a: a["t_ms"])
        )
        pair_aggs.append(F.count(F.when(col("r.t_ms") > ack_t, 1)).alias("after_ack"))
    pairs = rec.groupBy("hid", "key", col("r.cg").alias("cg")).agg(*pair_aggs)
    if opts.redelivery == "after_ack":
        redelivered = col("after_ack")
    elif opts.after_ack_groups:
        redelivered = F.when(
            col("cg").isin(*sorted(opts.after_ack_groups)), col("after_ack")
        ).otherwise(col("n") - 1)
    else:
        redelivered = col("n") - 1
    pair_counts = pairs.groupBy("hid").agg(
        total("duplicated", redelivered),
        total("received_acked_pairs", flag(col("acked"))),
    )
    # late: acknowledged delayed keys only; the time between due and the first delivery
    # without a writable master anywhere does not count (checker module docstring)
    delayed = pairs.where(col("due").isNotNull() & col("acked")).select(
        "hid", "key", "cg", "due", "first_t", "tol"
    )
    p, h = delayed.alias("p"), F.broadcast(held.alias("h"))
    # (least and greatest skip nulls: a pair that met no span must count 0, not
    # first_t - due)
    covered = F.when(
        col("h.held_from").isNotNull(),
        F.least(col("p.first_t"), col("h.held_until"))
        - F.greatest(col("p.due"), col("h.held_from")),
    ).otherwise(F.lit(0))
    late_counts = (
        p.join(
            h,
            (col("p.hid") == col("h.hid"))
            & (col("h.held_from") < col("p.first_t"))
            & (col("h.held_until") > col("p.due")),
            "left",
        )
        .groupBy(col("p.hid").alias("hid"), "p.key", "p.cg", "p.due", "p.first_t", "p.tol")
        .agg(F.coalesce(F.sum(covered), F.lit(0)).alias("held"))
        .select(
            "hid",
            (
                (col("first_t") - col("held") > col("due") + col("tol"))
                | (col("first_t") < col("due") - F.lit(opts.early_tolerance_ms))
            ).alias("late"),
        )
        .groupBy("hid")
        .agg(total("late_delayed", flag(col("late"))))
    )

    # lost = sum over acknowledged keys of max(groups subscribing the key's topic, 1)
    #        - (groups that received the key)
    subscribed = (
        ev.where(
            (col("f") == "subscribe") & col("topic").isNotNull() & col("consumer_group").isNotNull()
        )
        .select("hid", "topic", col("consumer_group").alias("cg"))
        .unionByName(pairs.select("hid", "topic", "cg"))
        .distinct()
        .groupBy("hid", "topic")
        .agg(F.count(F.lit(1)).alias("ng"))
    )
    expected_pairs = (
        keys.where(col("acked"))
        .groupBy("hid", "topic")
        .agg(F.count(F.lit(1)).alias("na"))
        .join(subscribed, ["hid", "topic"], "left")
        .groupBy("hid")
        .agg(
            total(
                "expected_pairs",
                col("na") * F.greatest(F.coalesce(col("ng"), F.lit(0)), F.lit(1)),
            )
        )
    )

    # FIFO: first receipt per (cg, consumer, key), ranked by send-ok time per stream.
    firsts = (
        rec.where(col("acked") & col("group").isNotNull())
        .groupBy("hid", "key", col("r.cg").alias("cg"), col("r.consumer").alias("consumer"))
        .agg(
            F.min(F.struct(col("r.t_ms").alias("t_ms"), col("r.qo").alias("qo"))).alias("first"),
            F.first("group").alias("group"),
            F.first("ok_t").alias("ok_t"),
        )
        .select("hid", "cg", "consumer", "key", "group", "ok_t", "first.t_ms", "first.qo")
    )
    stream = (
        Window.partitionBy("hid", "cg", "consumer", "group")
        .orderBy(col("t_ms"), col("qo"), col("key"))
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    order_counts = (
        firsts.withColumn("prev_max", F.max("ok_t").over(stream))
        .groupBy("hid")
        .agg(total("order_violations", flag(col("ok_t") < col("prev_max"))))
    )

    aggs = [
        key_counts,
        pair_counts,
        late_counts,
        expected_pairs,
        order_counts,
        _double_grants(ev, opts.lock_lease_ms)
        .groupBy("hid")
        .agg(total("double_lock_grants", col("n"))),
        _offset_rollbacks(ev).groupBy("hid").agg(total("offset_rollbacks", F.lit(1))),
    ]
    table = reduce(lambda a, b: a.join(F.broadcast(b), "hid", "left"), aggs, hids)
    rows = table.collect()  # one row per history
    out: dict[str, dict[str, int]] = {}
    for row in rows:
        d = {k: int(v or 0) for k, v in row.asDict().items() if k != "hid"}
        d["lost"] = d.pop("expected_pairs") - d.pop("received_acked_pairs")
        out[str(row["hid"])] = d
    return out


def _double_grants(ev: DataFrame, lease_ms: int) -> DataFrame:
    col = F.col
    ident = col("consumer_group").isNotNull() & col("consumer").isNotNull() & col("mq").isNotNull()
    grants = (
        ev.where((col("f") == "lock") & (col("type") == "ok") & col("granted") & ident)
        .groupBy("hid", col("t_ms").alias("t"), col("consumer_group").alias("cg"), "consumer", "mq")
        .agg(F.count(F.lit(1)).alias("n"))
    )
    unlocks = ev.where((col("f") == "unlock") & ident).select(
        col("hid").alias("uhid"),
        col("t_ms").alias("ut"),
        col("consumer_group").alias("ucg"),
        col("consumer").alias("uc"),
        col("mq").alias("umq"),
    )
    with_end = (
        grants.join(
            unlocks,
            (col("hid") == col("uhid"))
            & (col("cg") == col("ucg"))
            & (col("consumer") == col("uc"))
            & (col("mq") == col("umq"))
            & (col("ut") >= col("t")),
            "left",
        )
        .groupBy("hid", "t", "cg", "consumer", "mq", "n")
        .agg(F.least(col("t") + F.lit(lease_ms), F.min("ut")).alias("end"))
    )
    others = with_end.select(
        col("hid").alias("h_hid"),
        col("t").alias("h_t"),
        col("cg").alias("h_cg"),
        col("consumer").alias("h_consumer"),
        col("mq").alias("h_mq"),
        col("end").alias("h_end"),
    )
    return with_end.join(
        others,
        (col("hid") == col("h_hid"))
        & (col("cg") == col("h_cg"))
        & (col("mq") == col("h_mq"))
        & (col("consumer") != col("h_consumer"))
        & (col("h_t") <= col("t"))
        & (col("t") < col("h_end")),
        "left_semi",
    )


def _offset_rollbacks(ev: DataFrame) -> DataFrame:
    col = F.col

    def of(f: str) -> DataFrame:
        return ev.where(
            (col("f") == f)
            & (col("type") == "ok")
            & col("consumer_group").isNotNull()
            & col("mq").isNotNull()
            & col("offset").isNotNull()
        )

    probes = of("offset_probe").select("hid", "t_ms", "consumer_group", "mq", "offset")
    commits = of("commit_offset").select(
        col("hid").alias("c_hid"),
        col("t_ms").alias("c_t"),
        col("consumer_group").alias("c_cg"),
        col("mq").alias("c_mq"),
        col("offset").alias("c_offset"),
    )
    return probes.join(
        commits,
        (col("hid") == col("c_hid"))
        & (col("consumer_group") == col("c_cg"))
        & (col("mq") == col("c_mq"))
        & (col("c_t") < col("t_ms"))
        & (col("c_offset") > col("offset")),
        "left_semi",
    )


def _faults(ev: DataFrame, keys: DataFrame) -> dict[str, tuple[FaultWindow, ...]]:
    col = F.col
    faults = ev.where((col("f") == "fault") & col("kind").isNotNull() & col("target").isNotNull())
    starts = faults.where(col("type") == "info").select(
        "hid", col("t_ms").alias("start"), "kind", "target"
    )
    heals = faults.where(col("type") == "ok").select(
        col("hid").alias("hh"),
        col("t_ms").alias("ht"),
        col("kind").alias("hk"),
        col("target").alias("htg"),
    )
    ended = (
        starts.groupBy("hid", "start", "kind", "target")
        .agg(F.count(F.lit(1)).alias("n"))
        .join(
            heals,
            (col("hid") == col("hh"))
            & (col("kind") == col("hk"))
            & (col("target") == col("htg"))
            & (col("ht") >= col("start")),
            "left",
        )
        .groupBy("hid", "start", "kind", "target", "n")
        .agg(F.min("ht").alias("end"))
    )
    rows = ended.orderBy("hid", "start", "kind", "target").collect()  # one row per fault
    if not rows:
        return {}
    avail = _Availability(_availability(ev, keys, starts))
    out: dict[str, list[FaultWindow]] = {}
    for r in rows:
        hid, start = str(r["hid"]), int(r["start"])
        window = FaultWindow(
            str(r["kind"]),
            str(r["target"]),
            start,
            None if r["end"] is None else int(r["end"]),
            avail.window(hid, start, "write", None),
            avail.window(hid, start, "read", None),
            {g: avail.window(hid, start, "write", g) for g in avail.groups(hid, "write")},
            {g: avail.window(hid, start, "read", g) for g in avail.groups(hid, "read")},
            avail.unattributed(hid, start, "write"),
            avail.unattributed(hid, start, "read"),
        )
        out.setdefault(hid, []).extend([window] * int(r["n"]))
    return {hid: tuple(ws) for hid, ws in out.items()}


def _operations(ev: DataFrame, keys: DataFrame) -> DataFrame:
    """Writes and reads as the availability windows see them (checker docstring):
    ``hid, op ("write"|"read"), ok, t, issued, grp`` (``grp`` null: no group named).
    Writes come from the per-key rows (:func:`_keys`), reads from the events."""
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


def _availability(ev: DataFrame, keys: DataFrame, starts: DataFrame) -> list[Mapping[str, Any]]:
    """The unavailability windows of every fault start (``starts``: ``hid, start,
    target``), one row per (start, op, scope) that opened a window, plus one row per
    group seen."""
    col = F.col
    ops = _operations(ev, keys).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        ops.count()  # once, before several stages read it (see verdicts_of)
        # a fault's epoch ends at the next later fault start of its history
        later = (
            Window.partitionBy("hid").orderBy("start").rangeBetween(1, Window.unboundedFollowing)
        )
        epochs = (
            starts.select("hid", "start")
            .distinct()
            .select(col("hid").alias("e_hid"), "start", F.min("start").over(later).alias("until"))
        )
        # a fault on a broker opens its group's write window at the fault's start
        targeted = (
            starts.select(
                "hid",
                "start",
                F.lit("write").alias("op"),
                F.regexp_extract(col("target"), TARGET_BROKER_RE, 1).alias("grp"),
                col("start").alias("from"),
            )
            .where(col("grp") != "")
            .distinct()
        )
        opened = (
            ops.where(~col("ok"))
            .join(
                F.broadcast(epochs),
                (col("hid") == col("e_hid"))
                & (col("t") >= col("start"))
                & (col("until").isNull() | (col("t") < col("until"))),
            )
            .withColumn("from", F.greatest(col("issued"), col("start")))
        )
        wkeys = ["hid", "start", "op"]
        windows = (
            opened.where(col("grp").isNotNull())
            .select(*wkeys, "grp", "from")
            .unionByName(targeted)
            .groupBy(*wkeys, "grp")
            .agg(F.min("from").alias("ws"), F.lit(0).cast("long").alias("unattributed"))
            .withColumn("cluster", F.lit(False))
            .unionByName(
                opened.groupBy(*wkeys)
                .agg(
                    F.min("from").alias("ws"),
                    F.count(F.when(col("grp").isNull(), 1)).alias("unattributed"),
                )
                .withColumn("grp", F.lit(None).cast("string"))
                .withColumn("cluster", F.lit(True))
            )
        )
        w = windows.select(
            col("hid").alias("w_hid"),
            col("start").alias("w_start"),
            col("op").alias("w_op"),
            col("grp").alias("w_grp"),
            col("cluster").alias("w_cluster"),
            col("ws").alias("w_ws"),
        )
        # the first success of the scope issued (and recorded) at or after the opening:
        # first looked for within CLOSE_HORIZON_MS of it (each success meets only the
        # windows opened shortly before it), then without bound for windows still open
        successes = ops.where(col("ok"))

        def closes(scope: DataFrame, horizon_ms: int | None) -> dict[tuple[Any, ...], int]:
            cond = (
                (col("hid") == col("w_hid"))
                & (col("op") == col("w_op"))
                & (col("w_cluster") | (col("grp") == col("w_grp")))
                & (col("issued") >= col("w_ws"))
                & (col("t") >= col("w_ws"))
            )
            if horizon_ms is not None:
                cond = cond & (col("issued") < col("w_ws") + F.lit(horizon_ms))
            found = (
                successes.join(F.broadcast(scope), cond)
                .groupBy("w_hid", "w_start", "w_op", "w_grp")
                .agg(F.min("t").alias("we"))
                .collect()  # one row per window
            )
            return {(r["w_hid"], r["w_start"], r["w_op"], r["w_grp"]): int(r["we"]) for r in found}

        opened_rows = windows.collect()  # faults x groups rows
        ends = closes(w, CLOSE_HORIZON_MS)
        still_open = [
            r for r in opened_rows if (r["hid"], r["start"], r["op"], r["grp"]) not in ends
        ]
        if still_open:
            scope = w.join(
                F.broadcast(
                    ev.sparkSession.createDataFrame(
                        [(r["hid"], r["start"], r["op"], r["grp"]) for r in still_open],
                        "o_hid string, o_start long, o_op string, o_grp string",
                    )
                ),
                (col("w_hid") == col("o_hid"))
                & (col("w_start") == col("o_start"))
                & (col("w_op") == col("o_op"))
                & col("w_grp").eqNullSafe(col("o_grp")),
                "left_semi",
            )
            ends.update(closes(scope, None))
        measured: list[Mapping[str, Any]] = [
            {
                **r.asDict(),
                "we": ends.get((r["hid"], r["start"], r["op"], r["grp"])),
            }
            for r in opened_rows
        ]
        seen = (
            ops.where(col("grp").isNotNull())
            .select("hid", "op", "grp")
            .distinct()
            .collect()  # groups
        )
        return measured + [
            {"hid": r["hid"], "op": r["op"], "grp": r["grp"], "start": None} for r in seen
        ]
    finally:
        ops.unpersist()


class _Availability:
    """The collected rows of :func:`_availability`, read as the checker reports them."""

    def __init__(self, rows: Sequence[Mapping[str, Any]]) -> None:
        self._groups: dict[tuple[str, str], list[str]] = {}
        self._windows: dict[tuple[str, int, str, str | None], tuple[int, int | None, int]] = {}
        for r in rows:
            hid, op = str(r["hid"]), str(r["op"])
            if r["start"] is None:
                self._groups.setdefault((hid, op), []).append(str(r["grp"]))
                continue
            grp = None if r["cluster"] else str(r["grp"])
            we = None if r["we"] is None else int(r["we"])
            self._windows[(hid, int(r["start"]), op, grp)] = (
                int(r["ws"]),
                we,
                int(r["unattributed"]),
            )

    def groups(self, hid: str, op: str) -> list[str]:
        return sorted(self._groups.get((hid, op), []))

    def window(self, hid: str, start: int, op: str, grp: str | None) -> int | None:
        found = self._windows.get((hid, start, op, grp))
        if found is None:
            return 0  # no failure in the epoch
        ws, we, _ = found
        return None if we is None else we - ws

    def unattributed(self, hid: str, start: int, op: str) -> int:
        found = self._windows.get((hid, start, op, None))
        return 0 if found is None else found[2]


def compute_dir_verdict(
    spark: SparkSession,
    drill_dir: str | os.PathLike[str],
    *,
    scenario: str | None = None,
    options: CheckOptions | None = None,
) -> Verdict:
    """Judge ``DIR/history*.jsonl`` with ``spark``; write ``DIR/verdict.spark.json``.

    The scenario name comes from ``DIR/verdict.json`` when the drill wrote one, else from
    the directory name.  :func:`ha_controller.pipeline.analyze_dir` (``hactl analyze``)
    is this with its own session.
    """
    root = Path(drill_dir)
    files = sorted(root.glob("history*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no history*.jsonl in {root}")
    if scenario is None:
        written = root / "verdict.json"
        scenario = (
            str(json.loads(written.read_text(encoding="utf-8"))["scenario"])
            if written.exists()
            else root.name
        )
    verdict = compute_verdict(spark, files, scenario=scenario, options=options)
    (root / "verdict.spark.json").write_text(verdict.to_json() + "\n", encoding="utf-8")
    return verdict


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ha_controller.pipeline.verdict DIR [--master URL]``; exit 0 iff ok."""
    import argparse

    from ha_controller.pipeline.session import build_session

    parser = argparse.ArgumentParser(prog="hactl analyze", description=compute_dir_verdict.__doc__)
    parser.add_argument("dir", type=Path)
    parser.add_argument("--master", default=None, help="local[*] (default), spark://, sc://")
    parser.add_argument("--scenario", default=None)
    args = parser.parse_args(argv)
    spark = build_session(args.master)
    try:
        verdict = compute_dir_verdict(spark, args.dir, scenario=args.scenario)
    finally:
        spark.stop()
    print(verdict.to_json())
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
