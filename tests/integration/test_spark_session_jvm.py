"""The driver JVM that :func:`ha_controller.pipeline.session.build_session` starts in
local mode: the serial collector by default (docs/benchmarks.md measured it against G1),
and the log level's option beside it.  The JVM is started in a subprocess (a session
in this process would be reused)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(importlib.util.find_spec("pyspark") is None, reason="pyspark missing"),
]

_PROBE = """
import json, sys
from ha_controller.pipeline.session import build_session
config = json.loads(sys.argv[2])
spark = build_session("local[1]", local_dir=sys.argv[1], log_level="ERROR", config=config)
jvm = spark.sparkContext._jvm
beans = jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
args = jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
print(json.dumps({
    "collectors": sorted(str(b.getName()) for b in beans),
    "arguments": [str(a) for a in args],
}))
spark.stop()
"""


def _driver(tmp_path: Path, config: dict[str, str]) -> dict[str, list[str]]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path / "spark"), json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, list[str]] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_local_driver_runs_the_serial_collector_with_the_log_level(tmp_path: Path) -> None:
    driver = _driver(tmp_path, {})
    # the serial collector's young and old generation collectors
    assert driver["collectors"] == ["Copy", "MarkSweepCompact"], driver
    assert "-XX:+UseSerialGC" in driver["arguments"]
    assert any(a.startswith("-Dlog4j2.configurationFile=") for a in driver["arguments"])


def test_spark_defaults_conf_keeps_its_own_driver_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default is not put over the options of the spark-defaults.conf that
    ``spark-submit`` reads (a ``--conf`` would win over the file)."""
    from ha_controller.pipeline import session

    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert not session._spark_defaults_set("spark.driver.extraJavaOptions")  # no file
    (tmp_path / "spark-defaults.conf").write_text(
        "# spark.driver.extraJavaOptions -XX:+UseG1GC\n"
        "spark.driver.memory 2g\n"
        "spark.driver.extraJavaOptionsX nothing\n"
    )
    assert not session._spark_defaults_set("spark.driver.extraJavaOptions")
    for line in (
        "spark.driver.extraJavaOptions   -XX:+UseParallelGC",
        "  spark.driver.extraJavaOptions=-XX:+UseParallelGC",
        "spark.driver.extraJavaOptions: -XX:+UseParallelGC",
    ):
        (tmp_path / "spark-defaults.conf").write_text(f"spark.driver.memory 2g\n{line}\n")
        assert session._spark_defaults_set("spark.driver.extraJavaOptions"), line
