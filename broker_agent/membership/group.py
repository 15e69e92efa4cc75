"""The broker's group: who is id 0 now, and what that means for this broker.

"Min broker id" keeps RocketMQ's name, but it is the group's *lead* as the nameserver
tells it: 0 while the master is registered, else the slave chosen to act for it (not
always the lowest id: see ``nameserver.route_table``).  A slave acts only when that
names its own id.

Min-id notifications from the nameserver (NOTIFY_MIN_BROKER_ID_CHANGE), the 1 s
GET_BROKER_MEMBER_GROUP backstop, and EXCHANGE_BROKER_HA_INFO all end in
:meth:`MemberGroupSync.apply_min_broker`, which asks the plain
:class:`~broker_agent.membership.acting.ActingState` for a decision and carries it out
(special services on/off, replication re-pointed, held pulls told).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

from broker_agent.core import BrokerCore
from broker_agent.membership.acting import Decision
from broker_agent.membership.views import believed_view, fresh_window_ms, has_live_master
from ha_controller.proto import broker_pb2, common_pb2, nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import EscapesUnresolved, HaError
from ha_controller.routing import BrokerMemberGroup
from ha_controller.rpc import RequestContext
from ha_controller.rpc.bounds import Throttle
from ha_controller.wire import member_group_from_pb

log = logging.getLogger(__name__)

#: How long the backstop waits for a nameserver's view.
MEMBER_GROUP_TIMEOUT_MS: Final = 2000
#: Once one nameserver answered, how long the others may still take.
STRAGGLER_WAIT_MS: Final = 300
#: How long an acting slave holds its special services for a returning master that
#: contacted it (renewed by every contact): the master's pre-online waits up to 10 s
#: for each slave's HA link and then fetches its tables before it registers.
RETURN_HOLD_S: Final = 20.0
#: How long the answer to a returning master waits for the steps under way (the
#: master's request times out after 3 s and is sent again a second later).
QUIESCE_WAIT_S: Final = 2.5


class MemberGroupSync:
    """Member group, min-id changes and the HA-address exchange."""

    def __init__(self, core: BrokerCore) -> None:
        self.core = core
        #: changes applied so far: a view fetched while a notice changed the role is
        #: older than that notice and is dropped
        self.applied = 0
        self._defer_log = Throttle(5.0)

    def register(self) -> None:
        add = self.core.dispatcher.add
        add(
            RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE,
            nameserver_pb2.NotifyMinBrokerIdChangeRequest,
            self.notify_min_id,
        )
        add(RequestCode.EXCHANGE_BROKER_HA_INFO, broker_pb2.BrokerHaInfo, self.exchange_ha_info)

    # ---- handlers ---------------------------------------------------------------

    async def notify_min_id(
        self, ctx: RequestContext, req: nameserver_pb2.NotifyMinBrokerIdChangeRequest
    ) -> common_pb2.Empty:
        core = self.core
        if core.acting.is_master and req.min_broker_id != core.cfg.broker_id:
            # the nameserver shows another id as the group's lowest: it expired us
            core.fence(f"min-broker-id notice names id {req.min_broker_id}, not us")
            return common_pb2.Empty()
        if not core.isolated:
            if (
                req.min_broker_id == core.cfg.broker_id
                and not core.acting.is_master
                and not core.acting.chosen
            ):
                # told to act: not while another nameserver still hears our master
                # (it expired us on one nameserver only, or one has not heard of its
                # return yet); the backstop acts once they agree
                before = self.applied
                view = await self.a_live_master_is_listed()
                if self.applied != before:
                    return common_pb2.Empty()  # a newer notice was applied meanwhile
                if view is not None:
                    log.info(
                        "not acting on a nameserver's notice: another lists master %s, "
                        "heard %s ms ago",
                        view.broker_addrs.get(0),
                        view.master_heard_ms_ago,
                    )
                    return common_pb2.Empty()
            await self.apply_min_broker(
                req.min_broker_id,
                req.min_broker_addr or None,
                req.offline_broker_addr or None,
                req.ha_broker_addr or None,
            )
        return common_pb2.Empty()

    async def exchange_ha_info(
        self, ctx: RequestContext, req: broker_pb2.BrokerHaInfo
    ) -> broker_pb2.BrokerHaInfo:
        core = self.core
        if req.master_ha_addr:
            # a (returning) master tells this slave where to replicate from
            if not core.acting.is_master:
                if core.ha_slave is not None:
                    core.acting.returning_master(
                        req.master_addr or None, req.master_ha_addr, RETURN_HOLD_S
                    )
                    core.ha_slave.set_master(req.master_ha_addr)
                await self._hold_for_return(req.master_addr)
            return broker_pb2.BrokerHaInfo()
        if not core.acting.is_master:
            return broker_pb2.BrokerHaInfo()
        return broker_pb2.BrokerHaInfo(
            master_ha_addr=core.ha_addr,
            master_flush_offset=core.store.commitlog_max_offset,
            master_addr=core.addr,
        )

    async def _hold_for_return(self, master: str) -> None:
        """An acting slave contacted by its returning master (in pre-online, about to
        take this slave's tables): stop handing special work on, and answer once the
        steps under way have finished, so that the tables count every message handed
        on.  Raises EscapesUnresolved while a step is still under way (an escape
        awaiting its answer); the master asks again, which renews the hold."""
        core = self.core
        decision = core.acting.hold(RETURN_HOLD_S)
        if not core.acting.chosen:
            return  # a plain slave: nothing to hold
        if decision.changed:
            log.info("%s (master %s)", decision, master)
        if decision.stop_special_services:
            core.set_special_services(False)
        try:
            async with asyncio.timeout(QUIESCE_WAIT_S):
                await core.special_steps.idle()
        except TimeoutError:
            raise EscapesUnresolved(
                f"{core.name} still hands on {core.special_steps.under_way} special "
                "message(s) (an escape awaiting its answer); ask again"
            ) from None

    def release_expired_hold(self) -> None:
        """The returning master did not register within the hold: act again."""
        core = self.core
        decision = core.acting.release_expired_hold()
        if not decision.changed:
            return
        log.warning("%s", decision)
        if decision.start_special_services:
            core.offsets.bump_on_next_commit()
            core.set_special_services(True)
        core.update_role_metrics()

    # ---- decisions ---------------------------------------------------------------

    async def apply_min_broker(
        self, min_id: int, min_addr: str | None, offline: str | None, ha_addr: str | None
    ) -> Decision:
        core = self.core
        if min_id == core.cfg.broker_id and not core.acting.is_master and not core.acting.chosen:
            why = core.role.elected_elsewhere(
                core.member_id, time.monotonic(), core.cfg.broker_not_active_timeout_ms
            )
            if why is not None:
                if self._defer_log.hit(time.monotonic()):
                    log.info("%s", why)
                return Decision(False, reason=why)  # asked again at the next view
        decision = core.acting.on_min_broker_change(min_id, min_addr, offline, ha_addr)
        if not decision.changed:
            return decision
        self.applied += 1
        log.info("%s", decision)
        if decision.master_offline and core.ha_slave is not None:
            core.ha_slave.set_master(None)
        if decision.start_special_services:
            core.offsets.bump_on_next_commit()
        if decision.start_special_services or decision.stop_special_services:
            core.set_special_services(decision.start_special_services)
        if decision.master_online and min_addr is not None and core.ha_slave is not None:
            if not ha_addr:
                ha_addr = await self.retrieve_master_ha(min_addr)
            if ha_addr:
                core.acting.master_ha_addr = ha_addr
                core.ha_slave.set_master(ha_addr)
            core.holds.notify_master_online()
        core.update_role_metrics()
        return decision

    async def retrieve_master_ha(self, master_addr: str) -> str | None:
        try:
            info = await self.core.pool.call_pb(
                master_addr,
                RequestCode.EXCHANGE_BROKER_HA_INFO,
                broker_pb2.BrokerHaInfo(),
                broker_pb2.BrokerHaInfo,
                timeout_ms=3000,
            )
        except HaError as exc:
            log.info("cannot retrieve HA info from master %s: %s", master_addr, exc)
            return None
        return info.master_ha_addr or None

    # ---- the member group ------------------------------------------------------------

    async def fetch_views(self) -> list[BrokerMemberGroup]:
        """The group as each nameserver sees it, asked all at once, in ``namesrv_addrs``
        order.  Waits at most ``MEMBER_GROUP_TIMEOUT_MS``, and once one has answered at
        most ``STRAGGLER_WAIT_MS`` for the others: a paused nameserver costs a fraction
        of a second, not the answer of the live one."""
        core = self.core

        async def ask(ns: str) -> BrokerMemberGroup | None:
            try:
                pb = await core.pool.call_pb(
                    ns,
                    RequestCode.GET_BROKER_MEMBER_GROUP,
                    nameserver_pb2.GetBrokerMemberGroupRequest(
                        cluster=core.cfg.cluster, broker_name=core.cfg.broker_name
                    ),
                    nameserver_pb2.BrokerMemberGroup,
                    timeout_ms=MEMBER_GROUP_TIMEOUT_MS,
                )
            except (HaError, OSError) as exc:
                log.debug("member group from %s failed: %s", ns, exc)
                return None
            return member_group_from_pb(pb)

        tasks = [asyncio.ensure_future(ask(ns)) for ns in core.cfg.namesrv_addrs]
        try:
            pending: set[asyncio.Future[BrokerMemberGroup | None]] = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(t.result() is not None for t in done):
                    if pending:
                        await asyncio.wait(pending, timeout=STRAGGLER_WAIT_MS / 1000)
                    break
        finally:
            for t in tasks:
                t.cancel()
        return [
            view
            for t in tasks
            if t.done() and not t.cancelled() and (view := t.result()) is not None
        ]

    def fresh_ms(self) -> int:
        cfg = self.core.cfg
        return fresh_window_ms(cfg.broker_heartbeat_interval_ms, cfg.broker_not_active_timeout_ms)

    async def fetch_member_group(self) -> BrokerMemberGroup | None:
        """The view this broker follows when the nameservers disagree
        (:func:`~broker_agent.membership.views.believed_view`)."""
        return believed_view(await self.fetch_views(), self.fresh_ms())

    async def a_live_master_is_listed(self) -> BrokerMemberGroup | None:
        """A nameserver's view that lists a master it heard from recently, if any."""
        fresh = self.fresh_ms()
        return next((v for v in await self.fetch_views() if has_live_master(v, fresh)), None)

    async def loop(self) -> None:
        """The backstop for min-id notifications: every ``sync_broker_member_group_period_ms``
        (1 s) the member group is read again, as RocketMQ's syncBrokerMemberGroup does."""
        core = self.core
        while True:
            await asyncio.sleep(core.cfg.sync_broker_member_group_period_ms / 1000)
            self.release_expired_hold()
            if core.isolated:
                continue
            before = self.applied
            group = await self.fetch_member_group()
            if group is None or not group.broker_addrs or self.applied != before:
                continue  # nothing known, or a notice applied meanwhile is newer
            core.member_group = group
            if core.acting.is_master and group.broker_addrs.get(0) != core.addr:
                core.fence(f"the member group lists id 0 as {group.broker_addrs.get(0)}")
                continue
            # the lead: the master, else the slave the nameserver chose to act (the
            # most advanced one that can write), which need not be the lowest id
            lead = group.lead_broker_id()
            await self.apply_min_broker(lead, group.broker_addrs.get(lead), None, None)
