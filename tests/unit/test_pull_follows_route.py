"""A long poll held by a broker that stops serving the group's reads is dropped and sent
to the broker the route names now (campaign seed 5001: a partitioned master held a
consumer's poll for 7 s, until the partition healed, while the acting slave served the
queue's messages)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ha_controller.client import MessageQueue, NameserverClient, RouteCache
from ha_controller.client.pull_consumer import PullConsumer
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.routing import BrokerData, Perm, QueueData, TopicRouteData
from ha_controller.rpc import ConnectionPool, Dispatcher, RequestContext, RpcServer
from ha_controller.testing import eventually

TOPIC = "T"
GROUP = "broker-a"
MQ = MessageQueue(TOPIC, GROUP, 0)


class Broker:
    """Answers pulls with ``next_begin_offset``; ``hold`` ones it never answers."""

    def __init__(self, next_offset: int, *, hold: bool) -> None:
        self.next_offset = next_offset
        self.hold = hold
        self.pulls = 0
        self.server: RpcServer | None = None
        self.addr = ""

    async def start(self) -> Broker:
        d = Dispatcher()
        d.add(RequestCode.PULL_MESSAGE, broker_pb2.PullMessageRequest, self._pull)
        self.server = RpcServer(d, name=f"broker-{self.next_offset}")
        host, port = await self.server.start("127.0.0.1", 0)
        self.addr = f"{host}:{port}"
        return self

    async def _pull(
        self, ctx: RequestContext, req: broker_pb2.PullMessageRequest
    ) -> broker_pb2.PullMessageResponse:
        self.pulls += 1
        if self.hold:
            await asyncio.Event().wait()  # frozen, or cut off: no answer ever comes
        return broker_pb2.PullMessageResponse(
            status=broker_pb2.NO_NEW_MSG, next_begin_offset=self.next_offset
        )


def route(addr: str, perm: int = Perm.READ | Perm.WRITE) -> TopicRouteData:
    return TopicRouteData(
        TOPIC, [BrokerData("c", GROUP, {0: addr}, True)], [QueueData(GROUP, 1, 1, perm)]
    )


@pytest.fixture
async def brokers() -> AsyncIterator[tuple[Broker, Broker]]:
    master = await Broker(1, hold=True).start()
    slave = await Broker(7, hold=False).start()
    yield master, slave
    for b in (master, slave):
        assert b.server is not None
        await b.server.aclose(grace_s=0.1)


async def test_a_held_pull_follows_the_route_to_the_acting_slave(
    brokers: tuple[Broker, Broker],
) -> None:
    master, slave = brokers
    routes = RouteCache(NameserverClient(["127.0.0.1:1"]), watch=False)
    routes.update(route(master.addr))
    async with ConnectionPool() as pool:
        consumer = PullConsumer("127.0.0.1:1", "G", routes=routes, pool=pool, retry_backoff_s=0)
        polling = asyncio.create_task(consumer.pull(MQ, 0, suspend_timeout_ms=15_000))
        await eventually(lambda: master.pulls == 1, timeout=5)
        # the master is expired: the route shows the acting slave as id 0, read-only
        routes.update(route(slave.addr, Perm.READ))

        result = await asyncio.wait_for(polling, 3)

        assert result.next_begin_offset == 7
        assert slave.pulls == 1
        await consumer.aclose()
        await routes.aclose()


async def test_a_route_change_elsewhere_leaves_the_poll_alone(
    brokers: tuple[Broker, Broker],
) -> None:
    _master, slave = brokers
    routes = RouteCache(NameserverClient(["127.0.0.1:1"]), watch=False)
    routes.update(route(slave.addr))
    async with ConnectionPool() as pool:
        consumer = PullConsumer("127.0.0.1:1", "G", routes=routes, pool=pool)
        slave.hold = True
        polling = asyncio.create_task(consumer.pull(MQ, 0, suspend_timeout_ms=15_000))
        await eventually(lambda: slave.pulls == 1, timeout=5)
        # the same reader, another queue count: not a move
        routes.update(
            TopicRouteData(
                TOPIC,
                [BrokerData("c", GROUP, {0: slave.addr}, True)],
                [QueueData(GROUP, 2, 2, Perm.READ | Perm.WRITE)],
            )
        )
        await asyncio.sleep(0.2)
        assert not polling.done()
        polling.cancel()
        await consumer.aclose()
        await routes.aclose()
