from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ha_controller.testing import ProcessHandle, run_nameserver


@pytest.fixture
def nameserver(tmp_path: Path) -> Iterator[ProcessHandle]:
    """A real nameserver process on port 0 with a fast (500 ms) expiry scan."""
    ns = run_nameserver(tmp_path, env={"HAC_SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS": "500"})
    try:
        yield ns
    finally:
        ns.stop()
