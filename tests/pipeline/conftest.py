"""One session-scoped local[2] SparkSession for the pipeline tests (reference/pyspark.md §3)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long pipeline tests are opt-in: they run only when ``-m`` names ``slow``."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="long test: run with -m slow")
    here = Path(__file__).parent
    for item in items:
        if item.get_closest_marker("slow") and here in item.path.parents:
            item.add_marker(skip)
