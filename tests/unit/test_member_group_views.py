"""The member-group backstop asks every nameserver and trusts a view with a registered
master over one without (campaign seed 5001: a returning master's registration with one
nameserver hung on a stale connection; that nameserver still named the acting slave,
and the slave, asking it first every second, acted again beside its master)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from broker_agent.membership.group import MemberGroupSync
from ha_controller.proto import nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.routing import BrokerMemberGroup
from ha_controller.rpc import ConnectionPool, Dispatcher, RequestContext, RpcServer
from ha_controller.wire import member_group_to_pb

MASTER, SLAVE = "10.0.0.1:10911", "10.0.0.2:10911"
ACTING = BrokerMemberGroup("c", "g1", {1: SLAVE}, acting_broker_id=1)
MASTER_BACK = BrokerMemberGroup("c", "g1", {0: MASTER, 1: SLAVE})


class Nameserver:
    def __init__(self, view: BrokerMemberGroup | None) -> None:
        self.view = view  # None: it never answers (frozen)
        self.server: RpcServer | None = None
        self.addr = ""

    async def start(self) -> Nameserver:
        d = Dispatcher()
        d.add(
            RequestCode.GET_BROKER_MEMBER_GROUP,
            nameserver_pb2.GetBrokerMemberGroupRequest,
            self._member_group,
        )
        self.server = RpcServer(d, name="ns")
        host, port = await self.server.start("127.0.0.1", 0)
        self.addr = f"{host}:{port}"
        return self

    async def _member_group(
        self, ctx: RequestContext, req: nameserver_pb2.GetBrokerMemberGroupRequest
    ) -> nameserver_pb2.BrokerMemberGroup:
        if self.view is None:
            await asyncio.Event().wait()
        assert self.view is not None
        return member_group_to_pb(self.view)


@pytest.fixture
async def pool() -> AsyncIterator[ConnectionPool]:
    async with ConnectionPool() as p:
        yield p


async def views_of(pool: ConnectionPool, *views: BrokerMemberGroup | None) -> Any:
    servers = [await Nameserver(v).start() for v in views]
    core = SimpleNamespace(
        pool=pool,
        cfg=SimpleNamespace(
            cluster="c", broker_name="g1", namesrv_addrs=tuple(s.addr for s in servers)
        ),
    )
    try:
        return await MemberGroupSync(cast(Any, core)).fetch_member_group()
    finally:
        for s in servers:
            assert s.server is not None
            await s.server.aclose(grace_s=0.1)


async def test_a_view_with_the_master_wins_over_a_stale_acting_one(pool: ConnectionPool) -> None:
    assert await views_of(pool, ACTING, MASTER_BACK) == MASTER_BACK
    assert await views_of(pool, MASTER_BACK, ACTING) == MASTER_BACK


async def test_agreeing_views_and_a_silent_nameserver(pool: ConnectionPool) -> None:
    assert await views_of(pool, ACTING, ACTING) == ACTING
    # a frozen nameserver costs its timeout, not the answer of the other
    assert await views_of(pool, None, ACTING) == ACTING
