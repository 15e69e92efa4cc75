"""Connection bounds of a listener as plain objects (no sockets): the assembly budget,
the counters a service exports, and a log throttle.

:class:`AssemblyBudget` is the state machine behind ``assembly_budget_bytes`` (see
:class:`~ha_controller.rpc.limits.RpcLimits`); ``RpcServer`` owns one per listener and
its connections draw on it.  :class:`RpcStats` holds the counters that the services
export as ``hac_rpc_*`` (:mod:`ha_controller.rpc.metrics`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["AssemblyBudget", "RpcStats", "Throttle"]

K = TypeVar("K", bound=Hashable)

#: reasons of ``hac_rpc_connections_refused_total``
REFUSED_REASONS = ("max_connections", "tls_required", "tls_handshake")
#: reasons of ``hac_rpc_reads_paused_total``
PAUSE_REASONS = ("write_backlog", "assembly_budget")


@dataclass
class RpcStats:
    """Counters of one listener (monotonic; gauges are read from the server itself)."""

    accepted: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    accept_errors: int = 0
    frames_timed_out: int = 0
    idle_timeouts: int = 0
    reads_paused: Counter[str] = field(default_factory=Counter)


class Throttle:
    """ "Log once per interval": ``hit(now)`` returns how many hits the line that may be
    logged now stands for (the suppressed ones included), or 0 while it must stay quiet."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._next = float("-inf")
        self._pending = 0

    def hit(self, now: float) -> int:
        self._pending += 1
        if now < self._next:
            return 0
        count, self._pending = self._pending, 0
        self._next = now + self.interval_s
        return count


class AssemblyBudget(Generic[K]):
    """A listener's bytes for frames larger than a connection's own allowance.

    ``request(who, want)`` grants up to ``want`` bytes at once, or queues ``who`` (first
    come, first served) and returns 0; queued requests are granted later through
    ``wake(who, granted)`` as bytes come back with ``release``/``forget``.  The caller
    reads no more bytes than it was granted.

    A frame's size is not known until it is complete, so the budget can be spent on
    partial frames that all wait for more.  When every holder is waiting (none can
    finish and give bytes back), the oldest waiter may overdraw: its requests are
    granted regardless of the limit until it gives everything back.  One overdraft at
    a time, and a frame is bounded by ``max_frame_bytes``, so ``used`` never exceeds
    ``limit + max_frame_bytes`` (plus one request).
    """

    def __init__(self, limit: int, wake: Callable[[K, int], None]) -> None:
        self.limit = limit
        self.used = 0
        self._wake = wake
        self._held: dict[K, int] = {}
        self._waiting: dict[K, int] = {}  # insertion order = arrival order
        self._overdraft: K | None = None
        self._active = 0  # holders that are not waiting

    @property
    def available(self) -> int:
        return max(0, self.limit - self.used)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def overdrawn_by(self) -> K | None:
        return self._overdraft

    def held(self, who: K) -> int:
        return self._held.get(who, 0)

    def request(self, who: K, want: int) -> int:
        """Grant up to ``want`` bytes now, or queue the request and return 0."""
        if want <= 0:
            raise ValueError("want must be positive")
        if who in self._waiting:
            return 0
        if who == self._overdraft or (self.available and not self._waiting):
            granted = want if who == self._overdraft else min(want, self.available)
            self._grant(who, granted)
            return granted
        self._waiting[who] = want
        if who in self._held:
            self._active -= 1
        return self._settle(caller=who)

    def release(self, who: K, nbytes: int | None = None) -> None:
        """Give back ``nbytes`` (default: all) that ``who`` holds."""
        held = self._held.get(who, 0)
        nbytes = held if nbytes is None else min(nbytes, held)
        if nbytes <= 0:
            return
        self.used -= nbytes
        if held == nbytes:
            del self._held[who]
            if who not in self._waiting:
                self._active -= 1
            if who == self._overdraft:
                self._overdraft = None
        else:
            self._held[who] = held - nbytes
        self._settle()

    def forget(self, who: K) -> None:
        """``who`` is gone: drop its request and give back what it holds."""
        if self._waiting.pop(who, None) is not None and who in self._held:
            self._active += 1  # counted as active again, so that release() can uncount it
        if who in self._held:
            self.release(who)
        else:
            self._settle()  # a stall may now be one (the gone waiter held nothing)

    # ---- internals -----------------------------------------------------------------

    def _grant(self, who: K, nbytes: int) -> None:
        if who not in self._held:
            self._held[who] = 0
            self._active += 1
        self._held[who] += nbytes
        self.used += nbytes

    def _settle(self, caller: K | None = None) -> int:
        """Serve waiters in order while bytes are left; break a stall with an overdraft.

        Grants go out through ``wake``, except one to ``caller``, which is returned.
        """
        mine = 0
        while self._waiting:
            if self.available:
                granted = min(next(iter(self._waiting.values())), self.available)
            elif self._active == 0 and self._overdraft is None:
                granted = next(iter(self._waiting.values()))
                self._overdraft = next(iter(self._waiting))
            else:
                break
            who = next(iter(self._waiting))
            del self._waiting[who]
            if who in self._held:
                self._active += 1
            self._grant(who, granted)
            if who == caller:
                mine = granted
            else:
                self._wake(who, granted)
        return mine
