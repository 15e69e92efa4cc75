"""What the drill tests (tests/drills) share: the ``run`` fixture's type and the
safety check of a drill's verdict."""

from __future__ import annotations

from typing import Any, Protocol

from ha_controller.drills.runner import DrillResult

# Counts a healthy cluster must keep at zero in every drill here (sends are single
# attempts, so an unknown outcome is never retried into a second copy).
SAFETY = ("lost", "duplicated", "unexpected", "order_violations", "offset_rollbacks")


class DrillRunner(Protocol):
    """The ``run`` fixture (tests/drills/conftest.py): one short drill of ``scenario``,
    ``overrides`` on its ``DrillOptions``."""

    async def __call__(self, scenario: str, **overrides: Any) -> DrillResult: ...


def assert_safe(result: DrillResult, allow: tuple[str, ...] = ()) -> None:
    counts = result.verdict.counts
    assert result.drained, f"drain timed out: {counts}"
    safety = [k for k in SAFETY if k not in allow]
    assert {k: counts[k] for k in safety} == dict.fromkeys(safety, 0), counts
    assert counts["acknowledged"] > 0
    assert counts["delivered"] >= counts["acknowledged"]
