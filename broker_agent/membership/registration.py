"""Registration with every nameserver, the lightweight heartbeat, and unregistration.

Both registration and heartbeat carry the broker's replication position (its commit
log's end) and whether its store takes appends: the nameserver picks the acting slave
of a masterless group from them.  A broker whose store does not advertise writes
(full, or low on space) registers its topics without the WRITE bit, so that producers
leave it while it keeps serving reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable

from broker_agent.core import BrokerCore
from ha_controller import auth
from ha_controller.controller.ports import View
from ha_controller.controller.wire import view_from_pb
from ha_controller.proto import common_pb2, nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    HaError,
    NotRegistered,
    PreOnlineRequired,
    StaleEpoch,
)
from ha_controller.protocol.properties import now_ms
from ha_controller.routing import Perm, TopicConfig
from ha_controller.wire import data_version_to_pb, topic_config_to_pb

log = logging.getLogger(__name__)


class Registrar:
    """REGISTER_BROKER / BROKER_HEARTBEAT / UNREGISTER_BROKER with every nameserver.

    In controller mode both carry the member id and the log's last epoch, and their
    answers the controller's view of this member (``on_view``; ``on_stale`` when a
    nameserver refused the epoch or the id).  A master whose writes nothing but its
    lease fences (a sync-state set of itself alone, or async replication) renews the
    lease only with an answer whose view etcd confirmed, counted from the read of
    etcd rather than from the heartbeat: a master cut off with a nameserver that lost
    etcd stops in time."""

    def __init__(
        self,
        core: BrokerCore,
        *,
        on_view: Callable[[View], object] | None = None,
        on_stale: Callable[[StaleEpoch, str], None] | None = None,
    ) -> None:
        self.core = core
        self._on_view = on_view or (lambda view: None)
        self._on_stale = on_stale or (lambda exc, where: None)

    def _controlled(
        self, pb: nameserver_pb2.RegisterBrokerRequest | nameserver_pb2.BrokerHeartbeatRequest
    ) -> None:
        """Set the controller-mode fields of a registration or heartbeat."""
        core = self.core
        if core.role.controlled and core.epochs is not None:
            pb.member_id = core.member_id
            pb.epoch = core.epochs.last

    def _lease_fenced_only(self) -> bool:
        """Whether nothing but the lease stops this master's writes once it is replaced
        (no slave it must wait for would follow it)."""
        core = self.core
        if not core.role.controlled or not core.acting.is_master:
            return False
        return core.copies_needed() <= 1 or core.sync is None or len(core.sync.confirmed) <= 1

    def _answered(
        self,
        sent_at: float,
        pb: nameserver_pb2.RegisterBrokerResponse | nameserver_pb2.BrokerHeartbeatResponse,
        ns: str,
    ) -> None:
        """A registration or heartbeat was answered: the view, then the lease."""
        core = self.core
        view: View | None = None
        if pb.HasField("controller"):
            view = view_from_pb(core.cfg.cluster, core.cfg.broker_name, pb.controller)
            self._on_view(view)
        if self._lease_fenced_only():
            if view is None or view.confirmed_age_ms is None:
                return  # etcd did not confirm we are still master: no renewal
            core.lease.granted(sent_at - view.confirmed_age_ms / 1000)
            return
        core.lease.granted(sent_at)

    def _registered_topics(self) -> list[TopicConfig]:
        """The topic configs as registered: a master's without WRITE while its store
        does not advertise writes (the nameserver then leaves this group out of
        producers' publish queues; readers keep it).  A slave's go as they are (the
        nameserver makes them read-only itself when it uses them)."""
        topics = list(self.core.topics.topics.values())
        if self.core.advertises_writes or not self.core.acting.is_master:
            return topics
        return [dataclasses.replace(t, perm=Perm.without_write(t.perm)) for t in topics]

    def _register_request(self) -> nameserver_pb2.RegisterBrokerRequest:
        core = self.core
        cfg = core.cfg
        ts = now_ms()
        req = nameserver_pb2.RegisterBrokerRequest(
            cluster=cfg.cluster,
            broker_addr=core.addr,
            broker_name=cfg.broker_name,
            broker_id=cfg.broker_id,
            ha_addr=core.ha_addr,
            topic_configs=[topic_config_to_pb(t) for t in self._registered_topics()],
            data_version=data_version_to_pb(core.topics.data_version),
            timestamp_ms=ts,
            enable_acting_master=cfg.enable_slave_acting_master,
            # we never register while isolated: pre-online is behind us (or skipped)
            pre_online_done=True,
            max_offset=core.store.commitlog_max_offset,
            store_writable=core.store.writable,
            **core.acl_key(),
        )
        self._controlled(req)
        if cfg.enable_slave_acting_master:
            req.heartbeat_timeout_ms = cfg.broker_not_active_timeout_ms
        req.signature = self._signature("register", ts)
        return req

    def _signature(self, action: str, ts: int) -> bytes:
        """The HMAC of a (un)registration with the cluster secret; empty without one."""
        core = self.core
        cfg = core.cfg
        if not cfg.cluster_secret:
            return b""
        return auth.sign(
            cfg.cluster_secret,
            auth.canonical(action, cfg.cluster, core.addr, cfg.broker_name, cfg.broker_id, ts),
        )

    async def register_all(self, only: tuple[str, ...] | None = None) -> None:
        """Register with every nameserver (in parallel; ``only``: with those); never
        while isolated, and a master whose lease ran out fences itself instead (it may
        have been expired)."""
        core = self.core
        if core.isolated:
            return
        if core.lease_lost():
            core.fence("lease on id 0 ran out before re-registering")
            return
        req = self._register_request()
        sent_at = time.monotonic()

        async def one(ns: str) -> None:
            try:
                conn = await core.pool.get(ns)
                resp = await conn.call_pb(
                    RequestCode.REGISTER_BROKER,
                    req,
                    nameserver_pb2.RegisterBrokerResponse,
                    timeout_ms=core.cfg.register_broker_timeout_ms,
                )
            except PreOnlineRequired as exc:
                core.fence(f"nameserver {ns}: {exc}")
                return
            except StaleEpoch as exc:
                self._on_stale(exc, f"registration with {ns}")
                return
            except HaError as exc:
                log.warning("registration with %s failed: %s", ns, exc)
                return
            conn.attrs["registered"] = True
            self._answered(sent_at, resp, ns)
            if not core.acting.is_master and resp.master_addr:
                core.acting.master_addr = resp.master_addr
                if resp.master_ha_addr and core.ha_slave is not None:
                    core.acting.master_ha_addr = resp.master_ha_addr
                    core.ha_slave.set_master(resp.master_ha_addr)

        await asyncio.gather(*(one(ns) for ns in only or core.cfg.namesrv_addrs))

    def register_soon(self) -> None:
        """Re-register in the background (a topic was created)."""
        self.core.spawn(self.register_all(), "register-after-topic")

    async def heartbeat_loop(self) -> None:
        """Every interval, a heartbeat to each nameserver, each on its own clock: an
        answered one extends the master's lease, "not registered" makes a slave register
        again and fences a master (it was expired: pre-online first).

        One nameserver that stalls (SIGSTOP, a long GC) or answers slowly must not delay
        the heartbeats to the others: with one loop over all of them, every round waited
        for the stalled one's timeout (or a re-registration with it), the live nameserver
        heard from this broker too late and expired it, and the master fenced itself for
        want of a lease (campaign seed 5000, one of two nameservers paused)."""
        core = self.core
        async with asyncio.TaskGroup() as tg:
            for ns in core.cfg.namesrv_addrs:
                tg.create_task(self._heartbeat_loop_of(ns), name=f"heartbeat-{ns}")
            tg.create_task(self._watch_lease(), name="lease-watch")

    async def _watch_lease(self) -> None:
        """Fence as soon as the lease runs out, whatever the heartbeats are waiting for."""
        core = self.core
        interval = core.cfg.broker_heartbeat_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            if not core.isolated and core.lease_lost():
                core.fence("no heartbeat acknowledged within the not-active timeout")

    async def _heartbeat_loop_of(self, ns: str) -> None:
        core = self.core
        interval = core.cfg.broker_heartbeat_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            if core.isolated:
                continue
            if core.lease_lost():
                core.fence("no heartbeat acknowledged within the not-active timeout")
                continue
            await self._heartbeat(ns)

    async def _heartbeat(self, ns: str) -> None:
        core = self.core
        cfg = core.cfg
        sent_at = time.monotonic()
        try:
            conn = await core.pool.get(ns)
            if not conn.attrs.get("registered"):
                # a new connection: the nameserver expired us with the old one (only
                # this one: another that stalls must not hold this loop up)
                await self.register_all(only=(ns,))
                return
            if cfg.compatible_with_old_namesrv:
                await conn.call_pb(
                    RequestCode.QUERY_DATA_VERSION,
                    nameserver_pb2.QueryDataVersionRequest(
                        cluster=cfg.cluster,
                        broker_addr=core.addr,
                        broker_name=cfg.broker_name,
                        broker_id=cfg.broker_id,
                        data_version=data_version_to_pb(core.topics.data_version),
                    ),
                    nameserver_pb2.QueryDataVersionResponse,
                    timeout_ms=cfg.send_heartbeat_timeout_ms,
                )
            else:
                hb = nameserver_pb2.BrokerHeartbeatRequest(
                    cluster=cfg.cluster,
                    broker_addr=core.addr,
                    broker_name=cfg.broker_name,
                    max_offset=core.store.commitlog_max_offset,
                    store_writable=core.store.writable,
                    **core.acl_key(),
                )
                self._controlled(hb)
                resp = await conn.call_pb(
                    RequestCode.BROKER_HEARTBEAT,
                    hb,
                    nameserver_pb2.BrokerHeartbeatResponse,
                    timeout_ms=cfg.send_heartbeat_timeout_ms,
                )
                self._answered(sent_at, resp, ns)
                return
        except StaleEpoch as exc:
            self._on_stale(exc, f"heartbeat to {ns}")
            return
        except NotRegistered as exc:
            conn.attrs["registered"] = False
            if core.acting.is_master and cfg.enable_slave_acting_master:
                core.fence(f"nameserver {ns} expired us: {exc}")
            else:
                await self.register_all(only=(ns,))
            return
        except HaError as exc:
            log.debug("heartbeat to %s failed: %s", ns, exc)
            return
        core.lease.granted(sent_at)

    async def register_loop(self) -> None:
        while True:
            await asyncio.sleep(self.core.cfg.register_name_server_period_ms / 1000)
            await self.register_all()

    async def unregister_all(self) -> None:
        core = self.core
        cfg = core.cfg
        ts = now_ms()
        req = nameserver_pb2.UnregisterBrokerRequest(
            cluster=cfg.cluster,
            broker_addr=core.addr,
            broker_name=cfg.broker_name,
            broker_id=cfg.broker_id,
            timestamp_ms=ts,
            signature=self._signature("unregister", ts),
        )
        for ns in cfg.namesrv_addrs:
            with contextlib.suppress(HaError):
                await core.pool.call_pb(
                    ns, RequestCode.UNREGISTER_BROKER, req, common_pb2.Empty, timeout_ms=1000
                )
