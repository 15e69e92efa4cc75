"""Small fakes of the ports the special services see (``broker_agent.special.ports``).

The special services (escape, schedule, transaction, POP) take ``(core, write_path,
escape)``.  Their unit tests build those from:

- :class:`FakeStore`: an in-memory message store keyed by (topic, queue) with queue
  offsets and physical (commit-log) offsets, answering with the real
  ``StoredMessage`` / ``PutResult`` / ``GetResult`` shapes;
- :class:`FakeCore`: a ``CorePort`` around real plain objects (config, topic table,
  consumer offsets, acting state, metrics, pull holds, connection pool, dispatcher)
  and a FakeStore; ``store_dir`` only holds the services' JSON progress files;
- :class:`FakeWritePath`: a ``WritePort`` that appends into the core's FakeStore with
  the checks of the real write path, and records what it was asked;
- :class:`FakeBroker`: the three together (a real ``EscapeBridge`` over the fakes),
  shaped like a ``LocalBroker``; :class:`FakeNeighbours` lists several of them as
  the brokers of one process, for local escape.

No commit log on disk, no ``BrokerService``.  Peers, when a test needs them, are fake
servers at the socket seam (``RpcServer`` on port 0).
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_agent.membership.acting import ActingState
from broker_agent.metadata.offsets import ConsumerOffsetManager
from broker_agent.metrics import BrokerMetrics
from broker_agent.pull_hold import PullHoldService
from broker_agent.special.escape import EscapeBridge
from broker_agent.special.steps import SpecialSteps
from broker_agent.store.message_store import GetMessageStatus, GetResult, PutResult
from broker_agent.topics import TopicConfigManager
from broker_agent.write_path import Record, Stored
from ha_controller.acl import Acl
from ha_controller.config import BrokerConfig
from ha_controller.protocol.errors import (
    BadRequest,
    BrokerIsolated,
    HaError,
    NotMaster,
    TopicNotFound,
)
from ha_controller.protocol.properties import OFFSET_TOPIC, PROPERTY_TAGS, now_ms
from ha_controller.protocol.record import StoredMessage, encoded_size, make_msg_id, tag_hash
from ha_controller.routing import Perm, TopicConfig
from ha_controller.rpc import ConnectionPool, Dispatcher

MiB = 1024 * 1024
# the real store's rules (broker_agent.store.message_store)
_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")
_MAX_QUEUE_ID = 0xFFFFFFFF
_MAX_FILTER_SCAN = 16000


# ---- store ---------------------------------------------------------------------------


@dataclass
class _Queue:
    """One consume queue: offsets ``low`` (min) to ``high`` (max, next to write)."""

    low: int = 0
    high: int = 0
    messages: dict[int, StoredMessage] = field(default_factory=dict)
    unreadable: set[int] = field(default_factory=set)


class FakeStore:
    """An in-memory ``MessageStore`` with the methods the special services call.

    Every put gets the next queue offset of its (topic, queue) and the next physical
    offset of one shared commit log (advanced by the record's encoded size, as on
    disk), a store time that never goes back, and an offset message id.  Test helpers:
    :meth:`messages` (a queue's readable messages), :meth:`make_unreadable` (a corrupt
    record: ``get_message_at`` returns None, ``get_messages`` skips it) and
    :meth:`drop_before` (old segments deleted: the queue's min offset moves up).
    """

    def __init__(self, clock: Callable[[], int] = now_ms) -> None:
        self._clock = clock
        self._queues: dict[tuple[str, int], _Queue] = {}
        self._next_physical = 0
        self._last_store_ts = 0

    # ---- write ---------------------------------------------------------------------

    def put(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: Mapping[str, str] | None = None,
        *,
        flags: int = 0,
        born_ts_ms: int | None = None,
        born_host: str = "",
        store_host: str = "",
    ) -> PutResult:
        """Append one message at the next queue offset of (topic, queue_id)."""
        if not _TOPIC_RE.match(topic):
            raise BadRequest(f"invalid topic name {topic!r}")
        if not 0 <= queue_id <= _MAX_QUEUE_ID:
            raise BadRequest(f"invalid queue id {queue_id}")
        queue = self._queues.setdefault((topic, queue_id), _Queue())
        store_ts = max(self._clock(), self._last_store_ts)
        msg = StoredMessage(
            topic=topic,
            queue_id=queue_id,
            body=bytes(body),
            properties=dict(properties) if properties else {},
            flags=flags,
            born_ts_ms=store_ts if born_ts_ms is None else born_ts_ms,
            born_host=born_host,
            store_host=store_host,
            queue_offset=queue.high,
            physical_offset=self._next_physical,
            store_ts_ms=store_ts,
        )
        try:
            size = encoded_size(msg)
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        queue.messages[queue.high] = msg
        queue.high += 1
        self._next_physical += size
        self._last_store_ts = store_ts
        return PutResult(
            physical_offset=msg.physical_offset,
            queue_offset=msg.queue_offset,
            size=size,
            store_ts_ms=store_ts,
            msg_id=make_msg_id(store_host, msg.physical_offset),
        )

    # ---- read ----------------------------------------------------------------------

    def get_message_at(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        """The message at queue ``offset``, or None if there is none (or it is unreadable)."""
        queue = self._queues.get((topic, queue_id))
        if queue is None or not queue.low <= offset < queue.high or offset in queue.unreadable:
            return None
        return queue.messages.get(offset)

    def max_offset(self, topic: str, queue_id: int) -> int:
        """Next queue offset to be written (0 for an unknown queue)."""
        queue = self._queues.get((topic, queue_id))
        return 0 if queue is None else queue.high

    def min_offset(self, topic: str, queue_id: int) -> int:
        queue = self._queues.get((topic, queue_id))
        return 0 if queue is None else queue.low

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        max_bytes: int = 4 * MiB,
        tag_filter: set[int] | None = None,
    ) -> GetResult:
        """Up to ``max_count`` messages from queue ``offset``, with the statuses and
        ``next_begin_offset`` of ``MessageStore.get_messages``."""
        queue = self._queues.get((topic, queue_id))
        if queue is None:
            return GetResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE)
        lo, hi = queue.low, queue.high

        def result(status: GetMessageStatus, nxt: int, msgs: list[StoredMessage]) -> GetResult:
            return GetResult(status, msgs, nxt, lo, hi)

        if lo == hi:
            return result(GetMessageStatus.NO_MESSAGE_IN_QUEUE, lo, [])
        if offset < lo:
            return result(GetMessageStatus.OFFSET_TOO_SMALL, lo, [])
        if offset == hi:
            return result(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, [])
        if offset > hi:
            return result(GetMessageStatus.OFFSET_OVERFLOW_BADLY, hi, [])
        messages: list[StoredMessage] = []
        total = filtered = 0
        cur = offset
        scan_limit = offset + max(max_count, _MAX_FILTER_SCAN)
        while cur < hi and cur < scan_limit and len(messages) < max_count:
            msg = queue.messages[cur]
            if tag_filter is not None and tag_hash(msg.tags) not in tag_filter:
                filtered += 1
                cur += 1
                continue
            size = encoded_size(msg)
            if messages and total + size > max_bytes:
                break
            if cur not in queue.unreadable:
                messages.append(msg)
                total += size
            cur += 1
        if messages:
            return result(GetMessageStatus.FOUND, cur, messages)
        if filtered:
            return result(GetMessageStatus.NO_MATCHED_MESSAGE, cur, [])
        return result(GetMessageStatus.OFFSET_FOUND_NULL, cur, [])

    def topics_and_queues(self) -> dict[str, list[int]]:
        """Every known topic with its queue ids (sorted)."""
        out: dict[str, list[int]] = {}
        for topic, queue_id in sorted(self._queues):
            out.setdefault(topic, []).append(queue_id)
        return out

    @property
    def commitlog_max_offset(self) -> int:
        return self._next_physical

    # ---- test helpers ----------------------------------------------------------------

    def messages(self, topic: str, queue_id: int) -> list[StoredMessage]:
        """The readable messages of a queue, in queue order."""
        queue = self._queues.get((topic, queue_id))
        if queue is None:
            return []
        return [
            queue.messages[o] for o in range(queue.low, queue.high) if o not in queue.unreadable
        ]

    def make_unreadable(self, topic: str, queue_id: int, offset: int) -> None:
        """The record at ``offset`` is corrupt: it still counts, but cannot be read."""
        queue = self._queues[(topic, queue_id)]
        assert queue.low <= offset < queue.high, (offset, queue.low, queue.high)
        queue.unreadable.add(offset)

    def drop_before(self, topic: str, queue_id: int, offset: int) -> None:
        """Old segments were deleted: the queue now starts at ``offset``."""
        queue = self._queues.setdefault((topic, queue_id), _Queue())
        for o in range(queue.low, min(offset, queue.high)):
            queue.messages.pop(o, None)
        queue.low = offset
        queue.high = max(queue.high, offset)


# ---- core ------------------------------------------------------------------------------


class FakeCore:
    """A ``CorePort``: real plain state objects around a :class:`FakeStore`.

    ``isolated`` and ``acting`` are plain objects a test sets; ``special_hooks``,
    ``topics_changed_calls`` and ``spawned`` record what the services asked of it.
    """

    def __init__(
        self,
        cfg: BrokerConfig,
        *,
        addr: str = "",
        store: FakeStore | None = None,
        store_dir: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.name = f"{cfg.broker_name}/{cfg.broker_id}"
        self.addr = addr
        self.store_dir = cfg.store_path if store_dir is None else store_dir
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.store = FakeStore() if store is None else store
        self.topics = TopicConfigManager(None, cfg.default_topic_queue_nums)
        self.offsets = ConsumerOffsetManager(None, cfg.consumer_offset_update_version_step)
        self.acting = ActingState(cfg.broker_id, cfg.enable_slave_acting_master)
        self.isolated = False
        self.metrics = BrokerMetrics(cfg.cluster, cfg.broker_name, cfg.broker_id)
        self.holds = PullHoldService(cfg.max_held_pulls, now_ms)
        self.pool = ConnectionPool(connect_timeout_ms=2000)
        self.dispatcher = Dispatcher()
        self.special_hooks: list[Callable[[bool], None]] = []
        self.special_steps = SpecialSteps()
        self.acl = Acl(None)  # no client ACL: every producer may be asked
        self.topics_changed_calls = 0
        self.spawned: list[str] = []
        #: where spawn() runs coroutines; None closes them unrun (as BrokerCore does
        #: outside the service's TaskGroup)
        self.task_group: asyncio.TaskGroup | None = None

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self.spawned.append(name)
        if self.task_group is not None:
            self.task_group.create_task(coro, name=name)
        else:
            coro.close()

    def add_special_service(self, hook: Callable[[bool], None]) -> None:
        self.special_hooks.append(hook)

    def set_special_services(self, should_run: bool) -> None:
        """Start/stop every registered special service (BrokerCore does the same)."""
        for hook in self.special_hooks:
            hook(should_run)

    def topics_changed(self) -> None:
        self.topics_changed_calls += 1

    def check_master_only(self, what: str) -> None:
        """BrokerCore's guard: online, and the master or the acting slave."""
        if self.isolated:
            raise BrokerIsolated(f"{self.name} is in pre-online")
        if not self.acting.serves_master_only_ops:
            raise NotMaster(f"{what}: {self.name} is a slave and not acting")

    async def aclose(self) -> None:
        self.holds.close()
        await self.pool.aclose()


# ---- write path ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Appended:
    """One append a :class:`FakeWritePath` made: ``how`` is "put" or "append_local"."""

    how: str
    topic: str
    queue_id: int
    properties: dict[str, str]
    result: PutResult


class FakeWritePath:
    """A ``WritePort`` over a :class:`FakeCore`: the real write path's checks (topic for
    write, auto-create, perm, queue choice, master-only ``append_local``) and appends
    into the core's FakeStore, waking held pulls; no replication.

    ``confirmed`` is what ``put`` reports (False: stored but the slaves did not confirm
    in time); ``put_error``, when set, is raised by ``put`` before anything is stored
    (e.g. ``InSyncReplicasNotEnough``).  ``appends`` and ``replicated_offsets`` record
    what was written.
    """

    def __init__(self, core: FakeCore, *, confirmed: bool = True) -> None:
        self.core = core
        self.confirmed = confirmed
        self.put_error: HaError | None = None
        self.appends: list[Appended] = []
        self.replicated_offsets: list[tuple[str, str, int, int]] = []
        self.replicated_records: list[dict[str, str]] = []
        self._queue_rr = itertools.count()

    def topic_for_write(self, topic: str) -> TopicConfig:
        core = self.core
        config = core.topics.get(topic)
        if config is None:
            if not core.cfg.auto_create_topic:
                raise TopicNotFound(f"topic {topic!r} does not exist on {core.cfg.broker_name}")
            config = core.topics.auto_create(topic)
            core.topics_changed()
        if not Perm.is_writeable(config.perm):
            raise BadRequest(f"topic {topic!r} is not writeable on {core.cfg.broker_name}")
        return config

    def _append(
        self,
        how: str,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: Mapping[str, str],
        *,
        flags: int,
        born_ts_ms: int | None,
        born_host: str | None = None,
    ) -> PutResult:
        core = self.core
        props = dict(properties)
        result = core.store.put(
            topic,
            queue_id,
            body,
            props,
            flags=flags,
            born_ts_ms=born_ts_ms,
            born_host=born_host or core.addr,
            store_host=core.addr,
        )
        core.holds.notify(
            topic, queue_id, result.queue_offset + 1, tag_hash(props.get(PROPERTY_TAGS))
        )
        self.appends.append(Appended(how, topic, queue_id, props, result))
        return result

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
        if not self.core.acting.is_master:
            raise NotMaster(f"{self.core.name} cannot write its own store ({topic})")
        return self._append(
            "append_local", topic, queue_id, body, properties, flags=flags, born_ts_ms=born_ts_ms
        )

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
        config = self.topic_for_write(topic)
        if queue_id is not None and 0 <= queue_id < config.write_queue_nums:
            qid = queue_id
        else:
            qid = next(self._queue_rr) % config.write_queue_nums
        if self.put_error is not None:
            raise self.put_error
        result = self._append(
            "put",
            topic,
            qid,
            body,
            properties,
            flags=flags,
            born_ts_ms=born_ts_ms,
            born_host=born_host,
        )
        if then is not None:  # right behind the message, as WritePath.put appends it
            t_topic, t_qid, t_body, t_props = then
            self._append("put", t_topic, t_qid, t_body, t_props, flags=0, born_ts_ms=None)
        if progress is not None:  # travels right behind the message (WritePath.put)
            self.replicate_record(progress)
        return Stored(result, qid, self.confirmed)

    async def confirm(self, end: int, needed: int | None = None) -> bool:
        """No slaves here: ``confirmed``, as ``put`` reports it."""
        return self.confirmed

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> int | None:
        self.core.offsets.commit(group, topic, queue_id, offset)
        return self.replicate_offset(group, topic, queue_id, offset)

    def replicate_offset(self, group: str, topic: str, queue_id: int, offset: int) -> int | None:
        """Recorded; on a master also appended as an offset record (as the real one does)."""
        return self.replicate_record({"G": group, "T": topic, "Q": str(queue_id), "O": str(offset)})

    def replicate_record(self, properties: Mapping[str, str]) -> int | None:
        """Offset-shaped records are recorded in ``replicated_offsets``, every record in
        ``replicated_records``; on a master also appended (as the real one does)."""
        props = dict(properties)
        self.replicated_records.append(props)
        if {"G", "T", "Q", "O"} <= props.keys():
            self.replicated_offsets.append(
                (props["G"], props["T"], int(props["Q"]), int(props["O"]))
            )
        if not self.core.acting.is_master:
            return None
        result = self.append_local(OFFSET_TOPIC, 0, b"", props)
        return result.physical_offset + result.size


# ---- brokers of one process --------------------------------------------------------------


class FakeBroker:
    """A fake core and write path with a real ``EscapeBridge`` over them (a ``LocalBroker``).

    The bridge has no neighbours; set ``escape.neighbours`` to a :class:`FakeNeighbours`
    for local escape between the brokers of one process.
    """

    def __init__(
        self,
        cfg: BrokerConfig,
        *,
        addr: str = "",
        store: FakeStore | None = None,
        store_dir: Path | None = None,
    ) -> None:
        self.core = FakeCore(cfg, addr=addr, store=store, store_dir=store_dir)
        self.write_path = FakeWritePath(self.core)
        # CorePort types ``store`` as the concrete MessageStore, so mypy does not take a
        # FakeCore (whose FakeStore has only what the services call) for a CorePort
        self.escape = EscapeBridge(self.core, self.write_path)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        await self.core.aclose()


@dataclass
class FakeNeighbours:
    """The brokers hosted in one process (a ``Neighbours``)."""

    brokers: list[FakeBroker] = field(default_factory=list)

    def local_brokers(self) -> Sequence[FakeBroker]:
        return list(self.brokers)
