"""What the store's free space means for the broker's membership.

The store knows its space level (``store.diskspace``: OK, LOW, FULL) and whether it is
read-only.  This watch turns that into what the cluster sees:

- a broker whose store does not *advertise writes* (LOW, FULL or read-only) registers
  its topics without the WRITE bit (``Registrar``), so the nameserver leaves its group
  out of producers' publish queues at once, while consumers keep reading from it; when
  space returns the WRITE bit comes back the same way.  LOW comes before FULL, so
  producers normally leave before any send is refused;
- the registration and every heartbeat carry whether the store takes appends and how
  far its commit log reaches, which is how the nameserver picks a masterless group's
  acting slave;
- a slave whose store refuses appends stops replicating (``replication.ha``) and
  says so: status, ``/readyz`` (503) and ``hac_store_writable``; it resumes by itself
  once a sample shows room again.

The store is sampled every second here (``STORE_CHECK_INTERVAL_S``; appends sample it
too), and :meth:`WritabilityWatch.changed` is called after every append (cheap: one
tuple comparison), so a change is acted on at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from broker_agent.core import BrokerCore

log = logging.getLogger(__name__)

#: How often the store's free space is sampled by the broker (config key proposed:
#: ``disk_check_interval_ms``).
STORE_CHECK_INTERVAL_S = 1.0


class WritabilityWatch:
    """Acts on changes of the store's state (see the module docstring)."""

    def __init__(self, core: BrokerCore, register: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.core = core
        self._register = register
        self._advertised = core.advertises_writes

    def changed(self) -> None:
        """The store's state may have moved: withdraw or restore the WRITE bit and tell
        the nameservers at once (the registration carries the new state)."""
        core = self.core
        state = core.store_state()
        if state == core.store_state_seen:
            return
        core.store_state_seen = state
        writable, level = state
        advertise = core.advertises_writes
        decision = "no route change" if core.acting.is_master else "a slave: no routes to change"
        if advertise != self._advertised and core.acting.is_master:
            self._advertised = advertise
            # a new topic-config version makes the nameserver rewrite the queue data
            core.topics.data_version.next_version()
            decision = (
                "restoring WRITE on its routes"
                if advertise
                else f"withdrawing WRITE from its {len(core.topics.topics)} topic(s)' routes"
            )
        log.warning(
            "store %s, space %s (%d bytes free): %s; re-registering",
            "takes appends" if writable else f"refuses appends ({core.store.unwritable_reason()})",
            level.name,
            core.store.free_disk_bytes,
            decision,
        )
        core.spawn(self._register(), "register-store-state")
        core.refresh_gauges()

    async def loop(self) -> None:
        core = self.core
        while True:
            await asyncio.sleep(STORE_CHECK_INTERVAL_S)
            await asyncio.to_thread(core.store.check_space)
            self.changed()
