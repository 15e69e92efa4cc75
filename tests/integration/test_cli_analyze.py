"""``hactl analyze`` as a user runs it: Spark keeps quiet (log4j at ERROR from the JVM's
start), and progress goes to stderr while the Spark job runs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ha_controller.testing import hactl_argv

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(importlib.util.find_spec("pyspark") is None, reason="pyspark missing"),
]


@pytest.mark.slow  # hactl analyze runs in tests/pipeline
def test_analyze_is_quiet_and_shows_progress(tmp_path: Path) -> None:
    drill = tmp_path / "drill"
    drill.mkdir()
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gen_history.py"), str(drill / "history.jsonl"),
         "--operations", "600", "--seed", "3"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    out = subprocess.run(
        hactl_argv("analyze", str(drill), "--master", "local[1]"),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    verdict = json.loads(out.stdout)
    assert verdict["ok"] is True
    assert (drill / "verdict.spark.json").is_file()
    err = out.stderr.splitlines()
    # no log4j chatter: no WARN/INFO lines, no banner about Spark's default profile
    noisy = [
        line for line in err
        if " WARN " in line or " INFO " in line or "log4j" in line or "log level" in line
    ]  # fmt: skip
    assert not noisy, out.stderr
    progress = [line for line in err if line.startswith(f"analyze {drill} on local[1]: ")]
    assert progress and progress[-1].startswith(f"analyze {drill} on local[1]: done, ")
    assert err[-1].startswith("analyzed in ")
