"""The lock and offset checks on Spark: double lock grants and offset rollbacks, per
history (definitions: :mod:`ha_controller.drills.checker`)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

__all__ = ["double_grants", "offset_rollbacks"]


def double_grants(ev: DataFrame, lease_ms: int) -> DataFrame:
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


def offset_rollbacks(ev: DataFrame) -> DataFrame:
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
