"""Which nameserver to believe when they disagree about who leads the group.

Each nameserver keeps its own table: a returning master's registration may reach one
nameserver seconds before the other (campaign seed 5001: it hung on a connection the
partition had broken), one may expire a master the other still hears (a partition
between the master and one nameserver), and one that was paused lists the masters it
knew before its pause.  A slave that followed the first answer acted on a stale
nameserver's word beside its returned master, and both served POP.

The rule, a plain function of the views that answered:

- A view that lists a master the nameserver *heard from recently* (``fresh_ms``) wins:
  the master is alive, so no slave may act for it, whatever another nameserver says.
- Otherwise the first view (in ``namesrv_addrs`` order) that lists no master and
  names who acts.  A view whose master went silent is ignored, so a nameserver that has
  not expired a dead master yet neither holds up the acting slave nor stops it; and a
  view still *settling* (its nameserver expired the master a moment ago and waits for
  the slaves' positions before it chooses) is taken only when no view names one, so a
  slave does not stop and start again while the second nameserver catches up (check
  campaign seed 10002: 12 ms between the stop and the start).
- Otherwise the first view that lists no master, else the first view.
"""

from __future__ import annotations

from collections.abc import Sequence

from ha_controller.routing import MASTER_ID, SETTLING, BrokerMemberGroup


def has_live_master(view: BrokerMemberGroup, fresh_ms: int) -> bool:
    """The view lists a master its nameserver heard from within ``fresh_ms`` (a
    nameserver that does not say when counts as recent: RocketMQ's nameservers don't)."""
    if MASTER_ID not in view.broker_addrs:
        return False
    return view.master_heard_ms_ago is None or view.master_heard_ms_ago <= fresh_ms


def believed_view(views: Sequence[BrokerMemberGroup], fresh_ms: int) -> BrokerMemberGroup | None:
    """The view to follow (see the module doc); None when no nameserver answered."""
    for view in views:
        if has_live_master(view, fresh_ms):
            return view
    leaderless = [v for v in views if MASTER_ID not in v.broker_addrs and v.broker_addrs]
    for view in leaderless:
        if view.lead_broker_id() != SETTLING:
            return view
    if leaderless:
        return leaderless[0]
    return views[0] if views else None


def fresh_window_ms(heartbeat_interval_ms: int, not_active_timeout_ms: int) -> int:
    """How recent a master's last heartbeat must be for a view to count it alive: three
    heartbeat intervals, at most half the not-active timeout (a master silent that long
    is on its way to being expired anyway)."""
    return min(3 * heartbeat_interval_ms, not_active_timeout_ms // 2)


__all__ = ["believed_view", "fresh_window_ms", "has_live_master"]
