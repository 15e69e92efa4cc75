"""LOCK_BATCH_MQ / UNLOCK_BATCH_MQ on a broker, with RIP-32 strict mode.

After RocketMQ's ``AdminBrokerProcessor.lockBatchMQ`` / ``unlockBatchMQ``,
with one deliberate difference:

* The broker that receives a lock request (the master, or the acting slave
  that the route shows as id 0; a plain slave answers ``NotMaster``) locks the
  queues in its own :class:`RebalanceLockManager` first.
* ``only_this_broker=true`` (how peers vote) or strict mode off: the local
  result is the answer.  Any member answers a vote, slaves included.
* Strict mode with ``total_replicas // 2 + 1 > 1``: the queues locked locally
  are sent to every other member of the group (``only_this_broker=true``,
  ``lock_peer_timeout_ms`` per peer, twice that for the round), and only the
  queues that a quorum of copies locked are granted.  A queue that misses
  quorum is released locally — RocketMQ keeps it, which would make this broker
  refuse the queue to everyone until the lock expires.  When fewer members
  than the quorum answered at all the request fails with ``QuorumNotReached``.
* Strict unlock removes the local lock and sends the unlock to every other
  member (awaited for at most one round, not fire-and-forget).

The locks live in memory only: a broker that restarts, or a slave that starts
acting, has never seen the locks granted elsewhere.  That is exactly the risk
strict mode covers, as long as a quorum of members remembers.  When every member
restarts at once (a power loss of the group or the cluster) none does, and a client
still trusts the lock it was granted for up to 30 s.  So a broker that votes for a
lock keeps the time of its last vote in a marker (``lock_votes.json`` in its store,
synced before the vote is answered, at most once a second, the time a second ahead);
one that starts within one lock lifetime (``lock_max_live_time_ms``, never below the
clients' 30 s) of that time does not count its own vote until the lifetime is over:
as a peer it answers that it locked nothing, as the locking broker it needs a quorum of
peers without itself.  A restart of one member changes nothing (the others remember);
a restart of every member grants no lock until one lifetime after the last vote.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Protocol, TypeVar

from broker_agent.locks.manager import MessageQueueKey, RebalanceLockManager, quorum_grant
from broker_agent.membership.acting import ActingState
from broker_agent.metadata.json_table import (
    TableUnreadable,
    read_json_checked,
    write_json_atomic,
)
from broker_agent.metrics import BrokerMetrics
from ha_controller.config import BrokerConfig
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    BadRequest,
    BrokerIsolated,
    HaError,
    NotMaster,
    QuorumNotReached,
)
from ha_controller.routing import BrokerMemberGroup
from ha_controller.rpc import ConnectionPool, Dispatcher, RequestContext

__all__ = ["LockCore", "LockService", "mq_from_pb", "mq_to_pb"]

log = logging.getLogger(__name__)

R = TypeVar("R", broker_pb2.LockBatchResponse, common_pb2.Empty)

# Forget expired lock entries at most this often (on the request path, no task).
EXPIRE_SWEEP_INTERVAL_MS = 10_000
# The vote marker holds a time this far ahead, so that it is written at most this often.
VOTE_MARK_AHEAD_MS = 1_000


class LockCore(Protocol):
    """What the lock service reads of its broker (``BrokerCore`` fits)."""

    @property
    def cfg(self) -> BrokerConfig: ...

    @property
    def acting(self) -> ActingState: ...

    @property
    def isolated(self) -> bool: ...

    @property
    def pool(self) -> ConnectionPool: ...

    @property
    def metrics(self) -> BrokerMetrics: ...

    @property
    def member_group(self) -> BrokerMemberGroup | None: ...


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def wall_ms() -> int:
    return int(time.time() * 1000)


def mq_from_pb(pb: broker_pb2.MessageQueue) -> MessageQueueKey:
    if not pb.topic:
        raise BadRequest("message queue without a topic")
    if pb.queue_id < 0:
        raise BadRequest(f"message queue {pb.topic}: queue id {pb.queue_id} < 0")
    return MessageQueueKey(pb.topic, pb.broker_name, pb.queue_id)


def mq_to_pb(mq: MessageQueueKey) -> broker_pb2.MessageQueue:
    return broker_pb2.MessageQueue(topic=mq.topic, broker_name=mq.broker_name, queue_id=mq.queue_id)


def _result(requested: int, granted: int) -> str:
    if granted == requested:
        return "granted"
    return "partial" if granted else "refused"


class LockService:
    """Queue locks of one broker; register with :meth:`register`."""

    def __init__(
        self,
        host: LockCore,
        fetch_member_group: Callable[[], Awaitable[BrokerMemberGroup | None]],
        *,
        clock: Callable[[], int] = monotonic_ms,
        marker: Path | None = None,
        wall: Callable[[], int] = wall_ms,
    ) -> None:
        """``fetch_member_group`` asks a nameserver for the group when the broker does
        not know it yet (``MemberGroupSync.fetch_member_group``); ``marker`` is the file
        that says until when an earlier run voted for locks (None: nothing is remembered),
        ``wall`` the wall clock (ms) its time is read on."""
        self._host = host
        self._fetch_member_group = fetch_member_group
        cfg = host.cfg
        self.strict = cfg.lock_in_strict_mode
        self.quorum = cfg.lock_quorum
        self.peer_timeout_ms = cfg.lock_peer_timeout_ms
        self.round_timeout_s = 2 * cfg.lock_peer_timeout_ms / 1000
        self.manager = RebalanceLockManager(clock, cfg.lock_max_live_time_ms)
        self._clock = clock
        self._last_sweep_ms = clock()
        self._marker = marker
        self._wall = wall
        #: the vote time the marker covers (wall ms): votes before it need no write
        self._covered_ms = 0
        #: strict mode: until then (clock ms) this broker's own vote does not count
        self.forgets_until_ms = 0
        if self.strict and marker is not None:
            forgets_ms = self._forgotten_ms(marker, cfg.lock_max_live_time_ms)
            if forgets_ms > 0:
                self.forgets_until_ms = clock() + forgets_ms
                log.warning(
                    "queue locks: an earlier run of this broker voted for locks it no longer "
                    "knows (%s): its own vote does not count for %d ms, until every lock it "
                    "may have granted expired",
                    marker,
                    forgets_ms,
                )

    def _forgotten_ms(self, marker: Path, lease_ms: int) -> int:
        """How long the locks an earlier run voted for may still be trusted: one lease
        after its last vote (the marker's time), never more than one lease from now (a
        clock that went back); a whole lease when the marker cannot be read."""
        try:
            last_vote_ms = int(read_json_checked(marker)["lastVoteMs"])
        except FileNotFoundError:
            return 0
        except (OSError, TableUnreadable, KeyError, ValueError, TypeError) as exc:
            log.warning("%s cannot be read (%s): taken as a vote just now", marker, exc)
            return lease_ms
        return max(0, min(lease_ms, last_vote_ms + lease_ms - self._wall()))

    def register(self, dispatcher: Dispatcher) -> None:
        dispatcher.add(RequestCode.LOCK_BATCH_MQ, broker_pb2.LockBatchRequest, self.lock_batch)
        dispatcher.add(RequestCode.UNLOCK_BATCH_MQ, broker_pb2.LockBatchRequest, self.unlock_batch)

    # ---- handlers ---------------------------------------------------------------------

    async def lock_batch(
        self, ctx: RequestContext, req: broker_pb2.LockBatchRequest
    ) -> broker_pb2.LockBatchResponse:
        group, client_id, mqs = self._parse(req)
        if not req.only_this_broker:
            self._check_serves_locks("LOCK_BATCH_MQ")
        self._sweep()
        forgets = self.forgets()
        if req.only_this_broker and forgets:
            mode = "peer"
            granted: set[MessageQueueKey] = set()  # a vote that does not count
        else:
            self_locked = self.manager.try_lock_batch(group, mqs, client_id)
            if req.only_this_broker:
                mode = "peer"
                granted = self_locked
            elif not self.strict or (self.quorum <= 1 and not forgets):
                mode = "local"
                granted = self_locked
            else:
                mode = "strict"
                try:
                    granted = await self._quorum_lock(
                        group, client_id, self_locked, own_vote=not forgets
                    )
                except QuorumNotReached:
                    self._count(mode, "no_quorum")
                    raise
            if granted and not self._remember_voting():
                self.manager.release(group, granted, client_id)
                granted = set()
        self._count(mode, _result(len(mqs), len(granted)))
        return broker_pb2.LockBatchResponse(locked=[mq_to_pb(mq) for mq in sorted(granted)])

    async def unlock_batch(
        self, ctx: RequestContext, req: broker_pb2.LockBatchRequest
    ) -> common_pb2.Empty:
        group, client_id, mqs = self._parse(req)
        if not req.only_this_broker:
            self._check_serves_locks("UNLOCK_BATCH_MQ")
        unlocked = self.manager.unlock_batch(group, mqs, client_id)
        log.debug(
            "unlocked %d of %d queue(s) of %s for %s", len(unlocked), len(mqs), group, client_id
        )
        if self.strict and not req.only_this_broker and mqs:
            vote = broker_pb2.LockBatchRequest(
                consumer_group=group,
                client_id=client_id,
                mqs=[mq_to_pb(mq) for mq in sorted(mqs)],
                only_this_broker=True,
            )
            peers = await self._peers()
            await self._round(peers, RequestCode.UNLOCK_BATCH_MQ, vote, common_pb2.Empty)
        return common_pb2.Empty()

    # ---- strict mode ------------------------------------------------------------------

    def forgets(self) -> bool:
        """Strict mode, started with the marker: this broker's own vote does not count
        yet."""
        return self._clock() < self.forgets_until_ms

    def _remember_voting(self) -> bool:
        """Make sure the marker covers this vote before it is answered: it holds a time
        no earlier than any vote of this run, written (and synced) at most once per
        ``VOTE_MARK_AHEAD_MS``.  False when it cannot be written (the vote is withdrawn)."""
        if self._marker is None:
            return True
        now = self._wall()
        if now < self._covered_ms:
            return True
        covered = now + VOTE_MARK_AHEAD_MS
        try:
            write_json_atomic(self._marker, {"lastVoteMs": covered})
        except OSError as exc:
            log.error("cannot write %s: %s; no lock is granted", self._marker, exc)
            return False
        self._covered_ms = covered
        return True

    async def _quorum_lock(
        self,
        group: str,
        client_id: str,
        self_locked: set[MessageQueueKey],
        *,
        own_vote: bool = True,
    ) -> set[MessageQueueKey]:
        if not self_locked:
            return set()
        peers = await self._peers()
        vote = broker_pb2.LockBatchRequest(
            consumer_group=group,
            client_id=client_id,
            mqs=[mq_to_pb(mq) for mq in sorted(self_locked)],
            only_this_broker=True,
        )
        answers = await self._round(
            peers, RequestCode.LOCK_BATCH_MQ, vote, broker_pb2.LockBatchResponse
        )
        peer_locked = [{mq_from_pb(pb) for pb in answer.locked} for answer in answers.values()]
        total = self._host.cfg.total_replicas
        granted = quorum_grant(self_locked, peer_locked, total, own_vote=own_vote)
        missed = self_locked - granted
        if missed:
            self.manager.release(group, missed, client_id)
        voters = 1 + len(answers)
        if voters < self.quorum:
            log.warning(
                "lock of %d queue(s) of %s for %s: %d of %d member(s) answered, quorum %d",
                len(self_locked),
                group,
                client_id,
                voters,
                total,
                self.quorum,
            )
            raise QuorumNotReached(
                f"{self._host.cfg.broker_name}: {voters} of {total} member(s) answered the lock "
                f"round, {self.quorum} needed"
            )
        return granted

    async def _peers(self) -> dict[int, str]:
        """The other members of this broker's group (raw ids from the nameserver)."""
        group = self._host.member_group
        if group is None or not group.broker_addrs:
            group = await self._fetch_member_group()
        if group is None:
            return {}
        me = self._host.cfg.broker_id
        return {bid: addr for bid, addr in group.broker_addrs.items() if bid != me}

    async def _round(
        self,
        peers: Mapping[int, str],
        method: int,
        request: broker_pb2.LockBatchRequest,
        response_type: type[R],
    ) -> dict[int, R]:
        """Send ``request`` to every peer at once; the answers that came in time.

        Each call is bounded by ``lock_peer_timeout_ms`` (connect included) and
        the round by twice that.  A peer that fails or is late simply does not vote.
        """
        answers: dict[int, R] = {}

        async def ask(broker_id: int, addr: str) -> None:
            try:
                async with asyncio.timeout(self.peer_timeout_ms / 1000):
                    answers[broker_id] = await self._host.pool.call_pb(
                        addr, method, request, response_type, self.peer_timeout_ms
                    )
            except (HaError, OSError, TimeoutError) as exc:
                log.info("lock peer %d at %s did not answer: %r", broker_id, addr, exc)

        if not peers:
            return answers
        try:
            async with asyncio.timeout(self.round_timeout_s), asyncio.TaskGroup() as tg:
                for broker_id, addr in sorted(peers.items()):
                    tg.create_task(ask(broker_id, addr), name=f"lock-peer-{broker_id}")
        except TimeoutError:
            log.warning("lock round timed out after %.1f s", self.round_timeout_s)
        return answers

    # ---- helpers ----------------------------------------------------------------------

    def _parse(self, req: broker_pb2.LockBatchRequest) -> tuple[str, str, list[MessageQueueKey]]:
        if not req.consumer_group:
            raise BadRequest("lock request without a consumer group")
        if not req.client_id:
            raise BadRequest("lock request without a client id")
        return req.consumer_group, req.client_id, [mq_from_pb(pb) for pb in req.mqs]

    def _check_serves_locks(self, what: str) -> None:
        host = self._host
        name = f"{host.cfg.broker_name}/{host.cfg.broker_id}"
        if host.isolated:
            raise BrokerIsolated(f"{what}: {name} is in pre-online")
        if not host.acting.serves_master_only_ops:
            raise NotMaster(f"{what}: {name} is a slave and not acting")

    def _sweep(self) -> None:
        now = self._clock()
        if now - self._last_sweep_ms >= EXPIRE_SWEEP_INTERVAL_MS:
            self._last_sweep_ms = now
            self.manager.expire()

    def _count(self, mode: str, result: str) -> None:
        metrics = self._host.metrics
        metrics.lock_requests.labels(**metrics.ident, mode=mode, result=result).inc()

    def held(self, group: str) -> dict[MessageQueueKey, str]:
        """Live local locks of ``group`` (queue -> client id), for status and tests."""
        return self.manager.holders(group)
