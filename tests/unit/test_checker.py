"""Checker verdicts on hand-made histories, one per anomaly; plus the history file format.

``CASES`` is shared with ``tests/pipeline/test_verdict_spark.py``, which asserts that the
Spark pipeline produces the same verdict JSON for every case.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from ha_controller.drills.checker import (
    COUNT_NAMES,
    FAILING_COUNTS,
    CheckOptions,
    Durability,
    FaultWindow,
    Verdict,
    availability_summary,
    check,
    no_writable_master_spans,
    unavailability_windows,
)
from ha_controller.drills.history import (
    Ack,
    EndTx,
    EpochChange,
    Event,
    EventType,
    Fault,
    HistoryError,
    HistoryWriter,
    Lock,
    OffsetCommit,
    OffsetProbe,
    Receive,
    Role,
    SendInvoke,
    SendOk,
    SendOutcome,
    StoreMode,
    Subscribe,
    Unlock,
    read_history,
)
from ha_controller.drills.workloads import record_read_outcome


@dataclass
class H:
    """Builds a history tersely."""

    events: list[Event] = field(default_factory=list)
    _offsets: dict[str, int] = field(default_factory=dict)

    def add(self, t: int, process: str, type_: EventType, value: Any) -> H:
        self.events.append(Event.of(t, process, type_, value))
        return self

    def send(
        self,
        t: int,
        key: str,
        *,
        topic: str = "T",
        outcome: Literal["ok", "fail", "info"] | None = "ok",
        done_t: int | None = None,
        group: str | None = None,
        tx: bool | None = None,
        delay_ms: int | None = None,
        delay_level: int | None = None,
        due_ts_ms: int | None = None,
        broker: str = "broker-a",
        epoch: int | None = None,
        member: int | None = None,
    ) -> H:
        self.add(
            t,
            "producer",
            "invoke",
            SendInvoke(key, topic, group, delay_level, delay_ms, due_ts_ms, tx),
        )
        done = t + 5 if done_t is None else done_t
        if outcome == "ok":
            qo = self._offsets.get(topic, 0)
            self._offsets[topic] = qo + 1
            ok = SendOk(key, f"ID-{key}", broker, 0, qo, epoch, member)
            self.add(done, "producer", "ok", ok)
        elif outcome in ("fail", "info"):
            self.add(done, "producer", outcome, SendOutcome(key, "timeout"))
        return self

    def recv(
        self,
        t: int,
        key: str,
        *,
        cg: str = "G",
        consumer: str = "c1",
        qo: int = 0,
        broker: str = "broker-a",
        corrupt: bool | None = None,
    ) -> H:
        value = Receive(key, f"ID-{key}", broker, 0, qo, consumer, cg, corrupt=corrupt)
        return self.add(t, consumer, "ok", value)


def counts(**nonzero: int) -> dict[str, int]:
    out = dict.fromkeys(COUNT_NAMES, 0)
    out.update(nonzero)
    return out


def case_clean() -> H:
    h = H()
    h.add(0, "nemesis", "info", Role("broker-a", 0, "master"))
    h.add(0, "c1", "info", Subscribe("c1", "G", "T"))
    for i in range(3):
        h.send(10 * i, f"k{i}", group="g1", done_t=10 * i + 5)
    for i in range(3):
        h.recv(100 + i, f"k{i}", qo=i)
    h.add(200, "nemesis", "info", Fault("kill", "broker-a/0"))
    h.send(210, "k3")
    h.recv(250, "k3", qo=3)
    h.add(400, "nemesis", "ok", Fault("kill", "broker-a/0"))
    return h


def case_lost() -> H:
    h = H()
    for i in range(3):
        h.send(i, f"k{i}")
    h.recv(10, "k0").recv(11, "k2")
    # a second subscribed group that received nothing: each acked key is lost for it too
    h.add(0, "c9", "info", Subscribe("c9", "G2", "T"))
    return h


def case_duplicated() -> H:
    h = H().send(0, "k0").send(1, "k1")
    h.recv(10, "k0").recv(11, "k0", consumer="c2").recv(12, "k0")
    h.recv(13, "k0", cg="G2").recv(14, "k1", cg="G2").recv(15, "k1")
    return h


def case_unexpected() -> H:
    h = H().send(0, "k0")
    h.recv(10, "k0").recv(11, "ghost").recv(12, "ghost")
    return h


def case_recovered() -> H:
    h = H()
    h.send(0, "k-info", outcome="info")
    h.send(1, "k-fail", outcome="fail")
    h.send(2, "k-none", outcome=None)
    h.send(3, "k-info-lost", outcome="info")
    h.recv(10, "k-info").recv(11, "k-fail").recv(12, "k-none")
    return h


def case_order() -> H:
    h = H()
    for i, t in enumerate((10, 20, 30, 40)):
        h.send(t - 5, f"k{i}", group="g1", done_t=t)
    h.send(1, "other", group="g2", done_t=50)
    # c1 gets k0, k2, k1 (violation), k3, then k0 again (a duplicate, not an order violation)
    h.recv(100, "k0", qo=0).recv(101, "k2", qo=2).recv(102, "k1", qo=1).recv(103, "k3", qo=3)
    h.recv(104, "k0", qo=0)
    # a batch at one instant is ordered by queue offset: no violation for c2
    for i in (3, 2, 1, 0):
        h.recv(200, f"k{i}", qo=i, consumer="c2", cg="G2")
    h.recv(105, "other", qo=9)  # other message group: independent stream
    return h


def case_late_delayed() -> H:
    h = H()
    h.send(0, "late", delay_ms=5_000)  # due 5000, tolerance 1000
    h.send(0, "on-time", due_ts_ms=5_000)
    h.send(0, "level", delay_level=1)  # due 1000, tolerance 4000
    h.send(0, "level-late", delay_level=2)  # due 5000, tolerance 4000
    h.send(0, "early", delay_ms=5_000)
    h.send(0, "dup-first-ok", delay_ms=1_000)
    h.recv(6_500, "late").recv(5_800, "on-time").recv(4_500, "level")
    h.recv(9_001, "level-late").recv(4_000, "early")
    h.recv(1_100, "dup-first-ok").recv(9_000, "dup-first-ok", consumer="c2")
    return h


def case_transactions() -> H:
    h = H()
    for key in ("commit", "rollback", "unended", "commit-lost", "unended-delivered"):
        h.send(0, key, tx=True)
    h.add(10, "producer", "ok", EndTx("commit", True))
    h.add(11, "producer", "ok", EndTx("rollback", False))
    h.add(12, "producer", "ok", EndTx("commit-lost", True, via="check"))
    h.add(13, "producer", "info", EndTx("unended", True))  # unknown outcome: not resolved
    h.recv(20, "commit").recv(21, "rollback").recv(22, "unended-delivered")
    return h


def case_rollback_unknown() -> H:
    """Issue 17: a rollback whose END_TRANSACTION outcome the client never learnt (the
    broker had applied it, so it never checked back) is rolled back, not unresolved;
    an unknown commit still is unresolved, and a delivery after an unknown rollback is
    unexpected."""
    h = H()
    for key in ("rb-unknown", "commit-unknown", "rb-unknown-delivered"):
        h.send(0, key, tx=True)
    h.add(10, "producer", "invoke", EndTx("rb-unknown", False))
    h.add(11, "producer", "info", EndTx("rb-unknown", False))
    h.add(12, "producer", "info", EndTx("commit-unknown", True))
    h.add(13, "producer", "info", EndTx("rb-unknown-delivered", False))
    h.recv(20, "rb-unknown-delivered")
    return h


def case_double_lock() -> H:
    h = H()
    mq = "T/broker-a/0"
    h.add(0, "c1", "ok", Lock("c1", "G", mq, True))
    h.add(10_000, "c2", "ok", Lock("c2", "G", mq, True))  # c1 still holds: double grant
    h.add(12_000, "c2", "ok", Unlock("c2", "G", mq, "unlock"))
    h.add(15_000, "c1", "invoke", Unlock("c1", "G", mq))
    h.add(20_000, "c3", "ok", Lock("c3", "G", mq, True))  # both released: fine
    h.add(25_000, "c3", "ok", Lock("c3", "G", mq, True))  # own renewal: fine
    h.add(26_000, "c4", "ok", Lock("c4", "G", mq, False))  # refused: not a grant
    h.add(27_000, "x1", "ok", Lock("x1", "OTHER", mq, True))  # another consumer group
    h.add(60_000, "c4", "ok", Lock("c4", "G", mq, True))  # c3's lease ended at 55_000
    return h


def case_offset_rollback() -> H:
    h = H()
    mq = "T/broker-a/0"
    h.add(10, "c1", "ok", OffsetCommit("G", mq, 100))
    h.add(20, "c1", "ok", OffsetCommit("G", mq, 120))
    h.add(25, "c1", "fail", OffsetCommit("G", mq, 200))
    h.add(5, "probe", "ok", OffsetProbe("G", mq, 0))
    h.add(15, "probe", "ok", OffsetProbe("G", mq, 100))
    h.add(30, "probe", "ok", OffsetProbe("G", mq, 110, "broker-a"))  # rollback
    h.add(31, "probe", "ok", OffsetProbe("G2", mq, 0))
    return h


def case_late_without_a_writable_master() -> H:
    """broker-a's master is killed from 1000 to 6000 and broker-b's disk is full from
    2000 to 4000: from 2000 to 4000 no master takes writes, and that time does not count
    against a delayed message due before it or in it.  Campaign seed 3001: a partition
    and a full disk at once; long campaign seed 1011: a message due as its master froze,
    whose acting slave could not escape it because the other group's disk filled."""
    h = H()
    h.add(1_000, "nemesis", "info", Fault("kill", "broker-a/0"))
    h.add(2_000, "nemesis", "info", Fault("disk", "broker-b/0"))
    h.send(0, "held", delay_ms=2_500)  # due 2500: held to 4000, delivered 4800: on time
    h.send(0, "held-late", delay_ms=3_000)  # held to 4000, delivered 5100: late
    h.send(0, "one-down", delay_ms=500, broker="broker-b")  # only broker-a down: late
    # due 1800, delivered 4500: 2700 ms, of which 2000 without a writable master: on time
    h.send(0, "due-before", delay_ms=1_800)
    h.send(0, "unacked", delay_ms=1_000, outcome="info")  # never acknowledged: not judged
    h.send(4_100, "after", broker="broker-b")
    h.recv(4_800, "held").recv(5_100, "held-late").recv(1_600, "one-down", broker="broker-b")
    h.recv(4_500, "due-before")
    h.recv(9_000, "unacked").recv(4_200, "after", broker="broker-b")
    h.add(4_000, "nemesis", "ok", Fault("disk", "broker-b/0"))
    h.add(6_000, "nemesis", "ok", Fault("kill", "broker-a/0"))
    return h


def case_fault_recovery() -> H:
    h = H()
    h.send(0, "k0").recv(50, "k0")
    h.add(1_000, "nemesis", "invoke", Fault("kill", "broker-a/0"))
    h.add(1_000, "nemesis", "info", Fault("kill", "broker-a/0", "SIGKILL"))
    h.send(1_005, "k1", outcome="info", done_t=1_500)
    h.send(1_600, "k2", done_t=3_000)
    h.recv(4_000, "k2")
    h.add(5_000, "nemesis", "ok", Fault("kill", "broker-a/0"))
    h.add(5_100, "nemesis", "info", Fault("pause", "broker-b/1"))
    return h


# --- availability: a 3 s write and read gap on one group while the other keeps going ------

GAP_START = 2_000  # broker-a is partitioned from here ...
GAP_END = 5_000  # ... to here; broker-b acknowledges throughout
SEND_EVERY = 50  # sends alternate broker-a (even slots) and broker-b (odd slots)
RECV_LAG = 30


def send_event(t: int, type_: EventType, key: str, **value: Any) -> Event:
    """A ``send`` event with keys beyond the history dataclasses: the target ``broker`` on
    an invoke or a failure (the schema addition the availability windows need)."""
    return Event(t, "producer", type_, "send", {"key": key, **value})


def case_group_gap() -> H:
    """Sends to broker-a fail, time out or go unanswered for 3 s (each attributed by a
    different path) and pulls from it fail; broker-b acknowledges and delivers meanwhile.
    A second fault later sees no trouble: its epoch does not inherit the first one's."""
    h = H()
    h.add(0, "c1", "info", Subscribe("c1", "G", "T"))
    h.add(GAP_START, "nemesis", "info", Fault("partition", "broker-a/0", "link down"))
    h.add(GAP_END, "nemesis", "ok", Fault("partition", "broker-a/0"))
    h.add(7_000, "nemesis", "info", Fault("kill", "broker-b/1", "kill -9"))
    h.add(7_500, "nemesis", "ok", Fault("kill", "broker-b/1"))
    offsets = {"broker-a": 0, "broker-b": 0}
    for i in range(8_000 // SEND_EVERY):
        t = i * SEND_EVERY
        broker = "broker-a" if i % 2 == 0 else "broker-b"
        key = f"k{i}"
        h.events.append(send_event(t, "invoke", key, topic="T", broker=broker))
        if broker == "broker-a" and GAP_START <= t < GAP_END:
            if i % 3 == 0:  # refused: the failure names its broker
                h.events.append(send_event(t + 1, "fail", key, error="refused", broker=broker))
            elif i % 3 == 1:  # timed out: attributed through the invoke's broker
                h.events.append(send_event(t + 400, "info", key, error="timeout"))
            # i % 3 == 2: never answered (a failure at its invoke)
            continue
        h.add(t + 5, "producer", "ok", SendOk(key, f"ID-{key}", broker, 0, offsets[broker]))
        h.recv(t + 5 + RECV_LAG, key, qo=offsets[broker], broker=broker)
        offsets[broker] += 1
    # a send to broker-a in flight at the partition, timed out after it: clamped to the start
    h.events.append(send_event(GAP_START - 10, "invoke", "hung", topic="T", broker="broker-a"))
    h.events.append(send_event(GAP_START + 2_990, "info", "hung", error="timeout"))
    # a failure that names no broker at all: the cluster sees it, no group can
    h.events.append(send_event(3_000, "invoke", "anon", topic="T"))
    h.events.append(send_event(3_100, "info", "anon", error="timeout"))
    # pulls from broker-a fail from the partition on (polls: no key)
    for t in range(GAP_START, GAP_END, 200):
        h.events.append(
            Event(
                t,
                "c1",
                "fail",
                "receive",
                {"consumer": "c1", "consumer_group": "G", "broker": "broker-a", "error": "timeout"},
            )
        )
    return h


def _gap_acked() -> int:
    slots = range(8_000 // SEND_EVERY)
    return sum(1 for i in slots if i % 2 or not GAP_START <= i * SEND_EVERY < GAP_END)


# first broker-a send issued at or after the partition: slot 40 (t=2000) fails; the first
# one issued after it that succeeds is slot 100 (t=5000, ok at 5005, delivered at 5035)
GAP_FAULTS = (
    FaultWindow(
        "partition",
        "broker-a/0",
        GAP_START,
        GAP_END,
        # cluster write: broker-b's send issued at 2050 is acknowledged at 2055
        55,
        # cluster read: broker-b's delivery at 2085 (sent 2050)
        85,
        {"broker-a": 3_005, "broker-b": 0},
        {"broker-a": 3_035, "broker-b": 0},
        unattributed_write_failures=1,
    ),
    # a slave of broker-b killed: broker-b must show an ok issued after 7000 (7050 -> 7055)
    FaultWindow(
        "kill",
        "broker-b/1",
        7_000,
        7_500,
        0,
        0,
        {"broker-a": 0, "broker-b": 55},
        {"broker-a": 0, "broker-b": 0},
    ),
)


def _attributed_send(h: H, t: int, key: str, outcome: EventType, done_t: int, broker: str) -> None:
    h.events.append(send_event(t, "invoke", key, topic="T", broker=broker))
    if outcome == "ok":
        h.add(done_t, "producer", "ok", SendOk(key, f"ID-{key}", broker, 0, t))
    else:
        h.events.append(send_event(done_t, outcome, key, broker=broker))


def case_targeted_no_failures() -> H:
    """broker-a's master is killed and no send fails: the producer just stops sending
    to broker-a until the master is back (what a loopback kill drill records)."""
    h = H()
    for i in range(0, 10_000, 100):
        _attributed_send(h, i, f"b{i}", "ok", i + 3, "broker-b")
    _attributed_send(h, 900, "a-before", "ok", 903, "broker-a")
    h.add(1_000, "nemesis", "info", Fault("kill", "broker-a/0"))
    h.add(6_000, "nemesis", "ok", Fault("kill", "broker-a/0"))
    h.add(7_000, "nemesis", "info", Fault("pause", "nameserver"))
    _attributed_send(h, 6_500, "a-back", "ok", 6_504, "broker-a")
    _attributed_send(h, 7_500, "a-later", "ok", 7_501, "broker-a")
    return h


@dataclass(frozen=True)
class Case:
    build: Callable[[], H]
    counts: dict[str, int]
    #: None: not pinned (the Spark test still compares them whole)
    faults: tuple[FaultWindow, ...] | None = ()
    options: CheckOptions = field(default_factory=CheckOptions)
    durability: Durability | None = None


def case_corrupt() -> H:
    h = H()
    h.send(0, "k0").send(1, "k1")
    h.recv(10, "k0").recv(11, "k1", corrupt=True)
    h.recv(12, "stranger", corrupt=True)  # a corrupt key as well: unexpected and corrupt
    return h


def case_power_loss(mode: str) -> Callable[[], H]:
    """Flush ``mode`` every 500 ms; a power loss of broker-a at 2000 and of the cluster
    at 5000.  Lost: k100 (acked 1900 ms before the cut: outside the bound of 1500 ms),
    kb900 (its group broker-b did not lose power at 2000), and inside the bound k700,
    k1990 (broker-a at 2000) and kb4800 (the cluster at 5000)."""

    def build() -> H:
        h = H()
        h.add(0, "drill", "info", StoreMode(mode, 500))
        h.add(0, "c1", "info", Subscribe("c1", "G", "T"))
        for t in (100, 700, 1990):
            h.send(t - 5, f"k{t}", done_t=t)
        h.send(895, "kb900", done_t=900, broker="broker-b")
        h.send(1200, "k1200", done_t=1205)
        h.recv(1300, "k1200", qo=9)
        h.add(2000, "nemesis", "info", Fault("power", "broker-a"))
        h.add(3000, "nemesis", "ok", Fault("power", "broker-a"))
        h.send(4795, "kb4800", done_t=4800, broker="broker-b")
        h.add(5000, "nemesis", "info", Fault("power", "cluster"))
        h.add(8000, "nemesis", "ok", Fault("power", "cluster"))
        return h

    return build


def _written(h: H, sends: list[tuple[int, int, int, int]], broker: str = "broker-a") -> H:
    """Each ``(issue_t, ok_t, epoch, member)`` acknowledged by ``broker`` and delivered."""
    for issue, done, epoch, member in sends:
        key = f"{broker}-{issue}"
        h.send(issue, key, done_t=done, broker=broker, epoch=epoch, member=member)
        h.recv(done + 50, key, broker=broker, qo=issue)
    return h


def case_split_brain() -> H:
    """#7017: member 0 (epoch 1), cut off, keeps acknowledging while member 1 (epoch 2)
    does too: the acknowledgements at 100 (epoch 2) and 200 (epoch 1) each lie between
    two of the other writer's; the first and the last do not."""
    h = H()
    h.add(0, "c1", "info", Subscribe("c1", "G", "T"))
    return _written(h, [(0, 5, 1, 0), (100, 105, 2, 1), (200, 205, 1, 0), (300, 305, 2, 1)])


def case_split_brain_same_epoch() -> H:
    """Two members acknowledging under one epoch, never at the same time: the second
    member's write counts (one epoch, one master)."""
    h = H()
    h.add(0, "c1", "info", Subscribe("c1", "G", "T"))
    return _written(h, [(0, 5, 3, 0), (500, 505, 3, 2)])


def case_clean_switches() -> H:
    """Switches that hand over: epoch 1 (member 0) until it dies, epoch 2 (member 1),
    then back to member 0 in epoch 3; broker-b keeps its epoch 1 meanwhile (another
    group); a late answer of the old master (issued at 900 before it froze, answered at
    3000 while epoch 2 writes) is not a second master; writes without an epoch are not
    judged."""
    h = H()
    h.add(0, "c1", "info", Subscribe("c1", "G", "T"))
    _written(h, [(0, 5, 1, 0), (500, 505, 1, 0), (900, 3000, 1, 0)])
    _written(h, [(2000, 2005, 2, 1), (2500, 2505, 2, 1), (4000, 4005, 2, 1)])
    _written(h, [(6000, 6005, 3, 0), (6500, 6505, 3, 0)])
    _written(h, [(10, 15, 1, 0), (2200, 2205, 1, 0), (6100, 6105, 1, 0)], broker="broker-b")
    # the epochs as seen, each at least min_switch_interval_ms (5 s) after the last
    for t, epoch, member in ((0, 1, 0), (1950, 2, 1), (5900, 3, 0)):
        h.add(t + 50, "observer", "info", EpochChange("broker-a", epoch, member, t * 3, "gone"))
    h.add(60, "observer", "info", EpochChange("broker-b", 1, 0, 0, "initial"))
    h.send(2600, "no-epoch", done_t=2605, broker="broker-a")
    h.recv(2700, "no-epoch", qo=9999)
    return h


def case_fast_switches() -> H:
    """A flapping master: broker-a's epoch 3 began 4.9 s after epoch 2 (the interval is
    5 s); epoch 2 seen twice (the smallest since_ms counts), epoch 4 without since_ms
    (not judged); broker-b's first switch 3 s after its initial epoch (the first
    switch may come at any time), its second 6 s after the first."""
    h = H()
    seen = [
        ("broker-a", 1, 0),
        ("broker-a", 2, 10_000),
        ("broker-a", 2, 10_300),
        ("broker-a", 3, 14_900),
        ("broker-a", 4, None),
        ("broker-b", 1, 0),
        ("broker-b", 2, 3_000),
        ("broker-b", 3, 9_000),
    ]
    for i, (group, epoch, since) in enumerate(seen):
        h.add(100 * i, "observer", "info", EpochChange(group, epoch, epoch % 3, since))
    return h


CASES: dict[str, Case] = {
    "clean": Case(
        case_clean,
        counts(acknowledged=4, delivered=4),
        # broker-a was targeted: its write window runs to k3's ok (issued 210, ok 215)
        (FaultWindow("kill", "broker-a/0", 200, 400, 0, 0, {"broker-a": 15}, {"broker-a": 0}),),
    ),
    "lost": Case(case_lost, counts(acknowledged=3, delivered=2, lost=4)),
    "duplicated": Case(case_duplicated, counts(acknowledged=2, delivered=6, duplicated=2)),
    "duplicated-after-ack": Case(
        lambda: (
            case_duplicated()
            .add(11, "c1", "ok", Ack("k0", "c1", "G"))
            .add(14, "c1", "ok", Ack("k1", "c1", "G2"))
        ),
        counts(acknowledged=2, delivered=6, duplicated=1),
        options=CheckOptions(redelivery="after_ack"),
    ),
    # G2 takes a second k0 without acking it: a duplicate strictly, not after acks; G
    # is judged strictly (2), G2 after its acks (0): after_ack_groups is per group
    "duplicated-after-ack-groups": Case(
        lambda: (
            case_duplicated()
            .recv(16, "k0", cg="G2")
            .add(11, "c1", "ok", Ack("k0", "c1", "G"))
            .add(14, "c1", "ok", Ack("k1", "c1", "G2"))
        ),
        counts(acknowledged=2, delivered=7, duplicated=2),
        options=CheckOptions(after_ack_groups=frozenset({"G2"})),
    ),
    "unexpected": Case(case_unexpected, counts(acknowledged=1, delivered=3, unexpected=2)),
    "recovered": Case(case_recovered, counts(delivered=3, recovered=3)),
    "order": Case(
        case_order,
        counts(acknowledged=5, delivered=10, order_violations=1, duplicated=1, lost=1),
    ),
    "late_delayed": Case(
        case_late_delayed, counts(acknowledged=6, delivered=7, late_delayed=3, duplicated=1)
    ),
    "late_without_a_writable_master": Case(
        case_late_without_a_writable_master,
        counts(acknowledged=5, delivered=6, recovered=1, late_delayed=2),
        (
            FaultWindow(
                "kill",
                "broker-a/0",
                1_000,
                6_000,
                0,
                0,
                {"broker-a": None, "broker-b": 0},
                {"broker-a": 0, "broker-b": 0},
            ),
            FaultWindow(
                "disk",
                "broker-b/0",
                2_000,
                4_000,
                0,
                0,
                {"broker-a": 0, "broker-b": 2_105},
                {"broker-a": 0, "broker-b": 0},
            ),
        ),
    ),
    "transactions": Case(
        case_transactions,
        counts(acknowledged=2, delivered=3, lost=1, unexpected=1, unresolved_transactions=1),
    ),
    "rollback_unknown": Case(
        case_rollback_unknown, counts(delivered=1, unexpected=1, unresolved_transactions=1)
    ),
    "double_lock": Case(case_double_lock, counts(double_lock_grants=1)),
    "double_lock-short-lease": Case(
        case_double_lock, counts(), options=CheckOptions(lock_lease_ms=5_000)
    ),
    "offset_rollback": Case(case_offset_rollback, counts(offset_rollbacks=1)),
    "fault_recovery": Case(
        case_fault_recovery,
        counts(acknowledged=2, delivered=2, recovered=0),
        (
            # k1 (issued 1005, no broker) failed; k2 (issued 1600) is the next ok, at 3000;
            # broker-a was targeted, so its window runs from the fault start
            FaultWindow(
                "kill",
                "broker-a/0",
                1_000,
                5_000,
                1_995,
                0,
                {"broker-a": 2_000},
                {"broker-a": 0},
                unattributed_write_failures=1,
            ),
            FaultWindow("pause", "broker-b/1", 5_100, None, 0, 0, {"broker-a": 0}, {"broker-a": 0}),
        ),
    ),
    "targeted_no_failures": Case(
        case_targeted_no_failures,
        counts(acknowledged=103, lost=103),
        (
            FaultWindow(
                "kill", "broker-a/0", 1_000, 6_000, 0, 0, {"broker-a": 5_504, "broker-b": 0}
            ),
            FaultWindow("pause", "nameserver", 7_000, None, 0, 0, {"broker-a": 0, "broker-b": 0}),
        ),
    ),
    "corrupt": Case(
        case_corrupt, counts(acknowledged=2, delivered=3, unexpected=1, corrupt_deliveries=2)
    ),
    "power_loss_async": Case(
        case_power_loss("async"),
        counts(acknowledged=6, delivered=1, lost=2, unsynced_lost=3),
        None,
        durability=Durability("async", 500, 2, 3, 1300),
    ),
    "power_loss_sync": Case(
        case_power_loss("sync"),
        counts(acknowledged=6, delivered=1, lost=5, unsynced_lost=3),
        None,
        durability=Durability("sync", 500, 2, 3, 1300),
    ),
    "split_brain": Case(case_split_brain, counts(acknowledged=4, delivered=4, split_brain=2), None),
    "split_brain_same_epoch": Case(
        case_split_brain_same_epoch, counts(acknowledged=2, delivered=2, split_brain=1), None
    ),
    "clean_switches": Case(case_clean_switches, counts(acknowledged=12, delivered=12), None),
    "fast_switches": Case(case_fast_switches, counts(fast_switches=1), None),
    "fast_switches-shorter-interval": Case(
        case_fast_switches, counts(), None, CheckOptions(min_switch_interval_ms=4_900)
    ),
    "group_gap": Case(
        case_group_gap,
        counts(acknowledged=_gap_acked(), delivered=_gap_acked()),
        GAP_FAULTS,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_counts(name: str) -> None:
    case = CASES[name]
    verdict = check(case.build().events, scenario=name, options=case.options)
    assert dict(verdict.counts) == case.counts
    if case.faults is not None:
        assert verdict.faults == case.faults
    if case.durability is not None:
        assert verdict.durability == case.durability
    failing = any(case.counts[k] for k in FAILING_COUNTS)
    assert verdict.ok is not failing


def test_clean_is_ok_and_json_shape() -> None:
    verdict = check(case_clean().events, scenario="kill-master")
    assert verdict.ok
    doc = json.loads(verdict.to_json())
    assert list(doc) == ["scenario", "ok", "counts", "faults", "availability", "durability"]
    assert doc["durability"] == {
        "flush_mode": None,
        "flush_interval_ms": None,
        "power_losses": 0,
        "unsynced_lost": 0,
        "loss_window_ms": 0,
    }
    assert list(doc["counts"]) == list(COUNT_NAMES)
    assert doc["faults"] == [
        {
            "kind": "kill",
            "target": "broker-a/0",
            "start_ms": 200,
            "end_ms": 400,
            "recovery_ms": 0,
            "cluster_write_unavailable_ms": 0,
            "cluster_read_unavailable_ms": 0,
            "write_unavailable_ms": {"broker-a": 15},
            "read_unavailable_ms": {"broker-a": 0},
            "unattributed_write_failures": 0,
            "unattributed_read_failures": 0,
        }
    ]
    assert doc["availability"] == {
        "write_unavailable_ms": {"p50": 15, "p99": 15, "max": 15, "faults": 1, "unrecovered": 0},
        "read_unavailable_ms": {"p50": 0, "p99": 0, "max": 0, "faults": 1, "unrecovered": 0},
    }
    assert Verdict.from_dict(doc) == verdict


def test_recovered_alone_is_ok() -> None:
    assert check(case_recovered().events, scenario="x").ok


def test_check_reads_a_path(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as writer:
        writer.write_all(case_lost().events)
    assert check(path, scenario="lost").counts["lost"] == 4


def test_unavailability_windows() -> None:
    h = H()
    h.send(0, "a", done_t=10)
    h.send(20, "b", outcome="fail", done_t=100)
    h.send(30, "c", outcome="info", done_t=200)
    h.send(210, "d", done_t=300)
    h.send(310, "e", outcome="fail", done_t=1_000)  # within 2 s of the last window: merged
    h.send(1_010, "f", done_t=1_500)
    h.send(5_000, "g", outcome="fail", done_t=5_000)
    windows = unavailability_windows(h.events)
    assert [(w.start_ms, w.end_ms) for w in windows] == [(100, 1_500), (5_000, None)]
    assert windows[0].duration_ms == 1_400


# --- availability windows --------------------------------------------------------------


def test_gap_on_one_group_is_its_window_not_the_clusters(tmp_path: Path) -> None:
    """Acceptance (issue item 3): sends to broker-a fail or go unanswered for 3 s while
    broker-b keeps acknowledging: broker-a's window is 3 s, broker-b's and the cluster's
    about 0 (the old ``recovery_ms`` said "recovered in 2 ms" for both)."""
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as writer:
        writer.write_all(case_group_gap().events)
    verdict = check(path, scenario="partition-master")
    fault = verdict.faults[0]
    gap = GAP_END - GAP_START
    assert fault.write_unavailable_ms["broker-a"] == pytest.approx(gap, abs=50)
    assert fault.write_unavailable_ms["broker-b"] == 0
    assert fault.read_unavailable_ms["broker-a"] == pytest.approx(gap, abs=50)
    assert fault.read_unavailable_ms["broker-b"] == 0
    assert fault.cluster_write_unavailable_ms is not None
    assert fault.cluster_write_unavailable_ms <= 2 * SEND_EVERY  # broker-b kept acknowledging
    assert fault.recovery_ms == fault.cluster_write_unavailable_ms
    assert fault.cluster_read_unavailable_ms is not None
    assert fault.cluster_read_unavailable_ms <= 2 * SEND_EVERY
    assert fault.unattributed_write_failures == 1
    doc = json.loads(verdict.to_json())
    assert doc["faults"][0]["write_unavailable_ms"] == {"broker-a": 3_005, "broker-b": 0}
    assert doc["faults"][0]["cluster_write_unavailable_ms"] == doc["faults"][0]["recovery_ms"]
    # the second fault's epoch starts clean; the summary is over each fault's worst window
    assert verdict.faults[1].worst_ms("write") == 55
    assert doc["availability"]["write_unavailable_ms"] == {
        "p50": 55,
        "p99": 3_005,
        "max": 3_005,
        "faults": 2,
        "unrecovered": 0,
    }
    assert Verdict.from_dict(doc) == verdict


def test_reply_to_a_request_issued_before_the_failure_does_not_close_it() -> None:
    h = H()
    h.add(100, "nemesis", "info", Fault("pause", "nameserver"))  # no group targeted
    _attributed_send(h, 90, "before", "ok", 150, "broker-a")  # issued before the trouble
    _attributed_send(h, 110, "hangs", "info", 3_110, "broker-a")  # issued at 110, times out
    _attributed_send(h, 3_200, "after", "ok", 3_210, "broker-a")
    (fault,) = check(h.events, scenario="x").faults
    # the window opens when the failed send was issued (110), not when it timed out
    assert fault.write_unavailable_ms == {"broker-a": 3_100}
    assert fault.recovery_ms == 3_100


def test_targeted_group_must_show_a_write_even_when_nothing_failed() -> None:
    """A real kill drill: the producer routes away from the killed master's group at
    once, so no send fails; the group still took no write until its master returned."""
    kill, pause = check(case_targeted_no_failures().events, scenario="x").faults
    assert kill.write_unavailable_ms == {"broker-a": 5_504, "broker-b": 0}
    assert kill.recovery_ms == 0  # no client saw a failure
    assert kill.read_unavailable_ms == {}  # reads are not presumed down
    assert pause.write_unavailable_ms == {"broker-a": 0, "broker-b": 0}  # not a group
    assert (kill, pause) == CASES["targeted_no_failures"].faults


def test_window_that_never_closes_is_null_and_unrecovered() -> None:
    h = H()
    _attributed_send(h, 0, "k0", "ok", 5, "broker-a")
    h.add(100, "nemesis", "info", Fault("kill", "broker-a/0"))
    _attributed_send(h, 120, "k1", "fail", 121, "broker-a")
    _attributed_send(h, 130, "k2", "ok", 135, "broker-b")
    verdict = check(h.events, scenario="x")
    (fault,) = verdict.faults
    assert fault.write_unavailable_ms == {"broker-a": None, "broker-b": 0}
    assert fault.recovery_ms == 15  # from 120 to broker-b's ok at 135
    assert fault.worst_ms("write") is None
    assert verdict.availability["write_unavailable_ms"] == {
        "p50": None,
        "p99": None,
        "max": None,
        "faults": 1,
        "unrecovered": 1,
    }
    assert json.loads(verdict.to_json())["faults"][0]["write_unavailable_ms"]["broker-a"] is None


def test_no_writable_master_spans_need_every_group_down() -> None:
    def fw(kind: str, target: str, start: int, end: int | None) -> FaultWindow:
        return FaultWindow(kind, target, start, end, 0, 0, {"broker-a": 0, "broker-b": 0})

    # a slave, a loss and a nameserver fault never take a group's master away
    assert (
        no_writable_master_spans(
            [
                fw("kill", "broker-a/0", 0, 10_000),
                fw("pause", "broker-b/1", 0, 10_000),
                fw("netem", "broker-b/0", 0, 10_000),
                fw("pause", "nameserver", 0, 10_000),
            ]
        )
        == []
    )
    assert no_writable_master_spans(
        [
            fw("kill", "broker-a/0", 0, 3_000),
            fw("pause", "broker-a/0", 2_500, 6_000),  # overlapping faults of one group
            fw("partition", "broker-b/0", 1_000, 2_000),
            fw("disk", "broker-b/0", 4_000, None),  # never freed
        ]
    ) == [(1_000, 2_000), (4_000, 6_000)]


def test_availability_summary_nearest_rank() -> None:
    faults = [
        FaultWindow("kill", "b/0", i, None, 0, 0, {"b": ms}, {"b": 0})
        for i, ms in enumerate([400, 100, 300, 200, None])
    ]
    assert availability_summary(faults)["write_unavailable_ms"] == {
        "p50": 200,
        "p99": 400,
        "max": 400,
        "faults": 5,
        "unrecovered": 1,
    }
    assert availability_summary([])["read_unavailable_ms"]["max"] is None


def test_old_verdict_json_reads_and_mismatches_name_fields() -> None:
    old = {
        "scenario": "kill-master",
        "ok": True,
        "counts": counts(),
        "faults": [
            {
                "kind": "kill",
                "target": "broker-a/0",
                "start_ms": 1,
                "end_ms": None,
                "recovery_ms": 7,
            }
        ],
    }
    (fault,) = Verdict.from_dict(old).faults
    assert fault.cluster_write_unavailable_ms == 7
    assert fault.write_unavailable_ms == {}
    verdict = check(case_group_gap().events, scenario="x")
    assert verdict.mismatches(verdict) == []
    doc = verdict.to_dict()
    doc["faults"][0]["write_unavailable_ms"]["broker-a"] = 1
    diff = verdict.mismatches(Verdict.from_dict(doc))
    assert "faults[0].write_unavailable_ms" in diff[-1]
    assert any(line.startswith("availability:") for line in diff)


# --- history format -------------------------------------------------------------------


def test_writer_round_trip_and_thread_safety(tmp_path: Path) -> None:
    path = tmp_path / "out" / "history.jsonl"
    clock = iter(range(10_000))
    with HistoryWriter(path, clock_ms=lambda: next(clock)) as writer:
        first = writer.record("p", "invoke", SendInvoke("k", "T", delay_ms=10))

        def work(n: int) -> None:
            for i in range(200):
                writer.write(
                    Event.of(i, f"t{n}", "ok", Receive(f"k{n}-{i}", "id", "b", 0, i, "c", "G"))
                )

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert writer.count == 801
    events = read_history(path)
    assert len(events) == 801
    assert events[0] == first
    assert events[0].value == {"key": "k", "topic": "T", "delay_ms": 10}
    assert json.loads(path.read_text().splitlines()[0]) == {
        "t_ms": 0,
        "process": "p",
        "type": "invoke",
        "f": "send",
        "value": {"key": "k", "topic": "T", "delay_ms": 10},
    }
    writer.close()  # idempotent
    with pytest.raises(HistoryError, match="closed"):
        writer.write(first)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"t_ms": "1", "process": "p", "type": "ok", "f": "send"}', "'t_ms' must be an integer"),
        ('{"t_ms": 1, "process": "p", "type": "done", "f": "send"}', "'type' must be one of"),
        ('{"t_ms": 1, "process": "p", "type": "ok", "f": "send", "value": 3}', "'value'"),
        ('{"t_ms": 1, "process": 2, "type": "ok", "f": "send"}', "'process'"),
    ],
)
def test_read_history_names_bad_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "history.jsonl"
    good = Event(1, "p", "ok", "send", {"key": "k"}).to_line()
    path.write_text(f"{good}\n\n{line}\n{good}\n")
    with pytest.raises(HistoryError, match=rf"history\.jsonl:3: {message}"):
        read_history(path)


def test_read_history_keeps_unknown_f(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text('{"t_ms": 1, "process": "p", "type": "info", "f": "pop_revive"}\n')
    assert read_history(path) == [Event(1, "p", "info", "pop_revive", {})]


def test_after_ack_groups_differ_from_strict_and_from_all_after_ack() -> None:
    def history() -> H:
        return (
            case_duplicated()
            .recv(16, "k0", cg="G2")
            .add(11, "c1", "ok", Ack("k0", "c1", "G"))
            .add(14, "c1", "ok", Ack("k1", "c1", "G2"))
        )

    def dup(options: CheckOptions) -> int:
        return check(history().events, scenario="x", options=options).counts["duplicated"]

    assert dup(CheckOptions()) == 3
    assert dup(CheckOptions(redelivery="after_ack")) == 1
    assert dup(CheckOptions(after_ack_groups=frozenset({"G2"}))) == 2
    assert dup(CheckOptions(after_ack_groups=frozenset({"G"}))) == 2  # G: only t=12
    assert CheckOptions(after_ack_groups=frozenset({"G"})).after_ack("G")


# --- failed reads as the drill workloads record them ------------------------------------


def _pull_history(path: Path, *, recovered_poll: bool) -> None:
    """broker-a is partitioned 2000-5000: every pull of it fails (a ``receive`` fail,
    recorded by :func:`record_read_outcome` as PullWorkload does), and the first pull
    after the heal works but finds nothing; broker-b delivers throughout."""
    with HistoryWriter(path) as writer:
        writer.write(Event.of(0, "puller-0", "info", Subscribe("puller-0", "G", "T")))
        writer.write(Event.of(2_000, "nemesis", "info", Fault("partition", "broker-a/0")))
        writer.write(Event.of(5_000, "nemesis", "ok", Fault("partition", "broker-a/0")))
        for t in range(2_000, 5_000, 300):
            record_read_outcome(
                writer, "puller-0", "G", "T", ok=False, broker="broker-a", error="timeout", t_ms=t
            )
        if recovered_poll:
            record_read_outcome(
                writer, "puller-0", "G", "T", ok=True, broker="broker-a", t_ms=5_000
            )
        for i, t in enumerate(range(0, 6_000, 100)):
            key = f"b{i}"
            writer.write(Event.of(t, "producer", "invoke", SendInvoke(key, "T")))
            writer.write(
                Event.of(t + 5, "producer", "ok", SendOk(key, f"ID-{key}", "broker-b", 0, i))
            )
            writer.write(
                Event.of(
                    t + 20,
                    "puller-0",
                    "ok",
                    Receive(key, f"ID-{key}", "broker-b", 0, i, "puller-0", "G"),
                )
            )


def test_failed_pulls_make_the_read_window_and_an_empty_poll_closes_it(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    _pull_history(path, recovered_poll=True)
    verdict = check(path, scenario="partition-master")
    (fault,) = verdict.faults
    assert fault.read_unavailable_ms == {"broker-a": 3_000, "broker-b": 0}
    assert fault.cluster_read_unavailable_ms == 20  # broker-b delivered right away
    # neither a failed nor an empty poll is a delivery, or a duplicate, or unexpected
    assert verdict.counts["delivered"] == 60
    assert verdict.counts["unexpected"] == verdict.counts["duplicated"] == 0
    assert verdict.ok
    assert verdict.to_dict()["availability"]["read_unavailable_ms"]["max"] == 3_000
    # without the poll that worked again, the window never closes (null)
    path = tmp_path / "unrecovered.jsonl"
    _pull_history(path, recovered_poll=False)
    (fault,) = check(path, scenario="partition-master").faults
    assert fault.read_unavailable_ms["broker-a"] is None
