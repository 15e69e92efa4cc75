"""The broker's acting-master state as a plain object (RIP-32; docs/failover.md).

A slave with ``enable_slave_acting_master`` that learns (min-id notification
or member-group sync) that it is the group's lowest live id acts for the lost
master: its special services run and it serves the master-only operations.
It stops the moment id 0 is back.  Every transition returns a one-line
``Decision`` that the service logs and acts on.

A returning master in pre-online is not registered, so every nameserver lists no master
for its group while it syncs: a slave it contacted (:meth:`returning_master`) keeps
replicating from it through such views for the hold's length, whether it acts or not,
instead of dropping the link the master's pre-online waits for.

A returning master contacts its acting slave (EXCHANGE_BROKER_HA_INFO) before it takes
the slave's tables.  From then on the slave is *held*: it stops handing special work
on, so that the tables the master takes count everything it delivered, until the
master registers (the lead moves to id 0) or the hold runs out (the master did not
finish its pre-online: it froze or died again), when it acts again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

MASTER_ID = 0


@dataclass(frozen=True, slots=True)
class Decision:
    """What a membership change means for this broker."""

    changed: bool
    start_special_services: bool = False
    stop_special_services: bool = False
    master_offline: bool = False
    master_online: bool = False
    reason: str = ""

    def __str__(self) -> str:
        return self.reason


class ActingState:
    def __init__(
        self,
        broker_id: int,
        enable_slave_acting_master: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.broker_id = broker_id
        self.enabled = enable_slave_acting_master
        self.min_broker_id = MASTER_ID
        self.min_broker_addr: str | None = None
        self.master_addr: str | None = None
        self.master_ha_addr: str | None = None
        self.special_services_running = broker_id == MASTER_ID
        self._clock = clock
        #: while a returning master syncs from this acting slave: when the hold ends
        self.held_until: float | None = None
        #: until when the returning master that last contacted this slave keeps its HA
        #: address through views that list no master (see :meth:`returning_master`)
        self.returning_until: float | None = None

    @property
    def is_master(self) -> bool:
        return self.broker_id == MASTER_ID

    @property
    def acting(self) -> bool:
        """True on the slave the nameserver chose to lead while id 0 is gone, unless a
        returning master holds it (see :meth:`hold`)."""
        return self.chosen and self.held_until is None

    @property
    def chosen(self) -> bool:
        """The nameserver names this slave as the group's lead (held or not)."""
        return not self.is_master and self.enabled and self.min_broker_id == self.broker_id

    @property
    def master_online(self) -> bool:
        return self.min_broker_id == MASTER_ID

    @property
    def serves_master_only_ops(self) -> bool:
        return self.is_master or self.acting

    @property
    def role(self) -> str:
        if self.is_master:
            return "master"
        # a held slave still shows as acting: the hold lasts the master's pre-online
        return "acting" if self.chosen else "slave"

    def returning_master(self, master_addr: str | None, ha_addr: str, for_s: float) -> None:
        """A master in pre-online told this slave where to replicate from: follow it,
        and keep following it for ``for_s`` seconds (renewed by each contact) when a
        view lists no master, which is what its pre-online looks like to a nameserver.
        A view that names a master ends this, as does the master's own registration."""
        self.master_addr = master_addr or self.master_addr
        self.master_ha_addr = ha_addr
        self.returning_until = self._clock() + for_s

    def _returning(self) -> bool:
        return self.returning_until is not None and self._clock() < self.returning_until

    def hold(self, for_s: float) -> Decision:
        """A returning master is about to take this slave's tables: stop handing special
        work on for ``for_s`` seconds (renewed by each contact).  Only a chosen slave
        holds; a plain slave has nothing to stop."""
        if not self.chosen:
            return Decision(False, reason="not the chosen slave: nothing to hold")
        was_running = self.special_services_running
        first = self.held_until is None
        # each contact renews the hold from now; a hand-over's lasts for good
        if self.held_until != float("inf"):
            self.held_until = self._clock() + for_s
        self.special_services_running = False
        return Decision(
            first,
            stop_special_services=was_running,
            reason=f"returning master syncing: holding special services for {for_s:.0f} s",
        )

    def hand_over(self) -> Decision:
        """This broker's service is about to be rebuilt in another role (controller mode:
        it was elected master, or replaced): hand no more special work on, for good.
        What its steps under way finish is in its tables, which the next role (or the
        elected master's pre-online) takes as they are."""
        was_running = self.special_services_running
        self.special_services_running = False
        if not self.chosen:
            return Decision(False, stop_special_services=was_running, reason="not acting")
        self.held_until = float("inf")
        return Decision(
            True,
            stop_special_services=was_running,
            reason="role change: acting ends, the special work under way finishes first",
        )

    def release_expired_hold(self) -> Decision:
        """The hold ran out and the master never registered: act again."""
        if self.held_until is None or self._clock() < self.held_until:
            return Decision(False, reason="no hold ran out")
        self.held_until = None
        should_run = self.chosen
        self.special_services_running = should_run
        return Decision(
            True,
            start_special_services=should_run,
            reason="the returning master did not register in time: acting again",
        )

    def on_min_broker_change(
        self,
        min_id: int,
        min_addr: str | None,
        offline_addr: str | None = None,
        master_ha_addr: str | None = None,
    ) -> Decision:
        """Apply a (possibly repeated) view of the group's lowest live id."""
        if self.is_master or not self.enabled:
            return Decision(False, reason=f"ignored min id {min_id}: master or acting disabled")
        if min_id == self.min_broker_id and min_addr == self.min_broker_addr:
            return Decision(False, reason=f"min id {min_id} unchanged")
        prev = self.min_broker_id
        was_running = self.special_services_running
        self.held_until = None  # the lead changed: a hold has served its purpose
        self.min_broker_id = min_id
        self.min_broker_addr = min_addr
        should_run = self.broker_id == min_id
        master_offline = offline_addr is not None and offline_addr == self.master_addr
        if master_offline or (prev == MASTER_ID and min_id != MASTER_ID):
            # a master gone offline, unless it is the one in pre-online that contacted
            # us: the view is older than its return (a slave that starts first assumes
            # id 0 until its first view, and a master restarted at once is expired
            # after it called), and dropping its link would stall that pre-online for
            # its whole HA-attach timeout
            master_offline = not self._returning()
            if master_offline:
                self.master_addr = None
                self.master_ha_addr = None
        master_online = min_id == MASTER_ID and min_addr is not None
        if master_online:
            self.returning_until = None
        if master_online:
            self.master_addr = min_addr
            if master_ha_addr:
                self.master_ha_addr = master_ha_addr
        self.special_services_running = should_run
        verb = (
            "start acting as master"
            if should_run and not was_running
            else "stop acting"
            if was_running and not should_run
            else "stay " + self.role
        )
        return Decision(
            True,
            start_special_services=should_run and not was_running,
            stop_special_services=was_running and not should_run,
            master_offline=master_offline,
            master_online=master_online,
            reason=f"min broker id {prev} -> {min_id} ({min_addr}): {verb}",
        )
