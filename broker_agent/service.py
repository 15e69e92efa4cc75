"""The broker service: the composition root of one broker.

It builds the parts around one :class:`~broker_agent.core.BrokerCore` (the write path,
the escape bridge, the special services, locks, the request handlers, membership),
registers their handlers, owns the TaskGroup every background loop runs in, and shuts
down in phases:

1. stop accepting (no new connections or requests), then hand the special work
   over: no new step starts, and the steps under way (an escape and the progress it
   earns) finish, bounded,
2. unregister from the nameservers (clients move away),
3. drain in-flight requests (bounded),
4. cancel the background loops (special services persist their progress),
5. close the HA ends and the connection pool, persist offsets, close the store.

A role change (controller mode) stops the same way, and the next run of the broker
(``broker_agent.runner``) opens the same tables: an acting slave elected master starts
its master duties from what it handed on while acting, not from the old master's
progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from broker_agent.core import BrokerCore
from broker_agent.handlers.clients import ClientHandlers
from broker_agent.handlers.messages import MessageHandlers
from broker_agent.handlers.queries import QueryHandlers
from broker_agent.locks.service import LockService
from broker_agent.membership.controlled import ControllerLink
from broker_agent.membership.epochs import Epoch, EpochFile
from broker_agent.membership.group import MemberGroupSync
from broker_agent.membership.preonline import PreOnline
from broker_agent.membership.registration import Registrar
from broker_agent.membership.roles import Role, RoleChange
from broker_agent.membership.writability import WritabilityWatch
from broker_agent.metadata.acl_table import acl_table_sync
from broker_agent.metadata.forward import ForwardSync
from broker_agent.metadata.versioned import VersionedTable
from broker_agent.replication.catchup import CatchUp, CommitLogRangeService
from broker_agent.replication.ha import HaSlave
from broker_agent.replication.repair import RepairService
from broker_agent.special.escape import EscapeBridge
from broker_agent.special.pop import PopService
from broker_agent.special.ports import Neighbours
from broker_agent.special.schedule import ScheduleService
from broker_agent.special.transaction import TransactionService, store_target
from broker_agent.store.message_store import MessageStore
from broker_agent.store.repair import Damage
from broker_agent.write_path import WritePath
from ha_controller.acl import AclTable
from ha_controller.acl.service import AclService
from ha_controller.acl.sync import push_table
from ha_controller.config import BrokerConfig
from ha_controller.protocol.errors import HaError
from ha_controller.rpc import RpcConnection

log = logging.getLogger(__name__)

#: How long in-flight requests may take to finish once a stop begins.
DRAIN_GRACE_S = 2.0
#: How long the special steps under way may take to finish once a stop begins (an
#: escape waiting for a frozen target's answer: cut off, the next master hands the
#: message on again, and the target may store it on resume)
HANDOVER_WAIT_S = 5.0


class Listener(Protocol):
    """The broker's RPC listener as the shutdown sees it (ha_controller.rpc.RpcServer)."""

    def stop_accepting(self) -> None: ...

    async def aclose(self, grace_s: float = ...) -> None: ...


class BrokerService:
    """One broker: builds its parts, runs their loops, stops them in order."""

    def __init__(
        self,
        cfg: BrokerConfig,
        *,
        store: MessageStore | None = None,
        member_id: int | None = None,
        role: Role | None = None,
        epochs: EpochFile | None = None,
    ) -> None:
        self.cfg = cfg
        self.core = core = BrokerCore(
            cfg, store=store, member_id=member_id, role=role, epochs=epochs
        )
        self.write_path = WritePath(core)
        #: controller mode: the controller's views, role notices, the sync-state set
        self.controller_link = ControllerLink(core) if core.role.controlled else None
        link = self.controller_link
        self.registrar = Registrar(
            core,
            on_view=None if link is None else link.on_view,
            on_stale=None if link is None else link.stale,
        )
        #: why this run ends early: the broker changes role (broker_agent.runner)
        self.role_change: RoleChange | None = None
        self._role_changed = asyncio.Event()
        core.on_role_change(self._change_role)
        core.on_topics_changed(self.registrar.register_soon)
        self.writability = WritabilityWatch(core, self.registrar.register_all)
        core.on_store_state_changed(self.writability.changed)
        self.group = MemberGroupSync(core)
        self.escape = EscapeBridge(core, self.write_path)
        self.schedule = ScheduleService(
            core, self.write_path, self.escape, fetch_members=self.group.fetch_member_group
        )
        self.transactions = TransactionService(core, self.write_path, self.escape)
        self.pop = PopService(core, self.write_path, self.escape)
        self.locks = LockService(
            core, self.group.fetch_member_group, marker=core.store_dir / "lock_votes.json"
        )
        special_tables: list[VersionedTable] = [
            *self.schedule.tables(),
            self.transactions.table(),
            *self.pop.tables(),
        ]
        # ACL 2.0 at runtime: changes made here, the table kept in step like the others
        AclService(
            core.acl,
            core.dispatcher,
            cluster_enabled=core.auth.enabled,
            changes=True,
            on_change=self._spread_acl,
        )
        if core.acl.holder is not None:
            special_tables.append(acl_table_sync(core.acl.holder))
        self.metadata_sync = ForwardSync(
            core,
            special_tables,
            self.schedule.progress_records(),
            self.registrar.register_all,
        )
        self.preonline = PreOnline(
            core,
            self.group,
            self.registrar,
            self.metadata_sync,
            CatchUp(core.store, core.pool),
            check_role=None if link is None else link.check_role,
        )
        core.on_fence(self.preonline.fence)
        MessageHandlers(core, self.write_path, store_target).register()
        QueryHandlers(core, self.write_path).register()
        ClientHandlers(
            core, self.transactions.producer_seen, self.registrar.register_all
        ).register()
        self.group.register()
        if link is not None:
            link.register()
        CommitLogRangeService(core.store).register(core.dispatcher)
        self.repair = RepairService(
            core.store, core.pool, self._repair_sources, self._count_repair, self._cut_lost_tail
        )
        self.locks.register(core.dispatcher)
        self._listener: Listener | None = None
        self._serving_stopped = False

    def _repair_sources(self, start: int, end: int) -> list[str]:
        """Who to ask for damaged commit-log bytes ``[start, end)``: a master its slaves,
        those that acknowledged ``end`` first (most advanced first); a slave its master;
        then every other member the group lists (an acting slave's master is away)."""
        core = self.core
        addrs: list[str] = []
        ha = core.ha_master
        if ha is not None:
            links = sorted(
                ha.transfer_slaves(), key=lambda link: (link.acked >= end, link.acked), reverse=True
            )
            addrs.extend(link.slave_addr for link in links)
        else:
            master = core.acting.master_addr or core.acting.min_broker_addr
            if master:
                addrs.append(master)
        group = core.member_group
        if group is not None:
            addrs.extend(addr for _, addr in sorted(group.broker_addrs.items()))
        out: list[str] = []
        for addr in addrs:
            if addr and addr != core.addr and addr not in out:
                out.append(addr)
        return out

    def _cut_lost_tail(self, damage: Damage) -> None:
        """A master's log lost its tail under it and no slave received it: rebuild the
        service around the log cut back there (pre-online catches up from a slave)."""
        if not self.core.acting.is_master:
            return
        self.core.change_role(
            RoleChange(
                f"the commit log lost {damage.describe()}, held by no replica",
                cut_to=damage.start,
            )
        )

    def _count_repair(self, result: str, n: int) -> None:
        metrics = self.core.metrics
        metrics.records_repaired.labels(**metrics.ident, result=result).inc(n)

    def _change_role(self, change: RoleChange) -> None:
        """The first change asked for ends this run (later ones are its echoes)."""
        if self.role_change is None:
            log.warning("role change: %s", change.reason)
            self.role_change = change
        self._role_changed.set()

    def _cut_for_master(self, offset: int, master_epochs: list[Epoch]) -> None:
        self.core.change_role(
            RoleChange(
                f"the log parts from the master's at {offset}",
                cut_to=offset,
                master_epochs=tuple(master_epochs),
            )
        )

    def _spread_acl(self, table: AclTable) -> None:
        """A change made here goes to the nameservers, which spread it to every broker."""
        for ns in self.cfg.namesrv_addrs:
            self.core.spawn(self._push_acl(ns, table), f"acl-push-{ns}")

    async def _push_acl(self, ns: str, table: AclTable) -> None:
        await push_table(self.core.pool, ns, table)

    # ---- what the listeners and the container see ---------------------------------

    def set_neighbours(self, neighbours: Neighbours) -> None:
        """Brokers of the same process (container): local escape between them."""
        self.escape.neighbours = neighbours

    def attach_listener(self, listener: Listener) -> None:
        """The RPC server, so that a stop first stops accepting."""
        self._listener = listener

    def on_connection_closed(self, conn: RpcConnection) -> None:
        self.core.consumers.connection_closed(conn)
        self.transactions.connection_closed(conn)

    # ---- background -------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        core = self.core
        failing: str | None = None
        while True:
            await asyncio.sleep(core.cfg.flush_interval_ms / 1000)
            try:
                await asyncio.to_thread(core.store.flush)
                await core.offsets.persist_async()  # the table is read here, written there
            except OSError as exc:  # StoreError too
                # a failing or full disk: the broker keeps serving what it can (a store
                # whose fsync failed is read-only now) and tries again next round
                if str(exc) != failing:
                    log.error("flush failed: %s; retrying every round", exc)
                failing = str(exc)
                continue
            if failing is not None:
                log.info("flush works again")
                failing = None

    async def _retention_loop(self) -> None:
        """Delete expired store files every ``clean_resource_interval_ms`` (see
        broker_agent.store.retention); a master never deletes past its slowest slave."""
        core = self.core
        failing: str | None = None
        while True:
            await asyncio.sleep(core.cfg.clean_resource_interval_ms / 1000)
            if core.ha_master is not None:
                # the slaves' positions outlive a restart of this master (.holds)
                core.ha_master.keep_holds()
                try:
                    await core.ha_master.holds.persist_async()
                except OSError as exc:
                    log.warning("cannot save %s: %s", core.ha_master.holds.path, exc)
            more = True
            while more:
                try:
                    result = await asyncio.to_thread(
                        core.store.clean_expired_files, replica_limit=core.retention_limit()
                    )
                except OSError as exc:  # StoreError too: try again next round
                    if str(exc) != failing:
                        log.error("retention failed: %s; retrying every round", exc)
                    failing = str(exc)
                    break
                failing = None
                core.note_retention(result)
                if result.segments or result.queue_files:
                    log.info(
                        "retention: %s; %d consume-queue file(s) removed; the commit log "
                        "starts at %d",
                        result.reason,
                        result.queue_files,
                        result.commitlog_min_offset,
                    )
                more = result.more

    async def _metric_targets_loop(self) -> None:
        while True:
            with contextlib.suppress(HaError):
                await self.escape.init_metric_targets()
            await asyncio.sleep(10.0)

    async def _hold_check_loop(self) -> None:
        core = self.core
        interval = (
            core.cfg.long_polling_check_interval_ms
            if core.cfg.long_polling_enable
            else core.cfg.short_polling_check_interval_ms
        ) / 1000
        while True:
            await asyncio.sleep(interval)
            core.holds.check_all(core.store.max_offset)
            core.consumers.clients("")  # expire idle consumer entries lazily

    def _loops(self) -> list[tuple[Callable[[], Coroutine[Any, Any, None]], str]]:
        loops: list[tuple[Callable[[], Coroutine[Any, Any, None]], str]] = [
            (self.registrar.heartbeat_loop, "heartbeat"),
            (self.registrar.register_loop, "register"),
            (self.group.loop, "member-group"),
            (self._flush_loop, "flush"),
            (self._retention_loop, "retention"),
            (self.writability.loop, "store-space"),
            (self._hold_check_loop, "hold-check"),
            (self._metric_targets_loop, "metric-targets"),
            (self.schedule.run, "schedule"),
            (self.transactions.run, "transaction-check"),
            (self.pop.run, "pop-revive"),
            (self.repair.run, "store-repair"),
        ]
        if self.core.ha_slave is not None:
            loops.append((self.core.ha_slave.run, "ha-slave"))
            loops.append((self.metadata_sync.loop, "slave-sync"))
        if self.controller_link is not None and self.core.sync is not None:
            loops.append((self.controller_link.sync_loop, "sync-state-set"))
        if self.core.isolated:
            loops.append((self.preonline.run, "pre-online"))
        return loops

    async def run(self, stop: asyncio.Event) -> RoleChange | None:
        """Run every background loop until ``stop`` is set (or the broker changes role:
        the change is returned), then shut down in phases."""
        core = self.core
        if not core.acting.is_master:
            core.ha_slave = HaSlave(
                core.store,
                core.addr,
                core.cfg.broker_id,
                self.metadata_sync.on_dispatched,
                ssl_context=core.pool.ssl_context,
                auth=core.auth,
                broker_name=core.cfg.broker_name,
                epochs=core.epochs,
                member_id=core.member_id if core.role.controlled else None,
                on_cut=self._cut_for_master,
            )
        try:
            async with asyncio.TaskGroup() as tg:

                def spawn(coro: Coroutine[Any, Any, None], name: str) -> None:
                    tg.create_task(coro, name=name)

                core.bind_task_owner(spawn)
                loops = [tg.create_task(loop(), name=name) for loop, name in self._loops()]
                if not core.isolated:
                    core.set_special_services(core.acting.is_master)
                    await self.registrar.register_all()
                stopped = asyncio.ensure_future(stop.wait())
                changed = asyncio.ensure_future(self._role_changed.wait())
                try:
                    await asyncio.wait({stopped, changed}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stopped.cancel()
                    changed.cancel()
                if self._listener is not None:
                    self._listener.stop_accepting()  # phase 1 (again in _stop_serving)
                # the special work before the drain: its steps must end, not go on
                await self._hand_over()
                await self._stop_serving()
                core.bind_task_owner(None)
                log.info("shutdown phase 4: cancelling background loops")
                for task in loops:
                    task.cancel()
        finally:
            core.bind_task_owner(None)
            if not self._serving_stopped:  # a loop failed: still leave the cluster cleanly
                await self._stop_serving()
            await self._close()
        return None if stop.is_set() else self.role_change

    async def _stop_serving(self) -> None:
        """Phases 1-3: stop accepting, unregister, drain in-flight requests."""
        self._serving_stopped = True
        log.info("shutdown phase 1: stop accepting requests")
        if self._listener is not None:
            self._listener.stop_accepting()
        log.info("shutdown phase 2: unregistering from the nameservers")
        if not self.core.isolated or self.role_change is not None:
            await self.registrar.unregister_all()
        log.info("shutdown phase 3: draining in-flight requests")
        self.core.holds.close()  # held pulls answer now
        if self._listener is not None:
            await self._listener.aclose(grace_s=DRAIN_GRACE_S)

    async def _hand_over(self) -> None:
        """Phase 1, once nothing is accepted: start no special step any more and let those under way
        finish with their progress (:mod:`broker_agent.special_steps`), at most
        :data:`HANDOVER_WAIT_S`.  Cancelled in the middle, a step leaves a message handed
        on (or maybe: its answer never came) without its progress, and whoever serves
        next (this broker in its next role, after a role change) hands it on again."""
        core = self.core
        decision = core.acting.hand_over()
        if decision.changed:
            log.info("%s", decision)
        core.set_special_services(False)
        if not core.special_steps.under_way:
            return
        log.info(
            "shutdown phase 1: %d special step(s) under way finish first",
            core.special_steps.under_way,
        )
        try:
            async with asyncio.timeout(HANDOVER_WAIT_S):
                await core.special_steps.idle()
        except TimeoutError:
            log.warning(
                "shutdown phase 1: %d special step(s) still under way after %.0f s "
                "(an escape awaiting its answer): cancelled; what they handed on may be "
                "handed on again",
                core.special_steps.under_way,
                HANDOVER_WAIT_S,
            )

    async def _close(self) -> None:
        """Phase 5: close the HA ends and the pool, persist offsets, close the store."""
        core = self.core
        log.info("shutdown phase 5: closing replication, connections and the store")
        core.holds.close()
        if core.ha_slave is not None:
            await core.ha_slave.aclose()
        if core.ha_master is not None:
            await core.ha_master.aclose()
        await core.pool.aclose()
        core.offsets.persist()
        if core.owns_store:
            core.store.close()
        else:
            await asyncio.to_thread(core.store.flush)  # the next run reopens nothing
