"""Which members the pre-online of a member just elected master takes tables from
(``broker_agent.membership.preonline.sync_sources``), and which slave the runner
remembers as acting across the rebuild (``broker_agent.runner.acting_slave_of``).

The ``controller-flap`` campaign, seed 3307: member 0 acted while the master was
away, the controller elected member 2, and member 0, whose id changes with the master
(ids 0 and the master's swap), was rebuilt under its new id at the same moment.  No
nameserver listed it when member 2's pre-online read the group (``pre-online: 0
slave(s) synced``): member 2 served its own tables, and delivered again a delay level
it had delivered before it was killed (its table file was older than that delivery;
member 0's held it).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

from broker_agent.membership.acting import ActingState
from broker_agent.membership.preonline import sync_sources
from broker_agent.runner import acting_slave_of
from broker_agent.service import BrokerService
from ha_controller.routing import BrokerMemberGroup

ME = "127.0.0.1:43405"
ACTED = "127.0.0.1:40851"


def group(addrs: dict[int, str], acting: int | None = None) -> BrokerMemberGroup:
    return BrokerMemberGroup("C", "broker-a", dict(addrs), acting_broker_id=acting)


def test_the_slave_that_acted_is_synced_though_no_nameserver_lists_it() -> None:
    slaves, unlisted = sync_sources(group({}), 0, ME, (1, ACTED))
    assert (slaves, unlisted) == ([], (1, ACTED))
    # member 1 is listed, the slave that acted (member 0, rebuilt) is not
    slaves, unlisted = sync_sources(group({1: "127.0.0.1:1"}), 0, ME, (1, ACTED))
    assert (slaves, unlisted) == ([(1, "127.0.0.1:1")], (1, ACTED))


def test_a_listed_acting_slave_is_synced_once_and_last() -> None:
    g = group({2: ACTED, 1: "127.0.0.1:1", 0: ME}, acting=2)
    slaves, unlisted = sync_sources(g, 0, ME, (1, ACTED))
    assert slaves == [(1, "127.0.0.1:1"), (2, ACTED)]
    assert unlisted is None
    assert sync_sources(group({}), 0, ME, None) == ([], None)
    assert sync_sources(group({}), 0, ME, (1, ME)) == ([], None)  # this member acted


def service_with(acting: ActingState) -> BrokerService:
    return cast(BrokerService, SimpleNamespace(core=SimpleNamespace(acting=acting)))


def test_the_runner_remembers_the_acting_slave_a_slave_was_told_of() -> None:
    slave = ActingState(2, True)
    assert acting_slave_of(service_with(slave)) is None  # the master was online
    slave.on_min_broker_change(1, ACTED, None, None)  # member 0, id 1 now, acts
    assert acting_slave_of(service_with(slave)) == (1, ACTED)
    itself = ActingState(1, True)
    itself.on_min_broker_change(1, ACTED, None, None)
    assert acting_slave_of(service_with(itself)) is None  # its own tables are the truth
