"""Client SDK against in-process test peers: a fake nameserver and fake brokers
on real RpcServers (a fake at the socket seam; the real broker is elsewhere)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from ha_controller.client import (
    Message,
    MessageQueue,
    NameserverClient,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    ReceivedMessage,
    RouteCache,
)
from ha_controller.client.routes import fifo_queues_of
from ha_controller.client.siphash import queue_for_message_group
from ha_controller.proto import broker_pb2, common_pb2, nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BadRequest, HaError, NotMaster, TopicNotFound
from ha_controller.routing import BrokerData, Perm, QueueData, TopicRouteData
from ha_controller.rpc import Dispatcher, RequestContext, RpcConnection, RpcServer
from ha_controller.wire import route_to_pb

RW = Perm.READ | Perm.WRITE


async def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


class FakeNameserver:
    def __init__(self) -> None:
        self.routes: dict[str, TopicRouteData] = {}
        self.version = 0
        self.route_calls = 0
        self.watch_calls = 0
        #: while cleared, route reads are held unanswered (a frozen nameserver)
        self.answering = asyncio.Event()
        self.answering.set()
        self.changed = asyncio.Condition()
        d = Dispatcher()
        d.add(RequestCode.GET_ROUTEINFO_BY_TOPIC, nameserver_pb2.GetRouteInfoRequest, self._route)
        d.add(RequestCode.WATCH_ROUTE, nameserver_pb2.WatchRouteRequest, self._watch)
        self.server = RpcServer(d, name="fake-ns")
        self.addr = ""

    async def start(self) -> None:
        await self.server.start("127.0.0.1", 0)
        self.addr = self.server.bound

    async def set_route(self, route: TopicRouteData) -> None:
        self.routes[route.topic] = route
        self.version += 1
        async with self.changed:
            self.changed.notify_all()

    async def _route(
        self, ctx: RequestContext, req: nameserver_pb2.GetRouteInfoRequest
    ) -> common_pb2.TopicRoute:
        self.route_calls += 1
        await self.answering.wait()
        route = self.routes.get(req.topic)
        if route is None:
            raise TopicNotFound(req.topic)
        return route_to_pb(route)

    async def _watch(
        self, ctx: RequestContext, req: nameserver_pb2.WatchRouteRequest
    ) -> nameserver_pb2.WatchRouteResponse:
        self.watch_calls += 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(req.max_wait_ms / 1000):
                async with self.changed:
                    await self.changed.wait_for(lambda: str(self.version) != req.known_version)
        route = self.routes.get(req.topic)
        resp = nameserver_pb2.WatchRouteResponse(found=route is not None, version=str(self.version))
        if route is not None:
            resp.route.CopyFrom(route_to_pb(route))
        return resp


class FakeBroker:
    """Answers sends, pulls (with long polling), offsets, heartbeats, consumer lists."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.send_error: HaError | None = None
        self.sends: list[broker_pb2.SendMessageRequest] = []
        self.queues: dict[tuple[str, int], list[broker_pb2.Message]] = defaultdict(list)
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.commits: list[tuple[str, str, int, int]] = []
        #: while cleared, commits are held unanswered (a broker that answers slowly)
        self.commit_gate = asyncio.Event()
        self.commit_gate.set()
        #: offsets pulls carried (``commit_offset``), applied as a master applies them
        #: unless ``apply_carried`` is cleared (a broker that ignores them: a plain slave)
        self.carried: list[tuple[str, str, int, int]] = []
        self.apply_carried = True
        self.clients: dict[str, set[str]] = defaultdict(set)
        self.pull_timeouts: list[tuple[int, int]] = []
        self.arrived = asyncio.Condition()
        d = Dispatcher()
        d.add(RequestCode.SEND_MESSAGE, broker_pb2.SendMessageRequest, self._send)
        d.add(RequestCode.PULL_MESSAGE, broker_pb2.PullMessageRequest, self._pull)
        d.add(RequestCode.QUERY_CONSUMER_OFFSET, broker_pb2.ConsumerOffsetRequest, self._query)
        d.add(RequestCode.UPDATE_CONSUMER_OFFSET, broker_pb2.ConsumerOffsetRequest, self._update)
        d.add(RequestCode.GET_MAX_OFFSET, broker_pb2.QueueOffsetRequest, self._max)
        d.add(RequestCode.HEART_BEAT, broker_pb2.ClientHeartbeat, self._heartbeat)
        d.add(
            RequestCode.GET_CONSUMER_LIST_BY_GROUP,
            broker_pb2.ConsumerListRequest,
            self._consumer_list,
        )
        self.server = RpcServer(d, name=f"fake-{name}")
        self.server.on_connection_closed(self._conn_closed)
        self.addr = ""

    async def start(self) -> None:
        await self.server.start("127.0.0.1", 0)
        self.addr = self.server.bound

    async def aclose(self) -> None:
        await self.server.aclose(grace_s=0.1)

    async def put(self, topic: str, queue_id: int, count: int) -> None:
        q = self.queues[(topic, queue_id)]
        for _ in range(count):
            n = len(q)
            q.append(
                broker_pb2.Message(
                    topic=topic,
                    body=f"{queue_id}-{n}".encode(),
                    properties={"UNIQ_KEY": f"U{queue_id}-{n}", "KEYS": f"k{queue_id}-{n}"},
                    queue_id=queue_id,
                    queue_offset=n,
                    msg_id=f"M{queue_id}-{n}",
                    broker_name=self.name,
                    born_ts_ms=1,
                    store_ts_ms=2,
                )
            )
        async with self.arrived:
            self.arrived.notify_all()

    async def _send(
        self, ctx: RequestContext, req: broker_pb2.SendMessageRequest
    ) -> broker_pb2.SendMessageResponse:
        self.sends.append(req)
        if self.send_error is not None:
            raise self.send_error
        q = self.queues[(req.topic, req.queue_id)]
        results = []
        for entry in req.entries:
            results.append(
                broker_pb2.SendResult(
                    msg_id=f"{self.name}-{len(q)}",
                    uniq_key=entry.properties["UNIQ_KEY"],
                    queue_id=req.queue_id,
                    queue_offset=len(q),
                )
            )
            q.append(broker_pb2.Message(topic=req.topic, body=entry.body, queue_offset=len(q)))
        return broker_pb2.SendMessageResponse(broker_name=self.name, results=results)

    async def _pull(
        self, ctx: RequestContext, req: broker_pb2.PullMessageRequest
    ) -> broker_pb2.PullMessageResponse:
        self.pull_timeouts.append((req.suspend_timeout_ms, ctx.timeout_ms))
        if req.commit_offset >= 0:
            self.carried.append((req.consumer_group, req.topic, req.queue_id, req.commit_offset))
            if self.apply_carried:
                self.offsets[(req.consumer_group, req.topic, req.queue_id)] = req.commit_offset
        key = (req.topic, req.queue_id)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(req.suspend_timeout_ms / 1000):
                async with self.arrived:
                    await self.arrived.wait_for(lambda: len(self.queues[key]) > req.queue_offset)
        q = self.queues[key]
        found = q[req.queue_offset : req.queue_offset + req.max_msg_nums]
        return broker_pb2.PullMessageResponse(
            status=broker_pb2.FOUND if found else broker_pb2.NO_NEW_MSG,
            next_begin_offset=req.queue_offset + len(found),
            min_offset=0,
            max_offset=len(q),
            messages=found,
        )

    async def _query(
        self, ctx: RequestContext, req: broker_pb2.ConsumerOffsetRequest
    ) -> broker_pb2.OffsetResponse:
        return broker_pb2.OffsetResponse(
            offset=self.offsets.get((req.consumer_group, req.topic, req.queue_id), -1)
        )

    async def _update(
        self, ctx: RequestContext, req: broker_pb2.ConsumerOffsetRequest
    ) -> broker_pb2.OffsetResponse:
        await self.commit_gate.wait()
        self.offsets[(req.consumer_group, req.topic, req.queue_id)] = req.offset
        self.commits.append((req.consumer_group, req.topic, req.queue_id, req.offset))
        return broker_pb2.OffsetResponse()

    async def _max(
        self, ctx: RequestContext, req: broker_pb2.QueueOffsetRequest
    ) -> broker_pb2.OffsetResponse:
        return broker_pb2.OffsetResponse(offset=len(self.queues[(req.topic, req.queue_id)]))

    async def _heartbeat(self, ctx: RequestContext, req: broker_pb2.ClientHeartbeat) -> None:
        for group in req.consumer_groups:
            self.clients[group].add(req.client_id)
            ctx.conn.attrs.setdefault("clients", set()).add((group, req.client_id))

    def _conn_closed(self, conn: RpcConnection) -> None:
        # As RocketMQ's broker: a client whose channel closed leaves its groups.
        for group, client_id in conn.attrs.get("clients", ()):
            self.clients[group].discard(client_id)

    async def _consumer_list(
        self, ctx: RequestContext, req: broker_pb2.ConsumerListRequest
    ) -> broker_pb2.ConsumerListResponse:
        return broker_pb2.ConsumerListResponse(client_ids=sorted(self.clients[req.consumer_group]))


def two_group_route(a: FakeBroker, b: FakeBroker, topic: str = "T") -> TopicRouteData:
    return TopicRouteData(
        topic,
        [BrokerData("c", a.name, {0: a.addr}, True), BrokerData("c", b.name, {0: b.addr}, True)],
        [QueueData(a.name, 4, 4, RW), QueueData(b.name, 4, 4, RW)],
    )


@pytest.fixture
async def ns() -> AsyncIterator[FakeNameserver]:
    server = FakeNameserver()
    await server.start()
    yield server
    await server.server.aclose(grace_s=0.1)


@pytest.fixture
async def brokers() -> AsyncIterator[tuple[FakeBroker, FakeBroker]]:
    a, b = FakeBroker("broker-a"), FakeBroker("broker-b")
    await a.start()
    await b.start()
    yield a, b
    await a.aclose()
    await b.aclose()


@pytest.fixture
async def two_groups(
    ns: FakeNameserver, brokers: tuple[FakeBroker, FakeBroker]
) -> tuple[FakeBroker, FakeBroker]:
    """``brokers`` published as topic T's two groups (:func:`two_group_route`)."""
    await ns.set_route(two_group_route(*brokers))
    return brokers


# --- producer -------------------------------------------------------------------------


async def test_not_master_moves_the_send_to_another_group_and_isolates(
    ns: FakeNameserver, two_groups: tuple[FakeBroker, FakeBroker]
) -> None:
    a, _ = two_groups
    a.send_error = NotMaster("broker-a is a slave now")
    async with Producer(ns.addr, "PG") as producer:
        receipts = []
        # Round robin reaches a queue of broker-a within five sends, wherever it starts.
        for _ in range(5):
            routes_before = ns.route_calls
            receipts.append(await producer.send(Message("T", b"x")))
            if a.sends:
                break
        assert len(a.sends) == 1, "round robin never reached broker-a"
        assert all(r.broker_name == "broker-b" for r in receipts)
        assert ns.route_calls > routes_before, "NotMaster must refresh the route"
        assert producer.isolation.is_isolated(a.addr)
        # While isolated, broker-a is not tried again.
        for _ in range(8):
            assert (await producer.send(Message("T", b"y"))).broker_name == "broker-b"
        assert len(a.sends) == 1
        # The retry of the failed send carried the same client message id.
        failed_uk = a.sends[0].entries[0].properties["UNIQ_KEY"]
        assert any(r.uniq_key == failed_uk for r in receipts)


async def test_three_attempts_alternate_groups_then_raise(
    ns: FakeNameserver, two_groups: tuple[FakeBroker, FakeBroker]
) -> None:
    a, b = two_groups
    a.send_error = NotMaster("a")
    b.send_error = NotMaster("b")
    async with Producer(ns.addr, "PG") as producer:
        with pytest.raises(NotMaster):
            await producer.send(Message("T", b"x"))
    assert len(a.sends) + len(b.sends) == 3
    assert {len(a.sends), len(b.sends)} == {1, 2}  # a, b, a or b, a, b
    uks = {r.entries[0].properties["UNIQ_KEY"] for r in a.sends + b.sends}
    assert len(uks) == 1


async def test_non_retriable_error_raises_at_once(
    ns: FakeNameserver, two_groups: tuple[FakeBroker, FakeBroker]
) -> None:
    a, b = two_groups
    a.send_error = BadRequest("bad")
    b.send_error = BadRequest("bad")
    async with Producer(ns.addr, "PG") as producer:
        with pytest.raises(BadRequest):
            await producer.send(Message("T", b"x"))
    assert len(a.sends) + len(b.sends) == 1


async def test_fifo_message_group_keeps_its_queue_even_on_retry(
    ns: FakeNameserver, two_groups: tuple[FakeBroker, FakeBroker]
) -> None:
    a, b = two_groups
    queues = [MessageQueue("T", n, i) for n in ("broker-a", "broker-b") for i in range(4)]
    async with Producer(ns.addr, "PG") as producer:
        for group in ("order-1", "order-2", "order-3"):
            expected = queues[queue_for_message_group(group, 8)]
            for _ in range(3):
                r = await producer.send(Message("T", b"x", message_group=group))
                assert (r.broker_name, r.queue_id) == (expected.broker_name, expected.queue_id)
        # The group's broker fails: the retries stay on the same queue.
        target = queues[queue_for_message_group("order-1", 8)]
        bad = a if target.broker_name == "broker-a" else b
        bad.send_error = NotMaster("gone")
        before = len(bad.sends)
        with pytest.raises(NotMaster):
            await producer.send(Message("T", b"x", message_group="order-1"))
        retried = bad.sends[before:]
        assert len(retried) == 3
        assert {r.queue_id for r in retried} == {target.queue_id}
        assert all(r.entries[0].properties["__SHARDINGKEY"] == "order-1" for r in retried)


@pytest.mark.parametrize("acting_shown", [True, False], ids=["acting-slave", "no-id-0"])
async def test_fifo_message_group_waits_for_its_group_through_a_failover(
    ns: FakeNameserver, brokers: tuple[FakeBroker, FakeBroker], acting_shown: bool
) -> None:
    """Campaign seed 1000: broker-b's master was killed, message group g3 moved to a
    queue of broker-a, and once broker-b was back its next message was read before
    the one still waiting on broker-a's lagging queue.  Now a message group keeps its
    queue: while its group has no writable master its sends fail, nothing is stored
    elsewhere, and the other message groups go on."""
    a, b = brokers
    queues = [MessageQueue("T", n, i) for n in ("broker-a", "broker-b") for i in range(4)]
    on_b = [
        g
        for g in (f"g{i}" for i in range(32))
        if queues[queue_for_message_group(g, 8)].broker_name == "broker-b"
    ]
    on_a = [g for g in (f"g{i}" for i in range(32)) if g not in on_b]
    lost_master = TopicRouteData(
        "T",
        [
            BrokerData("c", a.name, {0: a.addr}, True),
            BrokerData("c", b.name, {0: b.addr} if acting_shown else {1: b.addr}, True),
        ],
        [QueueData(a.name, 4, 4, RW), QueueData(b.name, 4, 4, Perm.READ if acting_shown else RW)],
    )
    await ns.set_route(lost_master)
    async with Producer(ns.addr, "PG") as producer:
        for group in on_b[:3]:
            with pytest.raises(NotMaster, match="keeps queue broker-b"):
                await producer.send(Message("T", b"x", message_group=group))
        for group in on_a[:3]:
            r = await producer.send(Message("T", b"x", message_group=group))
            assert r.broker_name == "broker-a"
            expected = queues[queue_for_message_group(group, 8)]
            assert r.queue_id == expected.queue_id
        assert len(a.sends) == 3
        assert b.sends == []
    # RocketMQ's clients hash over the writable queues: the group moves on
    async with Producer(ns.addr, "PG", fifo_keep_queue=False) as producer:
        r = await producer.send(Message("T", b"x", message_group=on_b[0]))
        assert r.broker_name == "broker-a"
    assert b.sends == []


def test_fifo_queues_leave_out_a_group_drained_by_an_operator() -> None:
    """A group whose write bit was removed while its master is up (a drain, without
    acting master) is not failing over: its message groups move."""
    route = TopicRouteData(
        "T",
        [BrokerData("c", "broker-a", {0: "a:1"}), BrokerData("c", "broker-b", {0: "b:1"})],
        [QueueData("broker-a", 4, 4, RW), QueueData("broker-b", 4, 4, Perm.READ)],
    )
    assert {mq.broker_name for mq in fifo_queues_of(route)} == {"broker-a"}
    gone = TopicRouteData("T", [BrokerData("c", "broker-a", {0: "a:1"})], route.queue_datas)
    assert {mq.broker_name for mq in fifo_queues_of(gone)} == {"broker-a"}


async def test_acting_group_gets_no_sends(
    ns: FakeNameserver, brokers: tuple[FakeBroker, FakeBroker]
) -> None:
    a, b = brokers
    acting = TopicRouteData(
        "T",
        [BrokerData("c", a.name, {0: a.addr}, True), BrokerData("c", b.name, {0: b.addr}, True)],
        [QueueData(a.name, 4, 4, Perm.READ), QueueData(b.name, 4, 4, RW)],
    )
    await ns.set_route(acting)
    async with Producer(ns.addr, "PG") as producer:
        for _ in range(10):
            assert (await producer.send(Message("T", b"x"))).broker_name == "broker-b"
    assert a.sends == []


async def test_batch_goes_to_one_queue_with_receipts(
    ns: FakeNameserver, two_groups: tuple[FakeBroker, FakeBroker]
) -> None:
    a, b = two_groups
    async with Producer(ns.addr, "PG") as producer:
        msgs = [Message("T", f"m{i}".encode(), keys=[f"key-{i}"], tags="t") for i in range(5)]
        receipts = await producer.send_batch(msgs)
        with pytest.raises(ValueError):
            await producer.send_batch([Message("T", b""), Message("U", b"")])
    assert len(a.sends) + len(b.sends) == 1
    assert len({(r.broker_name, r.queue_id) for r in receipts}) == 1
    assert [r.queue_offset for r in receipts] == [0, 1, 2, 3, 4]
    assert [r.key for r in receipts] == [f"key-{i}" for i in range(5)]
    assert len({r.uniq_key for r in receipts}) == 5
    req = (a.sends + b.sends)[0]
    assert req.producer_group == "PG"
    assert req.entries[0].properties["PGROUP"] == "PG"
    assert req.entries[0].properties["TAGS"] == "t"


async def test_producer_unknown_topic_and_close(ns: FakeNameserver) -> None:
    producer = Producer(ns.addr, "PG")
    with pytest.raises(RuntimeError):
        await producer.send(Message("T", b"x"))  # not started
    await producer.start()
    with pytest.raises(TopicNotFound):
        # No TBW102 and no cluster info on this nameserver: nothing to auto-create on.
        await producer.send(Message("NOPE", b"x"))
    await producer.aclose()
    await producer.aclose()


# --- route watch ----------------------------------------------------------------------


async def test_route_watch_delivers_a_failover_in_milliseconds(
    ns: FakeNameserver, two_groups: tuple[FakeBroker, FakeBroker]
) -> None:
    a, b = two_groups
    client = NameserverClient([ns.addr])
    cache = RouteCache(client, refresh_interval_s=3600)
    changes: list[TopicRouteData] = []
    cache.on_change(lambda topic, route: changes.append(route))
    try:
        await cache.route("T")
        assert len(cache.publish_queues("T")) == 8
        await eventually(lambda: ns.watch_calls >= 2)  # the watch is parked
        acting = TopicRouteData(
            "T",
            [
                BrokerData("c", a.name, {0: "10.9.9.9:1", 2: "10.9.9.8:1"}, True),
                BrokerData("c", b.name, {0: b.addr}, True),
            ],
            [QueueData(a.name, 4, 4, Perm.READ), QueueData(b.name, 4, 4, RW)],
        )
        t0 = time.monotonic()
        await ns.set_route(acting)
        await eventually(lambda: cache.broker_addr_for_subscribe(a.name) == "10.9.9.9:1", 2.0)
        assert time.monotonic() - t0 < 1.0
        assert len(cache.publish_queues("T")) == 4
        assert len(cache.subscribe_queues("T")) == 8
        assert changes[-1] == acting
    finally:
        await cache.aclose()
        await client.aclose()


async def test_a_frozen_nameserver_costs_a_route_read_the_hedge_not_the_timeout(
    ns: FakeNameserver, two_groups: tuple[FakeBroker, FakeBroker]
) -> None:
    """Campaign seed 1014: with one of two nameservers frozen, an acting slave's escape
    waited 3 s (the request timeout) for its route before asking the other nameserver.
    Now the other is asked once the first has not answered within the hedge (0.3 s)."""
    frozen = FakeNameserver()
    await frozen.start()
    await frozen.set_route(two_group_route(*two_groups))
    frozen.answering.clear()
    client = NameserverClient([frozen.addr, ns.addr])
    try:
        async with asyncio.timeout(2.0):  # the request timeout is 3 s
            route = await client.route("T")
            assert [b.broker_name for b in route.broker_datas] == ["broker-a", "broker-b"]
            await client.route("T")  # straight to the one that answered
        assert (frozen.route_calls, ns.route_calls) == (1, 2)
    finally:
        frozen.answering.set()
        await client.aclose()
        await frozen.server.aclose(grace_s=0.1)


async def test_route_watch_reports_a_topic_that_appears_later(ns: FakeNameserver) -> None:
    client = NameserverClient([ns.addr])
    cache = RouteCache(client, refresh_interval_s=3600)
    try:
        with pytest.raises(TopicNotFound):
            await cache.route("LATER")
        cache.watch("LATER")
        await eventually(lambda: ns.watch_calls >= 1)
        await ns.set_route(
            TopicRouteData("LATER", [BrokerData("c", "x", {0: "h:1"})], [QueueData("x", 1, 1, RW)])
        )
        await eventually(lambda: cache.cached("LATER") is not None)
    finally:
        await cache.aclose()
        await client.aclose()


# --- pull consumer -----------------------------------------------------------------------


async def test_long_poll_rpc_timeout_exceeds_suspend_and_wakes_on_arrival(
    ns: FakeNameserver, two_groups: tuple[FakeBroker, FakeBroker]
) -> None:
    a, _ = two_groups
    async with PullConsumer(ns.addr, "CG") as consumer:
        mq = MessageQueue("T", "broker-a", 1)
        assert mq in await consumer.queues("T")
        result = await consumer.pull(mq, 0, suspend_timeout_ms=200)
        assert result.status is PullStatus.NO_NEW_MSG and result.messages == []
        suspend, rpc_timeout = a.pull_timeouts[-1]
        assert suspend == 200 and rpc_timeout > suspend
        pull = asyncio.ensure_future(consumer.pull(mq, 0, suspend_timeout_ms=10_000))
        await eventually(lambda: len(a.pull_timeouts) == 2)
        assert a.pull_timeouts[-1][1] > 10_000
        await a.put("T", 1, 3)
        result = await asyncio.wait_for(pull, 2.0)
        assert result.status is PullStatus.FOUND
        assert [m.queue_offset for m in result.messages] == [0, 1, 2]
        first: ReceivedMessage = result.messages[0]
        assert (first.uniq_key, first.key, first.broker_name, first.queue_id) == (
            "U1-0",
            "k1-0",
            "broker-a",
            1,
        )
        assert result.next_begin_offset == 3
        assert await consumer.max_offset(mq) == 3


async def test_offsets_follow_the_id0_address_through_a_failover(
    ns: FakeNameserver, brokers: tuple[FakeBroker, FakeBroker]
) -> None:
    master, slave = brokers
    route = TopicRouteData(
        "T",
        [BrokerData("c", "g", {0: master.addr, 1: slave.addr}, True)],
        [QueueData("g", 2, 2, RW)],
    )
    await ns.set_route(route)
    async with PullConsumer(ns.addr, "CG", retry_backoff_s=0.05) as consumer:
        mq = MessageQueue("T", "g", 0)
        assert await consumer.committed_offset(mq) == -1
        await consumer.commit(mq, 5)
        assert master.offsets[("CG", "T", 0)] == 5
        # The master dies; the nameserver shows the slave as a read-only id 0.
        await master.aclose()
        await ns.set_route(
            TopicRouteData(
                "T",
                [BrokerData("c", "g", {0: slave.addr}, True)],
                [QueueData("g", 2, 2, Perm.READ)],
            )
        )
        await consumer.commit(mq, 7)
        assert slave.offsets[("CG", "T", 0)] == 7
        assert await consumer.committed_offset(mq) == 7


# --- push consumer -----------------------------------------------------------------------


def one_group_route(broker: FakeBroker, queues: int) -> TopicRouteData:
    return TopicRouteData(
        "T",
        [BrokerData("c", broker.name, {0: broker.addr}, True)],
        [QueueData(broker.name, queues, queues, RW)],
    )


async def test_push_consumer_consumes_retries_and_commits(
    ns: FakeNameserver, brokers: tuple[FakeBroker, FakeBroker]
) -> None:
    a, _ = brokers
    await ns.set_route(one_group_route(a, 2))
    await a.put("T", 0, 5)
    await a.put("T", 1, 5)
    seen: list[tuple[int, int, int]] = []

    async def listener(m: ReceivedMessage) -> bool:
        seen.append((m.queue_id, m.queue_offset, m.reconsume_times))
        if (m.queue_id, m.queue_offset) == (0, 2) and m.reconsume_times == 0:
            return False
        if (m.queue_id, m.queue_offset) == (1, 3) and m.reconsume_times == 0:
            raise RuntimeError("listener bug")
        return True

    consumer = PushConsumer(
        ns.addr,
        "CG",
        "T",
        listener,
        client_id="me",
        suspend_timeout_ms=300,
        consume_retry_backoff_s=0.01,
    )
    async with consumer:
        assert consumer.assigned_queues() == [
            MessageQueue("T", "broker-a", 0),
            MessageQueue("T", "broker-a", 1),
        ]
        assert "me" in a.clients["CG"]
        await eventually(lambda: consumer.consumed == 10)
        assert (0, 2, 1) in seen and (1, 3, 1) in seen
        await eventually(
            lambda: a.offsets.get(("CG", "T", 0)) == 5 and a.offsets.get(("CG", "T", 1)) == 5
        )
        await a.put("T", 1, 2)
        await eventually(lambda: consumer.consumed == 12)
    assert a.offsets[("CG", "T", 1)] == 7
    assert consumer.given_up == 0


async def test_push_consumer_commits_only_up_to_the_lowest_unfinished(
    ns: FakeNameserver, brokers: tuple[FakeBroker, FakeBroker]
) -> None:
    a, _ = brokers
    await ns.set_route(one_group_route(a, 1))
    a.offsets[("CG", "T", 0)] = 2  # resume from the committed offset
    await a.put("T", 0, 6)
    release = asyncio.Event()
    done: set[int] = set()

    async def listener(m: ReceivedMessage) -> bool:
        if m.queue_offset == 3:
            await release.wait()
        done.add(m.queue_offset)
        return True

    consumer = PushConsumer(
        ns.addr, "CG", "T", listener, client_id="me", suspend_timeout_ms=300, commit_interval_s=0.05
    )
    async with consumer:
        await eventually(lambda: done == {2, 4, 5})
        await eventually(lambda: a.offsets[("CG", "T", 0)] == 3)
        await asyncio.sleep(0.2)  # several periodic commits pass
        assert max(c[3] for c in a.commits) == 3
        release.set()
        await eventually(lambda: a.offsets[("CG", "T", 0)] == 6)
    assert 0 not in done and 1 not in done


async def _consumer_of_one_queue(
    ns: FakeNameserver, a: FakeBroker, consumed: list[int], **kwargs: Any
) -> PushConsumer:
    """A push consumer of group CG on topic T: one queue on ``a`` holding three messages,
    and a listener that records each offset it gets in ``consumed``."""
    await ns.set_route(one_group_route(a, 1))
    await a.put("T", 0, 3)

    async def listener(m: ReceivedMessage) -> bool:
        consumed.append(m.queue_offset)
        return True

    return PushConsumer(ns.addr, "CG", "T", listener, client_id="me", **kwargs)


async def test_the_next_pull_carries_the_commit_of_a_batch(
    ns: FakeNameserver, brokers: tuple[FakeBroker, FakeBroker]
) -> None:
    """No request of its own per batch (at one message per pull that doubled the master's
    requests): the pull after a batch carries its offset, as RocketMQ's does."""
    a, _ = brokers
    consumed: list[int] = []
    consumer = await _consumer_of_one_queue(
        ns, a, consumed, suspend_timeout_ms=300, commit_interval_s=60
    )
    async with consumer:
        await eventually(lambda: a.offsets.get(("CG", "T", 0)) == 3)
        assert a.commits == []
        await a.put("T", 0, 2)
        await eventually(lambda: a.offsets.get(("CG", "T", 0)) == 5)
        assert a.commits == []
        # 0 first: the group had none, as the explicit commits did
        assert sorted({c[3] for c in a.carried}) == [0, 3, 5]
    assert consumed == [0, 1, 2, 3, 4]


async def test_pulls_carry_the_offset_until_a_commit_request_stored_it(
    ns: FakeNameserver, brokers: tuple[FakeBroker, FakeBroker]
) -> None:
    """The master that took a carried offset may die before its slaves have it: every
    pull carries it again (a retry on the acting slave too) until the periodic commit
    request has stored it."""
    a, _ = brokers
    consumer = await _consumer_of_one_queue(ns, a, [], suspend_timeout_ms=100, commit_interval_s=1)
    async with consumer:
        await eventually(lambda: [c[3] for c in a.carried][-3:] == [3, 3, 3])  # empty pulls
        await eventually(lambda: [c[3] for c in a.commits] == [3], timeout=5)
        await asyncio.sleep(0.3)  # three more empty pulls
        carried = len(a.carried)
        await asyncio.sleep(0.3)
        assert len(a.carried) == carried  # stored: nothing carried any more


async def test_commits_land_where_pulls_carrying_them_are_ignored(
    ns: FakeNameserver, brokers: tuple[FakeBroker, FakeBroker]
) -> None:
    """A broker that is neither master nor acting slave ignores a carried offset; the
    periodic commit still stores it (a carried offset never counts as committed)."""
    a, _ = brokers
    a.apply_carried = False
    consumer = await _consumer_of_one_queue(
        ns, a, [], suspend_timeout_ms=300, commit_interval_s=0.1
    )
    async with consumer:
        await eventually(lambda: a.offsets.get(("CG", "T", 0)) == 3)
        assert [c[3] for c in a.commits] == [3]
        assert {c[3] for c in a.carried} <= {0, 3}


async def test_a_commit_left_unanswered_does_not_hold_up_the_next_pull(
    ns: FakeNameserver, brokers: tuple[FakeBroker, FakeBroker]
) -> None:
    """Commits used to be awaited between pulls: a broker answering commits slowly
    (packet loss: 3 attempts of 3 s) stopped the queue's reads meanwhile (campaign seed
    1000: delayed messages read 6 s after they were due).  Pulls carry no offsets here
    (a broker that ignores them), so the explicit commits are the ones held."""
    a, _ = brokers
    a.apply_carried = False
    consumed: list[int] = []
    consumer = await _consumer_of_one_queue(
        ns, a, consumed, suspend_timeout_ms=300, request_timeout_ms=30_000, commit_interval_s=0.05
    )
    async with consumer:
        await eventually(lambda: consumed == [0, 1, 2])
        await eventually(lambda: a.offsets.get(("CG", "T", 0)) == 3)
        a.commit_gate.clear()
        await a.put("T", 0, 1)
        await eventually(lambda: len(consumed) == 4)  # the commit of 4 is held meanwhile
        await a.put("T", 0, 1)
        await eventually(lambda: len(consumed) == 5)
        assert a.offsets[("CG", "T", 0)] == 3
        a.commit_gate.set()
        await eventually(lambda: a.offsets.get(("CG", "T", 0)) == 5)
    assert consumed == [0, 1, 2, 3, 4]


async def test_two_push_consumers_split_the_queues_averagely(
    ns: FakeNameserver, brokers: tuple[FakeBroker, FakeBroker]
) -> None:
    a, _ = brokers
    await ns.set_route(one_group_route(a, 4))

    async def listener(m: ReceivedMessage) -> bool:
        return True

    kwargs: dict[str, Any] = {
        "suspend_timeout_ms": 300,
        "rebalance_interval_s": 0.05,
        "heartbeat_interval_s": 0.05,
    }
    c1 = PushConsumer(ns.addr, "CG", "T", listener, client_id="c1", **kwargs)
    c2 = PushConsumer(ns.addr, "CG", "T", listener, client_id="c2", **kwargs)
    async with c1:
        assert len(c1.assigned_queues()) == 4
        async with c2:
            q = [MessageQueue("T", "broker-a", i) for i in range(4)]
            await eventually(
                lambda: c1.assigned_queues() == q[:2] and c2.assigned_queues() == q[2:]
            )
        # c2 left (its connections closed): c1 takes every queue back.
        await eventually(lambda: c1.assigned_queues() == q)


async def test_push_consumer_waits_for_a_topic_that_appears_later(
    ns: FakeNameserver, brokers: tuple[FakeBroker, FakeBroker]
) -> None:
    a, _ = brokers
    got: list[int] = []

    async def listener(m: ReceivedMessage) -> bool:
        got.append(m.queue_offset)
        return True

    async with PushConsumer(ns.addr, "CG", "T", listener, suspend_timeout_ms=300) as consumer:
        assert consumer.assigned_queues() == []
        await a.put("T", 0, 2)
        await ns.set_route(one_group_route(a, 1))
        await eventually(lambda: sorted(got) == [0, 1])
