"""A broker group's replication state as the controller keeps it in etcd, and every
decision taken on it, as plain functions (no I/O; docs/failover.md, "Automatic master
switch").

One JSON value per group (:class:`GroupState`): the **epoch** (moves on at every
change of master), the **master** (a *member id*: the ``broker_id`` a broker was
configured with, which never changes), and the **sync-state set**: the members that
hold everything the master acknowledged to a client.  A controller-mode master
acknowledges a write only once every member of the set (and every member it asked to
add) holds it, so any member of the set may take over without losing an acknowledged
write; the set shrinks only through the controller (:func:`alter_sync_set`), and only
once that is written does the master stop waiting for the member it drops.

Routes keep RocketMQ's ids: the master shows as ``brokerId 0``.  When member ``m``
becomes master, it and member 0 swap ids (:meth:`GroupState.route_id`), so the ids of
a group stay the ones it was deployed with, and a returning member 0 rejoins as a
slave under ``m``'s old id.

Every change is a compare-and-swap on the value's etcd revision, so two controllers
(two nameservers that both believe they lead) can never both decide: one write wins,
the other re-reads and finds its decision stale.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ha_controller.protocol.errors import BadRequest, StaleEpoch

__all__ = [
    "MASTER_ROUTE_ID",
    "Election",
    "GroupState",
    "NoElection",
    "alter_sync_set",
    "elect",
    "group_key",
    "initial_state",
    "planned_switch",
]

MASTER_ROUTE_ID = 0


def group_key(prefix: str, cluster: str, group: str) -> str:
    """The etcd key of a group's state."""
    return f"{prefix.rstrip('/')}/groups/{cluster}/{group}"


@dataclass(frozen=True, slots=True)
class GroupState:
    """One group's replication state (the etcd value)."""

    cluster: str
    group: str
    epoch: int
    #: member id of the master of this epoch
    master: int
    #: members holding everything the master acknowledged (the master included)
    sync_set: frozenset[int]
    #: wall-clock ms the current epoch began (a flapping master waits out
    #: ``min_switch_interval_ms`` from here)
    since_ms: int = 0
    #: why the current epoch began ("initial", "master 0 gone 0.5 s", "planned", ...)
    reason: str = ""
    #: the election that began it took a member outside the sync set
    unclean: bool = False
    #: the master's address when the epoch began (for logs and ``hactl groups``)
    master_addr: str = ""

    def route_id(self, member: int) -> int:
        """The ``brokerId`` member ``member`` registers and shows in routes: 0 for the
        master, the master's own id for member 0 (they swap), its own for the rest."""
        if member == self.master:
            return MASTER_ROUTE_ID
        if member == MASTER_ROUTE_ID:
            return self.master
        return member

    def member_of(self, route_id: int) -> int:
        """The member that shows as ``route_id`` (the swap is its own inverse)."""
        if route_id == MASTER_ROUTE_ID:
            return self.master
        if route_id == self.master:
            return MASTER_ROUTE_ID
        return route_id

    def to_json(self) -> str:
        return json.dumps(
            {
                "cluster": self.cluster,
                "group": self.group,
                "epoch": self.epoch,
                "master": self.master,
                "syncStateSet": sorted(self.sync_set),
                "sinceMs": self.since_ms,
                "reason": self.reason,
                "unclean": self.unclean,
                "masterAddr": self.master_addr,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> GroupState:
        """Raises ValueError for a value that is not a group state."""
        try:
            data = json.loads(text)
            state = cls(
                cluster=str(data["cluster"]),
                group=str(data["group"]),
                epoch=int(data["epoch"]),
                master=int(data["master"]),
                sync_set=frozenset(int(m) for m in data["syncStateSet"]),
                since_ms=int(data.get("sinceMs", 0)),
                reason=str(data.get("reason", "")),
                unclean=bool(data.get("unclean", False)),
                master_addr=str(data.get("masterAddr", "")),
            )
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a group state: {exc}") from exc
        if state.epoch < 1 or state.master not in state.sync_set:
            raise ValueError(f"not a group state: epoch {state.epoch}, master outside its set")
        return state

    def view(self) -> dict[str, Any]:
        """What ``GET /api/v1/groups`` and ``hactl groups`` show."""
        return {
            "epoch": self.epoch,
            "masterId": self.master,
            "syncStateSet": sorted(self.sync_set),
            "epochSinceMs": self.since_ms,
            "epochReason": self.reason,
            "uncleanElection": self.unclean,
        }


def initial_state(
    cluster: str, group: str, master: int, *, now_ms: int, master_addr: str = ""
) -> GroupState:
    """The first state of a group: epoch 1, the configured master alone in its set
    (its slaves join as they catch up with it)."""
    return GroupState(
        cluster,
        group,
        1,
        master,
        frozenset({master}),
        since_ms=now_ms,
        reason="initial",
        master_addr=master_addr,
    )


@dataclass(frozen=True, slots=True)
class Election:
    """A new master: the state to write, and whether it came from outside the set."""

    state: GroupState
    unclean: bool
    #: why this member (for the log line)
    why: str


@dataclass(frozen=True, slots=True)
class NoElection:
    """Why no member may take over."""

    why: str


def elect(
    state: GroupState,
    live: Mapping[int, int],
    *,
    now_ms: int,
    reason: str,
    allow_unclean: bool = False,
    addrs: Mapping[int, str] | None = None,
) -> Election | NoElection:
    """Choose the next master of a group whose master is gone.

    ``live``: member id -> the commit-log end it last reported, for the members the
    controller sees alive (the gone master excluded by the caller or here).  Only a
    member of the sync-state set may be chosen (it holds every acknowledged write): the
    most advanced one, the lowest id among equals.  The new set is the chosen member
    and every other live member of the old set: they hold every write of the old
    epoch, and the new master acknowledges a write only once they hold it too (a
    member ahead of the new master first cuts its log back to where the new epoch
    begins, before it acknowledges anything: the HA epoch check).

    With ``allow_unclean`` and no member of the set alive, the most advanced live
    member is chosen and the set is that member alone: writes the old master
    acknowledged and it lacks are lost."""
    candidates = {m: off for m, off in live.items() if m != state.master}
    clean = {m: off for m, off in candidates.items() if m in state.sync_set}
    pool, unclean = clean, False
    if not clean:
        if not candidates:
            return NoElection("no live member to take over")
        if not allow_unclean:
            outside = ", ".join(str(m) for m in sorted(candidates))
            return NoElection(
                f"no live member of the sync-state set {sorted(state.sync_set)} "
                f"(live outside it: {outside}); allow_unclean_election is off"
            )
        pool, unclean = candidates, True
    chosen = min(pool, key=lambda m: (-pool[m], m))
    keep = {m for m in clean if m != chosen} if not unclean else set()
    new = GroupState(
        state.cluster,
        state.group,
        state.epoch + 1,
        chosen,
        frozenset({chosen, *keep}),
        since_ms=now_ms,
        reason=reason,
        unclean=unclean,
        master_addr=(addrs or {}).get(chosen, ""),
    )
    why = (
        f"member {chosen} at offset {pool[chosen]}"
        f"{' (outside the sync-state set: UNCLEAN)' if unclean else ''}"
        f" of {', '.join(f'{m}@{pool[m]}' for m in sorted(pool))}"
    )
    return Election(new, unclean, why)


def planned_switch(
    state: GroupState, target: int, *, now_ms: int, master_addr: str = ""
) -> GroupState:
    """``hactl group switch``: ``target`` (a member of the set, caught up with the
    master, which stopped taking writes) becomes master.  The old master leaves the set
    (it restarts as a slave and rejoins once it follows the new master); the others
    stay."""
    if target == state.master:
        raise BadRequest(f"member {target} is already the master of {state.group}")
    if target not in state.sync_set:
        raise BadRequest(
            f"member {target} is not in the sync-state set {sorted(state.sync_set)} of "
            f"{state.group}: it may lack acknowledged writes"
        )
    return GroupState(
        state.cluster,
        state.group,
        state.epoch + 1,
        target,
        frozenset(m for m in state.sync_set if m != state.master),
        since_ms=now_ms,
        reason=f"planned switch from member {state.master}",
        master_addr=master_addr,
    )


def alter_sync_set(
    state: GroupState, *, master: int, epoch: int, new_set: Iterable[int]
) -> GroupState:
    """The master's request to change its sync-state set; StaleEpoch when it is no
    longer the master of the current epoch (it must step down)."""
    if epoch != state.epoch or master != state.master:
        raise StaleEpoch(
            f"{state.group}: member {master} asks as master of epoch {epoch}; the group is "
            f"at epoch {state.epoch} with master {state.master}"
        )
    members = frozenset(new_set)
    if master not in members:
        raise BadRequest(f"{state.group}: a sync-state set must hold its master ({master})")
    return replace(state, sync_set=members)
