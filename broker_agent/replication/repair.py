"""Repair: damaged records of this broker's commit log are copied back from a replica.

The store notes a damaged range when a read finds a record below its end that it
cannot verify (``broker_agent.store.repair``) and refuses it to every reader until it
is repaired.  This loop asks replicas for those bytes with ``GET_COMMITLOG_RANGE``
(answered by every broker, which never sends bytes it cannot verify itself): a master
its slaves, in-sync ones first (they hold every acknowledged record); a slave its
master.  The store writes an answer back in place only once it checked it
(``MessageStore.repair``: CRC, offsets, the consume-queue entry).

Each repaired range is logged once by the store and counted in
``hac_store_records_repaired_total{result="repaired"}``.  A range no replica could
supply (none holds an intact copy, none answers) counts ``result="unrepairable"``
once and is logged once at ERROR with the remedy; it stays refused, and the loop
keeps asking, every 5 s and at once when another replica attaches.  A master's lost
tail that every replica answered for and none holds (never replicated) is cut back
instead (``cut_tail``: a role change, whose pre-online catches up).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from broker_agent.store.message_store import MessageStore
from broker_agent.store.repair import Damage
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BrokerUnavailable, HaError
from ha_controller.rpc import ConnectionPool

log = logging.getLogger(__name__)

#: how often the loop looks for damaged ranges
CHECK_S: Final = 0.1
#: how often a range no replica could supply is asked for again
RETRY_UNREPAIRABLE_S: Final = 5.0
#: how long one replica may take to answer
RANGE_TIMEOUT_MS: Final = 3000
#: the most bytes asked for (and checked, on the event loop) in one call
MAX_ASK_BYTES: Final = 1 << 20

#: replica RPC addresses to ask for ``[start, end)``, best first
Sources = Callable[[int, int], list[str]]
#: counts records: (result, how many)
Count = Callable[[str, int], None]
#: a master's tail range that no replica ever received: cut the log back there
CutTail = Callable[[Damage], None]

REMEDY: Final = (
    "bring back a replica that holds it (it is asked as soon as it attaches), or, for a "
    "tail past the checkpoint, restart this broker (docs/failover.md, 'A damaged record')"
)


class RepairService:
    """The loop that repairs the store's damaged ranges from replicas."""

    def __init__(
        self,
        store: MessageStore,
        pool: ConnectionPool,
        sources: Sources,
        count: Count,
        cut_tail: CutTail | None = None,
    ) -> None:
        self.store = store
        self.pool = pool
        self.sources = sources
        self.count = count
        self.cut_tail = cut_tail
        #: a range no replica could supply: when to ask again, and whom we asked
        self._next_try: dict[int, tuple[float, list[str]]] = {}

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            for damage in self.store.damaged():
                later = self._next_try.get(damage.start)
                sources = self._sources_for(damage)
                # a replica that attached since the last attempt is asked at once
                if later is not None and later[0] > now and later[1] == sources:
                    continue
                if await self.repair_one(damage):
                    self._next_try.pop(damage.start, None)
                else:
                    self._next_try[damage.start] = (loop.time() + RETRY_UNREPAIRABLE_S, sources)
            await asyncio.sleep(CHECK_S)

    def _sources_for(self, damage: Damage) -> list[str]:
        end = damage.end if damage.end is not None else damage.start + 1
        return self.sources(damage.start, end)

    async def repair_one(self, damage: Damage) -> bool:
        """Ask each source in turn until one's copy was written back; False when none
        could (counted and reported once per range)."""
        start = damage.start
        end = damage.end
        asked = (end - start) if end is not None else 1  # 1: exactly the first record
        asked = min(asked, MAX_ASK_BYTES)
        why: list[str] = []
        sources = self._sources_for(damage)
        #: every replica answered, none holds a byte at ``start``
        nowhere = True
        answered = 0
        for addr in sources:
            try:
                pb = await self.pool.call_pb(
                    addr,
                    RequestCode.GET_COMMITLOG_RANGE,
                    broker_pb2.CommitLogRangeRequest(from_offset=start, max_bytes=asked),
                    broker_pb2.CommitLogRange,
                    timeout_ms=RANGE_TIMEOUT_MS,
                )
            except BrokerUnavailable as exc:
                # not running: whatever it holds, pre-online compares it after a cut
                why.append(f"{addr}: {exc}")
                continue
            except HaError as exc:
                why.append(f"{addr}: {exc}")
                nowhere = False
                continue
            answered += 1
            if pb.max_offset > start:
                nowhere = False
            try:
                if pb.from_offset != start:
                    raise HaError(f"answered a range at {pb.from_offset}")  # noqa: TRY301
                _, records = self.store.repair(damage, pb.data)
            except HaError as exc:
                why.append(f"{addr}: {exc} (its log ends at {pb.max_offset})")
                continue
            if records:
                self.count("repaired", records)
            return True
        if (
            nowhere
            and answered
            and self.cut_tail is not None
            and end is not None
            and end >= self.store.commitlog_max_offset
        ):
            # the tail of the log, lost from our files, never reached a replica: with
            # SYNC replication nothing of it was acknowledged; cut it (a restart's
            # recovery would), pre-online then copies back whatever a slave holds
            log.error(
                "store: %s: no replica holds it (%s); cutting the commit log back to %d",
                damage.describe(),
                "; ".join(why),
                start,
            )
            self.count("unrepairable", 1)
            self.cut_tail(damage)
            return False
        if not damage.reported:
            damage.reported = True
            self.count("unrepairable", 1)
            log.error(
                "store: %s: no replica has an intact copy (%s); the record stays refused "
                "to every reader; %s",
                damage.describe(),
                "; ".join(why) or "no replica to ask",
                REMEDY,
            )
        damage.failures += 1
        return False
