"""What a master's retention waits for: attached slaves, and for a while a slave whose
link closed (a fresh clone under load: a slave resumed after a SIGSTOP found its link
silent and dialled again; in that gap one retention round deleted what it lacked, and
it could never continue)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from fakes import FakeConn

from broker_agent.replication.ha import HaMaster, SlaveLink
from broker_agent.replication.holds import SlaveHolds
from broker_agent.store import MessageStore, StoreConfig
from ha_controller.rpc import RpcConnection

CFG = StoreConfig(segment_size_bytes=64 * 1024, max_message_size_bytes=16 * 1024)
HOLD_MS = 600_000
T0 = 1_800_000_000_000


def attach(master: HaMaster, broker_id: int, acked: int) -> RpcConnection:
    conn = cast(RpcConnection, FakeConn())
    master.links[conn] = SlaveLink(conn, f"10.0.0.{broker_id}:1", broker_id, acked, acked, 0.0)
    master.holds.progressed(broker_id, acked)  # as the link's reports do
    return conn


def floor(holds: SlaveHolds, attached: list[int], now_ms: int, **kw: Any) -> int | None:
    args: dict[str, Any] = {"hold_ms": HOLD_MS, "log_start": 0, "pressed": False, **kw}
    return holds.floor(attached, now_ms=now_ms, **args)


def test_a_detached_slave_holds_retention_for_the_hold_then_not(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path, CFG) as store:
        master = HaMaster(store, broker_name="broker-a")
        assert master.retention_floor(HOLD_MS) is None  # no slave: time and space alone
        one = attach(master, 1, 5000)
        attach(master, 2, 9000)
        assert master.retention_floor(HOLD_MS) == 5000
        master._on_closed(one)  # slave 1's link closes (it froze, it restarts...)
        assert [link.broker_id for link in master.links.values()] == [2]
        seen = master.holds.away[1][1]
        assert master.retention_floor(HOLD_MS, now_ms=seen + HOLD_MS - 1) == 5000
        assert master.retention_floor(HOLD_MS, pressed=True, now_ms=seen) == 9000
        assert master.retention_floor(HOLD_MS, now_ms=seen + HOLD_MS) == 9000
        assert master.holds.away == {}  # forgotten once the hold is over
        master._on_closed(attach(master, 3, 4000))
        assert master.retention_floor(0) == 9000  # a hold of 0: attached slaves only


def test_a_slave_that_comes_back_and_gets_further_ends_its_hold() -> None:
    holds = SlaveHolds()
    holds.detached(1, 5000, T0)
    holds.progressed(1, 5000)  # back, not further yet: the hold stays
    assert floor(holds, [5000], T0) == 5000 and 1 in holds.away
    holds.progressed(1, 7000)
    assert holds.away == {}
    assert floor(holds, [7000], T0) == 7000


def test_a_crash_looping_slave_keeps_the_time_it_was_first_seen_away() -> None:
    holds = SlaveHolds()
    for minute in range(0, 40, 5):  # back and gone every 5 minutes, never further
        holds.detached(1, 5000, T0 + minute * 60_000)
    assert floor(holds, [], T0 + HOLD_MS - 1) == 5000
    assert floor(holds, [], T0 + HOLD_MS) is None


def test_a_hold_below_the_logs_start_is_dropped() -> None:
    holds = SlaveHolds()
    holds.detached(1, 5000, T0)
    assert floor(holds, [], T0, log_start=65536) is None  # it cannot continue anyway
    assert holds.away == {}


def test_a_second_link_of_the_same_slave_closing_leaves_the_first_in_charge(
    tmp_path: Path,
) -> None:
    with MessageStore.open(tmp_path, CFG) as store:
        master = HaMaster(store, broker_name="broker-a")
        attach(master, 1, 5000)
        stale = cast(RpcConnection, FakeConn())
        master.links[stale] = SlaveLink(stale, "10.0.0.1:2", 1, 4000, 4000, 0.0)
        master._on_closed(stale)
        assert master.holds.away == {}  # the live link holds retention by itself
        assert master.retention_floor(HOLD_MS) == 5000


def test_the_positions_outlive_a_restart_of_the_master(tmp_path: Path) -> None:
    path = tmp_path / "slave_holds.json"
    holds = SlaveHolds(path)
    holds.detached(2, 3000, T0)
    holds.keep({1: 5000}, T0 + 1000)
    holds.persist()
    again = SlaveHolds(path)  # the restarted master: both slaves away
    again.load()
    assert again.away == {1: (5000, T0 + 1000), 2: (3000, T0)}
    assert floor(again, [], T0 + HOLD_MS) == 5000  # 2's hold ran out, 1's did not
    missing = SlaveHolds(tmp_path / "missing.json")
    missing.load()
    assert missing.away == {}


@pytest.mark.parametrize("text", ["{not json", '{"1": 5000}', "[]"])
def test_an_unreadable_file_is_set_aside_and_holds_nothing(tmp_path: Path, text: str) -> None:
    path = tmp_path / "slave_holds.json"
    path.write_text(text)
    holds = SlaveHolds(path)
    holds.load()
    assert holds.away == {} and holds.lost
    assert (tmp_path / "slave_holds.json.corrupt").read_text() == text
