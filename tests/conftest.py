from __future__ import annotations

import os
from typing import Any

import pytest

# Service processes started by tests must not inherit a developer's HAC_* settings.
for _key in [k for k in os.environ if k.startswith("HAC_")]:
    del os.environ[_key]


#: test directories whose tests share one session-scoped SparkSession (their conftest);
#: they are also the longest units (one per drill file measured slower: a JVM each)
_SPARK_DIRS = ("drills", "pipeline")


def _work_unit(nodeid: str) -> str:
    """What one xdist worker runs whole: a test file, or a directory of ``_SPARK_DIRS``."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[1] in _SPARK_DIRS else path


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: no error without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test`` runs the suite on several workers (pytest-xdist ``-n``).  Every test
    file runs whole on one worker, so its module-scoped fixtures (a cluster, a topic a
    test created) are set up once and its tests keep their order; the tests of a
    directory that share one session-scoped SparkSession run together, so each such
    directory starts one JVM, not one per worker.  (xdist's ``loadgroup`` would do it
    with marks, but it cannot rename node ids under pytest 9.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    config.option.loadscopereorder = False  # the order below: the longest units first
    return ByFile(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long tests (marked ``slow``, in any directory) are opt-in: they run only when
    ``-m`` names ``slow``.  On an xdist worker, the Spark directories first: they are
    the longest units, and the others fill in around them."""
    if "slow" not in (config.getoption("markexpr") or ""):
        skip = pytest.mark.skip(reason="long test: run with -m slow")
        for item in items:
            if item.get_closest_marker("slow"):
                item.add_marker(skip)
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: _work_unit(item.nodeid) not in _SPARK_DIRS)
