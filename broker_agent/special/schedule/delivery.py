"""What the delay-level loops and the timer loop share: a delivery session's clock,
the escape of one due message, skipping a recalled one, and logging late ones.

Due messages go through the escape bridge (a local put on a master; local-in-container
or remote escape on an acting slave), and progress moves only after a successful
escape; with ``flush_mode = "sync"`` the loop goes on only once the progress is on disk
(``WritePath.progress_durable``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Final

from broker_agent.special.clock import Clock
from broker_agent.special.escape_ids import escape_id
from broker_agent.special.ports import CorePort, EscapePort
from broker_agent.special.schedule.recall_table import RecallTable
from broker_agent.special.schedule.target import restored
from ha_controller.protocol.errors import EscapeFailed
from ha_controller.protocol.properties import PROPERTY_REAL_TOPIC, PROPERTY_UNIQ_KEY
from ha_controller.protocol.record import StoredMessage

__all__ = ["IDLE_WAIT_S", "OVERDUE_LOG_LINES", "OVERDUE_LOG_MS", "POLL_S", "Delivery"]

log = logging.getLogger(__name__)

#: the pause before a delivery that failed is tried again (RocketMQ DELAY_FOR_A_WHILE)
POLL_S: Final = 0.1
#: the longest the delay-level and timer loops sleep with nothing due: they wake when a
#: message arrives in their queue (PullHoldService.arrival) or falls due; this is the
#: backstop (a wall clock that jumps).  Polling every POLL_S, the 19 loops woke the
#: event loop 190 times a second on an idle broker: 5 % of a busy master's samples.
IDLE_WAIT_S: Final = 1.0
#: a delivery this late (ms) is logged: the catch-up after a failover or a return
OVERDUE_LOG_MS: Final = 1_000
#: at most this many such lines per session (a long outage can leave thousands due)
OVERDUE_LOG_LINES: Final = 20


class Delivery:
    """One broker's delivery of due delayed and timer messages."""

    def __init__(
        self, core: CorePort, escape: EscapePort, recalls: RecallTable, clock: Clock
    ) -> None:
        self.core = core
        self.escape = escape
        self.recalls = recalls
        self.clock = clock
        #: the session is stopping: its loops start no new delivery (their state, the
        #: timer index above all, is stale once the broker serves again)
        self.stopping = False
        self.recalled_skipped = 0
        self._overdue_logged = 0  # late deliveries logged this session

    def start_session(self) -> None:
        self._overdue_logged = 0
        self.stopping = False

    async def arrival(self, topic: str, queue_id: int, wait_s: float) -> None:
        """Until a message arrives in the queue, or ``wait_s`` of the clock are over."""
        with contextlib.suppress(TimeoutError):
            async with self.clock.timeout(wait_s):
                await self.core.holds.arrival(topic, queue_id, None)

    async def deliver(self, msg: StoredMessage, kind: str, progress: dict[str, str]) -> bool:
        """Escape one due message to where it belongs; False to try again later."""
        target = restored(msg)
        if target is None:
            log.warning(
                "%s message at %s/%d offset %d has no %s: skipped",
                kind,
                msg.topic,
                msg.queue_id,
                msg.queue_offset,
                PROPERTY_REAL_TOPIC,
            )
            return True
        topic, qid, props = target
        try:
            await self.escape.put_message(
                topic,
                msg.body,
                props,
                kind=kind,
                queue_id=qid,
                flags=msg.flags,
                born_ts_ms=msg.born_ts_ms,
                progress=progress,
                escape_id=escape_id(self.core.cfg.broker_name, kind, msg),
            )
        except EscapeFailed as exc:
            log.warning("delivering a %s message for %s failed, will retry: %s", kind, topic, exc)
            return False
        return True

    def recalled(self, msg: StoredMessage) -> bool:
        """Whether a due message was recalled (it is then skipped, not delivered)."""
        uniq = msg.properties.get(PROPERTY_UNIQ_KEY)
        if not uniq or uniq not in self.recalls:
            return False
        self.recalled_skipped += 1
        log.info(
            "recalled message %s for %s not delivered",
            uniq,
            msg.properties.get(PROPERTY_REAL_TOPIC, "?"),
        )
        return True

    def log_overdue(self, what: str, msg: StoredMessage, offset: int, late_ms: int) -> None:
        """The catch-up after a failover or a return, message by message (what to read
        when one comes twice or late), up to :data:`OVERDUE_LOG_LINES` per session."""
        self._overdue_logged += 1
        if self._overdue_logged > OVERDUE_LOG_LINES:
            return
        log.info(
            "%s: delivering %s (queue offset %d) %d ms after it was due%s",
            what,
            msg.properties.get(PROPERTY_UNIQ_KEY, "?"),
            offset,
            late_ms,
            "; further late deliveries of this session are not logged"
            if self._overdue_logged == OVERDUE_LOG_LINES
            else "",
        )
