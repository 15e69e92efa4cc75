"""A broker container: several brokers in one process (RocketMQ RIP-31 BrokerContainer).

``hactl broker --config container.toml`` with several ``[[brokers]]`` tables
runs them all here, each with its own store, listeners and background loops.
What the container adds is locality: a slave acting for its lost master
escapes special messages to a master hosted in the same process (local
escape, as in RocketMQ's broker container) and reads messages of any group hosted here
from its store directly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from broker_agent.app import Listeners, open_listeners, ready_info
from broker_agent.service import BrokerService
from ha_controller.config import BrokerConfig
from ha_controller.readyfile import write_ready_file

log = logging.getLogger(__name__)


class BrokerContainer:
    """Owns several BrokerServices; their escape bridges see each other."""

    def __init__(self, configs: Sequence[BrokerConfig]) -> None:
        if not configs:
            raise ValueError("a broker container needs at least one broker")
        self.services: list[BrokerService] = []
        for cfg in configs:
            service = BrokerService(cfg)
            service.set_neighbours(self)
            self.services.append(service)

    def local_brokers(self) -> list[BrokerService]:
        """The brokers hosted here (the escape bridges' Neighbours port)."""
        return self.services

    def peek_master(self) -> BrokerService | None:
        """The first online master hosted here (RocketMQ peekMasterBroker)."""
        for service in self.services:
            if service.core.acting.is_master and not service.core.isolated:
                return service
        return None

    def ready_info(self) -> list[dict[str, object]]:
        return [
            {"name": s.cfg.broker_name, "id": s.cfg.broker_id, **ready_info(s)}
            for s in self.services
        ]

    async def run(self, stop: asyncio.Event, ready_file: str | Path | None = None) -> None:
        """Bind every broker, write the ready file, run until ``stop``; a broker that
        fails stops the others (they share one TaskGroup)."""
        listeners: list[Listeners] = []
        try:
            for service in self.services:
                # one by one, so that what was bound is closed if a later one fails
                listeners.append(await open_listeners(service))  # noqa: PERF401
            if ready_file:
                write_ready_file(ready_file, brokers=self.ready_info())
            log.info("broker container running %d brokers", len(self.services))
            async with asyncio.TaskGroup() as tg:
                for service in self.services:
                    name = f"broker-{service.cfg.broker_name}-{service.cfg.broker_id}"
                    tg.create_task(service.run(stop), name=name)
        finally:
            for item in reversed(listeners):
                await item.aclose()
            log.info("broker container stopped")


async def serve(
    configs: Sequence[BrokerConfig], stop: asyncio.Event, ready_file: str | Path | None
) -> None:
    await BrokerContainer(configs).run(stop, ready_file)
