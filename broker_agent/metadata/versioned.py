"""Versioned metadata tables and the two ways they travel (docs/failover.md, pre-online).

Consumer offsets, delay offsets, the timer checkpoint and transaction progress each
carry a DataVersion.  They move the same two ways:

- forward sync: a plain slave fetches the master's table and assigns it (every 2 s);
- reverse sync (pre-online): a returning master fetches each slave's table and
  adopts it when the slave's version is >= its own.

Each table says how it is fetched, assigned and adopted (:class:`VersionedTable`);
:func:`forward_sync` and :func:`reverse_sync` are the only loops over them.  Every table
is described by functions alone (:class:`TableSync`, the one adaptor), over its file
(``.json_table``): what it takes from a replica ends the file's wait for one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from google.protobuf.message import Message

from broker_agent.metadata.json_table import JsonTable
from ha_controller.proto import common_pb2
from ha_controller.protocol.errors import HaError, UnknownMethod
from ha_controller.rpc import ConnectionPool

log = logging.getLogger(__name__)

#: How long one table fetch may take.
FETCH_TIMEOUT_MS = 3000

M = TypeVar("M", bound=Message)
#: a fetched table as a :class:`TableSync` hands it to its functions
S = TypeVar("S")


async def fetch_table(
    pool: ConnectionPool, addr: str, code: int, response: type[M], request: Message | None = None
) -> M:
    """One GET_ALL_* / GET_*_CHECK_POINT request (no arguments unless ``request``) to
    ``addr``."""
    query = common_pb2.Empty() if request is None else request
    return await pool.call_pb(addr, code, query, response, timeout_ms=FETCH_TIMEOUT_MS)


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

    def adopt_on_promotion(self, snapshot: Any) -> bool:
        """Pre-online of a member just elected master (controller mode): take what a
        member's table holds that ours lacks (consumer offsets: every higher entry,
        whatever the versions); the other tables :meth:`adopt_if_newer`."""
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

    def awaiting_replica(self) -> bool:
        """Its file was lost and only a replica has it (``Recovery.REPLICA``): the
        broker takes it from one before it serves."""
        ...


@dataclass
class TableSync(Generic[M, S]):
    """A :class:`VersionedTable` made of functions, for a table fetched with one
    request ``code`` (no arguments unless ``request`` makes them) answered with a
    ``response``: ``decode`` turns the answer into the snapshot the functions take;
    ``take`` is :meth:`assign`, ``adopt`` :meth:`adopt_if_newer`, ``take_as_is``
    :meth:`replace` (``take`` when it is None), ``promote`` :meth:`adopt_on_promotion`
    (``adopt`` when it is None); what they return besides is ignored.
    ``file`` is the table's file: anything taken from a replica ends its wait for one."""

    name: str
    code: int
    response: type[M]
    decode: Callable[[M], S]
    take: Callable[[S], object]
    adopt: Callable[[S], bool]
    describe: Callable[[S], str]
    busy: Callable[[], bool]
    take_as_is: Callable[[S], object] | None = None
    file: JsonTable | None = None
    request: Callable[[], Message] | None = None
    promote: Callable[[S], bool] | None = None

    async def fetch(self, pool: ConnectionPool, addr: str) -> S:
        query = None if self.request is None else self.request()
        return self.decode(await fetch_table(pool, addr, self.code, self.response, query))

    def assign(self, snapshot: S) -> None:
        self.take(snapshot)
        self._taken()

    def adopt_if_newer(self, snapshot: S) -> bool:
        adopted = self.adopt(snapshot)
        self._taken()
        return adopted

    def adopt_on_promotion(self, snapshot: S) -> bool:
        adopted = (self.adopt if self.promote is None else self.promote)(snapshot)
        self._taken()
        return adopted

    def replace(self, snapshot: S) -> None:
        (self.take if self.take_as_is is None else self.take_as_is)(snapshot)
        self._taken()

    def awaiting_replica(self) -> bool:
        return self.file is not None and self.file.awaiting_replica

    def _taken(self) -> None:
        if self.file is not None:
            self.file.taken_from_replica()


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
    tables: Iterable[VersionedTable],
    pool: ConnectionPool,
    slave_id: int,
    slave_addr: str,
    *,
    promoted: bool = False,
) -> None:
    """Adopt each of the slave's tables that is at least as new as ours (``promoted``,
    a member just elected master: :meth:`VersionedTable.adopt_on_promotion`); raises
    HaError when the slave cannot be asked (pre-online retries from it)."""
    for table in tables:
        try:
            snapshot = await table.fetch(pool, slave_addr)
        except UnknownMethod:
            log.info("pre-online: slave %d keeps no %s", slave_id, table.name)
            continue
        if promoted:
            adopted = table.adopt_on_promotion(snapshot)
        else:
            adopted = table.adopt_if_newer(snapshot)
        log.info(
            "pre-online: %s of slave %d %s: %s",
            table.name,
            slave_id,
            ("taken where newer" if adopted else "nothing newer, kept ours")
            if promoted
            else ("adopted" if adopted else "older, kept ours"),
            table.describe(snapshot),
        )
