"""The nameserver route table: a plain state machine, no I/O.

Follows RocketMQ's ``RouteInfoManager`` with RIP-32:
registration with min-broker-id change detection, lightweight heartbeats,
expiry, write-perm wipe of a group that lost its master and the acting-master
route rewrite.  The service that wraps it owns sockets, timers and locking
(every method runs on one event loop, so no lock is taken here) and sends the
:class:`MinIdChange` notifications the table returns.

Deliberate differences from RocketMQ:
- a min-id change is notified on the register and the unregister path alike,
  and only for groups with ``enable_acting_master``;
- notifications carry the broker name;
- the slave that acts for a masterless group is not simply the lowest live id:
  brokers report their replication position (commit-log end) and whether their store
  takes appends (registration and heartbeat), and the table picks the most advanced
  slave, preferring one that can write, lowest id first (:func:`nameserver.acting.choose_acting`),
  and chooses again on every report that changes the answer (the acting slave falls
  behind, or says it cannot write).  The route rewrite, the member group and the
  min-id notifications all name that slave (the group's *lead*).  A member that
  reports no position (an old broker) brings back RocketMQ's rule, the lowest id;
- a single-topic registration before the first full one is accepted;
- a batch of removals (one scan, one closed connection) yields at most one
  notification per group, computed from the group's state before and after.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Final

from ha_controller.controller.ports import LiveMember
from ha_controller.dataversion import DataVersion
from ha_controller.routing import (
    SETTLING,
    SYNC_BROKER_MEMBER_GROUP_PREFIX,
    BrokerData,
    BrokerMemberGroup,
    Perm,
    QueueData,
    TopicRouteData,
)
from nameserver.acting import choose_acting, keeps_acting
from nameserver.route_records import (
    MASTER_ID,
    BrokerRegistration,
    ExpiredBroker,
    GroupRecord,
    HeartbeatOutcome,
    LiveInfo,
    MinIdChange,
    RegisterOutcome,
    Removal,
)

__all__ = [
    "DEFAULT_BROKER_CHANNEL_EXPIRED_TIME_MS",
    "MASTER_ID",
    "BrokerRegistration",
    "ExpiredBroker",
    "HeartbeatOutcome",
    "MinIdChange",
    "RegisterOutcome",
    "RouteTable",
]

log = logging.getLogger(__name__)

#: Heartbeat timeout of a broker that did not send one (old broker), as in RocketMQ.
DEFAULT_BROKER_CHANNEL_EXPIRED_TIME_MS: Final = 120_000
#: A scan that runs this much later than its interval (at least) means the nameserver
#: itself stalled (SIGSTOP, a VM or GC pause): the silence it measured is its own.
STALL_MARGIN_MIN_MS: Final = 1000.0

# Queue data of the compatibility member-group topic, as brokers create it.
_SYNC_TOPIC_QUEUE_NUMS: Final = 1
_SYNC_TOPIC_PERM: Final = Perm.INHERIT


#: groups whose highest reported position a nameserver remembers (oldest dropped)
MAX_HIGH_WATER_GROUPS = 10_000


def _monotonic_ms() -> float:
    return time.monotonic() * 1000


class RouteTable:
    """Clusters, broker groups, topic queue data and broker liveness."""

    def __init__(
        self,
        clock: Callable[[], float] = _monotonic_ms,
        *,
        support_acting_master: bool = True,
        notify_min_broker_id_changed: bool = True,
        scan_interval_ms: float | None = None,
    ) -> None:
        self._clock = clock
        #: the scanner's period; with it, a late scan is recognised as our own stall
        self.scan_interval_ms = scan_interval_ms
        self._last_scan_ms: float | None = None
        #: scans that found the nameserver itself had stalled (and expired nobody)
        self.stalls = 0
        self.support_acting_master = support_acting_master
        self.notify_min_broker_id_changed = notify_min_broker_id_changed
        self._cluster_addr: dict[str, set[str]] = {}
        self._groups: dict[str, GroupRecord] = {}
        self._topic_queues: dict[str, dict[str, QueueData]] = {}
        self._live: dict[tuple[str, str], LiveInfo] = {}
        #: (cluster, group) -> the highest commit-log end any member reported since
        #: this nameserver started, kept after the members left: a master that comes
        #: back with less (a lost volume) while no slave is there learns it held more
        self._high_water: dict[tuple[str, str], int] = {}
        self._generation = 0
        self._min_id_changes = 0

    # ------------------------------------------------------------------ state

    @property
    def generation(self) -> int:
        """Moves on every mutation that can change a route a client sees."""
        return self._generation

    @property
    def min_id_changes(self) -> int:
        """Min-broker-id changes seen so far, notified or not (a metric)."""
        return self._min_id_changes

    def topics(self) -> list[str]:
        """Topics with queue data (the implicit member-group topics excluded)."""
        return sorted(self._topic_queues)

    def is_registered(self, cluster: str, broker_addr: str) -> bool:
        return (cluster, broker_addr) in self._live

    def registration_conflict(
        self,
        cluster: str,
        broker_addr: str,
        conn_id: Hashable,
        *,
        broker_name: str | None = None,
        broker_id: int | None = None,
    ) -> str | None:
        """Open mode (no cluster secret): why a change to ``broker_addr``'s registration
        arriving on ``conn_id`` must be refused, or None.

        A live broker's registration belongs to the connection it registered on: a
        register, unregister or heartbeat naming its address from any other connection
        is refused.  With ``broker_name``/``broker_id`` (a registration), so is taking
        an id that another live broker holds through another connection.  Both hold
        until that broker unregisters, its connection closes or it expires (heartbeat
        timeout).  A broker registered without a connection binds nothing."""
        live = self._live.get((cluster, broker_addr))
        if live is not None and live.conn_id is not None and live.conn_id != conn_id:
            return f"{broker_addr} is registered through another connection"
        if broker_name is None or broker_id is None:
            return None
        group = self._groups.get(broker_name)
        holder = None if group is None else group.addrs.get(broker_id)
        if holder is None or holder == broker_addr:
            return None
        holder_live = self._live.get((cluster, holder))
        if holder_live is not None and holder_live.conn_id not in (None, conn_id):
            return (
                f"id {broker_id} of {broker_name} is held by {holder}, registered through "
                "another connection"
            )
        return None

    def broker_data_version(self, cluster: str, broker_addr: str) -> DataVersion | None:
        """The topic-config DataVersion last registered by a live broker."""
        live = self._live.get((cluster, broker_addr))
        return None if live is None else live.data_version.copy()

    def _bump(self) -> None:
        self._generation += 1

    # ---------------------------------------------------------- registration

    def register_broker(
        self, reg: BrokerRegistration, conn_id: Hashable | None = None
    ) -> RegisterOutcome:
        """Register (or refresh) a broker and its topics (REGISTER_BROKER)."""
        now = self._clock()
        names = self._cluster_addr.setdefault(reg.cluster, set())
        if reg.broker_name not in names:
            names.add(reg.broker_name)
            self._bump()

        group = self._groups.get(reg.broker_name)
        register_first = group is None
        if group is None:
            group = GroupRecord(reg.cluster, reg.broker_name, first_seen_ms=self._clock())
            self._groups[reg.broker_name] = group
            self._bump()

        # Last writer wins, an old broker (None) switches it off.
        is_old_version = reg.enable_acting_master is None
        enable_acting_master = not is_old_version and bool(reg.enable_acting_master)
        if group.enable_acting_master != enable_acting_master:
            log.info(
                "group %s: enableActingMaster %s -> %s (set by %s)",
                reg.broker_name,
                group.enable_acting_master,
                enable_acting_master,
                reg.broker_addr,
            )
            group.enable_acting_master = enable_acting_master
            self._bump()

        prev_min = self._notice_base(group)

        # A master may not take id 0 back from a slave acting for it unless it went
        # through pre-online (adopting the acting slave's newer offsets): a master that
        # was frozen or partitioned past its heartbeat timeout and simply re-registers
        # would serve (and replicate) the offsets it had before, and everything consumed
        # meanwhile would be delivered again.
        if (
            reg.broker_id == MASTER_ID
            and not reg.pre_online_done
            and group.addrs.get(MASTER_ID) != reg.broker_addr
            and self._may_act(group)
        ):
            log.warning(
                "refuse id 0 of %s to %s: %s acts for it and the master did not say it "
                "completed pre-online",
                reg.broker_name,
                reg.broker_addr,
                group.lead(),
            )
            return RegisterOutcome(rejected=True, notifications=[], needs_pre_online=True)

        # Stale stateVersion: another live address holds this id with a newer state.
        holder = group.addrs.get(reg.broker_id)
        if holder is not None and holder != reg.broker_addr:
            holder_live = self._live.get((reg.cluster, holder))
            if (
                holder_live is not None
                and holder_live.data_version.state_version > reg.data_version.state_version
            ):
                log.warning(
                    "reject registration of %s as %s/%d: stateVersion %d < %d of %s",
                    reg.broker_addr,
                    reg.broker_name,
                    reg.broker_id,
                    reg.data_version.state_version,
                    holder_live.data_version.state_version,
                    holder,
                )
                # Drop the loser's live entry and any other id it held (role switch).
                lost = self._unregister_many(
                    [Removal(reg.cluster, reg.broker_addr, reg.broker_name, reg.broker_id)]
                )
                return RegisterOutcome(rejected=True, notifications=lost)

        # Role switch: the same address holds only one id.
        for other_id in [i for i, a in group.addrs.items() if a == reg.broker_addr]:
            if other_id != reg.broker_id:
                log.info(
                    "group %s: %s switches id %d -> %d",
                    reg.broker_name,
                    reg.broker_addr,
                    other_id,
                    reg.broker_id,
                )
                del group.addrs[other_id]
                self._bump()

        old_addr = group.addrs.get(reg.broker_id)
        group.addrs[reg.broker_id] = reg.broker_addr
        if old_addr != reg.broker_addr:
            self._bump()
        register_first = register_first or old_addr is None

        is_master = reg.broker_id == MASTER_ID
        if is_master:
            group.master_seen = True
        is_prime_slave = not is_old_version and not is_master and reg.broker_id == min(group.addrs)
        if is_master or is_prime_slave:
            self._update_topics(reg, group, register_first=register_first, wipe=is_prime_slave)

        self._live[(reg.cluster, reg.broker_addr)] = LiveInfo(
            last_update_ms=now,
            heartbeat_timeout_ms=(
                reg.heartbeat_timeout_ms
                if reg.heartbeat_timeout_ms is not None
                else DEFAULT_BROKER_CHANNEL_EXPIRED_TIME_MS
            ),
            data_version=reg.data_version.copy(),
            conn_id=conn_id,
            ha_addr=reg.ha_addr,
            broker_name=reg.broker_name,
            max_offset=reg.max_offset,
            store_writable=reg.store_writable is not False,
            reported_ms=now,
            heard_ms=now,
            member_id=reg.member_id,
            epoch=reg.epoch,
        )
        self._note_position(reg.cluster, reg.broker_name, reg.max_offset)

        master_addr: str | None = None
        master_ha_addr: str | None = None
        if not is_master:
            candidate = group.addrs.get(MASTER_ID)
            master_live = None if candidate is None else self._live.get((reg.cluster, candidate))
            if master_live is not None:
                master_addr, master_ha_addr = candidate, master_live.ha_addr

        notes: list[MinIdChange] = []
        self._rechoose(group)
        change = self._min_id_change(
            group, prev_min, ha_addr=reg.ha_addr, registering=reg.broker_addr
        )
        if change is not None:
            notes.append(change)
        return RegisterOutcome(master_addr, master_ha_addr, False, notes)

    def _update_topics(
        self, reg: BrokerRegistration, group: GroupRecord, *, register_first: bool, wipe: bool
    ) -> None:
        """Write the topic queue data of a master or prime slave (§1.2 step 10)."""
        live = self._live.get((reg.cluster, reg.broker_addr))
        version_changed = live is None or live.data_version != reg.data_version
        wipe = wipe and group.enable_acting_master
        wiped = 0
        for topic in sorted(reg.topic_configs):
            queues = self._topic_queues.get(topic)
            if not (
                register_first
                or version_changed
                or queues is None
                or group.broker_name not in queues
            ):
                continue
            config = reg.topic_configs[topic]
            queue_data = QueueData.from_topic_config(group.broker_name, config)
            if wipe and Perm.is_writeable(queue_data.perm):
                queue_data = QueueData(
                    queue_data.broker_name,
                    queue_data.read_queue_nums,
                    queue_data.write_queue_nums,
                    Perm.without_write(queue_data.perm),
                    queue_data.topic_sys_flag,
                )
                wiped += 1
            if queues is None:
                queues = self._topic_queues.setdefault(topic, {})
            if queues.get(group.broker_name) != queue_data:
                queues[group.broker_name] = queue_data
                self._bump()
        if wiped:
            log.info(
                "perm wipe: group %s has no master, prime slave %s/%d registered %d topic(s)"
                " read-only",
                group.broker_name,
                reg.broker_addr,
                reg.broker_id,
                wiped,
            )

    # -------------------------------------------------------------- liveness

    def heartbeat(self, cluster: str, broker_addr: str) -> bool:
        """Refresh a registered broker; never registers one (§1.3)."""
        return self.broker_heartbeat(cluster, broker_addr).known

    def broker_heartbeat(
        self,
        cluster: str,
        broker_addr: str,
        *,
        max_offset: int | None = None,
        store_writable: bool | None = None,
        epoch: int | None = None,
    ) -> HeartbeatOutcome:
        """Refresh a registered broker with what it reports (its replication position,
        whether its store takes appends); never registers one (§1.3).  In a masterless
        group a report may make another slave the acting one: the notification is in
        the outcome."""
        live = self._live.get((cluster, broker_addr))
        if live is None:
            return HeartbeatOutcome(False)
        live.last_update_ms = live.heard_ms = self._clock()
        if epoch is not None:
            live.epoch = epoch
        changed = False
        if max_offset is not None:
            live.reported_ms = live.last_update_ms
            if live.broker_name is not None:
                self._note_position(cluster, live.broker_name, max_offset)
            if max_offset != live.max_offset:
                live.max_offset = max_offset
                changed = True
        if store_writable is not None and store_writable != live.store_writable:
            log.info(
                "broker %s reports its store %s",
                broker_addr,
                "takes appends again" if store_writable else "cannot take appends",
            )
            live.store_writable = store_writable
            changed = True
        group = None if live.broker_name is None else self._groups.get(live.broker_name)
        if group is None or not self._may_act(group) or not (changed or group.settling):
            return HeartbeatOutcome(True)
        prev = self._notice_base(group)
        self._rechoose(group)
        change = self._min_id_change(group, prev, ha_addr=None)
        return HeartbeatOutcome(True, [] if change is None else [change])

    def _note_position(self, cluster: str, broker_name: str, max_offset: int | None) -> None:
        if max_offset is None:
            return
        key = (cluster, broker_name)
        if max_offset > self._high_water.get(key, 0):
            if key not in self._high_water and len(self._high_water) >= MAX_HIGH_WATER_GROUPS:
                self._high_water.pop(next(iter(self._high_water)))
            self._high_water[key] = max_offset

    def query_data_version(self, cluster: str, broker_addr: str, data_version: DataVersion) -> bool:
        """Whether ``data_version`` differs from the registered one; also a heartbeat."""
        live = self._live.get((cluster, broker_addr))
        changed = live is None or live.data_version != data_version
        self.heartbeat(cluster, broker_addr)
        return changed

    def stall_margin_ms(self) -> float | None:
        """How much later than its interval a scan may run before it counts as a stall
        of the nameserver itself (None: the interval is not known, no detection)."""
        if self.scan_interval_ms is None:
            return None
        return max(STALL_MARGIN_MIN_MS, self.scan_interval_ms / 2)

    def _stalled(self, now: float) -> float | None:
        """The length of our own stall when this scan ran late, else None."""
        last, self._last_scan_ms = self._last_scan_ms, now
        margin = self.stall_margin_ms()
        if last is None or margin is None or self.scan_interval_ms is None:
            return None
        late = now - last - self.scan_interval_ms
        return late if late > margin else None

    def scan_not_active(self) -> tuple[list[ExpiredBroker], list[MinIdChange]]:
        """Expire every broker silent longer than its heartbeat timeout (§1.4).

        Unless this scan ran late (see :meth:`stall_margin_ms`): then the nameserver
        itself was frozen, the brokers' heartbeats waited in its sockets (or were
        dropped as too old), and the silence it would measure is its own.  Expiring
        them would tell every group's slaves that their master is gone while it lives,
        and serve clients routes without brokers.  Instead every broker gets a fresh
        grace period (one heartbeat timeout from now) and nothing expires this round."""
        now = self._clock()
        stall = self._stalled(now)
        if stall is not None:
            self.stalls += 1
            for live in self._live.values():
                live.last_update_ms = max(live.last_update_ms, now)
            for group in self._groups.values():
                if group.masterless_since is not None:
                    # a settling choice waits for reports made after the stall too
                    group.masterless_since = max(group.masterless_since, now)
            log.warning(
                "nameserver stalled: this scan ran %.0f ms late (interval %.0f ms); "
                "every broker (%d) gets a fresh heartbeat grace period instead of expiring",
                stall,
                self.scan_interval_ms or 0,
                len(self._live),
            )
            return [], []
        expired: list[ExpiredBroker] = []
        for (cluster, addr), live in sorted(self._live.items(), key=lambda kv: kv[0]):
            if live.last_update_ms + live.heartbeat_timeout_ms < now:
                name_id = self._locate(cluster, addr)
                log.warning(
                    "expire broker %s (cluster %s, group %s, id %s):"
                    " no heartbeat for %.0f ms > timeout %d ms",
                    addr,
                    cluster,
                    None if name_id is None else name_id[0],
                    None if name_id is None else name_id[1],
                    now - live.last_update_ms,
                    live.heartbeat_timeout_ms,
                )
                if name_id is not None and name_id[1] == MASTER_ID:
                    self._groups[name_id[0]].master_silent_since = live.last_update_ms
                expired.append(
                    ExpiredBroker(
                        cluster,
                        addr,
                        None if name_id is None else name_id[0],
                        None if name_id is None else name_id[1],
                        live.conn_id,
                        live.last_update_ms,
                        live.heartbeat_timeout_ms,
                    )
                )
        notes = self._expire([(b.cluster, b.broker_addr) for b in expired])
        notes.extend(self.settle())
        return expired, notes

    def on_connection_closed(self, conn_id: Hashable) -> list[MinIdChange]:
        """Expire at once every broker registered on a closed connection."""
        if conn_id is None:  # brokers registered without a connection are not bound to one
            return []
        keys = sorted(key for key, live in self._live.items() if live.conn_id == conn_id)
        for cluster, addr in keys:
            log.warning(
                "expire broker %s (cluster %s): connection %r closed", addr, cluster, conn_id
            )
        return self._expire(keys)

    def _locate(self, cluster: str, broker_addr: str) -> tuple[str, int] | None:
        for name in sorted(self._cluster_addr.get(cluster, ())):
            group = self._groups.get(name)
            if group is None:
                continue
            for broker_id, addr in group.addrs.items():
                if addr == broker_addr:
                    return name, broker_id
        return None

    def _expire(self, keys: Iterable[tuple[str, str]]) -> list[MinIdChange]:
        removals: list[Removal] = []
        for cluster, addr in keys:
            name_id = self._locate(cluster, addr)
            if name_id is None:
                self._live.pop((cluster, addr), None)
            else:
                removals.append(Removal(cluster, addr, name_id[0], name_id[1]))
        return self._unregister_many(removals)

    # ---------------------------------------------------------- unregister

    def unregister_broker(
        self, cluster: str, broker_addr: str, broker_name: str, broker_id: int
    ) -> list[MinIdChange]:
        """Remove a broker from its group (§1.5)."""
        return self._unregister_many([Removal(cluster, broker_addr, broker_name, broker_id)])

    def _unregister_many(self, removals: list[Removal]) -> list[MinIdChange]:
        """Apply removals, then clean topics and report one change per group."""
        prev_mins: dict[str, tuple[int, str] | None] = {}
        removed_groups: list[str] = []
        reduced_groups: list[str] = []
        for rm in removals:
            self._live.pop((rm.cluster, rm.broker_addr), None)
            group = self._groups.get(rm.broker_name)
            if group is None:
                continue
            prev_mins.setdefault(group.broker_name, group.lead())
            gone = [i for i, a in group.addrs.items() if a == rm.broker_addr]
            for broker_id in gone:
                del group.addrs[broker_id]
                self._bump()
            if gone:
                log.info(
                    "unregister %s from group %s (id %s)",
                    rm.broker_addr,
                    group.broker_name,
                    ",".join(str(i) for i in sorted(gone)),
                )
            if not group.addrs:
                self._remove_group(group)
                removed_groups.append(group.broker_name)
            elif group.broker_name not in reduced_groups:
                reduced_groups.append(group.broker_name)

        notes: list[MinIdChange] = []
        for name in reduced_groups:
            group = self._groups.get(name)
            if group is None:
                continue
            self._wipe_write_perm_if_masterless(group)
            self._rechoose(group)
            prev = prev_mins.get(name)
            if group.settling and prev is not None and prev[0] == MASTER_ID:
                group.lost_master = prev  # the notice goes out once a slave is chosen
            change = self._min_id_change(group, prev, ha_addr=None)
            if change is not None:
                notes.append(change)
        return notes

    def _remove_group(self, group: GroupRecord) -> None:
        name = group.broker_name
        del self._groups[name]
        self._bump()
        for cluster, names in list(self._cluster_addr.items()):
            names.discard(name)
            if not names:
                del self._cluster_addr[cluster]
        for topic, queues in list(self._topic_queues.items()):
            if queues.pop(name, None) is not None and not queues:
                del self._topic_queues[topic]
        log.info("group %s has no member left: removed with its queue data", name)

    def _wipe_write_perm_if_masterless(self, group: GroupRecord) -> None:
        if not group.enable_acting_master or group.has_master():
            return
        wiped = 0
        for queues in self._topic_queues.values():
            queue_data = queues.get(group.broker_name)
            if queue_data is not None and Perm.is_writeable(queue_data.perm):
                queues[group.broker_name] = QueueData(
                    queue_data.broker_name,
                    queue_data.read_queue_nums,
                    queue_data.write_queue_nums,
                    Perm.without_write(queue_data.perm),
                    queue_data.topic_sys_flag,
                )
                wiped += 1
        if wiped:
            self._bump()
            log.info(
                "perm wipe: group %s has no master, write bit removed from %d topic(s)",
                group.broker_name,
                wiped,
            )

    # ------------------------------------------------------- notifications

    def _min_id_change(
        self,
        group: GroupRecord,
        prev_min: tuple[int, str] | None,
        *,
        ha_addr: str | None,
        registering: str | None = None,
    ) -> MinIdChange | None:
        """The notification for a change of ``group``'s lead (its lowest id in
        RocketMQ: the master, else the chosen acting slave), if one is due.
        ``registering`` is the broker whose registration caused it: the one member
        that needs no notice (it learns from its member group)."""
        new_min = group.lead()
        if prev_min is None or new_min is None or new_min[0] == prev_min[0]:
            return None
        self._min_id_changes += 1
        min_id, min_addr = new_min
        # The previous lead left (not merely another slave chosen to act).
        offline = prev_min[1] if prev_min[1] and prev_min[1] not in group.addrs.values() else None
        addrs = group.sorted_addrs()
        if offline is None and len(addrs) > 1 and registering == min_addr:
            targets = [addr for broker_id, addr in addrs.items() if broker_id != min_id]
        else:
            targets = list(addrs.values())
        if registering != min_addr:
            ha_addr = None
        gated = (
            "sent"
            if self.notify_min_broker_id_changed and group.enable_acting_master
            else "not sent"
        )
        log.info(
            "min broker id change: group %s %d(%s) -> %d(%s), offline %s, notify %s (%s)",
            group.broker_name,
            prev_min[0],
            prev_min[1],
            min_id,
            min_addr,
            offline,
            ",".join(targets),
            gated,
        )
        if gated != "sent":
            return None
        return MinIdChange(
            cluster=group.cluster,
            broker_name=group.broker_name,
            min_broker_id=min_id,
            min_broker_addr=min_addr,
            offline_broker_addr=offline,
            ha_broker_addr=ha_addr if offline is None else None,
            targets=targets,
        )

    # ----------------------------------------------------------- acting choice

    def _notice_base(self, group: GroupRecord) -> tuple[int, str] | None:
        """The lead a min-id notice compares with: the current one, or while settling
        the master that left (so the notice at the choice says it is offline), or, while
        a group whose master this nameserver never saw settles, nobody (``SETTLING``):
        the members then hear of whoever leads first, the master registering or the
        slave chosen once the grace is over."""
        lead = group.lead()
        if lead is not None:
            return lead
        if group.lost_master is not None:
            return group.lost_master
        return (SETTLING, "") if group.settling else None

    def settle(self) -> list[MinIdChange]:
        """Choose for groups whose settle wait ran out with a slave that never reported
        (called by the scanner)."""
        notes: list[MinIdChange] = []
        for group in list(self._groups.values()):
            if not group.settling:
                continue
            prev = self._notice_base(group)
            self._rechoose(group)
            change = self._min_id_change(group, prev, ha_addr=None)
            if change is not None:
                notes.append(change)
        return notes

    def _rechoose(self, group: GroupRecord) -> None:
        """Keep ``group.acting_id`` current: None while the group may not act (a master
        is registered, acting master off), else :meth:`_choose_acting`."""
        if group.has_master():
            group.no_master_since = None
        elif group.no_master_since is None:
            # a master expired for silence has been away since it was last heard
            silent = group.master_silent_since
            group.no_master_since = self._clock() if silent is None else silent
        group.master_silent_since = None
        if self._may_act(group):
            if group.masterless_since is None:
                group.masterless_since = self._clock()
            new = choose_acting(group, self._members_live(group), self._clock())
        else:
            group.masterless_since = None
            group.lost_master = None
            new = None
        was_settling = group.settling
        group.settling = new is None and self._may_act(group)
        if new is not None:
            group.lost_master = None  # the caller's notice (from _notice_base) names it
        if group.settling != was_settling:
            self._bump()
            if group.settling:
                log.info(
                    "group %s lost its master: waiting for its slaves' positions",
                    group.broker_name,
                )
        old = group.acting_id
        if (
            new is not None
            and old is not None
            and new != old
            and self._position(group, new) > self._position(group, old)
            and keeps_acting(group, old, self._members_live(group), self._clock())
        ):
            log.debug(
                "group %s: slave %d is further now, slave %d keeps acting",
                group.broker_name,
                new,
                old,
            )
            new = old
        if new == old:
            return
        group.acting_id = new
        self._bump()
        if new is None:
            return

        def report(broker_id: int) -> str:
            info = self._live.get((group.cluster, group.addrs.get(broker_id, "")))
            if info is None:
                return f"id {broker_id}"
            return (
                f"id {broker_id} (position {info.max_offset}, "
                f"{'writable' if info.store_writable else 'cannot write'})"
            )

        log.info(
            "acting slave of group %s: %s%s; members: %s",
            group.broker_name,
            report(new),
            "" if old is None else f", was {report(old)}",
            ", ".join(report(b) for b in sorted(group.addrs)),
        )

    def _members_live(self, group: GroupRecord) -> dict[int, LiveInfo | None]:
        """What each member of ``group`` last reported (None: nothing live)."""
        return {
            broker_id: self._live.get((group.cluster, addr))
            for broker_id, addr in group.addrs.items()
        }

    def _position(self, group: GroupRecord, broker_id: int) -> int:
        info = self._live.get((group.cluster, group.addrs.get(broker_id, "")))
        return -1 if info is None or info.max_offset is None else info.max_offset

    # ---------------------------------------------------------------- reads

    def _may_act(self, group: GroupRecord) -> bool:
        return (
            self.support_acting_master
            and group.enable_acting_master
            and bool(group.addrs)
            and not group.has_master()
        )

    def _acting_rewrite_applies(self, group: GroupRecord, queue_data: QueueData) -> bool:
        return self._may_act(group) and not Perm.is_writeable(queue_data.perm)

    def pickup_route(self, topic: str) -> TopicRouteData | None:
        """The route clients see, with the acting-master rewrite (§1.7)."""
        if topic.startswith(SYNC_BROKER_MEMBER_GROUP_PREFIX):
            route = self._member_group_route(topic)
            if route is not None:
                return route
        queues = self._topic_queues.get(topic)
        if not queues:
            return None
        broker_datas: list[BrokerData] = []
        for name in sorted(queues):
            group = self._groups.get(name)
            if group is None:
                continue
            broker_data = dataclasses.replace(
                group.to_broker_data(), epoch=self._master_epoch(group)
            )
            lead = group.lead()
            if (
                lead is not None
                and not topic.startswith(SYNC_BROKER_MEMBER_GROUP_PREFIX)
                and self._acting_rewrite_applies(group, queues[name])
            ):
                addr = broker_data.broker_addrs.pop(lead[0])
                broker_data = BrokerData(
                    broker_data.cluster,
                    broker_data.broker_name,
                    {MASTER_ID: addr, **broker_data.broker_addrs},
                    broker_data.enable_acting_master,
                    broker_data.epoch,
                )
            broker_datas.append(broker_data)
        if not broker_datas:
            return None
        return TopicRouteData(topic, broker_datas, list(queues.values()))

    def _master_epoch(self, group: GroupRecord) -> int | None:
        """Controller mode: the epoch the member registered as id 0 reported."""
        addr = group.addrs.get(MASTER_ID)
        live = self._live.get((group.cluster, addr)) if addr is not None else None
        return live.epoch if live is not None and live.member_id is not None else None

    def _member_group_route(self, topic: str) -> TopicRouteData | None:
        """Route of ``rmq_sys_SYNC_BROKER_MEMBER_{name}``: raw ids, never rewritten."""
        group = self._groups.get(topic[len(SYNC_BROKER_MEMBER_GROUP_PREFIX) :])
        if group is None:
            return None
        queue_data = self._topic_queues.get(topic, {}).get(group.broker_name)
        if queue_data is None:
            queue_data = QueueData(
                group.broker_name, _SYNC_TOPIC_QUEUE_NUMS, _SYNC_TOPIC_QUEUE_NUMS, _SYNC_TOPIC_PERM
            )
        return TopicRouteData(topic, [group.to_broker_data()], [queue_data])

    def member_group(self, cluster: str, broker_name: str) -> BrokerMemberGroup:
        """A group's members with raw ids (§1.6); empty when unknown."""
        group = self._groups.get(broker_name)
        seen = self._high_water.get((cluster, broker_name))
        if group is None:
            return BrokerMemberGroup(cluster, broker_name, {}, max_offset_seen=seen)
        acting = (SETTLING if group.settling else group.acting_id) if self._may_act(group) else None
        heard: int | None = None
        master_addr = group.addrs.get(MASTER_ID)
        if master_addr is not None:
            live = self._live.get((group.cluster, master_addr))
            if live is not None:
                heard = max(0, int(self._clock() - live.heard_ms))
        return BrokerMemberGroup(
            cluster, broker_name, group.sorted_addrs(), acting, heard, max_offset_seen=seen
        )

    def cluster_info(self) -> dict[str, Any]:
        """``{"brokerAddrTable", "clusterAddrTable"}``, JSON-friendly and sorted."""
        return {
            "brokerAddrTable": {
                name: {
                    **self._groups[name].to_broker_data().to_json(),
                    "enableActingMaster": self._groups[name].enable_acting_master,
                    "actingBrokerId": self.acting_broker_id(name),
                }
                for name in sorted(self._groups)
            },
            "clusterAddrTable": {
                cluster: sorted(self._cluster_addr[cluster])
                for cluster in sorted(self._cluster_addr)
            },
        }

    def acting_broker_id(self, broker_name: str) -> int | None:
        """Raw id of the slave routes show as id 0, or None.

        A group with no queue data counts as acting when it has no master and
        acting master is on (its chosen slave runs the special services).
        """
        group = self._groups.get(broker_name)
        if group is None or not self._may_act(group):
            return None
        perms = [q[broker_name].perm for q in self._topic_queues.values() if broker_name in q]
        if perms and all(Perm.is_writeable(perm) for perm in perms):
            return None
        lead = group.lead()
        return None if lead is None else lead[0]

    # ------------------------------------------------ the controller's port

    def controlled_groups(self) -> list[tuple[str, str]]:
        """(cluster, group) of every group with a member that registered a member id
        (controller support), sorted."""
        out: set[tuple[str, str]] = set()
        for (cluster, _addr), live in self._live.items():
            if live.member_id is not None and live.broker_name is not None:
                out.add((cluster, live.broker_name))
        return sorted(out)

    def live_members(self, cluster: str, group: str) -> list[LiveMember]:
        """The group's registered members that said their member id."""
        g = self._groups.get(group)
        if g is None or g.cluster != cluster:
            return []
        now = self._clock()
        out: list[LiveMember] = []
        for route_id, addr in sorted(g.addrs.items()):
            live = self._live.get((cluster, addr))
            if live is None or live.member_id is None:
                continue
            out.append(
                LiveMember(
                    member=live.member_id,
                    route_id=route_id,
                    addr=addr,
                    max_offset=live.max_offset or 0,
                    epoch=live.epoch,
                    heard_age_ms=max(0.0, now - live.heard_ms),
                    heartbeat_timeout_ms=live.heartbeat_timeout_ms,
                )
            )
        return out

    def no_master_ms(self, cluster: str, group: str) -> float | None:
        """How long the group has had no member registered as id 0 (None: it has one,
        or the group is not known here)."""
        g = self._groups.get(group)
        if g is None or g.cluster != cluster or g.no_master_since is None:
            return None
        since = g.no_master_since
        if not g.master_seen:
            # a nameserver that has just started, or a cluster that starts, hears from
            # slaves first: a master it never saw counts as gone only from one heartbeat
            # timeout after the group's first member registered (as for acting)
            grace = max(
                (
                    live.heartbeat_timeout_ms
                    for addr in g.addrs.values()
                    if (live := self._live.get((cluster, addr))) is not None
                ),
                default=0,
            )
            since = max(since, g.first_seen_ms + grace)
        return max(0.0, self._clock() - since) if self._clock() >= since else None

    def registered_id(self, cluster: str, broker_addr: str) -> int | None:
        """The id a live broker is registered under."""
        located = self._locate(cluster, broker_addr)
        return None if located is None else located[1]

    def groups_view(self, now_ms: float | None = None) -> list[dict[str, Any]]:
        """``GET /api/v1/groups`` (docs/http-and-metrics.md), sorted by cluster and name."""
        now = self._clock() if now_ms is None else now_ms
        view: list[dict[str, Any]] = []
        for name in sorted(self._groups, key=lambda n: (self._groups[n].cluster, n)):
            group = self._groups[name]
            members: list[dict[str, Any]] = []
            for broker_id, addr in group.sorted_addrs().items():
                live = self._live.get((group.cluster, addr))
                member: dict[str, Any] = {}
                if live is not None and live.member_id is not None:
                    member = {"memberId": live.member_id, "epoch": live.epoch}
                members.append(
                    {
                        "brokerId": broker_id,
                        "addr": addr,
                        "haAddr": None if live is None else live.ha_addr,
                        "lastHeartbeatAgeMs": (
                            None if live is None else max(0, int(now - live.last_update_ms))
                        ),
                        "maxOffset": None if live is None else live.max_offset,
                        "storeWritable": None if live is None else live.store_writable,
                        **member,
                    }
                )
            view.append(
                {
                    "cluster": group.cluster,
                    "brokerName": name,
                    "enableActingMaster": group.enable_acting_master,
                    "members": members,
                    "masterOnline": group.has_master(),
                    "actingBrokerId": self.acting_broker_id(name),
                }
            )
        return view
