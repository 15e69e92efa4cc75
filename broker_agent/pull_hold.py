"""Long polling: hold a pull that found nothing until a message arrives.

After RocketMQ's ``PullRequestHoldService`` (clients suspend a pull for
15-20 s; the check below is only the backstop).  A pull that finds nothing awaits
:meth:`PullHoldService.hold`; the reput task calls :meth:`PullHoldService.notify`
for every dispatched message, which answers matching holds at once; a
periodic :meth:`PullHoldService.check_all` (5 s long polling, 1 s short
polling) is only the backstop.  Whatever the wake reason, the broker then runs
the pull again without suspending (an empty result answers PULL_NOT_FOUND).

This object does no I/O and starts no task: each hold is a future plus a
``call_later`` timer, both owned by the awaiting request and cleaned up when it
returns or is cancelled (client gone).  It is used from one event loop.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
from collections.abc import Callable, Set
from dataclasses import dataclass, field

from ha_controller.protocol.errors import Overloaded, ServiceStopping

__all__ = ["HoldResult", "PullHoldService", "WakeReason"]

logger = logging.getLogger(__name__)


class WakeReason(enum.StrEnum):
    ARRIVED = "arrived"
    """``notify`` reported a matching message at or beyond the pull offset."""
    CHECKED = "checked"
    """The periodic backstop found the queue already holds data beyond the offset."""
    TIMEOUT = "timeout"
    """The suspend time elapsed with nothing to return."""
    MASTER_ONLINE = "master_online"
    """The master came back; the consumer should pull from it (RocketMQ notifyMasterOnline)."""
    CLOSED = "closed"
    """The service is shutting down."""
    FENCED = "fenced"
    """This master fenced itself: the pull must be refused, not answered from a log
    that pre-online may cut back (the broker re-checks that it serves after a hold)."""


@dataclass(frozen=True, slots=True)
class HoldResult:
    reason: WakeReason
    max_offset: int | None
    """The queue's max offset that caused the wake (ARRIVED/CHECKED), else None."""
    held_ms: int

    @property
    def timed_out(self) -> bool:
        return self.reason is WakeReason.TIMEOUT

    @property
    def has_data(self) -> bool:
        return self.reason in (WakeReason.ARRIVED, WakeReason.CHECKED)


@dataclass(slots=True, eq=False)
class _Hold:
    serial: int
    key: tuple[str, int]
    offset: int
    tag_filter: Set[int] | None
    suspended_at_ms: int
    deadline_ms: int
    future: asyncio.Future[HoldResult] = field(repr=False)

    def matches(self, max_offset: int, tag_hash: int | None) -> bool:
        if max_offset <= self.offset:
            return False
        # No tag (backstop, or unknown) cannot rule a message out: let the re-run pull filter.
        return self.tag_filter is None or tag_hash is None or tag_hash in self.tag_filter


class PullHoldService:
    """Bounded table of held pulls, keyed by (topic, queue id).

    ``clock`` returns milliseconds; it stamps holds and decides expiry during
    ``notify``/``check_all`` (as RocketMQ does), while each hold also has its
    own loop timer so it returns on time without the backstop.
    """

    def __init__(self, max_held: int, clock: Callable[[], int]) -> None:
        if max_held < 1:
            raise ValueError(f"max_held must be >= 1, got {max_held}")
        self._max_held = max_held
        self._clock = clock
        self._table: dict[tuple[str, int], dict[int, _Hold]] = {}
        self._held = 0
        # the broker's own services waiting for the next message of a queue (arrival)
        self._arrivals: dict[tuple[str, int], list[asyncio.Future[None]]] = {}
        self._serials = itertools.count()
        self._closed = False
        self.rejected_count = 0
        """Holds refused with ``Overloaded`` (the overflow counter)."""

    @property
    def held_count(self) -> int:
        """Pulls held right now (the ``hac_pull_held_requests`` gauge)."""
        return self._held

    @property
    def max_held(self) -> int:
        return self._max_held

    @property
    def closed(self) -> bool:
        return self._closed

    async def hold(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        timeout_ms: int,
        tag_filter: Set[int] | None = None,
    ) -> HoldResult:
        """Wait until a message at queue offset >= ``offset`` that passes ``tag_filter`` arrives.

        Returns on arrival, on timeout, when the master comes back, or on
        :meth:`close`.  Raises ``Overloaded`` at once when ``max_held`` pulls are
        already held, and ``ServiceStopping`` after :meth:`close`.
        """
        if self._closed:
            raise ServiceStopping("pull hold service is closed")
        now = self._clock()
        if timeout_ms <= 0:
            return HoldResult(WakeReason.TIMEOUT, None, 0)
        if self._held >= self._max_held:
            self.rejected_count += 1
            logger.debug("pull hold refused for %s@%d: %d held", topic, queue_id, self._held)
            raise Overloaded(f"too many held pulls ({self._held} >= {self._max_held})")
        loop = asyncio.get_running_loop()
        h = _Hold(
            serial=next(self._serials),
            key=(topic, queue_id),
            offset=offset,
            tag_filter=tag_filter,
            suspended_at_ms=now,
            deadline_ms=now + timeout_ms,
            future=loop.create_future(),
        )
        self._table.setdefault(h.key, {})[h.serial] = h
        self._held += 1
        timer = loop.call_later(timeout_ms / 1000, self._wake, h, WakeReason.TIMEOUT, None)
        try:
            return await h.future
        finally:
            timer.cancel()
            self._remove(h)

    async def arrival(self, topic: str, queue_id: int, timeout_s: float | None) -> bool:
        """Wait for the next message dispatched to ``topic``/``queue_id`` (True) or
        ``timeout_s`` (False; None: no timeout, the caller bounds the wait): for the
        broker's own services (the schedule service's loops), which look at the queue
        first, in the same tick.  Not a held pull: not counted, not bounded, not
        answered by :meth:`close` (the caller is cancelled)."""
        key = (topic, queue_id)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._arrivals.setdefault(key, []).append(fut)
        try:
            async with asyncio.timeout(timeout_s):
                await fut
            return True
        except TimeoutError:
            return False
        finally:
            waiters = self._arrivals.get(key)
            if waiters is not None and fut in waiters:
                waiters.remove(fut)
                if not waiters:
                    del self._arrivals[key]

    def _remove(self, h: _Hold) -> None:
        holds = self._table.get(h.key)
        if holds is not None and holds.pop(h.serial, None) is not None:
            self._held -= 1
            if not holds:
                del self._table[h.key]

    def _wake(self, h: _Hold, reason: WakeReason, max_offset: int | None) -> None:
        self._remove(h)
        if not h.future.done():
            held_ms = self._clock() - h.suspended_at_ms
            h.future.set_result(HoldResult(reason, max_offset, held_ms))

    def _notify(
        self, topic: str, queue_id: int, max_offset: int, tag_hash: int | None, reason: WakeReason
    ) -> int:
        if self._arrivals:
            for fut in self._arrivals.pop((topic, queue_id), ()):
                if not fut.done():
                    fut.set_result(None)
        holds = self._table.get((topic, queue_id))
        if not holds:
            return 0
        now = self._clock()
        woken = 0
        for h in list(holds.values()):
            if h.matches(max_offset, tag_hash):
                self._wake(h, reason, max_offset)
                woken += 1
            elif now >= h.deadline_ms:
                self._wake(h, WakeReason.TIMEOUT, None)
                woken += 1
        return woken

    def notify(
        self, topic: str, queue_id: int, max_offset: int, tag_hash: int | None = None
    ) -> int:
        """A message was dispatched to ``topic``/``queue_id``; wake the holds it satisfies.

        ``max_offset`` is the queue's max offset after the message (its queue
        offset + 1, as RocketMQ's reput passes it): a hold at ``offset`` matches
        when ``max_offset > offset`` and ``tag_hash`` passes its filter
        (``tag_hash=None`` passes every filter).  Holds past their deadline by
        the clock are answered too.  Returns how many holds were woken.
        """
        return self._notify(topic, queue_id, max_offset, tag_hash, WakeReason.ARRIVED)

    def check_all(self, max_offset_of: Callable[[str, int], int]) -> int:
        """Backstop: wake holds whose queue already has data beyond their offset.

        ``max_offset_of(topic, queue_id)`` reads the store's max offset.  A
        failure for one queue is logged and the others are still checked.
        Returns how many holds were woken.
        """
        woken = 0
        for topic, queue_id in list(self._table):
            try:
                max_offset = max_offset_of(topic, queue_id)
            except Exception:
                logger.exception("hold check failed for %s@%d", topic, queue_id)
                continue
            woken += self._notify(topic, queue_id, max_offset, None, WakeReason.CHECKED)
        return woken

    def _wake_all(self, reason: WakeReason) -> int:
        holds = [h for per_key in self._table.values() for h in per_key.values()]
        for h in holds:
            self._wake(h, reason, None)
        return len(holds)

    def notify_master_online(self) -> int:
        """The master is back: answer every held pull so consumers move back to it."""
        woken = self._wake_all(WakeReason.MASTER_ONLINE)
        if woken:
            logger.info("master online: woke %d held pull(s)", woken)
        return woken

    def notify_fenced(self) -> int:
        """This master stopped serving: answer every held pull now, so that clients
        move on at once and nothing is read from the log while it is isolated."""
        woken = self._wake_all(WakeReason.FENCED)
        if woken:
            logger.info("fenced: woke %d held pull(s)", woken)
        return woken

    def close(self) -> int:
        """Answer every held pull with ``CLOSED`` and refuse new holds (idempotent)."""
        self._closed = True
        woken = self._wake_all(WakeReason.CLOSED)
        if woken:
            logger.info("pull hold service closed: woke %d held pull(s)", woken)
        return woken
