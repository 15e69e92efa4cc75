"""The only writer of a broker's commit log.

Every append goes through :class:`WritePath`: client sends, committed transactions,
op/half records, POP checkpoints and acks, locally escaped special messages and the
system records that carry consumer and delay offsets to the slaves.  One append is
always the same three steps: store the record, wake the pulls held on its queue,
tell the HA side there is more to stream; a write that must be durable then waits
for the copies the replication mode asks for.

A store that cannot take an append (full disk, read-only) stores nothing of it; the
write path answers the retriable ``NotWritable`` so that the caller goes elsewhere, and
lets the broker withdraw its routes' WRITE bit at once (``BrokerCore.note_store_state``).

It sees its broker through one narrow port (:class:`WriteCore`: the store's appends,
the replicas' confirmations, the topic and offset tables, the acting state), which
``BrokerCore`` fits and so does the unit tests' in-memory broker (``tests/fakes.py``):
they run this write path, not a copy of it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from broker_agent.membership.acting import ActingState
from broker_agent.metadata.json_table import JsonTable
from broker_agent.metadata.offsets import ConsumerOffsetManager
from broker_agent.metadata.topics import TopicConfigManager
from broker_agent.metrics import BrokerMetrics
from broker_agent.pull_hold import PullHoldService
from broker_agent.store.message_store import PutRequest, PutResult
from ha_controller.config import BrokerConfig
from ha_controller.protocol.errors import (
    BadRequest,
    InSyncReplicasNotEnough,
    MessageTooLarge,
    NotMaster,
    NotWritable,
    RecordUnderRepair,
    SlaveAckTimeout,
    StoreFull,
    StoreReadOnly,
    TopicNotFound,
)
from ha_controller.protocol.properties import OFFSET_TOPIC, PROPERTY_TAGS
from ha_controller.protocol.record import (
    StoredMessage,
    encoded_size,
    encoded_size_bound,
    tag_hash,
)
from ha_controller.protocol.validation import check_body
from ha_controller.routing import Perm, TopicConfig

#: what a client's message must leave of the largest record for the properties the
#: brokers add when they hand it on: a delayed or half message delivered or escaped to
#: another group (ESCAPE_ID, the escaping broker as born host), a POP retry (its retry
#: topic and origin).  Without it a message stored at the limit could never be handed
#: on, and the delay level, or the queue, behind it would wait for ever.
CLIENT_HEADROOM_BYTES = 2048

log = logging.getLogger(__name__)

#: One more record for :meth:`WritePath.put` to append: (topic, queue id, body, properties).
Record = tuple[str, int, bytes, Mapping[str, str]]


def copies_needed(cfg: BrokerConfig) -> int:
    """Copies (the master's included) a write needs before it is acknowledged."""
    if cfg.replication_mode != "sync":
        return 1
    return min(cfg.in_sync_replicas, cfg.total_replicas)


class AppendStore(Protocol):
    """The appends of the store (MessageStore)."""

    def put_batch(self, requests: Sequence[PutRequest]) -> list[PutResult]: ...

    @property
    def cuts(self) -> int: ...

    def cut_below(self, since: int, end: int) -> bool: ...


class Replicas(Protocol):
    """A master's end of the replication (HaMaster)."""

    def slave_count(self) -> int: ...

    def data_appended(self) -> None: ...

    async def wait_for_copies(self, offset: int, copies: int, timeout_s: float) -> bool: ...


class WriteCore(Protocol):
    """What the write path reads and tells of its broker (BrokerCore)."""

    @property
    def cfg(self) -> BrokerConfig: ...

    @property
    def name(self) -> str: ...

    @property
    def addr(self) -> str: ...

    @property
    def store(self) -> AppendStore: ...

    @property
    def ha_master(self) -> Replicas | None: ...

    @property
    def topics(self) -> TopicConfigManager: ...

    @property
    def offsets(self) -> ConsumerOffsetManager: ...

    @property
    def acting(self) -> ActingState: ...

    @property
    def holds(self) -> PullHoldService: ...

    @property
    def metrics(self) -> BrokerMetrics: ...

    @property
    def sync(self) -> object | None:
        """Controller mode: the master's sync-state set (None without a controller)."""
        ...

    def topics_changed(self) -> None: ...

    def copies_needed(self) -> int: ...

    def sync_set_shortfall(self) -> str | None: ...

    def note_store_state(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Stored:
    """One appended record and whether its copies were confirmed in time."""

    result: PutResult
    queue_id: int
    confirmed: bool

    @property
    def end(self) -> int:
        return self.result.physical_offset + self.result.size


class WritePath:
    """Topic for write, queue choice, append, append-and-replicate."""

    def __init__(self, core: WriteCore) -> None:
        self.core = core
        self._queue_rr = itertools.count()

    # ---- where ---------------------------------------------------------------

    def topic_for_write(self, topic: str) -> TopicConfig:
        """The topic's config, auto-created when allowed; refuses a read-only topic."""
        core = self.core
        config = core.topics.get(topic)
        if config is None:
            if not core.cfg.auto_create_topic:
                raise TopicNotFound(f"topic {topic!r} does not exist on {core.cfg.broker_name}")
            config = core.topics.auto_create(topic)
            log.info("auto-created topic %s with %d queues", topic, config.write_queue_nums)
            core.topics_changed()
        if not Perm.is_writeable(config.perm):
            raise BadRequest(f"topic {topic!r} is not writeable on {core.cfg.broker_name}")
        return config

    def topic_for_delivery(self, topic: str) -> TopicConfig:
        """The topic a special service hands a message on to (a due delayed message, a
        committed transaction, a POP retry, an escape of one): as :meth:`topic_for_write`,
        but a topic made read-only since, or deleted while topics are not auto-created,
        still takes it.  The message was taken in while its topic took writes, and one
        that no longer does must not hold up the messages queued behind it (RocketMQ's
        schedule service writes due messages whatever their topic's permission)."""
        core = self.core
        config = core.topics.get(topic)
        if config is not None:
            return config
        if core.cfg.auto_create_topic:
            return self.topic_for_write(topic)
        log.warning(
            "topic %s does not exist on %s: a message handed on to it is stored in its queue",
            topic,
            core.cfg.broker_name,
        )
        return TopicConfig(topic, 1, 1, Perm.READ | Perm.WRITE)

    def pick_queue(self, config: TopicConfig, queue_id: int | None, *, strict: bool) -> int:
        """``queue_id`` when it exists; else round robin.  ``strict`` refuses a bad id."""
        if queue_id is not None and queue_id >= 0:
            if queue_id < config.write_queue_nums:
                return queue_id
            if strict:
                raise BadRequest(f"queue {queue_id} out of range for {config.topic_name}")
        return next(self._queue_rr) % config.write_queue_nums

    def check_replicas(self) -> int:
        """The copies a write needs; refuses when fewer replicas are alive."""
        needed = self.core.copies_needed()
        ha = self.core.ha_master
        live = 1 + (ha.slave_count() if ha is not None else 0)
        if needed > 1 and live < needed:
            raise InSyncReplicasNotEnough(f"{live} live copies, {needed} required")
        short = self.core.sync_set_shortfall()
        if short is not None:
            raise InSyncReplicasNotEnough(short)
        return needed

    # ---- append ----------------------------------------------------------------

    def message(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: Mapping[str, str],
        *,
        flags: int = 0,
        born_ts_ms: int | None = None,
        born_host: str | None = None,
    ) -> PutRequest:
        """One record for :meth:`append_batch`, stamped with this broker as its store
        host (and born host, unless the sender's is given)."""
        addr = self.core.addr
        return PutRequest(
            topic, queue_id, body, properties, flags, born_ts_ms, born_host or addr, addr
        )

    def check_client_size(self, requests: Sequence[PutRequest]) -> None:
        """MessageTooLarge for a client's message whose body is over ``max_message_bytes``
        (RocketMQ's maxMessageSize bounds the body), or whose record leaves less than
        :data:`CLIENT_HEADROOM_BYTES` of the largest record (nothing stored)."""
        cfg = self.core.cfg
        limit = cfg.max_record_bytes - CLIENT_HEADROOM_BYTES
        for r in requests:
            check_body(r.body, cfg.max_message_bytes)
            props = r.properties or {}
            if encoded_size_bound(r.topic, r.body, props, r.born_host, r.store_host) <= limit:
                continue  # the common case: no encoding needed to tell
            size = encoded_size(
                StoredMessage(
                    r.topic,
                    r.queue_id,
                    r.body,
                    dict(props),
                    born_host=r.born_host,
                    store_host=r.store_host,
                )
            )
            if size > limit:
                raise MessageTooLarge(
                    f"message of {size} bytes exceeds {limit} (the largest record, "
                    f"max_message_bytes {cfg.max_message_bytes} and its properties, less "
                    f"{CLIENT_HEADROOM_BYTES} kept for the properties a broker adds when it "
                    "hands a message on)"
                )

    def append(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: Mapping[str, str],
        *,
        flags: int = 0,
        born_ts_ms: int | None = None,
        born_host: str | None = None,
    ) -> PutResult:
        """Store one record and wake the pulls held on its queue (no replication push:
        call :meth:`replicate` once after a batch).  NotWritable (nothing stored) when
        the store refuses appends."""
        message = self.message(
            topic,
            queue_id,
            body,
            properties,
            flags=flags,
            born_ts_ms=born_ts_ms,
            born_host=born_host,
        )
        return self.append_batch((message,))[0]

    def append_batch(self, messages: Sequence[PutRequest]) -> list[PutResult]:
        """Store several records as one unit (one write, one fsync in sync flush mode;
        see ``MessageStore.put_batch``) and wake the pulls held on their queues.
        All or nothing: NotWritable (nothing stored) when the store refuses appends or
        the batch does not fit."""
        core = self.core
        try:
            results = core.store.put_batch(messages)
        except (StoreFull, StoreReadOnly, RecordUnderRepair) as exc:
            # RecordUnderRepair: the active segment shrank under us; appends wait for
            # its repair from a replica (store.repair)
            core.note_store_state()
            core.metrics.send_errors.labels(**core.metrics.ident, reason="not_writable").inc()
            topics = ", ".join(sorted({m.topic for m in messages}))
            raise NotWritable(f"{core.name} cannot store {topics}: {exc}") from exc
        core.note_store_state()
        notify = core.holds.notify
        for message, result in zip(messages, results, strict=True):
            props = message.properties
            notify(
                message.topic,
                message.queue_id,
                result.queue_offset + 1,
                tag_hash(props.get(PROPERTY_TAGS) if props else None),
            )
        return results

    def replicate(self) -> None:
        """Tell the HA side that the log grew (streams to the slaves)."""
        if self.core.ha_master is not None:
            self.core.ha_master.data_appended()

    async def confirm(self, end: int, needed: int | None = None) -> bool:
        """Wait until ``needed`` copies hold the log up to ``end`` (True at once when
        one copy is enough); False when the slaves did not confirm in time."""
        core = self.core
        if needed is None:
            needed = core.copies_needed()
        if needed <= 1 or core.ha_master is None:
            return True
        cuts = core.store.cuts
        confirmed = await core.ha_master.wait_for_copies(
            end, needed, core.cfg.slave_ack_timeout_ms / 1000
        )
        # A master cut off while it waited may have been fenced, cut its log back on
        # its return and written again: the slaves then confirm other bytes at these
        # offsets (seed 5002: a pull answered with a record the cut had removed; a send
        # would have been acknowledged though it was gone)
        return confirmed and not core.store.cut_below(cuts, end)

    async def confirm_answer(self, end: int, what: str) -> None:
        """Controller mode: before a write the client trusts is answered (a POP ack),
        every member of the sync-state set holds the log up to ``end``, else
        ``SlaveAckTimeout`` (the client repeats it; a repeat is harmless).  A master cut
        off keeps its lease for a moment and the clients may still reach it: what it
        takes then reaches no member, its log is cut back when it rejoins, and an ack
        answered ok was lost with it (``controller-isolate``, seed 3308: messages acked
        on the cut-off master came again from the one elected).  Without a controller
        nothing waits here."""
        core = self.core
        if core.sync is None:
            return
        if not await self.confirm(end):
            raise SlaveAckTimeout(
                f"{what} stored on {core.name} but not confirmed by its sync-state set "
                f"within {core.cfg.slave_ack_timeout_ms} ms"
            )

    def append_local(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: Mapping[str, str],
        *,
        flags: int = 0,
        born_ts_ms: int | None = None,
    ) -> PutResult:
        """A master's own record (op, CK/ACK, committed transaction, offset record):
        append and push to the slaves, no copy wait."""
        if not self.core.acting.is_master:
            raise NotMaster(f"{self.core.name} cannot write its own store ({topic})")
        result = self.append(topic, queue_id, body, properties, flags=flags, born_ts_ms=born_ts_ms)
        self.replicate()
        return result

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> int | None:
        """Commit a consumer offset and, on the master, replicate it (see below)."""
        self.core.offsets.commit(group, topic, queue_id, offset)
        return self.replicate_offset(group, topic, queue_id, offset)

    async def commit_offset_durably(
        self, group: str, topic: str, queue_id: int, offset: int
    ) -> int | None:
        """:meth:`commit_offset` of a commit about to be acknowledged: with ``flush_mode =
        "sync"`` the table is on disk before this returns (group commit: commits that
        arrive meanwhile share one write), so the commit survives a power loss of every
        node; with async it is written with the next flush."""
        end = self.commit_offset(group, topic, queue_id, offset)
        await self.durable(self.core.offsets)
        return end

    async def durable(self, table: JsonTable) -> None:
        """With ``flush_mode = "sync"``, return once every change made to ``table`` so
        far is on disk (:meth:`JsonTable.persist_durably`: the callers that arrive while
        a write is on its way share the next one): for a change about to be answered
        (a commit, a POP, an ack) or whose delivery is about to count as done (a delay
        level's or the timer's progress, a transaction's), so that a power loss of every
        node keeps it.  With async the table is written every interval.  OSError when
        the write fails (the table stays changed; the next write tries again)."""
        if self.core.cfg.flush_mode == "sync":
            await table.persist_durably()

    async def progress_durable(self, table: JsonTable) -> None:
        """:meth:`durable` for a special service's progress (a delivery, an escape, a
        resolution): it counts as done once on disk, so a power loss of the whole group
        right after it repeats it only within that one write.  A failed write is logged;
        the service's periodic write tries again."""
        try:
            await self.durable(table)
        except OSError as exc:
            log.warning("cannot persist the %s: %s; retrying", table.what, exc)

    def replicate_offset(self, group: str, topic: str, queue_id: int, offset: int) -> int | None:
        """On the master, append an offset record (consumer or delay offset) so that it
        reaches the slaves with the durability of messages (they apply it as it arrives:
        an acting slave knows every committed offset, not the last periodic sync).
        Returns the commit-log end offset of the record, None when not the master."""
        return self.replicate_record({"G": group, "T": topic, "Q": str(queue_id), "O": str(offset)})

    def replicate_record(self, properties: Mapping[str, str]) -> int | None:
        """On the master, append a progress record (``G`` names what it carries) to the
        system offsets topic; the slaves apply it as it arrives (metadata.forward)."""
        if not self.core.acting.is_master or self.core.ha_master is None:
            return None
        try:
            result = self.append_local(OFFSET_TOPIC, 0, b"", properties)
        except NotWritable as exc:
            # a full store still serves reads and commits: the slaves get the table
            # from the periodic metadata sync instead
            log.debug("progress record not replicated: %s", exc)
            return None
        return result.physical_offset + result.size

    async def put(
        self,
        topic: str,
        body: bytes,
        properties: Mapping[str, str],
        *,
        queue_id: int | None = None,
        flags: int = 0,
        born_ts_ms: int | None = None,
        born_host: str | None = None,
        progress: Mapping[str, str] | None = None,
        then: Record | None = None,
    ) -> Stored:
        """A special service's whole write, like a send's: topic for delivery
        (:meth:`topic_for_delivery`), queue (``queue_id`` when it exists, else round
        robin), replica check, append, replicate, wait for copies.
        ``confirmed`` is False when stored but not confirmed in time (a retry would
        store it twice; replication catches up).

        ``progress`` is a progress record (see :meth:`replicate_record`) appended right
        behind the message, before either is pushed: a special service's delivery and
        its progress reach the slaves in the same transfer, so a slave that takes over
        never holds the delivered message without knowing it was delivered.  ``then``
        is such a record in another queue (a POP revive's ACK in the revive queue)."""
        config = self.topic_for_delivery(topic)
        qid = self.pick_queue(config, queue_id, strict=False)
        needed = self.check_replicas()
        result = self.append(
            topic, qid, body, properties, flags=flags, born_ts_ms=born_ts_ms, born_host=born_host
        )
        end = result.physical_offset + result.size
        if then is not None:
            record = self.append(*then)
            end = record.physical_offset + record.size
        if progress is not None:
            record = self.append(OFFSET_TOPIC, 0, b"", progress)
            end = record.physical_offset + record.size
        self.replicate()
        confirmed = await self.confirm(end, needed)
        return Stored(result, qid, confirmed)
