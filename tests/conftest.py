from __future__ import annotations

import os
from typing import Any

import pytest

# Service processes started by tests must not inherit a developer's HAC_* settings.
# HAC_*_SDK_DIR say where the tests find the official SDKs (no service reads them).
for _key in [k for k in os.environ if k.startswith("HAC_") and not k.endswith("_SDK_DIR")]:
    del os.environ[_key]


#: test directories whose files are the longest units (real clusters and a Spark session
#: per worker): they are handed out first, the other files fill in around them
_LONG_DIRS = ("drills", "pipeline")


def _work_unit(nodeid: str) -> str:
    """What one xdist worker runs whole: a test file."""
    return nodeid.split("::", 1)[0]


def _long(nodeid: str) -> bool:
    parts = nodeid.split("::", 1)[0].split("/")
    return len(parts) > 2 and parts[1] in _LONG_DIRS


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: no error without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test`` runs the suite on several workers (pytest-xdist ``-n``).  Every test
    file runs whole on one worker, so its module-scoped fixtures (a cluster, a topic a
    test created) are set up once and its tests keep their order.  A worker that runs
    Spark tests starts one session-scoped SparkSession for all of them (one JVM per
    worker at most).  (xdist's ``loadgroup`` would do it with marks, but it cannot
    rename node ids under pytest 9.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):  # type: ignore[misc]  # xdist has no annotations
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    config.option.loadscopereorder = False  # the order below: the longest units first
    return ByFile(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long tests (marked ``slow``, in any directory) are opt-in: they run only when
    ``-m`` names ``slow``.  On an xdist worker, the files of the long directories
    first, so that no long file is left for the end."""
    if "slow" not in (config.getoption("markexpr") or ""):
        skip = pytest.mark.skip(reason="long test: run with -m slow")
        for item in items:
            if item.get_closest_marker("slow"):
                item.add_marker(skip)
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: not _long(item.nodeid))
