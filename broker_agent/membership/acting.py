"""The broker's acting-master state as a plain object (reference/rip32.md §2.4-2.6).

A slave with ``enable_slave_acting_master`` that learns (min-id notification
or member-group sync) that it is the group's lowest live id acts for the lost
master: its special services run and it serves the master-only operations.
It stops the moment id 0 is back.  Every transition returns a one-line
``Decision`` that the service logs and acts on.
"""

from __future__ import annotations

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
    def __init__(self, broker_id: int, enable_slave_acting_master: bool) -> None:
        self.broker_id = broker_id
        self.enabled = enable_slave_acting_master
        self.min_broker_id = MASTER_ID
        self.min_broker_addr: str | None = None
        self.master_addr: str | None = None
        self.master_ha_addr: str | None = None
        self.special_services_running = broker_id == MASTER_ID

    @property
    def is_master(self) -> bool:
        return self.broker_id == MASTER_ID

    @property
    def acting(self) -> bool:
        """True on the lowest live slave while id 0 is gone."""
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
        return "acting" if self.acting else "slave"

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
        self.min_broker_id = min_id
        self.min_broker_addr = min_addr
        should_run = self.broker_id == min_id
        master_offline = offline_addr is not None and offline_addr == self.master_addr
        if master_offline or (prev == MASTER_ID and min_id != MASTER_ID):
            master_offline = True
            self.master_addr = None
            self.master_ha_addr = None
        master_online = min_id == MASTER_ID and min_addr is not None
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
