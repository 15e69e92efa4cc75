"""Plain state objects of the transaction and POP services (no sockets)."""

from __future__ import annotations

import pytest

from broker_agent.special.pop import Checkpoint, ReceiptHandle, ReviveState
from broker_agent.special.transaction import HalfProgress, half_to_prepared, half_to_real
from ha_controller.dataversion import DataVersion
from ha_controller.protocol.errors import BadRequest
from ha_controller.protocol.record import StoredMessage


def test_half_progress_advances_over_resolved_prefix_only() -> None:
    p = HalfProgress()
    p.resolve(1, "t1")
    assert not p.advance() and p.half_offset == 0
    p.resolve(0, "t0")
    assert p.advance() and p.half_offset == 2 and p.resolved == set()
    assert p.is_resolved(1) and p.is_resolved(7, "t1") and not p.is_resolved(2, "t2")


def test_half_progress_adopts_newer_or_equal_version_only() -> None:
    master = HalfProgress(half_offset=3, version=DataVersion(0, 5, 1))
    older = HalfProgress(half_offset=9, version=DataVersion(0, 4, 9))
    assert not master.adopt_if_newer(older) and master.half_offset == 3
    slave = HalfProgress(half_offset=8, resolved={10}, version=DataVersion(0, 5, 1))
    slave.resolved_ids["x"] = None
    assert master.adopt_if_newer(slave)
    assert master.half_offset == 8 and master.resolved == {10} and "x" in master.resolved_ids
    assert HalfProgress.from_pb(master.to_pb()).to_dict() == master.to_dict()
    assert HalfProgress.from_dict(master.to_dict()).to_dict() == master.to_dict()


def test_half_message_conversions_keep_the_transaction_id() -> None:
    half = StoredMessage(
        "RMQ_SYS_TRANS_HALF_TOPIC",
        0,
        b"b",
        {"REAL_TOPIC": "T", "REAL_QID": "3", "TRAN_MSG": "true", "UNIQ_KEY": "U"},
        queue_offset=5,
    )
    assert half_to_real(half, 5) == ("T", 3, {"UNIQ_KEY": "U", "TRAN_PREPARED_QUEUE_OFFSET": "5"})
    assert half_to_prepared(half) == ("T", 3, {"UNIQ_KEY": "U", "TRAN_MSG": "true"})


def test_receipt_handle_round_trip_and_key_names_the_broker() -> None:
    h = ReceiptHandle(10, 1000, 5000, 2, False, "broker-a", 1, 12)
    assert ReceiptHandle.decode(h.encode()) == h
    assert h.ck_key("g", "T").startswith("broker-a@g@T@1@10@1000")
    with pytest.raises(BadRequest):
        ReceiptHandle.decode("1 2 3")


def test_revive_state_matches_acks_and_holds_the_commit_offset() -> None:
    ck = Checkpoint("a", "g", "T", 0, 4, (4, 5), 100, 50, 150)
    assert Checkpoint.from_json(ck.to_json()) == ck
    state = ReviveState()
    state.ack(ck.key, 4)  # an ack read before its CK
    state.add_ck(ck, 0, 7)
    state.read_offsets[0] = 9
    assert state.due(149) == [] and state.commit_offset(0) == 7
    [p] = state.due(150)
    assert p.acked == {4}
    state.ack(ck.key, 5)
    assert state.due(1000) == [] and state.commit_offset(0) == 9
