"""The broker process: one broker (``broker_agent.runner``) and its ready file."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from broker_agent.listeners import ready_info
from broker_agent.membership.preonline import ACCEPT_LOSS as ACCEPT_LOSS  # hactl's
from broker_agent.runner import BrokerRunner
from broker_agent.service import BrokerService
from ha_controller.config import BrokerConfig
from ha_controller.readyfile import write_ready_file

log = logging.getLogger(__name__)


async def serve(cfg: BrokerConfig, stop: asyncio.Event, ready_file: str | Path | None) -> None:
    """Run one broker (``broker_agent.runner``: a role change rebuilds its service)."""

    def ready(service: BrokerService) -> None:
        if ready_file:
            write_ready_file(ready_file, **ready_info(service))

    try:
        await BrokerRunner(cfg).run(stop, ready)
    finally:
        log.info("broker %s/%d stopped", cfg.broker_name, cfg.broker_id)
