"""The escape bridge against fake peers at the socket seam: a fake nameserver
serving routes and fake masters answering SEND_MESSAGE / PULL_MESSAGE
(after RocketMQ's EscapeBridgeTest; issue #7923).

The bridge's own broker is small fakes of its ports (``tests/fakes.py``: a fake core
with an in-memory store and a fake write path), never a BrokerService on disk."""

from __future__ import annotations

import asyncio
import socket
import time
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeBroker, FakeClock, FakeNeighbours

from broker_agent.special.escape import EscapeBridge, NotServingAnyMore
from broker_agent.special.escape_routes import EscapeRoutes, stable_hash
from ha_controller.config import BrokerConfig
from ha_controller.proto import broker_pb2, common_pb2, nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    BadRequest,
    BrokerIsolated,
    EscapeFailed,
    HaError,
    InSyncReplicasNotEnough,
    StoreFull,
    TopicNotFound,
)
from ha_controller.routing import BrokerData, Perm, QueueData, TopicRouteData
from ha_controller.rpc import Dispatcher, RequestContext, RpcServer
from ha_controller.testing import eventually
from ha_controller.wire import route_to_pb

TOPIC = "TEST_TOPIC"
OWN = "broker_a"


def dead_addr() -> str:
    """A local port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@dataclass
class FakeMaster:
    """A master that records sends and serves one stored message per queue offset."""

    name: str
    fail_first: int = 0
    error: type[HaError] = InSyncReplicasNotEnough
    sends: list[broker_pb2.SendMessageRequest] = field(default_factory=list)
    stored: dict[tuple[str, int, int], broker_pb2.Message] = field(default_factory=dict)
    server: RpcServer | None = None
    addr: str = ""
    #: called on every send before it is answered (a test changes the world there)
    on_send: Callable[[], None] | None = None
    #: the first this many sends are stored, then answered only after ``slow_s``
    slow_first: int = 0
    slow_s: float = 0.0

    async def start(self) -> FakeMaster:
        d = Dispatcher()
        d.add(RequestCode.SEND_MESSAGE, broker_pb2.SendMessageRequest, self._send)
        d.add(RequestCode.PULL_MESSAGE, broker_pb2.PullMessageRequest, self._pull)
        self.server = RpcServer(d, name=self.name)
        host, port = await self.server.start("127.0.0.1", 0)
        self.addr = f"{host}:{port}"
        return self

    async def _send(
        self, ctx: RequestContext, req: broker_pb2.SendMessageRequest
    ) -> broker_pb2.SendMessageResponse:
        if self.on_send is not None:
            self.on_send()
        if self.fail_first > 0:
            self.fail_first -= 1
            raise self.error(f"{self.name} refuses this one")
        self.sends.append(req)
        if self.slow_first > 0:
            self.slow_first -= 1
            await asyncio.sleep(self.slow_s)  # stored; the answer comes too late
        return broker_pb2.SendMessageResponse(
            broker_name=self.name,
            results=[
                broker_pb2.SendResult(
                    msg_id=f"{self.name}-{len(self.sends)}",
                    queue_id=req.queue_id,
                    queue_offset=len(self.sends) - 1,
                )
            ],
        )

    async def _pull(
        self, ctx: RequestContext, req: broker_pb2.PullMessageRequest
    ) -> broker_pb2.PullMessageResponse:
        assert req.max_msg_nums == 1
        msg = self.stored.get((req.topic, req.queue_id, req.queue_offset))
        if msg is None:
            return broker_pb2.PullMessageResponse(status=broker_pb2.NO_NEW_MSG)
        return broker_pb2.PullMessageResponse(status=broker_pb2.FOUND, messages=[msg])


class FakeNameserver:
    def __init__(self) -> None:
        self.routes: dict[str, TopicRouteData] = {}
        self.route_calls = 0
        self.server: RpcServer | None = None
        self.addr = ""

    async def start(self) -> FakeNameserver:
        d = Dispatcher()
        d.add(RequestCode.GET_ROUTEINFO_BY_TOPIC, nameserver_pb2.GetRouteInfoRequest, self._route)
        d.add(RequestCode.GET_BROKER_CLUSTER_INFO, common_pb2.Empty, self._cluster)
        self.server = RpcServer(d, name="fake-ns")
        host, port = await self.server.start("127.0.0.1", 0)
        self.addr = f"{host}:{port}"
        return self

    def publish(
        self, groups: dict[str, dict[int, str]], *, writable: set[str] | None = None
    ) -> None:
        writable = set(groups) if writable is None else writable
        self.routes[TOPIC] = TopicRouteData(
            TOPIC,
            [BrokerData("c", name, addrs, True) for name, addrs in groups.items()],
            [
                QueueData(name, 4, 4, Perm.READ | Perm.WRITE if name in writable else Perm.READ)
                for name in groups
            ],
        )

    async def _route(
        self, ctx: RequestContext, req: nameserver_pb2.GetRouteInfoRequest
    ) -> common_pb2.TopicRoute:
        self.route_calls += 1
        route = self.routes.get(req.topic)
        if route is None:
            raise TopicNotFound(req.topic)
        return route_to_pb(route)

    async def _cluster(
        self, ctx: RequestContext, req: common_pb2.Empty
    ) -> nameserver_pb2.ClusterInfo:
        brokers = {b.broker_name: b for r in self.routes.values() for b in r.broker_datas}
        return nameserver_pb2.ClusterInfo(
            brokers=[
                common_pb2.BrokerData(
                    cluster="c", broker_name=b.broker_name, broker_addrs=b.broker_addrs
                )
                for b in brokers.values()
            ]
        )


@dataclass
class Env:
    ns: FakeNameserver
    masters: dict[str, FakeMaster]
    brokers: list[FakeBroker]
    tmp: Path

    def broker(
        self, broker_id: int = 1, name: str = OWN, *, acting: bool = True, **kw: object
    ) -> FakeBroker:
        """A fake core and write path of broker ``name``/``broker_id`` with a real
        EscapeBridge over them (no BrokerService, nothing on disk); a slave acts
        unless ``acting`` is False."""
        args: dict[str, Any] = {
            "cluster": "c",
            "broker_name": name,
            "broker_id": broker_id,
            "namesrv_addrs": (self.ns.addr,),
            "store_dir": str(self.tmp / f"{name}-{broker_id}"),
            "total_replicas": 1,
            "in_sync_replicas": 1,
            "escape_max_attempts": 4,
            "escape_backoff_initial_ms": 1,
            "escape_backoff_max_ms": 5,
            "escape_send_timeout_ms": 1000,
        }
        args.update(kw)
        broker = FakeBroker(
            BrokerConfig(**args),
            addr=f"127.0.0.{len(self.brokers) + 1}:10911",
        )
        self.brokers.append(broker)
        if acting and broker_id != 0:
            broker.core.acting.on_min_broker_change(broker_id, broker.core.addr)
        return broker

    def escaped(self, broker: FakeBroker, target: str, result: str) -> float:
        m = broker.core.metrics
        value = m.registry.get_sample_value(
            "hac_escape_messages_total",
            {**m.ident, "kind": "delay", "target": target, "result": result},
        )
        return value or 0.0


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    ns = await FakeNameserver().start()
    masters = {name: await FakeMaster(name).start() for name in ("broker_b", "broker_c")}
    e = Env(ns, masters, [], tmp_path)
    yield e
    for broker in e.brokers:
        await broker.aclose()
    for server in [ns.server, *(m.server for m in masters.values())]:
        assert server is not None
        await server.aclose(grace_s=0.2)


def three_groups(env: Env, own_addr: str = "127.0.0.1:1", **extra: dict[int, str]) -> None:
    groups = {OWN: {0: own_addr}, **{n: {0: m.addr} for n, m in env.masters.items()}, **extra}
    env.ns.publish(groups, writable=set(groups) - {OWN})


async def test_remote_escape_round_robins_and_never_targets_its_own_group(env: Env) -> None:
    slave = env.broker()
    # even a route that shows our own group writable with an id 0 is skipped
    env.ns.publish({OWN: {0: dead_addr()}, **{n: {0: m.addr} for n, m in env.masters.items()}})
    results = [
        await slave.escape.put_message(TOPIC, b"x", {"K": str(i)}, kind="delay") for i in range(16)
    ]
    assert {r.target for r in results} == {"broker_b", "broker_c"}
    assert len(env.masters["broker_b"].sends) == len(env.masters["broker_c"].sends) == 8
    sent = env.masters["broker_b"].sends[0]
    assert sent.producer_group == f"InnerProducerGroup_{OWN}_1"
    assert sent.born_host == slave.core.addr
    assert env.escaped(slave, "broker_b", "ok") == 8


async def test_a_dead_master_in_a_stale_route_costs_one_attempt_not_the_message(env: Env) -> None:
    slave = env.broker()
    three_groups(env, broker_dead={0: dead_addr()})
    # 12 queues in round robin: every message passes broker_dead's queues once
    results = [await slave.escape.put_message(TOPIC, b"x", {}, kind="delay") for _ in range(12)]
    assert all(r.target in {"broker_b", "broker_c"} for r in results)
    assert sum(len(m.sends) for m in env.masters.values()) == 12
    assert env.escaped(slave, "broker_dead", "error") == 1  # then it is avoided


async def test_a_master_the_nameserver_dropped_is_never_targeted(env: Env) -> None:
    slave = env.broker()
    clock = FakeClock(0.0)
    slave.escape.routes = EscapeRoutes(
        slave.escape.routes.nameserver, "c", max_age_s=1.0, clock=clock
    )
    three_groups(env)
    await slave.escape.put_message(TOPIC, b"x", {}, kind="delay")  # route now cached
    env.ns.publish(
        {OWN: {0: "127.0.0.1:1"}, "broker_c": {0: env.masters["broker_c"].addr}},
        writable={"broker_c"},
    )
    clock.now += 1.5  # the cached route is too old to be used
    before = len(env.masters["broker_b"].sends)
    for _ in range(8):
        assert (await slave.escape.put_message(TOPIC, b"x", {}, kind="delay")).target == "broker_c"
    assert len(env.masters["broker_b"].sends) == before


async def test_refused_sends_are_retried_with_backoff(env: Env) -> None:
    slave = env.broker()
    env.ns.publish(
        {OWN: {0: "127.0.0.1:1"}, "broker_b": {0: env.masters["broker_b"].addr}},
        writable={"broker_b"},
    )
    env.masters["broker_b"].fail_first = 2
    result = await slave.escape.put_message(TOPIC, b"x", {}, kind="delay")
    assert result.target == "broker_b"
    assert env.escaped(slave, "broker_b", "error") == 2
    assert env.escaped(slave, "broker_b", "ok") == 1


async def test_a_slave_that_stops_acting_hands_nothing_on_and_stops_retrying(env: Env) -> None:
    """Campaign seed 5000: an acting slave's escape of a half message retried against a
    frozen master for 15 s, went through after its own master was back and had resolved
    the transaction, and the target committed it a second time."""
    slave = env.broker()
    b = env.masters["broker_b"]
    env.ns.publish({OWN: {0: "127.0.0.1:1"}, "broker_b": {0: b.addr}}, writable={"broker_b"})
    b.fail_first = 100

    def master_back() -> None:  # our master returns while the first attempt is refused
        slave.core.acting.on_min_broker_change(0, "127.0.0.1:1")

    b.on_send = master_back
    with pytest.raises(NotServingAnyMore, match="does not act any more"):
        await slave.escape.put_message(TOPIC, b"x", {}, kind="delay")
    assert env.escaped(slave, "broker_b", "error") == 1  # no second attempt
    b.fail_first = 0
    with pytest.raises(NotServingAnyMore):
        await slave.escape.put_message(TOPIC, b"x", {}, kind="delay")
    assert b.sends == []
    plain = env.broker(broker_id=2, acting=False)
    with pytest.raises(NotServingAnyMore):
        await plain.escape.put_message_to_specific_queue(TOPIC, b"x", {}, kind="pop_ck")
    assert b.sends == []


async def test_an_unanswered_escape_is_retried_to_the_same_target_only(env: Env) -> None:
    """Long-campaign seeds 1016 and 7001: an escape's answer was lost (a slow target, a
    partition) and the message was stored there; a retry elsewhere, or none, left it
    twice or its fate unknown when the master returned.  With an escape id, every
    retry goes to the target that may hold it (which stores a repeat once), also after
    this slave stopped acting, until an answer comes."""
    slave = env.broker(escape_send_timeout_ms=200)
    three_groups(env)
    for m in env.masters.values():
        m.slow_first, m.slow_s = 1, 0.5

    def master_back() -> None:  # our master returns while the answer is outstanding
        slave.core.acting.on_min_broker_change(0, "127.0.0.1:1")

    for m in env.masters.values():
        m.on_send = master_back
    result = await slave.escape.put_message(TOPIC, b"x", {}, kind="delay", escape_id="a/delay/1/2")
    sends = {n: m.sends for n, m in env.masters.items() if m.sends}
    assert list(sends) == [result.target], "retried to another target"
    assert [r.entries[0].properties["ESCAPE_ID"] for r in sends[result.target]] == [
        "a/delay/1/2"
    ] * 2
    assert env.escaped(slave, result.target, "unknown") == 1
    assert env.escaped(slave, result.target, "ok") == 1
    assert slave.escape.unknown_outcomes == 0
    # no id: the old way (no pinning: the target cannot tell a repeat)
    with pytest.raises(NotServingAnyMore):
        await slave.escape.put_message(TOPIC, b"x", {}, kind="delay")


async def test_a_retry_waiting_out_its_backoff_ends_when_the_services_stop(env: Env) -> None:
    """Long campaign, seed 1000: an acting slave's escapes to a partitioned group were
    refused and waited out backoffs of seconds; its returning master, which waits for
    the steps under way, stayed isolated 3.5 s longer and the messages came late."""
    slave = env.broker(escape_backoff_initial_ms=3000, escape_backoff_max_ms=5000)
    b = env.masters["broker_b"]
    env.ns.publish({OWN: {0: "127.0.0.1:1"}, "broker_b": {0: b.addr}}, writable={"broker_b"})
    b.fail_first = 100
    put = asyncio.create_task(slave.escape.put_message(TOPIC, b"x", {}, kind="delay"))
    await eventually(lambda: env.escaped(slave, "broker_b", "error") == 1, 2)
    started = time.monotonic()
    slave.core.acting.hold(20)  # the returning master's contact
    slave.core.set_special_services(False)
    with pytest.raises(NotServingAnyMore):
        await put
    assert time.monotonic() - started < 0.5


async def test_an_escape_left_unknown_holds_up_nothing_once_its_attempts_run_out(
    env: Env,
) -> None:
    """A target that never answers must not hold up the queue behind the message for
    ever: when the attempts run out the fate stays unknown and the next put chooses
    afresh (the target is avoided after its failures)."""
    slave = env.broker(escape_send_timeout_ms=100, escape_max_attempts=2)
    three_groups(env)
    for m in env.masters.values():
        m.slow_first, m.slow_s = 5, 0.3
    with pytest.raises(EscapeFailed):
        await slave.escape.put_message(TOPIC, b"x", {}, kind="delay", escape_id="a/delay/9/2")
    (target,) = [n for n, m in env.masters.items() if m.sends]
    assert len(env.masters[target].sends) == 2  # both attempts went there
    assert slave.escape.unknown_outcomes == 0
    for m in env.masters.values():
        m.slow_first = 0
    result = await slave.escape.put_message(TOPIC, b"x", {}, kind="delay", escape_id="a/delay/9/2")
    assert result.target != target


async def test_attempts_are_bounded_and_a_bad_message_is_not_retried(env: Env) -> None:
    slave = env.broker()
    b = env.masters["broker_b"]
    env.ns.publish({OWN: {0: "127.0.0.1:1"}, "broker_b": {0: b.addr}}, writable={"broker_b"})
    b.fail_first = 100
    with pytest.raises(EscapeFailed):
        await slave.escape.put_message(TOPIC, b"x", {}, kind="delay")
    assert env.escaped(slave, "broker_b", "error") == 4  # escape_max_attempts
    b.fail_first, b.error = 100, BadRequest
    with pytest.raises(EscapeFailed):
        await slave.escape.put_message(TOPIC, b"x", {}, kind="delay")
    assert env.escaped(slave, "broker_b", "error") == 5


async def test_no_other_master_means_escape_failed(env: Env) -> None:
    slave = env.broker()
    env.ns.publish({OWN: {0: "127.0.0.1:1"}}, writable=set())
    with pytest.raises(EscapeFailed):
        await slave.escape.put_message(TOPIC, b"x", {}, kind="delay")
    assert env.escaped(slave, "none", "no_target") >= 1


async def test_remote_escape_off_fails_at_once(env: Env) -> None:
    slave = env.broker(enable_remote_escape=False)
    three_groups(env)
    with pytest.raises(EscapeFailed):
        await slave.escape.put_message(TOPIC, b"x", {}, kind="delay")
    assert env.ns.route_calls == 0


async def test_unknown_topic_falls_back_to_every_online_master(env: Env) -> None:
    slave = env.broker()
    three_groups(env)
    result = await slave.escape.put_message("NEW_TOPIC", b"x", {}, kind="delay")
    assert result.target in {"broker_b", "broker_c"}
    assert result.queue_id in range(4)


async def test_specific_queue_is_a_stable_function_of_topic_and_store_host(env: Env) -> None:
    slave = env.broker()
    three_groups(env)
    results = {
        (r.target, r.queue_id)
        for r in [
            await slave.escape.put_message_to_specific_queue(TOPIC, b"ck", {}, kind="delay")
            for _ in range(10)
        ]
    }
    assert len(results) == 1
    queues = sorted((n, q) for n in ("broker_b", "broker_c") for q in range(4))
    assert results == {queues[zlib.crc32((TOPIC + slave.core.addr).encode()) % len(queues)]}
    assert stable_hash("abc") == zlib.crc32(b"abc")


async def test_a_named_group_and_queue_is_where_it_goes_or_it_fails(env: Env) -> None:
    """A POP ACK goes to the revive queue of the group that holds its CK (named in the
    receipt handle), in this process or remote, and nowhere else."""
    slave = env.broker()
    neighbour = env.broker(broker_id=0, name="broker_x")
    slave.escape.neighbours = FakeNeighbours([slave, neighbour])
    three_groups(env)
    r = await slave.escape.put_message_to_specific_queue(
        TOPIC, b"ack", {}, kind="pop_ack", to_group="broker_c", to_queue=3
    )
    assert (r.target, r.group, r.queue_id) == ("broker_c", "broker_c", 3)
    [sent] = env.masters["broker_c"].sends
    assert sent.queue_id == 3
    # answered once the target's slaves hold it: a target cut off and fenced cuts back
    # what it did not replicate (long campaign seed 1026)
    assert not sent.no_replica_wait
    # the neighbour master is not another group's
    assert neighbour.core.store.appended == []
    r = await slave.escape.put_message_to_specific_queue(
        TOPIC, b"ack", {}, kind="pop_ack", to_group="broker_x", to_queue=2
    )
    assert (r.target, r.group, r.queue_id) == ("local", "broker_x", 2)
    for group, queue in (("broker_gone", None), ("broker_c", 9)):
        with pytest.raises(EscapeFailed):
            await slave.escape.put_message_to_specific_queue(
                TOPIC, b"ack", {}, kind="pop_ack", to_group=group, to_queue=queue
            )


async def test_a_master_escapes_locally(env: Env) -> None:
    master = env.broker(broker_id=0)
    three_groups(env)
    result = await master.escape.put_message(TOPIC, b"x", {"K": "v"}, kind="delay", queue_id=2)
    assert (result.target, result.queue_id, result.queue_offset) == ("local", 2, 0)
    stored = master.core.store.get_message_at(TOPIC, 2, 0)
    assert stored is not None and stored.properties == {"K": "v"}
    assert sum(len(m.sends) for m in env.masters.values()) == 0
    assert env.escaped(master, "local", "ok") == 1


async def test_a_masters_own_record_goes_right_behind_its_message_and_nowhere_else(
    env: Env,
) -> None:
    """``then`` (a POP revive's ACK) is appended right behind the message when this
    broker is the master that stores it, and dropped when the message escapes."""
    ack = ("REVIVE", 0, b"ack", {"TAGS": "ack"})
    master = env.broker(broker_id=0)
    three_groups(env)
    await master.escape.put_message_to_specific_queue(TOPIC, b"x", {}, kind="pop_retry", then=ack)
    message, record = master.core.store.appended[-2:]
    assert (message.topic, record.topic, record.queue_id) == (TOPIC, "REVIVE", 0)
    slave = env.broker(broker_id=1)
    await slave.escape.put_message_to_specific_queue(TOPIC, b"x", {}, kind="pop_retry", then=ack)
    assert slave.core.store.appended == []
    [sent] = [r for m in env.masters.values() for r in m.sends]
    assert [e.body for e in sent.entries] == [b"x"]


async def test_in_a_container_a_slave_escapes_to_the_master_next_to_it(env: Env) -> None:
    slave = env.broker(broker_id=1)
    other_master = env.broker(broker_id=0, name="broker_x")
    slave.escape.neighbours = FakeNeighbours([slave, other_master])
    three_groups(env)
    local = slave.escape.local_master()
    assert local is not None
    assert local[0] is other_master.core
    assert local[1] is other_master.write_path
    r1 = await slave.escape.put_message(TOPIC, b"x", {}, kind="delay", queue_id=1)
    r2 = await slave.escape.put_message_to_specific_queue(TOPIC, b"ck", {}, kind="delay")
    assert r1.target == r2.target == "local"
    assert other_master.core.store.get_message_at(TOPIC, 1, 0) is not None
    assert slave.core.store.max_offset(TOPIC, 1) == 0
    assert sum(len(m.sends) for m in env.masters.values()) == 0
    # an isolated (pre-online) master next to it is not used
    other_master.core.isolated = True
    assert slave.escape.local_master() is None


async def test_get_message_reads_own_store_or_pulls_from_the_group(env: Env) -> None:
    slave = env.broker()
    slave.core.store.put(TOPIC, 0, b"mine", {}, store_host=slave.core.addr)
    own = await slave.escape.get_message(TOPIC, OWN, 0, 0)
    assert own is not None and own.body == b"mine"
    assert await slave.escape.get_message(TOPIC, OWN, 0, 5) is None

    three_groups(env)
    env.masters["broker_b"].stored[(TOPIC, 3, 7)] = broker_pb2.Message(
        topic=TOPIC, body=b"theirs", queue_id=3, queue_offset=7, properties={"K": "v"}
    )
    theirs = await slave.escape.get_message(TOPIC, "broker_b", 3, 7)
    assert theirs is not None and theirs.body == b"theirs" and theirs.properties == {"K": "v"}
    assert await slave.escape.get_message(TOPIC, "broker_b", 3, 8) is None


async def test_get_message_transport_error_is_a_retriable_escape_failure(env: Env) -> None:
    slave = env.broker()
    three_groups(env, broker_dead={0: dead_addr()})
    with pytest.raises(EscapeFailed) as info:
        await slave.escape.get_message(TOPIC, "broker_dead", 0, 0)
    assert info.value.retriable
    with pytest.raises(EscapeFailed):
        await slave.escape.get_message(TOPIC, "broker_nowhere", 0, 0)


async def test_bridge_constructor_matches_the_published_api(env: Env) -> None:
    slave = env.broker()
    bridge = EscapeBridge(slave.core, slave.write_path, None)
    assert bridge.local_master() is None
    master = env.broker(broker_id=0, name="m")
    assert EscapeBridge(master.core, master.write_path).local_master() is not None


# ---- a master that may have been expired, or whose disk is full (issue 17, defects A, C)


async def test_a_fenced_master_hands_nothing_on(env: Env) -> None:
    master = env.broker(broker_id=0)
    three_groups(env)
    master.core.isolated = True  # fenced: back in pre-online
    with pytest.raises(EscapeFailed) as failed:
        await master.escape.put_message(TOPIC, b"x", {}, kind="delay")
    assert isinstance(failed.value.__cause__, BrokerIsolated)
    with pytest.raises(EscapeFailed):
        await master.escape.put_message_to_specific_queue(TOPIC, b"x", {}, kind="pop_retry")
    assert master.core.store.max_offset(TOPIC, 0) == 0
    assert sum(len(m.sends) for m in env.masters.values()) == 0


async def test_a_master_whose_store_is_full_escapes_to_another_group(env: Env) -> None:
    master = env.broker(broker_id=0, total_replicas=2, in_sync_replicas=2)
    three_groups(env)
    master.core.store.refuse = StoreFull("store full")  # the write path: NotWritable
    result = await master.escape.put_message(TOPIC, b"x", {"K": "v"}, kind="delay")
    assert result.target in ("broker_b", "broker_c")
    assert sum(len(m.sends) for m in env.masters.values()) == 1
    # any other refusal of the local put is still the caller's to retry
    master.core.store.refuse = None
    assert master.core.ha_master is not None
    master.core.ha_master.live = 0  # its slave is gone: InSyncReplicasNotEnough
    with pytest.raises(EscapeFailed, match="live copies"):
        await master.escape.put_message(TOPIC, b"x", {}, kind="delay")
    assert sum(len(m.sends) for m in env.masters.values()) == 1
    assert master.core.store.appended == []


async def test_a_full_master_without_remote_escape_waits(env: Env) -> None:
    master = env.broker(broker_id=0, enable_remote_escape=False)
    three_groups(env)
    master.core.store.refuse = StoreFull("store full")
    with pytest.raises(EscapeFailed):
        await master.escape.put_message(TOPIC, b"x", {}, kind="delay")
    assert sum(len(m.sends) for m in env.masters.values()) == 0
