"""RouteTable: registration, liveness, expiry and the acting-master rewrite.

Mirrors RocketMQ's RouteInfoManagerNewTest with an
injected clock instead of sleeps.
"""

from __future__ import annotations

import logging

import pytest
from fakes import FakeClock

from ha_controller.dataversion import DataVersion
from ha_controller.routing import (
    SETTLING,
    SYNC_BROKER_MEMBER_GROUP_PREFIX,
    BrokerData,
    BrokerMemberGroup,
    Perm,
    QueueData,
    TopicConfig,
    TopicConfigWrapper,
    TopicRouteData,
    sync_member_group_topic,
)
from nameserver.route_table import (
    DEFAULT_BROKER_CHANNEL_EXPIRED_TIME_MS,
    BrokerRegistration,
    ExpiredBroker,
    HeartbeatOutcome,
    MinIdChange,
    RouteTable,
)

CLUSTER = "DefaultCluster"
NAME = "Default_Broker"
MASTER = "127.0.0.1:10911"
MASTER_HA = "127.0.0.1:20911"
SLAVE1 = "127.0.0.1:30911"
SLAVE1_HA = "127.0.0.1:40911"
SLAVE2 = "127.0.0.1:50911"
SLAVE2_HA = "127.0.0.1:60911"
TOPIC = "TestTopic"
BASE_TOPIC = "BaseTopic"
RW = Perm.READ | Perm.WRITE

HA_OF = {MASTER: MASTER_HA, SLAVE1: SLAVE1_HA, SLAVE2: SLAVE2_HA}


def topics(*names: str, perm: int = RW) -> dict[str, TopicConfig]:
    return {n: TopicConfig(n, 8, 8, perm) for n in names}


def version(counter: int = 1, state: int = 0) -> DataVersion:
    return DataVersion(state_version=state, counter=counter, timestamp_ms=counter)


def reg(
    addr: str,
    broker_id: int,
    *,
    name: str = NAME,
    eam: bool | None = True,
    timeout: int | None = None,
    topic_configs: dict[str, TopicConfig] | None = None,
    dv: DataVersion | None = None,
    pos: int | None = None,
    writable: bool | None = None,
) -> BrokerRegistration:
    return BrokerRegistration(
        cluster=CLUSTER,
        broker_addr=addr,
        broker_name=name,
        broker_id=broker_id,
        ha_addr=HA_OF.get(addr, addr + "-ha"),
        heartbeat_timeout_ms=timeout,
        enable_acting_master=eam,
        topic_configs=topics(BASE_TOPIC, TOPIC) if topic_configs is None else topic_configs,
        data_version=version() if dv is None else dv,
        max_offset=pos,
        store_writable=writable,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000.0)


@pytest.fixture
def table(clock: FakeClock) -> RouteTable:
    return RouteTable(clock)


def past_the_grace(table: RouteTable, clock: FakeClock) -> None:
    """Let the grace of a group whose master this nameserver never saw run out (see
    ``test_a_restarted_nameserver_lets_no_slave_act_before_its_master_could_register``)."""
    clock.advance(DEFAULT_BROKER_CHANNEL_EXPIRED_TIME_MS + 1)
    table.settle()


def addrs_of(table: RouteTable, topic: str = TOPIC, name: str = NAME) -> dict[int, str]:
    route = table.pickup_route(topic)
    assert route is not None
    broker = route.broker(name)
    assert broker is not None
    return broker.broker_addrs


def perm_of(table: RouteTable, topic: str = TOPIC, name: str = NAME) -> int:
    route = table.pickup_route(topic)
    assert route is not None
    queue = route.queue(name)
    assert queue is not None
    return queue.perm


def group_of_three(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0))
    table.register_broker(reg(SLAVE1, 1))
    table.register_broker(reg(SLAVE2, 2))


# ----------------------------------------------------------------- registration


def test_register_master_then_slave_returns_master_addresses(table: RouteTable) -> None:
    master = table.register_broker(reg(MASTER, 0))
    assert (master.master_addr, master.master_ha_addr, master.rejected) == (None, None, False)
    assert master.notifications == []

    slave = table.register_broker(reg(SLAVE1, 1))
    assert slave.master_addr == MASTER
    assert slave.master_ha_addr == MASTER_HA
    assert slave.rejected is False
    assert slave.notifications == []

    assert addrs_of(table) == {0: MASTER, 1: SLAVE1}
    assert perm_of(table) == RW
    assert table.topics() == [BASE_TOPIC, TOPIC]


def test_slave_without_live_master_gets_no_master_addr(table: RouteTable) -> None:
    outcome = table.register_broker(reg(SLAVE1, 1))
    assert outcome.master_addr is None
    assert outcome.master_ha_addr is None


def test_new_topic_from_master_shows_both_members(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0))
    table.register_broker(reg(SLAVE1, 1))
    table.register_broker(
        reg(MASTER, 0, topic_configs=topics(BASE_TOPIC, TOPIC, "NewTopic"), dv=version(2))
    )
    assert addrs_of(table, "NewTopic") == {0: MASTER, 1: SLAVE1}
    assert perm_of(table, "NewTopic") == RW


def test_non_prime_slave_never_touches_topics(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0))
    table.register_broker(reg(SLAVE1, 1, topic_configs=topics("SlaveOnly"), dv=version(7)))
    assert table.pickup_route("SlaveOnly") is None
    assert table.topics() == [BASE_TOPIC, TOPIC]


def test_old_broker_gets_default_timeout(table: RouteTable, clock: FakeClock) -> None:
    table.register_broker(reg(MASTER, 0, eam=None, timeout=None))
    clock.advance(DEFAULT_BROKER_CHANNEL_EXPIRED_TIME_MS)
    assert table.scan_not_active() == ([], [])
    clock.advance(1)
    expired, _ = table.scan_not_active()
    assert [e.broker_addr for e in expired] == [MASTER]


# --------------------------------------------------------- acting-master rewrite


def test_unregister_master_shows_slave_as_id0_read_only(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0))
    table.register_broker(reg(SLAVE1, 1))

    table.unregister_broker(CLUSTER, MASTER, NAME, 0)

    route = table.pickup_route(TOPIC)
    assert route is not None
    assert route.to_json() == {
        "topic": TOPIC,
        "brokers": [
            {"cluster": CLUSTER, "brokerName": NAME, "brokerAddrs": {"0": SLAVE1}},
        ],
        "queues": [
            {"brokerName": NAME, "readQueueNums": 8, "writeQueueNums": 8, "perm": Perm.READ},
        ],
    }
    # The rewrite works on a clone: the member group keeps raw ids.
    assert table.member_group(CLUSTER, NAME).broker_addrs == {1: SLAVE1}


@pytest.mark.parametrize("eam", [None, False])
def test_group_without_acting_master_is_never_rewritten(
    table: RouteTable, eam: bool | None
) -> None:
    table.register_broker(reg(MASTER, 0, eam=eam))
    table.register_broker(reg(SLAVE1, 1, eam=eam))

    notes = table.unregister_broker(CLUSTER, MASTER, NAME, 0)

    assert notes == []
    assert addrs_of(table) == {1: SLAVE1}
    assert 0 not in addrs_of(table)
    assert perm_of(table) == RW
    assert table.groups_view()[0]["actingBrokerId"] is None


def test_support_acting_master_off_wipes_but_never_rewrites(clock: FakeClock) -> None:
    table = RouteTable(clock, support_acting_master=False)
    table.register_broker(reg(MASTER, 0))
    table.register_broker(reg(SLAVE1, 1))
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert addrs_of(table) == {1: SLAVE1}
    assert perm_of(table) == Perm.READ
    assert table.groups_view()[0]["actingBrokerId"] is None


def test_pickup_route_with_slave_follows_master_loss_and_return(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0))
    table.register_broker(reg(SLAVE1, 1))
    assert addrs_of(table) == {0: MASTER, 1: SLAVE1}
    assert Perm.is_writeable(perm_of(table))

    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert addrs_of(table) == {0: SLAVE1}
    assert not Perm.is_writeable(perm_of(table))
    assert Perm.is_readable(perm_of(table))

    table.register_broker(reg(MASTER, 0))
    assert addrs_of(table) == {0: MASTER, 1: SLAVE1}
    assert perm_of(table) == RW
    assert perm_of(table, BASE_TOPIC) == RW


def test_register_only_slave_is_read_only_acting(table: RouteTable, clock: FakeClock) -> None:
    table.register_broker(reg(SLAVE1, 1))
    past_the_grace(table, clock)
    assert perm_of(table) == Perm.READ
    assert addrs_of(table) == {0: SLAVE1}
    assert table.groups_view()[0]["actingBrokerId"] == 1


def test_register_only_slave_then_master_restores_write(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0))
    table.register_broker(reg(SLAVE1, 1))
    assert perm_of(table) == RW
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert perm_of(table) == Perm.READ
    table.register_broker(reg(MASTER, 0))
    assert perm_of(table) == RW


def test_prime_slave_new_topic_registered_read_only(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0))
    table.register_broker(reg(SLAVE1, 1))
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)

    table.register_broker(
        reg(SLAVE1, 1, topic_configs=topics(BASE_TOPIC, TOPIC, "Later"), dv=version(2))
    )

    assert perm_of(table, "Later") == Perm.READ
    assert addrs_of(table, "Later") == {0: SLAVE1}


def test_prime_slave_of_old_version_group_keeps_write(table: RouteTable) -> None:
    table.register_broker(reg(SLAVE1, 1, eam=False))
    assert perm_of(table) == RW
    assert addrs_of(table) == {1: SLAVE1}


def test_three_member_group_acting_slave1_keeps_slave2_id(table: RouteTable) -> None:
    group_of_three(table)

    table.unregister_broker(CLUSTER, MASTER, NAME, 0)

    assert addrs_of(table) == {0: SLAVE1, 2: SLAVE2}
    assert perm_of(table) == Perm.READ
    assert table.member_group(CLUSTER, NAME).broker_addrs == {1: SLAVE1, 2: SLAVE2}

    table.unregister_broker(CLUSTER, SLAVE1, NAME, 1)
    assert addrs_of(table) == {0: SLAVE2}
    assert perm_of(table) == Perm.READ


def test_switch_broker_role_without_acting_master(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0, eam=False))
    table.register_broker(reg(SLAVE1, 1, eam=False))

    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert addrs_of(table) == {1: SLAVE1}

    dv = version(1)
    dv.next_version()
    table.register_broker(reg(SLAVE1, 0, eam=False, dv=dv))
    assert addrs_of(table) == {0: SLAVE1}

    table.register_broker(reg(MASTER, 1, eam=False))
    assert addrs_of(table) == {0: SLAVE1, 1: MASTER}
    assert perm_of(table) == RW


def test_switch_broker_role_with_acting_master_restores_write(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0))
    table.register_broker(reg(SLAVE1, 1))
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert perm_of(table) == Perm.READ

    outcome = table.register_broker(reg(SLAVE1, 0, dv=version(2)))

    assert table.member_group(CLUSTER, NAME).broker_addrs == {0: SLAVE1}
    assert perm_of(table) == RW
    assert outcome.notifications == [
        MinIdChange(CLUSTER, NAME, 0, SLAVE1, None, SLAVE1_HA, [SLAVE1]),
    ]


def test_unregister_slave_leaves_master_only(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0))
    table.register_broker(reg(SLAVE1, 1))
    notes = table.unregister_broker(CLUSTER, SLAVE1, NAME, 1)
    assert notes == []
    assert addrs_of(table) == {0: MASTER}
    assert perm_of(table) == RW


def test_unregister_last_member_removes_group_and_topics(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0))
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert table.pickup_route(TOPIC) is None
    assert table.pickup_route(sync_member_group_topic(NAME)) is None
    assert table.topics() == []
    assert table.cluster_info() == {"brokerAddrTable": {}, "clusterAddrTable": {}}
    assert table.member_group(CLUSTER, NAME) == BrokerMemberGroup(CLUSTER, NAME, {})


def test_topic_shared_by_two_groups_keeps_other_group(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0))
    table.register_broker(reg("127.0.0.1:11911", 0, name="Broker_B"))
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    route = table.pickup_route(TOPIC)
    assert route is not None
    assert [b.broker_name for b in route.broker_datas] == ["Broker_B"]
    assert [q.broker_name for q in route.queue_datas] == ["Broker_B"]


# ---------------------------------------------------------------- stale versions


def test_stale_state_version_registration_rejected(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0, dv=version(1, state=5)))
    gen = table.generation

    outcome = table.register_broker(reg("127.0.0.1:19999", 0, dv=version(9, state=3)))

    assert outcome.rejected is True
    assert outcome.master_addr is None
    assert addrs_of(table) == {0: MASTER}
    assert table.is_registered(CLUSTER, "127.0.0.1:19999") is False
    assert table.heartbeat(CLUSTER, "127.0.0.1:19999") is False
    assert table.generation == gen


def test_rejected_registration_drops_the_id_it_held(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0, dv=version(1, state=5)))
    table.register_broker(reg(SLAVE1, 1, dv=version(1, state=5)))

    outcome = table.register_broker(reg(SLAVE1, 0, dv=version(2, state=4)))

    assert outcome.rejected is True
    assert table.member_group(CLUSTER, NAME).broker_addrs == {0: MASTER}
    assert table.is_registered(CLUSTER, SLAVE1) is False


def test_equal_or_newer_state_version_replaces_holder(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0, dv=version(1, state=5)))
    outcome = table.register_broker(reg("127.0.0.1:19999", 0, dv=version(1, state=5)))
    assert outcome.rejected is False
    assert addrs_of(table) == {0: "127.0.0.1:19999"}


# ---------------------------------------------------------------------- liveness


def test_heartbeat_never_registers(table: RouteTable, clock: FakeClock) -> None:
    assert table.heartbeat(CLUSTER, MASTER) is False
    assert table.pickup_route(TOPIC) is None
    assert table.groups_view() == []
    assert table.generation == 0

    table.register_broker(reg(MASTER, 0, timeout=10_000))
    clock.advance(9_000)
    assert table.heartbeat(CLUSTER, MASTER) is True
    clock.advance(9_000)
    assert table.scan_not_active() == ([], [])
    clock.advance(1_001)
    expired, _ = table.scan_not_active()
    assert [e.broker_addr for e in expired] == [MASTER]


def test_heartbeat_for_other_cluster_is_ignored(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0))
    assert table.heartbeat("OtherCluster", MASTER) is False


def test_query_data_version_reports_change_and_refreshes(
    table: RouteTable, clock: FakeClock
) -> None:
    table.register_broker(reg(MASTER, 0, timeout=10_000, dv=version(3)))

    clock.advance(8_000)
    assert table.query_data_version(CLUSTER, MASTER, version(3)) is False
    clock.advance(8_000)
    assert table.query_data_version(CLUSTER, MASTER, version(4)) is True
    clock.advance(8_000)
    assert table.scan_not_active() == ([], [])
    assert table.broker_data_version(CLUSTER, MASTER) == version(3)

    assert table.query_data_version(CLUSTER, SLAVE1, version(3)) is True
    assert table.is_registered(CLUSTER, SLAVE1) is False


def test_scan_uses_each_brokers_timeout(table: RouteTable, clock: FakeClock) -> None:
    table.register_broker(reg(MASTER, 0, timeout=10_000), conn_id="conn-a")
    table.register_broker(reg(SLAVE1, 1, timeout=10_000), conn_id="conn-b")
    old_b = "127.0.0.1:11911"
    table.register_broker(reg(old_b, 0, name="Broker_B", eam=None), conn_id="conn-c")
    start = clock.now

    clock.advance(10_000)
    table.heartbeat(CLUSTER, SLAVE1)
    assert table.scan_not_active() == ([], [])  # last + timeout == now: not yet

    clock.advance(1)
    expired, notes = table.scan_not_active()
    assert expired == [ExpiredBroker(CLUSTER, MASTER, NAME, 0, "conn-a", start, 10_000)]
    assert notes == [MinIdChange(CLUSTER, NAME, 1, SLAVE1, MASTER, None, [SLAVE1])]
    assert addrs_of(table) == {0: SLAVE1}
    assert perm_of(table) == Perm.READ

    clock.now = start + 120_000
    expired, _ = table.scan_not_active()
    assert expired == [ExpiredBroker(CLUSTER, SLAVE1, NAME, 1, "conn-b", start + 10_000, 10_000)]
    clock.now = start + 120_001
    expired, notes = table.scan_not_active()
    assert expired == [
        ExpiredBroker(CLUSTER, old_b, "Broker_B", 0, "conn-c", start, 120_000),
    ]
    assert notes == []
    assert table.topics() == []


def test_scan_expiring_master_and_slave_together_notifies_once(
    table: RouteTable, clock: FakeClock
) -> None:
    table.register_broker(reg(MASTER, 0, timeout=10_000))
    table.register_broker(reg(SLAVE1, 1, timeout=10_000))
    table.register_broker(reg(SLAVE2, 2, timeout=10_000))
    clock.advance(10_001)
    table.heartbeat(CLUSTER, SLAVE2)

    expired, notes = table.scan_not_active()

    assert sorted(e.broker_addr for e in expired) == [MASTER, SLAVE1]
    assert notes == [MinIdChange(CLUSTER, NAME, 2, SLAVE2, MASTER, None, [SLAVE2])]
    assert addrs_of(table) == {0: SLAVE2}


def test_connection_close_expires_every_broker_on_it(table: RouteTable) -> None:
    other_master = "127.0.0.1:11911"
    # One connection carries a master of one group and a slave of another (container).
    table.register_broker(reg(MASTER, 0), conn_id="c1")
    table.register_broker(reg(SLAVE1, 1), conn_id="c2")
    table.register_broker(reg(other_master, 0, name="Broker_B"), conn_id="c2")
    table.register_broker(reg(SLAVE2, 1, name="Broker_B"), conn_id="c1")

    notes = table.on_connection_closed("c1")

    assert notes == [MinIdChange(CLUSTER, NAME, 1, SLAVE1, MASTER, None, [SLAVE1])]
    assert table.is_registered(CLUSTER, MASTER) is False
    assert table.is_registered(CLUSTER, SLAVE2) is False
    assert table.is_registered(CLUSTER, SLAVE1) is True
    assert addrs_of(table) == {0: SLAVE1}
    assert addrs_of(table, name="Broker_B") == {0: other_master}
    assert perm_of(table, name="Broker_B") == RW
    assert table.on_connection_closed("c1") == []


# --------------------------------------------- a nameserver stall, a returning master
# (issue 17, defect B and the acting flap of defect A)

SCAN_MS = 500
TIMEOUT_MS = 2000


def scanned_group(clock: FakeClock) -> RouteTable:
    """A master and two slaves on a table that scans every SCAN_MS."""
    table = RouteTable(clock, scan_interval_ms=SCAN_MS)
    for addr, broker_id in ((MASTER, 0), (SLAVE1, 1), (SLAVE2, 2)):
        table.register_broker(reg(addr, broker_id, timeout=TIMEOUT_MS, pos=100))
    return table


def test_a_late_scan_is_our_own_stall_and_expires_nobody() -> None:
    clock = FakeClock()
    table = scanned_group(clock)
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
    table = scanned_group(clock)
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
    table = scanned_group(clock)
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
    table = scanned_group(clock)
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert table.acting_broker_id(NAME) == 1
    clock.advance(TIMEOUT_MS)  # the master returns later than half a timeout

    out = table.broker_heartbeat(CLUSTER, SLAVE2, max_offset=500)

    assert out.notifications == []
    assert table.acting_broker_id(NAME) == 1
    # a slave that reports it cannot write is still replaced
    out = table.broker_heartbeat(CLUSTER, SLAVE1, max_offset=100, store_writable=False)
    assert [n.min_broker_id for n in out.notifications] == [2]


# ------------------------------------------------------------------ notifications


def test_master_loss_notifies_all_remaining_naming_the_offline_master(
    table: RouteTable,
) -> None:
    group_of_three(table)

    notes = table.unregister_broker(CLUSTER, MASTER, NAME, 0)

    assert notes == [
        MinIdChange(
            cluster=CLUSTER,
            broker_name=NAME,
            min_broker_id=1,
            min_broker_addr=SLAVE1,
            offline_broker_addr=MASTER,
            ha_broker_addr=None,
            targets=[SLAVE1, SLAVE2],
        )
    ]
    assert table.min_id_changes == 1


def test_master_return_restores_perm_and_notifies_slaves(table: RouteTable) -> None:
    group_of_three(table)
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert perm_of(table) == Perm.READ

    outcome = table.register_broker(reg(MASTER, 0))

    assert outcome.notifications == [
        MinIdChange(CLUSTER, NAME, 0, MASTER, None, MASTER_HA, [SLAVE1, SLAVE2]),
    ]
    assert perm_of(table) == RW
    assert perm_of(table, BASE_TOPIC) == RW
    assert addrs_of(table) == {0: MASTER, 1: SLAVE1, 2: SLAVE2}
    view = table.groups_view()[0]
    assert (view["masterOnline"], view["actingBrokerId"]) == (True, None)


def test_lower_slave_registering_notifies_others_only(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0))
    table.register_broker(reg(SLAVE2, 2))
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)  # slave 2 acts
    outcome = table.register_broker(reg(SLAVE1, 1))
    assert outcome.notifications == [
        MinIdChange(CLUSTER, NAME, 1, SLAVE1, None, SLAVE1_HA, [SLAVE2]),
    ]
    assert addrs_of(table) == {0: SLAVE1, 2: SLAVE2}


def test_first_registration_and_higher_ids_do_not_notify(table: RouteTable) -> None:
    assert table.register_broker(reg(SLAVE1, 1)).notifications == []
    assert table.register_broker(reg(SLAVE2, 2)).notifications == []
    assert table.unregister_broker(CLUSTER, SLAVE2, NAME, 2) == []
    assert table.min_id_changes == 0


def test_notifications_off_by_config(clock: FakeClock) -> None:
    table = RouteTable(clock, notify_min_broker_id_changed=False)
    group_of_three(table)
    assert table.unregister_broker(CLUSTER, MASTER, NAME, 0) == []
    assert table.register_broker(reg(MASTER, 0)).notifications == []
    assert table.min_id_changes == 2
    # The route rewrite does not depend on notifications.
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert addrs_of(table) == {0: SLAVE1, 2: SLAVE2}


def test_old_version_group_is_not_notified_on_either_path(table: RouteTable) -> None:
    table.register_broker(reg(SLAVE1, 1, eam=None))
    table.register_broker(reg(SLAVE2, 2, eam=None))
    assert table.register_broker(reg(MASTER, 0, eam=None)).notifications == []
    assert table.unregister_broker(CLUSTER, MASTER, NAME, 0) == []
    assert table.min_id_changes == 2


# ------------------------------------------------------- choice of the acting slave


def reporting_group(
    table: RouteTable, s1: tuple[int, bool], s2: tuple[int, bool], master_pos: int = 10_000
) -> None:
    """Master and two slaves that report (position, store writable)."""
    table.register_broker(reg(MASTER, 0, pos=master_pos, writable=True))
    table.register_broker(reg(SLAVE1, 1, pos=s1[0], writable=s1[1]))
    table.register_broker(reg(SLAVE2, 2, pos=s2[0], writable=s2[1]))


def acting_of(table: RouteTable) -> int | None:
    return table.acting_broker_id(NAME)


def test_acting_slave_is_the_most_advanced_one_not_the_lowest_id(table: RouteTable) -> None:
    # slave 1's disk filled up: it stopped at 6000 and says it cannot write
    reporting_group(table, (6_000, False), (10_000, True))

    notes = table.unregister_broker(CLUSTER, MASTER, NAME, 0)

    assert notes == [MinIdChange(CLUSTER, NAME, 2, SLAVE2, MASTER, None, [SLAVE1, SLAVE2])]
    assert acting_of(table) == 2
    assert addrs_of(table) == {0: SLAVE2, 1: SLAVE1}
    assert perm_of(table) == Perm.READ
    group = table.member_group(CLUSTER, NAME)
    assert group.broker_addrs == {1: SLAVE1, 2: SLAVE2}
    assert (group.acting_broker_id, group.lead_broker_id()) == (2, 2)
    assert table.groups_view()[0]["actingBrokerId"] == 2


def test_caught_up_slaves_tie_break_on_the_lowest_id(table: RouteTable) -> None:
    reporting_group(table, (10_000, True), (10_000, True))
    (note,) = table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert (note.min_broker_id, note.min_broker_addr) == (1, SLAVE1)
    assert acting_of(table) == 1


def test_a_slave_that_cannot_write_is_skipped_when_another_is_as_far(table: RouteTable) -> None:
    reporting_group(table, (10_000, False), (10_000, True))
    (note,) = table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert note.min_broker_id == 2
    assert addrs_of(table) == {0: SLAVE2, 1: SLAVE1}


def test_a_slave_that_cannot_write_still_acts_when_only_it_holds_everything(
    table: RouteTable,
) -> None:
    # reads of what only slave 1 holds matter more than its writes
    reporting_group(table, (10_000, False), (9_000, True))
    (note,) = table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert note.min_broker_id == 1


def test_acting_slave_that_falls_behind_is_replaced(table: RouteTable, clock: FakeClock) -> None:
    # the last reports before the master died were sampled at different moments
    reporting_group(table, (10_000, True), (9_500, True))
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert acting_of(table) == 1
    g = table.generation

    clock.advance(300)
    outcome = table.broker_heartbeat(CLUSTER, SLAVE2, max_offset=10_400, store_writable=True)

    assert outcome.known
    assert outcome.notifications == [
        MinIdChange(CLUSTER, NAME, 2, SLAVE2, None, None, [SLAVE1, SLAVE2])
    ]
    assert acting_of(table) == 2
    assert addrs_of(table) == {0: SLAVE2, 1: SLAVE1}
    assert table.generation > g  # route watches see the new id 0


def test_acting_slave_that_reports_it_cannot_write_is_replaced(table: RouteTable) -> None:
    reporting_group(table, (10_000, True), (10_000, True))
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert acting_of(table) == 1

    outcome = table.broker_heartbeat(CLUSTER, SLAVE1, max_offset=10_000, store_writable=False)

    assert [n.min_broker_id for n in outcome.notifications] == [2]
    assert outcome.notifications[0].targets == [SLAVE1, SLAVE2]  # 1 must stop acting
    assert acting_of(table) == 2


def test_a_slave_that_gets_space_back_but_is_behind_changes_nothing(table: RouteTable) -> None:
    reporting_group(table, (6_000, False), (10_000, True))
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert acting_of(table) == 2
    g = table.generation

    # writable again, but it cannot catch up without a master
    assert table.broker_heartbeat(CLUSTER, SLAVE1, max_offset=6_000, store_writable=True) == (
        HeartbeatOutcome(True)
    )
    assert table.register_broker(reg(SLAVE1, 1, pos=6_000, writable=True)).notifications == []
    assert acting_of(table) == 2
    assert table.generation == g


def test_the_choice_depends_only_on_the_last_reports(clock: FakeClock) -> None:
    """Two nameservers that saw different stale reports at the master's loss agree as
    soon as they hold the same reports (no memory of earlier choices)."""
    first, second = RouteTable(clock), RouteTable(clock)
    reporting_group(first, (10_000, True), (9_000, True))  # slave 2 sampled early
    reporting_group(second, (9_000, True), (10_000, True))  # slave 1 sampled early
    for t in (first, second):
        t.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert (acting_of(first), acting_of(second)) == (1, 2)

    notes = {}
    for name, t in (("first", first), ("second", second)):
        changes = [
            *t.broker_heartbeat(CLUSTER, SLAVE1, max_offset=10_000).notifications,
            *t.broker_heartbeat(CLUSTER, SLAVE2, max_offset=10_000).notifications,
        ]
        notes[name] = [n.min_broker_id for n in changes]
    assert (acting_of(first), acting_of(second)) == (1, 1)  # equals: the lowest id
    assert notes == {"first": [], "second": [1]}


def test_reports_while_the_master_is_registered_choose_nothing(table: RouteTable) -> None:
    reporting_group(table, (6_000, False), (10_000, True))
    g = table.generation
    for addr, pos in ((SLAVE1, 1), (SLAVE2, 20_000), (MASTER, 30_000)):
        assert table.broker_heartbeat(CLUSTER, addr, max_offset=pos, store_writable=False) == (
            HeartbeatOutcome(True)
        )
    assert acting_of(table) is None
    assert table.member_group(CLUSTER, NAME).acting_broker_id is None
    assert table.generation == g
    assert table.broker_heartbeat(CLUSTER, "127.0.0.1:1", max_offset=1) == HeartbeatOutcome(False)


def test_master_return_after_a_chosen_slave_notifies_id_0(table: RouteTable) -> None:
    reporting_group(table, (6_000, False), (10_000, True))
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert acting_of(table) == 2

    outcome = table.register_broker(reg(MASTER, 0, pos=10_000, writable=True))

    assert outcome.notifications == [
        MinIdChange(CLUSTER, NAME, 0, MASTER, None, MASTER_HA, [SLAVE1, SLAVE2])
    ]
    assert acting_of(table) is None
    assert addrs_of(table) == {0: MASTER, 1: SLAVE1, 2: SLAVE2}
    assert perm_of(table) == RW


def test_acting_slave_expiring_hands_over_to_the_next_best(
    table: RouteTable, clock: FakeClock
) -> None:
    table.register_broker(reg(MASTER, 0, pos=10_000, writable=True, timeout=1_000))
    table.register_broker(reg(SLAVE1, 1, pos=8_000, writable=True, timeout=1_000))
    table.register_broker(reg(SLAVE2, 2, pos=10_000, writable=True, timeout=5_000))
    table.register_broker(reg("127.0.0.1:7", 3, pos=9_000, writable=True, timeout=5_000))
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert acting_of(table) == 2

    table.unregister_broker(CLUSTER, SLAVE2, NAME, 2)

    assert acting_of(table) == 3  # 9000 beats slave 1's 8000
    assert addrs_of(table) == {0: "127.0.0.1:7", 1: SLAVE1}


def test_an_old_broker_without_reports_brings_back_the_lowest_id(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0, pos=10_000, writable=True))
    table.register_broker(reg(SLAVE1, 1))  # reports nothing
    table.register_broker(reg(SLAVE2, 2, pos=10_000, writable=True))
    (note,) = table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert note.min_broker_id == 1


# ---------------------------------------------------------- compatibility topic


def test_compat_member_group_topic_shows_raw_ids(table: RouteTable) -> None:
    group_of_three(table)
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    topic = SYNC_BROKER_MEMBER_GROUP_PREFIX + NAME

    route = table.pickup_route(topic)

    assert route is not None
    assert route.to_json() == {
        "topic": topic,
        "brokers": [
            {
                "cluster": CLUSTER,
                "brokerName": NAME,
                "brokerAddrs": {"1": SLAVE1, "2": SLAVE2},
            }
        ],
        "queues": [
            {"brokerName": NAME, "readQueueNums": 1, "writeQueueNums": 1, "perm": Perm.INHERIT}
        ],
    }
    assert table.pickup_route(sync_member_group_topic("NoSuchBroker")) is None
    assert topic not in table.topics()


def test_compat_topic_registered_by_prime_slave_is_not_rewritten(
    table: RouteTable, clock: FakeClock
) -> None:
    topic = sync_member_group_topic(NAME)
    configs = {topic: TopicConfig(topic, 1, 1, Perm.INHERIT), **topics(TOPIC)}
    table.register_broker(reg(SLAVE1, 1, topic_configs=configs))
    table.register_broker(reg(SLAVE2, 2, topic_configs=configs))
    past_the_grace(table, clock)

    assert addrs_of(table, topic) == {1: SLAVE1, 2: SLAVE2}
    assert addrs_of(table, TOPIC) == {0: SLAVE1, 2: SLAVE2}


# ------------------------------------------------------------------- views


def test_member_group_uses_raw_ids(table: RouteTable) -> None:
    group_of_three(table)
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    group = table.member_group(CLUSTER, NAME)
    assert group == BrokerMemberGroup(CLUSTER, NAME, {1: SLAVE1, 2: SLAVE2}, acting_broker_id=1)
    assert group.minimum_broker_id() == 1
    assert group.lead_broker_id() == 1
    table.register_broker(reg(MASTER, 0))
    assert table.member_group(CLUSTER, NAME).acting_broker_id is None


def test_groups_view_shape(table: RouteTable, clock: FakeClock) -> None:
    table.register_broker(reg(MASTER, 0))
    clock.advance(500)
    table.register_broker(reg(SLAVE1, 1))
    clock.advance(250)
    table.broker_heartbeat(CLUSTER, SLAVE1, max_offset=4096, store_writable=False)
    clock.advance(250)
    assert table.groups_view(now_ms=clock.now - 250) == [
        {
            "cluster": CLUSTER,
            "brokerName": NAME,
            "enableActingMaster": True,
            "members": [
                {
                    "brokerId": 0,
                    "addr": MASTER,
                    "haAddr": MASTER_HA,
                    "lastHeartbeatAgeMs": 750,
                    "maxOffset": None,
                    "storeWritable": True,
                },
                {
                    "brokerId": 1,
                    "addr": SLAVE1,
                    "haAddr": SLAVE1_HA,
                    "lastHeartbeatAgeMs": 0,
                    "maxOffset": 4096,
                    "storeWritable": False,
                },
            ],
            "masterOnline": True,
            "actingBrokerId": None,
        }
    ]

    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert table.groups_view(now_ms=clock.now + 1_000) == [
        {
            "cluster": CLUSTER,
            "brokerName": NAME,
            "enableActingMaster": True,
            "members": [
                {
                    "brokerId": 1,
                    "addr": SLAVE1,
                    "haAddr": SLAVE1_HA,
                    "lastHeartbeatAgeMs": 1_250,
                    "maxOffset": 4096,
                    "storeWritable": False,
                },
            ],
            "masterOnline": False,
            "actingBrokerId": 1,
        }
    ]


def test_cluster_info(table: RouteTable) -> None:
    table.register_broker(reg(SLAVE1, 1))
    table.register_broker(reg(MASTER, 0))
    table.register_broker(reg("127.0.0.1:11911", 0, name="Broker_A", eam=None))
    assert table.cluster_info() == {
        "brokerAddrTable": {
            "Broker_A": {
                "cluster": CLUSTER,
                "brokerName": "Broker_A",
                "brokerAddrs": {"0": "127.0.0.1:11911"},
                "enableActingMaster": False,
                "actingBrokerId": None,
            },
            NAME: {
                "cluster": CLUSTER,
                "brokerName": NAME,
                "brokerAddrs": {"0": MASTER, "1": SLAVE1},
                "enableActingMaster": True,
                "actingBrokerId": None,
            },
        },
        "clusterAddrTable": {CLUSTER: ["Broker_A", NAME]},
    }


def test_enable_acting_master_is_last_writer_wins(table: RouteTable) -> None:
    table.register_broker(reg(MASTER, 0, eam=True))
    table.register_broker(reg(SLAVE1, 1, eam=None))
    assert table.groups_view()[0]["enableActingMaster"] is False
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert perm_of(table) == RW
    assert addrs_of(table) == {1: SLAVE1}


def test_generation_moves_on_route_changes_only(table: RouteTable, clock: FakeClock) -> None:
    g0 = table.generation
    table.register_broker(reg(MASTER, 0, timeout=10_000))
    g1 = table.generation
    assert g1 > g0

    # Refreshes and identical re-registrations change no route.
    table.heartbeat(CLUSTER, MASTER)
    table.query_data_version(CLUSTER, MASTER, version())
    table.register_broker(reg(MASTER, 0, timeout=10_000))
    assert table.generation == g1

    table.register_broker(reg(SLAVE1, 1, timeout=10_000))
    g2 = table.generation
    assert g2 > g1

    clock.advance(10_001)
    table.heartbeat(CLUSTER, SLAVE1)
    table.scan_not_active()
    g3 = table.generation
    assert g3 > g2

    table.register_broker(reg(MASTER, 0))
    g4 = table.generation
    assert g4 > g3

    table.on_connection_closed("nobody")
    table.unregister_broker(CLUSTER, "127.0.0.1:1", NAME, 5)
    assert table.generation == g4


def test_decisions_are_logged(table: RouteTable, caplog: pytest.LogCaptureFixture) -> None:
    group_of_three(table)
    with caplog.at_level(logging.INFO, logger="nameserver.route_table"):
        table.on_connection_closed(None)  # nothing registered without a connection id
        table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    text = caplog.text
    assert "min broker id change: group Default_Broker 0(127.0.0.1:10911) -> 1" in text
    assert "perm wipe: group Default_Broker has no master" in text


def test_default_clock_is_monotonic_ms() -> None:
    table = RouteTable()
    table.register_broker(reg(MASTER, 0))
    age = table.groups_view()[0]["members"][0]["lastHeartbeatAgeMs"]
    assert 0 <= age < 1_000


# ---------------------------------------------------------------- routing types


def test_perm_helpers() -> None:
    assert (Perm.PRIORITY, Perm.READ, Perm.WRITE, Perm.INHERIT) == (8, 4, 2, 1)
    assert Perm.is_readable(6) and Perm.is_writeable(6)
    assert Perm.is_readable(4) and not Perm.is_writeable(4)
    assert not Perm.is_readable(2) and Perm.is_writeable(2)
    assert Perm.without_write(6) == 4
    assert Perm.to_string(6) == "RW-"
    assert Perm.to_string(1) == "--X"


def test_route_json_is_sorted_and_round_trips() -> None:
    route = TopicRouteData(
        "T",
        [
            BrokerData("C", "b", {2: "h:2", 0: "h:0"}),
            BrokerData("C", "a", {1: "g:1"}),
        ],
        [QueueData("b", 4, 4, 6), QueueData("a", 2, 2, 4)],
    )
    data = route.to_json()
    assert data == {
        "topic": "T",
        "brokers": [
            {"cluster": "C", "brokerName": "a", "brokerAddrs": {"1": "g:1"}},
            {"cluster": "C", "brokerName": "b", "brokerAddrs": {"0": "h:0", "2": "h:2"}},
        ],
        "queues": [
            {"brokerName": "a", "readQueueNums": 2, "writeQueueNums": 2, "perm": 4},
            {"brokerName": "b", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6},
        ],
    }
    assert list(data["brokers"][1]["brokerAddrs"]) == ["0", "2"]
    back = TopicRouteData.from_json(data)
    assert back.to_json() == data
    assert back.broker("b") == BrokerData("C", "b", {0: "h:0", 2: "h:2"})
    b = back.broker("b")
    assert b is not None and b.master_addr == "h:0"


def test_member_group_minimum_id_and_json() -> None:
    assert BrokerMemberGroup("C", "b").minimum_broker_id() == 0
    group = BrokerMemberGroup("C", "b", {2: "x", 1: "y"})
    assert group.minimum_broker_id() == 1
    assert group.lead_broker_id() == 1
    assert BrokerMemberGroup.from_json(group.to_json()) == group
    acting = BrokerMemberGroup("C", "b", {2: "x", 1: "y"}, acting_broker_id=2)
    assert acting.lead_broker_id() == 2
    assert acting.to_json()["actingBrokerId"] == 2
    assert BrokerMemberGroup.from_json(acting.to_json()) == acting
    assert BrokerMemberGroup("C", "b", {0: "m", 1: "y"}, acting_broker_id=1).lead_broker_id() == 0


def test_topic_config_wrapper_round_trips() -> None:
    wrapper = TopicConfigWrapper(topics("A", "B", perm=4), version(3, state=2))
    assert TopicConfigWrapper.from_json(wrapper.to_json()) == wrapper


def test_acting_choice_waits_for_positions_reported_after_the_master_left(
    table: RouteTable, clock: FakeClock
) -> None:
    """A slave's last heartbeat before the loss can predate the last bytes it got:
    choosing from it and switching on the next report moved consumers and special
    services twice (POP redeliveries).  The table waits for fresh reports."""
    table.register_broker(reg(MASTER, 0, timeout=4000, pos=100))
    table.register_broker(reg(SLAVE1, 1, timeout=4000, pos=90))
    table.register_broker(reg(SLAVE2, 2, timeout=4000, pos=95))
    clock.advance(10)
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    group = table.member_group(CLUSTER, NAME)
    assert group.acting_broker_id == SETTLING and group.lead_broker_id() == SETTLING
    route = table.pickup_route(TOPIC)
    assert route is not None and 0 not in route.broker_datas[0].broker_addrs  # nobody acts
    clock.advance(10)
    # slave 2's stale report said 95, but slave 1 really got to 100: it acts, once
    assert table.broker_heartbeat(CLUSTER, SLAVE2, max_offset=95).notifications == []
    out = table.broker_heartbeat(CLUSTER, SLAVE1, max_offset=100)
    assert [(n.min_broker_id, n.offline_broker_addr) for n in out.notifications] == [(1, MASTER)]
    assert table.member_group(CLUSTER, NAME).lead_broker_id() == 1
    route = table.pickup_route(TOPIC)
    assert route is not None and route.broker_datas[0].broker_addrs[0] == SLAVE1


def test_acting_choice_stops_waiting_for_a_silent_slave(
    table: RouteTable, clock: FakeClock
) -> None:
    table.register_broker(reg(MASTER, 0, timeout=4000, pos=100))
    table.register_broker(reg(SLAVE1, 1, timeout=4000, pos=100))
    table.register_broker(reg(SLAVE2, 2, timeout=4000, pos=100))
    clock.advance(10)
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    table.broker_heartbeat(CLUSTER, SLAVE2, max_offset=100)  # slave 1 is silent
    assert table.member_group(CLUSTER, NAME).lead_broker_id() == SETTLING
    clock.advance(1001)  # a quarter of the heartbeat timeout
    _, notes = table.scan_not_active()
    # chosen from every live slave's latest report, not from the one that reported
    # (another nameserver may have heard slave 1 in time): the lowest id of the
    # furthest; a slave that stays silent expires and the next one acts
    assert [n.min_broker_id for n in notes] == [1]
    assert table.member_group(CLUSTER, NAME).lead_broker_id() == 1


@pytest.mark.parametrize("late", [SLAVE1, SLAVE2])
def test_two_nameservers_hearing_reports_in_opposite_orders_choose_one_slave(
    clock: FakeClock, late: str
) -> None:
    """Issue 34 (5): with two slaves at the same position, the choice took whichever
    slave reported first after the loss, so two nameservers receiving the reports in
    different orders could make two different slaves act.  Here nameserver A hears
    ``late`` only after its settle wait ran out, nameserver B hears both at once; both
    end on one acting slave, the lowest id, and stay on it."""
    a, b = RouteTable(clock), RouteTable(clock)
    for t in (a, b):
        t.register_broker(reg(MASTER, 0, timeout=4000, pos=90))
        t.register_broker(reg(SLAVE1, 1, timeout=4000, pos=90))
        t.register_broker(reg(SLAVE2, 2, timeout=4000, pos=90))
    clock.advance(10)
    early = SLAVE2 if late == SLAVE1 else SLAVE1
    for t in (a, b):
        t.unregister_broker(CLUSTER, MASTER, NAME, 0)  # the master froze: expired
    a.broker_heartbeat(CLUSTER, early, max_offset=100)
    b.broker_heartbeat(CLUSTER, late, max_offset=100)
    b.broker_heartbeat(CLUSTER, early, max_offset=100)
    clock.advance(1001)  # A's settle wait runs out without ``late``'s report
    a.scan_not_active()
    b.scan_not_active()
    clock.advance(1500)  # past half the heartbeat timeout: a choice is sticky now
    a.broker_heartbeat(CLUSTER, late, max_offset=100)
    clock.advance(300)
    for t in (a, b):
        t.broker_heartbeat(CLUSTER, SLAVE1, max_offset=100)
        t.broker_heartbeat(CLUSTER, SLAVE2, max_offset=100)
    assert a.acting_broker_id(NAME) == b.acting_broker_id(NAME) == 1
    assert a.member_group(CLUSTER, NAME).lead_broker_id() == 1
    # a slave the returning master feeds further does not take over (it would deliver
    # again what the acting one delivered)
    for t in (a, b):
        t.broker_heartbeat(CLUSTER, SLAVE2, max_offset=150)
    assert a.acting_broker_id(NAME) == b.acting_broker_id(NAME) == 1


def test_a_restarted_nameserver_lets_no_slave_act_before_its_master_could_register(
    clock: FakeClock,
) -> None:
    """Long campaign seed 1015: a nameserver restarted with an empty table; the slaves'
    registrations reached it before their masters', it chose acting slaves at once, and
    two slaves acted for a second beside their live masters (delayed and transactional
    messages delivered twice).  Now a group whose master this nameserver never saw gets
    no acting slave until one heartbeat timeout after the group's first member
    registered (a starting cluster, whose slaves may start first, too)."""
    table = RouteTable(clock)
    clock.advance(5_000)  # the grace runs from the group's first registration
    timeout = 2_000
    first = table.register_broker(reg(SLAVE2, 2, timeout=timeout))
    second = table.register_broker(reg(SLAVE1, 1, timeout=timeout))
    assert first.notifications == [] and second.notifications == []
    assert table.acting_broker_id(NAME) is None
    assert table.member_group(CLUSTER, NAME).lead_broker_id() == SETTLING
    clock.advance(timeout / 2)
    assert table.settle() == []
    outcome = table.register_broker(reg(MASTER, 0, timeout=timeout))
    assert all(n.min_broker_id == 0 for n in outcome.notifications)
    assert table.member_group(CLUSTER, NAME).lead_broker_id() == 0
    clock.advance(timeout)
    assert table.settle() == []
    assert table.acting_broker_id(NAME) is None

    # the slaves heard of the master at once (they attach to it for replication)
    assert [n.targets for n in outcome.notifications] == [[SLAVE1, SLAVE2]]

    # a master that does not come: its slave acts once the grace is over, and is told
    table = RouteTable(clock)
    table.register_broker(reg(SLAVE1, 1, timeout=timeout))
    clock.advance(timeout + 1)
    notes = table.settle()
    assert [(n.min_broker_id, n.targets, n.offline_broker_addr) for n in notes] == [
        (1, [SLAVE1], None)
    ]
    assert table.acting_broker_id(NAME) == 1
    assert table.member_group(CLUSTER, NAME).lead_broker_id() == 1

    # a master seen since the start and then lost: no grace, the usual choice
    table = RouteTable(clock)
    table.register_broker(reg(MASTER, 0, timeout=timeout))
    table.register_broker(reg(SLAVE1, 1, timeout=timeout))
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert table.acting_broker_id(NAME) == 1


def test_a_master_expired_for_silence_counts_as_away_since_it_was_last_heard(
    table: RouteTable, clock: FakeClock
) -> None:
    # the controller's clock (no_master_ms): a frozen master has been away for its whole
    # silence, not only since the scan noticed it; a closed connection counts from now
    table.register_broker(reg(MASTER, 0, timeout=2000))
    table.register_broker(reg(SLAVE1, 1, timeout=2000))
    assert table.no_master_ms(CLUSTER, NAME) is None
    clock.advance(1000)
    table.register_broker(reg(SLAVE1, 1, timeout=2000))  # the slave keeps heartbeating
    clock.advance(1500)
    expired, _ = table.scan_not_active()
    assert [e.broker_addr for e in expired] == [MASTER]
    assert table.no_master_ms(CLUSTER, NAME) == pytest.approx(2500)
    table.register_broker(reg(MASTER, 0, timeout=2000))
    assert table.no_master_ms(CLUSTER, NAME) is None
    table.unregister_broker(CLUSTER, MASTER, NAME, 0)
    assert table.no_master_ms(CLUSTER, NAME) == 0
