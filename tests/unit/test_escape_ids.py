"""Escape ids (source side: which failures leave an escape's fate unknown; target
side: a repeated escape is found once its first store is still there) and the steps
a stopping service waits for."""

from __future__ import annotations

import asyncio
import errno

import pytest

from broker_agent.special.escape import outcome_unknown
from broker_agent.special.escape_ids import Escaped, EscapedIds, escape_id
from broker_agent.special_steps import SpecialSteps
from ha_controller.protocol.errors import (
    BrokerIsolated,
    BrokerUnavailable,
    ConnectionClosed,
    InSyncReplicasNotEnough,
    NotWritable,
    RequestTimeout,
    TlsClosedEarly,
)
from ha_controller.protocol.record import StoredMessage


def _msg(offset: int, ts: int = 5, props: dict[str, str] | None = None) -> StoredMessage:
    return StoredMessage(
        "T", 0, b"x", props or {}, physical_offset=offset, store_ts_ms=ts, queue_offset=0
    )


def test_the_id_names_the_source_record_and_not_who_escapes_it() -> None:
    a = escape_id("g1", "delay", _msg(4096))
    assert a == "g1/delay/4096/5"
    assert escape_id("g1", "delay", _msg(4096)) == a  # the master and its slave agree
    assert escape_id("g1", "delay", _msg(4096, ts=6)) != a  # a record written anew there
    assert escape_id("g1", "timer", _msg(4096)) != a
    assert escape_id("g1", "pop_retry", _msg(4096), "ck-1") == "g1/pop_retry/4096/5/ck-1"


@pytest.mark.parametrize(
    ("exc", "unknown"),
    [
        (RequestTimeout("timed out"), True),
        (ConnectionClosed("closed while pending"), True),
        (TlsClosedEarly("closed during the request"), True),
        (ConnectionResetError(errno.ECONNRESET, "reset"), True),
        (BrokerUnavailable("cannot connect"), False),  # the request never left
        (BrokerIsolated("pre-online"), False),  # refused: nothing stored
        (NotWritable("disk full"), False),
        (InSyncReplicasNotEnough("1 live copies, 2 required"), False),
    ],
)
def test_which_failures_leave_the_outcome_unknown(exc: BaseException, unknown: bool) -> None:
    assert outcome_unknown(exc) is unknown


def test_a_repeat_is_found_while_its_first_store_is_there() -> None:
    ids = EscapedIds(capacity=2)
    log: dict[tuple[str, int, int], StoredMessage] = {}

    def read(topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        return log.get((topic, queue_id, offset))

    first = Escaped("T", 1, 1, 7, "MSGID", 1000)
    log[("T", 1, 7)] = _msg(1000, props={"ESCAPE_ID": "g1/delay/1/5"})
    ids.add("g1/delay/1/5", first)
    assert ids.find("g1/delay/1/5", read, "T") == first
    assert ids.find("g1/delay/2/5", read, "T") is None
    assert ids.repeats == 1
    # the target cut its log back on a return and wrote another record there
    log[("T", 1, 7)] = _msg(1000, props={"ESCAPE_ID": "g1/delay/9/5"})
    assert ids.find("g1/delay/1/5", read, "T") is None
    assert len(ids) == 0  # forgotten: the next repeat is stored again
    # bounded: the oldest id goes first
    for n in range(3):
        ids.add(f"id{n}", first)
    assert len(ids) == 2 and ids.find("id0", read, "T") is None


def test_a_message_carrying_the_id_for_another_topic_is_not_a_repeat() -> None:
    """Without a cluster secret a consumer that sends a received (once escaped) message
    on to another topic copies its ESCAPE_ID: that send is stored, and the first store
    stays the one a repeat of the escape finds."""
    log: dict[tuple[str, int, int], StoredMessage] = {}

    def read(topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        return log.get((topic, queue_id, offset))

    ids = EscapedIds()
    eid = "g1/delay/1/5"
    log[("T", 0, 7)] = StoredMessage("T", 0, b"x", {"ESCAPE_ID": eid}, queue_offset=7)
    first = Escaped("T", 0, 0, 7, "FIRST", 1000)
    ids.add(eid, first)
    assert ids.find(eid, read, "Forwarded") is None  # stored as a message of its own
    log[("Forwarded", 0, 0)] = StoredMessage("Forwarded", 0, b"x", {"ESCAPE_ID": eid})
    ids.add(eid, Escaped("Forwarded", 0, 0, 0, "COPY", 2000))
    assert ids.find(eid, read, "T") == first
    # a half message lies in the half topic and names the topic its send named
    half = StoredMessage("RMQ_SYS_TRANS_HALF_TOPIC", 0, b"x", {"ESCAPE_ID": "h", "REAL_TOPIC": "T"})
    log[("RMQ_SYS_TRANS_HALF_TOPIC", 0, 0)] = half
    ids.add("h", Escaped("RMQ_SYS_TRANS_HALF_TOPIC", 0, 0, 0, "HALF", 3000))
    assert ids.find("h", read, "T") is not None
    assert ids.find("h", read, "RMQ_SYS_TRANS_HALF_TOPIC") is None


def test_a_restarted_target_remembers_the_escapes_its_log_holds() -> None:
    """Rebuilt from stored messages (a restart reads them back from the commit log): a
    repeat is answered as the first send was, including the queue a delayed message's
    send asked for (it lies in the schedule queue)."""
    stored = [
        StoredMessage(
            "T", 3, b"x", {"ESCAPE_ID": "g1/delay/1/5"}, queue_offset=7, physical_offset=100
        ),
        StoredMessage("T", 0, b"x", {}, queue_offset=8, physical_offset=200),
        StoredMessage(
            "SCHEDULE_TOPIC_XXXX",
            2,
            b"x",
            {"ESCAPE_ID": "g1/pop_retry/2/5", "REAL_TOPIC": "T", "REAL_QID": "1"},
            queue_offset=4,
            physical_offset=300,
        ),
    ]
    ids = EscapedIds()
    assert ids.rebuild(stored) == 2
    by_place = {(m.topic, m.queue_id, m.queue_offset): m for m in stored}

    def read(topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        return by_place.get((topic, queue_id, offset))

    assert ids.find("g1/delay/1/5", read, "T") == Escaped("T", 3, 3, 7, stored[0].msg_id, 100)
    assert ids.find("g1/pop_retry/2/5", read, "T") == Escaped(
        "SCHEDULE_TOPIC_XXXX", 2, 1, 4, stored[2].msg_id, 300
    )


async def test_a_stop_waits_for_the_steps_under_way() -> None:
    steps = SpecialSteps()
    await steps.idle()  # nothing under way: at once
    release = asyncio.Event()
    progress: list[str] = []

    async def one_step() -> None:
        with steps.step():
            await release.wait()
            progress.append("escaped and recorded")

    task = asyncio.create_task(one_step())
    await asyncio.sleep(0)
    assert steps.under_way == 1
    waiter = asyncio.create_task(steps.idle())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    release.set()
    await asyncio.wait_for(waiter, 1)
    assert progress == ["escaped and recorded"] and steps.under_way == 0
    await task
