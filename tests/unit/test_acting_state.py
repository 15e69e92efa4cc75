"""The broker's acting-master state machine and versioned consumer offsets."""

from __future__ import annotations

from pathlib import Path

from broker_agent.membership.acting import ActingState
from broker_agent.metadata.offsets import ConsumerOffsetManager
from ha_controller.dataversion import DataVersion


def test_lowest_slave_acts_while_master_is_gone_and_stops_when_it_returns() -> None:
    s = ActingState(broker_id=1, enable_slave_acting_master=True)
    s.master_addr = "m:1"
    d = s.on_min_broker_change(0, "m:1")
    assert s.role == "slave" and not d.start_special_services
    d = s.on_min_broker_change(1, "s1:1", offline_addr="m:1")
    assert d.start_special_services and d.master_offline
    assert s.acting and s.serves_master_only_ops and s.role == "acting"
    assert s.master_addr is None
    assert not s.on_min_broker_change(1, "s1:1").changed  # repeated view: no-op
    d = s.on_min_broker_change(0, "m:1", master_ha_addr="m:2")
    assert d.stop_special_services and d.master_online
    assert not s.acting and s.master_addr == "m:1" and s.master_ha_addr == "m:2"


def test_higher_slave_never_acts_and_master_ignores_changes() -> None:
    s2 = ActingState(broker_id=2, enable_slave_acting_master=True)
    d = s2.on_min_broker_change(1, "s1:1", offline_addr="m:1")
    assert d.changed and not d.start_special_services and not s2.acting
    assert not s2.serves_master_only_ops
    # slave 1 gone too: slave 2 is now the lowest
    assert s2.on_min_broker_change(2, "s2:1").start_special_services
    master = ActingState(broker_id=0, enable_slave_acting_master=True)
    assert not master.on_min_broker_change(1, "s1:1").changed
    assert master.serves_master_only_ops


def test_a_returning_master_holds_the_acting_slave_until_it_registers() -> None:
    now = [100.0]
    s = ActingState(broker_id=1, enable_slave_acting_master=True, clock=lambda: now[0])
    assert s.on_min_broker_change(1, "s1:1", offline_addr="m:1").start_special_services
    d = s.hold(20)
    assert d.changed and d.stop_special_services
    assert not s.acting and s.chosen and not s.serves_master_only_ops
    assert s.role == "acting"  # still the group's lead for the nameserver and dashboards
    now[0] += 10
    d = s.hold(20)  # the master asks again: renewed, nothing more to stop
    assert not d.changed and not d.stop_special_services
    now[0] += 15
    assert not s.release_expired_hold().changed  # renewed at 110: holds until 130
    d = s.on_min_broker_change(0, "m:1")  # the master registered
    assert d.master_online and not d.stop_special_services  # already stopped
    assert s.held_until is None and not s.acting and s.role == "slave"


def test_a_hold_that_runs_out_makes_the_slave_act_again() -> None:
    now = [0.0]
    s = ActingState(broker_id=1, enable_slave_acting_master=True, clock=lambda: now[0])
    s.on_min_broker_change(1, "s1:1", offline_addr="m:1")
    s.hold(20)
    now[0] = 19.9
    assert not s.release_expired_hold().changed
    now[0] = 20.0  # the master froze or died again in its pre-online
    d = s.release_expired_hold()
    assert d.start_special_services and s.acting
    assert not s.release_expired_hold().changed


def test_only_the_chosen_slave_holds() -> None:
    s2 = ActingState(broker_id=2, enable_slave_acting_master=True)
    s2.on_min_broker_change(1, "s1:1", offline_addr="m:1")
    assert not s2.hold(20).changed and s2.held_until is None
    master = ActingState(broker_id=0, enable_slave_acting_master=True)
    assert not master.hold(20).changed and master.acting is False and master.is_master


def test_disabled_acting_master_never_acts() -> None:
    s = ActingState(broker_id=1, enable_slave_acting_master=False)
    assert not s.on_min_broker_change(1, "s1:1").changed
    assert not s.acting


def test_offsets_version_moves_every_step_and_persists(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    m = ConsumerOffsetManager(path, version_step=3)
    v0 = m.data_version.copy()
    m.commit("g", "t", 0, 1)
    m.commit("g", "t", 0, 2)
    assert m.data_version.counter == v0.counter
    m.commit("g", "t", 1, 5)
    assert m.data_version.counter == v0.counter + 1
    m.persist()
    again = ConsumerOffsetManager(path, version_step=3)
    again.load()
    assert again.query("g", "t", 0) == 2 and again.query("g", "t", 1) == 5
    assert again.query("g", "t", 9) == -1
    assert again.data_version.key() == m.data_version.key()


def test_reverse_sync_adopts_newer_or_equal_versions_only(tmp_path: Path) -> None:
    master = ConsumerOffsetManager(tmp_path / "m.json", version_step=500)
    master.commit("g", "t", 0, 10)
    base = master.data_version.copy()
    # the slave got the master's version by forward sync, then consumed 32 more
    # messages while acting: fewer than a step, so the version is unchanged (a tie)
    assert master.adopt_if_newer([("g", "t", 0, 42)], base.copy())
    assert master.query("g", "t", 0) == 42
    older = DataVersion(base.state_version, base.counter - 1, base.timestamp_ms)
    assert not master.adopt_if_newer([("g", "t", 0, 7)], older)
    assert master.query("g", "t", 0) == 42
    newer = DataVersion(base.state_version, base.counter + 1, 0)
    assert master.adopt_if_newer([("g", "t", 1, 3)], newer)
    assert master.query("g", "t", 0) == 42 and master.query("g", "t", 1) == 3  # merged


def test_a_fresh_table_is_oldest_and_acting_bumps_at_once(tmp_path: Path) -> None:
    fresh = ConsumerOffsetManager(None, version_step=500)
    assert fresh.data_version.key() == (0, 0, 0)
    acting = ConsumerOffsetManager(None, version_step=500)
    acting.bump_on_next_commit()
    acting.commit("g", "t", 0, 32)
    assert acting.data_version.counter == 1  # moved although 1 < step
    acting.commit("g", "t", 0, 33)
    assert acting.data_version.counter == 1
    # a returning master that lost its file adopts the acting slave's table
    assert fresh.adopt_if_newer(acting.entries(), acting.data_version.copy())
    assert fresh.query("g", "t", 0) == 33


def test_a_returning_master_keeps_its_link_through_views_that_list_no_master() -> None:
    """Fresh-clone run (test_retention, on a loaded machine): the slave started first and
    assumed id 0; the master, isolated in pre-online, told it its HA address; 10 ms later
    the slave's first view (no master listed: the master is not registered while it
    syncs) made it drop that address, and the pre-online waited 10 s for the slave's HA
    link before trying again."""
    now = [0.0]
    s = ActingState(broker_id=1, enable_slave_acting_master=True, clock=lambda: now[0])
    s.returning_master("m:1", "m:2", 20)
    d = s.on_min_broker_change(-1, None)  # the nameserver waits for the slaves' positions
    assert d.changed and not d.master_offline
    assert (s.master_addr, s.master_ha_addr) == ("m:1", "m:2")
    # chosen to act meanwhile (the master's pre-online outlasted the nameserver's grace):
    # it acts, and still replicates from the master that will hold it
    d = s.on_min_broker_change(1, "s1:1", offline_addr="m:1")
    assert d.start_special_services and not d.master_offline and s.master_ha_addr == "m:2"
    d = s.on_min_broker_change(0, "m:1", master_ha_addr="m:2")  # it registered
    assert d.master_online and d.stop_special_services and s.returning_until is None
    # a master that contacted the slave and then never registered is let go after the hold
    s.returning_master("m:1", "m:2", 20)
    now[0] = 20.0
    d = s.on_min_broker_change(1, "s1:1", offline_addr="m:1")
    assert d.master_offline and s.master_ha_addr is None and s.master_addr is None
