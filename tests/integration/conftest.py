from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ha_controller.testing import ProcessHandle, run_nameserver
from ha_controller.testing.etcd import EtcdCluster, etcd_missing, run_etcd


@pytest.fixture
def nameserver(tmp_path: Path) -> Iterator[ProcessHandle]:
    """A real nameserver process on port 0 with a fast (500 ms) expiry scan."""
    ns = run_nameserver(tmp_path, env={"HAC_SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS": "500"})
    try:
        yield ns
    finally:
        ns.stop()


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdCluster]:
    """A real one-member etcd on loopback (controller mode); skips where none can run."""
    why = etcd_missing()
    if why is not None:
        pytest.skip(why)
    workdir = tmp_path / "etcd"
    workdir.mkdir()
    cluster = run_etcd(workdir)
    try:
        yield cluster
    finally:
        cluster.stop()
