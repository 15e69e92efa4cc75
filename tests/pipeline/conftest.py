"""One session-scoped local[2] SparkSession for the pipeline tests (reference/pyspark.md §3)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

try:
    import pyspark  # noqa: F401
except ImportError:  # pragma: no cover - depends on the environment
    pytest.skip("pyspark is not installed (pip install -e '.[spark]')", allow_module_level=True)
if not (os.environ.get("JAVA_HOME") or shutil.which("java")):  # pragma: no cover
    pytest.skip("pyspark needs a JDK 17/21 (java on PATH or JAVA_HOME)", allow_module_level=True)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    from ha_controller.pipeline.session import build_session

    tmp = tmp_path_factory.mktemp("spark")
    session = build_session(
        "local[2]",
        app_name="ha-controller-tests",
        local_dir=tmp / "local",
        config={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
