"""POP consumption: pop / ack / change-invisible-time with checkpoints and the revive service.

POP_MESSAGE (200050) takes messages from a topic's queues for a consumer group
(the pop offset is the group's consumer offset, so it is forward-synced to slaves
and reverse-synced in pre-online like any other), returns each with a receipt
handle (:class:`ReceiptHandle`, RocketMQ's ExtraInfo idea) in the ``POP_CK``
property, and writes a checkpoint (CK) record into the revive topic
``rmq_sys_REVIVE_LOG_{cluster}``.  ACK_MESSAGE (200051) writes an ACK record;
CHANGE_MESSAGE_INVISIBLETIME (200053) writes a new CK for the one message and
acks the old one.  CK and ACK keys include the broker name (reference/rip32.md
§3.3), because one revive queue holds the records of several groups.

The revive service (master, or the acting slave) reads the revive queues, matches
CKs with ACKs and, when a CK's invisible time is over with offsets still un-acked,
reads each original message (``EscapeBridge.get_message``: locally, or from the
group that holds it) and writes it to ``%RETRY%{group}`` through
``put_message_to_specific_queue``.  A failure re-puts the CK later with RocketMQ's
back-off (10 s, 20 s, 30 s, 1 min, ...), dropped after the last interval.

On an acting slave CK and ACK records cannot go to its own store: they are escaped
with ``put_message_to_specific_queue``, which sends every record of this slave for
the revive topic to the same live master and queue; that master revives them and
reads the bodies back from this group.  CKs the lost master wrote before it died
are in the slave's replicated revive queue: the acting slave revives those itself,
and an ack of such a message (``ck_local`` in its handle) has no record to go to:
it is kept in the POP ack table (:mod:`broker_agent.metadata.pop_acks`), as is every
CK revived, with how far each revive queue is finished.  The table is versioned,
persisted and synced like the other metadata tables: the returning master adopts it
in pre-online (and the slave reloads it after a restart), and its revive loop starts
again from the synced state, so an acked message is never revived.

An ack (or change of invisible time) is taken only before the handle's invisible time
is over, and marks the CK in memory before anything awaits; once the time is over it is
refused with ``ReceiptHandleExpired`` (RocketMQ's "receipt handle is expired") because
the revive loop may already be putting the message back.  So an ack answered ok is
never followed by the same message again, and a late one tells its consumer that the
message will come again.  (A handle whose CK escaped to another group is checked here
too, but that group's revive loop sees the ack only once its record arrives there.)

Orderly POP (RocketMQ's ``order=true``; a request's ``order`` or the group's
``consume_orderly``): a queue of the group is given to one batch at a time.  No CK is
written: :class:`OrderLocks` holds the batch (which offsets, until when) until every
message of it is acked — then the group's offset moves past it and the next batch can
be popped — or its invisible time is over — then the same messages are popped again
from the group's offset (reconsume times + 1), never a later one first.  The lock is in
memory, as RocketMQ's ConsumerOrderInfoManager.  An acting slave taking over has none:
it gives a queue with unconsumed messages to nobody for one invisible time first, so
a batch still in a consumer's hands is popped again only once its invisible time is
over, in order.  A restarted master starts without locks: a batch in flight before
the restart can be handed out again at once (a duplicate, in order).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Final

from broker_agent.convert import message_to_pb
from broker_agent.metadata.offsets import write_json_atomic
from broker_agent.metadata.pop_acks import PopAckSnapshot, PopAckTable
from broker_agent.metadata.subscriptions import (
    SubscriptionGroupConfig,
    SubscriptionGroupManager,
    SubscriptionGroupSync,
)
from broker_agent.metadata.versioned import VersionedTable, fetch_table
from broker_agent.special.escape_ids import escape_id
from broker_agent.special.ports import CorePort, EscapePort, WritePort
from broker_agent.store.message_store import GetMessageStatus
from ha_controller.client.routes import DEFAULT_TOPIC_QUEUE_NUMS
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    BadRequest,
    HaError,
    ReceiptHandleExpired,
    TopicNotFound,
)
from ha_controller.protocol.properties import (
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_POP_CK,
    PROPERTY_POP_KEY,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TAGS,
    RETRY_PREFIX,
    REVIVE_GROUP,
    now_ms,
    retry_topic,
    revive_log_topic,
)
from ha_controller.protocol.record import StoredMessage, make_msg_id, tag_hash
from ha_controller.routing import Perm, TopicConfig
from ha_controller.rpc import ConnectionPool, RequestContext

__all__ = [
    "REVIVE_GROUP",
    "Checkpoint",
    "OrderLocks",
    "PopAckSync",
    "PopService",
    "ReceiptHandle",
    "ReviveState",
    "retry_topic",
    "revive_topic",
]

log = logging.getLogger(__name__)

REVIVE_QUEUE_NUMS: Final = DEFAULT_TOPIC_QUEUE_NUMS
TAG_CK: Final = "ck"
TAG_ACK: Final = "ack"
MAX_POP_BATCH: Final = 32
MIN_INVISIBLE_MS: Final = 1000
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


def revive_topic(cluster: str) -> str:
    return revive_log_topic(cluster)


# --- records (plain, no I/O) ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    """Where a popped message came from and where its CK went.

    Text form: ``ck_offset pop_time_ms invisible_ms revive_qid L|R:group|O broker_name
    queue_id offset`` (RocketMQ ExtraInfoUtil order, with L/R: CK in this group's own
    revive queue, or escaped to the master of ``group``; O: an orderly pop, no CK — the
    batch starting at ``ck_offset`` popped at ``pop_time_ms``).
    """

    ck_offset: int
    pop_time_ms: int
    invisible_ms: int
    revive_qid: int
    ck_local: bool
    broker_name: str
    queue_id: int
    offset: int
    orderly: bool = False
    #: the group whose revive queue holds an escaped CK ("R:<group>"; "" in a handle
    #: from before it was named)
    ck_group: str = ""

    def encode(self) -> str:
        return " ".join(
            [
                str(self.ck_offset),
                str(self.pop_time_ms),
                str(self.invisible_ms),
                str(self.revive_qid),
                "O"
                if self.orderly
                else "L"
                if self.ck_local
                else f"R:{self.ck_group}"
                if self.ck_group
                else "R",
                self.broker_name,
                str(self.queue_id),
                str(self.offset),
            ]
        )

    @classmethod
    def decode(cls, text: str) -> ReceiptHandle:
        parts = text.split(" ")
        kind, _, ck_group = parts[4].partition(":") if len(parts) == 8 else ("", "", "")
        if len(parts) != 8 or kind not in ("L", "R", "O") or (ck_group and kind != "R"):
            raise BadRequest(f"invalid receipt handle {text!r}")
        try:
            return cls(
                ck_offset=int(parts[0]),
                pop_time_ms=int(parts[1]),
                invisible_ms=int(parts[2]),
                revive_qid=int(parts[3]),
                ck_local=kind == "L",
                broker_name=parts[5],
                queue_id=int(parts[6]),
                offset=int(parts[7]),
                orderly=kind == "O",
                ck_group=ck_group,
            )
        except ValueError as exc:
            raise BadRequest(f"invalid receipt handle {text!r}") from exc

    def ck_key(self, group: str, topic: str) -> str:
        return ck_key(
            self.broker_name, group, topic, self.queue_id, self.ck_offset, self.pop_time_ms
        )


def ck_key(broker_name: str, group: str, topic: str, queue_id: int, start: int, pop_ms: int) -> str:
    """The CK/ACK unique key; it names the broker (RIP-32: keys include the broker name)."""
    return f"{broker_name}@{group}@{topic}@{queue_id}@{start}@{pop_ms}"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One pop: which queue offsets of (topic, queue) a group took, until when."""

    broker_name: str
    group: str
    topic: str
    queue_id: int
    start_offset: int
    offsets: tuple[int, ...]
    pop_time_ms: int
    invisible_ms: int
    due_ms: int
    reput_times: int = 0

    @property
    def key(self) -> str:
        return ck_key(
            self.broker_name,
            self.group,
            self.topic,
            self.queue_id,
            self.start_offset,
            self.pop_time_ms,
        )

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "bn": self.broker_name,
                "g": self.group,
                "t": self.topic,
                "q": self.queue_id,
                "so": self.start_offset,
                "offs": list(self.offsets),
                "pt": self.pop_time_ms,
                "it": self.invisible_ms,
                "due": self.due_ms,
                "rp": self.reput_times,
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Checkpoint:
        d = json.loads(data)
        return cls(
            broker_name=str(d["bn"]),
            group=str(d["g"]),
            topic=str(d["t"]),
            queue_id=int(d["q"]),
            start_offset=int(d["so"]),
            offsets=tuple(int(o) for o in d["offs"]),
            pop_time_ms=int(d["pt"]),
            invisible_ms=int(d["it"]),
            due_ms=int(d["due"]),
            reput_times=int(d.get("rp", 0)),
        )


def ack_body(key: str, offset: int) -> bytes:
    return json.dumps({"k": key, "o": offset}).encode()


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


@dataclass
class _OrderBatch:
    offsets: tuple[int, ...]
    next_offset: int  # the group's offset once the whole batch is acked
    pop_ms: int
    until_ms: int
    attempts: int = 0  # how often these messages were popped before
    acked: set[int] = field(default_factory=set)

    @property
    def done(self) -> bool:
        return all(o in self.acked for o in self.offsets)


OrderKey = tuple[str, str, int]  # group, topic, queue id


class OrderLocks:
    """The batch each (group, topic, queue) of orderly consumers holds.  Plain object."""

    def __init__(self) -> None:
        self._batches: dict[OrderKey, _OrderBatch] = {}
        #: set when this broker starts serving: queues wait one invisible time
        self.started_ms = 0

    def __len__(self) -> int:
        return len(self._batches)

    def reset(self, now: int) -> None:
        self._batches.clear()
        self.started_ms = now

    def get(self, key: OrderKey) -> _OrderBatch | None:
        return self._batches.get(key)

    def locked(self, key: OrderKey, now: int) -> bool:
        b = self._batches.get(key)
        return b is not None and not b.done and b.until_ms > now

    def lock(self, key: OrderKey, batch: _OrderBatch) -> None:
        self._batches[key] = batch

    def release(self, key: OrderKey) -> None:
        self._batches.pop(key, None)

    def ack(self, key: OrderKey, pop_ms: int, offset: int) -> int | None:
        """One message of the batch popped at ``pop_ms`` is done; the offset to commit
        when that finished the batch (the queue is then free), else None.  An ack of an
        older pop of the queue (its batch was popped again since) changes nothing."""
        b = self._batches.get(key)
        if b is None or b.pop_ms != pop_ms or offset not in b.offsets:
            return None
        b.acked.add(offset)
        if not b.done:
            return None
        del self._batches[key]
        return b.next_offset

    def extend(self, key: OrderKey, pop_ms: int, until_ms: int) -> bool:
        """Change-invisible-time of an orderly message: the batch stays locked until then."""
        b = self._batches.get(key)
        if b is None or b.pop_ms != pop_ms:
            return False
        b.until_ms = until_ms
        return True


# --- the service ------------------------------------------------------------------


class PopService:
    """POP_MESSAGE / ACK_MESSAGE / CHANGE_MESSAGE_INVISIBLETIME and the revive loop."""

    def __init__(self, core: CorePort, write_path: WritePort, escape: EscapePort) -> None:
        self.core = core
        self.write_path = write_path
        self.escape = escape
        self.revive_topic = revive_topic(core.cfg.cluster)
        self.state = ReviveState()
        self.order = OrderLocks()
        self._order_wake = asyncio.Event()
        self.subscriptions = SubscriptionGroupManager(core.store_dir / "subscriptions.json")
        self.subscriptions.load()
        self.acks = PopAckTable(core.store_dir / "pop_acks.json")
        self.acks.load()
        self._clamp_finished()
        self.restart_state()
        self._active = False  # the service turns special services on (master online, acting)
        self._reset = True
        self._wake = asyncio.Event()
        self._locks: dict[tuple[str, str, int], asyncio.Lock] = {}
        self._rr = 0
        self._last_pop_ms = 0
        self.revived = 0
        core.dispatcher.add(RequestCode.POP_MESSAGE, broker_pb2.PopMessageRequest, self._pop)
        core.dispatcher.add(RequestCode.ACK_MESSAGE, broker_pb2.AckMessageRequest, self._ack)
        core.dispatcher.add(
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
            broker_pb2.AckMessageRequest,
            self._change_invisible,
        )
        core.dispatcher.add(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            broker_pb2.UpdateSubscriptionGroupRequest,
            self._update_group,
        )
        core.dispatcher.add(
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, common_pb2.Empty, self._get_groups
        )
        core.dispatcher.add(RequestCode.GET_POP_ACK_TABLE, common_pb2.Empty, self._get_acks)
        core.add_special_service(self.set_active)
        if core.acting.is_master and core.topics.get(self.revive_topic) is None:
            core.topics.upsert(
                TopicConfig(
                    self.revive_topic, REVIVE_QUEUE_NUMS, REVIVE_QUEUE_NUMS, Perm.READ | Perm.WRITE
                )
            )

    def _pop_time(self) -> int:
        """The pop time of a new checkpoint: now, but strictly after the last one this
        broker issued, because it is part of the checkpoint key (two checkpoints of
        one queue and start offset in the same millisecond would share a key, and an
        ack of one would mark the other done)."""
        self._last_pop_ms = max(now_ms(), self._last_pop_ms + 1)
        return self._last_pop_ms

    @property
    def active(self) -> bool:
        """The revive service runs here (master online, acting slave)."""
        return self._active

    def set_active(self, active: bool) -> None:
        """Special-service hook: the revive service runs on the master and an acting slave."""
        if active != self._active:
            log.info("pop revive service %s", "started" if active else "stopped")
            if active:
                # an acting slave does not know the orderly batches the lost master
                # handed out: its queues wait one invisible time (a master starts
                # with no lock: a batch in flight before its restart may come again)
                self.order.reset(0 if self.core.acting.is_master else now_ms())
                self._clamp_finished()
        self._active = active
        self._reset = True
        self._wake.set()

    # ---- helpers ------------------------------------------------------------

    def _ensure_retry_topic(self, group: str) -> None:
        """RocketMQ creates ``%RETRY%group`` when a consumer shows up; so do we (masters)."""
        core = self.core
        topic = retry_topic(group)
        if not core.acting.is_master or core.topics.get(topic) is not None:
            return
        core.topics.upsert(TopicConfig(topic, 1, 1, Perm.READ | Perm.WRITE))
        log.info("created retry topic %s", topic)
        core.topics_changed()

    async def _write_record(
        self,
        body: bytes,
        tag: str,
        key: str,
        kind: str,
        to_group: str = "",
        to_queue: int | None = None,
    ) -> tuple[int, bool, str]:
        """Store a CK/ACK record: our own revive queue on a master, else escaped (to
        ``to_group``'s revive queue ``to_queue`` when named: where the CK an ACK is for
        lies).  Returns (revive queue id, stored locally, the group that holds it)."""
        core = self.core
        props = {PROPERTY_TAGS: tag, PROPERTY_POP_KEY: key}
        own = core.cfg.broker_name
        if core.acting.is_master and to_group in ("", own):
            qid = 0 if to_queue is None else to_queue
            self.write_path.append_local(self.revive_topic, qid, body, props)
            return qid, True, own
        result = await self.escape.put_message_to_specific_queue(
            self.revive_topic, body, props, kind=kind, to_group=to_group, to_queue=to_queue
        )
        return result.queue_id, False, result.group or result.target

    def _to_pb(self, m: StoredMessage, handle: str) -> broker_pb2.Message:
        props = dict(m.properties)
        props[PROPERTY_POP_CK] = handle
        return message_to_pb(
            m,
            self.core.cfg.broker_name,
            properties=props,
            reconsume_times=int(props.get(PROPERTY_RECONSUME_TIME, "0") or 0),
        )

    # ---- handlers ------------------------------------------------------------------

    async def _pop(
        self, ctx: RequestContext, req: broker_pb2.PopMessageRequest
    ) -> broker_pb2.PopMessageResponse:
        self.core.check_master_only("POP_MESSAGE")
        core = self.core
        if not req.consumer_group or not req.topic:
            raise BadRequest("POP_MESSAGE needs a consumer group and a topic")
        self._ensure_retry_topic(req.consumer_group)
        config = core.topics.get(req.topic)
        # an acting slave may not have synced a config the lost master created
        # just before it died: its replicated queues are enough to serve pops
        stored = [] if config is not None else core.store.topics_and_queues().get(req.topic, [])
        if config is None and not stored:
            raise TopicNotFound(f"topic {req.topic!r} does not exist on {core.cfg.broker_name}")
        all_qids = list(range(config.read_queue_nums)) if config is not None else stored
        if req.queue_id >= 0:
            qids = [req.queue_id]
        else:
            self._rr += 1
            qids = [all_qids[(self._rr + i) % len(all_qids)] for i in range(len(all_qids))]
        tags = {tag_hash(t) for t in req.tags if t and t != "*"} or None
        max_msgs = max(1, min(req.max_msg_nums or MAX_POP_BATCH, MAX_POP_BATCH))
        invisible = max(MIN_INVISIBLE_MS, req.invisible_time_ms)
        orderly = req.order or self.subscriptions.orderly(req.consumer_group)
        pop_queue = self._pop_queue_orderly if orderly else self._pop_queue
        resp = broker_pb2.PopMessageResponse(invisible_time_ms=invisible)
        deadline = time.monotonic() + max(0, req.poll_time_ms) / 1000
        while True:
            pop_ms = self._pop_time()
            resp.pop_time_ms = pop_ms
            for qid in qids:
                if len(resp.messages) >= max_msgs:
                    break
                resp.messages.extend(
                    await pop_queue(
                        req.consumer_group,
                        req.topic,
                        qid,
                        max_msgs - len(resp.messages),
                        tags,
                        pop_ms,
                        invisible,
                    )
                )
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if resp.messages or remaining_ms <= 0 or not core.acting.serves_master_only_ops:
                return resp
            await self._hold(
                req.consumer_group, req.topic, qids, remaining_ms, tags, orderly=orderly
            )

    async def _hold(
        self,
        group: str,
        topic: str,
        qids: list[int],
        timeout_ms: int,
        tags: set[int] | None,
        *,
        orderly: bool = False,
    ) -> None:
        """Wait (long polling) until one of the queues gets a message, or the timeout;
        orderly: also until an orderly batch is done, or a second (a lock may expire)."""
        core = self.core
        waits: list[asyncio.Future[object]] = []
        if orderly:
            timeout_ms = min(timeout_ms, 1000)
            waits.append(asyncio.ensure_future(self._order_wake.wait()))
        for qid in qids:
            offset = core.offsets.query(group, topic, qid)
            if offset < 0:
                offset = core.store.min_offset(topic, qid)
            waits.append(
                asyncio.ensure_future(core.holds.hold(topic, qid, offset, timeout_ms, tags))
            )
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def _pop_queue(
        self,
        group: str,
        topic: str,
        qid: int,
        max_msgs: int,
        tags: set[int] | None,
        pop_ms: int,
        invisible_ms: int,
    ) -> list[broker_pb2.Message]:
        core = self.core
        lock = self._locks.setdefault((group, topic, qid), asyncio.Lock())
        async with lock:
            # served still (a pop waiting for the lock may find its acting slave held
            # for the returning master): nothing awaits from here to the step below
            core.check_master_only("POP_MESSAGE")
            start = core.offsets.query(group, topic, qid)
            if start < 0:
                start = core.store.min_offset(topic, qid)
            got = core.store.get_messages(topic, qid, start, max_msgs, tag_filter=tags)
            if got.status is GetMessageStatus.OFFSET_TOO_SMALL:
                start = got.next_begin_offset
                got = core.store.get_messages(topic, qid, start, max_msgs, tag_filter=tags)
            if not got.messages:
                if got.next_begin_offset > start and got.status in (
                    GetMessageStatus.NO_MATCHED_MESSAGE,
                    GetMessageStatus.OFFSET_FOUND_NULL,
                ):
                    self.write_path.commit_offset(group, topic, qid, got.next_begin_offset)
                return []
            ck = Checkpoint(
                broker_name=core.cfg.broker_name,
                group=group,
                topic=topic,
                queue_id=qid,
                start_offset=start,
                offsets=tuple(m.queue_offset for m in got.messages),
                pop_time_ms=pop_ms,
                invisible_ms=invisible_ms,
                due_ms=pop_ms + invisible_ms,
            )
            # the CK and the offset it moves are one step: an acting slave answers its
            # returning master only once no step is under way, so the offsets the
            # master takes count this pop (else it pops the messages again: two CKs,
            # two revives, long campaign seed 1032)
            with core.special_steps.step():
                revive_qid, local, holder = await self._write_record(
                    ck.to_json(), TAG_CK, ck.key, "pop_ck"
                )
                self.write_path.commit_offset(group, topic, qid, got.next_begin_offset)
        out = []
        for m in got.messages:
            handle = ReceiptHandle(
                start,
                pop_ms,
                invisible_ms,
                revive_qid,
                local,
                core.cfg.broker_name,
                qid,
                m.queue_offset,
                ck_group="" if local else holder,
            )
            out.append(self._to_pb(m, handle.encode()))
        core.metrics.messages_out.labels(**core.metrics.ident, topic=topic, group=group).inc(
            len(out)
        )
        return out

    async def _pop_queue_orderly(
        self,
        group: str,
        topic: str,
        qid: int,
        max_msgs: int,
        tags: set[int] | None,
        pop_ms: int,
        invisible_ms: int,
    ) -> list[broker_pb2.Message]:
        """One batch of one queue for an orderly group, unless a batch holds the queue."""
        core = self.core
        key = (group, topic, qid)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            now = now_ms()
            if self.order.locked(key, now):
                return []
            start = core.offsets.query(group, topic, qid)
            if start < 0:
                start = core.store.min_offset(topic, qid)
            previous = self.order.get(key)
            if (
                previous is None
                and now < self.order.started_ms + invisible_ms
                and start < core.store.max_offset(topic, qid)
            ):
                return []  # just started serving: a batch may be in flight elsewhere
            got = core.store.get_messages(topic, qid, start, max_msgs, tag_filter=tags)
            if got.status is GetMessageStatus.OFFSET_TOO_SMALL:
                start = got.next_begin_offset
                got = core.store.get_messages(topic, qid, start, max_msgs, tag_filter=tags)
            if not got.messages:
                self.order.release(key)
                if got.next_begin_offset > start and got.status in (
                    GetMessageStatus.NO_MATCHED_MESSAGE,
                    GetMessageStatus.OFFSET_FOUND_NULL,
                ):
                    self.write_path.commit_offset(group, topic, qid, got.next_begin_offset)
                return []
            # an expired batch comes again from the group's offset; what of it was
            # acked already is not handed out twice
            acked = previous.acked if previous is not None else set()
            attempts = previous.attempts + 1 if previous is not None else 0
            batch = _OrderBatch(
                offsets=tuple(m.queue_offset for m in got.messages),
                next_offset=got.next_begin_offset,
                pop_ms=pop_ms,
                until_ms=pop_ms + invisible_ms,
                attempts=attempts,
                acked={o for o in acked if any(m.queue_offset == o for m in got.messages)},
            )
            if batch.done:  # everything acked: the group's offset moves on
                self.write_path.commit_offset(group, topic, qid, batch.next_offset)
                self.order.release(key)
                return []
            self.order.lock(key, batch)
        out = []
        for m in got.messages:
            if m.queue_offset in batch.acked:
                continue
            handle = ReceiptHandle(
                start,
                pop_ms,
                invisible_ms,
                -1,
                False,
                core.cfg.broker_name,
                qid,
                m.queue_offset,
                orderly=True,
            )
            pb = self._to_pb(m, handle.encode())
            pb.reconsume_times += attempts
            out.append(pb)
        core.metrics.messages_out.labels(**core.metrics.ident, topic=topic, group=group).inc(
            len(out)
        )
        return out

    def _order_done(self, group: str, topic: str, handle: ReceiptHandle) -> None:
        key = (group, topic, handle.queue_id)
        next_offset = self.order.ack(key, handle.pop_time_ms, handle.offset)
        if next_offset is None:
            return
        self.write_path.commit_offset(group, topic, handle.queue_id, next_offset)
        wake, self._order_wake = self._order_wake, asyncio.Event()
        wake.set()

    # ---- subscription groups ------------------------------------------------------

    async def _update_group(
        self, ctx: RequestContext, req: broker_pb2.UpdateSubscriptionGroupRequest
    ) -> common_pb2.Empty:
        self.core.check_master_only("UPDATE_AND_CREATE_SUBSCRIPTIONGROUP")
        config = SubscriptionGroupConfig.from_pb(req.config)
        self.subscriptions.upsert(config)
        return common_pb2.Empty()

    async def _get_groups(
        self, ctx: RequestContext, req: common_pb2.Empty
    ) -> broker_pb2.SubscriptionGroupTable:
        return self.subscriptions.table_pb()

    async def _get_acks(self, ctx: RequestContext, req: common_pb2.Empty) -> broker_pb2.PopAckTable:
        return self.acks.to_pb()

    def tables(self) -> list[VersionedTable]:
        """The subscription groups and the POP ack table, for forward and reverse sync."""
        return [SubscriptionGroupSync(self.subscriptions), PopAckSync(self)]

    def acks_adopted(self) -> None:
        """A reverse sync merged a slave's acks: revive from the synced state."""
        self.acks.persist()
        self._reset = True
        self._wake.set()

    def _handle_of(self, req: broker_pb2.AckMessageRequest) -> ReceiptHandle:
        if not req.consumer_group or not req.topic:
            raise BadRequest("an ack needs a consumer group and a topic")
        handle = ReceiptHandle.decode(req.receipt_handle)
        own = self.core.cfg.broker_name
        if handle.broker_name != own:
            raise BadRequest(f"receipt handle of {handle.broker_name} sent to {own}")
        return handle

    @staticmethod
    def _check_not_expired(handle: ReceiptHandle, what: str) -> None:
        """Refuse an ack or change of invisible time once the handle's invisible time
        is over: the revive loop may already be putting the message back (an ack
        answered ok must never be followed by the same message again)."""
        due = handle.pop_time_ms + handle.invisible_ms
        late = now_ms() - due
        if late >= 0:
            raise ReceiptHandleExpired(
                f"{what} of a receipt handle whose invisible time ended {late} ms ago: "
                "the message comes again"
            )

    async def _write_ack(self, handle: ReceiptHandle, key: str) -> None:
        core = self.core
        # a master appends the ACK record before anything awaits, so a revive pass
        # that starts from now on reads it; a pass already running revives only CKs
        # that were due when it started, and their handles are refused as expired
        if handle.ck_local and not core.acting.is_master:
            # the CK sits in our replicated revive queue: our revive loop owns it, and
            # the ack table carries the ack to the returning master
            self.state.ack(key, handle.offset)
            p = self.state.pending.get(key)
            where = None if p is None else (p.revive_qid, p.revive_offset)
            self.acks.record(key, {handle.offset}, where)
            return
        # an escaped CK's ACK goes to the group that holds the CK, whoever serves the
        # ack (the returning master too: long campaign seed 1003 on 8fbf299)
        named = bool(handle.ck_group)
        await self._write_record(
            ack_body(key, handle.offset),
            TAG_ACK,
            key,
            "pop_ack",
            to_group=handle.ck_group,
            to_queue=handle.revive_qid if named else None,
        )

    async def _ack(
        self, ctx: RequestContext, req: broker_pb2.AckMessageRequest
    ) -> broker_pb2.AckMessageResponse:
        self.core.check_master_only("ACK_MESSAGE")
        handle = self._handle_of(req)
        if handle.orderly:
            self._order_done(req.consumer_group, req.topic, handle)
            return broker_pb2.AckMessageResponse()
        self._check_not_expired(handle, "ack")
        await self._write_ack(handle, handle.ck_key(req.consumer_group, req.topic))
        return broker_pb2.AckMessageResponse()

    async def _change_invisible(
        self, ctx: RequestContext, req: broker_pb2.AckMessageRequest
    ) -> broker_pb2.AckMessageResponse:
        """A new CK for the one message from now, then an ACK of the old one."""
        self.core.check_master_only("CHANGE_MESSAGE_INVISIBLETIME")
        handle = self._handle_of(req)
        invisible = max(MIN_INVISIBLE_MS, req.invisible_time_ms)
        if handle.orderly:
            # the batch keeps its queue until then; the handle stays valid for the ack
            key = (req.consumer_group, req.topic, handle.queue_id)
            self.order.extend(key, handle.pop_time_ms, now_ms() + invisible)
            return broker_pb2.AckMessageResponse(receipt_handle=handle.encode())
        self._check_not_expired(handle, "change of invisible time")
        pop_ms = self._pop_time()
        ck = Checkpoint(
            broker_name=handle.broker_name,
            group=req.consumer_group,
            topic=req.topic,
            queue_id=handle.queue_id,
            start_offset=handle.offset,
            offsets=(handle.offset,),
            pop_time_ms=pop_ms,
            invisible_ms=invisible,
            due_ms=pop_ms + invisible,
        )
        with self.core.special_steps.step():  # the new CK and the old one's ack, uncut
            revive_qid, local, holder = await self._write_record(
                ck.to_json(), TAG_CK, ck.key, "pop_ck"
            )
            await self._write_ack(handle, handle.ck_key(req.consumer_group, req.topic))
        new = ReceiptHandle(
            handle.offset,
            pop_ms,
            invisible,
            revive_qid,
            local,
            handle.broker_name,
            handle.queue_id,
            handle.offset,
            ck_group="" if local else holder,
        )
        return broker_pb2.AckMessageResponse(receipt_handle=new.encode())

    # ---- revive ----------------------------------------------------------------------

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
                payload = self.acks.file_payload()
                if payload is not None and self.acks.path is not None:
                    await asyncio.to_thread(write_json_atomic, self.acks.path, payload)
        finally:
            with contextlib.suppress(OSError):
                self.acks.persist()

    def _clamp_finished(self) -> None:
        """Before anything is written (starting, or becoming active after pre-online
        and its cut): the ack table's revive offsets stop at each queue's end, or the
        records written from there on would never be read."""
        store = self.core.store
        for rq in {*self._revive_queues(), *self.acks.revive_offsets}:
            self.acks.clamp(rq, max(0, store.max_offset(self.revive_topic, rq)))

    def restart_state(self) -> None:
        """Forget what was read from the revive queues; the ack table's acks apply to
        the CKs read again (as on a restart)."""
        self.state.reset()
        for key, entry in self.acks.entries.items():
            for offset in entry.offsets:
                self.state.ack(key, offset)

    def _revive_queues(self) -> list[int]:
        return self.core.store.topics_and_queues().get(self.revive_topic, [])

    def _read_records(self, rq: int) -> None:
        core = self.core
        state = self.state
        offset = state.read_offsets.get(rq)
        if offset is None:
            offset = core.offsets.query(REVIVE_GROUP, self.revive_topic, rq)
            if offset < 0:
                offset = core.store.min_offset(self.revive_topic, rq)
            # CKs below the ack table's offset are finished, their entries dropped
            offset = max(offset, self.acks.start_offset(rq))
        while True:
            got = core.store.get_messages(self.revive_topic, rq, offset, 256)
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
                        d = json.loads(rec.body)
                        state.ack(str(d["k"]), int(d["o"]))
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("bad revive record %d/%d: %s", rq, rec.queue_offset, exc)
            offset = got.next_begin_offset
        state.read_offsets[rq] = offset

    async def revive_once(self) -> None:
        core = self.core
        queues = self._revive_queues()
        for rq in queues:
            self._read_records(rq)
        for p in self.state.due(now_ms()):
            with core.special_steps.step():  # the revive and its record, uncut
                if await self._revive(p):
                    self.state.pending.pop(p.ck.key, None)
                    # revived offsets are done: whoever reads this CK again skips them
                    # (a re-put CK keeps the key, its failed offsets stay to do)
                    done = {o for o in p.ck.offsets if o in p.acked}
                    self.acks.record(p.ck.key, done, (p.revive_qid, p.revive_offset))
        for rq in queues:
            offset = self.state.commit_offset(rq)
            if offset != core.offsets.query(REVIVE_GROUP, self.revive_topic, rq):
                self.write_path.commit_offset(REVIVE_GROUP, self.revive_topic, rq, offset)
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
                    self._retry_properties(msg, ck),
                    kind="pop_retry",
                    flags=msg.flags,
                    escape_id=escape_id(self.core.cfg.broker_name, "pop_retry", msg, ck.key),
                    then=(
                        self.revive_topic,
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
            due_ms=now_ms() + CK_REWRITE_INTERVALS_S[ck.reput_times] * 1000,
            reput_times=ck.reput_times + 1,
        )
        try:
            await self._write_record(again.to_json(), TAG_CK, again.key, "pop_ck")
        except HaError as exc:
            log.warning("re-put of CK %s failed: %s", ck.key, exc)
            return False
        return True

    @staticmethod
    def _retry_properties(msg: StoredMessage, ck: Checkpoint) -> dict[str, str]:
        props = dict(msg.properties)
        props.pop(PROPERTY_POP_CK, None)
        if not ck.topic.startswith(RETRY_PREFIX):
            props[PROPERTY_RETRY_TOPIC] = ck.topic
        props[PROPERTY_RECONSUME_TIME] = str(int(props.get(PROPERTY_RECONSUME_TIME, "0") or 0) + 1)
        props.setdefault(
            PROPERTY_ORIGIN_MESSAGE_ID, make_msg_id(msg.store_host, msg.physical_offset)
        )
        return props


class PopAckSync:
    """The POP ack table as a versioned table (GET_POP_ACK_TABLE).  Forward: a slave
    takes the master's table; reverse: a returning master merges the slave's acks (an
    ack is never undone) and revives from the synced state."""

    name = "pop acks"

    def __init__(self, service: PopService) -> None:
        self.service = service

    async def fetch(self, pool: ConnectionPool, addr: str) -> PopAckSnapshot:
        pb = await fetch_table(pool, addr, RequestCode.GET_POP_ACK_TABLE, broker_pb2.PopAckTable)
        return PopAckSnapshot.from_pb(pb)

    def assign(self, snapshot: PopAckSnapshot) -> None:
        if self.service.acks.assign(snapshot):
            self.service.acks.persist()

    def replace(self, snapshot: PopAckSnapshot) -> None:
        self.assign(snapshot)  # the ack table as the slave has it

    def adopt_if_newer(self, snapshot: PopAckSnapshot) -> bool:
        """Merged whatever the version; True (for the log) when the slave's table was
        at least as new as ours or added anything."""
        newer = snapshot.version.compare(self.service.acks.data_version) >= 0
        changed = self.service.acks.merge(snapshot)
        if changed:
            self.service.acks_adopted()
        return newer or changed

    def describe(self, snapshot: PopAckSnapshot) -> str:
        acked = sum(len(e.offsets) for e in snapshot.entries.values())
        return (
            f"{acked} offsets of {len(snapshot.entries)} checkpoints, "
            f"revive offsets {snapshot.revive_offsets}"
        )

    def busy(self) -> bool:
        # reviving (master, acting slave): the table is this broker's own
        return self.service.active
