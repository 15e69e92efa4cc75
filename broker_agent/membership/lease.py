"""A master's lease on id 0, as a plain object.

The nameserver expires a broker whose heartbeats stop for ``heartbeat_timeout``
(``broker_not_active_timeout_ms``) and lets its lowest slave act.  A master that was
frozen (SIGSTOP, a long GC or VM stall) or cut off by a partition cannot tell from
inside whether that happened, so it keeps a lease: every heartbeat (or registration)
a nameserver acknowledges extends it to *the time that heartbeat was sent* plus the
timeout.  Once the lease has run out the master must assume it was expired; it
fences itself (refuses clients, stops its special services) and goes back through
pre-online before it registers again.

The lease is measured on the monotonic clock from the *send* time, so it always ends
no later than the nameserver's own view of the heartbeat's age.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Lease:
    """Valid until ``timeout_s`` after the last acknowledged heartbeat was sent."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._valid_until: float | None = None  # None: never granted (not registered yet)

    def granted(self, sent_at: float) -> None:
        """A nameserver acknowledged a heartbeat or registration sent at ``sent_at``."""
        until = sent_at + self.timeout_s
        if self._valid_until is None or until > self._valid_until:
            self._valid_until = until

    def expired(self) -> bool:
        """True once a granted lease has run out (never before the first grant)."""
        return self._valid_until is not None and self._clock() > self._valid_until

    def remaining_s(self) -> float | None:
        if self._valid_until is None:
            return None
        return self._valid_until - self._clock()

    def reset(self) -> None:
        """Fenced: no lease until the next registration."""
        self._valid_until = None
