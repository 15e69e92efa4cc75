"""What the controller reads of its nameserver and asks of brokers: two narrow ports
(the route table fits :class:`Members`; the nameserver's connection pool
:class:`BrokerCalls`), so the controller runs over plain objects in tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ha_controller.controller.state import GroupState

__all__ = ["BrokerCalls", "LiveMember", "Members", "View"]


@dataclass(frozen=True, slots=True)
class LiveMember:
    """A registered member of a group as this nameserver sees it."""

    member: int
    route_id: int
    addr: str
    max_offset: int
    epoch: int | None
    heard_age_ms: float
    heartbeat_timeout_ms: int


class Members(Protocol):
    """The route table, as the controller reads it."""

    def controlled_groups(self) -> list[tuple[str, str]]: ...

    def live_members(self, cluster: str, group: str) -> list[LiveMember]: ...

    def no_master_ms(self, cluster: str, group: str) -> float | None: ...


class BrokerCalls(Protocol):
    """Requests the controller makes to brokers."""

    async def notify_role(
        self, addr: str, state: GroupState, route_id: int, fence_wait_ms: int
    ) -> None: ...

    async def prepare_switch(
        self, addr: str, target: int, epoch: int, timeout_ms: int
    ) -> tuple[bool, int, str]: ...


@dataclass(frozen=True, slots=True)
class View:
    """What the controller tells one member of a group."""

    enabled: bool
    state: GroupState | None = None
    route_id: int = 0
    #: how long ago the state was read from etcd; None when that read is too old
    confirmed_age_ms: int | None = None
