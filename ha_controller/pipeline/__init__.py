"""PySpark pipeline: drill verdicts at any scale and commit-log audits.

Modules: :mod:`.session` (SparkSession for local, cluster or Spark Connect),
:mod:`.verdict` (the drill verdict as DataFrame transforms), :mod:`.commitlog_source`
(the ``hac_commitlog`` Python data source and ``audit_store``).  Importing this package
does not import pyspark; the submodules do.

The pipeline depends on :mod:`ha_controller.drills` (the history schema, the checker's
options and verdict types), never the other way round; ``hactl analyze``
(:mod:`ha_controller.cli.drill`) calls :func:`analyze_dir`.
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
    """``hactl analyze DIR``: judge ``DIR/history*.jsonl`` on a session built for
    ``master`` (local[*] by default, spark://, sc://) and write ``DIR/verdict.spark.json``;
    see :func:`ha_controller.pipeline.verdict.compute_dir_verdict`.  Raises ImportError
    without pyspark."""
    from ha_controller.pipeline.session import build_session
    from ha_controller.pipeline.verdict import compute_dir_verdict

    spark = build_session(master)
    try:
        return compute_dir_verdict(spark, directory, scenario=scenario, options=options)
    finally:
        spark.stop()
