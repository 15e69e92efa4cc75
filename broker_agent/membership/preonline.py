"""Pre-online: stay isolated (unregistered, ``/readyz`` 503) until it is safe to serve.

A master first cuts its commit log back to its most advanced slave when a slave acted
for it and only unacknowledged bytes lie past that (see
:mod:`broker_agent.membership.truncation`), or catches up when its log is behind (a lost
volume, a lost unflushed tail; see :mod:`broker_agent.replication.catchup`), then
reverse-syncs the newer metadata of each slave, retrying from the slave that failed; a
slave waits for its HA link to an online master.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from broker_agent.core import BrokerCore
from broker_agent.membership.group import MemberGroupSync
from broker_agent.membership.registration import Registrar
from broker_agent.membership.truncation import plan_cut
from broker_agent.metadata.forward import ForwardSync
from broker_agent.metadata.versioned import VersionedTable, fetch_table, reverse_sync
from broker_agent.replication.catchup import CatchUp, SlaveLog
from broker_agent.store.truncate import pending_cut
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BadRequest, HaError, UnknownMethod
from ha_controller.routing import BrokerMemberGroup
from ha_controller.wire import data_version_from_pb, topic_config_from_pb

log = logging.getLogger(__name__)

#: How long a slave's HA link (either direction) may take to attach.
HA_LINK_WAIT_S = 10.0
RETRY_S = 1.0
#: how long a member just elected waits for the slave that acted when no nameserver
#: lists it (it is being rebuilt under its new id): its tables hold the commits and the
#: special work of its acting time
ACTING_SLAVE_WAIT_S = 5.0
#: the file in a store directory by which an operator lets a master whose store ends
#: before what its group held go online without the rest (``hactl accept-data-loss``)
ACCEPT_LOSS = "accept-data-loss"


def sync_sources(
    group: BrokerMemberGroup, own_id: int, own_addr: str, acting_slave: tuple[int, str] | None
) -> tuple[list[tuple[int, str]], tuple[int, str] | None]:
    """The slaves a master's pre-online syncs from, the acting slave last; and
    ``acting_slave`` (id, address: the slave that acted when this member was elected)
    when the group does not list its address (else None).

    Controller-flap campaign, seed 3307: member 0 acted, member 2 was elected; member 0
    was rebuilt under its new id (unregistered meanwhile) when member 2's pre-online
    read the group (``0 slave(s) synced``), and member 2 served its own tables: a delay
    level it had delivered before it was killed was delivered again."""
    acting_id = group.acting_broker_id
    slaves = sorted(
        # (our own address under another id: a registration of ours before a role
        # change that the nameserver still lists)
        ((i, a) for i, a in group.broker_addrs.items() if i != own_id and a != own_addr),
        key=lambda s: (s[0] == acting_id, s[0]),
    )
    if acting_slave is None or acting_slave[1] == own_addr:
        return slaves, None
    if any(a == acting_slave[1] for _, a in slaves):
        return slaves, None
    return slaves, acting_slave


class PreOnline:
    """The isolated start of a broker with replicas."""

    def __init__(
        self,
        core: BrokerCore,
        group: MemberGroupSync,
        registrar: Registrar,
        forward: ForwardSync,
        catchup: CatchUp,
        check_role: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.core = core
        #: controller mode: ask the controller whether this member changed role (True:
        #: it did, and the service is rebuilt)
        self.check_role = check_role
        self.group = group
        self.registrar = registrar
        #: a slave's forward sync; its tables are every versioned table, consumer
        #: offsets first
        self.forward = forward
        self.tables = forward.tables
        self.catchup = catchup
        #: why this master went back to pre-online (fenced), until it is online again
        self._fenced_for: str | None = None
        #: elected here: the unlisted acting slave was synced (or waited for long enough)
        self._acting_done = False
        self._acting_wait_until: float | None = None

    def fence(self, why: str) -> None:
        """A master that may have been expired stops serving at once (clients get the
        retriable "not serving" error), stops its special services, and goes back
        through pre-online (HA link, reverse sync of every versioned table) before it
        registers again.  Idempotent while fenced."""
        core = self.core
        if core.isolated:
            return
        log.warning("fenced: %s; refusing clients and going back through pre-online", why)
        core.isolated = True
        self._fenced_for = why
        core.preonline_step = f"fenced: {why}"
        core.holds.notify_fenced()
        core.lease.reset()
        core.metrics.fenced.labels(**core.metrics.ident).inc()
        core.set_special_services(False)
        core.update_role_metrics()
        core.spawn(self.run(), "pre-online")

    async def run(self) -> None:
        core = self.core
        cycle = 0
        synced: set[int] = set()
        # A fenced master's special work under way finishes first
        # (broker_agent.special_steps): a delivery that was waiting for its replicas
        # when the lease ran out moves its progress when it ends, and that must not
        # land on the tables taken from the slaves below (long campaign seed 1027: a
        # delay offset moved past a message stored after the return, which was never
        # delivered).  Nothing new starts while isolated, and each step is bounded (a
        # replica wait, escape attempts).
        if core.special_steps.under_way:
            core.preonline_step = "finishing the special work under way"
            await core.special_steps.idle()
        while core.isolated:
            if self.check_role is not None and core.acting.is_master:
                core.preonline_step = "asking the controller for this member's role"
                try:
                    if await self.check_role():
                        return  # rebuilt in its new role (broker_agent.runner)
                except HaError as exc:
                    log.warning("pre-online: the controller did not answer: %s", exc)
            if cycle == 0:
                # (on a retry the reason it waits stays shown while the group is read
                # again: an operator, or a probe, never sees it flicker to this step)
                core.preonline_step = "reading member group"
            group = await self.group.fetch_member_group()
            if group is None:
                why: str | None = "no nameserver answered"
            elif core.acting.is_master:
                why = await self._master(group, synced)
            else:
                why = await self._slave(group)
            if why is not None:
                core.preonline_step = f"waiting: {why}"
                log.warning("pre-online cycle %d: staying isolated: %s", cycle + 1, why)
                cycle += 1
                await asyncio.sleep(RETRY_S)
                continue
            if core.acting.is_master and core.recovered_queues:
                # the first time online since an unclean recovery, nothing stored since:
                # what it copied from its slaves is the tail it held, and consumers that
                # read it before the stop keep their place (store.marks)
                if core.store.lift_recovery_marks():
                    log.info("pre-online: recovery marks raised to the queue ends caught up")
                core.correct_offsets_past_ends()
            core.isolated = False
            self._fenced_for = None
            core.preonline_step = "online"
            log.info("pre-online done: registering as %s", core.acting.role)
            if group is not None and group.broker_addrs and not core.acting.is_master:
                # (a group no nameserver knows yet says nothing: this slave waits for
                # the nameserver's choice instead of acting on its own, beside a master
                # that has not registered yet)
                if 0 in group.broker_addrs or group.acting_broker_id is not None:
                    # the nameserver names the lead (a chosen acting slave stays: we
                    # take over only if it chooses us once we report our position)
                    min_id = group.lead_broker_id()
                else:
                    min_id = min((i for i in group.broker_addrs), default=core.cfg.broker_id)
                    min_id = min(min_id, core.cfg.broker_id)
                min_addr = group.broker_addrs.get(min_id, core.addr)
                await self.group.apply_min_broker(min_id, min_addr, None, None)
            core.update_role_metrics()
            core.set_special_services(core.acting.serves_master_only_ops)
            await self.registrar.register_all()

    async def _master(self, group: BrokerMemberGroup, synced: set[int]) -> str | None:
        """Sync from each slave not synced yet; the reason to wait, or None when done."""
        core = self.core
        # controller mode, elected here: the logs are reconciled by the HA epoch check
        # (a member ahead cuts back to where this epoch began), not by copying from or
        # cutting back to a slave; the slaves' newer tables are still taken
        promoted = core.role.promoted
        # the acting slave last: it holds its special services from our first contact
        # until we register (membership.group), so that gap is kept short
        slaves, unlisted = sync_sources(
            group,
            core.cfg.broker_id,
            core.addr,
            core.role.acting_slave if promoted and not self._acting_done else None,
        )
        if promoted:
            self._cover_stored_topics("newer than the last sync from the old master")
        if not slaves and not promoted:
            why = self._held_more(group)
            if why is not None:
                return why
        if not synced and not promoted:  # before any slave re-attaches to this master
            why = await self._cut_back(group, slaves)
            if why is not None:
                return why
        # a synced slave's HA link was accepted: it holds no more than we do
        if not promoted:
            why = await self._catch_up([(i, a) for i, a in slaves if i not in synced])
            if why is not None:
                return why
        for slave_id, slave_addr in slaves:
            if slave_id in synced:
                continue
            try:
                await self._sync_from_slave(slave_id, slave_addr, wait_link=not promoted)
            except HaError as exc:
                core.metrics.preonline_syncs.labels(**core.metrics.ident, result="failed").inc()
                return f"slave {slave_id} at {slave_addr}: {exc}"
            synced.add(slave_id)
        if unlisted is not None:
            why = await self._sync_unlisted_acting(*unlisted)
            if why is not None:
                return why
        awaiting = self.forward.awaiting_replica()
        if awaiting:
            # their files were lost and only a replica has them: serving without them
            # would hand the group an empty table (metadata.json_table.Recovery)
            return f"{', '.join(awaiting)} lost with their file: no slave to take them from yet"
        log.info("pre-online: %d slave(s) synced", len(synced))
        return None

    async def _sync_unlisted_acting(self, old_id: int, addr: str) -> str | None:
        """Take the tables of the slave that acted when this member was elected, which
        no nameserver lists now (see :func:`sync_sources`); it keeps its address across
        its rebuild.  The reason to wait, for at most ``ACTING_SLAVE_WAIT_S``."""
        now = time.monotonic()
        if self._acting_wait_until is None:
            self._acting_wait_until = now + ACTING_SLAVE_WAIT_S
        try:
            await self._sync_from_slave(old_id, addr, wait_link=False)
        except (HaError, OSError) as exc:
            if now < self._acting_wait_until:
                return (
                    f"the slave that acted ({addr}, id {old_id} before the switch) is not "
                    f"listed and does not answer yet: {exc}"
                )
            log.warning(
                "pre-online: the slave that acted (%s) did not answer within %.0f s: "
                "going online without its tables (%s)",
                addr,
                ACTING_SLAVE_WAIT_S,
                exc,
            )
        self._acting_done = True
        return None

    def _held_more(self, group: BrokerMemberGroup) -> str | None:
        """Why a master without a slave to copy from must not go online: its store
        ends before what the group held (its members' reports to the nameserver: a
        lost volume, a lost unflushed tail).  Going online would serve an empty or
        shortened log, acknowledge writes no returning slave can follow, and refuse
        those slaves for good.  An operator may accept the loss (:data:`ACCEPT_LOSS`)."""
        core = self.core
        seen = group.max_offset_seen or 0
        end = core.store.commitlog_max_offset
        if end >= seen:
            return None
        marker = core.store_dir / ACCEPT_LOSS
        if marker.exists():
            log.error(
                "pre-online: OPERATOR OVERRIDE (%s): going online with a commit log ending "
                "at %d although group %s held data up to %d and no slave holds it here: "
                "the messages between are lost, and a slave that comes back with them "
                "will be refused",
                marker,
                end,
                core.cfg.broker_name,
                seen,
            )
            marker.unlink(missing_ok=True)
            return None
        return (
            f"this store ends at {end} but group {core.cfg.broker_name} held data up to "
            f"{seen} and no slave is there to copy it from: waiting for a slave that holds "
            "it (to go online without it, losing those messages: hactl accept-data-loss "
            f"--store-dir {core.store_dir})"
        )

    def _slave_acted(self, group: BrokerMemberGroup) -> str | None:
        """Why this master believes a slave acted for it, or None."""
        if self._fenced_for is not None:
            return f"this master was fenced ({self._fenced_for})"
        if group.acting_broker_id is not None and group.acting_broker_id > 0:
            return f"slave {group.acting_broker_id} acting for it"
        return None

    async def _cut_back(
        self, group: BrokerMemberGroup, slaves: list[tuple[int, str]]
    ) -> str | None:
        """Cut the commit log back to the most advanced slave when a slave acted for
        this master and no acknowledged message lies past that slave's end (see
        membership.truncation); the reason to wait, or None.

        The slaves are detached first so that none copies the tail meanwhile, and the
        source slave's metadata tables replace ours (they advanced with the records cut
        away: delay offsets, POP and transaction progress); the reverse sync then still
        adopts any newer one."""
        core = self.core
        store = core.store
        try:
            pending = pending_cut(store.directory)
            if pending is not None:
                log.warning("pre-online: finishing an interrupted cut of the log at %d", pending)
                store.cut_back(pending)
        except HaError as exc:
            return f"interrupted commit-log cut: {exc}"
        acted = self._slave_acted(group)
        if acted is None or not slaves:
            return None
        ha = core.ha_master
        if ha is not None and ha.links:
            core.preonline_step = "detaching the slaves before comparing commit logs"
            for link in list(ha.links.values()):
                await link.conn.aclose()
        core.preonline_step = "asking the slaves for their commit-log ends"
        try:
            logs = await self.catchup.probe(slaves)
        except HaError as exc:
            return str(exc)
        plan = plan_cut(
            store.commitlog_min_offset,
            store.commitlog_max_offset,
            logs,
            expected_slaves=core.cfg.total_replicas - 1,
            copies_needed=core.copies_needed(),
            slave_acted=acted,
            acting_id=group.acting_broker_id,
        )
        if plan.target is None or plan.source is None:
            log.log(logging.WARNING if plan.risky else logging.DEBUG, "pre-online: %s", plan)
            return None
        try:
            snapshots = await self._fetch_tables(plan.source)
        except HaError as exc:
            return f"metadata of slave {plan.source.broker_id} at {plan.source.addr}: {exc}"
        if ha is not None and ha.links:
            return "a slave attached while the commit logs were compared; comparing again"
        # no await from here on: nothing reads, writes or streams the log meanwhile
        log.warning("pre-online: %s", plan)
        core.preonline_step = f"cutting the commit log at {plan.target}"
        try:
            store.cut_back(plan.target)  # logs what it dropped
        except HaError as exc:
            log.error("pre-online: cutting the commit log failed: %s", exc)
            return f"commit-log cut: {exc}"
        for table, snapshot in snapshots:
            table.replace(snapshot)  # ours counted what the cut removed
            log.info(
                "pre-online: %s of slave %d taken after the cut: %s",
                table.name,
                plan.source.broker_id,
                table.describe(snapshot),
            )
        return None

    async def _fetch_tables(self, source: SlaveLog) -> list[tuple[VersionedTable, object]]:
        out: list[tuple[VersionedTable, object]] = []
        for table in self.tables:
            try:
                out.append((table, await table.fetch(self.core.pool, source.addr)))
            except UnknownMethod:
                continue
        return out

    async def _catch_up(self, slaves: list[tuple[int, str]]) -> str | None:
        """Copy what the most advanced slave holds beyond our commit log, with its topics
        (and, for a lost volume, its metadata tables); the reason to wait, or None.

        A master that is ahead of (or level with) its slaves only asks each for its
        commit-log bounds."""
        core = self.core
        if not slaves:
            return None
        core.preonline_step = "asking the slaves for their commit-log ends"
        try:
            plan = self.catchup.plan(await self.catchup.probe(slaves))
        except HaError as exc:
            return str(exc)
        if plan.blocked is not None:
            return plan.blocked
        if not plan.needed:
            log.debug("pre-online: %s", plan)
        else:
            log.info("pre-online: %s", plan)
            try:
                await self.catchup.run(plan, self._set_step)
            except HaError as exc:
                log.warning("pre-online: catch-up stopped: %s", exc)
                return f"catch-up: {exc}"
        source = plan.source
        if source is None:
            return None
        lost_volume = self.catchup.lost_volume_pending()
        try:
            add_missing = lost_volume or not core.topics.topics or core.topics.awaiting_replica
            if plan.needed or add_missing:
                await self._adopt_topics(source.broker_id, source.addr, add_missing=add_missing)
            if plan.needed:
                # the slave's topic table comes from its periodic sync with us: a topic
                # created shortly before we lost it has messages in the copied log but
                # no config there (without one its messages have no route)
                self._cover_stored_topics(f"copied from slave {source.broker_id}")
            if lost_volume:
                await self._assign_tables(source.broker_id, source.addr)
        except HaError as exc:
            return f"metadata of slave {source.broker_id} at {source.addr}: {exc}"
        return None

    def _cover_stored_topics(self, why: str) -> None:
        """Give a config to every topic the log holds messages of but the topic table
        lacks (:meth:`TopicConfigManager.cover_queues`)."""
        added = self.core.topics.cover_queues(self.core.store.topics_and_queues())
        if added:
            log.warning(
                "pre-online: topics without a config here but with messages in the log "
                "(%s) get one: %s",
                why,
                ", ".join(added[:20]),
            )

    def _set_step(self, step: str) -> None:
        self.core.preonline_step = step

    async def _adopt_topics(self, slave_id: int, slave_addr: str, *, add_missing: bool) -> None:
        core = self.core
        core.preonline_step = f"pulling topics from slave {slave_id}"
        pb = await fetch_table(
            core.pool, slave_addr, RequestCode.GET_ALL_TOPIC_CONFIG, broker_pb2.TopicConfigTable
        )
        changed = core.topics.adopt(
            [topic_config_from_pb(t) for t in pb.topics],
            data_version_from_pb(pb.data_version),
            add_missing=add_missing,
        )
        core.topics.taken_from_replica()
        log.log(
            logging.INFO if changed else logging.DEBUG,
            "pre-online: topics of slave %d: %d of %d taken%s",
            slave_id,
            len(changed),
            len(pb.topics),
            f" ({', '.join(sorted(changed)[:10])}{', ...' if len(changed) > 10 else ''})"
            if changed
            else "",
        )

    async def _assign_tables(self, slave_id: int, slave_addr: str) -> None:
        """A master that lost its volume lost its metadata files too; its fresh tables
        carry no authority, so it takes the source slave's as they are.  The reverse
        sync from every slave that follows still adopts newer ones (an acting slave's)."""
        core = self.core
        core.preonline_step = f"taking the metadata tables of slave {slave_id}"
        for table in self.tables:
            try:
                snapshot = await table.fetch(core.pool, slave_addr)
            except UnknownMethod:
                continue
            table.replace(snapshot)
            log.info(
                "pre-online: lost volume: %s of slave %d taken: %s",
                table.name,
                slave_id,
                table.describe(snapshot),
            )
        self.catchup.lost_volume_done()

    async def _slave(self, group: BrokerMemberGroup) -> str | None:
        """With the master online, wait for the HA link (10 s) before serving."""
        core = self.core
        master_addr = group.broker_addrs.get(0)
        if master_addr == core.addr:
            master_addr = None  # our own registration as master before a role change
        awaiting = self.forward.awaiting_replica()
        if master_addr is None and awaiting:
            return f"{', '.join(awaiting)} lost with their file: waiting for the master"
        if master_addr is None or core.ha_slave is None:
            return None  # no master online: start directly
        core.preonline_step = "retrieving the master's HA address"
        ha_addr = await self.group.retrieve_master_ha(master_addr)
        if ha_addr is None:
            return f"master {master_addr} does not answer EXCHANGE_BROKER_HA_INFO"
        core.acting.master_addr = master_addr
        core.acting.master_ha_addr = ha_addr
        core.ha_slave.set_master(ha_addr)
        core.preonline_step = f"waiting for the HA link to {ha_addr}"
        try:
            async with asyncio.timeout(HA_LINK_WAIT_S):
                await core.ha_slave.transfer_ok.wait()
        except TimeoutError:
            return f"no HA transfer from master {ha_addr} within {HA_LINK_WAIT_S:.0f} s"
        if awaiting:
            core.preonline_step = f"taking {', '.join(awaiting)} from the master"
            await self.forward.pull(master_addr, lambda: True, register=False)
            awaiting = self.forward.awaiting_replica()
            if awaiting:
                return f"{', '.join(awaiting)} lost with their file: the master did not give them"
        return None

    async def _sync_from_slave(self, slave_id: int, slave_addr: str, *, wait_link: bool) -> None:
        core = self.core
        core.preonline_step = f"exchanging HA info with slave {slave_id}"
        await core.pool.call_pb(
            slave_addr,
            RequestCode.EXCHANGE_BROKER_HA_INFO,
            broker_pb2.BrokerHaInfo(
                master_ha_addr=core.ha_addr,
                master_flush_offset=core.store.commitlog_max_offset,
                master_addr=core.addr,
            ),
            broker_pb2.BrokerHaInfo,
            timeout_ms=3000,
        )
        core.preonline_step = f"waiting for slave {slave_id} HA link"
        host = slave_addr.rsplit(":", 1)[0]
        assert core.ha_master is not None
        deadline = time.monotonic() + HA_LINK_WAIT_S
        while wait_link and not core.ha_master.has_transfer_link(host):
            if time.monotonic() > deadline:
                raise BadRequest(f"slave {slave_id} did not attach to the HA port within 10 s")
            await asyncio.sleep(0.05)
        core.preonline_step = f"pulling metadata from slave {slave_id}"
        await reverse_sync(
            self.tables, core.pool, slave_id, slave_addr, promoted=core.role.promoted
        )
        core.metrics.preonline_syncs.labels(**core.metrics.ident, result="ok").inc()
