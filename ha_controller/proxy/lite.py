"""Lite topics (RocketMQ 5.5's RIP-83), a bounded first version: SyncLiteSubscription
and the lite subscription table.

A lite topic is a key under a parent topic of type LITE (``hactl topic create T
--message-type LITE``): a LITE message carries it (v2 ``lite_topic`` ->
``__LITE_TOPIC``) and is stored in one of the parent topic's queues, the one its lite
topic hashes to (as a FIFO message group's), so a lite topic's messages keep their
order.  Nothing is kept per lite topic in the store: any number of lite topics cost
nothing there.

What a lite consumer (LITE_PUSH_CONSUMER, LITE_SIMPLE_CONSUMER) subscribes lives in the
gateway that serves it (:class:`LiteSubscriptions`, bounded per client and in total); a
lite consumer's receive pops the parent topic with the broker's orderly POP (one batch
per queue at a time: per-lite-topic order) and a lite filter naming the lite topics its
group subscribes here, so that a message of another lite topic never crosses the wire
(the group's offset moves past it).  docs/grpc.md "Lite topics" says how this differs
from RocketMQ.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import grpc

from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s
from ha_controller.protocol.errors import BadRequest, IllegalTopic, LiteSubscriptionQuotaExceeded
from ha_controller.protocol.topics import TopicMessageType
from ha_controller.protocol.validation import check_consumer_group, check_lite_topic, check_topic
from ha_controller.proxy import convert
from ha_controller.proxy.core import GatewayCore
from ha_controller.proxy.limits import client_id

log = logging.getLogger(__name__)

__all__ = ["LITE_CLIENT_TYPES", "LiteService", "LiteSubscriptions", "Subscriber"]

#: the v2 client types that subscribe lite topics
LITE_CLIENT_TYPES: Final = frozenset({v2.LITE_PUSH_CONSUMER, v2.LITE_SIMPLE_CONSUMER})

#: (consumer group, parent topic)
Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Subscriber:
    """Who subscribes: one client's subscriptions for one group and parent topic."""

    client_id: str
    group: str
    topic: str


@dataclass(slots=True)
class _Group:
    """A group's lite topics under one parent topic: each with how many of the group's
    clients subscribe it, and the set a pop carries (made again after a change)."""

    counts: dict[str, int] = field(default_factory=dict)
    frozen: frozenset[str] | None = None


class LiteSubscriptions:
    """Which lite topics each client subscribes, per consumer group and parent topic, as
    a plain object (no I/O).

    Bounds (typed refusal :class:`LiteSubscriptionQuotaExceeded`, nothing applied):
    ``client_quota`` lite topics per client, group and parent topic (RocketMQ's
    ``lite.sub.client.quota``, told to the SDKs in their settings), and ``max_total``
    subscriptions — (client, lite topic) pairs — in the whole table (RocketMQ's broker
    ``maxLiteSubscriptionCount``)."""

    def __init__(self, *, client_quota: int, max_total: int) -> None:
        if client_quota < 1 or max_total < 1:
            raise ValueError("lite subscription bounds must be at least 1")
        self.client_quota = client_quota
        self.max_total = max_total
        self._subs: dict[Subscriber, set[str]] = {}
        self._by_client: dict[str, set[Subscriber]] = {}
        self._groups: dict[Key, _Group] = {}
        self._total = 0

    def __len__(self) -> int:
        """Subscriptions held: (client, group, parent topic, lite topic) entries."""
        return self._total

    def of(self, sub: Subscriber) -> frozenset[str]:
        return frozenset(self._subs.get(sub, ()))

    def sync(self, sub: Subscriber, action: int, names: Iterable[str]) -> int:
        """Apply a SyncLiteSubscription ``action`` (v2 ``LiteSubscriptionAction``) of
        ``names`` for ``sub``; the client's count afterwards.  PARTIAL_ADD adds,
        PARTIAL_REMOVE removes, COMPLETE_ADD replaces the client's set (the SDKs resend
        theirs every 30 s), COMPLETE_REMOVE drops it.  Beyond a bound nothing changes;
        the work is in the names given, not in the client's set."""
        old = self._subs.get(sub, set())
        given = set(names)
        if action == v2.PARTIAL_ADD:
            added, removed = given - old, set()
        elif action == v2.PARTIAL_REMOVE:
            added, removed = set(), given & old
        elif action == v2.COMPLETE_ADD:
            added, removed = given - old, old - given
        elif action == v2.COMPLETE_REMOVE:
            added, removed = set(), set(old)
        else:
            raise BadRequest(f"unknown lite subscription action {action}")
        count = len(old) + len(added) - len(removed)
        if len(added) > len(removed):
            if count > self.client_quota:
                raise LiteSubscriptionQuotaExceeded(
                    f"lite subscription quota exceeded: {self.client_quota} per client "
                    f"(client {sub.client_id} would have {count} under {sub.topic})"
                )
            if self._total + len(added) - len(removed) > self.max_total:
                raise LiteSubscriptionQuotaExceeded(
                    f"lite subscription quota exceeded: the gateway holds {self._total} of "
                    f"max_lite_subscriptions {self.max_total}"
                )
        self._change(sub, added, removed)
        return count

    def drop_client(self, cid: str) -> int:
        """Forget every subscription of client ``cid`` (it terminated or expired, as
        RocketMQ drops a lite client's subscriptions when it goes offline); how many."""
        dropped = 0
        for sub in list(self._by_client.get(cid, ())):
            old = set(self._subs.get(sub, ()))
            dropped += len(old)
            self._change(sub, set(), old)
        return dropped

    def keys_of(self, cid: str) -> set[Key]:
        """The (group, parent topic) pairs client ``cid`` subscribes lite topics of."""
        return {(s.group, s.topic) for s in self._by_client.get(cid, ())}

    def group_topics(self, group: str, topic: str) -> frozenset[str]:
        """The lite topics some client of ``group`` subscribes under ``topic``: what a
        pop of the group lets through."""
        g = self._groups.get((group, topic))
        if g is None:
            return frozenset()
        if g.frozen is None:
            g.frozen = frozenset(g.counts)
        return g.frozen

    def _change(self, sub: Subscriber, added: set[str], removed: set[str]) -> None:
        if not added and not removed:
            return
        key = (sub.group, sub.topic)
        g = self._groups.setdefault(key, _Group())
        for name in removed:
            n = g.counts[name] - 1
            if n:
                g.counts[name] = n
            else:
                del g.counts[name]
        for name in added:
            g.counts[name] = g.counts.get(name, 0) + 1
        g.frozen = None
        if not g.counts:
            del self._groups[key]
        self._total += len(added) - len(removed)
        mine = self._subs.setdefault(sub, set())
        mine -= removed
        mine |= added
        if mine:
            self._by_client.setdefault(sub.client_id, set()).add(sub)
            return
        del self._subs[sub]
        subs = self._by_client.get(sub.client_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._by_client[sub.client_id]


class LiteService:
    """SyncLiteSubscription, and what receives ask of the table."""

    def __init__(self, core: GatewayCore) -> None:
        self.core = core
        cfg = core.cfg
        self.table = LiteSubscriptions(
            client_quota=cfg.lite_subscription_quota, max_total=cfg.max_lite_subscriptions
        )
        #: (group, topic) -> set when its lite topics change (receives waiting for one)
        self._changed: dict[Key, asyncio.Event] = {}

    async def sync(
        self, request: v2s.SyncLiteSubscriptionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> v2s.SyncLiteSubscriptionResponse:
        core = self.core
        cid = client_id(context)
        if not cid:
            core.count("SyncLiteSubscription", v2.CLIENT_ID_REQUIRED)
            return v2s.SyncLiteSubscriptionResponse(
                status=convert.status(v2.CLIENT_ID_REQUIRED, "x-mq-client-id is required")
            )

        async def work() -> v2s.SyncLiteSubscriptionResponse:
            topic, group = request.topic.name, request.group.name
            check_topic(topic)
            check_consumer_group(group)
            names = list(request.lite_topic_set)
            if request.HasField("offset_option"):
                # accepted, not applied (docs/grpc.md "Lite topics"): nothing is stored
                # per lite topic, so a lite subscription starts where its group is in
                # the parent topic's queues, whatever start the client asks for
                log.warning(
                    "client %s: offset option %s of %s/%s not applied: the lite "
                    "subscription starts where the group is in the parent topic's queues",
                    cid,
                    request.offset_option.WhichOneof("offset_type"),
                    group,
                    topic,
                )
            for name in names:
                check_lite_topic(name, core.cfg.max_lite_topic_bytes)
            if request.action != v2.COMPLETE_REMOVE:
                await core.route(topic)  # TOPIC_NOT_FOUND for a topic that does not exist
                kind = await core.topic_type(topic)
                if kind not in (TopicMessageType.LITE, TopicMessageType.MIXED):
                    raise IllegalTopic(
                        f"topic {topic!r} is {kind.value}: lite topics need a LITE parent topic "
                        f"(hactl topic create {topic} --message-type LITE)"
                    )
            core.sessions.get(cid)  # a lite consumer's syncs keep it alive
            sub = Subscriber(cid, group, topic)
            before = self.table.group_topics(group, topic)
            count = self.table.sync(sub, request.action, names)
            if self.table.group_topics(group, topic) != before:
                self._wake((group, topic))
            core.metrics.lite_subscriptions.set(len(self.table))
            log.debug(
                "client %s: %s %d lite topic(s) of %s/%s, %d now",
                cid,
                v2.LiteSubscriptionAction.Name(request.action),
                len(names),
                group,
                topic,
                count,
            )
            return v2s.SyncLiteSubscriptionResponse(status=convert.status())

        return await core.answer("SyncLiteSubscription", v2s.SyncLiteSubscriptionResponse, work)

    def drop_client(self, cid: str) -> int:
        """A client is gone: its lite subscriptions with it."""
        keys = self.table.keys_of(cid)
        dropped = self.table.drop_client(cid)
        for key in keys:
            self._wake(key)
        self.core.metrics.lite_subscriptions.set(len(self.table))
        return dropped

    def group_topics(self, group: str, topic: str) -> frozenset[str]:
        return self.table.group_topics(group, topic)

    async def wait_change(self, group: str, topic: str, timeout_s: float) -> None:
        """Until ``group``'s lite topics under ``topic`` change, or ``timeout_s``."""
        if timeout_s <= 0:
            return
        event = self._changed.setdefault((group, topic), asyncio.Event())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await event.wait()

    def _wake(self, key: Key) -> None:
        event = self._changed.pop(key, None)
        if event is not None:
            event.set()
