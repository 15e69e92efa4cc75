"""The POP revive service (RocketMQ's PopReviveService).

The revive service (master, or the acting slave) reads the revive queues, matches
CKs with ACKs and, when a CK's invisible time is over with offsets still un-acked,
reads each original message (``EscapeBridge.get_message``: locally, or from the
group that holds it) and writes it to ``%RETRY%{group}`` through
``put_message_to_specific_queue``.  A failure re-puts the CK later with RocketMQ's
back-off (10 s, 20 s, 30 s, 1 min, ...), dropped after the last interval.

CKs the lost master wrote before it died are in the slave's replicated revive queue:
the acting slave revives those itself, and an ack of such a message (``ck_local`` in
its handle) has no record to go to: it is kept in the POP ack table
(:mod:`broker_agent.metadata.pop_acks`), as is every CK revived, with how far each
revive queue is finished.  The table is versioned, persisted and synced like the other
metadata tables: the returning master adopts it in pre-online (and the slave reloads it
after a restart), and its revive loop starts again from the synced state, so an acked
message is never revived.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from broker_agent.metadata.pop_acks import PopAckTable
from broker_agent.special.escape_ids import escape_id
from broker_agent.special.pop.records import TAG_ACK, TAG_CK, Checkpoint, ack_body, parse_ack
from broker_agent.special.pop.revive_log import ReviveLog
from broker_agent.special.ports import CorePort, EscapePort, WritePort
from broker_agent.store.message_store import GetMessageStatus
from ha_controller.protocol.errors import HaError
from ha_controller.protocol.properties import (
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_POP_CK,
    PROPERTY_POP_KEY,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TAGS,
    RETRY_PREFIX,
    REVIVE_GROUP,
    retry_topic,
)
from ha_controller.protocol.record import StoredMessage, make_msg_id

__all__ = ["CK_REWRITE_INTERVALS_S", "PopReviveService", "ReviveState", "retry_properties"]

log = logging.getLogger(__name__)

#: RocketMQ ckRewriteIntervalsInSeconds: the back-off of a CK whose revive failed.
CK_REWRITE_INTERVALS_S: Final = (
    10,
    20,
    30,
    60,
    120,
    180,
    240,
    300,
    360,
    420,
    480,
    540,
    600,
    1200,
    1800,
    3600,
    7200,
)
#: ACKs read before their CK (or applied in memory) kept at most this many keys.
MAX_EARLY_ACK_KEYS: Final = 100_000


# --- what the revive has read (plain, no I/O) ---------------------------------------


@dataclass
class _Pending:
    ck: Checkpoint
    revive_qid: int
    revive_offset: int
    acked: set[int] = field(default_factory=set)

    @property
    def done(self) -> bool:
        return all(o in self.acked for o in self.ck.offsets)


class ReviveState:
    """CKs read from the revive queues and not finished yet, with their ACKs."""

    def __init__(self) -> None:
        self.read_offsets: dict[int, int] = {}
        self.pending: dict[str, _Pending] = {}
        self._early_acks: dict[str, set[int]] = {}

    def reset(self) -> None:
        self.read_offsets.clear()
        self.pending.clear()
        self._early_acks.clear()

    def add_ck(self, ck: Checkpoint, revive_qid: int, revive_offset: int) -> None:
        p = _Pending(ck, revive_qid, revive_offset, self._early_acks.pop(ck.key, set()))
        self.pending[ck.key] = p

    def ack(self, key: str, offset: int) -> None:
        p = self.pending.get(key)
        if p is not None:
            p.acked.add(offset)
            return
        if key not in self._early_acks and len(self._early_acks) >= MAX_EARLY_ACK_KEYS:
            self._early_acks.pop(next(iter(self._early_acks)))
        self._early_acks.setdefault(key, set()).add(offset)

    def due(self, now: int) -> list[_Pending]:
        """Pending CKs that are finished (all acked) are dropped; the expired are returned."""
        for key in [k for k, p in self.pending.items() if p.done]:
            del self.pending[key]
        return sorted(
            (p for p in self.pending.values() if p.ck.due_ms <= now),
            key=lambda p: p.ck.due_ms,
        )

    def commit_offset(self, revive_qid: int) -> int:
        """Where the revive queue is consumed up to: the earliest unfinished CK, else read."""
        read = self.read_offsets.get(revive_qid, 0)
        offs = [p.revive_offset for p in self.pending.values() if p.revive_qid == revive_qid]
        return min([read, *offs])


def retry_properties(msg: StoredMessage, ck: Checkpoint) -> dict[str, str]:
    """The properties of a revived message in the retry topic."""
    props = dict(msg.properties)
    props.pop(PROPERTY_POP_CK, None)
    if not ck.topic.startswith(RETRY_PREFIX):
        props[PROPERTY_RETRY_TOPIC] = ck.topic
    props[PROPERTY_RECONSUME_TIME] = str(int(props.get(PROPERTY_RECONSUME_TIME, "0") or 0) + 1)
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, make_msg_id(msg.store_host, msg.physical_offset))
    return props


# --- the service ----------------------------------------------------------------------


class PopReviveService:
    """Revives the expired CKs of the revive queues while this broker serves them."""

    def __init__(
        self,
        core: CorePort,
        write_path: WritePort,
        escape: EscapePort,
        revive_log: ReviveLog,
        clock: Callable[[], int],
    ) -> None:
        self.core = core
        self.write_path = write_path
        self.escape = escape
        self.revive_log = revive_log
        self.topic = revive_log.topic
        self._clock = clock
        self.state = ReviveState()
        self.acks = PopAckTable(core.store_dir / "pop_acks.json")
        self.acks.load()
        self._clamp_finished()
        self.restart_state()
        self._active = False  # the service turns special services on (master online, acting)
        self._reset = True
        self._wake = asyncio.Event()
        self.revived = 0

    @property
    def active(self) -> bool:
        """The revive service runs here (master online, acting slave)."""
        return self._active

    def set_active(self, active: bool) -> None:
        if active != self._active:
            log.info("pop revive service %s", "started" if active else "stopped")
            if active:
                self._clamp_finished()
        self._active = active
        self._reset = True
        self._wake.set()

    def acks_adopted(self) -> None:
        """A reverse sync merged a slave's acks: revive from the synced state."""
        self.acks.persist()
        self._reset = True
        self._wake.set()

    def ack_local(self, key: str, offset: int) -> None:
        """An ack of a CK in our replicated revive queue on a slave (it cannot write an
        ACK record there): our revive loop owns the CK, and the ack table carries the
        ack to the returning master."""
        self.state.ack(key, offset)
        p = self.state.pending.get(key)
        where = None if p is None else (p.revive_qid, p.revive_offset)
        self.acks.record(key, {offset}, where)

    async def run(self) -> None:
        """Forever: while active (master / acting slave, not isolated), revive."""
        core = self.core
        interval_s = core.cfg.pop_revive_interval_ms / 1000
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(interval_s):
                        await self._wake.wait()
                self._wake.clear()
                if self._reset:
                    self._reset = False
                    self.restart_state()
                if core.isolated or not self._active or not core.acting.serves_master_only_ops:
                    continue
                try:
                    # a master resumed after a freeze fences itself here (lease lost)
                    # before it revives from a state its acting slave has moved past
                    core.check_master_only("pop revive")
                    await self.revive_once()
                except HaError as exc:
                    log.warning("pop revive pass failed: %s", exc)
                try:
                    await self.acks.persist_async()
                except OSError as exc:  # a full disk: the table stays dirty, tried again
                    log.warning("cannot persist the POP ack table: %s; retrying", exc)
        finally:
            with contextlib.suppress(OSError):
                self.acks.persist()

    def _clamp_finished(self) -> None:
        """Before anything is written (starting, or becoming active after pre-online
        and its cut): the ack table's revive offsets stop at each queue's end, or the
        records written from there on would never be read."""
        store = self.core.store
        for rq in {*self._revive_queues(), *self.acks.revive_offsets}:
            self.acks.clamp(rq, max(0, store.max_offset(self.topic, rq)))

    def restart_state(self) -> None:
        """Forget what was read from the revive queues; the ack table's acks apply to
        the CKs read again (as on a restart)."""
        self.state.reset()
        for key, entry in self.acks.entries.items():
            for offset in entry.offsets:
                self.state.ack(key, offset)

    def _revive_queues(self) -> list[int]:
        return self.core.store.topics_and_queues().get(self.topic, [])

    def _read_records(self, rq: int) -> None:
        core = self.core
        state = self.state
        offset = state.read_offsets.get(rq)
        if offset is None:
            offset = core.offsets.query(REVIVE_GROUP, self.topic, rq)
            if offset < 0:
                offset = core.store.min_offset(self.topic, rq)
            # CKs below the ack table's offset are finished, their entries dropped
            offset = max(offset, self.acks.start_offset(rq))
        while True:
            got = core.store.get_messages(self.topic, rq, offset, 256)
            if not got.messages:
                if got.next_begin_offset > offset and got.status in (
                    GetMessageStatus.OFFSET_TOO_SMALL,
                    GetMessageStatus.OFFSET_FOUND_NULL,
                ):
                    offset = got.next_begin_offset
                    continue
                break
            for rec in got.messages:
                tag = rec.properties.get(PROPERTY_TAGS)
                try:
                    if tag == TAG_CK:
                        ck = Checkpoint.from_json(rec.body)
                        state.add_ck(ck, rq, rec.queue_offset)
                        self.acks.locate(ck.key, rq, rec.queue_offset)
                    elif tag == TAG_ACK:
                        state.ack(*parse_ack(rec.body))
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("bad revive record %d/%d: %s", rq, rec.queue_offset, exc)
            offset = got.next_begin_offset
        state.read_offsets[rq] = offset

    async def revive_once(self) -> None:
        core = self.core
        queues = self._revive_queues()
        for rq in queues:
            self._read_records(rq)
        for p in self.state.due(self._clock()):
            with core.special_steps.step():  # the revive and its record, uncut
                if await self._revive(p):
                    self.state.pending.pop(p.ck.key, None)
                    # revived offsets are done: whoever reads this CK again skips them
                    # (a re-put CK keeps the key, its failed offsets stay to do)
                    done = {o for o in p.ck.offsets if o in p.acked}
                    self.acks.record(p.ck.key, done, (p.revive_qid, p.revive_offset))
        for rq in queues:
            offset = self.state.commit_offset(rq)
            if offset != core.offsets.query(REVIVE_GROUP, self.topic, rq):
                self.write_path.commit_offset(REVIVE_GROUP, self.topic, rq, offset)
            self.acks.finished(rq, offset)

    async def _revive(self, p: _Pending) -> bool:
        """Write the un-acked messages of an expired CK to the retry topic; on failure
        re-put the CK for the rest with back-off.  False: try again next pass."""
        ck = p.ck
        failed: list[int] = []
        for offset in ck.offsets:
            if offset in p.acked:
                continue
            try:
                msg = await self.escape.get_message(ck.topic, ck.broker_name, ck.queue_id, offset)
                if msg is None:
                    log.warning(
                        "revive: %s/%s/%d offset %d not found",
                        ck.broker_name,
                        ck.topic,
                        ck.queue_id,
                        offset,
                    )
                    continue
                # on a master the revive's ACK goes right behind the retry message, in
                # the same transfer: a slave that then acts (the master was cut off
                # mid-revive, and the slaves got both) does not revive it again
                await self.escape.put_message_to_specific_queue(
                    retry_topic(ck.group),
                    msg.body,
                    retry_properties(msg, ck),
                    kind="pop_retry",
                    flags=msg.flags,
                    escape_id=escape_id(self.core.cfg.broker_name, "pop_retry", msg, ck.key),
                    then=(
                        self.topic,
                        0,
                        ack_body(ck.key, offset),
                        {PROPERTY_TAGS: TAG_ACK, PROPERTY_POP_KEY: ck.key},
                    ),
                )
            except HaError as exc:
                log.info("revive of %s offset %d failed: %s", ck.key, offset, exc)
                failed.append(offset)
                continue
            p.acked.add(offset)
            self.revived += 1
        if not failed:
            log.debug("revived %s", ck.key)
            return True
        if ck.reput_times >= len(CK_REWRITE_INTERVALS_S):
            log.error("revive of %s dropped after %d re-puts", ck.key, ck.reput_times)
            return True
        again = Checkpoint(
            broker_name=ck.broker_name,
            group=ck.group,
            topic=ck.topic,
            queue_id=ck.queue_id,
            start_offset=ck.start_offset,
            offsets=tuple(failed),
            pop_time_ms=ck.pop_time_ms,
            invisible_ms=ck.invisible_ms,
            due_ms=self._clock() + CK_REWRITE_INTERVALS_S[ck.reput_times] * 1000,
            reput_times=ck.reput_times + 1,
        )
        try:
            await self.revive_log.write(again.to_json(), TAG_CK, again.key, "pop_ck")
        except HaError as exc:
            log.warning("re-put of CK %s failed: %s", ck.key, exc)
            return False
        return True
