"""Pre-online: stay isolated (unregistered, ``/readyz`` 503) until it is safe to serve.

A master reverse-syncs the newer metadata of each slave (rip32.md §5), retrying from
the slave that failed; a slave waits for its HA link to an online master.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from broker_agent.core import BrokerCore
from broker_agent.membership.group import MemberGroupSync
from broker_agent.membership.registration import Registrar
from broker_agent.metadata.versioned import VersionedTable, reverse_sync
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import BadRequest, HaError
from ha_controller.routing import BrokerMemberGroup

log = logging.getLogger(__name__)

#: How long a slave's HA link (either direction) may take to attach.
HA_LINK_WAIT_S = 10.0
RETRY_S = 1.0


class PreOnline:
    """The isolated start of a broker with replicas."""

    def __init__(
        self,
        core: BrokerCore,
        group: MemberGroupSync,
        registrar: Registrar,
        tables: Sequence[VersionedTable],
    ) -> None:
        self.core = core
        self.group = group
        self.registrar = registrar
        self.tables = tables  # every versioned table, consumer offsets first

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
        core.preonline_step = f"fenced: {why}"
        core.lease.reset()
        core.metrics.fenced.labels(**core.metrics.ident).inc()
        core.set_special_services(False)
        core.update_role_metrics()
        core.spawn(self.run(), "pre-online")

    async def run(self) -> None:
        core = self.core
        cycle = 0
        synced: set[int] = set()
        while core.isolated:
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
            core.isolated = False
            core.preonline_step = "online"
            log.info("pre-online done: registering as %s", core.acting.role)
            if group is not None and not core.acting.is_master:
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
        slaves = sorted((i, a) for i, a in group.broker_addrs.items() if i != core.cfg.broker_id)
        for slave_id, slave_addr in slaves:
            if slave_id in synced:
                continue
            try:
                await self._sync_from_slave(slave_id, slave_addr)
            except HaError as exc:
                core.metrics.preonline_syncs.labels(**core.metrics.ident, result="failed").inc()
                return f"slave {slave_id} at {slave_addr}: {exc}"
            synced.add(slave_id)
        log.info("pre-online: %d slave(s) synced", len(synced))
        return None

    async def _slave(self, group: BrokerMemberGroup) -> str | None:
        """With the master online, wait for the HA link (10 s) before serving."""
        core = self.core
        master_addr = group.broker_addrs.get(0)
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
        return None

    async def _sync_from_slave(self, slave_id: int, slave_addr: str) -> None:
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
        while not core.ha_master.has_transfer_link(host):
            if time.monotonic() > deadline:
                raise BadRequest(f"slave {slave_id} did not attach to the HA port within 10 s")
            await asyncio.sleep(0.05)
        core.preonline_step = f"pulling metadata from slave {slave_id}"
        await reverse_sync(self.tables, core.pool, slave_id, slave_addr)
        core.metrics.preonline_syncs.labels(**core.metrics.ident, result="ok").inc()
