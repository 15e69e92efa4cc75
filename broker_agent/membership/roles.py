"""Which role a broker runs in, as a plain object, and how it learns it.

Without a controller (no nameserver runs one) a broker is what it was configured as:
``broker_id`` 0 is the master, the others are slaves, for the life of the process —
RIP-32 as before.  In controller mode the group's state in etcd decides: the member
the state names master runs as ``brokerId 0``, the others under the ids the state
gives them (:meth:`~ha_controller.controller.state.GroupState.route_id`), and a broker
changes role only by rebuilding its service around its store (``broker_agent.runner``)
when the controller moves the epoch on.  Every such change is a :class:`RoleChange`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from broker_agent.membership.epochs import Epoch
from ha_controller.controller.ports import View
from ha_controller.controller.state import MASTER_ROUTE_ID, GroupState
from ha_controller.controller.wire import view_from_pb
from ha_controller.proto import nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import HaError, UnknownMethod
from ha_controller.rpc import ConnectionPool

__all__ = ["Role", "RoleChange", "ask_role", "role_from_view"]

log = logging.getLogger(__name__)

#: how long one round of asking the nameservers for a role may take
ASK_TIMEOUT_MS = 2000


@dataclass(frozen=True, slots=True)
class Role:
    """What one run of a broker's service is."""

    #: the ``brokerId`` it registers and serves as
    route_id: int
    #: controller mode: the group's state decides the role
    controlled: bool = False
    #: the group's state this role comes from (controller mode)
    state: GroupState | None = None
    #: became master by an election or a planned switch in this process: pre-online
    #: takes the slaves' newer tables but leaves the logs to the epoch check
    promoted: bool = False
    #: an unclean election: take writes only once this (monotonic) time has passed
    writes_from: float = 0.0
    #: when this broker learnt of ``state`` (monotonic s; 0: long ago)
    learnt_at: float = 0.0
    #: elected here: (id, address) of the slave that acted for the group when this
    #: member was told (its tables hold what it did while acting; it may be rebuilt
    #: under a new id, and so unlisted, while this member's pre-online reads the group)
    acting_slave: tuple[int, str] | None = None

    @property
    def is_master(self) -> bool:
        return self.route_id == MASTER_ROUTE_ID

    @property
    def epoch(self) -> int:
        return 0 if self.state is None else self.state.epoch

    def elected_elsewhere(self, member: int, now: float, grace_ms: int) -> str | None:
        """Why this slave (member ``member``) must not start acting now, or None.

        The controller elected another member, and this broker learnt of it ``grace_ms``
        ago or less (``now`` and :attr:`learnt_at` are monotonic seconds): that master is
        coming up (its service rebuilt around its store, then its pre-online), and the
        nameserver, which lists no id 0 meanwhile, names some slave to act.  A slave
        that acted then would hand on again what the elected member handed on while it
        acted (its tables start from the old master's progress; seen: the timer
        messages the elected member had escaped, escaped a second time).  After the
        grace the elected master may have died too: acting is for a master that is
        gone, as before."""
        state = self.state
        if not self.controlled or state is None or state.master == member:
            return None
        if state.epoch <= 1:
            return None  # the group's first state: its configured master, not elected
        age_ms = int((now - self.learnt_at) * 1000)
        if age_ms >= grace_ms:
            return None
        return (
            f"member {state.master} was elected master of epoch {state.epoch} (told "
            f"{age_ms} ms ago) and is coming up: not acting for it for {grace_ms - age_ms} "
            "ms more"
        )

    def describe(self) -> str:
        if not self.controlled:
            return f"{'master' if self.is_master else 'slave'} (id {self.route_id}, no controller)"
        if self.state is None:
            return f"slave (id {self.route_id}), the group has no controller state yet"
        what = "master" if self.is_master else f"slave (id {self.route_id})"
        return f"{what} of epoch {self.state.epoch} (master: member {self.state.master})"


@dataclass(frozen=True, slots=True)
class RoleChange:
    """Why a broker's service must be rebuilt, and what is known of the next role."""

    reason: str
    #: the controller's view that calls for it (None: ask the nameservers)
    view: View | None = None
    #: the log must first be cut back to this offset (the HA epoch check)
    cut_to: int | None = None
    #: the master's epochs the cut follows
    master_epochs: Sequence[Epoch] = field(default_factory=tuple)
    fence_wait_ms: int = 0


def role_from_view(view: View, member: int) -> Role:
    """The role ``view`` gives member ``member``."""
    if not view.enabled:
        return Role(member)
    if view.state is None:
        # the group has no state yet: its configured master creates it when it asks,
        # the others wait as slaves under their own ids
        return Role(member, True)
    return Role(view.state.route_id(member), True, view.state, learnt_at=time.monotonic())


async def ask_role(
    pool: ConnectionPool,
    namesrv_addrs: Sequence[str],
    *,
    cluster: str,
    group: str,
    member: int,
    addr: str,
    max_offset: int,
    epoch: int,
) -> View | None:
    """Ask every nameserver at once for the member's role; the first controller's
    answer wins (None: no nameserver answered).  A nameserver without a controller
    answers "not enabled"; an old one does not know the request (the same)."""
    req = nameserver_pb2.GetReplicaInfoRequest(
        cluster=cluster,
        broker_name=group,
        member_id=member,
        broker_addr=addr,
        max_offset=max_offset,
        epoch=epoch,
    )
    disabled: View | None = None
    pending = {
        asyncio.ensure_future(
            pool.call_pb(
                ns,
                RequestCode.CONTROLLER_GET_REPLICA_INFO,
                req,
                nameserver_pb2.ControllerView,
                timeout_ms=ASK_TIMEOUT_MS,
            )
        ): ns
        for ns in namesrv_addrs
    }
    problems: list[str] = []
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                ns = pending.pop(task)
                try:
                    pb = task.result()
                except UnknownMethod:
                    disabled = View(False)
                    continue
                except HaError as exc:
                    problems.append(f"{ns}: {exc}")
                    continue
                view = view_from_pb(cluster, group, pb)
                if view.enabled:
                    return view
                disabled = view
    finally:
        for task in pending:
            task.cancel()
    if disabled is None and problems:
        log.info("no nameserver told the role (%s)", "; ".join(problems))
    return disabled
