"""The drill verdict computed with Spark DataFrame transforms, for histories of any size.

Every definition mirrors :mod:`ha_controller.drills.checker` (read its docstring); the
two produce the same ``Verdict.to_dict()`` for the same history, which the pipeline tests
assert.  Several history files are read as one history; a file with a current Parquet
copy (written by the drill's history writer) is read from the copy.

Only DataFrame APIs are used (no RDDs, no ``sparkContext``), so the job runs in local
mode, under ``spark-submit`` and over Spark Connect.  Nothing proportional to the history
reaches the driver: the whole verdict is three ``collect`` calls of small rows (bounded
by histories x faults x groups x topics, never by events), each the union of several
aggregates.  The unavailability windows are put together on the driver from per
(history, kind, group, fault epoch) failure aggregates (their openings) and, for each
scope, the earliest success in each bucket between two consecutive openings (their
closes).  The
``availability`` summary is derived from the fault list by :class:`Verdict` itself, as in
the checker.

:func:`compute_verdicts` judges many histories in the same jobs (a ``hid`` column keys
every grouping and join), which keeps a campaign of small drills, or the tests, cheap;
:func:`read_drills` reads a campaign's histories in one scan with that column taken from
each file's drill directory, and :func:`verdicts_of` judges such a frame.

Parts beside it: the schema and readers (:mod:`~ha_controller.pipeline.events`), the
small collected rows (:mod:`~ha_controller.pipeline.rows`), the lock and offset checks
(:mod:`~ha_controller.pipeline.locks_offsets`), the split-brain check
(:mod:`~ha_controller.pipeline.split_brain`) and the unavailability
windows (:mod:`~ha_controller.pipeline.windows`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import reduce
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ha_controller.drills.checker import (
    POWER_CLUSTER,
    CheckOptions,
    Durability,
    Verdict,
    no_writable_master_spans,
    unsynced_losses,
)
from ha_controller.drills.history import DELAY_LEVELS_MS
from ha_controller.pipeline.events import (
    EVENT_SCHEMA,
    VALUE_SCHEMA,
    HistorySource,
    flat,
    read_drills,
    read_events,
)
from ha_controller.pipeline.locks_offsets import double_grants, offset_rollbacks
from ha_controller.pipeline.rows import Rows, collect, flag, part, total
from ha_controller.pipeline.split_brain import fast_switches, split_brain
from ha_controller.pipeline.windows import Windows, closes, operations

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
    (cached), without joining events back.  Everything else is read in three rounds,
    each one ``collect`` of small rows (:func:`_first_round`, :func:`_second_round`,
    :func:`_closes`), and the fault windows are put together on the driver
    (:class:`Windows`).  Events read from JSON lines are cached once (each further
    scan would parse the JSON again); Parquet is scanned again instead, column by
    column.
    """
    opts = options if options is not None else CheckOptions()
    ev = flat(events)
    cache_events = any(not f.endswith(".parquet") for f in events.inputFiles())
    if cache_events:
        ev = ev.persist(StorageLevel.MEMORY_AND_DISK)
    keys = _keys(ev, opts).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        # the cache of the key rows is built by the one query of this round that reads
        # them (several readers at once would each compute the rows they find missing)
        first = Rows(collect(_first_round(ev, keys, opts)))
        win = Windows(first.every("fault"))
        held = {
            hid: spans
            for hid in win.hids
            if (spans := no_writable_master_spans(win.stubs(hid, first.write_groups(hid))))
        }
        power = {hid: _durability(first, hid) for hid in names}
        cuts = {hid: (d.bound_ms, p) for hid, (d, p) in power.items() if p}
        second = Rows(collect(_second_round(spark, ev, keys, opts, win.epochs, held, cuts)))
        win.open(second.every("ops"))
        scopes = win.scopes()
        if scopes:
            win.close(collect([closes(spark, ev, keys, scopes)]))
    finally:
        keys.unpersist()
        if cache_events:
            ev.unpersist()
    faults = win.faults()
    out: dict[str, Verdict] = {}
    for name in names:
        durability, cut_list = power[name]
        counts = _counts(name, first, second)
        unsynced, window = unsynced_losses(
            [
                (
                    int(r["n1"]),
                    r["s2"],
                    max(len(_groups_of_topic(first, second, name).get(str(r["s1"]), ())), 1)
                    - int(r["n3"]),
                )
                for r in second.of("unsynced", name)
            ],
            cut_list,
            durability.bound_ms,
        )
        durability = replace(durability, unsynced_lost=unsynced, loss_window_ms=window)
        counts["unsynced_lost"] = unsynced
        if durability.flush_mode == "async":
            counts["lost"] -= unsynced
        out[name] = Verdict(
            scenario=name, counts=counts, faults=faults.get(name, ()), durability=durability
        )
    return out


def _durability(first: Rows, hid: str) -> tuple[Durability, list[tuple[int, str]]]:
    """History ``hid``'s store settings (its earliest ``store`` event) and its power
    losses ``(start, target)``, from the first round's rows."""
    store = first.of("store", hid)
    mode = None if not store or store[0]["s1"] is None else str(store[0]["s1"])
    interval = None if not store or store[0]["n1"] is None else int(store[0]["n1"])
    cuts = [
        (int(r["n1"]), str(r["s3"]))
        for r in first.of("fault", hid)
        if r["s1"] == "info" and r["s2"] == "power"
    ]
    return Durability(mode, interval, len(cuts)), cuts


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
        # the earliest send ok's broker (ties by name), for losses at a power loss
        F.min(
            F.when(
                is_send & (col("type") == "ok"),
                F.struct("t_ms", F.coalesce(col("broker"), F.lit("")).alias("broker")),
            )
        ).alias("ok_first"),
        F.coalesce(
            F.bool_or(F.when(is_end & (col("type") == "ok"), col("commit"))), F.lit(False)
        ).alias("committed"),
        F.coalesce(
            F.bool_or(F.when(is_end & col("type").isin("ok", "info"), ~col("commit"))),
            F.lit(False),
        ).alias("has_rb"),
        F.collect_list(F.when(is_outcome, F.struct("t_ms", "type", "broker"))).alias("outcomes"),
        # the send oks that name their writer (split brain)
        F.collect_list(
            F.when(
                is_send
                & (col("type") == "ok")
                & col("broker").isNotNull()
                & col("epoch").isNotNull()
                & col("member_id").isNotNull(),
                F.struct(col("t_ms").alias("ok_t"), "broker", "epoch", "member_id"),
            )
        ).alias("writes"),
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
    # shuffled by key alone: the rows stay partitioned by ``key``, an attribute every
    # later grouping per (key, ...) names, so those need no shuffle of their own (the
    # hash partitioning of a grouping by (hid, key) is on a literal ``hid`` when one
    # history is judged, which later groupings do not recognise)
    per_key = (
        ev.where(col("key").isNotNull() & wanted)
        .repartition("key")
        .groupBy("hid", "key")
        .agg(*aggs)
    )
    return (
        per_key.select(
            "hid",
            "key",
            "sent",
            "ok_t",
            F.when(col("ok_first.broker") != "", col("ok_first.broker")).alias("ok_broker"),
            "committed",
            "outcomes",
            "writes",
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


#: the columns of the small rows every round collects (:func:`_collect`): which part of


def _first_round(ev: DataFrame, keys: DataFrame, opts: CheckOptions) -> list[DataFrame]:
    """The key counts and the groups the write operations name (the one reader of the
    key rows here, so it builds their cache), the fault events, the lock and offset
    counts and the subscriptions the events declare."""
    col = F.col
    # the groups of a key's write operations (as :func:`_operations` names them)
    op_groups = F.when(
        F.size("outcomes") > 0,
        F.transform(
            "outcomes",
            lambda o: F.when(o["type"] == "ok", o["broker"]).otherwise(
                F.coalesce(o["broker"], col("inv_broker"))
            ),
        ),
    ).when(col("t_inv").isNotNull(), F.array(col("inv_broker")))
    key_counts = keys.groupBy("hid").agg(
        total("n1", flag(col("acked"))),
        total("n2", col("n_recv")),
        total("n3", F.when(col("unexpected"), col("n_recv"))),
        total(
            "n4",
            flag(col("sent") & col("ok_t").isNull() & ~col("rolled_back") & (col("n_recv") > 0)),
        ),
        total(
            "n5",
            flag(
                col("is_tx")
                & col("ok_t").isNotNull()
                & ~col("committed")
                & ~col("rolled_back")
                & (col("n_recv") == 0)
            ),
        ),
        F.array_distinct(F.flatten(F.collect_set(F.array_compact(op_groups)))).alias("groups"),
    )
    faults = ev.where(
        (col("f") == "fault")
        & col("type").isin("info", "ok")
        & col("kind").isNotNull()
        & col("target").isNotNull()
    )
    subscribed = (
        ev.where(
            (col("f") == "subscribe") & col("topic").isNotNull() & col("consumer_group").isNotNull()
        )
        .select("hid", "topic", "consumer_group")
        .distinct()
    )
    store = (
        ev.where((col("f") == "store") & (col("type") == "info"))
        .groupBy("hid")
        .agg(F.min_by(F.struct("flush_mode", "flush_interval_ms"), col("t_ms")).alias("m"))
    )
    corrupt = (
        ev.where((col("f") == "receive") & (col("type") == "ok") & (col("corrupt") == F.lit(True)))
        .groupBy("hid")
        .agg(total("n", F.lit(1)))
    )
    return [
        part("keys", key_counts, n1="n1", n2="n2", n3="n3", n4="n4", n5="n5", groups="groups"),
        part("fault", faults, s1="type", s2="kind", s3="target", n1="t_ms"),  # one per fault
        part("store", store, s1="m.flush_mode", n1="m.flush_interval_ms"),
        part("corrupt", corrupt, n1="n"),
        part(
            "grants",
            double_grants(ev, opts.lock_lease_ms).groupBy("hid").agg(total("n", col("n"))),
            n1="n",
        ),
        part(
            "rollbacks",
            offset_rollbacks(ev).groupBy("hid").agg(total("n", F.lit(1))),
            n1="n",
        ),
        part("subscribed", subscribed, s1="topic", s2="consumer_group"),
    ]


def _second_round(
    spark: SparkSession,
    ev: DataFrame,
    keys: DataFrame,
    opts: CheckOptions,
    epochs: Mapping[str, Sequence[int]],
    held: Mapping[str, Sequence[tuple[int, int]]],
    cuts: Mapping[str, tuple[int, Sequence[tuple[int, str]]]],
) -> list[DataFrame]:
    """The failures of every (history, kind, group, fault epoch) (a count and the
    earliest issue, for the windows' openings; epoch 0 is before the first fault), the
    counts of the (consumer group, key) pairs, the topics they subscribe, the
    acknowledged keys per topic, the FIFO order violations and the split-brain count.

    ``epochs``: each history's distinct fault starts, sorted; ``held``: its spans
    without a writable master (for ``late_delayed``); ``cuts``: its power losses'
    bound and ``(start, target)`` (for ``unsynced_lost``: the acknowledged keys within
    the bound before a power loss of their group are collected, a few per power loss)."""
    col = F.col
    ops = operations(ev, keys)
    if epochs:
        starts = spark.createDataFrame(
            [(hid, list(s)) for hid, s in epochs.items()], "e_hid string, starts array<long>"
        )
        ops = ops.join(F.broadcast(starts), col("hid") == col("e_hid"), "left")
        epoch = F.when(col("starts").isNull(), F.lit(0)).otherwise(
            F.size(F.filter("starts", lambda s: s <= col("t")))
        )
    else:
        epoch = F.lit(0)
    failed = ~col("ok")
    per_epoch = ops.groupBy("hid", "op", "grp", epoch.alias("e")).agg(
        F.count(F.when(failed, 1)).alias("n_fail"),
        F.min(F.when(failed, col("issued"))).alias("issued"),
    )

    # every receipt of a key that is not unexpected, with the key's attributes (no join
    # with the key rows)
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
    # the key's attributes are grouping columns (one value per key), not first()
    # aggregates: fixed-width buffers only, so a hash aggregate and no sort
    pair_aggs = [F.count(F.lit(1)).alias("n"), F.min("r.t_ms").alias("first_t")]
    if with_acks:
        ack_t = F.array_min(
            F.transform(F.filter("acks", lambda a: a["cg"] == col("r.cg")), lambda a: a["t_ms"])
        )
        pair_aggs.append(F.count(F.when(col("r.t_ms") > ack_t, 1)).alias("after_ack"))
    pairs = rec.groupBy("hid", "key", col("r.cg").alias("cg"), "topic", "acked", "due", "tol").agg(
        *pair_aggs
    )
    if opts.redelivery == "after_ack":
        redelivered = col("after_ack")
    elif opts.after_ack_groups:
        redelivered = F.when(
            col("cg").isin(*sorted(opts.after_ack_groups)), col("after_ack")
        ).otherwise(col("n") - 1)
    else:
        redelivered = col("n") - 1
    # late: acknowledged delayed keys only; the time between due and the first delivery
    # without a writable master anywhere does not count (checker module docstring)
    judged = pairs
    covered: Column = F.lit(0).cast("long")
    if held:
        spans = spark.createDataFrame(
            [(hid, [(a, b) for a, b in s]) for hid, s in held.items()],
            "h_hid string, spans array<struct<a: long, b: long>>",
        )
        judged = pairs.join(F.broadcast(spans), col("hid") == col("h_hid"), "left")
        covered = F.when(col("spans").isNull(), F.lit(0).cast("long")).otherwise(
            F.aggregate(
                "spans",
                F.lit(0).cast("long"),
                lambda acc, s: (
                    acc
                    + F.greatest(
                        F.lit(0).cast("long"),
                        F.least(col("first_t"), s["b"]) - F.greatest(col("due"), s["a"]),
                    )
                ),
            )
        )
    late = (
        col("due").isNotNull()
        & col("acked")
        & (
            (col("first_t") - covered > col("due") + col("tol"))
            | (col("first_t") < col("due") - F.lit(opts.early_tolerance_ms))
        )
    )
    pair_counts = judged.groupBy("hid").agg(
        total("duplicated", redelivered),
        total("received_acked_pairs", flag(col("acked"))),
        total("late", flag(late)),
    )
    acked_topics = (
        keys.where(col("acked")).groupBy("hid", "topic").agg(F.count(F.lit(1)).alias("n"))
    )

    # FIFO: first receipt per (cg, consumer, key), ranked by send-ok time per stream.
    firsts = (
        rec.where(col("acked") & col("group").isNotNull())
        .groupBy(
            "hid",
            "key",
            col("r.cg").alias("cg"),
            col("r.consumer").alias("consumer"),
            "group",
            "ok_t",
        )
        .agg(F.min(F.struct(col("r.t_ms").alias("t_ms"), col("r.qo").alias("qo"))).alias("first"))
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
        .agg(total("n", flag(col("ok_t") < col("prev_max"))))
    )
    parts = []
    if cuts:
        power = spark.createDataFrame(
            [(hid, bound, [(t, target) for t, target in c]) for hid, (bound, c) in cuts.items()],
            "p_hid string, bound long, cuts array<struct<t: long, target: string>>",
        )

        def covers(c: Column) -> Column:
            return (
                ((c["target"] == col("ok_broker")) | (c["target"] == F.lit(POWER_CLUSTER)))
                & (c["t"] >= col("ok_t"))
                & (c["t"] <= col("ok_t") + col("bound"))
            )

        near = (
            keys.where(col("acked") & col("ok_broker").isNotNull())
            .join(F.broadcast(power), col("hid") == col("p_hid"))
            .where(F.exists("cuts", covers))
            .select(
                "hid",
                "topic",
                "ok_t",
                "ok_broker",
                F.size(F.array_distinct(F.transform("receipts", lambda r: r["cg"]))).alias("recv"),
            )
        )
        parts.append(part("unsynced", near, s1="topic", s2="ok_broker", n1="ok_t", n3="recv"))
    return [
        *parts,
        part("ops", per_epoch, s1="op", s2="grp", n1="e", n2="n_fail", n3="issued"),
        part(
            "pairs",
            pair_counts,
            n1="duplicated",
            n2="received_acked_pairs",
            n3="late",
        ),
        part("subscribed", pairs.select("hid", "topic", "cg").distinct(), s1="topic", s2="cg"),
        part("acked_topic", acked_topics, s1="topic", n1="n"),
        part("order", order_counts, n1="n"),
        part("split", split_brain(keys), n1="n"),
        part("switches", fast_switches(ev, opts.min_switch_interval_ms), n1="n"),
    ]


def _groups_of_topic(first: Rows, second: Rows, hid: str) -> dict[str, set[str]]:
    """topic -> the consumer groups that subscribe it (declared or by receiving)."""
    groups_of_topic: dict[str, set[str]] = {}
    for r in (*first.of("subscribed", hid), *second.of("subscribed", hid)):
        groups_of_topic.setdefault(str(r["s1"]), set()).add(str(r["s2"]))
    return groups_of_topic


def _counts(hid: str, first: Rows, second: Rows) -> dict[str, int]:
    """The counts of history ``hid`` from the collected rows (``unsynced_lost`` and its
    share of ``lost`` are settled by the caller)."""
    # lost = sum over acknowledged keys of max(groups subscribing the key's topic, 1)
    #        - (groups that received the key)
    groups_of_topic = _groups_of_topic(first, second, hid)
    expected_pairs = sum(
        int(r["n1"]) * max(len(groups_of_topic.get(str(r["s1"]), ())), 1)
        for r in second.of("acked_topic", hid)
    )
    return {
        "acknowledged": first.total("keys", hid, "n1"),
        "delivered": first.total("keys", hid, "n2"),
        "lost": expected_pairs - second.total("pairs", hid, "n2"),
        "duplicated": second.total("pairs", hid, "n1"),
        "unexpected": first.total("keys", hid, "n3"),
        "recovered": first.total("keys", hid, "n4"),
        "order_violations": second.total("order", hid, "n1"),
        "late_delayed": second.total("pairs", hid, "n3"),
        "unresolved_transactions": first.total("keys", hid, "n5"),
        "double_lock_grants": first.total("grants", hid, "n1"),
        "offset_rollbacks": first.total("rollbacks", hid, "n1"),
        "corrupt_deliveries": first.total("corrupt", hid, "n1"),
        "split_brain": second.total("split", hid, "n1"),
        "fast_switches": second.total("switches", hid, "n1"),
        "unsynced_lost": 0,
    }


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
