"""POP's plain records: receipt handles, checkpoints and the revive state (no sockets)."""

from __future__ import annotations

import pytest

from broker_agent.special.pop import Checkpoint, ReceiptHandle, ReviveState
from ha_controller.protocol.errors import BadRequest


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
