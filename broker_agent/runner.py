"""One broker across its roles (controller mode; docs/failover.md).

The store, its epochs and the listeners' ports outlive each :class:`BrokerService`;
a role change (the controller elected this member master, or replaced it, or the HA
epoch check found its log parts from its new master's) ends the service's run, and the
runner builds the next one around the same open store, on the same ports, under the
id the group's state gives it.  Rebuilding instead of switching in place means every
part of a broker is always built for one role, as at a start.

Without a controller this is a broker that runs once in the role it was configured
with, as before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from broker_agent.core import store_config
from broker_agent.listeners import Listeners, open_listeners
from broker_agent.membership.acting import MASTER_ID
from broker_agent.membership.epochs import EpochFile
from broker_agent.membership.roles import Role, RoleChange, ask_role, role_from_view
from broker_agent.service import BrokerService
from broker_agent.special.ports import Neighbours
from broker_agent.store.message_store import MessageStore
from ha_controller.auth import ClusterAuth
from ha_controller.config import BrokerConfig, parse_host_port
from ha_controller.controller.ports import View
from ha_controller.rpc import ConnectionPool
from ha_controller.rpc.bounds import Throttle

__all__ = ["BrokerRunner"]

log = logging.getLogger(__name__)

#: how long to wait between asking the nameservers for a role
ASK_AGAIN_S = 1.0


def acting_slave_of(service: BrokerService) -> tuple[int, str] | None:
    """(id, address) of the slave acting for the group as the ended ``service`` knew
    it (the member group's lead when that is neither the master nor this broker)."""
    acting = service.core.acting
    if acting.is_master or acting.min_broker_id in (MASTER_ID, acting.broker_id):
        return None
    addr = acting.min_broker_addr
    return None if not addr else (acting.min_broker_id, addr)


class BrokerRunner:
    """Runs one configured broker, rebuilding its service at each role change."""

    def __init__(self, cfg: BrokerConfig) -> None:
        self.cfg = cfg
        self.member_id = cfg.broker_id
        self.store_dir = cfg.store_path
        self.service: BrokerService | None = None
        self.neighbours: Neighbours | None = None
        #: the listeners as first bound (a port 0 keeps the port it got)
        self._bound: dict[str, str] = {}
        self._ask_log = Throttle(10.0)

    def _cfg_for(self, role: Role) -> BrokerConfig:
        bound = self._bound
        return dataclasses.replace(
            self.cfg,
            broker_id=role.route_id,
            store_dir=str(self.store_dir),
            listen=bound.get("listen", self.cfg.listen),
            http_listen=bound.get("http_listen", self.cfg.http_listen),
            ha_listen=bound.get("ha_listen", self.cfg.ha_listen),
        )

    def _keep_ports(self, service: BrokerService) -> None:
        core = service.core
        if self._bound:
            return
        for key, addr in (("listen", core.addr), ("http_listen", core.http_addr)):
            host, _ = parse_host_port(getattr(self.cfg, key))
            self._bound[key] = f"{host}:{parse_host_port(addr)[1]}"
        if core.ha_master is not None:
            host, _ = parse_host_port(self.cfg.ha_listen)
            self._bound["ha_listen"] = f"{host}:{parse_host_port(core.ha_addr)[1]}"

    async def _ask(self, store: MessageStore, epochs: EpochFile) -> View | None:
        cfg = self.cfg
        auth = ClusterAuth(cfg.cluster_secret, sign_all=cfg.acl.enabled)
        pool = ConnectionPool(
            connect_timeout_ms=2000, ssl_context=cfg.tls.client_context(), signer=auth.sign
        )
        try:
            return await ask_role(
                pool,
                cfg.namesrv_addrs,
                cluster=cfg.cluster,
                group=cfg.broker_name,
                member=self.member_id,
                addr=self._bound.get("listen", ""),
                max_offset=store.commitlog_max_offset,
                epoch=epochs.last,
            )
        finally:
            await pool.aclose()

    async def _role(
        self, store: MessageStore, epochs: EpochFile, *, first: bool, stop: asyncio.Event
    ) -> Role | None:
        """The role to run in, asked of the nameservers (None: stopped meanwhile).

        At the first start a broker that never ran under a controller and finds no
        nameserver takes its configured role (RIP-32: it registers when they come); one
        whose log has epochs waits for a controller's answer, and so does every broker
        after a role change: running in a role no controller gave could make a second
        master."""
        while not stop.is_set():
            view = await self._ask(store, epochs)
            if view is not None and not view.enabled:
                if epochs.entries:
                    log.error(
                        "this broker ran under a controller (its log has epochs up to %d) "
                        "but no nameserver runs one now: taking the configured role, id %d",
                        epochs.last,
                        self.member_id,
                    )
                return Role(self.member_id)
            if view is not None:
                role = role_from_view(view, self.member_id)
                if role.state is not None or self.member_id != 0:
                    return role
            elif first and not epochs.entries:
                return Role(self.member_id)
            count = self._ask_log.hit(time.monotonic())
            if count:
                log.warning(
                    "waiting for the controller to say this member's role (%d attempt(s))",
                    count,
                )
            await asyncio.sleep(ASK_AGAIN_S)
        return None

    async def _next_role(
        self,
        change: RoleChange,
        previous: Role,
        store: MessageStore,
        epochs: EpochFile,
        stop: asyncio.Event,
    ) -> Role | None:
        if change.cut_to is not None:
            log.warning("cutting the commit log back to %d (%s)", change.cut_to, change.reason)
            store.cut_back(change.cut_to)
            epochs.cut(change.cut_to)
        role: Role | None
        if change.view is not None and change.view.state is not None:
            role = role_from_view(change.view, self.member_id)
        else:
            role = await self._role(store, epochs, first=False, stop=stop)
        if role is None:
            return None
        if role.is_master and not previous.is_master:
            role = dataclasses.replace(role, promoted=True)
        if change.fence_wait_ms and role.is_master:
            role = dataclasses.replace(
                role, writes_from=time.monotonic() + change.fence_wait_ms / 1000
            )
        return role

    @staticmethod
    def _begin(role: Role, store: MessageStore, epochs: EpochFile) -> None:
        """A master of a newer epoch than its log's last: the epoch begins at its end."""
        if role.controlled and role.is_master and role.state is not None:
            if epochs.last < role.state.epoch:
                epochs.begin(role.state.epoch, store.commitlog_max_offset)

    async def run(
        self, stop: asyncio.Event, on_ready: Callable[[BrokerService], None] | None = None
    ) -> None:
        """Run until ``stop``; ``on_ready`` after each service's listeners are bound."""
        store = MessageStore.open(self.store_dir, store_config(self.cfg))
        epochs = EpochFile.open(self.store_dir)
        try:
            role = await self._role(store, epochs, first=True, stop=stop)
            while role is not None:
                self._begin(role, store, epochs)
                log.info(
                    "broker %s member %d runs as %s",
                    self.cfg.broker_name,
                    self.member_id,
                    role.describe(),
                )
                service = BrokerService(
                    self._cfg_for(role),
                    store=store,
                    member_id=self.member_id,
                    role=role,
                    epochs=epochs,
                )
                if self.neighbours is not None:
                    service.set_neighbours(self.neighbours)
                self.service = service
                listeners: Listeners = await open_listeners(service)
                try:
                    self._keep_ports(service)
                    if on_ready is not None:
                        on_ready(service)
                    change = await service.run(stop)
                finally:
                    await listeners.aclose()
                if change is None or stop.is_set():
                    return
                acting_slave = acting_slave_of(service)
                role = await self._next_role(change, role, store, epochs, stop)
                if role is not None and role.promoted and acting_slave is not None:
                    role = dataclasses.replace(role, acting_slave=acting_slave)
        finally:
            store.close()
