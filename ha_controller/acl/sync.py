"""How a runtime ACL table reaches every node.

A change is made on one broker (:mod:`ha_controller.acl.service`), which pushes it to
its nameservers (:func:`push_table`).  A nameserver (:class:`AclSpread`) adopts a
newer table it is pushed or sees in a broker's heartbeat (it fetches it from that
broker), pushes every table it adopts to every broker it knows, and pushes its own
to a broker whose heartbeat shows it behind (a broker that was away or restarted).
A gateway fetches from its nameservers every second (:func:`fetch_newer`); a slave's
forward sync and a returning master's pre-online carry the table too.  Every hop only
ever moves a node to a newer table (``(revision, digest)``), so nothing travels back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Final

from ha_controller.acl.authorizer import AclHolder
from ha_controller.acl.model import AclInvalid, AclTable
from ha_controller.acl.wire import table_from_pb, table_to_pb
from ha_controller.proto import acl_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import HaError
from ha_controller.rpc import ConnectionPool

log = logging.getLogger(__name__)

__all__ = ["AclSpread", "answered_table", "fetch_newer", "fetch_table", "push_table"]

TIMEOUT_MS: Final = 3000
#: a broker behind is pushed to at most this often
PUSH_INTERVAL_S: Final = 2.0

Spawn = Callable[[Coroutine[Any, Any, None], str], None]


async def fetch_table(pool: ConnectionPool, addr: str, known: tuple[int, str]) -> AclTable | None:
    """The table of the member at ``addr`` when it is newer than ``known``."""
    answer = await pool.call_pb(
        addr,
        RequestCode.GET_ACL_TABLE,
        acl_pb2.AclTableQuery(revision=known[0], digest=known[1]),
        acl_pb2.AclTableAnswer,
        timeout_ms=TIMEOUT_MS,
    )
    return answered_table(answer)


def answered_table(answer: acl_pb2.AclTableAnswer) -> AclTable | None:
    """The table a GET_ACL_TABLE answer carries: None when ours was not older."""
    if not answer.newer:
        return None
    return table_from_pb(answer.table)


async def fetch_newer(pool: ConnectionPool, addr: str, holder: AclHolder) -> bool:
    """Adopt the table of ``addr`` when newer; False when it is not (or unreachable)."""
    try:
        table = await fetch_table(pool, addr, holder.key())
    except (HaError, AclInvalid) as exc:
        log.debug("ACL table fetch from %s failed: %s", addr, exc)
        return False
    return table is not None and holder.offer(table)


async def push_table(pool: ConnectionPool, addr: str, table: AclTable) -> bool:
    try:
        await pool.call_pb(
            addr,
            RequestCode.PUT_ACL_TABLE,
            table_to_pb(table),
            acl_pb2.AclChange,
            timeout_ms=TIMEOUT_MS,
        )
    except HaError as exc:
        log.info("ACL table revision %d to %s failed: %s", table.revision, addr, exc)
        return False
    return True


class AclSpread:
    """A nameserver's part: pull newer tables, push its own where it is newer."""

    def __init__(
        self,
        holder: AclHolder,
        pool: ConnectionPool,
        spawn: Spawn,
        brokers: Callable[[], Iterable[str]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.holder = holder
        self.pool = pool
        self._spawn = spawn
        self._brokers = brokers
        self._clock = clock
        self._fetching: set[str] = set()
        self._pushed: dict[str, tuple[float, tuple[int, str]]] = {}
        holder.subscribe(self._adopted)

    def observed(self, addr: str, revision: int | None, digest: str | None) -> None:
        """A broker's heartbeat or registration said which table it has."""
        if revision is None:
            return  # an old broker
        theirs = (revision, digest or "")
        ours = self.holder.key()
        if revision >= 1 and theirs > ours:
            if addr not in self._fetching:
                self._fetching.add(addr)
                self._spawn(self._fetch(addr), f"acl-fetch-{addr}")
        elif ours[0] >= 1 and ours > theirs:
            last = self._pushed.get(addr)
            now = self._clock()
            if last is not None and last[1] == ours and now - last[0] < PUSH_INTERVAL_S:
                return
            self._pushed[addr] = (now, ours)
            self._spawn(self._push(addr, self.holder.table), f"acl-push-{addr}")

    async def _fetch(self, addr: str) -> None:
        try:
            await fetch_newer(self.pool, addr, self.holder)
        finally:
            self._fetching.discard(addr)

    async def _push(self, addr: str, table: AclTable) -> None:
        await push_table(self.pool, addr, table)

    def _adopted(self, table: AclTable) -> None:
        now = self._clock()
        for addr in sorted(set(self._brokers())):
            self._pushed[addr] = (now, table.key())
            self._spawn(self._push(addr, table), f"acl-push-{addr}")
        if len(self._pushed) > 10_000:
            self._pushed.clear()
