"""Signatures survive a step of one process's wall clock (issue 34, item 6): the clock
they carry and are checked against is the wall time the process first read, moved on by
the monotonic clock (ha_controller.auth.SteadyWallClock)."""

from __future__ import annotations

import logging

import pytest
from fakes import FakeConn, request_context

from ha_controller.auth import ClusterAuth, SteadyWallClock
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.envelope import RequestAuth
from ha_controller.rpc.connection import RequestContext


class Clocks:
    """A wall clock an operator can step and a monotonic one that only moves on."""

    def __init__(self) -> None:
        self.wall = 1_700_000_000.0
        self.mono = 100.0

    def advance(self, s: float) -> None:
        self.wall += s
        self.mono += s


def ctx(method: int, auth: RequestAuth | None) -> RequestContext:
    return request_context(method, FakeConn("10.0.0.1:1"), timeout_ms=0, auth=auth)


def test_a_step_does_not_move_it_and_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    c = Clocks()
    clock = SteadyWallClock(lambda: c.wall, lambda: c.mono)
    start = clock()
    c.advance(10)
    assert clock() == start + 10_000
    caplog.set_level(logging.WARNING, logger="ha_controller.auth")
    c.wall += 45  # stepped forward
    assert clock() == start + 10_000
    assert clock() == start + 10_000
    steps = [r for r in caplog.records if "stepped by +45.0 s" in r.getMessage()]
    assert len(steps) == 1
    c.wall -= 90  # and back, past where it was
    c.advance(1)
    assert clock() == start + 11_000
    assert any("stepped by -90.0 s" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("stepped", ["sender", "receiver"])
def test_signed_requests_pass_when_one_side_steps(stepped: str) -> None:
    """A nameserver whose clock stepped +45 s refused every heartbeat as stale; with
    each process on its steady clock, neither a sender's nor a receiver's step does."""
    sender, receiver = Clocks(), Clocks()
    send_clock = SteadyWallClock(lambda: sender.wall, lambda: sender.mono)
    recv_clock = SteadyWallClock(lambda: receiver.wall, lambda: receiver.mono)
    a = ClusterAuth("secret", clock_ms=send_clock)
    b = ClusterAuth("secret", clock_ms=recv_clock)
    method = RequestCode.BROKER_HEARTBEAT
    b.check(ctx(method, a.sign(method, b"x")), b"x")
    (sender if stepped == "sender" else receiver).wall += 45
    for _ in range(3):
        sender.advance(1)
        receiver.advance(1)
        b.check(ctx(method, a.sign(method, b"x")), b"x")
    # the raw wall clock would have refused it
    raw = ClusterAuth("secret", clock_ms=lambda: int(receiver.wall * 1000))
    late = ClusterAuth("secret", clock_ms=lambda: int(sender.wall * 1000))
    if stepped == "receiver":
        from ha_controller.protocol.errors import SignatureInvalid

        with pytest.raises(SignatureInvalid, match="synchronise"):
            raw.check(ctx(method, late.sign(method, b"x")), b"x")
