"""A master cut off with one etcd member while a new master is elected (apache/rocketmq
#7017), on real hosts in network namespaces with three real etcd members.

While cut off, the old master fences itself (no heartbeat acknowledged) and the
controller elects a member of the sync-state set; once the cut heals the old master
must learn that it was replaced and rejoin as a slave of the new epoch.  It sends no
heartbeat while fenced and the role notice went out while it was cut off, so it must
ask; before it did, it stayed in pre-online for good, trying to catch up from the new
epoch's log as an old master.  Skipped with the reason without network namespaces or
etcd.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ha_controller.drills.cluster import ClusterSpec, DrillCluster
from ha_controller.testing import http_get
from ha_controller.testing.etcd import etcd_missing

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.usefixtures("needs_netns"),
    pytest.mark.skipif(etcd_missing() is not None, reason=str(etcd_missing())),
]

GROUP = "broker-a"


@pytest.fixture
def cluster() -> Iterator[DrillCluster]:
    spec = ClusterSpec(groups=(GROUP,), replicas=3, netns=True, etcd_members=3)
    with DrillCluster(spec) as c:
        yield c


def group(c: DrillCluster) -> dict[str, Any]:
    status, body = http_get(c.namesrv_http, "/api/v1/groups")
    assert status == 200, body
    return next(g for g in json.loads(body) if g["brokerName"] == GROUP)


def wait_for(what: str, predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except (AssertionError, KeyError, OSError, StopIteration, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def members(c: DrillCluster) -> dict[int, int]:
    """memberId -> the brokerId it shows as."""
    return {m["memberId"]: m["brokerId"] for m in group(c)["members"] if "memberId" in m}


def test_isolated_master_rejoins_as_a_slave_of_the_new_epoch(cluster: DrillCluster) -> None:
    c = cluster
    wait_for("a full sync-state set", lambda: group(c)["syncStateSet"] == [0, 1, 2], 60)
    assert (group(c)["epoch"], group(c)["masterId"]) == (1, 0)
    c.isolate(f"{GROUP}/0", 0)
    try:
        wait_for("a new master", lambda: group(c)["epoch"] >= 2, 30)
        new_master = group(c)["masterId"]
        assert new_master in (1, 2)
    finally:
        c.heal_isolation(f"{GROUP}/0")
    wait_for(
        "member 0 back as a slave under the new master's old id",
        lambda: members(c).get(0) == new_master,
        40,
    )
