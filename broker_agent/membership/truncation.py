"""Whether a returning master cuts its commit log back to its most advanced slave.

A master cut off by a partition keeps working until its lease runs out: in those last
seconds its timer and POP revive loop still store due delayed messages and retries in
its own log, and clients may have sent it messages whose acknowledgement never came
back.  Its slaves never got those bytes.  Meanwhile a slave acted for it and did the
same special work through the escape bridge.  If the returning master kept its tail,
its slaves would copy it when they re-attach and consumers would get those deliveries
a second time.  So, like a RocketMQ controller-mode master that comes back as an old
master, it cuts its log back to what its slaves hold before it serves.

That is safe only when no acknowledged message lies in the cut tail:

- **SYNC replication with at least two copies** (``copies_needed() >= 2``): a send is
  acknowledged only once a slave holds it, so a byte no live slave holds was never
  acknowledged -- provided every slave that could hold it answers.  With ``missing``
  slaves not answering, a cut is safe only when ``missing < copies_needed - 1`` (each
  acknowledged byte is on ``copies_needed - 1`` slaves, so at least one live slave has
  it).  Under ASYNC replication (or one copy) acknowledged data may exist only on the
  master: it never cuts, and logs what that costs (the tail's special work may be
  delivered twice).
- **A slave acted for it**: the nameserver names an acting slave in the member group,
  or this master fenced itself (its lease ran out, it was expired).  A master simply
  ahead of lagging slaves keeps its tail; they copy it as usual.

:func:`plan_cut` decides (no I/O); pre-online carries it out while the broker is
isolated, before any slave re-attaches (``broker_agent.store.truncate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from broker_agent.replication.catchup import SlaveLog


@dataclass(frozen=True, slots=True)
class CutPlan:
    """The decision; ``str()`` is the one-line text pre-online logs."""

    #: the offset to cut at, or None to keep the log
    target: int | None
    #: the slave whose end is the target (its tables replace ours), None without a cut
    source: SlaveLog | None
    #: True when a tail stays although a slave acted (a warning for operators)
    risky: bool
    text: str

    def __str__(self) -> str:
        return self.text


def plan_cut(
    own_min: int,
    own_max: int,
    slaves: Sequence[SlaveLog],
    *,
    expected_slaves: int,
    copies_needed: int,
    slave_acted: str | None,
    acting_id: int | None = None,
) -> CutPlan:
    """Whether to cut ``[own_min, own_max)`` back to the most advanced slave's end.

    ``slaves``: the slaves that answered the probe; ``expected_slaves``: how many the
    group has (``total_replicas - 1``); ``slave_acted``: why this master believes a
    slave acted for it (None: no sign of it); ``acting_id``: the acting slave, which is
    preferred as the source among equally advanced slaves."""
    if not slaves:
        return CutPlan(None, None, False, "no slave answered: nothing to compare with")
    best = max(slaves, key=lambda s: (s.max_offset, s.broker_id == acting_id))
    ahead = own_max - best.max_offset
    if ahead <= 0:
        return CutPlan(None, None, False, f"commit log ends at {own_max}, not ahead of a slave")
    head = (
        f"commit log ends at {own_max}, {ahead} bytes ahead of the most advanced slave "
        f"(slave {best.broker_id} at {best.max_offset})"
    )
    if slave_acted is None:
        return CutPlan(None, None, False, f"{head}; no slave acted: the slaves copy the tail")
    if copies_needed < 2:
        return CutPlan(
            None,
            None,
            True,
            f"{head} after {slave_acted}; replication acknowledges with one copy, so the "
            "tail may hold acknowledged messages: keeping it (special work in it may be "
            "delivered twice)",
        )
    missing = max(0, expected_slaves - len(slaves))
    if missing >= copies_needed - 1:
        return CutPlan(
            None,
            None,
            True,
            f"{head} after {slave_acted}; {missing} slave(s) did not answer and may hold "
            "acknowledged messages of the tail: keeping it",
        )
    if best.max_offset < own_min:
        return CutPlan(
            None,
            None,
            True,
            f"{head} after {slave_acted}; the slave ends before our log starts ({own_min}): "
            "keeping it",
        )
    return CutPlan(
        best.max_offset,
        best,
        False,
        f"{head} after {slave_acted}; no acknowledged message lies past it "
        f"({copies_needed} copies per acknowledgement): cutting the log at {best.max_offset}",
    )
