"""`hactl demo` is what a new user runs first: it must pass, quickly, through the CLI."""

from __future__ import annotations

import subprocess
import time

from ha_controller.testing import hactl_argv


def test_hactl_demo_exits_0_within_a_minute() -> None:
    t0 = time.monotonic()
    proc = subprocess.run(hactl_argv("demo"), capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "lost 0  duplicated 0" in proc.stdout
    assert "nameserver shows slave 1 as id 0, read-only" in proc.stdout
    assert elapsed < 60, f"demo took {elapsed:.1f} s"
