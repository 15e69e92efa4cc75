"""The escape bridge (RIP-32's EscapeBridge): how special messages leave a broker.

A master stores what its special services produce (due delayed messages,
revived POP messages, ...) in its own store.  A slave acting for a lost
master must not write to its own commit log (it would fork from the master's),
so it *escapes* them:

- local escape: to a master hosted in the same process (broker container);
- remote escape (``enable_remote_escape``): SEND_MESSAGE to a writable master
  of another group, never its own group and never a master the nameserver
  no longer lists, retried with bounded exponential backoff (tenacity).

``put_message_to_specific_queue`` picks the remote queue deterministically
(``crc32(topic + store host) mod len(queues)``, RocketMQ's
``(topic + storeHost).hashCode()``) so that every POP checkpoint and ack of a
slave for a topic lands on the same master and queue.  ``get_message`` reads a
message back from its group: locally when the group lives in this process,
else by PULL_MESSAGE from that group.

Every outcome is counted in ``hac_escape_messages_total{kind,target,result}``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Final

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from broker_agent.convert import message_from_pb
from broker_agent.special.escape_routes import EscapeRoutes, RemoteQueue, stable_hash
from broker_agent.special.ports import CorePort, EscapeResult, LocalBroker, Neighbours, WritePort
from broker_agent.write_path import Record
from ha_controller.client.admin import NameserverClient
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    BadRequest,
    BrokerUnavailable,
    ConnectionClosed,
    EscapeFailed,
    HaError,
    NotWritable,
    RequestTimeout,
)
from ha_controller.protocol.properties import PROPERTY_ESCAPE_ID, PROPERTY_PRODUCER_GROUP
from ha_controller.protocol.record import StoredMessage

log = logging.getLogger(__name__)

#: EscapeBridge.DEFAULT_PULL_TIMEOUT_MILLIS
PULL_TIMEOUT_MS: Final = 10_000
LOCAL: Final = "local"
#: After a failed send, round-robin escapes avoid that master this long
#: (while another one is available), like a producer's endpoint isolation.
FAILED_MASTER_AVOID_S: Final = 5.0
#: The longest backoff between attempts of a pinned escape (see ``_put_remote``).
PINNED_BACKOFF_MAX_S: Final = 0.5


class NotServingAnyMore(EscapeFailed):
    """This broker stopped serving special work (fenced, or no longer acting) while
    it had a message to hand on: nothing was handed on, and no attempt may follow."""


def outcome_unknown(exc: BaseException) -> bool:
    """Whether a failed send may still have been stored: the request left, and its
    answer did not come (a timeout, the connection cut).  A refusal by the target, or a
    connection that never opened, stored nothing."""
    if isinstance(exc, BrokerUnavailable):
        return False
    return isinstance(exc, RequestTimeout | ConnectionClosed) or (
        isinstance(exc, OSError) and not isinstance(exc, HaError)
    )


def _retriable(exc: BaseException) -> bool:
    if isinstance(exc, BadRequest):
        return False  # the message itself is refused; another try would be refused too
    if isinstance(exc, NotServingAnyMore):
        return False  # whoever serves now owns the message
    return isinstance(exc, HaError | OSError)


class EscapeBridge:
    """Puts special messages where a master will serve them (see the module doc)."""

    def __init__(
        self, core: CorePort, write_path: WritePort, neighbours: Neighbours | None = None
    ) -> None:
        self.core = core
        self.write_path = write_path
        self.neighbours = neighbours
        cfg = core.cfg
        self.routes = EscapeRoutes(
            NameserverClient(list(cfg.namesrv_addrs), core.pool), cfg.cluster
        )
        self._rr = itertools.count()
        self._failed_at: dict[str, float] = {}
        #: puts retrying to the target of an attempt whose answer never came
        self.unknown_outcomes = 0
        #: retries waiting out their backoff: woken when the special services stop, so
        #: that a step under way ends at once (a returning master waits for it)
        self._sleepers: set[asyncio.Future[None]] = set()
        core.add_special_service(self._on_special_services)
        self.inner_producer_group = f"InnerProducerGroup_{cfg.broker_name}_{cfg.broker_id}"
        self.inner_consumer_group = f"InnerConsumerGroup_{cfg.broker_name}_{cfg.broker_id}"

    def _on_special_services(self, running: bool) -> None:
        if not running:
            for sleeper in self._sleepers:
                if not sleeper.done():
                    sleeper.set_result(None)

    async def _backoff(self, seconds: float) -> None:
        """A retry's backoff, cut short when the special services stop: the next
        attempt then finds this broker not serving (unless the escape is pinned)."""
        sleeper: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.add(sleeper)
        try:
            await asyncio.wait({sleeper}, timeout=seconds)
        finally:
            self._sleepers.discard(sleeper)

    # ---- choosing where ---------------------------------------------------

    def _others(self) -> list[LocalBroker]:
        if self.neighbours is None:
            return []
        return [b for b in self.neighbours.local_brokers() if b.core is not self.core]

    def local_master(self, group: str = "") -> tuple[CorePort, WritePort] | None:
        """This broker if it is a master; else an online master in the same process
        (of ``group`` only, when named)."""
        own = self.core
        if own.acting.is_master and group in ("", own.cfg.broker_name):
            return own, self.write_path
        for other in self._others():
            core = other.core
            if group in ("", core.cfg.broker_name) and core.acting.is_master:
                if not core.isolated:
                    return core, other.write_path
        return None

    def _local_core_of(self, group: str) -> CorePort | None:
        if self.core.cfg.broker_name == group:
            return self.core
        candidates = [b.core for b in self._others() if b.core.cfg.broker_name == group]
        return min(candidates, key=lambda c: c.cfg.broker_id, default=None)

    def _count(self, kind: str, target: str, result: str) -> None:
        m = self.core.metrics
        m.init_escape_target(target)
        m.escape.labels(**m.ident, kind=kind, target=target, result=result).inc()

    async def init_metric_targets(self) -> None:
        """Create the escape series of every other group of the cluster at 0 before any
        escape happens, so that the first one shows in rate() (called periodically)."""
        for group in await self.routes.nameserver.groups():
            if group.broker_name != self.core.cfg.broker_name and (
                not self.routes.cluster or group.cluster == self.routes.cluster
            ):
                self.core.metrics.init_escape_target(group.broker_name)

    def _check_remote_allowed(self, kind: str) -> None:
        cfg = self.core.cfg
        if not (cfg.enable_slave_acting_master and cfg.enable_remote_escape):
            self._count(kind, "none", "no_target")
            raise EscapeFailed(
                f"{cfg.broker_name}/{cfg.broker_id}: no master in this process and remote "
                "escape is off (enable_slave_acting_master and enable_remote_escape)"
            )

    def _check_still_serving(self, kind: str) -> None:
        """A master's special service hands a message on only while the master serves:
        not fenced, not in pre-online, and still holding its lease on id 0.  (An acting
        slave's services stop when it stops acting; its puts go elsewhere anyway.)

        A master resumed after a freeze, or reconnected after a partition, wakes its
        timer and revive loops at the same moment as its heartbeat loop; whichever runs
        first must not deliver what the acting slave delivered meanwhile.  The check
        fences such a master (core.check_online) and refuses; the put that follows it
        appends without yielding, so no fence can slip in between.

        A slave hands on only while it acts: a pass that started while acting (its
        escapes retry for seconds against a frozen target) must not go on once the
        master is back, or it escapes half messages the master has resolved since, and
        the target commits them a second time (campaign seed 5000).  Checked again
        before every remote attempt."""
        acting = self.core.acting
        if not acting.is_master:
            if not acting.acting:
                raise NotServingAnyMore(
                    f"{kind} not handed on: {self.core.name} does not act any more"
                )
            return
        try:
            self.core.check_master_only(f"{kind} delivery")
        except HaError as exc:
            raise NotServingAnyMore(f"{kind} not handed on: {exc}") from exc

    # ---- put --------------------------------------------------------------

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
        """Store a message on a local master (``queue_id`` honoured when it exists
        there), else on a remote master of another group (round robin).

        ``escape_id`` (see :mod:`broker_agent.special.escape_ids`) names the source of a
        remote escape: once an attempt's answer is lost, every later attempt with that id
        goes to the same target, which stores it once.

        ``progress`` (a progress record of this broker's special service) travels with
        the message when this broker is the master that stores it (WritePath.put);
        elsewhere it is dropped: an acting slave's progress is its own.

        A master whose own store refuses appends (full disk) escapes remotely too, like
        an acting slave: its slaves then learn the progress from the metadata sync."""
        self._check_still_serving(kind)
        master = self.local_master()
        if master is not None:
            own = master[0] is self.core
            try:
                return await self._put_local(
                    master,
                    topic,
                    body,
                    properties,
                    kind,
                    queue_id,
                    flags,
                    born_ts_ms,
                    progress if own else None,
                )
            except EscapeFailed as exc:
                if not (own and isinstance(exc.__cause__, NotWritable)):
                    raise
                # our own store takes no appends (disk full): nothing was stored, and
                # no slave acts for a live master, so the message would wait for the
                # disk; it goes to another group's master as an acting slave's would
                self._check_remote_allowed(kind)
                log.info(
                    "%s message for %s: own store takes no writes; escaping it to another group",
                    kind,
                    topic,
                )
        else:
            self._check_remote_allowed(kind)

        def choose(queues: list[RemoteQueue], failed: set[str]) -> RemoteQueue:
            now = time.monotonic()
            usable = (
                [
                    q
                    for q in queues
                    if q.addr not in failed
                    and now - self._failed_at.get(q.addr, -FAILED_MASTER_AVOID_S)
                    >= FAILED_MASTER_AVOID_S
                ]
                or [q for q in queues if q.addr not in failed]
                or queues
            )
            return usable[next(self._rr) % len(usable)]

        return await self._put_remote(
            topic, body, properties, kind, flags, born_ts_ms, choose, escape_id
        )

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
        """Like ``put_message`` but the queue is a function of (topic, our store host),
        so every call of this broker for ``topic`` reaches the same master and queue
        (as long as the set of live masters does not change).  ``to_group`` (and
        ``to_queue``) name the group whose master must store it, and the queue: an ACK
        goes to the revive queue its CK is in, whoever serves the ack.  EscapeFailed
        when that group has no master to write to (or no such queue).

        ``then`` (a record of this broker's own, e.g. a POP revive's ACK) is appended
        right behind the message when this broker is the master that stores it (see
        WritePath.put); elsewhere it is dropped."""
        key = stable_hash(topic + self.core.addr)
        self._check_still_serving(kind)
        master = self.local_master(to_group)
        if master is not None:
            try:
                config = master[1].topic_for_write(topic)
            except HaError as exc:
                self._count(kind, LOCAL, "error")
                raise EscapeFailed(f"local escape of {topic} refused: {exc}") from exc
            return await self._put_local(
                master,
                topic,
                body,
                properties,
                kind,
                key % config.write_queue_nums if to_queue is None else to_queue,
                flags,
                None,
                None,
                then if master[0] is self.core else None,
            )
        self._check_remote_allowed(kind)

        def choose(queues: list[RemoteQueue], failed: set[str]) -> RemoteQueue:
            if to_group:
                queues = [
                    q
                    for q in queues
                    if q.broker_name == to_group and to_queue in (None, q.queue_id)
                ]
                if not queues:
                    where = to_group if to_queue is None else f"{to_group} queue {to_queue}"
                    raise EscapeFailed(f"{kind}: no master of {where} to write {topic} to")
            return queues[key % len(queues)]

        return await self._put_remote(topic, body, properties, kind, flags, None, choose, escape_id)

    async def _put_local(
        self,
        master: tuple[CorePort, WritePort],
        topic: str,
        body: bytes,
        properties: Mapping[str, str],
        kind: str,
        queue_id: int | None,
        flags: int,
        born_ts_ms: int | None,
        progress: Mapping[str, str] | None,
        then: Record | None = None,
    ) -> EscapeResult:
        """A put into ``master``'s store with the checks and replica wait of a send."""
        core, write_path = master
        try:
            stored = await write_path.put(
                topic,
                body,
                properties,
                queue_id=queue_id,
                flags=flags,
                born_ts_ms=born_ts_ms,
                born_host=self.core.addr,
                progress=progress,
                then=then,
            )
        except HaError as exc:
            self._count(kind, LOCAL, "error")
            raise EscapeFailed(
                f"local escape of {topic} to {core.cfg.broker_name} failed: {exc}"
            ) from exc
        # not counted in hac_messages_in_total: the send that first stored it
        # (a delayed, half or retried message) was already counted
        outcome = "ok"
        if not stored.confirmed:
            # Stored: a retry would duplicate it; replication catches up.
            outcome = "unconfirmed"
            log.warning(
                "escaped %s message %s stored on %s but not confirmed by its slaves",
                kind,
                stored.result.msg_id,
                core.cfg.broker_name,
            )
        self._count(kind, LOCAL, outcome)
        return EscapeResult(
            LOCAL,
            stored.result.msg_id,
            stored.queue_id,
            stored.result.queue_offset,
            core.cfg.broker_name,
        )

    async def _put_remote(
        self,
        topic: str,
        body: bytes,
        properties: Mapping[str, str],
        kind: str,
        flags: int,
        born_ts_ms: int | None,
        choose: Callable[[list[RemoteQueue], set[str]], RemoteQueue],
        escape_id: str,
    ) -> EscapeResult:
        """SEND_MESSAGE to a master of another group, retried with backoff.

        Before the first answer is lost, each attempt checks that this broker still
        serves (a retry comes seconds later) and chooses a target.  Once an attempt's
        answer is lost (:func:`outcome_unknown`) and the escape has an id, the message
        may be stored there: every later attempt goes to that target, also after this
        broker stopped serving, until one is answered (the target answers a repeat with
        its first store).  When the attempts run out the fate stays unknown (logged):
        the next put chooses afresh, so a target that never comes back holds up no queue,
        at the risk of a second copy."""
        cfg = self.core.cfg
        own = cfg.broker_name
        props = dict(properties)
        if escape_id:
            props[PROPERTY_ESCAPE_ID] = escape_id
        pinned: RemoteQueue | None = None
        request = broker_pb2.SendMessageRequest(
            producer_group=props.get(PROPERTY_PRODUCER_GROUP) or self.inner_producer_group,
            topic=topic,
            born_host=self.core.addr,
            # the target answers once its slaves hold the message (as RocketMQ's
            # waitStoreMsgOK): a master that is cut off may be fenced and cut back its
            # unreplicated tail, and an escape it answered before would be gone, while
            # we moved our progress past it (long campaign seed 1026: an acting slave's
            # half message, stored by a master partitioned outbound).  A slow copy makes
            # us retry; the escape id makes the repeat one store.
            no_replica_wait=False,
            member_escape=bool(escape_id),
            entries=[
                broker_pb2.SendEntry(
                    body=body, properties=props, born_ts_ms=born_ts_ms or 0, flag=flags
                )
            ],
        )
        failed: set[str] = set()
        refresh = False

        async def attempt() -> EscapeResult:
            nonlocal refresh, pinned
            if pinned is not None:
                target = pinned  # it may hold the message: only it can tell
            else:
                self._check_still_serving(kind)  # a retry comes seconds later
                queues = await self.routes.queues(topic, own, refresh=refresh)
                if not queues:
                    refresh = True
                    self._count(kind, "none", "no_target")
                    raise EscapeFailed(f"no writable master of another group for {topic}")
                target = choose(queues, failed)
            assert target.broker_name != own
            request.queue_id = target.queue_id
            try:
                resp = await self.core.pool.call_pb(
                    target.addr,
                    RequestCode.SEND_MESSAGE,
                    request,
                    broker_pb2.SendMessageResponse,
                    timeout_ms=cfg.escape_send_timeout_ms,
                )
            except (HaError, OSError) as exc:
                failed.add(target.addr)
                self._failed_at[target.addr] = time.monotonic()
                refresh = True
                self.routes.invalidate(topic)
                unknown = escape_id and (pinned is not None or outcome_unknown(exc))
                if unknown and pinned is None:
                    pinned = target
                    self.unknown_outcomes += 1
                self._count(kind, target.broker_name, "unknown" if unknown else "error")
                log.info(
                    "escape of a %s message to %s (%s) failed%s: %s",
                    kind,
                    target.broker_name,
                    target.addr,
                    "; it may be stored there, retrying there" if unknown else "",
                    exc,
                )
                raise
            if not resp.results:
                self._count(kind, target.broker_name, "error")
                raise EscapeFailed(f"{target.broker_name} returned no send result")
            if pinned is not None:
                pinned = None
                self.unknown_outcomes -= 1
            self._failed_at.pop(target.addr, None)
            self._count(kind, target.broker_name, "ok")
            r = resp.results[0]
            group = resp.broker_name or target.broker_name
            return EscapeResult(group, r.msg_id, r.queue_id, r.queue_offset, group)

        backoff = wait_exponential(
            multiplier=cfg.escape_backoff_initial_ms / 1000,
            min=cfg.escape_backoff_initial_ms / 1000,
            max=cfg.escape_backoff_max_ms / 1000,
        )

        def wait(state: RetryCallState) -> float:
            # a pinned escape waits for one target that stores a repeat once: asking
            # it often costs nothing, and its answer is what a returning master awaits
            seconds = backoff(state)
            return min(seconds, PINNED_BACKOFF_MAX_S) if pinned is not None else seconds

        retrying = AsyncRetrying(
            stop=stop_after_attempt(cfg.escape_max_attempts),
            wait=wait,
            retry=retry_if_exception(_retriable),
            sleep=self._backoff,
            reraise=True,
        )
        try:
            async for tried in retrying:
                with tried:
                    result = await attempt()
        except EscapeFailed:
            raise
        except (HaError, OSError) as exc:
            raise EscapeFailed(
                f"remote escape of a {kind} message for {topic} failed: {exc}"
            ) from exc
        finally:
            if pinned is not None:
                self.unknown_outcomes -= 1
                log.warning(
                    "escape %s to %s (%s): no answer after %d attempts; its fate is "
                    "unknown, and handing it on again may store it twice",
                    escape_id,
                    pinned.broker_name,
                    pinned.addr,
                    cfg.escape_max_attempts,
                )
        return result

    # ---- get --------------------------------------------------------------

    async def get_message(
        self, topic: str, broker_name: str, queue_id: int, offset: int
    ) -> StoredMessage | None:
        """The message at ``offset`` of ``topic``/``queue_id`` of group ``broker_name``.

        None when there is none; EscapeFailed (retriable) when the group cannot be asked.
        """
        local = self._local_core_of(broker_name)
        if local is not None:
            return local.store.get_message_at(topic, queue_id, offset)
        try:
            addrs = await self.routes.group_addrs(topic, broker_name)
        except (HaError, OSError) as exc:
            raise EscapeFailed(f"no route to {broker_name} for {topic}: {exc}") from exc
        addr = addrs.get(0) or (addrs[min(addrs)] if addrs else None)
        if addr is None:
            raise EscapeFailed(f"no address of {broker_name} is known")
        request = broker_pb2.PullMessageRequest(
            consumer_group=self.inner_consumer_group,
            topic=topic,
            queue_id=queue_id,
            queue_offset=offset,
            max_msg_nums=1,
            suspend_timeout_ms=0,
            commit_offset=-1,
        )
        try:
            resp = await self.core.pool.call_pb(
                addr,
                RequestCode.PULL_MESSAGE,
                request,
                broker_pb2.PullMessageResponse,
                timeout_ms=PULL_TIMEOUT_MS,
            )
        except (HaError, OSError) as exc:
            self.routes.invalidate(topic)
            raise EscapeFailed(f"pull from {broker_name} ({addr}) failed: {exc}") from exc
        if resp.status != broker_pb2.FOUND:
            return None
        for m in resp.messages:
            if m.queue_offset == offset:
                return message_from_pb(m)
        return None


__all__ = ["EscapeBridge", "EscapeResult"]
