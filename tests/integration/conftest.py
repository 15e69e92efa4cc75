from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ha_controller.testing import ProcessHandle, run_nameserver


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long integration tests are opt-in: they run only when ``-m`` names ``slow``."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="long test: run with -m slow")
    here = Path(__file__).parent
    for item in items:
        if item.get_closest_marker("slow") and here in item.path.parents:
            item.add_marker(skip)


@pytest.fixture
def nameserver(tmp_path: Path) -> Iterator[ProcessHandle]:
    """A real nameserver process on port 0 with a fast (500 ms) expiry scan."""
    ns = run_nameserver(tmp_path, env={"HAC_SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS": "500"})
    try:
        yield ns
    finally:
        ns.stop()
