"""The driver JVM that :func:`ha_controller.pipeline.session.build_session` starts in
local mode: the serial collector by default (docs/benchmarks.md measured it against G1),
and the log level's option beside it; spark-defaults.conf's driver options instead of
the default.  Each JVM is started in a subprocess (a session in this process would be
reused)."""

from __future__ import annotations

import importlib.util
import json
import os
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


def _driver(
    tmp_path: Path, config: dict[str, str], env: dict[str, str] | None = None
) -> dict[str, list[str]]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path / "spark"), json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=170,
        env={**os.environ, **(env or {})},
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


def test_spark_defaults_conf_options_stay_with_the_log_level(tmp_path: Path) -> None:
    """The default is not put over the driver options of the spark-defaults.conf that
    ``spark-submit`` reads, and the log level's option is added to them (a ``--conf``
    of that option alone would replace the file's)."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        "spark.driver.extraJavaOptions=-XX:+UseParallelGC -Dhac.probe=1\n"
    )
    driver = _driver(tmp_path, {}, env={"SPARK_CONF_DIR": str(conf)})
    assert driver["collectors"] == ["PS MarkSweep", "PS Scavenge"], driver
    assert "-Dhac.probe=1" in driver["arguments"]
    assert any(a.startswith("-Dlog4j2.configurationFile=") for a in driver["arguments"])


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("", None),
        ("# spark.driver.extraJavaOptions -XX:+UseG1GC\n! spark.driver.extraJavaOptions x", None),
        ("spark.driver.extraJavaOptionsX nothing\nspark.driver.memory 2g", None),
        ("spark.driver.extraJavaOptions   -XX:+UseParallelGC -Da=b", "-XX:+UseParallelGC -Da=b"),
        ("  spark.driver.extraJavaOptions=-XX:+UseParallelGC  ", "-XX:+UseParallelGC"),
        ("spark.driver.extraJavaOptions : -Da=1\nspark.driver.extraJavaOptions -Da=2", "-Da=2"),
    ],
)
def test_spark_defaults_conf_is_read_as_java_properties(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, value: str | None
) -> None:
    from ha_controller.pipeline import session

    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert session._spark_default("spark.driver.extraJavaOptions") is None  # no file yet
    (tmp_path / "spark-defaults.conf").write_text(text)
    assert session._spark_default("spark.driver.extraJavaOptions") == value
