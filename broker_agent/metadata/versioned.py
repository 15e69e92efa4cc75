"""Versioned metadata tables and the two ways they travel (reference/rip32.md §5).

Consumer offsets, delay offsets, the timer checkpoint and transaction progress each
carry a DataVersion.  They move the same two ways:

- forward sync: a plain slave fetches the master's table and assigns it (every 2 s);
- reverse sync (pre-online): a returning master fetches each slave's table and
  adopts it when the slave's version is >= its own.

Each table says how it is fetched, assigned and adopted (:class:`VersionedTable`);
:func:`forward_sync` and :func:`reverse_sync` are the only loops over them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from google.protobuf.message import Message

from ha_controller.proto import common_pb2
from ha_controller.protocol.errors import HaError, UnknownMethod
from ha_controller.rpc import ConnectionPool

log = logging.getLogger(__name__)

#: How long one table fetch may take.
FETCH_TIMEOUT_MS = 3000

M = TypeVar("M", bound=Message)


async def fetch_table(pool: ConnectionPool, addr: str, code: int, response: type[M]) -> M:
    """One GET_ALL_* / GET_*_CHECK_POINT request (no arguments) to ``addr``."""
    return await pool.call_pb(addr, code, common_pb2.Empty(), response, timeout_ms=FETCH_TIMEOUT_MS)


class VersionedTable(Protocol):
    """One versioned table as the sync loops see it."""

    #: for logs: "consumer offsets", "delay offsets", ...
    name: str

    async def fetch(self, pool: ConnectionPool, addr: str) -> Any:
        """The table of the broker at ``addr`` (raises HaError)."""
        ...

    def assign(self, snapshot: Any) -> None:
        """Forward sync: take the master's table as it is."""
        ...

    def adopt_if_newer(self, snapshot: Any) -> bool:
        """Reverse sync: take a slave's table when its version is >= ours."""
        ...

    def replace(self, snapshot: Any) -> None:
        """Take a slave's table as it is, even where ours is ahead: a master that cut
        its log back (or lost its volume) counted deliveries and commits that are gone,
        and an offset left ahead of the log skips what is stored there next."""
        ...

    def describe(self, snapshot: Any) -> str:
        """A short text of a fetched table, for the pre-online log."""
        ...

    def busy(self) -> bool:
        """True while this broker itself moves the table (no forward sync then)."""
        ...


async def forward_sync(
    tables: Iterable[VersionedTable],
    pool: ConnectionPool,
    master: str,
    still_wanted: Callable[[], bool] = lambda: True,
) -> None:
    """Assign each table from the master; a table that cannot be fetched waits for
    the next round.

    ``still_wanted`` is asked right before each assignment (nothing awaits between
    the two): a fetch can take seconds (a frozen master answers when it resumes), and
    a slave that started acting meanwhile must keep its own tables, or the returning
    master's pre-online would find the acting slave's progress gone."""
    for table in tables:
        try:
            snapshot = await table.fetch(pool, master)
        except HaError as exc:
            log.debug("%s sync from %s failed: %s", table.name, master, exc)
            continue
        if not still_wanted():
            log.info("forward sync from %s dropped: this slave acts or its master left", master)
            return
        if not table.busy():
            table.assign(snapshot)


async def reverse_sync(
    tables: Iterable[VersionedTable], pool: ConnectionPool, slave_id: int, slave_addr: str
) -> None:
    """Adopt each of the slave's tables that is at least as new as ours; raises
    HaError when the slave cannot be asked (pre-online retries from it)."""
    for table in tables:
        try:
            snapshot = await table.fetch(pool, slave_addr)
        except UnknownMethod:
            log.info("pre-online: slave %d keeps no %s", slave_id, table.name)
            continue
        adopted = table.adopt_if_newer(snapshot)
        log.info(
            "pre-online: %s of slave %d %s: %s",
            table.name,
            slave_id,
            "adopted" if adopted else "older, kept ours",
            table.describe(snapshot),
        )
