"""A controller-mode broker's dealings with the controller (docs/failover.md).

- **Views.**  Every registration and heartbeat answer carries the group's state as the
  nameserver's controller holds it (:meth:`ControllerLink.on_view`): a member that
  serves under another id than the state gives it, or a master that is not the
  state's, stops and is rebuilt in its new role; a slave that only learns of a newer
  epoch keeps running (its HA link checks the new master's epochs when it attaches).
- **Role notices.**  ``NOTIFY_BROKER_ROLE_CHANGED``: the controller elected a master
  (or switched one by plan); the same check, at once.
- **Asked for** (:meth:`ControllerLink.check_role`): a fenced master neither
  registers nor heartbeats, and a notice sent while it was cut off is lost, so every
  pre-online cycle asks the controller for its view (the same check): a master that
  was replaced meanwhile rejoins as a slave instead of trying to catch up from the
  new epoch's logs as an old master.
- **The sync-state set** (master): the set every write waits for follows the links
  (:class:`~broker_agent.replication.sync_set.SyncSet`), each change asked of the
  controller (``CONTROLLER_ALTER_SYNC_STATE_SET``); ``StaleEpoch`` in the answer
  means this master was replaced, and it steps down.
- **Planned switch** (master): ``PREPARE_SWITCH`` stops writes until the target holds
  everything, for at most the request's timeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from broker_agent.core import BrokerCore
from broker_agent.membership.roles import RoleChange, ask_role
from ha_controller.controller.ports import View
from ha_controller.controller.wire import state_from_pb, view_from_pb
from ha_controller.proto import broker_pb2, common_pb2, nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BadRequest, HaError, NotMaster, StaleEpoch
from ha_controller.rpc import RequestContext

__all__ = ["ControllerLink"]

log = logging.getLogger(__name__)

#: how often a master compares its links with its sync-state set
SYNC_CHECK_S = 0.1


class ControllerLink:
    """One controller-mode broker's side of the controller."""

    def __init__(self, core: BrokerCore) -> None:
        self.core = core

    def register(self) -> None:
        d = self.core.dispatcher
        d.add(
            RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
            nameserver_pb2.NotifyBrokerRoleChangedRequest,
            self._on_role_notice,
        )
        d.add(RequestCode.GET_BROKER_EPOCH_CACHE, broker_pb2.EpochRequest, self._on_epochs)
        d.add(RequestCode.PREPARE_SWITCH, broker_pb2.PrepareSwitchRequest, self._on_prepare)

    # ---- views -------------------------------------------------------------------------

    async def check_role(self) -> bool:
        """Ask the controller for this member's view and act on it; True when this
        member changes role (the service is rebuilt: the caller stops)."""
        core = self.core
        view = await ask_role(
            core.pool,
            core.cfg.namesrv_addrs,
            cluster=core.cfg.cluster,
            group=core.cfg.broker_name,
            member=core.member_id,
            addr=core.addr,
            max_offset=core.store.commitlog_max_offset,
            epoch=core.role.epoch if core.epochs is None else core.epochs.last,
        )
        return view is not None and self.on_view(view, source="asked in pre-online")

    def on_view(self, view: View, *, fence_wait_ms: int = 0, source: str = "") -> bool:
        """Act on the controller's view of this member (see the module's docstring);
        True when it changes role."""
        core = self.core
        state = view.state
        if not view.enabled or state is None:
            return False
        if state.epoch < core.role.epoch:
            return False  # an older copy of the state than ours (a nameserver behind)
        route_id = state.route_id(core.member_id)
        replaced = core.acting.is_master and (
            state.epoch > core.role.epoch or state.master != core.member_id
        )
        if route_id != core.cfg.broker_id or replaced:
            core.change_role(
                RoleChange(
                    f"epoch {state.epoch}{f' ({source})' if source else ''}: member "
                    f"{state.master} is master, this member {core.member_id} serves as id "
                    f"{route_id}",
                    view=view,
                    fence_wait_ms=fence_wait_ms,
                )
            )
            return True
        if state.epoch > core.role.epoch:
            core.role = dataclasses.replace(core.role, state=state, learnt_at=time.monotonic())
        return False

    def stale(self, exc: StaleEpoch, where: str) -> None:
        """A nameserver refused this member's epoch or id: ask again, in a new role."""
        self.core.change_role(RoleChange(f"{where}: {exc}"))

    async def _on_role_notice(
        self, ctx: RequestContext, req: nameserver_pb2.NotifyBrokerRoleChangedRequest
    ) -> common_pb2.Empty:
        core = self.core
        if req.broker_name != core.cfg.broker_name:
            raise BadRequest(f"role notice for {req.broker_name}, this is {core.cfg.broker_name}")
        state = state_from_pb(req.cluster, req.broker_name, req.state)
        self.on_view(
            View(True, state, req.route_id),
            fence_wait_ms=req.fence_wait_ms,
            source="role notice",
        )
        return common_pb2.Empty()

    # ---- the master's side ----------------------------------------------------------------

    async def _on_epochs(
        self, ctx: RequestContext, req: broker_pb2.EpochRequest
    ) -> broker_pb2.EpochCache:
        core = self.core
        if core.epochs is None:
            raise BadRequest(f"{core.name} has no epochs (no controller)")
        return broker_pb2.EpochCache(
            epochs=[broker_pb2.EpochEntry(epoch=e, start_offset=s) for e, s in core.epochs.entries],
            max_offset=core.store.commitlog_max_offset,
            epoch=core.epochs.last,
        )

    async def _on_prepare(
        self, ctx: RequestContext, req: broker_pb2.PrepareSwitchRequest
    ) -> broker_pb2.PrepareSwitchResponse:
        """Stop taking writes; answer once member ``target`` holds everything (or the
        timeout passed: then writes resume)."""
        core = self.core
        ha = core.ha_master
        if not core.acting.is_master or ha is None or req.epoch != core.role.epoch:
            raise NotMaster(
                f"{core.name} is not the master of epoch {req.epoch} (its epoch: {core.role.epoch})"
            )
        timeout_s = max(0.1, req.timeout_ms / 1000)
        core.paused_until = time.monotonic() + timeout_s
        core.paused_for = f"switching to member {req.target_member}"
        log.warning(
            "planned switch: taking no writes while member %d catches up", req.target_member
        )
        deadline = time.monotonic() + timeout_s
        end = core.store.commitlog_max_offset
        while time.monotonic() < deadline:
            end = core.store.commitlog_max_offset
            if ha.acked_by_member().get(req.target_member, -1) >= end:
                # paused until the role change (or the timeout, should it never come)
                return broker_pb2.PrepareSwitchResponse(caught_up=True, end_offset=end)
            await asyncio.sleep(0.005)
        core.paused_until = 0.0
        log.warning(
            "planned switch: member %d did not catch up; taking writes again", req.target_member
        )
        return broker_pb2.PrepareSwitchResponse(
            caught_up=False,
            end_offset=end,
            detail=f"member {req.target_member} holds "
            f"{ha.acked_by_member().get(req.target_member, -1)} of {end}",
        )

    async def sync_loop(self) -> None:
        """Keep the sync-state set in step with the links (module docstring)."""
        core = self.core
        sync, ha = core.sync, core.ha_master
        if sync is None or ha is None:
            return
        while True:
            await asyncio.sleep(SYNC_CHECK_S)
            if core.isolated:
                continue
            proposal = sync.observe(
                ha.acked_by_member(), core.store.commitlog_max_offset, time.monotonic() * 1000
            )
            if proposal is None:
                continue
            log.info("sync-state set: asking for %s (%s)", sorted(proposal.members), proposal.why)
            try:
                view = await self._alter(sorted(proposal.members))
            except StaleEpoch as exc:
                sync.answered(None)
                self.stale(exc, "sync-state set change")
                return
            except HaError as exc:
                sync.answered(None)
                log.warning("sync-state set change not confirmed: %s; asking again", exc)
                await asyncio.sleep(0.5)
                continue
            sync.answered(None if view.state is None else view.state.sync_set)
            await ha.sync_changed()
            core.metrics.sync_state_set_size.labels(**core.metrics.ident).set(len(sync.confirmed))

    async def _alter(self, members: list[int]) -> View:
        core = self.core
        req = nameserver_pb2.AlterSyncStateSetRequest(
            cluster=core.cfg.cluster,
            broker_name=core.cfg.broker_name,
            master_member=core.member_id,
            epoch=core.role.epoch,
            sync_state_set=members,
        )
        last: HaError | None = None
        for ns in core.cfg.namesrv_addrs:
            try:
                pb = await core.pool.call_pb(
                    ns,
                    RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
                    req,
                    nameserver_pb2.ControllerView,
                    timeout_ms=3000,
                )
            except StaleEpoch:
                raise
            except HaError as exc:
                last = exc
                continue
            return view_from_pb(core.cfg.cluster, core.cfg.broker_name, pb)
        assert last is not None
        raise last
