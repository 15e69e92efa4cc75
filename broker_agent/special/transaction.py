"""Transaction messages: half and op messages, END_TRANSACTION and the check service.

A send whose properties carry ``TRAN_MSG=true`` is stored as a *half message* in
``RMQ_SYS_TRANS_HALF_TOPIC`` (queue 0) with ``REAL_TOPIC`` / ``REAL_QID``; consumers
never see it.  END_TRANSACTION (37) commits it (the real message is written to its
topic) or rolls it back; either way an *op message* in ``RMQ_SYS_TRANS_OP_HALF_TOPIC``
records the half queue offset it resolved.  The check service (master, or the acting
slave) reads the op queue, then walks the half queue from ``half_offset``:

- on a master, an unresolved half message older than ``transaction_timeout_ms`` is
  checked: CHECK_TRANSACTION_STATE (39) goes one-way to the producer group on the
  producer's own connection (HEART_BEAT or the send remembers it), and the producer
  answers with END_TRANSACTION; after ``transaction_check_max`` checks it is discarded;
- on an acting slave (as RocketMQ's RIP-32 does it), every unresolved half message is
  *escaped*: converted back to a prepared message (same UNIQ_KEY, i.e. transaction
  id) and put to a live master (local in a container, else remote), which checks it.

The slave cannot write op messages (its store only replicates), so the progress —
``half_offset``, ``op_offset`` and the offsets resolved or escaped while acting — is a
small table with a DataVersion (``transaction_offsets.json``), served on
GET_TRANSACTION_OFFSETS, forward-synced to slaves and adopted by a returning master in
pre-online, so that it does not check (and the producer commit) again what its
acting slave already handed on.  With ``flush_mode = "sync"`` what only the table
records (an acting slave's resolution or escape) is on disk before it counts as done
(``WritePath.durable``); a master's op messages are synced with its commit log.

Beyond RocketMQ, whose EndTransactionProcessor refuses a SLAVE, an END_TRANSACTION
received by the acting slave is honoured, as the RIP-32 text promises: a commit is
forwarded through the escape bridge as the real message, a rollback is recorded.
Half messages are not rewritten on each check (RocketMQ re-puts them to count the
checks); check counts live in memory, and resolutions are keyed by offset *and*
transaction id, so a duplicate half (a retried send) is not committed twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from broker_agent.metadata.json_table import JsonTable, oldest
from broker_agent.metadata.versioned import TableSync
from broker_agent.special.escape_ids import escape_id
from broker_agent.special.ports import CorePort, EscapePort, WritePort
from broker_agent.store.message_store import GetMessageStatus, PutResult
from ha_controller.acl.rules import PUB, topic_need
from ha_controller.dataversion import DataVersion
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    BadRequest,
    ConnectionClosed,
    HaError,
    NotMaster,
    RequestTimeout,
)
from ha_controller.protocol.properties import (
    HALF_TOPIC,
    OP_TOPIC,
    PROPERTY_OP_RESULT,
    PROPERTY_OP_TRANSACTION_ID,
    PROPERTY_PREPARED_QUEUE_OFFSET,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRAN_MSG,
)
from ha_controller.protocol.record import StoredMessage, make_msg_id
from ha_controller.rpc import RequestContext, RpcConnection
from ha_controller.wire import data_version_from_pb, data_version_to_pb

__all__ = [
    "HALF_TOPIC",
    "OP_TOPIC",
    "HalfProgress",
    "TransactionProgressFile",
    "TransactionService",
    "half_to_prepared",
    "half_to_real",
    "accept_escaped",
]

log = logging.getLogger(__name__)

HALF_QUEUE: Final = 0
OP_REMOVE_TAG: Final = "d"


#: Read statuses after which the scan moves on to ``next_begin_offset``.
SKIPPABLE: Final = frozenset(
    {GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_FOUND_NULL}
)
#: How many halves rolled back by a check are remembered for a late commit.
MAX_CHECK_ROLLBACKS: Final = 10_000
#: How many resolved transaction ids are remembered (oldest forgotten first).
MAX_RESOLVED_IDS: Final = 100_000
#: Half messages looked at per check pass (the rest wait for the next pass).
MAX_SCAN_PER_PASS: Final = 2000
#: The check loop wakes at least this often.
CHECK_TICK_S: Final = 2.0
#: how long an END_TRANSACTION waits for the escape of its half (in flight) to finish,
#: below a client's request timeout; then it is refused as retriable
ESCAPE_WAIT_S: Final = 2.5
#: A producer connection not seen (heartbeat or send) for this long is forgotten.
PRODUCER_EXPIRY_S: Final = 120.0


# --- pure helpers ---------------------------------------------------------------


def is_half_send(properties: dict[str, str]) -> bool:
    return properties.get(PROPERTY_TRAN_MSG, "").lower() == "true"


def half_to_real(msg: StoredMessage, half_offset: int) -> tuple[str, int, dict[str, str]]:
    """The committed message of a half message: (real topic, real queue, properties)."""
    props = dict(msg.properties)
    topic = props.pop(PROPERTY_REAL_TOPIC, "")
    qid = int(props.pop(PROPERTY_REAL_QID, "0") or 0)
    props.pop(PROPERTY_TRAN_MSG, None)
    props[PROPERTY_PREPARED_QUEUE_OFFSET] = str(half_offset)
    if not topic:
        raise BadRequest(f"half message at {half_offset} has no {PROPERTY_REAL_TOPIC}")
    return topic, qid, props


def half_to_prepared(msg: StoredMessage) -> tuple[str, int, dict[str, str]]:
    """A half message turned back into the prepared message the producer sent
    (RocketMQ ``buildTransactionalMessageFromHalfMessage``): real topic and queue,
    ``TRAN_MSG=true``, same UNIQ_KEY (the transaction id)."""
    props = dict(msg.properties)
    topic = props.pop(PROPERTY_REAL_TOPIC, "")
    qid = int(props.pop(PROPERTY_REAL_QID, "0") or 0)
    props.pop(PROPERTY_PREPARED_QUEUE_OFFSET, None)
    props[PROPERTY_TRAN_MSG] = "true"
    if not topic:
        raise BadRequest(f"half message at {msg.queue_offset} has no {PROPERTY_REAL_TOPIC}")
    return topic, qid, props


def accept_escaped(
    core: CorePort,
    write_path: WritePort,
    topic: str,
    queue_id: int,
    msg: StoredMessage,
    properties: dict[str, str],
) -> PutResult:
    """Local escape (same process): a master stores a slave's prepared message as
    its own half message."""
    config = core.topics.get(topic)
    qid = queue_id % config.write_queue_nums if config is not None else 0
    props = dict(properties)
    target_topic, target_qid = store_target(topic, qid, props)
    return write_path.append_local(
        target_topic, target_qid, msg.body, props, flags=msg.flags, born_ts_ms=msg.born_ts_ms
    )


def store_target(topic: str, queue_id: int, properties: dict[str, str]) -> tuple[str, int]:
    """Where SEND_MESSAGE stores an entry: a prepared message goes to the half
    topic with its real topic and queue in properties (which are updated)."""
    if not is_half_send(properties):
        return topic, queue_id
    properties[PROPERTY_REAL_TOPIC] = topic
    properties[PROPERTY_REAL_QID] = str(queue_id)
    return HALF_TOPIC, HALF_QUEUE


# --- progress (a plain object) -------------------------------------------------


@dataclass
class HalfProgress:
    """How far the check service got over the half and op queues.

    Every half offset below ``half_offset`` is resolved, escaped or discarded;
    ``resolved`` holds those at or above it; ``resolved_ids`` the transaction ids
    whose resolution is known (bounded, oldest forgotten first).
    """

    half_offset: int = 0
    op_offset: int = 0
    resolved: set[int] = field(default_factory=set)
    resolved_ids: OrderedDict[str, None] = field(default_factory=OrderedDict)
    version: DataVersion = field(default_factory=DataVersion)

    def is_resolved(self, offset: int, transaction_id: str | None = None) -> bool:
        if offset < self.half_offset or offset in self.resolved:
            return True
        return bool(transaction_id) and transaction_id in self.resolved_ids

    def resolve(self, offset: int, transaction_id: str | None = None) -> bool:
        """Record a resolution; True when it is new."""
        new = not self.is_resolved(offset, None)
        if offset >= self.half_offset:
            self.resolved.add(offset)
        if transaction_id:
            self.resolved_ids[transaction_id] = None
            self.resolved_ids.move_to_end(transaction_id)
            while len(self.resolved_ids) > MAX_RESOLVED_IDS:
                self.resolved_ids.popitem(last=False)
        return new

    def advance(self) -> bool:
        """Move ``half_offset`` over the resolved prefix; True when it moved."""
        start = self.half_offset
        while self.half_offset in self.resolved:
            self.resolved.discard(self.half_offset)
            self.half_offset += 1
        return self.half_offset != start

    def adopt_if_newer(self, other: HalfProgress) -> bool:
        """Pre-online: merge a slave's progress whose version is >= ours (ties adopt).

        Progress only grows (every offset in either table was resolved or escaped by
        someone), so the merge is safe; the version check is RocketMQ's rule, and an
        acting slave's table outranks ours because it took over (state version + 1)."""
        if self.version.compare(other.version) > 0:
            return False
        self.half_offset = max(self.half_offset, other.half_offset)
        self.op_offset = max(self.op_offset, other.op_offset)
        self.resolved = {o for o in self.resolved | other.resolved if o >= self.half_offset}
        for tid in other.resolved_ids:
            self.resolved_ids[tid] = None
        self.version.assign(other.version)
        self.advance()
        return True

    def adopt_on_promotion(self, other: HalfProgress, half_end: int, op_end: int) -> bool:
        """Pre-online of a member just elected master: merge a member's progress
        whatever the versions (each slave that acted moved the version on when it took
        over, so they do not tell who resolved more; ``controller-flap``, seed 3307),
        but nothing at or past this log's ends (``half_end``, ``op_end``): a member's
        unacknowledged tail is not here, and the halves this master stores at those
        offsets are not resolved."""
        half = max(self.half_offset, min(other.half_offset, half_end))
        op = max(self.op_offset, min(other.op_offset, op_end))
        resolved = {o for o in self.resolved | other.resolved if half <= o < half_end}
        resolved |= {o for o in self.resolved if o >= half}
        ids = [tid for tid in other.resolved_ids if tid not in self.resolved_ids]
        if (half, op, resolved) == (self.half_offset, self.op_offset, self.resolved) and not ids:
            return False
        self.half_offset, self.op_offset, self.resolved = half, op, resolved
        for tid in ids:
            self.resolved_ids[tid] = None
        if other.version.compare(self.version) > 0:
            self.version.assign(other.version)
        self.advance()
        return True

    def assign(self, other: HalfProgress) -> None:
        """Forward sync on a slave: take the master's progress as it is."""
        self.half_offset = other.half_offset
        self.op_offset = other.op_offset
        self.resolved = set(other.resolved)
        self.resolved_ids = OrderedDict(other.resolved_ids)
        self.version.assign(other.version)

    def to_pb(self) -> broker_pb2.TransactionOffsets:
        return broker_pb2.TransactionOffsets(
            half_offset=self.half_offset,
            op_offset=self.op_offset,
            resolved=sorted(self.resolved),
            resolved_transaction_ids=list(self.resolved_ids),
            data_version=data_version_to_pb(self.version),
        )

    @classmethod
    def from_pb(cls, pb: broker_pb2.TransactionOffsets) -> HalfProgress:
        return cls(
            half_offset=pb.half_offset,
            op_offset=pb.op_offset,
            resolved=set(pb.resolved),
            resolved_ids=OrderedDict.fromkeys(pb.resolved_transaction_ids),
            version=data_version_from_pb(pb.data_version),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "halfOffset": self.half_offset,
            "opOffset": self.op_offset,
            "resolved": sorted(self.resolved),
            "resolvedTransactionIds": list(self.resolved_ids),
            "dataVersion": self.version.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HalfProgress:
        return cls(
            half_offset=int(data.get("halfOffset", 0)),
            op_offset=int(data.get("opOffset", 0)),
            resolved={int(o) for o in data.get("resolved", [])},
            resolved_ids=OrderedDict.fromkeys(
                str(t) for t in data.get("resolvedTransactionIds", [])
            ),
            version=DataVersion.from_dict(data.get("dataVersion", {})),
        )


class TransactionProgressFile(JsonTable):
    """The progress, persisted (``transaction_offsets.json``)."""

    what = "transaction progress table"
    rebuilt_from = (
        "starting over: the check service reads the op queue again, and a replica's "
        "progress, newer, is adopted in pre-online and by the forward sync"
    )

    def __init__(self, path: Path | None) -> None:
        super().__init__(path)
        self.progress = HalfProgress()

    def restore(self, data: Any) -> None:
        self.progress = HalfProgress.from_dict(data)

    def start_over(self) -> None:
        self.progress = HalfProgress(version=oldest())

    def payload(self) -> dict[str, Any]:
        return self.progress.to_dict()


# --- the service ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Producer:
    """A producer connection as a HEART_BEAT left it: when, and who (a cluster member,
    an ACL user and its address, or None: anonymous)."""

    seen: float
    user: str | None
    ip: Any
    member: bool


class TransactionService:
    """Half/op messages, END_TRANSACTION, GET_TRANSACTION_OFFSETS and the check loop."""

    def __init__(self, core: CorePort, write_path: WritePort, escape: EscapePort) -> None:
        self.core = core
        self.write_path = write_path
        self.escape = escape
        self.file = TransactionProgressFile(core.store_dir / "transaction_offsets.json")
        self.file.load()
        self._active = False  # the service turns special services on (master online, acting)
        self._wake = asyncio.Event()
        self._checks: dict[int, int] = {}  # half offset -> checks sent (in memory)
        self._escape_failures: dict[int, int] = {}
        self._inflight: set[int] = set()
        #: half offset -> transaction id, of halves a check rolled back (in memory): the
        #: producer's own commit arriving after it still counts, as in RocketMQ
        self._check_rollbacks: OrderedDict[int, str] = OrderedDict()
        # half offset -> set once its escape (in flight now) has finished, either way
        self._escaping: dict[int, asyncio.Event] = {}
        # half offset -> (group it was escaped to, its half offset there), while acting
        self._escaped_to: dict[int, tuple[str, int]] = {}
        self._producers: dict[str, dict[RpcConnection, _Producer]] = {}
        self.escaped = 0
        self.checked = 0
        core.dispatcher.add(
            RequestCode.END_TRANSACTION, broker_pb2.EndTransactionRequest, self._end_transaction
        )
        core.dispatcher.add(
            RequestCode.GET_TRANSACTION_OFFSETS, common_pb2.Empty, self._get_offsets
        )
        core.add_special_service(self.set_active)

    # ---- persistence -------------------------------------------------------

    @property
    def progress(self) -> HalfProgress:
        return self.file.progress

    def persist(self) -> None:
        self.file.persist()

    def _changed(self) -> None:
        self.progress.version.next_version()
        self.file.mark_changed()

    @property
    def active(self) -> bool:
        """Whether this broker checks (a master) or escapes (an acting slave) now."""
        return self._active

    # ---- wiring called by the service ----------------------------------------

    def set_active(self, active: bool) -> None:
        """Special-service hook: checking runs on the master and on an acting slave."""
        if active != self._active:
            log.info("transaction check service %s", "started" if active else "stopped")
            if active and not self.core.acting.is_master:
                # an acting slave: its progress is the group's truth from now on
                self.progress.version.take_over()
                self.file.mark_changed()
        self._active = active
        self._checks.clear()
        self._escape_failures.clear()
        self._escaped_to.clear()
        self._wake.set()

    def producer_seen(self, ctx: RequestContext, groups: list[str]) -> None:
        """HEART_BEAT on ``ctx``'s connection for producer ``groups``, by the user the
        guard authorised it as (a claim of a group is not authorised: a check goes
        only to a producer whose user may publish to the half message's topic)."""
        seen = _Producer(time.monotonic(), ctx.acl_user, ctx.acl_ip, ctx.authenticated)
        for group in groups:
            if group:
                self._producers.setdefault(group, {})[ctx.conn] = seen

    def connection_closed(self, conn: RpcConnection) -> None:
        for conns in self._producers.values():
            conns.pop(conn, None)

    def _producer_conns(self, group: str, topic: str) -> list[RpcConnection]:
        """Live producers of ``group`` that may publish to ``topic``, newest first."""
        now = time.monotonic()
        conns = self._producers.get(group, {})
        for conn in [c for c, p in conns.items() if c.closed or now - p.seen > PRODUCER_EXPIRY_S]:
            del conns[conn]
        need = topic_need(topic, PUB)
        acl = self.core.acl
        allowed = [c for c, p in conns.items() if p.member or acl.permits(p.user, need, p.ip)]
        return sorted(allowed, key=lambda c: conns[c].seen, reverse=True)

    # ---- handlers --------------------------------------------------------------

    async def _end_transaction(
        self, ctx: RequestContext, req: broker_pb2.EndTransactionRequest
    ) -> common_pb2.Empty:
        self.core.check_master_only("END_TRANSACTION")
        offset = req.half_queue_offset
        msg = self.core.store.get_message_at(HALF_TOPIC, HALF_QUEUE, offset)
        if msg is None:
            raise BadRequest(f"no half message at offset {offset}")
        if req.transaction_id and msg.uniq_key != req.transaction_id:
            raise BadRequest(
                f"half message at {offset} is transaction {msg.uniq_key}, not {req.transaction_id}"
            )
        group = msg.properties.get(PROPERTY_PRODUCER_GROUP, "")
        if group and req.producer_group != group and not ctx.authenticated:
            # RocketMQ's EndTransactionProcessor refuses it too ("the producer group
            # wrong"); a member's forward of a resolution is the cluster's
            raise BadRequest(
                f"half message at {offset} belongs to producer group {group!r}, not "
                f"{req.producer_group[:128]!r}"
            )
        tid = msg.uniq_key
        escaping = self._escaping.get(offset)
        if escaping is not None:
            # the check loop is handing this half on right now: once that finishes the
            # decision goes where the half lives (ignoring it, as a duplicate, would
            # leave the half prepared on the target, whose checks may never commit it)
            try:
                async with asyncio.timeout(ESCAPE_WAIT_S):
                    await escaping.wait()
            except TimeoutError:
                raise RequestTimeout(
                    f"END_TRANSACTION for {tid}: half {offset} is being handed on to another "
                    "group; retry"
                ) from None
        escaped = self._escaped_to.get(offset)
        if escaped is not None:
            # we handed this half message on: the decision goes where it lives now
            await self._forward_end(msg, escaped, req)
            return common_pb2.Empty()
        late_commit = req.commit and not req.from_check and self._check_rollbacks.get(offset) == tid
        if late_commit and offset not in self._inflight:
            # the check asked the producer while its own commit was on the way, and a
            # checker answered ROLLBACK: the producer's decision is the one it was told
            # about (RocketMQ's EndTransactionProcessor commits it too; ignored, the
            # producer would be told OK for a message never delivered)
            log.warning(
                "transaction %s (half %d): the producer commits after a check rolled it "
                "back; committed",
                tid,
                offset,
            )
            del self._check_rollbacks[offset]
        elif self.progress.is_resolved(offset, tid) or offset in self._inflight:
            log.info("END_TRANSACTION for %s (half %d) already resolved: ignored", tid, offset)
            return common_pb2.Empty()
        self._inflight.add(offset)
        try:
            with self.core.special_steps.step():  # the escape and its record, uncut
                if req.commit:
                    await self._deliver(msg, offset)
                await self._record(msg, offset, "commit" if req.commit else "rollback")
        finally:
            self._inflight.discard(offset)
        if req.from_check and not req.commit and tid:
            self._check_rollbacks[offset] = tid
            while len(self._check_rollbacks) > MAX_CHECK_ROLLBACKS:
                self._check_rollbacks.popitem(last=False)
        log.info(
            "transaction %s (half %d) %s%s",
            tid,
            offset,
            "committed" if req.commit else "rolled back",
            " after a check" if req.from_check else "",
        )
        return common_pb2.Empty()

    async def _forward_end(
        self, msg: StoredMessage, escaped: tuple[str, int], req: broker_pb2.EndTransactionRequest
    ) -> None:
        group, remote_offset = escaped
        core = self.core
        topic = msg.properties.get(PROPERTY_REAL_TOPIC, msg.topic)
        forward = broker_pb2.EndTransactionRequest()
        forward.CopyFrom(req)
        forward.broker_name = group
        forward.half_queue_offset = remote_offset
        addrs = await self.escape.routes.group_addrs(topic, group)
        addr = addrs.get(0)
        if addr is None:
            raise NotMaster(f"transaction {msg.uniq_key} was escaped to {group}, which has no id 0")
        await core.pool.call_pb(
            addr, RequestCode.END_TRANSACTION, forward, common_pb2.Empty, timeout_ms=3000
        )
        log.info(
            "END_TRANSACTION for %s forwarded to %s (half %d there)",
            msg.uniq_key,
            group,
            remote_offset,
        )

    async def _get_offsets(
        self, ctx: RequestContext, req: common_pb2.Empty
    ) -> broker_pb2.TransactionOffsets:
        return self.progress.to_pb()

    # ---- resolution ------------------------------------------------------------

    async def _deliver(self, msg: StoredMessage, offset: int) -> None:
        """Write the committed (real) message: locally on a master, else by escape."""
        topic, qid, props = half_to_real(msg, offset)
        core = self.core
        if core.acting.is_master:
            self.write_path.append_local(
                topic, qid, msg.body, props, flags=msg.flags, born_ts_ms=msg.born_ts_ms
            )
            return
        result = await self.escape.put_message(
            topic,
            msg.body,
            props,
            kind="transaction",
            flags=msg.flags,
            born_ts_ms=msg.born_ts_ms,
            escape_id=escape_id(core.cfg.broker_name, "transaction", msg),
        )
        log.info("committed transaction %s escaped to %s", msg.uniq_key, result.target)

    async def _record(self, msg: StoredMessage, offset: int, result: str) -> None:
        """Record a resolution: an op message on a master, the progress table always."""
        tid = msg.uniq_key
        if self.core.acting.is_master:
            props = {PROPERTY_TAGS: OP_REMOVE_TAG, PROPERTY_OP_RESULT: result}
            if tid:
                props[PROPERTY_OP_TRANSACTION_ID] = tid
            self.write_path.append_local(OP_TOPIC, HALF_QUEUE, str(offset).encode(), props)
        self.progress.resolve(offset, tid)
        self.progress.advance()
        self._checks.pop(offset, None)
        self._changed()
        if not self.core.acting.is_master:
            # no op message records it (a master's is synced with its commit log):
            # the table must hold it before the resolution counts as done
            await self.write_path.progress_durable(self.file)

    # ---- the check loop ----------------------------------------------------------

    async def run(self) -> None:
        """Forever: check (or escape) while active (membership forward-syncs the
        progress of a plain slave, see :meth:`table`)."""
        core = self.core
        interval_s = core.cfg.transaction_check_interval_ms / 1000
        last_check = 0.0
        try:
            while True:
                tick = min(interval_s, CHECK_TICK_S)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(tick):
                        await self._wake.wait()
                self._wake.clear()
                now = time.monotonic()
                if core.isolated:
                    continue
                try:
                    if self._active and core.acting.serves_master_only_ops:
                        if now - last_check >= interval_s or not core.acting.is_master:
                            last_check = now
                            # a master resumed after a freeze fences itself here (lease
                            # lost) before it asks any producer about a half message the
                            # acting slave may have escaped meanwhile
                            core.check_master_only("transaction check")
                            await self.check_once()
                except HaError as exc:
                    log.warning("transaction check pass failed: %s", exc)
                try:
                    await self.file.persist_async()
                except OSError as exc:  # a full disk: the table stays dirty, tried again
                    log.warning("cannot persist the transaction progress: %s; retrying", exc)
        finally:
            with contextlib.suppress(OSError):
                self.persist()

    def table(self) -> TableSync[broker_pb2.TransactionOffsets, HalfProgress]:
        """Transaction progress, for forward and reverse sync (GET_TRANSACTION_OFFSETS):
        forward and after a cut taken as it is, reverse merged when at least as new;
        never while this broker checks or escapes (the progress is its own then)."""
        file = self.file

        def take(snapshot: HalfProgress) -> None:
            if snapshot.version.compare(file.progress.version) != 0:
                file.progress.assign(snapshot)
                file.mark_changed()

        def adopt(snapshot: HalfProgress) -> bool:
            adopted = file.progress.adopt_if_newer(snapshot)
            if adopted:
                file.mark_changed()
                file.persist()
            return adopted

        def promote(snapshot: HalfProgress) -> bool:
            store = self.core.store
            adopted = file.progress.adopt_on_promotion(
                snapshot,
                store.max_offset(HALF_TOPIC, HALF_QUEUE),
                store.max_offset(OP_TOPIC, HALF_QUEUE),
            )
            if adopted:
                file.mark_changed()
                file.persist()
            return adopted

        def describe(snapshot: HalfProgress) -> str:
            return (
                f"half {snapshot.half_offset} op {snapshot.op_offset}, "
                f"ours now half {file.progress.half_offset}"
            )

        return TableSync(
            "transaction offsets",
            RequestCode.GET_TRANSACTION_OFFSETS,
            broker_pb2.TransactionOffsets,
            decode=HalfProgress.from_pb,
            take=take,
            adopt=adopt,
            promote=promote,
            describe=describe,
            busy=lambda: self.active,
            file=file,
        )

    def _read_ops(self) -> bool:
        store = self.core.store
        progress = self.progress
        moved = False
        while True:
            got = store.get_messages(OP_TOPIC, HALF_QUEUE, progress.op_offset, 256)
            if not got.messages:
                if got.next_begin_offset > progress.op_offset and got.status in SKIPPABLE:
                    progress.op_offset = got.next_begin_offset
                    moved = True
                    continue
                return moved
            for op in got.messages:
                try:
                    half = int(op.body.decode())
                except ValueError:
                    log.warning("op message at %d has a bad body", op.queue_offset)
                    continue
                progress.resolve(half, op.properties.get(PROPERTY_OP_TRANSACTION_ID))
                self._checks.pop(half, None)
            progress.op_offset = got.next_begin_offset
            moved = True

    async def check_once(self) -> None:
        """One pass over the op and half queues (check on a master, escape when acting)."""
        core = self.core
        progress = self.progress
        changed = self._read_ops()
        acting_slave = not core.acting.is_master
        now_ms = int(time.time() * 1000)
        timeout_ms = core.cfg.transaction_timeout_ms
        offset = progress.half_offset
        scanned = 0
        while scanned < MAX_SCAN_PER_PASS:
            got = core.store.get_messages(HALF_TOPIC, HALF_QUEUE, offset, 64)
            if not got.messages:
                if got.status in SKIPPABLE and got.next_begin_offset > offset:
                    for o in range(offset, got.next_begin_offset):
                        progress.resolve(o)
                    offset = got.next_begin_offset
                    changed = True
                    continue
                break
            stop = False
            for msg in got.messages:
                scanned += 1
                o = msg.queue_offset
                offset = o + 1
                if progress.is_resolved(o, msg.uniq_key):
                    changed |= progress.resolve(o)
                    continue
                if o in self._inflight:
                    # an END_TRANSACTION (or an escape) is resolving it right now; it is
                    # resolved only once that succeeds, or a failure would lose it
                    continue
                if acting_slave:
                    if not core.acting.acting:
                        # the master is back (or another slave acts): what is left is
                        # theirs; an escape now would hand on what they resolve
                        stop = True
                        break
                    if not await self._escape(msg):
                        stop = True
                        break
                    changed = True
                    continue
                if now_ms - msg.born_ts_ms < timeout_ms:
                    stop = True  # the rest are younger still
                    break
                checks = self._checks.get(o, 0)
                if checks >= core.cfg.transaction_check_max:
                    log.warning(
                        "transaction %s (half %d) discarded after %d checks",
                        msg.uniq_key,
                        o,
                        checks,
                    )
                    await self._record(msg, o, "discard")
                    continue
                if self._send_check(msg, o):
                    self._checks[o] = checks + 1
            if stop:
                break
        changed |= progress.advance()
        if changed:
            self._changed()

    def _send_check(self, msg: StoredMessage, offset: int) -> bool:
        core = self.core
        group = msg.properties.get(PROPERTY_PRODUCER_GROUP, "")
        topic = msg.properties.get(PROPERTY_REAL_TOPIC, msg.topic)
        request = broker_pb2.CheckTransactionStateRequest(
            message=broker_pb2.Message(
                topic=topic,
                body=msg.body,
                properties=msg.properties,
                queue_id=int(msg.properties.get(PROPERTY_REAL_QID, "0") or 0),
                queue_offset=offset,
                commit_log_offset=msg.physical_offset,
                msg_id=make_msg_id(msg.store_host, msg.physical_offset),
                born_ts_ms=msg.born_ts_ms,
                born_host=msg.born_host,
                store_ts_ms=msg.store_ts_ms,
                store_host=msg.store_host,
                broker_name=core.cfg.broker_name,
                flag=msg.flags,
            ),
            transaction_id=msg.uniq_key or "",
            commit_log_offset=msg.physical_offset,
            broker_name=core.cfg.broker_name,
            broker_addr=core.addr,
        ).SerializeToString()
        for conn in self._producer_conns(group, topic):
            try:
                conn.oneway(RequestCode.CHECK_TRANSACTION_STATE, request)
            except ConnectionClosed:
                continue
            self.checked += 1
            log.debug("checking transaction %s (half %d) with %s", msg.uniq_key, offset, conn.peer)
            return True
        log.info(
            "no live producer of group %r that may publish to %r to check transaction %s",
            group,
            topic,
            msg.uniq_key,
        )
        return False

    async def _escape(self, msg: StoredMessage) -> bool:
        """Acting slave: hand an unresolved half message to a live master.  In flight
        meanwhile: an END_TRANSACTION for it arriving now must not also commit it."""
        o = msg.queue_offset
        self._inflight.add(o)
        done = self._escaping[o] = asyncio.Event()
        try:
            with self.core.special_steps.step():
                escaped = await self._escape_half(msg)
            if escaped:
                # handed on (or given up): escaped again after a power loss otherwise
                await self.write_path.progress_durable(self.file)
            return escaped
        finally:
            self._inflight.discard(o)
            del self._escaping[o]
            done.set()

    async def _escape_half(self, msg: StoredMessage) -> bool:
        core = self.core
        o = msg.queue_offset
        topic, qid, props = half_to_prepared(msg)
        try:
            local = self.escape.local_master()
            if local is not None:
                put = accept_escaped(local[0], local[1], topic, qid, msg, props)
                target = local[0].cfg.broker_name
                remote_offset = put.queue_offset
            else:
                result = await self.escape.put_message(
                    topic,
                    msg.body,
                    props,
                    kind="transaction_half",
                    flags=msg.flags,
                    born_ts_ms=msg.born_ts_ms,
                    escape_id=escape_id(core.cfg.broker_name, "transaction_half", msg),
                )
                target = result.target
                remote_offset = result.queue_offset
        except HaError as exc:
            failures = self._escape_failures.get(o, 0) + 1
            self._escape_failures[o] = failures
            if failures >= core.cfg.escape_max_attempts:
                log.error(
                    "half message %d (%s) skipped after %d failed escapes: %s",
                    o,
                    msg.uniq_key,
                    failures,
                    exc,
                )
                self._escape_failures.pop(o, None)
                self.progress.resolve(o)
                self._changed()
                return True
            log.warning("escaping half message %d failed (%d): %s", o, failures, exc)
            return False
        self._escape_failures.pop(o, None)
        self._escaped_to[o] = (target, remote_offset)
        self.progress.resolve(o)
        # marked at once, not at the end of the pass: a pass escapes for as long as it
        # finds halves, and the table written when the service stops (a role change)
        # must count every half handed on
        self._changed()
        self.escaped += 1
        log.info("half message %d (transaction %s) escaped to %s", o, msg.uniq_key, target)
        return True
