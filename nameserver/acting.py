"""Which slave acts for a broker group that lost its master: a pure function of the
members' last reports (position, whether their store takes appends, when they
reported), so that every nameserver that got the same reports chooses the same slave
whatever order they came in; and when the acting slave keeps acting although another
got further.  The route table (:mod:`nameserver.route_table`) calls these on every
report that may change the answer.
"""

from __future__ import annotations

from collections.abc import Mapping

from nameserver.route_records import GroupRecord, LiveInfo

__all__ = ["choose_acting", "keeps_acting"]


def choose_acting(
    group: GroupRecord, live: Mapping[int, LiveInfo | None], now_ms: float
) -> int | None:
    """The slave that acts for a masterless group: a pure function of the members'
    last reports, so that every nameserver that got the same reports makes the
    same choice (no memory of earlier choices: two nameservers must converge).

    The slaves at the highest reported position (commit-log end) have every byte
    any slave has; among them, those whose store takes appends are preferred; the
    lowest id of those acts.  A slave that cannot write is still chosen when it
    alone is that far (reads of what only it holds matter more than its writes).
    When a member reports no position (an old broker), RocketMQ's rule: the
    lowest id."""
    if not group.master_seen:
        # A nameserver that has just (re)started knows nothing of the masters: its
        # table is empty and slaves often register first (a cluster that starts
        # does the same).  A live master registers within a heartbeat interval, so
        # no slave acts for a master this nameserver never saw until one heartbeat
        # timeout after the group's first member registered (long campaign seed
        # 1015: a restarted nameserver made two slaves act for a second beside
        # their masters, and they delivered delayed and transactional messages a
        # second time).
        grace_ms = max((i.heartbeat_timeout_ms for i in live.values() if i), default=0)
        if now_ms < group.first_seen_ms + grace_ms:
            return None
    positions: dict[int, int] = {}
    for broker_id, info in live.items():
        if info is None or info.max_offset is None:
            return min(group.addrs)
        positions[broker_id] = info.max_offset
    # Positions reported before the master left may be stale (a slave's last
    # heartbeat can predate the last bytes it received): wait for a report made
    # after it from every slave, up to a quarter of the heartbeat timeout (with one
    # slave there is nothing to choose; choosing early then switching when a
    # fresher report arrives moves the group's consumers and special services
    # twice, and redelivers).  Then choose from every live slave's latest report,
    # fresh or not: never from the ones that happened to report first, which two
    # nameservers receiving the reports in different orders would see differently
    # (and choose two acting slaves).
    since = group.masterless_since
    if since is not None and len(positions) > 1:
        fresh = sum(
            1 for b in positions if (info := live[b]) is not None and info.reported_ms >= since
        )
        if fresh < len(positions):
            settle_ms = max(i.heartbeat_timeout_ms for i in live.values() if i) / 4
            if now_ms < since + settle_ms:
                return None
    best = max(positions.values())
    caught_up = [broker_id for broker_id, pos in positions.items() if pos == best]
    writable = [b for b in caught_up if (info := live[b]) is None or info.store_writable]
    return min(writable or caught_up)


def keeps_acting(
    group: GroupRecord, acting_id: int, live: Mapping[int, LiveInfo | None], now_ms: float
) -> bool:
    """Whether the acting slave keeps acting although another slave now reports a
    higher position (a lower id at the same position always takes over: that is
    the choice every nameserver converges on, whatever order reports came in).

    Early on a higher position is news: a report made before the master left
    missed bytes already on their way, so the choice follows it.  Half a heartbeat
    timeout after the master left, every byte the old master wrote before it lost
    its lease has arrived; a slave that gets further now is being fed by the
    returning master (its pre-online re-attaches the slaves).  Moving the group's
    special services to that slave then would make it deliver again what the
    acting one delivered: acting slaves do not share their progress.  A slave that
    reports it cannot write is still replaced."""
    info = live.get(acting_id)
    since = group.masterless_since
    if info is None or not info.store_writable or since is None:
        return False
    timeout_ms = max(
        (i.heartbeat_timeout_ms for i in live.values() if i), default=info.heartbeat_timeout_ms
    )
    return now_ms >= since + timeout_ms / 2
