"""Which nameserver a slave believes when they disagree about who leads its group.

Campaign seed 5001: a returning master's registration with one of two nameservers hung
on a connection the partition had broken; that nameserver still named the acting slave
for 4.5 s, and the slave, asking it first every second, acted again beside its master
(a POP message was popped twice).  The rule (``broker_agent.membership.views``) as a
plain function, then the backstop and the min-id notice against nameservers on real
sockets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from broker_agent.core import BrokerCore
from broker_agent.membership import group as group_module
from broker_agent.membership.group import STRAGGLER_WAIT_MS, MemberGroupSync
from broker_agent.membership.preonline import PreOnline
from broker_agent.membership.views import believed_view, fresh_window_ms, has_live_master
from broker_agent.metadata.forward import ForwardSync
from broker_agent.replication.ha import HaSlave
from ha_controller.config import BrokerConfig
from ha_controller.proto import broker_pb2, nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import EscapesUnresolved
from ha_controller.routing import SETTLING, BrokerMemberGroup
from ha_controller.rpc import Dispatcher, RequestContext, RpcServer
from ha_controller.wire import member_group_to_pb

MASTER, SLAVE = "10.0.0.1:10911", "10.0.0.2:10911"
FRESH = 900
ACTING = BrokerMemberGroup("c", "g1", {1: SLAVE}, acting_broker_id=1)
MASTER_LIVE = BrokerMemberGroup("c", "g1", {0: MASTER, 1: SLAVE}, master_heard_ms_ago=120)
MASTER_SILENT = BrokerMemberGroup("c", "g1", {0: MASTER, 1: SLAVE}, master_heard_ms_ago=1500)


# ---- the rule -------------------------------------------------------------------------


def test_a_view_that_still_hears_the_master_wins_in_any_order() -> None:
    assert believed_view([ACTING, MASTER_LIVE], FRESH) == MASTER_LIVE
    assert believed_view([MASTER_LIVE, ACTING], FRESH) == MASTER_LIVE


def test_a_nameserver_that_has_not_expired_a_silent_master_yet_is_not_believed() -> None:
    """The other nameserver expired the killed master first: the acting slave acts at
    once and is not stopped a second later by the slower nameserver (or one resumed
    after a pause, which lists the masters it knew before)."""
    assert believed_view([MASTER_SILENT, ACTING], FRESH) == ACTING
    assert believed_view([ACTING, MASTER_SILENT], FRESH) == ACTING
    # nobody says who acts: the silent master's view, which starts nothing
    assert believed_view([MASTER_SILENT], FRESH) == MASTER_SILENT
    assert believed_view([], FRESH) is None


def test_a_settling_view_does_not_stop_a_slave_another_nameserver_chose() -> None:
    """Check campaign seed 10002: the second nameserver expired the master 30 ms after
    the first and settled for 0.3 s; the acting slave's backstop took its "nobody acts
    yet" and stopped, then started again 12 ms later."""
    settling = BrokerMemberGroup("c", "g1", {1: SLAVE, 2: "s2"}, acting_broker_id=SETTLING)
    acting = BrokerMemberGroup("c", "g1", {1: SLAVE, 2: "s2"}, acting_broker_id=1)
    for views in ([settling, acting], [acting, settling]):
        assert believed_view(views, 600) == acting
    assert believed_view([settling], 600) == settling  # nobody chose yet: nobody acts
    assert believed_view([settling, MASTER_LIVE], 600) == MASTER_LIVE


def test_an_old_nameserver_that_does_not_say_when_it_heard_counts_as_recent() -> None:
    old = BrokerMemberGroup("c", "g1", {0: MASTER, 1: SLAVE})
    assert has_live_master(old, FRESH)
    assert believed_view([ACTING, old], FRESH) == old
    assert not has_live_master(ACTING, FRESH)
    assert not has_live_master(MASTER_SILENT, FRESH)


def test_the_fresh_window() -> None:
    assert fresh_window_ms(1000, 10_000) == 3000
    assert fresh_window_ms(300, 2000) == 900
    assert fresh_window_ms(900, 2000) == 1000  # at most half the not-active timeout


# ---- on sockets -------------------------------------------------------------------------


class Nameserver:
    def __init__(self, view: BrokerMemberGroup | None) -> None:
        self.view = view  # None: it never answers (paused)
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


class Slave:
    """MemberGroupSync of slave id 1 of a real BrokerCore (its store in ``tmp``) over
    ``views`` (one nameserver each)."""

    def __init__(self, tmp: Path, views: Sequence[BrokerMemberGroup | None]) -> None:
        self.tmp = tmp
        self.views = views
        self.servers: list[Nameserver] = []
        self.started: list[bool] = []
        self.core: BrokerCore | None = None

    async def __aenter__(self) -> MemberGroupSync:
        self.servers = [await Nameserver(v).start() for v in self.views]
        core = self.core = BrokerCore(
            BrokerConfig(
                cluster="c",
                broker_name="g1",
                broker_id=1,
                namesrv_addrs=tuple(s.addr for s in self.servers),
                broker_heartbeat_interval_ms=300,
                broker_not_active_timeout_ms=2000,
                store_dir=str(self.tmp / f"g1-1-{len(list(self.tmp.iterdir()))}"),
            )
        )
        core.isolated = False
        acting = core.acting
        acting.min_broker_id, acting.min_broker_addr, acting.master_addr = 0, MASTER, MASTER
        core.add_special_service(self.started.append)
        return MemberGroupSync(core)

    async def __aexit__(self, *exc: object) -> None:
        for s in self.servers:
            assert s.server is not None
            await s.server.aclose(grace_s=0.1)
        if self.core is not None:
            await self.core.pool.aclose()
            self.core.store.close()


def master_core(tmp_path: Path) -> BrokerCore:
    """The core of group g1's master, its store under ``tmp_path``, no nameserver."""
    return BrokerCore(
        BrokerConfig(
            cluster="c",
            broker_name="g1",
            broker_id=0,
            namesrv_addrs=("127.0.0.1:1",),
            store_dir=str(tmp_path / "g1-0"),
        )
    )


async def step_under_way(core: BrokerCore, ends: asyncio.Event) -> asyncio.Task[None]:
    """A special-service step of ``core`` that lasts until ``ends`` is set (started)."""

    async def step() -> None:
        with core.special_steps.step():
            await ends.wait()

    task = asyncio.create_task(step())
    await asyncio.sleep(0)
    return task


def act_notice() -> nameserver_pb2.NotifyMinBrokerIdChangeRequest:
    return nameserver_pb2.NotifyMinBrokerIdChangeRequest(
        min_broker_id=1, min_broker_addr=SLAVE, offline_broker_addr=MASTER
    )


async def test_the_backstop_believes_the_nameserver_that_hears_the_returned_master(
    tmp_path: Path,
) -> None:
    async with Slave(tmp_path, [ACTING, MASTER_LIVE]) as sync:
        assert await sync.fetch_member_group() == MASTER_LIVE
    async with Slave(tmp_path, [MASTER_SILENT, ACTING]) as sync:
        assert await sync.fetch_member_group() == ACTING


async def test_a_paused_nameserver_costs_a_fraction_of_a_second(tmp_path: Path) -> None:
    async with Slave(tmp_path, [None, ACTING]) as sync:
        t0 = time.monotonic()
        assert await sync.fetch_views() == [ACTING]
        assert time.monotonic() - t0 < 1.5 * STRAGGLER_WAIT_MS / 1000 + 0.5


async def test_a_notice_to_act_is_not_followed_while_another_nameserver_hears_the_master(
    tmp_path: Path,
) -> None:
    slave = Slave(tmp_path, [ACTING, MASTER_LIVE])
    async with slave as sync:
        await sync.notify_min_id(cast(Any, None), act_notice())
        assert not sync.core.acting.acting
        assert slave.started == []
    # once the other nameserver has not heard from the master for a while, it acts
    slave = Slave(tmp_path, [ACTING, MASTER_SILENT])
    async with slave as sync:
        await sync.notify_min_id(cast(Any, None), act_notice())
        assert sync.core.acting.acting
        assert slave.started == [True]


async def test_a_returning_master_holds_the_acting_slave_until_no_step_is_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The returning master's EXCHANGE_BROKER_HA_INFO stops the acting slave's special
    services; the answer waits for the step under way (an escape awaiting its answer)
    and says EscapesUnresolved while it lasts; the master asks again and is answered
    once it ended.  The hold ends when the master registers, or runs out."""
    monkeypatch.setattr(group_module, "QUIESCE_WAIT_S", 0.2)
    slave = Slave(tmp_path, [ACTING])
    returning = broker_pb2.BrokerHaInfo(master_ha_addr="10.0.0.1:10912", master_addr=MASTER)
    async with slave as sync:
        core = sync.core
        await sync.apply_min_broker(1, SLAVE, MASTER, None)
        assert core.acting.acting and slave.started == [True]
        escape_answered = asyncio.Event()
        step = await step_under_way(core, escape_answered)  # an escape awaiting its answer
        with pytest.raises(EscapesUnresolved):
            await sync.exchange_ha_info(cast(Any, None), returning)
        assert slave.started == [True, False]  # stopped at the first contact
        assert not core.acting.acting and not core.acting.serves_master_only_ops
        escape_answered.set()
        await step
        await sync.exchange_ha_info(cast(Any, None), returning)  # asked again: answered
        assert slave.started == [True, False]
        # the master did not register in time (it froze again): the slave acts again
        monkeypatch.setattr(group_module, "RETURN_HOLD_S", 0.05)
        await sync.exchange_ha_info(cast(Any, None), returning)
        await asyncio.sleep(0.1)
        sync.release_expired_hold()
        assert core.acting.acting and slave.started == [True, False, True]
        # held again; this time the master registers: the hold ends, the slave is a slave
        monkeypatch.setattr(group_module, "RETURN_HOLD_S", 20.0)
        await sync.exchange_ha_info(cast(Any, None), returning)
        await sync.apply_min_broker(0, MASTER, None, None)
        assert core.acting.held_until is None and core.acting.role == "slave"
        assert slave.started == [True, False, True, False]


async def test_a_fenced_masters_pre_online_waits_for_its_special_work_under_way(
    tmp_path: Path,
) -> None:
    """Long campaign seed 1027: a master fenced while a delivery waited for its
    replicas took its acting slave's delay offsets in pre-online; the delivery then
    ended and moved the offset past a message stored after the return, which was
    never delivered.  Pre-online now reads the member group (and takes any table) only
    once the steps under way have ended."""
    core = master_core(tmp_path)
    asked: list[int] = []

    class Members:
        """The member group as pre-online reads it: records when it was asked."""

        async def fetch_member_group(self) -> None:
            asked.append(core.special_steps.under_way)
            core.isolated = False  # end the loop: this test is about what comes first
            return None

    delivery_done = asyncio.Event()
    step = await step_under_way(core, delivery_done)  # a delivery waiting for replicas
    core.isolated = True

    async def register() -> None: ...

    forward = ForwardSync(core, [], {}, register)  # no table to sync
    preonline = PreOnline(core, cast(Any, Members()), cast(Any, None), forward, cast(Any, None))
    run = asyncio.create_task(preonline.run())
    await asyncio.sleep(0.2)
    assert asked == [] and core.preonline_step == "finishing the special work under way"
    delivery_done.set()
    await step
    await asyncio.wait_for(run, 5)
    assert asked == [0]
    await core.pool.aclose()
    core.store.close()


async def test_a_master_waiting_for_its_data_keeps_saying_why_while_it_reads_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI (stop 39): a wiped master's status was sampled while it re-read its member
    group and said "reading member group" instead of why it waits.  The reason stays
    shown on every retry."""
    from broker_agent.membership import preonline as preonline_module

    monkeypatch.setattr(preonline_module, "RETRY_S", 0.01)
    core = master_core(tmp_path)
    seen: list[str] = []

    class Members:
        """A group that held more than this empty store, with no slave listed."""

        async def fetch_member_group(self) -> BrokerMemberGroup:
            seen.append(core.preonline_step)
            if len(seen) == 4:
                core.isolated = False  # end the loop
            return BrokerMemberGroup("c", "g1", {}, max_offset_seen=4096)

    core.isolated = True

    async def register() -> None: ...

    forward = ForwardSync(core, [], {}, register)
    preonline = PreOnline(core, cast(Any, Members()), cast(Any, None), forward, cast(Any, None))
    await asyncio.wait_for(preonline.run(), 5)
    assert seen[0] == "reading member group"
    assert all("held data up to 4096" in step for step in seen[1:]), seen
    await core.pool.aclose()
    core.store.close()


async def test_a_view_without_a_master_does_not_cut_a_returning_masters_ha_link(
    tmp_path: Path,
) -> None:
    """The slave learns where its returning master replicates from (EXCHANGE_BROKER_HA_INFO
    in the master's pre-online); the nameservers, which the master has not registered
    with yet, list no master.  The slave's HA side keeps the master's address."""
    slave = Slave(tmp_path, [ACTING])
    async with slave as sync:
        core = sync.core
        ha = HaSlave(core.store, SLAVE, 1, lambda _d: None, broker_name="g1")
        core.ha_slave = ha
        returning = broker_pb2.BrokerHaInfo(master_ha_addr="10.0.0.1:10912", master_addr=MASTER)
        await sync.exchange_ha_info(cast(Any, None), returning)
        assert ha.master_ha_addr == "10.0.0.1:10912"
        await sync.apply_min_broker(-1, None, None, None)
        await sync.apply_min_broker(1, SLAVE, MASTER, None)
        assert ha.master_ha_addr == "10.0.0.1:10912"
        assert core.acting.acting  # it acts until the master holds it
