"""What a master's retention waits for: attached slaves, and for a while a slave whose
link closed (a fresh clone under load: a slave resumed after a SIGSTOP found its link
silent and dialled again; in that gap one retention round deleted what it lacked, and
it could never continue)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from broker_agent.replication.ha import HaMaster, SlaveLink
from broker_agent.store import MessageStore, StoreConfig
from ha_controller.rpc import RpcConnection

CFG = StoreConfig(segment_size_bytes=64 * 1024, max_message_size_bytes=16 * 1024)
HOLD_S = 600.0


class Conn:
    """A link's connection, as far as the master's bookkeeping looks at it."""

    closed = False


def attach(master: HaMaster, broker_id: int, acked: int) -> RpcConnection:
    conn = cast(RpcConnection, cast(Any, Conn()))
    master.links[conn] = SlaveLink(conn, f"10.0.0.{broker_id}:1", broker_id, acked, acked, 0.0)
    master.departed.pop(broker_id, None)  # as a new link's first report does
    return conn


def test_a_detached_slave_holds_retention_for_the_hold_then_not(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path, CFG) as store:
        master = HaMaster(store, broker_name="broker-a")
        assert master.retention_floor(HOLD_S) is None  # no slave: time and space alone
        one = attach(master, 1, 5000)
        attach(master, 2, 9000)
        assert master.retention_floor(HOLD_S) == 5000
        master._on_closed(one)  # slave 1's link closes (it froze, it restarts...)
        assert master.links and all(link.broker_id == 2 for link in master.links.values())
        closed_at = master.departed[1][1]
        assert master.retention_floor(HOLD_S, now=closed_at + HOLD_S - 1) == 5000
        assert master.retention_floor(HOLD_S, now=closed_at + HOLD_S) == 9000
        assert 1 not in master.departed  # forgotten once the hold is over
        assert master.retention_floor(0.0) == 9000  # a hold of 0: attached slaves only


def test_a_slave_that_comes_back_holds_by_its_new_link(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path, CFG) as store:
        master = HaMaster(store, broker_name="broker-a")
        master._on_closed(attach(master, 1, 5000))
        assert master.retention_floor(HOLD_S) == 5000
        attach(master, 1, 7000)  # back, further along
        assert master.departed == {}
        assert master.retention_floor(HOLD_S) == 7000


def test_a_second_link_of_the_same_slave_closing_leaves_the_first_in_charge(
    tmp_path: Path,
) -> None:
    with MessageStore.open(tmp_path, CFG) as store:
        master = HaMaster(store, broker_name="broker-a")
        attach(master, 1, 5000)
        stale = cast(RpcConnection, cast(Any, Conn()))
        master.links[stale] = SlaveLink(stale, "10.0.0.1:2", 1, 4000, 4000, 0.0)
        master._on_closed(stale)
        assert master.departed == {}  # the live link holds retention by itself
        assert master.retention_floor(HOLD_S) == 5000
