"""One session-scoped local[2] SparkSession for the pipeline tests (a JVM each is slow)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from ha_controller.testing import local_spark, spark_missing

_missing = spark_missing()
if _missing is not None:  # pragma: no cover - depends on the environment
    pytest.skip(_missing, allow_module_level=True)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    with local_spark(tmp_path_factory.mktemp("spark"), "ha-controller-tests") as session:
        yield session
