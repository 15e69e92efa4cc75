"""PySpark pipeline: drill verdicts at any scale and commit-log audits (DESIGN.md §11).

Modules: :mod:`.session` (SparkSession for local, cluster or Spark Connect),
:mod:`.verdict` (the drill verdict as DataFrame transforms), :mod:`.commitlog_source`
(the ``hac_commitlog`` Python data source and ``audit_store``).  Importing this package
does not import pyspark; the submodules do.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ha_controller.drills.checker import CheckOptions, Verdict

__all__ = ["analyze_dir"]


def analyze_dir(
    directory: str | os.PathLike[str],
    *,
    master: str | None = None,
    scenario: str | None = None,
    options: CheckOptions | None = None,
) -> Verdict:
    """``hactl analyze DIR``: build a session for ``master``, write ``DIR/verdict.spark.json``."""
    from ha_controller.pipeline.session import build_session
    from ha_controller.pipeline.verdict import analyze_dir as analyze

    spark = build_session(master)
    try:
        return analyze(spark, directory, scenario=scenario, options=options)
    finally:
        spark.stop()
