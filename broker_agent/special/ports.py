"""The narrow ports the special services (escape, schedule, transaction, POP) see.

A special service takes ``(core, write_path, escape)`` typed by these protocols,
never the broker service: the real ones are :class:`broker_agent.core.BrokerCore`,
:class:`broker_agent.write_path.WritePath` and
:class:`broker_agent.special.escape.EscapeBridge`; unit tests pass small fakes.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from broker_agent.membership.acting import ActingState
from broker_agent.metadata.json_table import JsonTable
from broker_agent.metadata.offsets import ConsumerOffsetManager
from broker_agent.metadata.topics import TopicConfigManager
from broker_agent.metrics import BrokerMetrics
from broker_agent.pull_hold import PullHoldService
from broker_agent.special_steps import SpecialSteps
from broker_agent.store.message_store import GetResult, PutResult
from broker_agent.write_path import Record, Stored
from ha_controller.acl import Acl
from ha_controller.config import BrokerConfig
from ha_controller.protocol.record import StoredMessage
from ha_controller.routing import BrokerMemberGroup, TopicConfig
from ha_controller.rpc import ConnectionPool, Dispatcher


class StorePort(Protocol):
    """The reads a special service makes of its broker's store (MessageStore)."""

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = ...,
        max_bytes: int = ...,
        tag_filter: set[int] | None = ...,
        message_filter: Callable[[Mapping[str, str]], bool] | None = ...,
    ) -> GetResult: ...

    def get_message_at(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None: ...

    def min_offset(self, topic: str, queue_id: int) -> int: ...

    def max_offset(self, topic: str, queue_id: int) -> int: ...

    def topics_and_queues(self) -> dict[str, list[int]]: ...

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int: ...

    #: this open found the last stop unclean
    recovered_unclean: bool


class CorePort(Protocol):
    """What a special service reads of its broker (see BrokerCore)."""

    cfg: BrokerConfig
    name: str
    addr: str
    store_dir: Path

    @property
    def store(self) -> StorePort: ...

    topics: TopicConfigManager
    offsets: ConsumerOffsetManager
    acting: ActingState
    isolated: bool
    #: it takes a lost table only its replicas have from one (pre-online)
    has_replicas: bool
    metrics: BrokerMetrics
    holds: PullHoldService
    pool: ConnectionPool
    dispatcher: Dispatcher
    special_steps: SpecialSteps
    #: the client ACL (who of the producers may be asked about a transaction)
    acl: Acl
    #: the group's members as the nameserver last said (None before the first view)
    member_group: BrokerMemberGroup | None

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None: ...

    def add_special_service(self, hook: Callable[[bool], None]) -> None: ...

    def topics_changed(self) -> None: ...

    def check_master_only(self, what: str) -> None: ...


class WritePort(Protocol):
    """The broker's only writer (see WritePath)."""

    def topic_for_write(self, topic: str) -> TopicConfig: ...

    def append_local(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: Mapping[str, str],
        *,
        flags: int = 0,
        born_ts_ms: int | None = None,
    ) -> PutResult: ...

    async def put(
        self,
        topic: str,
        body: bytes,
        properties: Mapping[str, str],
        *,
        queue_id: int | None = None,
        flags: int = 0,
        born_ts_ms: int | None = None,
        born_host: str | None = None,
        progress: Mapping[str, str] | None = None,
        then: Record | None = None,
    ) -> Stored: ...

    async def confirm(self, end: int, needed: int | None = None) -> bool: ...

    async def confirm_answer(self, end: int, what: str) -> None: ...

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> int | None: ...

    async def durable(self, table: JsonTable) -> None: ...

    async def progress_durable(self, table: JsonTable) -> None: ...

    def replicate_offset(
        self, group: str, topic: str, queue_id: int, offset: int
    ) -> int | None: ...

    def replicate_record(self, properties: Mapping[str, str]) -> int | None: ...


class RoutesPort(Protocol):
    """Route look-ups of the escape bridge (EscapeRoutes)."""

    async def group_addrs(self, topic: str, group: str) -> dict[int, str]: ...


class EscapePort(Protocol):
    """How special messages leave a broker (EscapeBridge)."""

    @property
    def routes(self) -> RoutesPort: ...

    def local_master(self) -> tuple[CorePort, WritePort] | None: ...

    async def put_message(
        self,
        topic: str,
        body: bytes,
        properties: dict[str, str],
        *,
        kind: str,
        queue_id: int | None = None,
        flags: int = 0,
        born_ts_ms: int | None = None,
        progress: Mapping[str, str] | None = None,
        escape_id: str = "",
    ) -> EscapeResult: ...

    async def put_message_to_specific_queue(
        self,
        topic: str,
        body: bytes,
        properties: dict[str, str],
        *,
        kind: str,
        flags: int = 0,
        escape_id: str = "",
        then: Record | None = None,
        to_group: str = "",
        to_queue: int | None = None,
    ) -> EscapeResult: ...

    async def get_message(
        self, topic: str, broker_name: str, queue_id: int, offset: int
    ) -> StoredMessage | None: ...


@dataclass(frozen=True)
class EscapeResult:
    """Where an escaped message was stored."""

    target: str  # the group name it went to, or "local"
    msg_id: str
    queue_id: int
    queue_offset: int
    #: the group whose master stored it (also for "local": a master in this process)
    group: str = ""


class LocalBroker(Protocol):
    """A broker of the same process (broker container), for local escape."""

    @property
    def core(self) -> CorePort: ...

    @property
    def write_path(self) -> WritePort: ...


class Neighbours(Protocol):
    """The brokers hosted in this process (broker_agent.container)."""

    def local_brokers(self) -> Sequence[LocalBroker]: ...
