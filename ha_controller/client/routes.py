"""The client's route cache: periodic refresh plus a route watch per topic.

RocketMQ clients poll the nameserver every 30 s; here each topic also holds a
route watch (a long poll on the route version, which RocketMQ has not) so that a
failover reaches the client within milliseconds.  The derived views follow
``MQClientInstance.topicRouteData2TopicPublishInfo`` / ``...SubscribeInfo``:
producers only use writable queues of groups that show an id 0, so a group
whose master is away (the nameserver shows its acting slave as a read-only
id 0) gets no sends, while consumers keep reading, locking and committing
through the id-0 address (docs/failover.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

from ha_controller.client.admin import NameserverClient
from ha_controller.client.lifecycle import AsyncLifecycle
from ha_controller.client.message import MessageQueue
from ha_controller.protocol.errors import HaError, TopicNotFound, UnknownMethod
from ha_controller.protocol.properties import AUTO_CREATE_TOPIC
from ha_controller.routing import MASTER_ID, BrokerData, Perm, QueueData, TopicRouteData

__all__ = [
    "AUTO_CREATE_TOPIC",
    "RouteCache",
    "RouteListener",
    "addr_for_publish",
    "addr_for_subscribe",
    "fifo_queues_of",
    "parse_namesrv_addrs",
    "publish_queues_of",
    "subscribe_queues_of",
]

log = logging.getLogger(__name__)

#: Queues a producer assumes for a topic the brokers will auto-create.
DEFAULT_TOPIC_QUEUE_NUMS: Final = 4
#: how long a group shown only under older epochs than one seen is kept at the newer
OLDER_EPOCH_ACCEPT_S: Final = 60.0

RouteListener = Callable[[str, TopicRouteData], None]
"""Called with (topic, new route) whenever a cached route changes."""


def parse_namesrv_addrs(addrs: str | Sequence[str]) -> list[str]:
    """``"h:p;h:p"``, ``"h:p,h:p"`` or a list, as RocketMQ users write them."""
    items = [addrs] if isinstance(addrs, str) else list(addrs)
    out = [a.strip() for item in items for a in item.replace(";", ",").split(",") if a.strip()]
    if not out:
        raise ValueError("at least one nameserver address is needed")
    return out


# --- pure derived views ------------------------------------------------------


def addr_for_publish(broker: BrokerData | None) -> str | None:
    """The id-0 address (the master, or the acting slave the route shows as id 0)."""
    return None if broker is None else broker.broker_addrs.get(MASTER_ID)


def addr_for_subscribe(broker: BrokerData | None) -> str | None:
    """The id-0 address if present, else the lowest live id."""
    if broker is None or not broker.broker_addrs:
        return None
    addr = broker.broker_addrs.get(MASTER_ID)
    return addr if addr is not None else broker.broker_addrs[min(broker.broker_addrs)]


def publish_queues_of(route: TopicRouteData) -> list[MessageQueue]:
    """Write queues of writable groups that show an id 0, by (broker_name, queue_id)."""
    out: list[MessageQueue] = []
    for qd in route.queue_datas:
        if not Perm.is_writeable(qd.perm) or addr_for_publish(route.broker(qd.broker_name)) is None:
            continue
        out.extend(MessageQueue(route.topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
    out.sort(key=lambda mq: (mq.broker_name, mq.queue_id))
    return out


def fifo_queues_of(route: TopicRouteData) -> list[MessageQueue]:
    """The queues a message group is hashed over: the write queues of every group that
    takes writes now *or* has only lost its master for a while (no id 0, or a slave
    acting as a read-only id 0), by (broker_name, queue_id).

    Unlike :func:`publish_queues_of` this list does not shrink when a master fails, so a
    message group keeps its queue through a failover and its order holds: its sends
    fail until the group writes again instead of going to another group's queue,
    where a consumer could read them before the older ones still waiting on the first
    queue.  A group whose write bit an operator removed while it has a master (a
    drain) leaves the list, and its message groups move."""
    out: list[MessageQueue] = []
    for qd in route.queue_datas:
        broker = route.broker(qd.broker_name)
        if broker is None or not broker.broker_addrs:
            continue
        failing_over = addr_for_publish(broker) is None or broker.enable_acting_master
        if not (Perm.is_writeable(qd.perm) or failing_over):
            continue
        out.extend(MessageQueue(route.topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
    out.sort(key=lambda mq: (mq.broker_name, mq.queue_id))
    return out


def subscribe_queues_of(route: TopicRouteData) -> list[MessageQueue]:
    """Read queues of readable groups, by (broker_name, queue_id)."""
    out: list[MessageQueue] = []
    for qd in route.queue_datas:
        if Perm.is_readable(qd.perm):
            out.extend(
                MessageQueue(route.topic, qd.broker_name, i) for i in range(qd.read_queue_nums)
            )
    out.sort(key=lambda mq: (mq.broker_name, mq.queue_id))
    return out


def _default_route(topic: str, template: TopicRouteData) -> TopicRouteData:
    """The route a producer uses for a topic that brokers will auto-create (RocketMQ's TBW102)."""
    queues = [
        QueueData(
            qd.broker_name,
            min(DEFAULT_TOPIC_QUEUE_NUMS, qd.read_queue_nums),
            min(DEFAULT_TOPIC_QUEUE_NUMS, qd.write_queue_nums),
            qd.perm,
        )
        for qd in template.queue_datas
        if Perm.is_writeable(qd.perm)
    ]
    names = {qd.broker_name for qd in queues}
    brokers = [b.clone() for b in template.broker_datas if b.broker_name in names]
    return TopicRouteData(topic, brokers, queues)


# --- the cache ---------------------------------------------------------------


class RouteCache(AsyncLifecycle):
    """Topic routes fetched on first use, refreshed every ``refresh_interval_s``
    and watched (long poll) so that changes arrive at once.

    Background loops are tasks the cache tracks; ``aclose()`` cancels and
    awaits them.  The cache does not own ``nameserver``.
    """

    def __init__(
        self,
        nameserver: NameserverClient,
        *,
        refresh_interval_s: float = 30.0,
        watch: bool = True,
        watch_max_wait_ms: int = 30_000,
        watch_backoff_s: tuple[float, float] = (0.1, 5.0),
        owner: str = "",
    ) -> None:
        #: who uses the cache (``"producer G"``, ``"consumer G"``), named in its log lines
        self.owner = owner
        self.nameserver = nameserver
        self.refresh_interval_s = refresh_interval_s
        self.watch_enabled = watch
        self.watch_max_wait_ms = watch_max_wait_ms
        self._backoff_min_s, self._backoff_max_s = watch_backoff_s
        self._routes: dict[str, TopicRouteData] = {}
        self._publish: dict[str, list[MessageQueue]] = {}
        self._fifo: dict[str, list[MessageQueue]] = {}
        self._brokers: dict[str, BrokerData] = {}
        #: controller mode: the highest epoch seen per group (routes never go back)
        self._epochs: dict[str, int] = {}
        #: since when only older epochs were shown for a group (monotonic seconds)
        self._older_since: dict[str, float] = {}
        self._versions: dict[str, str] = {}
        self._defaulted: set[str] = set()
        self._fetch_locks: dict[str, asyncio.Lock] = {}
        self._listeners: list[RouteListener] = []
        self._watches: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._refresher: asyncio.Task[None] | None = None
        self._closed = False

    # ---- views --------------------------------------------------------------

    def cached(self, topic: str) -> TopicRouteData | None:
        return self._routes.get(topic)

    def topics(self) -> list[str]:
        return sorted(self._routes)

    def publish_queues(self, topic: str) -> list[MessageQueue]:
        """Write queues a producer may use; empty when the route is not known.

        Derived once per route version (``update`` drops it) and shared by every
        send: callers must not modify the list."""
        return self._derived(self._publish, topic, publish_queues_of)

    def fifo_queues(self, topic: str) -> list[MessageQueue]:
        """The queues message groups are hashed over (:func:`fifo_queues_of`); empty
        when the route is not known.  Cached like :meth:`publish_queues`."""
        return self._derived(self._fifo, topic, fifo_queues_of)

    def _derived(
        self,
        cache: dict[str, list[MessageQueue]],
        topic: str,
        derive: Callable[[TopicRouteData], list[MessageQueue]],
    ) -> list[MessageQueue]:
        queues = cache.get(topic)
        if queues is None:
            route = self._routes.get(topic)
            if route is None:
                return []
            queues = cache[topic] = derive(route)
        return queues

    def subscribe_queues(self, topic: str) -> list[MessageQueue]:
        """Read queues a consumer may pull; empty when the route is not known."""
        route = self._routes.get(topic)
        return [] if route is None else subscribe_queues_of(route)

    def broker(self, broker_name: str) -> BrokerData | None:
        """The group as the most recently received route showed it."""
        return self._brokers.get(broker_name)

    def brokers(self) -> list[BrokerData]:
        return [self._brokers[name] for name in sorted(self._brokers)]

    def broker_addr_for_publish(self, broker_name: str) -> str | None:
        return addr_for_publish(self._brokers.get(broker_name))

    def broker_addr_for_subscribe(self, broker_name: str) -> str | None:
        return addr_for_subscribe(self._brokers.get(broker_name))

    def topic_broker_addrs(self, topic: str) -> list[str]:
        """Every address (all ids) of every group in the topic's route."""
        route = self._routes.get(topic)
        if route is None:
            return []
        return sorted({a for b in route.broker_datas for a in b.broker_addrs.values()})

    def is_default_route(self, topic: str) -> bool:
        """True while the topic's route is the auto-create stand-in."""
        return topic in self._defaulted

    # ---- listeners ------------------------------------------------------------

    def on_change(self, listener: RouteListener) -> Callable[[], None]:
        """Call ``listener(topic, route)`` on every route change; returns an unsubscribe."""
        self._listeners.append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return remove

    def update(self, route: TopicRouteData, *, default: bool = False) -> bool:
        """Store ``route``; returns True (and tells listeners) when it changed.

        A real route replaces an auto-create stand-in; a stand-in never replaces
        a real route.
        """
        topic = route.topic
        if default and topic in self._routes and topic not in self._defaulted:
            return False
        route = self._fenced(route)
        if default:
            self._defaulted.add(topic)
        else:
            self._defaulted.discard(topic)
        if self._routes.get(topic) == route:
            return False
        self._routes[topic] = route
        self._publish.pop(topic, None)
        self._fifo.pop(topic, None)
        for broker in route.broker_datas:
            self._brokers[broker.broker_name] = broker
        log.info(
            "route of %s%s: %s",
            topic,
            f" ({self.owner})" if self.owner else "",
            "; ".join(
                f"{b.broker_name} {dict(sorted(b.broker_addrs.items()))}"
                for b in route.broker_datas
            ),
        )
        for listener in list(self._listeners):
            try:
                listener(topic, route)
            except Exception:
                log.exception("route listener failed for topic %s", topic)
        return True

    def _fenced(self, route: TopicRouteData) -> TopicRouteData:
        """``route`` with every group shown under an older epoch than one seen before
        replaced by the newer one: a nameserver that has not yet heard of a master
        switch must not send writes back to the old master.  Older epochs shown for
        :data:`OLDER_EPOCH_ACCEPT_S` on end are taken (the controller's state was reset).
        """
        kept: list[BrokerData] = []
        changed = False
        now = time.monotonic()
        for broker in route.broker_datas:
            name, epoch = broker.broker_name, broker.epoch
            if epoch is None:
                kept.append(broker)
                continue
            known = self._epochs.get(name, epoch)
            newer = self._brokers.get(name)
            if epoch < known and newer is not None:
                since = self._older_since.setdefault(name, now)
                if now - since < OLDER_EPOCH_ACCEPT_S:
                    log.info(
                        "route of %s: %s shown in epoch %d, seen in epoch %d: kept the newer",
                        route.topic,
                        name,
                        epoch,
                        known,
                    )
                    kept.append(newer)
                    changed = True
                    continue
                log.warning(
                    "route of %s: %s shown only in epoch %d for %.0f s after epoch %d: "
                    "taken (the controller's state was reset?)",
                    route.topic,
                    name,
                    epoch,
                    now - since,
                    known,
                )
                known = epoch
            self._older_since.pop(name, None)
            self._epochs[name] = epoch
            kept.append(broker)
        if not changed:
            return route
        return TopicRouteData(route.topic, kept, list(route.queue_datas))

    # ---- fetching ----------------------------------------------------------------

    async def route(self, topic: str, *, allow_default: bool = False) -> TopicRouteData:
        """The cached route, fetched (and then watched) on first use.

        Raises ``TopicNotFound`` when the nameserver does not know the topic.
        With ``allow_default`` a producer gets a stand-in route instead (built
        from ``TBW102`` or, failing that, from the groups with a master), so
        that the first send makes the brokers auto-create the topic.
        """
        cached = self._routes.get(topic)
        if cached is not None:
            return cached
        self._check_open()
        lock = self._fetch_locks.setdefault(topic, asyncio.Lock())
        async with lock:
            cached = self._routes.get(topic)
            if cached is not None:
                return cached
            try:
                route = await self._fetch(topic)
            except TopicNotFound:
                if not allow_default:
                    raise
                try:
                    stand_in = await self._stand_in(topic)
                except (HaError, OSError) as exc:
                    log.debug("no auto-create route for %s: %s", topic, exc)
                    stand_in = None
                if stand_in is None:
                    raise
                log.info("topic %s is unknown to the nameserver; sending to auto-create it", topic)
                self.update(stand_in, default=True)
                self.watch(topic)
                return self._routes[topic]
            self.update(route)
            self.watch(topic)
            return self._routes[topic]

    async def refresh(self, topic: str) -> TopicRouteData | None:
        """Fetch the topic's route now; None (keeping the cached one) when unknown."""
        self._check_open()
        try:
            route = await self._fetch(topic)
        except TopicNotFound:
            return None
        self.update(route)
        return route

    async def _fetch(self, topic: str) -> TopicRouteData:
        """The topic's route from the nameservers.  A nameserver that answers "no route"
        may have just restarted or resumed and not yet heard every broker's next full
        registration; like RocketMQ's clients, ask each other configured nameserver
        before believing it (one that times out is skipped already)."""
        try:
            return await self.nameserver.route(topic)
        except TopicNotFound:
            addrs = self.nameserver.addrs
            for addr in addrs if len(addrs) > 1 else []:
                one = NameserverClient([addr], self.nameserver.pool)
                try:
                    route = await one.route(topic)
                except (HaError, OSError) as exc:
                    log.debug("route of %s from nameserver %s: %s", topic, addr, exc)
                    continue
                log.info("route of %s: nameserver %s had it, another did not", topic, addr)
                return route
            raise

    async def refresh_quietly(self, topic: str) -> None:
        """``refresh`` that logs instead of raising (after a send or pull failed)."""
        try:
            await self.refresh(topic)
        except (HaError, OSError) as exc:
            log.warning("cannot refresh the route of %s: %s", topic, exc)

    async def _stand_in(self, topic: str) -> TopicRouteData | None:
        with contextlib.suppress(TopicNotFound):
            template = await self.nameserver.route(AUTO_CREATE_TOPIC)
            route = _default_route(topic, template)
            if route.queue_datas:
                return route
        groups = [g for g in await self.nameserver.groups() if g.master_online]
        if not groups:
            return None
        return TopicRouteData(
            topic,
            [
                BrokerData(g.cluster, g.broker_name, dict(g.members), g.enable_acting_master)
                for g in groups
            ],
            [
                QueueData(
                    g.broker_name,
                    DEFAULT_TOPIC_QUEUE_NUMS,
                    DEFAULT_TOPIC_QUEUE_NUMS,
                    Perm.READ | Perm.WRITE,
                )
                for g in groups
            ],
        )

    # ---- background loops ----------------------------------------------------------

    def watch(self, topic: str) -> None:
        """Hold a route watch for ``topic`` (idempotent); also starts the refresher.

        The topic need not exist yet: the watch reports it when it appears.
        """
        self._check_open()
        if self._refresher is None:
            self._refresher = self._spawn(self._refresh_loop(), "route-refresh")
        if not self.watch_enabled or topic in self._watches:
            return
        self._watches[topic] = self._spawn(self._watch_loop(topic), f"route-watch-{topic}")

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("route cache task %s died", task.get_name(), exc_info=task.exception())

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_interval_s)
            for topic in sorted(set(self._routes) | set(self._watches)):
                await self.refresh_quietly(topic)

    async def _watch_loop(self, topic: str) -> None:
        loop = asyncio.get_running_loop()
        backoff = self._backoff_min_s
        while True:
            known = self._versions.get(topic, "")
            started = loop.time()
            try:
                version, route = await self.nameserver.watch_route(
                    topic, known, self.watch_max_wait_ms
                )
            except UnknownMethod:
                log.info("nameserver has no route watch; polling %s only", topic)
                return
            except (HaError, OSError) as exc:
                log.warning(
                    "route watch of %s failed (%s); retrying in %.1f s", topic, exc, backoff
                )
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                backoff = min(backoff * 2, self._backoff_max_s)
                continue
            backoff = self._backoff_min_s
            self._versions[topic] = version
            if route is not None:
                self.update(route)
            if version == known and loop.time() - started < self._backoff_min_s / 2:
                # A nameserver that answers at once without a change: do not spin.
                await asyncio.sleep(self._backoff_min_s)

    # ---- lifecycle ------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("route cache is closed")

    async def aclose(self) -> None:
        """Stop every watch and the refresher; idempotent."""
        self._closed = True
        tasks = list(self._tasks)
        self._watches.clear()
        self._refresher = None
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
