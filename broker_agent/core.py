"""BrokerCore: what every part of one broker shares, and the guards it serves by.

The core owns the broker's state (config, store, topics, consumer offsets, acting
state, replication ends, connection pool, metrics, the request dispatcher) but no
behaviour beyond answering questions about it: "am I serving?", "am I master?",
"how many copies does a write need?", "what is my status?".  Request handlers,
membership, the write path and the special services each take the core (or a
narrow port of it) and do their one job.

Background work is spawned through :meth:`BrokerCore.spawn` into the TaskGroup
that the service owns while it runs; outside that window a spawned coroutine is
closed, never left running without an owner.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from broker_agent.lag import QueueLag, queue_lags
from broker_agent.membership.acting import ActingState
from broker_agent.membership.epochs import EpochFile
from broker_agent.membership.lease import Lease
from broker_agent.membership.roles import Role, RoleChange
from broker_agent.metadata import acl_table
from broker_agent.metadata.offsets import ConsumerOffsetManager
from broker_agent.metadata.topics import TopicConfigManager
from broker_agent.metrics import BrokerMetrics
from broker_agent.pull_hold import PullHoldService
from broker_agent.replication.ha import HaMaster, HaSlave
from broker_agent.replication.holds import SlaveHolds
from broker_agent.replication.sync_set import SyncSet
from broker_agent.special_steps import SpecialSteps
from broker_agent.store.diskspace import SpaceLevel
from broker_agent.store.message_store import MessageStore, StoreConfig
from broker_agent.store.retention import CleanResult
from broker_agent.write_path import copies_needed
from ha_controller.acl import Acl, AclHolder, load_acl_file
from ha_controller.acl import guard as acl_guard
from ha_controller.auth import ClusterAuth
from ha_controller.config import BrokerConfig
from ha_controller.protocol.errors import BrokerIsolated, NotMaster, NotWritable
from ha_controller.protocol.properties import HALF_TOPIC, PROPERTY_REAL_TOPIC, now_ms
from ha_controller.routing import BrokerMemberGroup
from ha_controller.rpc import ConnectionPool, Dispatcher, RpcConnection

log = logging.getLogger(__name__)

#: A consumer client not seen (HEART_BEAT) for this long leaves its group's list.
CONSUMER_EXPIRY_S = 40.0


class ConsumerRegistry:
    """Which clients consume for a group (HEART_BEAT), for client-side rebalancing."""

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, float]] = {}
        self._by_conn: dict[RpcConnection, set[tuple[str, str]]] = {}

    def heartbeat(self, conn: RpcConnection, client_id: str, groups: list[str]) -> None:
        now = time.monotonic()
        for g in groups:
            self._seen.setdefault(g, {})[client_id] = now
            self._by_conn.setdefault(conn, set()).add((g, client_id))

    def unregister(self, client_id: str, groups: list[str]) -> None:
        for g in groups:
            self._seen.get(g, {}).pop(client_id, None)

    def connection_closed(self, conn: RpcConnection) -> None:
        for g, c in self._by_conn.pop(conn, set()):
            self._seen.get(g, {}).pop(c, None)

    def clients(self, group: str) -> list[str]:
        now = time.monotonic()
        members = self._seen.get(group, {})
        for c in [c for c, t in members.items() if now - t > CONSUMER_EXPIRY_S]:
            del members[c]
        return sorted(members)


def store_config(cfg: BrokerConfig) -> StoreConfig:
    """The store's settings from the broker's."""
    return StoreConfig(
        segment_size_bytes=cfg.segment_size_bytes,
        flush_mode=cfg.flush_mode,
        flush_interval_ms=cfg.flush_interval_ms,
        min_free_disk_ratio=cfg.min_free_disk_ratio,
        warn_free_disk_ratio=cfg.warn_free_disk_ratio,
        disk_check_interval_ms=cfg.disk_check_interval_ms,
        max_message_size_bytes=cfg.max_record_bytes,
        file_reserved_time_ms=cfg.file_reserved_time_ms,
        delete_when=cfg.delete_when,
        disk_max_used_space_ratio=cfg.disk_max_used_space_ratio,
        max_open_files=cfg.max_open_files,
        consume_queue_file_entries=cfg.consume_queue_file_entries,
        key_index_max_entries=cfg.key_index_max_entries,
    )


class BrokerCore:
    """The shared state of one broker and the checks every handler makes."""

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
        self.name = f"{cfg.broker_name}/{cfg.broker_id}"
        self.store_dir = Path(cfg.store_path)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        #: a store handed in outlives this core (broker_agent.runner: a role change
        #: rebuilds the service around it); one opened here closes with it
        self.owns_store = store is None
        self.store = (
            store
            if store is not None
            else MessageStore.open(
                self.store_dir,
                store_config(cfg),
            )
        )
        #: the id this broker was configured with; ``cfg.broker_id`` is the id it
        #: serves as, which the controller may have swapped (ha_controller.controller)
        self.member_id = cfg.broker_id if member_id is None else member_id
        self.role = role if role is not None else Role(cfg.broker_id)
        #: controller mode: the epochs of this log (membership.epochs)
        self.epochs = epochs if self.role.controlled else None
        #: controller mode, master: the sync-state set every write waits for
        self.sync: SyncSet | None = (
            SyncSet(
                self.member_id,
                self.role.state.sync_set,
                lag_ms=cfg.sync_state_lag_ms,
            )
            if self.role.controlled and cfg.is_master and self.role.state is not None
            else None
        )
        self._role_change: Callable[[RoleChange], None] = lambda change: None
        #: a planned switch: no writes until then (monotonic), and why
        self.paused_until = 0.0
        self.paused_for = ""
        #: a master takes a table only its replicas have from a slave in pre-online, a
        #: slave from its master (metadata.json_table.Recovery.REPLICA)
        self.has_replicas = cfg.total_replicas > 1 and not cfg.skip_pre_online
        self.topics = TopicConfigManager(
            self.store_dir / "topics.json", cfg.default_topic_queue_nums
        )
        self.topics.load(replicas=self.has_replicas)
        self.offsets = ConsumerOffsetManager(
            self.store_dir / "consumer_offsets.json", cfg.consumer_offset_update_version_step
        )
        self.offsets.load()
        if self.offsets.lost:
            found = self.offsets.rebuild_from_log(self.store)
            log.info("consumer offsets rebuilt from %d record(s) of the commit log", found)
        # a master's only: a slave's table is ahead of its log whenever it lags (the
        # master corrects what a pre-online takes from it when a consumer reads there)
        #: the queues an unclean recovery ended, whose committed offsets are corrected
        #: once the master knows where they end (:meth:`correct_offsets_past_ends`)
        self.recovered_queues = set(self.store.take_recovery_marks()) if cfg.is_master else set()
        self.acting = ActingState(cfg.broker_id, cfg.enable_slave_acting_master)
        self.metrics = BrokerMetrics(cfg.cluster, cfg.broker_name, self.member_id)
        self.metrics.export_consumer_lag(
            lambda: self.consumer_lag() if self.exports_consumer_lag else None,
            now_ms,
            cfg.consumer_lag_max_queue_series,
        )
        self.holds = PullHoldService(cfg.max_held_pulls, now_ms)
        self.consumers = ConsumerRegistry()
        #: cluster authentication: signs our control requests, guards the dispatcher
        self.auth = ClusterAuth(
            cfg.cluster_secret, on_refused=self.metrics.auth_refusal, sign_all=cfg.acl.enabled
        )
        self.pool = ConnectionPool(
            connect_timeout_ms=2000,
            ssl_context=cfg.tls.client_context(),
            signer=self.auth.sign,
            # a nameserver expires a broker whose registration connection closes
            sessions=cfg.namesrv_addrs,
        )
        #: the client ACL, its table kept in the store (broker_agent.metadata.acl_table);
        #: the guard also checks group names (ha_controller.acl)
        holder = None
        if cfg.acl.enabled:
            assert cfg.acl.file is not None  # checked at load
            holder = AclHolder(
                acl_table.load_table(self.store_dir, load_acl_file(cfg.acl.file)),
                persist=acl_table.persister(self.store_dir),
            )
        self.acl = Acl.from_config(cfg.acl, on_denied=self.metrics.acl_denial, holder=holder)
        self.dispatcher = Dispatcher(
            guard=acl_guard(self.auth, self.acl, half_topic=self.half_message_topic)
        )
        self.addr = ""  # advertised RPC address, set once bound
        self.ha_addr = ""
        self.http_addr = ""
        self.isolated = self.has_replicas
        self.preonline_step = "waiting to start" if self.isolated else "online"
        if not self.isolated:  # no pre-online to catch up first
            self.correct_offsets_past_ends()
        self.ha_master: HaMaster | None = (
            HaMaster(
                self.store,
                auth=self.auth,
                broker_name=cfg.broker_name,
                epochs=self.epochs,
                sync=self.sync,
                on_stale=lambda why: self.change_role(RoleChange(f"a slave says: {why}")),
            )
            if cfg.is_master
            else None
        )
        if self.ha_master is not None:
            # the positions of its slaves, for retention (replication.holds)
            self.ha_master.holds = SlaveHolds(self.store_dir / "slave_holds.json")
            self.ha_master.holds.load()
        self.ha_slave: HaSlave | None = None
        self.member_group: BrokerMemberGroup | None = None
        #: a master's lease on id 0 (membership.lease); only kept with acting masters on
        self.lease = Lease(cfg.broker_not_active_timeout_ms / 1000)
        self._fence: Callable[[str], None] = lambda why: None
        self._special_hooks: list[Callable[[bool], None]] = []
        #: hand-ons of special work under way (a stop and a returning master wait)
        self.special_steps = SpecialSteps()
        self._spawn: Callable[[Coroutine[Any, Any, None], str], None] | None = None
        self._topics_changed: Callable[[], None] = lambda: None
        self._store_state_changed: Callable[[], None] = lambda: None
        #: the store state last acted on (membership.writability)
        self.store_state_seen: tuple[bool, SpaceLevel] = self.store_state()
        self.update_role_metrics()

    def acl_key(self) -> dict[str, Any]:
        """The ACL table this broker has, as its registration and heartbeats tell it
        (nothing without an ACL)."""
        if self.acl.holder is None:
            return {}
        revision, digest = self.acl.holder.key()
        return {"acl_revision": revision, "acl_digest": digest}

    def half_message_topic(self, req: Any) -> str | None:
        """The real topic of the half message an END_TRANSACTION resolves (None when
        this broker holds no such half): what the request is authorised against."""
        msg = self.store.get_message_at(HALF_TOPIC, 0, req.half_queue_offset)
        if msg is None or (req.transaction_id and msg.uniq_key != req.transaction_id):
            return None
        # a half without its real topic (never written so) counts as the brokers' own
        return msg.properties.get(PROPERTY_REAL_TOPIC) or msg.topic

    # ---- ownership of background work -----------------------------------------

    def bind_task_owner(
        self, spawn: Callable[[Coroutine[Any, Any, None], str], None] | None
    ) -> None:
        """The service's TaskGroup while it runs (``None`` once it stops)."""
        self._spawn = spawn

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``coro`` under the service's TaskGroup; closed unrun when none is bound."""
        if self._spawn is not None:
            self._spawn(coro, name)
        else:
            coro.close()

    def on_topics_changed(self, callback: Callable[[], None]) -> None:
        """Who re-registers with the nameservers when a topic appears (membership)."""
        self._topics_changed = callback

    def topics_changed(self) -> None:
        """A topic was created on this broker: the nameservers must learn it."""
        self._topics_changed()

    # ---- the store's space ---------------------------------------------------------

    def store_state(self) -> tuple[bool, SpaceLevel]:
        """(appends possible, space level): what routes and heartbeats report."""
        return self.store.writable, self.store.space_level

    @property
    def advertises_writes(self) -> bool:
        """Whether this broker's routes carry the WRITE bit: its store takes appends and
        has room to spare (LOW withdraws it before anything must be refused)."""
        return self.store.writable and self.store.space_level is SpaceLevel.OK

    def on_store_state_changed(self, callback: Callable[[], None]) -> None:
        """Who withdraws or restores the routes' WRITE bit (membership.writability)."""
        self._store_state_changed = callback

    def note_store_state(self) -> None:
        """Cheap; called after appends: acts at once when the store's state moved."""
        if self.store_state() != self.store_state_seen:
            self._store_state_changed()

    def check_store_writable(self, what: str) -> None:
        """NotWritable (retriable: nothing is stored) while the store refuses appends."""
        if not self.store.writable:
            self.metrics.send_errors.labels(**self.metrics.ident, reason="not_writable").inc()
            raise NotWritable(
                f"{what}: {self.name} takes no writes now ({self.store.unwritable_reason()}); "
                "send to another group"
            )

    # ---- retention -----------------------------------------------------------------

    def retention_limit(self) -> int | None:
        """The commit-log offset retention must not delete up to: on a master, the
        smallest offset its attached slaves acknowledged (a stalled slave keeps its
        link, so it holds deletion back), and for ``detached_slave_hold_ms`` after a
        slave's link closed, what that slave had, unless the disk is short of space
        (see ``broker_agent.replication.holds``);
        None on a slave or a master with no slave to wait for (a slave deletes by time
        and space alone)."""
        if self.ha_master is None:
            return None
        used = self.store.disk_used_ratio
        pressed = self.store.space_level is not SpaceLevel.OK or (
            used is not None and used >= self.cfg.disk_max_used_space_ratio
        )
        return self.ha_master.retention_floor(self.cfg.detached_slave_hold_ms, pressed=pressed)

    def note_retention(self, result: CleanResult) -> None:
        """Count what a retention round removed."""
        ident = self.metrics.ident
        deleted_bytes, deleted_files = self.metrics.store_deleted_bytes, self.metrics.store_deleted
        if result.segments:
            deleted_bytes.labels(**ident, file="commitlog").inc(result.segment_bytes)
            deleted_files.labels(**ident, file="commitlog").inc(result.segments)
        if result.queue_files:
            deleted_bytes.labels(**ident, file="consumequeue").inc(result.queue_bytes)
            deleted_files.labels(**ident, file="consumequeue").inc(result.queue_files)
        self.refresh_store_bytes()

    def refresh_store_bytes(self) -> None:
        ident = self.metrics.ident
        self.metrics.store_bytes.labels(**ident, file="commitlog").set(self.store.commitlog_bytes)
        self.metrics.store_bytes.labels(**ident, file="consumequeue").set(
            self.store.consume_queue_bytes
        )

    # ---- special services --------------------------------------------------------

    def add_special_service(self, hook: Callable[[bool], None]) -> None:
        """Register a special service's ``set_running``: they run on the master and on the
        acting slave (RocketMQ's ``changeSpecialServiceStatus``)."""
        self._special_hooks.append(hook)

    def set_special_services(self, should_run: bool) -> None:
        """Start/stop every special service (a master runs them once online)."""
        for hook in self._special_hooks:
            hook(should_run)

    # ---- role changes (controller mode) --------------------------------------------

    def on_role_change(self, callback: Callable[[RoleChange], None]) -> None:
        """Who rebuilds the service in another role (the service, for its runner)."""
        self._role_change = callback

    def change_role(self, change: RoleChange) -> None:
        """Stop serving in this role at once (a master may have been replaced, a slave's
        log may hold what its new master's does not): the service is rebuilt as
        ``change`` says."""
        self.isolated = True
        self.preonline_step = f"changing role: {change.reason}"
        self._role_change(change)

    # ---- fencing -----------------------------------------------------------------

    def on_fence(self, fence: Callable[[str], None]) -> None:
        """Who fences this broker and starts pre-online again (membership)."""
        self._fence = fence

    def fence(self, why: str) -> None:
        """Stop serving at once: this master may have been expired (see Lease)."""
        self._fence(why)

    def lease_lost(self) -> bool:
        """A master with acting masters on whose lease on id 0 has run out."""
        return (
            self.acting.is_master and self.cfg.enable_slave_acting_master and self.lease.expired()
        )

    # ---- guards ------------------------------------------------------------------

    def check_online(self) -> None:
        """Refuse clients while isolated (pre-online) or fenced.

        A master checks its lease here too, so that a master resumed after a freeze
        refuses the requests queued meanwhile before its heartbeat loop even runs."""
        if not self.isolated and self.lease_lost():
            self.fence("no heartbeat acknowledged within the not-active timeout")
        if self.isolated:
            raise BrokerIsolated(f"{self.name} is not serving: {self.preonline_step}")

    def check_master_only(self, what: str) -> None:
        """Online, and the master or the acting slave."""
        self.check_online()
        if not self.acting.serves_master_only_ops:
            raise NotMaster(f"{what}: {self.name} is a slave and not acting")

    def check_writable_master(self, what: str) -> None:
        """Online and the master: the only broker that may append to its own log."""
        self.check_online()
        if not self.acting.is_master:
            raise NotMaster(f"{what}: {self.name} is a slave; send to the master")
        if self.paused_until and time.monotonic() < self.paused_until:
            raise NotMaster(f"{what}: {self.name} takes no writes: {self.paused_for}")
        if self.role.writes_from and time.monotonic() < self.role.writes_from:
            raise NotMaster(
                f"{what}: {self.name} was elected uncleanly and waits "
                f"{self.role.writes_from - time.monotonic():.1f} s more for the old master's "
                "lease to run out"
            )

    def copies_needed(self) -> int:
        """Copies (the master's included) a write needs before it is acknowledged."""
        return copies_needed(self.cfg)

    def sync_set_shortfall(self) -> str | None:
        """Controller mode: why writes are refused because the confirmed sync-state set
        is smaller than ``in_sync_replicas`` (every member of it must hold a write; a
        smaller set could not survive the loss of the master), else None."""
        if self.sync is None:
            return None
        needed = self.copies_needed()
        if needed <= 1 or len(self.sync.confirmed) >= needed:
            return None
        return (
            f"the sync-state set {sorted(self.sync.confirmed)} of {self.cfg.broker_name} "
            f"holds {len(self.sync.confirmed)} member(s), in_sync_replicas is {needed}"
        )

    # ---- status and gauges -------------------------------------------------------

    def replication_lag(self) -> int:
        if self.ha_master is not None:
            return self.ha_master.lag_bytes()
        if self.ha_slave is not None:
            return self.ha_slave.lag_bytes
        return 0

    def not_ready_reason(self) -> str | None:
        """Why ``/readyz`` answers 503, or None: pre-online, or a store that cannot
        take writes (a master cannot take sends, a slave cannot replicate)."""
        if self.isolated:
            return f"pre-online: {self.preonline_step}"
        why = self.store.unwritable_reason()
        if why is not None:
            return f"store not writable: {why}"
        return None

    def status(self) -> dict[str, Any]:
        """``GET /api/v1/status`` and GET_BROKER_STATUS."""
        return {
            "cluster": self.cfg.cluster,
            "brokerName": self.cfg.broker_name,
            "brokerId": self.cfg.broker_id,
            "role": "master" if self.acting.is_master else "slave",
            **(
                {
                    "memberId": self.member_id,
                    "epoch": self.role.epoch,
                    "syncStateSet": sorted(self.sync.confirmed) if self.sync else None,
                }
                if self.role.controlled
                else {}
            ),
            "acting": self.acting.acting,
            "isolated": self.isolated,
            "preOnlineStep": self.preonline_step,
            "minBrokerIdInGroup": self.acting.min_broker_id,
            "commitLogMaxOffset": self.store.commitlog_max_offset,
            "replicationLagBytes": self.replication_lag(),
            "storeWritable": self.store.writable,
            "storeNotWritableReason": self.store.unwritable_reason(),
            "storeSpaceLevel": self.store.space_level.name.lower(),
            "storeFreeBytes": self.store.free_disk_bytes,
            "advertisesWrites": self.advertises_writes,
            "replicating": self.ha_slave.replicating if self.ha_slave is not None else None,
            "replicationStalled": self.ha_slave.stalled if self.ha_slave is not None else None,
            "addr": self.addr,
            "haAddr": self.ha_addr,
            "slaves": (
                [
                    {
                        "addr": link.slave_addr,
                        "brokerId": link.broker_id,
                        "ackedOffset": link.acked,
                        "confirming": self.ha_master.confirming(link),
                    }
                    for link in self.ha_master.transfer_slaves()
                ]
                if self.ha_master is not None
                else []
            ),
        }

    @property
    def exports_consumer_lag(self) -> bool:
        """Whether this broker reports its group's consumer lag now: an online master,
        or the slave acting for it; never two members of a group at once (a slave that
        does not act, or a master in pre-online or fenced, keeps quiet).  A master whose
        lease ran out (resumed after a freeze, not fenced yet) is quiet too: a slave may
        act for it by now."""
        return not self.isolated and not self.lease_lost() and self.acting.serves_master_only_ops

    def consumer_lag(self, group: str | None = None, topic: str | None = None) -> list[QueueLag]:
        """Consumer lag per queue (``broker_agent.lag``) from this broker's offsets and
        store, for every group (or ``group``) and topic (or ``topic``)."""

        def read_queues(name: str) -> int:
            config = self.topics.get(name)
            return 0 if config is None else config.read_queue_nums

        return queue_lags(self.store, self.offsets.entries(), read_queues, group=group, topic=topic)

    def correct_offsets_past_ends(self) -> None:
        """Bring the committed offsets past the ends of the queues an unclean recovery
        ended back to those ends (the commits were of a lost tail, and the next messages
        take those offsets), once: at start without a pre-online, else when a master's
        pre-online has caught up from its slaves (what it copied back is the same tail,
        and a commit into it stands)."""
        queues, self.recovered_queues = self.recovered_queues, set()
        if not queues:
            return
        ends = {key: self.store.max_offset(*key) for key in queues}
        for (group, topic, qid), was, end in self.offsets.correct_past(ends):
            log.warning(
                "consumer offset of %s in %s/%d was %d, past the queue's end %d after an "
                "unclean stop: corrected to it",
                group,
                topic,
                qid,
                was,
                end,
            )

    def update_role_metrics(self) -> None:
        self.metrics.set_role(self.acting.role)
        self.metrics.isolated.labels(**self.metrics.ident).set(1 if self.isolated else 0)
        self.metrics.min_broker_id.labels(**self.metrics.ident).set(self.acting.min_broker_id)
        if self.epochs is not None:
            self.metrics.epoch.labels(**self.metrics.ident).set(self.epochs.last)
        if self.sync is not None:
            self.metrics.sync_state_set_size.labels(**self.metrics.ident).set(
                len(self.sync.confirmed)
            )

    def refresh_gauges(self) -> None:
        ident = self.metrics.ident
        self.metrics.replication_lag.labels(**ident).set(self.replication_lag())
        self.metrics.commitlog_max_offset.labels(**ident).set(self.store.commitlog_max_offset)
        self.metrics.store_writable.labels(**ident).set(1 if self.store.writable else 0)
        self.metrics.store_free_bytes.labels(**ident).set(self.store.free_disk_bytes)
        self.metrics.damaged_ranges.labels(**ident).set(self.store.damaged_count)
        self.metrics.pull_held.labels(**ident).set(self.holds.held_count)
        keys = self.store.key_index_stats
        if keys:
            self.metrics.key_index_entries.labels(**ident).set(keys["entries"])
            self.metrics.key_index_overflow.labels(**ident).set(keys["overflow"])
        self.refresh_store_bytes()
        self.update_role_metrics()
