"""Catch-up: a master whose commit log is behind its most advanced slave copies the
missing bytes from that slave before it serves.

A master comes back behind its slaves when it lost its volume (a lost PVC: an empty
store) or the unflushed tail of its log (async flush, power loss).  Without catch-up
its HA port would refuse every slave ("slave reports offset beyond our max") for ever.

Two ends, both on the brokers' RPC port:

- :class:`CommitLogRangeService` (every broker) answers ``GET_COMMITLOG_RANGE`` with
  whole records read from its own store, at most :data:`MAX_RANGE_BYTES` per call,
  and the bounds of its log;
- :class:`CatchUp` (a master in pre-online) asks each slave for its bounds
  (:meth:`CatchUp.probe`), decides with :func:`plan_catch_up` (no I/O) whether and from
  whom to copy, then pulls ranges (:meth:`CatchUp.run`) and appends them with the checks
  a slave applies to the HA stream (``append_replicated``: CRC, physical offsets,
  segment fit), rebuilding the consume queues as it goes (``reput``), and flushes.

A master with an empty log that catches up has lost its metadata files as well
(:attr:`CatchUpPlan.lost_volume`): pre-online then takes the source slave's versioned
tables as they are before its usual reverse sync.  The marker file
:data:`LOST_VOLUME_MARKER` remembers that across a restart in the middle of it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from broker_agent.store.message_store import MessageStore
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import CorruptRecord, HaError, OffsetOutOfRange, UnknownMethod
from ha_controller.rpc import ConnectionPool, Dispatcher, RequestContext

log = logging.getLogger(__name__)

MiB = 1 << 20
#: What a master asks for per GET_COMMITLOG_RANGE call.
CHUNK_BYTES = 1 * MiB
#: What a broker answers at most per call (a single larger record still goes whole).
MAX_RANGE_BYTES = 4 * MiB
#: How long one range request may take (a bounds-only probe: PROBE_TIMEOUT_MS).
RANGE_TIMEOUT_MS = 5000
PROBE_TIMEOUT_MS = 3000
#: How often a running catch-up logs its progress.
PROGRESS_LOG_S = 5.0
#: In the store directory while a master that lost its volume still has to take its
#: slave's metadata tables (survives a restart in the middle of the catch-up).
LOST_VOLUME_MARKER = "catchup.lost-volume"


class CatchUpError(HaError):
    """A catch-up step failed (slave gone, short or corrupt data); pre-online retries.

    Local only: it never crosses the wire (it has no code of its own)."""

    retriable = True


def mib(n: int) -> str:
    return f"{n / MiB:.1f}"


# ---- the answering end -----------------------------------------------------------------


class CommitLogRangeService:
    """GET_COMMITLOG_RANGE: whole records of this broker's commit log and its bounds.

    Read-only and served in any role (a master in pre-online asks its slaves); it
    exposes what PULL_MESSAGE and the HA port already expose."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store

    def register(self, dispatcher: Dispatcher) -> None:
        dispatcher.add(
            RequestCode.GET_COMMITLOG_RANGE, broker_pb2.CommitLogRangeRequest, self.get_range
        )

    async def get_range(
        self, ctx: RequestContext, req: broker_pb2.CommitLogRangeRequest
    ) -> broker_pb2.CommitLogRange:
        store = self.store
        max_bytes = max(0, min(req.max_bytes, MAX_RANGE_BYTES))
        # bounds first: data never ends past the max_offset we report
        lo, hi = store.commitlog_min_offset, store.commitlog_max_offset
        data = store.read_commitlog(req.from_offset, max_bytes) if max_bytes else b""
        return broker_pb2.CommitLogRange(
            from_offset=req.from_offset, data=data, min_offset=lo, max_offset=hi
        )


# ---- the decision (no I/O) -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlaveLog:
    """A slave's commit-log bounds, as its probe answered."""

    broker_id: int
    addr: str
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class CatchUpPlan:
    """What pre-online does about its commit log; ``str()`` is the one-line decision."""

    #: the most advanced slave (the one to copy from when behind), None without slaves
    source: SlaveLog | None
    start: int
    target: int
    #: our log was empty: the volume (and every metadata file with it) is lost
    lost_volume: bool
    #: why the master cannot catch up (it stays isolated), or None
    blocked: str | None
    text: str

    @property
    def needed(self) -> bool:
        return self.source is not None and self.blocked is None and self.target > self.start

    def __str__(self) -> str:
        return self.text


def plan_catch_up(own_min: int, own_max: int, slaves: Sequence[SlaveLog]) -> CatchUpPlan:
    """Whether and from whom a master with commit log ``[own_min, own_max)`` copies.

    The source is the most advanced slave; among equals the highest id, because the
    lowest live id is the one acting for the master and serving clients.  A master with
    an empty log takes everything its source holds (from the source's first segment);
    otherwise the source must hold the bytes right after ours.
    """
    if not slaves:
        return CatchUpPlan(None, own_max, own_max, False, None, "no slave to compare with")
    seen = ", ".join(f"slave {s.broker_id} at {s.max_offset}" for s in slaves)
    best = max(slaves, key=lambda s: (s.max_offset, s.broker_id))
    if best.max_offset <= own_max:
        text = f"commit log ends at {own_max}, not behind any slave ({seen})"
        return CatchUpPlan(best, own_max, own_max, False, None, text)
    empty = own_min == own_max
    start = best.min_offset if empty else own_max
    if not empty and best.min_offset > own_max:
        why = (
            f"slave {best.broker_id}'s commit log starts at {best.min_offset}, past our end "
            f"{own_max}: it cannot fill the gap (move this store away to copy all of it)"
        )
        return CatchUpPlan(best, start, best.max_offset, False, why, why)
    text = (
        f"commit log {'empty' if empty else f'ends at {own_max}'}, behind its slaves "
        f"({seen}): catching up {mib(best.max_offset - start)} MiB "
        f"[{start}, {best.max_offset}) from slave {best.broker_id} at {best.addr}"
    )
    return CatchUpPlan(best, start, best.max_offset, empty, None, text)


# ---- the copying end -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CatchUpResult:
    copied_bytes: int
    seconds: float

    @property
    def mib_per_s(self) -> float:
        return self.copied_bytes / MiB / self.seconds if self.seconds > 0 else 0.0


class CatchUp:
    """A master's side: probe the slaves, plan, copy from the most advanced one.

    Only pre-online uses it, while the master is isolated (unregistered, refusing
    clients), so nothing else appends to the store meanwhile.
    """

    def __init__(
        self,
        store: MessageStore,
        pool: ConnectionPool,
        *,
        chunk_bytes: int = CHUNK_BYTES,
        progress_log_s: float = PROGRESS_LOG_S,
        timeout_ms: int = RANGE_TIMEOUT_MS,
    ) -> None:
        self.store = store
        self.pool = pool
        self.chunk_bytes = chunk_bytes
        self.progress_log_s = progress_log_s
        self.timeout_ms = timeout_ms

    # ---- the lost-volume marker ----------------------------------------------------------

    @property
    def _marker(self) -> Path:
        return self.store.directory / LOST_VOLUME_MARKER

    def lost_volume_pending(self) -> bool:
        """A catch-up into an empty log started and its metadata is not taken yet."""
        return self._marker.exists()

    def lost_volume_done(self) -> None:
        """The source slave's metadata tables are ours now."""
        try:
            self._marker.unlink(missing_ok=True)
        except OSError as exc:
            raise CatchUpError(f"cannot remove {self._marker}: {exc}") from exc

    # ---- steps ---------------------------------------------------------------------------

    async def _range(
        self, slave_id: int, addr: str, offset: int, max_bytes: int
    ) -> broker_pb2.CommitLogRange:
        """One GET_COMMITLOG_RANGE; UnknownMethod passes, other errors name the slave."""
        try:
            pb = await self.pool.call_pb(
                addr,
                RequestCode.GET_COMMITLOG_RANGE,
                broker_pb2.CommitLogRangeRequest(from_offset=offset, max_bytes=max_bytes),
                broker_pb2.CommitLogRange,
                timeout_ms=self.timeout_ms if max_bytes else PROBE_TIMEOUT_MS,
            )
        except UnknownMethod:
            raise
        except HaError as exc:
            raise CatchUpError(f"slave {slave_id} at {addr}: {exc}") from exc
        return pb

    async def probe(self, slaves: Sequence[tuple[int, str]]) -> list[SlaveLog]:
        """Each slave's commit-log bounds.  A slave that does not know the request (an
        older version) is left out; one that does not answer raises CatchUpError."""
        out: list[SlaveLog] = []
        for slave_id, addr in slaves:
            try:
                pb = await self._range(slave_id, addr, 0, 0)
            except UnknownMethod:
                log.info("pre-online: slave %d cannot tell its commit-log bounds", slave_id)
                continue
            out.append(SlaveLog(slave_id, addr, pb.min_offset, pb.max_offset))
        return out

    def plan(self, slaves: Sequence[SlaveLog]) -> CatchUpPlan:
        store = self.store
        return plan_catch_up(store.commitlog_min_offset, store.commitlog_max_offset, slaves)

    async def run(self, plan: CatchUpPlan, on_step: Callable[[str], None]) -> CatchUpResult:
        """Copy ``[plan.start, plan.target)`` from ``plan.source``; raises CatchUpError
        (or a StoreError when the local store fails).  Resumable: a retry plans again
        from wherever the local log ends."""
        source = plan.source
        if source is None or not plan.needed:
            raise CatchUpError(f"nothing to catch up: {plan}")
        if plan.lost_volume:
            try:
                self._marker.touch()
            except OSError as exc:
                raise CatchUpError(f"cannot create {self._marker}: {exc}") from exc
        store = self.store
        sid = source.broker_id
        offset = plan.start
        target = plan.target
        total = target - plan.start
        began = last_log = time.monotonic()

        def step() -> str:
            return f"catching up from slave {sid}: {mib(offset - plan.start)} of {mib(total)} MiB"

        on_step(step())
        while offset < target:
            rng = await self._range(sid, source.addr, offset, self.chunk_bytes)
            if rng.from_offset != offset:
                raise CatchUpError(
                    f"slave {sid} answered a range at {rng.from_offset}, asked for {offset}"
                )
            if rng.max_offset < target:
                log.warning(
                    "slave %d's commit log now ends at %d, not %d; catching up to there",
                    sid,
                    rng.max_offset,
                    target,
                )
                target = rng.max_offset
                total = target - plan.start
            if not rng.data:
                if offset >= target:
                    break
                raise CatchUpError(
                    f"slave {sid} sent no data at {offset} though its log ends at {target}"
                )
            try:
                store.append_replicated(offset, rng.data)
            except (CorruptRecord, OffsetOutOfRange) as exc:
                # nothing of it was written; any other StoreError is our own store's
                raise CatchUpError(f"data from slave {sid} at {offset}: {exc}") from exc
            store.reput()
            offset = store.commitlog_max_offset
            on_step(step())
            now = time.monotonic()
            if now - last_log >= self.progress_log_s:
                last_log = now
                log.info(
                    "%s (%.1f MiB/s)",
                    step(),
                    (offset - plan.start) / MiB / (now - began),
                )
        while store.dispatch_behind_bytes:
            store.reput()
        on_step(f"caught up from slave {sid}: flushing {mib(offset - plan.start)} MiB")
        await asyncio.to_thread(store.flush)
        result = CatchUpResult(offset - plan.start, time.monotonic() - began)
        log.info(
            "caught up from slave %d: %s MiB in %.1f s (%.1f MiB/s); commit log now [%d, %d)",
            sid,
            mib(result.copied_bytes),
            result.seconds,
            result.mib_per_s,
            store.commitlog_min_offset,
            offset,
        )
        return result
