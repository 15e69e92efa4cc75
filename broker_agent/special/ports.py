"""The narrow ports the special services (escape, schedule, transaction, POP) see.

A special service takes ``(core, write_path, escape)`` typed by these protocols,
never the broker service: the real ones are :class:`broker_agent.core.BrokerCore`,
:class:`broker_agent.write_path.WritePath` and
:class:`broker_agent.special.escape.EscapeBridge`; unit tests pass small fakes.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from broker_agent.membership.acting import ActingState
from broker_agent.metadata.offsets import ConsumerOffsetManager
from broker_agent.metrics import BrokerMetrics
from broker_agent.pull_hold import PullHoldService
from broker_agent.store.message_store import MessageStore, PutResult
from broker_agent.topics import TopicConfigManager
from broker_agent.write_path import Stored
from ha_controller.config import BrokerConfig
from ha_controller.routing import TopicConfig
from ha_controller.rpc import ConnectionPool, Dispatcher


class CorePort(Protocol):
    """What a special service reads of its broker (see BrokerCore)."""

    cfg: BrokerConfig
    name: str
    addr: str
    store_dir: Path
    store: MessageStore
    topics: TopicConfigManager
    offsets: ConsumerOffsetManager
    acting: ActingState
    isolated: bool
    metrics: BrokerMetrics
    holds: PullHoldService
    pool: ConnectionPool
    dispatcher: Dispatcher

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
    ) -> Stored: ...

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> int | None: ...

    def replicate_offset(
        self, group: str, topic: str, queue_id: int, offset: int
    ) -> int | None: ...

    def replicate_record(self, properties: Mapping[str, str]) -> int | None: ...


class LocalBroker(Protocol):
    """A broker of the same process (broker container), for local escape."""

    @property
    def core(self) -> CorePort: ...

    @property
    def write_path(self) -> WritePort: ...


class Neighbours(Protocol):
    """The brokers hosted in this process (broker_agent.container)."""

    def local_brokers(self) -> Sequence[LocalBroker]: ...
