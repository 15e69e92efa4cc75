"""Faults ("nemesis", after Jepsen/OpenChaos) and the role observer of a drill.

:class:`Nemesis` injects one fault at a time on a target chosen at the moment of the
fault — the current master of a group (the broker the nameserver lists as id 0), a
slave, the nameserver or an explicit ``"group/id"`` — and heals it:

========== ======================================= ===================================
kind       inject                                  heal
========== ======================================= ===================================
kill       kill -9                                 restart on the same store
pause      SIGSTOP                                 SIGCONT
partition  host's link down, or one way (netns)    link up / drop queue removed
netem      tc netem delay/loss (netns; iptables    qdisc / rule removed, blackouts
           or periodic blackouts without netem)    stopped
disk       fill the broker's tmpfs store           filler deleted
power      kill -9 the processes of the scope (a     mount the stores again, restart
           broker, a group, the cluster), then       (nameservers, slaves, masters)
           their stores' FUSE daemons: unsynced
           writes are gone
corrupt    damage the broker's store (kill -9        restart on what is left (kill -9
           first when ``stopped``)                   first when it ran)
clock      step the process's wall clock             step it back
etcd       kill -9 every etcd member (controller   start them again on their data
           mode)
isolate    the broker and one etcd member cut off  rules removed
           from every other host, clients still
           reaching the broker (netns; ``variant``
           ``etcd-<i>``)
========== ======================================= ===================================

:data:`HEAL_ACTIONS` names each heal by what it does (``restart``, ``resume``, ``heal
partition``, ``clear loss``; ``free disk`` for a disk-full fault, ``power on``,
``restart``, ``reset clock``, ``start etcd``, ``heal isolation``); the terminal and the
report label heals with it.

Each fault is recorded in the history as ``fault`` info when it takes effect and
``fault`` ok when it is healed (history module schema); a fault injected for a generated
schedule also records its ``family`` (:mod:`ha_controller.drills.generator`).
:class:`RoleObserver` polls a nameserver's ``/api/v1/groups`` (the one that answered
last, then the others) and every broker's ``/api/v1/status`` and records a ``role`` info
event whenever a broker's observed role changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import aiohttp

from ha_controller.drills.cluster import NAMESERVER, DrillCluster, broker_target, parse_target
from ha_controller.drills.history import EpochChange, Fault, HistoryWriter, Role
from ha_controller.drills.netns import Direction

__all__ = [
    "HEAL_ACTIONS",
    "ActiveFault",
    "FaultKind",
    "Nemesis",
    "RoleObserver",
    "TargetRole",
    "heal_action",
]

log = logging.getLogger(__name__)

FaultKind = Literal[
    "kill", "pause", "partition", "netem", "disk", "power", "corrupt", "clock", "etcd", "isolate"
]
TargetRole = Literal["master", "slave", "nameserver"]

PROCESS = "nemesis"

#: fault kind -> what healing it does, as the terminal and the report label it
HEAL_ACTIONS: Final[Mapping[str, str]] = {
    "kill": "restart",
    "pause": "resume",
    "partition": "heal partition",
    "netem": "clear loss",
    "disk": "free disk",
    "power": "power on",
    "corrupt": "restart",
    "clock": "reset clock",
    "etcd": "start etcd",
    "isolate": "heal isolation",
}


def heal_action(kind: str) -> str:
    """The label of healing a ``kind`` fault (``"heal <kind>"`` for a kind not listed)."""
    return HEAL_ACTIONS.get(kind, f"heal {kind}")


@dataclass(slots=True)
class ActiveFault:
    kind: FaultKind
    target: str
    detail: str
    start_ms: int
    restart: bool = True
    healed: bool = False
    family: str | None = None
    #: corrupt: the broker was stopped before the damage (else it still runs)
    stopped: bool = False


class RoleObserver:
    """Polls roles every ``interval_s`` and records changes; also answers "who is master"."""

    def __init__(
        self,
        cluster: DrillCluster,
        history: HistoryWriter,
        *,
        interval_s: float = 0.25,
        on_change: Callable[[str, str], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.history = history
        self.interval_s = interval_s
        self.roles: dict[str, str] = {}
        self.groups: dict[str, dict[str, Any]] = {}
        self._on_change = on_change
        #: controller mode: the last epoch recorded per group
        self.epochs: dict[str, int] = {}
        self._session: aiohttp.ClientSession | None = None
        self._ns_first = 0  # the nameserver that answered last

    async def __aenter__(self) -> RoleObserver:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _get(self, addr: str, path: str) -> Any:
        assert self._session is not None
        try:
            async with self._session.get(f"http://{addr}{path}") as resp:
                if resp.status != 200:
                    return None
                return await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def _groups(self) -> Any:
        """``/api/v1/groups`` of the nameserver that answered last, else of another."""
        nameservers = self.cluster.nameserver_targets()
        for i in range(len(nameservers)):
            k = (self._ns_first + i) % len(nameservers)
            target = nameservers[k]
            if not self.cluster.alive(target):
                continue
            groups = await self._get(self.cluster.http(target), "/api/v1/groups")
            if isinstance(groups, list):
                self._ns_first = k
                return groups
        return None

    async def poll_once(self) -> None:
        groups = await self._groups()
        if isinstance(groups, list):
            self.groups = {str(g.get("brokerName")): g for g in groups if isinstance(g, dict)}
            self._record_epochs()
        targets = self.cluster.broker_targets()
        statuses = await asyncio.gather(
            *(self._status(t) for t in targets), return_exceptions=False
        )
        for target, role in zip(targets, statuses, strict=True):
            if not self.cluster.alive(target):
                self.roles.pop(target, None)  # a restart is observed as a new role
                continue
            if role is None or self.roles.get(target) == role:
                continue
            self.roles[target] = role
            group, bid = parse_target(target)
            self.history.record("observer", "info", Role(group=group, broker_id=bid, role=role))
            if self._on_change is not None:
                self._on_change(target, role)

    def _record_epochs(self) -> None:
        for name, g in self.groups.items():
            epoch, master = g.get("epoch"), g.get("masterId")
            if not isinstance(epoch, int) or not isinstance(master, int):
                continue  # not controller mode
            if epoch <= self.epochs.get(name, 0):
                continue
            self.epochs[name] = epoch
            since = g.get("epochSinceMs")
            reason = g.get("epochReason")
            self.history.record(
                "observer",
                "info",
                EpochChange(
                    name,
                    epoch,
                    master,
                    since if isinstance(since, int) else None,
                    reason if isinstance(reason, str) else None,
                ),
            )

    def master_member(self, group: str) -> int | None:
        """Controller mode: the member id of ``group``'s master as the nameserver shows it
        (None without controller mode or when it is not known)."""
        g = self.groups.get(group)
        master = None if g is None else g.get("masterId")
        return master if isinstance(master, int) else None

    async def controller_leader(self) -> str | None:
        """The nameserver that leads the controller now (its ``hac_controller_leader``
        gauge is 1), None when none says so."""
        assert self._session is not None
        for target in self.cluster.nameserver_targets():
            if not self.cluster.alive(target):
                continue
            try:
                url = f"http://{self.cluster.http(target)}/metrics"
                async with self._session.get(url) as resp:
                    text = await resp.text()
            except (aiohttp.ClientError, TimeoutError):
                continue
            for line in text.splitlines():
                name, _, value = line.partition(" ")
                if name == "hac_controller_leader" and value.strip() in ("1", "1.0"):
                    return target
        return None

    async def _status(self, target: str) -> str | None:
        if not self.cluster.alive(target):
            return None
        status = await self._get(self.cluster.http(target), "/api/v1/status")
        if not isinstance(status, dict):
            return None
        if status.get("isolated"):
            return "isolated"
        if status.get("acting"):
            return "acting"
        return "master" if status.get("role") == "master" else "slave"

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await self.poll_once()
            await asyncio.sleep(self.interval_s)

    def master_id(self, group: str) -> int | None:
        """The id the nameserver lists as 0 for ``group`` (None while no master is online)."""
        g = self.groups.get(group)
        if g is None or not g.get("masterOnline"):
            return None
        return 0

    async def replicas_attached(self, group: str) -> bool:
        """Whether ``group``'s id-0 broker serves as master with every slave that runs
        attached and confirming: what a SYNC send needs.  Traffic that starts before
        that has its first sends refused (``InSyncReplicasNotEnough``) and the
        producers avoid the group for a while."""
        targets = self.cluster.broker_targets(group)
        master = next((t for t in targets if parse_target(t)[1] == 0), None)
        if master is None or not self.cluster.alive(master):
            return False
        status = await self._get(self.cluster.http(master), "/api/v1/status")
        if not isinstance(status, dict) or status.get("isolated") or status.get("role") != "master":
            return False
        attached = {
            int(s["brokerId"])
            for s in status.get("slaves", [])
            if "brokerId" in s and s.get("confirming")
        }
        running = {parse_target(t)[1] for t in targets if t != master and self.cluster.alive(t)}
        return running <= attached

    def master_online(self, group: str) -> bool:
        g = self.groups.get(group)
        return bool(g and g.get("masterOnline"))

    def live_ids(self, group: str) -> list[int]:
        g = self.groups.get(group)
        if g is None:
            return []
        return sorted(int(m["brokerId"]) for m in g.get("members", []) if "brokerId" in m)


class Nemesis:
    """Injects and heals faults, recording both in the history."""

    def __init__(
        self,
        cluster: DrillCluster,
        history: HistoryWriter,
        observer: RoleObserver,
        *,
        say: Callable[[str], None] = lambda _text: None,
    ) -> None:
        self.cluster = cluster
        self.history = history
        self.observer = observer
        self.say = say
        self.active: list[ActiveFault] = []
        self.done: list[ActiveFault] = []

    def resolve(self, role: TargetRole | str, group: str = "broker-a") -> str:
        """The target for ``role`` now: ``master`` is the group's id 0 (as listed by the
        nameserver, else the configured master), ``slave`` its lowest live slave."""
        if role == "nameserver":
            return NAMESERVER
        if role.startswith(NAMESERVER + "-"):
            return role
        if role == "master":
            return broker_target(group, 0)
        if role == "slave":
            live = [i for i in self.observer.live_ids(group) if i != 0]
            ids = live or [
                parse_target(t)[1]
                for t in self.cluster.broker_targets(group)
                if not t.endswith("/0")
            ]
            if not ids:
                raise ValueError(f"group {group} has no slave")
            return broker_target(group, min(ids))
        parse_target(role)
        return role

    async def resolve_role(self, role: str, target: str) -> str:
        """The target a controller family aims at now (``role``: ``master``, ``slave``,
        ``leader``); ``target`` names the group (``"<group>/<id>"``) and is kept when the
        role holder is not known."""
        if role == "leader":
            return await self.observer.controller_leader() or target
        group = parse_target(target)[0]
        await self.observer.poll_once()
        master = self.observer.master_member(group)
        if role == "master":
            return target if master is None else broker_target(group, master)
        if role == "slave":
            members = sorted(parse_target(t)[1] for t in self.cluster.broker_targets(group))
            alive = [
                m
                for m in members
                if m != (0 if master is None else master)
                and self.cluster.alive(broker_target(group, m))
            ]
            return broker_target(group, alive[0]) if alive else target
        raise ValueError(f"unknown role {role!r}")

    async def inject(
        self,
        kind: FaultKind,
        target: str,
        *,
        delay_ms: int = 0,
        jitter_ms: int = 0,
        loss_pct: float = 0,
        restart: bool = True,
        direction: Direction = "both",
        family: str | None = None,
        variant: str = "",
        stopped: bool = False,
        clock_step_s: float = 0.0,
        seed: int = 0,
    ) -> ActiveFault:
        """Apply the fault now; ``restart=False`` makes a kill permanent (heal does nothing
        and no ``fault`` ok is recorded: the host is gone); ``direction`` makes a partition
        one-way; ``family`` is recorded with the fault (generated schedules);
        ``variant``/``stopped``/``seed`` say what a corruption damages, ``clock_step_s``
        how far a clock fault steps."""
        detail: str = kind
        if kind == "kill":
            await asyncio.to_thread(self.cluster.kill, target)
            detail = "kill -9" + ("" if restart else " (host lost, not restarted)")
        elif kind == "pause":
            await asyncio.to_thread(self.cluster.pause, target)
            detail = "SIGSTOP"
        elif kind == "partition":
            await asyncio.to_thread(self.cluster.partition, target, direction)
            detail = {
                "both": "link down",
                "in": "one way: the host hears nothing",
                "out": "one way: the host sends nothing",
            }[direction]
        elif kind == "netem":
            how = await asyncio.to_thread(
                self.cluster.netem,
                target,
                delay_ms=delay_ms,
                jitter_ms=jitter_ms,
                loss_pct=loss_pct,
            )
            detail = f"{how} delay {delay_ms}ms jitter {jitter_ms}ms loss {loss_pct}%"
        elif kind == "disk":
            size = await asyncio.to_thread(self.cluster.fill_disk, target)
            detail = f"store filled ({size // (1024 * 1024)} MiB filler)"
        elif kind == "power":
            hit = await asyncio.to_thread(self.cluster.power_off, target)
            mode, interval = self.cluster.spec.store_mode()
            detail = (
                f"power lost: {len(hit)} processes, unsynced writes dropped "
                f"(flush {mode}{f' every {interval} ms' if mode == 'async' else ''})"
            )
        elif kind == "corrupt":
            detail = await asyncio.to_thread(
                functools.partial(self.cluster.corrupt, target, variant, stopped=stopped, seed=seed)
            )
            detail = f"{variant}: {detail}"
        elif kind == "clock":
            await asyncio.to_thread(self.cluster.step_clock, target, clock_step_s)
            detail = f"wall clock stepped {clock_step_s:+g} s"
        elif kind == "etcd":
            await asyncio.to_thread(self.cluster.stop_etcd)
            detail = "kill -9 every etcd member"
        elif kind == "isolate":
            index = int(variant.removeprefix("etcd-") or 0)
            await asyncio.to_thread(self.cluster.isolate, target, index)
            detail = f"cut off with {variant} from every other host; clients still reach it"
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        ev = self.history.record(
            PROCESS, "info", Fault(kind=kind, target=target, detail=detail, family=family)
        )
        fault = ActiveFault(
            kind, target, detail, ev.t_ms, restart=restart, family=family, stopped=stopped
        )
        self.active.append(fault)
        self.say(f"fault: {kind} {target} ({detail})")
        return fault

    async def heal(self, fault: ActiveFault) -> None:
        """Undo ``fault`` (idempotent); cancellation during a restart still finishes it."""
        if fault.healed:
            return
        fault.healed = True
        if fault.kind == "kill":
            if not fault.restart:
                self.say(f"heal: {fault.target} stays down (host lost)")
                return
            await _shielded(asyncio.to_thread(self.cluster.restart, fault.target))
        elif fault.kind == "pause":
            await asyncio.to_thread(self.cluster.resume, fault.target)
        elif fault.kind == "partition":
            await asyncio.to_thread(self.cluster.heal_partition, fault.target)
        elif fault.kind == "netem":
            await asyncio.to_thread(self.cluster.clear_netem, fault.target)
        elif fault.kind == "disk":
            await asyncio.to_thread(self.cluster.free_disk, fault.target)
        elif fault.kind == "power":
            await _shielded(asyncio.to_thread(self.cluster.power_on, fault.target))
        elif fault.kind == "corrupt":
            await _shielded(asyncio.to_thread(self.cluster.restart, fault.target))
        elif fault.kind == "clock":
            await asyncio.to_thread(self.cluster.reset_clock, fault.target)
        elif fault.kind == "etcd":
            await _shielded(asyncio.to_thread(self.cluster.start_etcd))
        elif fault.kind == "isolate":
            await asyncio.to_thread(self.cluster.heal_isolation, fault.target)
        self.history.record(
            PROCESS, "ok", Fault(kind=fault.kind, target=fault.target, family=fault.family)
        )
        with contextlib.suppress(ValueError):
            self.active.remove(fault)
        self.done.append(fault)
        self.say(f"healed: {heal_action(fault.kind)} {fault.target}")

    async def heal_all(self) -> None:
        for fault in list(reversed(self.active)):
            await self.heal(fault)


async def _shielded(aw: Any) -> Any:
    """Run ``aw`` to completion even if the caller is cancelled, then re-raise."""
    task = asyncio.ensure_future(aw)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=60)
        raise
