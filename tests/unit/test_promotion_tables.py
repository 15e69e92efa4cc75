"""What a member elected master (controller mode) takes as its tables, and what an
acting slave hands over when its service is rebuilt (issue 33, campaign defects (a) and
(b); docs/failover.md, "Automatic master switch").

- A member elected master takes every higher consumer-offset entry of every member,
  whatever the versions: a table whose version moved on (an acting slave took it over,
  the old master's counter stepped) may still lack the last commits of a later master
  (campaign: ``consumer offsets of slave 1 older, kept ours`` and 15 redeliveries).
- A slave that acts, or is held by the master that contacted it, still applies the
  replicated commits that move an entry forward (they were dropped).
- An acting slave whose service is rebuilt stops acting for good first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fakes import FakeClock

from broker_agent.membership.acting import ActingState
from broker_agent.membership.roles import Role
from broker_agent.metadata.forward import ForwardSync
from broker_agent.metadata.offsets import ConsumerOffsetManager, consumer_offset_sync
from broker_agent.metadata.topics import TopicConfigManager
from broker_agent.pull_hold import PullHoldService
from broker_agent.store.types import Dispatched
from ha_controller.controller.state import GroupState
from ha_controller.dataversion import DataVersion
from ha_controller.protocol.properties import OFFSET_TOPIC
from ha_controller.protocol.record import StoredMessage
from ha_controller.rpc import ConnectionPool


def test_an_elected_master_takes_the_higher_entries_of_a_newer_table(tmp_path: Path) -> None:
    elected = ConsumerOffsetManager(tmp_path / "e.json", version_step=1)
    elected.commit("g", "t", 0, 20)  # the last master's commit, replicated here
    elected.commit("g", "t", 1, 5)
    ours = elected.data_version.copy()
    # a member whose table outranks ours by its version, without that last commit
    newer = DataVersion(ours.state_version, ours.counter + 5, ours.timestamp_ms)
    table = consumer_offset_sync(elected)
    assert table.adopt_on_promotion(([("g", "t", 0, 10), ("g", "t", 1, 7)], newer))
    assert (elected.query("g", "t", 0), elected.query("g", "t", 1)) == (20, 7)
    assert elected.data_version.key() == newer.key()  # ours outranks theirs from now on
    # the version comparison of a RIP-32 return takes the member's 10 over our 20
    returning = ConsumerOffsetManager(None, version_step=1)
    returning.commit("g", "t", 0, 20)
    v = returning.data_version
    returning.adopt_if_newer([("g", "t", 0, 10)], DataVersion(v.state_version, v.counter + 1, 0))
    assert returning.query("g", "t", 0) == 10


def test_an_elected_master_caps_an_entry_at_its_queue_end(tmp_path: Path) -> None:
    elected = ConsumerOffsetManager(tmp_path / "e.json", version_step=1)
    elected.commit("g", "t", 0, 3)
    table = consumer_offset_sync(elected, queue_end=lambda topic, qid: 8)
    assert table.adopt_on_promotion(([("g", "t", 0, 12)], DataVersion(0, 0, 0)))
    assert elected.query("g", "t", 0) == 8
    assert not table.adopt_on_promotion(([("g", "t", 0, 2)], DataVersion(9, 9, 9)))
    assert elected.query("g", "t", 0) == 8


@dataclass
class Store:
    records: dict[int, StoredMessage] = field(default_factory=dict)

    def get_message_at(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        return self.records.get(offset) if topic == OFFSET_TOPIC else None

    def max_offset(self, topic: str, queue_id: int) -> int:
        return 100


@dataclass
class Slave:
    acting: ActingState
    pool: ConnectionPool
    topics: TopicConfigManager
    offsets: ConsumerOffsetManager
    store: Store
    holds: PullHoldService


async def _noop() -> None:
    return None


async def test_a_held_acting_slave_applies_a_newer_replicated_commit() -> None:
    acting = ActingState(1, True)
    acting.on_min_broker_change(1, "s1:1")  # acting for the lost master
    assert acting.chosen
    async with ConnectionPool() as pool:
        slave = Slave(
            acting,
            pool,
            TopicConfigManager(None),
            ConsumerOffsetManager(None),
            Store(),
            PullHoldService(10, lambda: 0),
        )
        slave.offsets.commit("g", "t", 0, 30)  # taken while acting
        acting.hold(20.0)  # the (returning or elected) master contacted us
        sync = ForwardSync(slave, [], {}, _noop)
        for offset, value in enumerate((25, 41)):  # its old tail, then a new commit
            props = {"G": "g", "T": "t", "Q": "0", "O": str(value)}
            slave.store.records[offset] = StoredMessage(OFFSET_TOPIC, 0, b"", props)
            sync.on_dispatched([Dispatched(OFFSET_TOPIC, 0, offset, 0, 0, 0, 0)])
        # never back to the old tail's 25; on to the new master's 41
        assert slave.offsets.query("g", "t", 0) == 41


def test_a_rebuilt_acting_slave_stops_acting_for_good() -> None:
    clock = FakeClock(0.0)
    s = ActingState(1, True, clock=clock)
    s.on_min_broker_change(1, "s1:1")
    assert s.acting and s.serves_master_only_ops
    d = s.hand_over()
    assert d.changed and d.stop_special_services
    assert not s.acting and not s.serves_master_only_ops
    s.hold(0.05)  # a returning master's contact does not shorten a hand-over's hold
    clock.now = 1e9
    assert not s.release_expired_hold().changed and not s.acting
    plain = ActingState(2, True)
    plain.on_min_broker_change(1, "s1:1")
    assert not plain.hand_over().changed


def test_a_slave_does_not_act_for_a_member_elected_moments_ago() -> None:
    def role(epoch: int, master: int, learnt_at: float) -> Role:
        state = GroupState("c", "g", epoch, master, frozenset({master, 2}))
        return Role(state.route_id(2), True, state, learnt_at=learnt_at)

    # member 1 was elected 0.3 s ago: it is being rebuilt as master, member 2 waits
    assert role(2, 1, 10.0).elected_elsewhere(2, 10.3, 2000) is not None
    assert role(2, 1, 10.0).elected_elsewhere(2, 12.0, 2000) is None  # it may be gone
    assert role(1, 0, 10.0).elected_elsewhere(2, 10.3, 2000) is None  # not an election
    assert role(2, 2, 10.0).elected_elsewhere(2, 10.3, 2000) is None  # us
    assert Role(2).elected_elsewhere(2, 10.3, 2000) is None  # no controller
