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

from broker_agent.listeners import ready_info
from broker_agent.runner import BrokerRunner
from broker_agent.service import BrokerService
from ha_controller.config import BrokerConfig
from ha_controller.readyfile import write_ready_file

log = logging.getLogger(__name__)


class BrokerContainer:
    """Owns several brokers (each a BrokerRunner); their escape bridges see each other."""

    def __init__(self, configs: Sequence[BrokerConfig]) -> None:
        if not configs:
            raise ValueError("a broker container needs at least one broker")
        self.runners = [BrokerRunner(cfg) for cfg in configs]
        for runner in self.runners:
            runner.neighbours = self

    @property
    def services(self) -> list[BrokerService]:
        """The brokers' current services (a role change replaces one)."""
        return [r.service for r in self.runners if r.service is not None]

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
            {"name": r.cfg.broker_name, "id": r.member_id, **ready_info(r.service)}
            for r in self.runners
            if r.service is not None
        ]

    async def run(self, stop: asyncio.Event, ready_file: str | Path | None = None) -> None:
        """Run every broker until ``stop``; the ready file is written once all are
        bound (and again after a role change); a broker that fails stops the others
        (they share one TaskGroup)."""

        bound: set[int] = set()  # runners whose current service has its listeners

        def ready(service: BrokerService) -> None:
            bound.update(i for i, r in enumerate(self.runners) if r.service is service)
            if ready_file and len(bound) == len(self.runners):
                write_ready_file(ready_file, brokers=self.ready_info())

        try:
            log.info("broker container running %d brokers", len(self.runners))
            async with asyncio.TaskGroup() as tg:
                for runner in self.runners:
                    name = f"broker-{runner.cfg.broker_name}-{runner.member_id}"
                    tg.create_task(runner.run(stop, ready), name=name)
        finally:
            log.info("broker container stopped")


async def serve(
    configs: Sequence[BrokerConfig], stop: asyncio.Event, ready_file: str | Path | None
) -> None:
    await BrokerContainer(configs).run(stop, ready_file)
