"""A local Spark session for the pipeline tests, or why there is none."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import (
    Iterator,
)
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def spark_missing() -> str | None:
    """Why no local Spark session can run here (no pyspark, no JDK), or None."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (pip install -e '.[spark]')"
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        return "pyspark needs a JDK 17/21 (java on PATH or JAVA_HOME)"
    return None


@contextlib.contextmanager
def local_spark(workdir: Path, app_name: str) -> Iterator[SparkSession]:
    """A ``local[2]`` session sized for test histories (2 partitions, serial GC, quick
    JIT, ERROR logs), its scratch space under ``workdir``; stopped on exit."""
    from ha_controller.pipeline.session import build_session

    session = build_session(
        "local[2]",
        app_name=app_name,
        local_dir=workdir / "local",
        config={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
