"""Building the SparkSession for the pipeline (reference/pyspark.md).

``master`` may be ``local[*]`` (the default), any Spark master URL (``spark://``,
``yarn``, ``k8s://``) or a Spark Connect address (``sc://host:15002``), which goes through
``SparkSession.builder.remote``.  ``SPARK_REMOTE`` in the environment selects Connect
when no master is given.

Environment facts measured on this project's machines are applied before the JVM
starts: Python workers run this interpreter (``PYSPARK_PYTHON``), the driver binds to
loopback with ``SPARK_LOCAL_HOSTNAME=localhost`` (an unresolvable hostname kills the
JVM), and the workers can import ``ha_controller`` (the data source is cloudpickled by
reference to its module).  Only DataFrame APIs are used by the pipeline, so the same
code runs in local mode, under ``spark-submit`` and over Spark Connect.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

__all__ = ["build_session", "prepare_environment", "project_root"]


def project_root() -> Path:
    """The directory holding the ``ha_controller`` package."""
    return Path(__file__).resolve().parents[2]


def prepare_environment() -> None:
    """Set the environment the JVM and its Python workers need (idempotent, setdefault)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_HOSTNAME", "localhost")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    root = str(project_root())
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *parts])


def build_session(
    master: str | None = None,
    *,
    app_name: str = "ha-controller-pipeline",
    config: Mapping[str, str] | None = None,
    local_dir: str | os.PathLike[str] | None = None,
) -> SparkSession:
    """Create (or reuse) a SparkSession for ``master``; see the module docstring."""
    prepare_environment()
    remote = master if master is not None and master.startswith("sc://") else None
    if master is None and os.environ.get("SPARK_REMOTE"):
        remote = os.environ["SPARK_REMOTE"]
    builder = SparkSession.builder.appName(app_name)
    settings: dict[str, str] = {"spark.sql.session.timeZone": "UTC"}
    if remote is None:
        builder = builder.master(master or "local[*]")
        settings.update(
            {
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.sql.shuffle.partitions": "8",
            }
        )
        if (master or "local[*]").startswith("local"):
            settings.update(
                {
                    "spark.driver.host": "127.0.0.1",
                    "spark.driver.bindAddress": "127.0.0.1",
                }
            )
        if local_dir is not None:
            settings["spark.local.dir"] = str(local_dir)
            settings["spark.sql.warehouse.dir"] = str(Path(local_dir) / "warehouse")
    else:
        builder = builder.remote(remote)
    settings.update(config or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if remote is not None:
        _ship_package(session)
    return session


def _ship_package(session: SparkSession) -> None:
    """Under Spark Connect the server's Python workers need our modules as artifacts."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        archive = shutil.make_archive(
            str(Path(tmp) / "ha_controller"),
            "zip",
            root_dir=project_root(),
            base_dir="ha_controller",
        )
        session.addArtifacts(archive, pyfile=True)
