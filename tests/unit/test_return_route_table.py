"""RouteTable after a nameserver stall and while a master returns (issue 17, defect B
and the acting flap of defect A), with an injected clock."""

from __future__ import annotations

from test_route_table import (
    CLUSTER,
    MASTER,
    NAME,
    SLAVE1,
    SLAVE2,
    TOPIC,
    FakeClock,
    reg,
)

from nameserver.route_table import RouteTable

SCAN_MS = 500
TIMEOUT_MS = 2000


def group(clock: FakeClock) -> RouteTable:
    table = RouteTable(clock, scan_interval_ms=SCAN_MS)
    for addr, broker_id in ((MASTER, 0), (SLAVE1, 1), (SLAVE2, 2)):
        table.register_broker(reg(addr, broker_id, timeout=TIMEOUT_MS, pos=100))
    return table


def test_a_late_scan_is_our_own_stall_and_expires_nobody() -> None:
    clock = FakeClock()
    table = group(clock)
    assert table.scan_not_active() == ([], [])
    clock.advance(6000)  # SIGSTOP for 6 s: no heartbeat got through, the scan ran late

    expired, notes = table.scan_not_active()

    assert (expired, notes) == ([], [])
    assert table.stalls == 1
    route = table.pickup_route(TOPIC)
    assert route is not None and route.broker_datas[0].broker_addrs == {
        0: MASTER,
        1: SLAVE1,
        2: SLAVE2,
    }
    # the grace is one heartbeat timeout: a broker that stays silent expires after it
    for addr in (MASTER, SLAVE1):
        clock.advance(SCAN_MS)
        assert table.heartbeat(CLUSTER, addr)
        table.scan_not_active()
    clock.advance(TIMEOUT_MS - SCAN_MS)
    assert table.heartbeat(CLUSTER, MASTER) and table.heartbeat(CLUSTER, SLAVE1)
    expired, _ = table.scan_not_active()
    assert [b.broker_addr for b in expired] == [SLAVE2]
    assert table.stalls == 1


def test_the_member_group_says_how_long_ago_the_master_was_heard_and_a_stall_is_no_news() -> None:
    """A slave believes a nameserver's view with a master only while that nameserver
    heard the master recently (broker_agent.membership.views); the stall's fresh grace
    period must not make an old entry look recent."""
    clock = FakeClock()
    table = group(clock)
    clock.advance(250)
    assert table.member_group(CLUSTER, NAME).master_heard_ms_ago == 250
    assert table.heartbeat(CLUSTER, MASTER)
    assert table.member_group(CLUSTER, NAME).master_heard_ms_ago == 0
    table.scan_not_active()
    clock.advance(6000)  # paused
    table.scan_not_active()
    assert table.stalls == 1
    assert table.member_group(CLUSTER, NAME).master_heard_ms_ago == 6000
    for _ in range(TIMEOUT_MS // SCAN_MS + 1):  # the master stays silent: it expires
        clock.advance(SCAN_MS)
        table.heartbeat(CLUSTER, SLAVE1)
        table.heartbeat(CLUSTER, SLAVE2)
        table.scan_not_active()
    view = table.member_group(CLUSTER, NAME)
    assert 0 not in view.broker_addrs and view.master_heard_ms_ago is None


def test_scans_on_time_still_expire_a_silent_master() -> None:
    clock = FakeClock()
    table = group(clock)
    expired: list[str] = []
    for _ in range(6):
        clock.advance(SCAN_MS)
        table.heartbeat(CLUSTER, SLAVE1)
        table.heartbeat(CLUSTER, SLAVE2)
        expired += [b.broker_addr for b in table.scan_not_active()[0]]
    assert expired == [MASTER]
    assert table.stalls == 0
    assert table.acting_broker_id(NAME) == 1


def test_without_the_scan_interval_there_is_no_stall_detection() -> None:
    clock = FakeClock()
    table = RouteTable(clock)
    table.register_broker(reg(MASTER, 0, timeout=TIMEOUT_MS, pos=100))
    table.scan_not_active()
    clock.advance(6000)
    assert [b.broker_addr for b in table.scan_not_active()[0]] == [MASTER]


def test_a_slave_fed_by_the_returning_master_does_not_take_over_acting() -> None:
    """The master's pre-online re-attaches the slaves; one of them gets its tail first
    and reports a higher position.  The acting slave keeps acting: moving the special
    services to the other slave made it deliver again what the first one delivered."""
    clock = FakeClock()
    table = group(clock)
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert table.acting_broker_id(NAME) == 1
    clock.advance(TIMEOUT_MS)  # the master returns later than half a timeout

    out = table.broker_heartbeat(CLUSTER, SLAVE2, max_offset=500)

    assert out.notifications == []
    assert table.acting_broker_id(NAME) == 1
    # a slave that reports it cannot write is still replaced
    out = table.broker_heartbeat(CLUSTER, SLAVE1, max_offset=100, store_writable=False)
    assert [n.min_broker_id for n in out.notifications] == [2]
