"""A controller-mode master's sync-state set, as a plain object (no I/O).

The set is the members that hold everything the master acknowledged to a client; the
controller may elect any of them, so none may lack an acknowledged write:

- **The master waits for all of it.**  A write is acknowledged only once every member
  the master *requires* holds it: the confirmed set and every member it asked to add
  (:attr:`SyncSet.required`).  ``in_sync_replicas`` stays the least the set may hold:
  with fewer confirmed members, writes are refused (``InSyncReplicasNotEnough``).
- **Adding a member takes two steps** (the expand race of apache/rocketmq#5663).  A
  member close behind (``JOIN_GAP_BYTES``) is first *required*, with the master's end
  at that moment as its mark; once it holds everything below the mark it holds every
  write the master ever acknowledged, and only then is the controller asked to add it.
  If the answer is lost, the member stays required: the master never acknowledges with
  a smaller set than the controller may elect from.  Only a member that keeps up is
  required so: one that has not acknowledged what the master held ``lag_ms`` ago is
  not (a frozen slave is close behind too: just removed, it was required again at
  once, and every write waited for it until its link closed; seen in the
  ``controller-slave-behind`` campaign, seed 3305), and a required member that falls
  that far behind stops being required, unless it was asked for.
- **Removing one waits for the controller.**  A member whose link closed, or that has
  not acknowledged a write older than ``lag_ms``, is proposed for removal, and stays
  required until the controller confirmed the smaller set; writes wait for it meanwhile.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["JOIN_GAP_BYTES", "Proposal", "SyncSet"]

#: a member this close behind the master's end is required (and then added)
JOIN_GAP_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class Proposal:
    """A set to ask the controller for, and why."""

    members: frozenset[int]
    why: str


class SyncSet:
    """The set as one master sees it (see the module's docstring)."""

    def __init__(
        self, me: int, confirmed: frozenset[int], *, lag_ms: int, join_gap: int = JOIN_GAP_BYTES
    ) -> None:
        self.me = me
        self.confirmed = frozenset(confirmed) | {me}
        #: member -> the master's end when it became required (added once it holds it)
        self.joining: dict[int, int] = {}
        self.lag_ms = lag_ms
        self.join_gap = join_gap
        #: a request is out: no other until it is answered
        self.in_flight: Proposal | None = None
        #: (ms, master end) samples, oldest first, for the lag rule
        self._ends: deque[tuple[float, int]] = deque()

    @property
    def required(self) -> frozenset[int]:
        """Members (other than the master) every write waits for."""
        return (self.confirmed | frozenset(self.joining)) - {self.me}

    def observe(self, acked: Mapping[int, int], end: int, now_ms: float) -> Proposal | None:
        """What the links show: ``acked`` is member -> acknowledged offset for every
        attached member.  Returns a set to ask the controller for (None: nothing to ask,
        or a request is out)."""
        self._ends.append((now_ms, end))
        while len(self._ends) > 1 and now_ms - self._ends[1][0] >= self.lag_ms:
            self._ends.popleft()
        old_end = self._ends[0][1] if now_ms - self._ends[0][0] >= self.lag_ms else None
        asked = self.in_flight.members if self.in_flight is not None else frozenset()
        for member, off in acked.items():
            if member == self.me or member in self.confirmed or member in self.joining:
                continue
            if end - off <= self.join_gap and (old_end is None or off >= old_end):
                self.joining[member] = end
        ready = {m for m, mark in self.joining.items() if acked.get(m, -1) >= mark}
        for m in list(self.joining):
            if m in asked:
                continue  # the controller may add it: writes wait for it until answered
            if m not in acked:
                del self.joining[m]  # it left before it held the mark: never asked for
            elif m not in ready and old_end is not None and acked[m] < old_end:
                del self.joining[m]  # it stopped keeping up (frozen): never asked for
        drop: dict[int, str] = {}
        for member in self.confirmed - {self.me}:
            got = acked.get(member)
            if got is None:
                drop[member] = "its HA link closed"
            elif old_end is not None and got < old_end:
                drop[member] = f"it has not acknowledged offset {old_end} for {self.lag_ms} ms"
        if self.in_flight is not None or (not ready and not drop):
            return None
        members = (self.confirmed - frozenset(drop)) | frozenset(ready)
        why = "; ".join(
            [f"add {m}: it holds everything acknowledged" for m in sorted(ready)]
            + [f"remove {m}: {w}" for m, w in sorted(drop.items())]
        )
        proposal = Proposal(frozenset(members), why)
        self.in_flight = proposal
        return proposal

    def answered(self, members: frozenset[int] | None) -> None:
        """The controller's answer: the set it now holds (None: no answer, the request
        may or may not have been applied; the members asked for stay required)."""
        self.in_flight = None
        if members is None:
            return
        self.confirmed = frozenset(members) | {self.me}
        for m in list(self.joining):
            if m in self.confirmed:
                del self.joining[m]
