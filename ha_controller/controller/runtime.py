"""The controller a nameserver runs with ``etcd_endpoints`` set (docs/failover.md,
"Automatic master switch").

Every nameserver runs one.  Each keeps a copy of every group's state, read from etcd
every ``controller_poll_interval_ms`` (and at once when a broker shows a newer epoch);
each answers its brokers from it (the role a member takes, the id it registers as,
whether a master's epoch is still current) and each may change a group's sync-state
set for its master, by compare-and-swap.  One of them, the holder of the etcd lease on
the leader key, also takes the timed decision: when a group has had no master for
``auto_switch_after_ms`` it elects a member of the sync-state set
(:func:`~ha_controller.controller.state.elect`), writes the new epoch and tells the
members (``NOTIFY_BROKER_ROLE_CHANGED``).

Why inside the nameservers, not a separate ``hactl controller``: a nameserver already
holds what an election needs, live (which members heartbeat, how far each got, which
one the connection loss or the heartbeat timeout just took away), and it is where
brokers and clients look; a separate process would need all of it sent again and
would be one more thing to deploy, watch and lose.  The decisions themselves are not
the nameservers': they are etcd's, and a nameserver that lost etcd decides nothing.

The controller reads the nameserver through two narrow ports (:class:`Members`, the
route table's live members; :class:`BrokerCalls`, requests to brokers), so it is
tested with plain objects and a real etcd.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from ha_controller.controller.etcd import EtcdClient
from ha_controller.controller.ports import BrokerCalls, LiveMember, Members, View
from ha_controller.controller.state import (
    Election,
    GroupState,
    alter_sync_set,
    elect,
    initial_state,
    planned_switch,
)
from ha_controller.controller.store import GroupStore, Leadership, Stored
from ha_controller.protocol.errors import BadRequest, EtcdUnavailable, HaError, StaleEpoch
from ha_controller.rpc.bounds import Throttle

__all__ = [
    "BrokerCalls",
    "Controller",
    "ControllerSettings",
    "LiveMember",
    "Members",
    "SwitchOutcome",
    "View",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    endpoints: tuple[str, ...]
    prefix: str = "/hac"
    #: 0: no automatic switch (the controller still answers and keeps the sets)
    auto_switch_after_ms: int = 500
    allow_unclean_election: bool = False
    min_switch_interval_ms: int = 5000
    poll_interval_ms: int = 200
    lease_ttl_s: int = 3
    #: a member not heard from for this long is not a candidate (frozen, partitioned)
    member_alive_ms: int = 3000


@dataclass(frozen=True, slots=True)
class SwitchOutcome:
    view: View
    paused_ms: int
    detail: str


class ControllerMetrics(Protocol):
    def switched(self, state: GroupState, kind: str, duration_s: float) -> None: ...

    def states(self, states: Iterable[GroupState]) -> None: ...

    def leading(self, leading: bool) -> None: ...

    def etcd_up(self, up: bool) -> None: ...


class _NoMetrics:
    def switched(self, state: GroupState, kind: str, duration_s: float) -> None:
        pass

    def states(self, states: Iterable[GroupState]) -> None:
        pass

    def leading(self, leading: bool) -> None:
        pass

    def etcd_up(self, up: bool) -> None:
        pass


def _wall_ms() -> int:
    return int(time.time() * 1000)


class Controller:
    """One nameserver's controller (see the module's docstring)."""

    def __init__(
        self,
        settings: ControllerSettings,
        members: Members,
        calls: BrokerCalls,
        *,
        node_id: str,
        metrics: ControllerMetrics | None = None,
        spawn: Callable[[Coroutine[Any, Any, None], str], None] | None = None,
        wall_ms: Callable[[], int] = _wall_ms,
    ) -> None:
        self.settings = settings
        self.members = members
        self.calls = calls
        self.metrics: ControllerMetrics = metrics or _NoMetrics()
        # a request waits for one etcd member no longer than a renewal may (store.py)
        self.etcd = EtcdClient(settings.endpoints, timeout_s=settings.lease_ttl_s / 3)
        self.store = GroupStore(self.etcd, settings.prefix)
        self.leadership = Leadership(
            self.etcd, node_id, prefix=settings.prefix, ttl_s=settings.lease_ttl_s
        )
        self._spawn = spawn
        self._wall_ms = wall_ms
        self._states: dict[tuple[str, str], Stored] = {}
        self._confirmed_at: float | None = None
        self._blocked: dict[tuple[str, str], str] = {}
        self._etcd_log = Throttle(10.0)
        #: one decision per group at a time (an election, a switch, a set change)
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    # ---- the copy of the states ----------------------------------------------------------

    @property
    def fresh_window_ms(self) -> int:
        """A read of etcd older than this does not confirm anything."""
        return max(1000, 5 * self.settings.poll_interval_ms)

    def confirmed_age_ms(self) -> int | None:
        if self._confirmed_at is None:
            return None
        age = int((time.monotonic() - self._confirmed_at) * 1000)
        return age if age <= self.fresh_window_ms else None

    def state(self, cluster: str, group: str) -> GroupState | None:
        stored = self._states.get((cluster, group))
        return None if stored is None else stored.state

    def states(self) -> list[GroupState]:
        return [s.state for _, s in sorted(self._states.items())]

    def view(self, cluster: str, group: str, member: int) -> View:
        """What member ``member`` is told in a registration or heartbeat answer."""
        state = self.state(cluster, group)
        if state is None:
            return View(True, None, member, self.confirmed_age_ms())
        return View(True, state, state.route_id(member), self.confirmed_age_ms())

    def _remember(self, stored: Stored) -> None:
        key = (stored.state.cluster, stored.state.group)
        old = self._states.get(key)
        if old is None or old.revision <= stored.revision:
            self._states[key] = stored
            self.metrics.states(self.states())

    async def refresh(self) -> None:
        """Read every group's state (EtcdUnavailable passes)."""
        started = time.monotonic()
        states = await self.store.load_all()
        for stored in states.values():
            self._remember(stored)
        for key in [k for k in self._states if k not in states]:
            del self._states[key]  # deleted by an operator: the group starts over
        self._confirmed_at = started
        self.metrics.etcd_up(True)

    async def ensure_epoch(self, cluster: str, group: str, epoch: int) -> GroupState | None:
        """The group's state, read again from etcd when a broker shows an epoch newer
        than our copy (our poll has not seen the switch yet)."""
        state = self.state(cluster, group)
        if state is not None and state.epoch >= epoch:
            return state
        stored = await self.store.load(cluster, group)
        if stored is not None:
            self._remember(stored)
        return self.state(cluster, group)

    def _lock(self, key: tuple[str, str]) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    # ---- answers to brokers ----------------------------------------------------------------

    async def replica_info(self, cluster: str, group: str, member: int, addr: str) -> View:
        """The role member ``member`` takes at start.  A group without a state gets its
        first one when its configured master (member 0) asks."""
        async with self._lock((cluster, group)):
            stored = await self.store.load(cluster, group)
            if stored is None and member == 0:
                first = initial_state(cluster, group, 0, now_ms=self._wall_ms(), master_addr=addr)
                stored = await self.store.write(first, revision=0)
                if stored is not None:
                    log.info("group %s/%s: first state %s", cluster, group, first.to_json())
                else:
                    stored = await self.store.load(cluster, group)
            if stored is not None:
                self._remember(stored)
        return self.view(cluster, group, member)

    async def alter(
        self, cluster: str, group: str, *, master: int, epoch: int, new_set: Iterable[int]
    ) -> View:
        """A master changes its sync-state set (StaleEpoch: it is not the master)."""
        wanted = frozenset(new_set)
        async with self._lock((cluster, group)):
            for _ in range(5):
                stored = await self.store.load(cluster, group)
                if stored is None:
                    raise StaleEpoch(f"{cluster}/{group} has no controller state")
                self._remember(stored)
                new = alter_sync_set(stored.state, master=master, epoch=epoch, new_set=wanted)
                if new == stored.state:
                    return self.view(cluster, group, master)
                written = await self.store.write(new, revision=stored.revision)
                if written is not None:
                    self._remember(written)
                    log.info(
                        "group %s/%s epoch %d: sync-state set %s -> %s (asked by master %d)",
                        cluster,
                        group,
                        epoch,
                        sorted(stored.state.sync_set),
                        sorted(new.sync_set),
                        master,
                    )
                    return self.view(cluster, group, master)
            raise EtcdUnavailable(f"{cluster}/{group}: the state kept changing under the request")

    # ---- the loops ---------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._poll_loop(), name="controller-poll")
                tg.create_task(self._lead_loop(), name="controller-lead")
                tg.create_task(self._elect_loop(), name="controller-elect")
        finally:
            await self.leadership.resign()
            await self.etcd.aclose()

    def _etcd_down(self, what: str, exc: BaseException) -> None:
        self.metrics.etcd_up(False)
        count = self._etcd_log.hit(time.monotonic())
        if count:
            log.warning(
                "controller: %s failed (%d time(s) since the last line): %s", what, count, exc
            )

    async def _poll_loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except EtcdUnavailable as exc:
                self._etcd_down("reading the group states", exc)
            await asyncio.sleep(self.settings.poll_interval_ms / 1000)

    async def _lead_loop(self) -> None:
        """Campaign for or renew the leadership every third of the lease's TTL."""
        renew_s = max(0.2, self.settings.lease_ttl_s / 3)
        while True:
            started = time.monotonic()
            try:
                await self.leadership.step()
            except EtcdUnavailable as exc:
                self._etcd_down("controller leadership", exc)
            self.metrics.leading(self.leadership.leading)
            await asyncio.sleep(max(0.0, started + renew_s - time.monotonic()))

    async def _elect_loop(self) -> None:
        """While leading, check the groups every 100 ms (at most every poll).  Apart
        from the renewals: a renewal that waits on an etcd member cut off from the
        others holds no election back while the lease is still surely ours."""
        check_s = min(0.1, self.settings.poll_interval_ms / 1000)
        while True:
            if self.leadership.leading and self.settings.auto_switch_after_ms > 0:
                await self.check_groups()
            await asyncio.sleep(check_s)

    # ---- elections ------------------------------------------------------------------------------

    async def check_groups(self) -> None:
        """Elect a master for every group that has been without one for too long."""
        for cluster, group in self.members.controlled_groups():
            try:
                await self._check_group(cluster, group)
            except EtcdUnavailable as exc:
                self._etcd_down(f"electing a master of {cluster}/{group}", exc)

    def _block(self, key: tuple[str, str], why: str) -> None:
        if self._blocked.get(key) != why:
            self._blocked[key] = why
            log.warning("group %s/%s has no master and none is elected: %s", *key, why)

    async def _check_group(self, cluster: str, group: str) -> None:
        key = (cluster, group)
        stored = self._states.get(key)
        gone_ms = self.members.no_master_ms(cluster, group)
        if stored is None or gone_ms is None:
            self._blocked.pop(key, None)
            return
        state = stored.state
        if gone_ms < self.settings.auto_switch_after_ms:
            return
        since = self._wall_ms() - state.since_ms
        if state.epoch > 1 and since < self.settings.min_switch_interval_ms:
            self._block(
                key,
                f"epoch {state.epoch} began {since} ms ago, less than min_switch_interval_ms "
                f"{self.settings.min_switch_interval_ms}",
            )
            return
        if self.confirmed_age_ms() is None:
            self._block(key, "this nameserver's copy of the state is not fresh (etcd unreachable)")
            return
        members = [
            m
            for m in self.members.live_members(cluster, group)
            if m.heard_age_ms <= self.settings.member_alive_ms and m.member != state.master
        ]
        decision = elect(
            state,
            {m.member: m.max_offset for m in members},
            now_ms=self._wall_ms(),
            reason=f"master {state.master} gone for {gone_ms / 1000:.1f} s",
            allow_unclean=self.settings.allow_unclean_election,
            addrs={m.member: m.addr for m in members},
        )
        if not isinstance(decision, Election):
            self._block(key, decision.why)
            return
        async with self._lock(key):
            current = await self.store.load(cluster, group)
            if current is None or current.revision != stored.revision:
                if current is not None:
                    self._remember(current)
                return  # changed meanwhile: decide again on the next round
            written = await self.store.write(decision.state, revision=stored.revision)
        if written is None:
            return
        self._remember(written)
        self._blocked.pop(key, None)
        new = decision.state
        kind = "unclean" if decision.unclean else "auto"
        log.warning(
            "group %s/%s: master %d gone for %.1f s: elected %s; epoch %d -> %d, "
            "sync-state set %s -> %s%s",
            cluster,
            group,
            state.master,
            gone_ms / 1000,
            decision.why,
            state.epoch,
            new.epoch,
            sorted(state.sync_set),
            sorted(new.sync_set),
            " — UNCLEAN ELECTION: writes the old master acknowledged and this member lacks are lost"
            if decision.unclean
            else "",
        )
        self.metrics.switched(new, kind, gone_ms / 1000)
        # an unclean master waits out the old one's lease, wherever it still runs
        fence_ms = (
            max((m.heartbeat_timeout_ms for m in members), default=10_000) + 1000
            if decision.unclean
            else 0
        )
        self._tell(cluster, group, new, fence_ms)

    def _tell(self, cluster: str, group: str, state: GroupState, fence_wait_ms: int) -> None:
        """NOTIFY_BROKER_ROLE_CHANGED to every live member, the new master first."""
        members = sorted(
            self.members.live_members(cluster, group), key=lambda m: m.member != state.master
        )
        for m in members:
            coro = self._notify(m.addr, state, state.route_id(m.member), fence_wait_ms)
            if self._spawn is not None:
                self._spawn(coro, f"notify-role-{m.addr}")
            else:
                coro.close()

    async def _notify(
        self, addr: str, state: GroupState, route_id: int, fence_wait_ms: int
    ) -> None:
        for attempt in range(3):
            try:
                await self.calls.notify_role(addr, state, route_id, fence_wait_ms)
                return
            except HaError as exc:
                log.info("role notice to %s failed (attempt %d/3): %s", addr, attempt + 1, exc)
                await asyncio.sleep(0.2 * 2**attempt)

    # ---- planned switch ----------------------------------------------------------------------

    async def switch(
        self, cluster: str, group: str, target: int, *, timeout_ms: int = 3000
    ) -> SwitchOutcome:
        """``hactl group switch``: the master stops taking writes, the target catches
        up with it, the epoch moves on, the members are told."""
        key = (cluster, group)
        async with self._lock(key):
            stored = await self.store.load(cluster, group)
            if stored is None:
                raise BadRequest(f"{cluster}/{group} has no controller state")
            self._remember(stored)
            state = stored.state
            if target not in state.sync_set or target == state.master:
                planned_switch(state, target, now_ms=self._wall_ms())  # raises why
            live = {m.member: m for m in self.members.live_members(cluster, group)}
            master = live.get(state.master)
            if master is None or master.route_id != 0:
                raise BadRequest(
                    f"{cluster}/{group}: master {state.master} is not registered here; an "
                    "automatic switch handles a lost master"
                )
            if target not in live:
                raise BadRequest(f"{cluster}/{group}: member {target} is not registered")
            started = time.monotonic()
            caught_up, end, detail = await self.calls.prepare_switch(
                master.addr, target, state.epoch, timeout_ms
            )
            if not caught_up:
                raise BadRequest(
                    f"{cluster}/{group}: member {target} did not catch up with the master "
                    f"within {timeout_ms} ms ({detail}); the master takes writes again"
                )
            new = planned_switch(
                state, target, now_ms=self._wall_ms(), master_addr=live[target].addr
            )
            written = await self.store.write(new, revision=stored.revision)
            if written is None:
                raise BadRequest(f"{cluster}/{group}: the state changed during the switch")
            self._remember(written)
        paused_ms = int((time.monotonic() - started) * 1000)
        log.warning(
            "group %s/%s: planned switch from member %d to %d at offset %d: epoch %d -> %d",
            cluster,
            group,
            state.master,
            target,
            end,
            state.epoch,
            new.epoch,
        )
        self.metrics.switched(new, "planned", paused_ms / 1000)
        self._tell(cluster, group, new, 0)
        return SwitchOutcome(self.view(cluster, group, target), paused_ms, detail)
