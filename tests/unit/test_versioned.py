"""A slave's forward sync that was in flight when the slave started acting must not
overwrite the acting slave's tables (issue 17, defect A: a frozen master answered the
fetch when it resumed, the acting slave took the master's old transaction progress
over its own escapes, and the returning master's pre-online found them gone: it
committed the escaped transactions a second time)."""

from __future__ import annotations

from typing import Any

from broker_agent.metadata.versioned import forward_sync
from ha_controller.rpc import ConnectionPool


class Table:
    """A versioned table whose fetch lets the test change the world meanwhile."""

    name = "test table"

    def __init__(self, during_fetch: Any = None) -> None:
        self.assigned: list[str] = []
        self.during_fetch = during_fetch

    async def fetch(self, pool: ConnectionPool, addr: str) -> str:
        if self.during_fetch is not None:
            self.during_fetch()
        return f"table of {addr}"

    def assign(self, snapshot: str) -> None:
        self.assigned.append(snapshot)

    def adopt_if_newer(self, snapshot: str) -> bool:
        raise AssertionError("not in a forward sync")

    def adopt_on_promotion(self, snapshot: str) -> bool:
        raise AssertionError("not in a forward sync")

    def replace(self, snapshot: str) -> None:
        raise AssertionError("not in a forward sync")

    def describe(self, snapshot: str) -> str:
        return snapshot

    def busy(self) -> bool:
        return False

    def awaiting_replica(self) -> bool:
        return False


async def test_a_slave_that_starts_acting_during_the_fetch_keeps_its_tables() -> None:
    acting = False

    def start_acting() -> None:
        nonlocal acting
        acting = True  # the min-id notice arrived while the fetch was in flight

    first, second = Table(during_fetch=start_acting), Table()
    async with ConnectionPool() as pool:
        await forward_sync([first, second], pool, "master:1", still_wanted=lambda: not acting)
    assert first.assigned == [] and second.assigned == []


async def test_without_a_change_every_table_is_assigned() -> None:
    tables = [Table(), Table()]
    async with ConnectionPool() as pool:
        await forward_sync(tables, pool, "master:1", still_wanted=lambda: True)
    assert [t.assigned for t in tables] == [["table of master:1"]] * 2
