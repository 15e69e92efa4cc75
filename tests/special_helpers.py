"""Helpers shared by the special-message (transaction, POP) integration tests."""

from __future__ import annotations

import json
from collections.abc import Iterable

from ha_controller.client.admin import NameserverClient
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import eventually


async def create_topic_on(
    addr: str, topic: str, queues: int = 2, *, message_type: str = ""
) -> None:
    """``topic`` on the one broker at ``addr`` (``message_type``: "" is MIXED)."""
    async with ConnectionPool() as pool:
        await pool.call_pb(
            addr,
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            broker_pb2.CreateTopicRequest(
                topic=common_pb2.TopicConfig(
                    topic_name=topic,
                    read_queue_nums=queues,
                    write_queue_nums=queues,
                    perm=6,
                    message_type=message_type,
                )
            ),
            common_pb2.Empty,
        )


async def send_raw(
    pool: ConnectionPool,
    addr: str,
    topic: str,
    queue_id: int,
    properties: dict[str, str],
    *,
    body: bytes = b"m",
    no_replica_wait: bool = False,
    member_escape: bool = False,
) -> broker_pb2.SendResult:
    """One SEND_MESSAGE of one message straight to a broker (no client, no retry);
    ``member_escape`` marks it as a broker's escape, as the escape bridge does."""
    resp = await pool.call_pb(
        addr,
        RequestCode.SEND_MESSAGE,
        broker_pb2.SendMessageRequest(
            producer_group="PG",
            topic=topic,
            queue_id=queue_id,
            no_replica_wait=no_replica_wait,
            member_escape=member_escape,
            entries=[broker_pb2.SendEntry(body=body, properties=properties)],
        ),
        broker_pb2.SendMessageResponse,
        5000,
    )
    return resp.results[0]


async def masters_online(namesrv: str, groups: Iterable[str]) -> None:
    wanted = set(groups)

    async def ok() -> bool:
        async with NameserverClient([namesrv]) as ns:
            online = {g.broker_name for g in await ns.groups() if g.master_online}
        return wanted <= online

    await eventually(ok, timeout=30, interval=0.1)


async def acting(namesrv: str, group: str, addr: str, topic: str = "TX") -> None:
    """Wait until the route of ``topic`` shows ``addr`` as ``group``'s id 0, and the
    broker at ``addr`` knows it serves so (the nameserver publishes the route a few
    milliseconds before its notice reaches the slave: an ack sent in between is
    refused, seen on a fresh clone)."""

    async def ok() -> bool:
        async with NameserverClient([namesrv]) as ns:
            route = await ns.route(topic)
        broker = route.broker(group)
        if broker is None or broker.broker_addrs.get(0) != addr:
            return False
        async with ConnectionPool() as pool:
            resp = await pool.call_pb(
                addr, RequestCode.GET_BROKER_STATUS, common_pb2.Empty(), broker_pb2.BrokerStatus
            )
        st = json.loads(resp.json)
        return not st["isolated"] and (st["role"] == "master" or bool(st["acting"]))

    await eventually(ok, timeout=20, interval=0.1)


async def messages_on(
    pool: ConnectionPool, addrs: Iterable[str], topic: str, queues: int
) -> list[broker_pb2.Message]:
    """Every message of ``topic`` stored on these brokers (a master, an acting slave or a
    plain replica: raw pulls at each address), queue by queue from offset 0."""
    out: list[broker_pb2.Message] = []
    for addr in addrs:
        for q in range(queues):
            offset = 0
            while True:
                resp = await pool.call_pb(
                    addr,
                    RequestCode.PULL_MESSAGE,
                    broker_pb2.PullMessageRequest(
                        consumer_group="CG",
                        topic=topic,
                        queue_id=q,
                        queue_offset=offset,
                        max_msg_nums=64,
                        commit_offset=-1,
                    ),
                    broker_pb2.PullMessageResponse,
                    3000,
                )
                if resp.status != broker_pb2.FOUND:
                    break
                out.extend(resp.messages)
                offset = resp.next_begin_offset
    return out
