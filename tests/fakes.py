"""The fakes the unit tests share: a hand-moved clock, a connection, a handler call,
and small fakes of the ports the special services see (``broker_agent.special.ports``).

- :class:`FakeClock`: time a test sets and moves (``advance``); callable (the clocks
  that are a ``Callable[[], int | float]``) and a ``broker_agent.special.clock.Clock``
  (``now_ms``, ``sleep``, ``timeout``), so a service's waits end when the test moves
  it, not when real time passes;
- :class:`FakeConn` and :func:`call_handler`: one request through a dispatcher's
  handler, as the server runs it, on a connection that records one-way sends;
- :class:`RecordingEscape`: the escape bridge as a special service calls it,
  recording each put (:class:`EscapePut`).

The special services (escape, schedule, transaction, POP) take ``(core, write_path,
escape)``.  Their unit tests build those from:

- :class:`FakeStore`: an in-memory message store keyed by (topic, queue) with queue
  offsets and physical (commit-log) offsets, answering with the real
  ``StoredMessage`` / ``PutResult`` / ``GetResult`` shapes; it records every append
  (``appended``) and can refuse them (``refuse``);
- :class:`FakeReplicas`: a master's slaves as the write path asks them (how many are
  live, whether they confirmed in time);
- :class:`FakeCore`: a ``CorePort`` and the write path's ``WriteCore`` around real
  plain objects (config, topic table, consumer offsets, acting state, metrics, pull
  holds, connection pool, dispatcher), a FakeStore and, on a master, FakeReplicas;
  ``store_dir`` only holds the services' JSON progress files;
- the real ``WritePath`` over a FakeCore;
- :class:`FakeBroker`: the three together (a real ``EscapeBridge`` over them), shaped
  like a ``LocalBroker``; :class:`FakeNeighbours` lists several of them as the
  brokers of one process, for local escape.

No commit log on disk, no ``BrokerService``.  Peers, when a test needs them, are fake
servers at the socket seam (``RpcServer`` on port 0).

mypy checks every fake against the port it stands in for (``_stand_ins`` at the end):
a fake that drifts from its port fails ``make typecheck``, not a test at run time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from google.protobuf.message import Message

from broker_agent.membership.acting import ActingState
from broker_agent.metadata.offsets import ConsumerOffsetManager
from broker_agent.metadata.topics import TopicConfigManager
from broker_agent.metrics import BrokerMetrics
from broker_agent.pull_hold import PullHoldService
from broker_agent.special.clock import Clock
from broker_agent.special.escape import EscapeBridge
from broker_agent.special.ports import (
    CorePort,
    EscapePort,
    EscapeResult,
    LocalBroker,
    Neighbours,
    RoutesPort,
    StorePort,
)
from broker_agent.special_steps import SpecialSteps
from broker_agent.store.message_store import GetMessageStatus, GetResult, PutRequest, PutResult
from broker_agent.write_path import (
    AppendStore,
    Record,
    Replicas,
    WriteCore,
    WritePath,
    copies_needed,
)
from ha_controller.acl import Acl
from ha_controller.config import BrokerConfig
from ha_controller.protocol import envelope
from ha_controller.protocol.errors import (
    BadRequest,
    BrokerIsolated,
    ConnectionClosed,
    EscapeFailed,
    HaError,
    NotMaster,
    RecordUnderRepair,
)
from ha_controller.protocol.properties import OFFSET_TOPIC, now_ms
from ha_controller.protocol.record import StoredMessage, encoded_size, make_msg_id, tag_hash
from ha_controller.routing import BrokerMemberGroup
from ha_controller.rpc import ConnectionPool, Dispatcher, RequestContext, RpcConnection

M = TypeVar("M", bound=Message)
MiB = 1024 * 1024
# the real store's rules (broker_agent.store.message_store)
_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")
_MAX_QUEUE_ID = 0xFFFFFFFF
_MAX_FILTER_SCAN = 16000


# ---- clock -----------------------------------------------------------------------------


class FakeClock:
    """A clock that moves only when the test says so.

    ``now`` is in the unit the code under test reads (milliseconds for most; a float of
    seconds where the code takes one); calling the clock returns it.  As a
    ``broker_agent.special.clock.Clock`` ``now`` is milliseconds, and ``sleep`` and
    ``timeout`` (in seconds) end when :meth:`advance` passes their deadline.
    ``waiting`` counts the sleeps and timeouts not over yet: a service whose loops all
    wait on the clock is idle once it equals their number.
    """

    def __init__(self, now: float = 1_000_000) -> None:
        self.now = now
        self._waits: list[tuple[float, Callable[[], None]]] = []

    def __call__(self) -> Any:
        return self.now

    def now_ms(self) -> int:
        return int(self.now)

    @property
    def waiting(self) -> int:
        return len(self._waits)

    def advance(self, delta: float) -> None:
        """Move on by ``delta``; the waits whose deadline that passes end (in order)."""
        self.now += delta
        due = sorted((w for w in self._waits if w[0] <= self.now), key=lambda w: w[0])
        for wait in due:
            self._waits.remove(wait)
            wait[1]()

    def _wait_until(self, deadline: float, wake: Callable[[], None]) -> Callable[[], None]:
        """Register ``wake`` for ``deadline`` (called at once when it has passed); the
        function returned forgets it."""
        entry = (deadline, wake)
        if deadline <= self.now:
            wake()
            return lambda: None
        self._waits.append(entry)
        return lambda: self._waits.remove(entry) if entry in self._waits else None

    async def sleep(self, seconds: float) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not done.done():
                done.set_result(None)

        forget = self._wait_until(self.now + seconds * 1000, wake)
        try:
            await done
        finally:
            forget()

    @contextlib.asynccontextmanager
    async def timeout(self, seconds: float) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(None) as scope:
            forget = self._wait_until(
                self.now + seconds * 1000,
                lambda: None if scope.expired() else scope.reschedule(loop.time()),
            )
            try:
                yield
            finally:
                forget()


# ---- a connection and a handler call ----------------------------------------------------


class FakeConn:
    """What the servers' handlers use of an ``RpcConnection``: ``peer``, ``closed``,
    ``oneway`` (recorded in ``sent``; ``broken``: it raises ConnectionClosed)."""

    def __init__(self, peer: str = "10.0.0.9:50000", *, broken: bool = False) -> None:
        self.peer = peer
        self.closed = False
        self.broken = broken
        self.sent: list[tuple[int, bytes]] = []

    def oneway(self, method: int, body: bytes) -> None:
        if self.broken:
            raise ConnectionClosed(f"connection to {self.peer} is closed")
        self.sent.append((method, body))


def request_context(
    method: int,
    conn: FakeConn | None = None,
    *,
    timeout_ms: int = 3000,
    auth: envelope.RequestAuth | None = None,
) -> RequestContext:
    """The context a server gives a handler, on a :class:`FakeConn`."""
    conn = FakeConn() if conn is None else conn
    return RequestContext(cast(RpcConnection, conn), method, time.monotonic(), timeout_ms, auth)


async def call_handler(
    dispatcher: Dispatcher, method: int, request: Message, response_type: type[M]
) -> M:
    """One request through a dispatcher's registered handler, as the server runs it."""
    handler = dispatcher.get(method)
    assert handler is not None, f"no handler for {method}"
    out = await handler(request_context(method), request.SerializeToString())
    response = response_type()
    response.ParseFromString(out or b"")
    return response


# ---- an escape bridge that records ------------------------------------------------------


@dataclass(frozen=True)
class EscapePut:
    """One put a :class:`RecordingEscape` was asked for."""

    kind: str
    topic: str
    body: bytes
    properties: dict[str, str]
    flags: int
    born_ts_ms: int | None = None
    #: the record a master appends right behind it (WritePath.put's ``then``)
    then: Record | None = None
    #: the group whose master must store it, and the queue
    to_group: str = ""
    to_queue: int | None = None


class FakeRoutes:
    """``EscapeRoutes.group_addrs`` from a fixed table (group -> {broker id: addr})."""

    def __init__(self) -> None:
        self.addrs: dict[str, dict[int, str]] = {}

    async def group_addrs(self, topic: str, group: str) -> dict[int, str]:
        return dict(self.addrs.get(group, {}))


class RecordingEscape:
    """The escape bridge as the special services call it, recording every put.

    ``put_message`` answers from ``target`` at the queue offset ``stored_at`` gives
    (a test's target stores it), else the next of ``offsets``, then calls
    ``after_put`` (a test changes the world there); ``failures_left`` puts fail with
    EscapeFailed first.  ``put_message_to_specific_queue`` answers from the group it
    names (else ``neighbour``, the master of this process, else ``target``) at queue
    ``to_queue`` (else ``specific_queue``).  ``get_message`` reads from ``stores``
    (group -> store; ``get_failures_left`` reads fail first).
    """

    def __init__(self, target: str = "broker-b", *, first_offset: int = 40) -> None:
        self.target = target
        self.routes = FakeRoutes()
        self.puts: list[EscapePut] = []
        self.gets: list[tuple[str, str, int, int]] = []
        self.failures_left = 0
        self.get_failures_left = 0
        self.offsets = itertools.count(first_offset)
        self.stored_at: Callable[[EscapePut], int] | None = None
        self.after_put: Callable[[], None] | None = None
        self.specific_queue = 0
        self.neighbour = ""
        self.stores: dict[str, FakeStore] = {}
        self.local: tuple[FakeCore, WritePath] | None = None

    def local_master(self) -> tuple[FakeCore, WritePath] | None:
        return self.local

    def kinds(self) -> list[str]:
        return [p.kind for p in self.puts]

    async def put_message(
        self,
        topic: str,
        body: bytes,
        properties: dict[str, str],
        *,
        kind: str,
        queue_id: int | None = None,
        flags: int = 0,
        born_ts_ms: int | None = None,
        progress: Mapping[str, str] | None = None,
        escape_id: str = "",
    ) -> EscapeResult:
        if self.failures_left > 0:
            self.failures_left -= 1
            raise EscapeFailed("no live master")
        put = EscapePut(kind, topic, body, dict(properties), flags, born_ts_ms)
        self.puts.append(put)
        offset = next(self.offsets) if self.stored_at is None else self.stored_at(put)
        if self.after_put is not None:
            self.after_put()
        return EscapeResult(self.target, f"MSG{len(self.puts)}", 1, offset)

    async def put_message_to_specific_queue(
        self,
        topic: str,
        body: bytes,
        properties: dict[str, str],
        *,
        kind: str,
        flags: int = 0,
        escape_id: str = "",
        then: Record | None = None,
        to_group: str = "",
        to_queue: int | None = None,
    ) -> EscapeResult:
        self.puts.append(
            EscapePut(kind, topic, body, dict(properties), flags, None, then, to_group, to_queue)
        )
        qid = self.specific_queue if to_queue is None else to_queue
        group = to_group or self.neighbour or self.target
        target = "local" if group == self.neighbour else group
        return EscapeResult(target, f"MSG{len(self.puts)}", qid, len(self.puts) - 1, group)

    async def get_message(
        self, topic: str, broker_name: str, queue_id: int, offset: int
    ) -> StoredMessage | None:
        self.gets.append((topic, broker_name, queue_id, offset))
        if self.get_failures_left > 0:
            self.get_failures_left -= 1
            raise EscapeFailed(f"cannot read from {broker_name}")
        store = self.stores.get(broker_name)
        return None if store is None else store.get_message_at(topic, queue_id, offset)


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
    disk), a store time that never goes back, and an offset message id.
    ``put_batch`` (the write path's append) records each message in ``appended`` and,
    while ``refuse`` is set, raises it before storing anything (``StoreFull``: the
    write path answers NotWritable).  Test helpers:
    :meth:`messages` (a queue's readable messages), :meth:`make_unreadable` (a corrupt
    record: ``get_message_at`` returns None, ``get_messages`` skips it) and
    :meth:`drop_before` (old segments deleted: the queue's min offset moves up).
    """

    def __init__(self, clock: Callable[[], int] = now_ms) -> None:
        self._clock = clock
        self._queues: dict[tuple[str, int], _Queue] = {}
        self._next_physical = 0
        self._last_store_ts = 0
        self.appended: list[StoredMessage] = []
        self.refuse: HaError | None = None
        #: what a real store says after an unclean stop (the tables catch up with it)
        self.recovered_unclean = False

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

    def put_batch(self, requests: Sequence[PutRequest]) -> list[PutResult]:
        """The write path's append: all of them, or (``refuse``) none."""
        if self.refuse is not None:
            raise self.refuse
        results = []
        for r in requests:
            result = self.put(
                r.topic,
                r.queue_id,
                r.body,
                r.properties,
                flags=r.flags,
                born_ts_ms=r.born_ts_ms,
                born_host=r.born_host,
                store_host=r.store_host,
            )
            results.append(result)
            self.appended.append(self._queues[(r.topic, r.queue_id)].messages[result.queue_offset])
        return results

    @property
    def cuts(self) -> int:
        return 0  # never cut back

    def cut_below(self, since: int, end: int) -> bool:
        return False

    # ---- read ----------------------------------------------------------------------

    def get_message_at(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        """The message at queue ``offset``, or None if there is none; RecordUnderRepair
        when it is unreadable (see :meth:`make_unreadable`)."""
        queue = self._queues.get((topic, queue_id))
        if queue is None or not queue.low <= offset < queue.high:
            return None
        if offset in queue.unreadable:
            raise RecordUnderRepair(f"{topic}/{queue_id} offset {offset}: damaged")
        return queue.messages.get(offset)

    def max_offset(self, topic: str, queue_id: int) -> int:
        """Next queue offset to be written (0 for an unknown queue)."""
        queue = self._queues.get((topic, queue_id))
        return 0 if queue is None else queue.high

    def min_offset(self, topic: str, queue_id: int) -> int:
        queue = self._queues.get((topic, queue_id))
        return 0 if queue is None else queue.low

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset stored at or after ``timestamp_ms`` (the end: none)."""
        queue = self._queues.get((topic, queue_id))
        if queue is None:
            return 0
        for offset in range(queue.low, queue.high):
            msg = queue.messages.get(offset)
            if msg is not None and msg.store_ts_ms >= timestamp_ms:
                return offset
        return queue.high

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        max_bytes: int = 4 * MiB,
        tag_filter: set[int] | None = None,
        message_filter: Callable[[Mapping[str, str]], bool] | None = None,
    ) -> GetResult:
        """Up to ``max_count`` messages from queue ``offset``, with the statuses and
        ``next_begin_offset`` of ``MessageStore.get_messages`` (without its bound on
        the messages read for ``message_filter``)."""
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
            if cur in queue.unreadable:  # never passed over: readers wait at it
                if messages:
                    return result(GetMessageStatus.FOUND, cur, messages)
                if filtered:
                    return result(GetMessageStatus.NO_MATCHED_MESSAGE, cur, [])
                return result(GetMessageStatus.RECORD_UNDER_REPAIR, cur, [])
            cur += 1
            if message_filter is not None and not message_filter(msg.properties):
                filtered += 1
                continue
            messages.append(msg)
            total += size
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

    def appended_to(self, topic: str | None = None) -> list[StoredMessage]:
        """What the write path appended (to ``topic``, when given), in order."""
        return [m for m in self.appended if topic is None or m.topic == topic]

    def progress_records(self) -> list[dict[str, str]]:
        """The progress records the write path appended (consumer and delay offsets, the
        timer checkpoint: what reaches the slaves), in order."""
        return [dict(m.properties) for m in self.appended_to(OFFSET_TOPIC)]

    def offset_records(self) -> list[tuple[str, str, int, int]]:
        """The offset-shaped progress records as (group, topic, queue, offset)."""
        return [
            (r["G"], r["T"], int(r["Q"]), int(r["O"]))
            for r in self.progress_records()
            if {"G", "T", "Q", "O"} <= r.keys()
        ]

    def make_unreadable(self, topic: str, queue_id: int, offset: int) -> None:
        """The record at ``offset`` is damaged: it still counts, but cannot be read
        until :meth:`repaired` (a replica's copy written back, store.repair)."""
        queue = self._queues[(topic, queue_id)]
        assert queue.low <= offset < queue.high, (offset, queue.low, queue.high)
        queue.unreadable.add(offset)

    def repaired(self, topic: str, queue_id: int, offset: int) -> None:
        self._queues[(topic, queue_id)].unreadable.discard(offset)

    def drop_before(self, topic: str, queue_id: int, offset: int) -> None:
        """Old segments were deleted: the queue now starts at ``offset``."""
        queue = self._queues.setdefault((topic, queue_id), _Queue())
        for o in range(queue.low, min(offset, queue.high)):
            queue.messages.pop(o, None)
        queue.low = offset
        queue.high = max(queue.high, offset)


# ---- core ------------------------------------------------------------------------------


class FakeReplicas:
    """A master's slaves as the write path asks them (``HaMaster``): ``live`` of them can
    confirm, and they confirm in time unless ``confirmed`` is False (stored, but the
    slaves did not confirm in time)."""

    def __init__(self, live: int) -> None:
        self.live = live
        self.confirmed = True
        self.pushes = 0

    def slave_count(self) -> int:
        return self.live

    def data_appended(self) -> None:
        self.pushes += 1

    async def wait_for_copies(self, offset: int, copies: int, timeout_s: float) -> bool:
        return self.confirmed and 1 + self.live >= copies


class FakeCore:
    """A ``CorePort``: real plain state objects around a :class:`FakeStore`.

    ``isolated`` and ``acting`` are plain objects a test sets; ``special_hooks``,
    ``topics_changed_calls`` and ``spawned`` record what the services asked of it.  A
    master (by its config's id) has :class:`FakeReplicas`, every slave live.
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
        self.has_replicas = False
        self.metrics = BrokerMetrics(cfg.cluster, cfg.broker_name, cfg.broker_id)
        self.holds = PullHoldService(cfg.max_held_pulls, now_ms)
        self.ha_master = FakeReplicas(cfg.total_replicas - 1) if cfg.is_master else None
        #: a slave's HA link (a test sets an object with ``replicating``)
        self.ha_slave: Any = None
        #: controller mode: the master's sync-state set (a test sets any object)
        self.sync: object | None = None
        self.pool = ConnectionPool(connect_timeout_ms=2000)
        self.dispatcher = Dispatcher()
        self.special_hooks: list[Callable[[bool], None]] = []
        self.special_steps = SpecialSteps()
        self.acl = Acl(None)  # no client ACL: every producer may be asked
        self.member_group: BrokerMemberGroup | None = None
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

    def copies_needed(self) -> int:
        return copies_needed(self.cfg)

    def sync_set_shortfall(self) -> str | None:
        return None

    def note_store_state(self) -> None:
        """Nothing watches the fake store's space."""

    def check_online(self) -> None:
        """BrokerCore's guard: not in pre-online."""
        if self.isolated:
            raise BrokerIsolated(f"{self.name} is in pre-online")

    def check_master_only(self, what: str) -> None:
        """BrokerCore's guard: online, and the master or the acting slave."""
        if self.isolated:
            raise BrokerIsolated(f"{self.name} is in pre-online")
        if not self.acting.serves_master_only_ops:
            raise NotMaster(f"{what}: {self.name} is a slave and not acting")

    async def aclose(self) -> None:
        self.holds.close()
        await self.pool.aclose()


# ---- brokers of one process --------------------------------------------------------------


class FakeBroker:
    """A fake core, the real write path and a real ``EscapeBridge`` over them (a
    ``LocalBroker``).

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
        self.write_path = WritePath(self.core)
        self.escape = EscapeBridge(self.core, self.write_path)

    async def aclose(self) -> None:
        await self.core.aclose()


@dataclass
class FakeNeighbours:
    """The brokers hosted in one process (a ``Neighbours``)."""

    brokers: list[FakeBroker] = field(default_factory=list)

    def local_brokers(self) -> Sequence[FakeBroker]:
        return list(self.brokers)


# ---- each fake against the port it stands in for --------------------------------------

if TYPE_CHECKING:  # mypy checks these assignments; nothing runs

    def _stand_ins(
        clock: FakeClock,
        store: FakeStore,
        replicas: FakeReplicas,
        core: FakeCore,
        escape: RecordingEscape,
        routes: FakeRoutes,
        broker: FakeBroker,
        neighbours: FakeNeighbours,
    ) -> None:
        _clock: Clock = clock
        _read_store: StorePort = store
        _append_store: AppendStore = store
        _replicas: Replicas = replicas
        _core: CorePort = core
        _write_core: WriteCore = core
        _escape: EscapePort = escape
        _routes: RoutesPort = routes
        _local: LocalBroker = broker
        _neighbours: Neighbours = neighbours
