"""The controller-mode checks on Spark, per history: split brain and fast switches
(definitions: :mod:`ha_controller.drills.checker`, "Split brain")."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

__all__ = ["fast_switches", "split_brain"]


def split_brain(keys: DataFrame) -> DataFrame:
    """``(hid, n)``: the acknowledgements another writer of their group surrounds, or
    made by a member that does not own their epoch (histories without any: no row).

    Read from the key rows (their ``writes``: the send oks naming a writer), so the
    acknowledgement's issue is the key's earliest invoke without a join."""
    col = F.col
    oks = keys.where(F.size("writes") > 0).select(
        "hid", "key", "t_inv", F.posexplode("writes").alias("pos", "w")
    )
    oks = oks.select(
        "hid",
        "key",  # (key, pos) names one acknowledgement
        "pos",
        col("w.broker").alias("broker"),
        col("w.epoch").alias("epoch"),
        col("w.member_id").alias("member_id"),
        col("w.ok_t").alias("ok_t"),
        F.coalesce(col("t_inv"), col("w.ok_t")).alias("issue"),
    )
    writers = oks.groupBy(
        col("hid").alias("w_hid"),
        col("broker").alias("w_broker"),
        col("epoch").alias("w_epoch"),
        col("member_id").alias("w_member"),
    ).agg(F.min("ok_t").alias("w_ok"), F.max("issue").alias("w_issue"))
    owners = oks.groupBy(
        col("hid").alias("o_hid"), col("broker").alias("o_broker"), col("epoch").alias("o_epoch")
    ).agg(F.min(F.struct("ok_t", "member_id"))["member_id"].alias("owner"))
    surrounded = oks.join(
        F.broadcast(writers),
        (col("hid") == col("w_hid"))
        & (col("broker") == col("w_broker"))
        & ((col("epoch") != col("w_epoch")) | (col("member_id") != col("w_member")))
        & (col("w_ok") < col("issue"))
        & (col("w_issue") > col("ok_t")),
        "left_semi",
    )
    foreign = oks.join(
        F.broadcast(owners),
        (col("hid") == col("o_hid"))
        & (col("broker") == col("o_broker"))
        & (col("epoch") == col("o_epoch"))
        & (col("member_id") != col("owner")),
        "left_semi",
    )
    return (
        surrounded.select("hid", "key", "pos")
        .unionByName(foreign.select("hid", "key", "pos"))
        .distinct()
        .groupBy("hid")
        .agg(F.count(F.lit(1)).alias("n"))
    )


def fast_switches(ev: DataFrame, min_interval_ms: int) -> DataFrame:
    """``(hid, n)``: consecutive seen epochs of a group, the earlier past epoch 1, that
    began less than ``min_interval_ms`` apart."""
    col = F.col
    epochs = (
        ev.where(
            (col("f") == "epoch")
            & (col("type") == "info")
            & col("group").isNotNull()
            & col("epoch").isNotNull()
            & col("since_ms").isNotNull()
        )
        .groupBy("hid", "group", "epoch")
        .agg(F.min("since_ms").alias("since"))
    )
    window = Window.partitionBy("hid", "group").orderBy("epoch")
    return (
        epochs.withColumn("prev", F.lag("since").over(window))
        .withColumn("prev_epoch", F.lag("epoch").over(window))
        .where(
            col("prev").isNotNull()
            & (col("prev_epoch") > 1)
            & (col("since") - col("prev") < F.lit(min_interval_ms))
        )
        .groupBy("hid")
        .agg(F.count(F.lit(1)).alias("n"))
    )
