"""``hactl demo``: a whole failover on this machine, end to end, with a verdict.

A nameserver plus two broker groups (each a master and two slaves) start as
real processes on loopback.  A producer and a push consumer run the whole
time.  Before the master of ``broker-a`` is killed with SIGKILL, special work
is left on it: delayed messages due after the kill, two open transactions,
POP messages nobody received yet, and queue locks (strict mode) held by a
client.  Then:

- the nameserver shows broker-a's lowest slave as id 0 (read-only); the push
  consumer keeps reading and committing through it, producers move to
  ``broker-b``;
- the acting slave still grants the held locks (2 of 3 members vote) and
  refuses them to a second client;
- a simple consumer receives the POP messages from it and acks them; their
  checkpoints and acks escape to ``broker-b``'s master, which revives the one
  message left un-acked into the retry topic;
- the half messages escape to ``broker-b``, whose checks reach the
  producer's checker: one transaction is committed, one rolled back;
- the due delayed messages escape to ``broker-b`` and are delivered there;
- the master comes back through pre-online (adopting the acting slave's
  consumer and delay offsets) and takes over again.

The demo is a narrated drill.  The cluster is a drill
:class:`~ha_controller.drills.cluster.DrillCluster`, the kill and the restart are the
drill :class:`~ha_controller.drills.nemesis.Nemesis`'s (a
:class:`~ha_controller.drills.nemesis.RoleObserver` records the roles), and every
client is a drill workload (:mod:`ha_controller.drills.workloads`) recording into one
history (``history.jsonl`` in the work directory, kept with the logs when the demo
fails).  The demo drives the workloads' sends itself (``send_one``) so that each kind
of work lands where the story needs it.

The verdict has one line per invariant; the demo exits 0 only if all held.  Each line
is the drill checker's verdict (:func:`ha_controller.drills.checker.check`) on that
part of the history — lost, duplicated, unexpected, late, unresolved, double lock
grants — plus what only the demo watches: the escape bridge's counters, who answered
the transaction checks, the one POP message revived, the pre-online steps and the
offsets the returning master adopted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message, MessageQueue, ReceivedMessage
from ha_controller.client.routes import RouteCache
from ha_controller.client.simple_consumer import retry_topic_of
from ha_controller.client.tools import body_for
from ha_controller.client.transaction import TransactionResolution
from ha_controller.drills.checker import CheckOptions, Verdict, check
from ha_controller.drills.cluster import ClusterSpec, DrillCluster, broker_target
from ha_controller.drills.history import Event, HistoryWriter, SendInvoke
from ha_controller.drills.nemesis import Nemesis, RoleObserver
from ha_controller.drills.workloads import (
    PopWorkload,
    ProducerWorkload,
    PushWorkload,
    RecordingQueueLocker,
    TransactionWorkload,
)
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import HaError
from ha_controller.routing import Perm
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import EventuallyTimeout, ProcessHandle, eventually, make_workdir

__all__ = ["run_demo"]

TOPIC = "DemoTopic"  # normal, delayed and transactional messages: one push consumer
POP_TOPIC = "DemoPop"
GROUP = "demo-consumers"
POP_GROUP = "demo-pop"
LOCK_GROUP = "demo-orderly"
A, B = "broker-a", "broker-b"
A_QUEUES = frozenset(MessageQueue(TOPIC, A, i) for i in range(4))

#: history process names; each producer's keys are ``<process>-<n>``
NORMAL, DELAYED, TRANSACTIONS, POP = "demo", "delay", "tx", "pop"

#: ``HAC_DELAY_LEVELS`` of the demo: level n delays by n seconds
DELAY_LEVELS_S = tuple(range(1, 11))
DELAY_LEVEL = 3  # 3 s: due after the kill
DELAY_S = float(DELAY_LEVELS_S[DELAY_LEVEL - 1])
DELAY_TOLERANCE_S = 3.0  # "on time": at most this late (never early)
POP_INVISIBLE_S = 2.0
POP_MESSAGES = 16

# The cluster runs with short timers so that every special service acts within
# seconds (production defaults are 30 s transaction checks, 1 s revive, ...).
DEMO_ENV = {
    "HAC_DELAY_LEVELS": " ".join(f"{s}s" for s in DELAY_LEVELS_S),
    "HAC_LOCK_IN_STRICT_MODE": "true",
    "HAC_TRANSACTION_CHECK_INTERVAL_MS": "300",
    "HAC_TRANSACTION_TIMEOUT_MS": "1000",
    "HAC_TRANSACTION_CHECK_MAX": "1000",
    "HAC_POP_REVIVE_INTERVAL_MS": "200",
}

#: The checker's options per part of the history.  Delayed messages are recorded with
#: their delay in ms (the demo's level table is not RocketMQ's default one), which the
#: checker judges with ``timer_tolerance_ms``; "never early" allows 0.1 s of clock skew.
#: A POP message delivered again before it was acked is at-least-once, not a duplicate.
STRICT = CheckOptions()
DELAYED_CHECK = CheckOptions(
    timer_tolerance_ms=int(DELAY_TOLERANCE_S * 1000), early_tolerance_ms=100
)
POP_CHECK = CheckOptions(redelivery="after_ack")


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def clock(ts_ms: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts_ms / 1000))


def _yes(value: bool | None) -> str:
    return "yes" if value else "NO"


async def within(predicate: Callable[[], Any], timeout: float) -> bool:
    """``eventually`` that answers False instead of raising: a special invariant
    that does not hold is reported in the verdict, it does not abort the demo."""
    try:
        await eventually(predicate, timeout=timeout, interval=0.05)
    except EventuallyTimeout:
        return False
    return True


@dataclass
class Invariant:
    name: str
    ok: bool
    detail: str


# ---- the history, kept in memory too ------------------------------------------------------


class DemoHistory(HistoryWriter):
    """The demo's ``history.jsonl``, also indexed in memory for the narration."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.events: list[Event] = []
        self.invoked_ms: dict[str, int] = {}  # key -> its (first) send invoke
        self.stored_on: dict[str, str] = {}  # key -> the group that acknowledged it
        self._deliveries: defaultdict[str, list[Event]] = defaultdict(list)

    def write(self, event: Event) -> None:
        super().write(event)
        self.events.append(event)
        key = event.value.get("key")
        if not isinstance(key, str):
            return
        if event.f == "send" and event.type == "invoke":
            self.invoked_ms.setdefault(key, event.t_ms)
        elif event.f == "send" and event.type == "ok":
            self.stored_on[key] = str(event.value.get("broker"))
        elif event.f == "receive" and event.type == "ok":
            self._deliveries[key].append(event)

    def deliveries(self, key: str, topic: str | None = None) -> list[Event]:
        """Receive oks of ``key`` (from ``topic`` only, when given), in order."""
        found = self._deliveries.get(key, [])
        return found if topic is None else [e for e in found if e.value.get("topic") == topic]

    def received(self, key: str, topic: str | None = None) -> int:
        return len(self.deliveries(key, topic))

    def first(self, key: str) -> Event | None:
        found = self._deliveries.get(key)
        return found[0] if found else None

    def on(self, keys: Iterable[str], group: str) -> list[str]:
        return [k for k in keys if self.stored_on.get(k) == group]

    def judge(self, process: str, options: CheckOptions) -> Verdict:
        """The checker's verdict on the keys ``process`` sent (and every subscription)."""
        prefix = f"{process}-"
        part = [
            e
            for e in self.events
            if e.f == "subscribe" or str(e.value.get("key", "")).startswith(prefix)
        ]
        return check(part, scenario=f"demo-{process}", options=options)


# ---- the workloads the demo drives ----------------------------------------------------------


class DemoProducer(ProducerWorkload):
    """A drill producer whose sends the demo makes itself (:meth:`send_one`); it never
    sends on its own.  A delay level is recorded as its delay on the demo's brokers,
    as :class:`~ha_controller.drills.workloads.DelayedProducerWorkload` records levels."""

    def __init__(self, namesrv: str, topic: str, history: HistoryWriter, **options: Any) -> None:
        super().__init__(namesrv, topic, history, **options)
        self.pause()

    def _next_message(self) -> tuple[Message, SendInvoke]:
        msg, invoke = super()._next_message()
        if invoke.delay_level:
            delay_ms = DELAY_LEVELS_S[invoke.delay_level - 1] * 1000
            invoke = dataclasses.replace(invoke, delay_level=None, delay_ms=delay_ms)
        return msg, invoke


class DemoTransactions(TransactionWorkload):
    """Transactions that stay open on broker-a until its master is gone.

    A half stored on broker-b is rolled back at once; on broker-a the first is left for
    the check to commit and the second for the check to roll back.  The checker answers
    UNKNOWN until :attr:`armed` (the kill), then with that plan (recorded as the drill
    workload records every answer)."""

    def __init__(self, namesrv: str, history: HistoryWriter) -> None:
        super().__init__(namesrv, TOPIC, history, process=TRANSACTIONS, size=64)
        self.pause()
        self.armed = False
        self.unknown_answers = 0
        self.asked: list[tuple[str, str, TransactionResolution]] = []  # key, broker, answer

    def planned(self, *plans: str) -> list[str]:
        return [k for k, p in self.plans.items() if p in plans]

    async def send_one(self) -> bool:
        key = f"{self.process}-{self._seq:02d}"
        self._seq += 1
        self.plans[key] = "rollback"  # also the answer should a check come for a lost send
        tx = self.producer.begin_transaction()
        msg = Message(self.topic, body_for(key, self.size), keys=(key,))
        receipt = await self._send_recorded(msg, SendInvoke(key=key, topic=self.topic, tx=True), tx)
        if receipt is None:
            return False
        self.stored.add(key)
        if receipt.broker_name != A:
            await self._end(tx, key, commit=False)
        elif not self.planned("check-commit"):
            self.plans[key] = "check-commit"
        else:
            self.plans[key] = "check-rollback"
        return True

    async def _check(self, message: ReceivedMessage) -> TransactionResolution:
        if not self.armed:
            self.unknown_answers += 1
            return TransactionResolution.UNKNOWN
        answer = await super()._check(message)
        self.asked.append((message.key, message.broker_name, answer))
        return answer


class DemoPop(PopWorkload):
    """Acks every POP message except the first one received from broker-a: that one
    must come back, once, from the retry topic."""

    def __init__(self, namesrv: str, history: HistoryWriter) -> None:
        super().__init__(
            namesrv,
            POP_TOPIC,
            POP_GROUP,
            history,
            process="pop-consumer",
            invisible_s=POP_INVISIBLE_S,
            skip_ratio=0.0,
            batch=POP_MESSAGES,
        )
        self.unacked: str | None = None
        self.unacked_ms = 0

    async def _settle(self, m: ReceivedMessage) -> None:
        if self.unacked is None and m.topic == self.topic and m.broker_name == A:
            self.unacked, self.unacked_ms = m.key, int(time.time() * 1000)
            self.skipped.add(m.key)
            self.history.write(
                Event(
                    self.unacked_ms,
                    self.process,
                    "info",
                    "nack",
                    {"key": m.key, "consumer": self.process, "consumer_group": self.consumer_group},
                )
            )
            return  # left un-acked on purpose
        await super()._settle(m)


# ---- normal messages ----------------------------------------------------------------------


class NormalWork:
    """Normal messages to both groups, consumed by the push consumer of DemoTopic."""

    def __init__(self, producer: DemoProducer, history: DemoHistory) -> None:
        self.producer = producer
        self.history = history

    def consumed(self) -> int:
        return sum(1 for k in self.producer.acked if self.history.received(k))

    async def produce(self, n: int, rate: float) -> None:
        for _ in range(n):
            await self.producer.send_one()
            await asyncio.sleep(1 / rate)

    async def all_consumed(self, timeout: float) -> None:
        await within(lambda: self.consumed() >= len(self.producer.acked), timeout)
        say(f"    acknowledged {len(self.producer.acked)}, consumed {self.consumed()}")

    def summary(self) -> list[str]:
        p = self.producer
        by_group: Counter[str] = Counter()
        for key in p.acked:
            by_group.update(str(e.value.get("broker")) for e in self.history.deliveries(key))
        return [
            f"sent {p.sent}  acknowledged {len(p.acked)}  "
            f"failed (not acknowledged) {p.failed + p.unknown}",
            f"consumed {self.consumed()}  by group {dict(by_group)}",
        ]

    def invariant(self) -> Invariant:
        v = self.history.judge(NORMAL, STRICT)
        c = v.counts
        return Invariant("normal", v.ok, f"lost {c['lost']}  duplicated {c['duplicated']}")


# ---- delayed ------------------------------------------------------------------------------


class DelayedWork:
    """Delayed messages on both groups; broker-a's are due after its master died."""

    def __init__(self, producer: DemoProducer, history: DemoHistory) -> None:
        self.producer = producer
        self.history = history

    def keys(self) -> list[str]:
        return sorted(self.producer.acked)

    def due_ms(self, key: str) -> int:
        return self.history.invoked_ms[key] + int(DELAY_S * 1000)  # the broker's is >= this

    async def send(self, at_least_on_a: int = 4) -> None:
        while (
            len(self.history.on(self.keys(), A)) < at_least_on_a
            and self.producer.sent < 4 * at_least_on_a
        ):
            await self.producer.send_one()
        keys = self.keys()
        due = max((self.due_ms(k) for k in keys), default=0)
        say(
            f"    delayed: {len(keys)} messages at level {DELAY_LEVEL} ({DELAY_S:.0f} s), "
            f"{len(self.history.on(keys, A))} of them on {A}, due at {clock(due)} "
            "(after the kill)"
        )

    def lateness_s(self, keys: Iterable[str]) -> list[float]:
        return [
            (first.t_ms - self.due_ms(k)) / 1000
            for k in keys
            if (first := self.history.first(k)) is not None
        ]

    def first_from(self, keys: Iterable[str]) -> list[str]:
        return [str(first.value.get("broker")) for k in keys if (first := self.history.first(k))]

    async def wait_delivered(self) -> None:
        await within(lambda: all(self.history.received(k) for k in self.keys()), DELAY_S + 15)
        for group, how in ((A, f"by the acting slave through {B}"), (B, f"by {B} itself")):
            keys = self.history.on(self.keys(), group)
            if not keys:
                continue
            late = self.lateness_s(keys)
            via = sorted(set(self.first_from(keys)))
            span = f"{min(late):.2f}..{max(late):.2f} s late" if late else "-"
            say(
                f"    delayed: {len(late)}/{len(keys)} of {group} delivered {how} "
                f"(consumed from {', '.join(via) or '-'}), {span}"
            )

    def invariant(self, bridge: Counter[str]) -> Invariant:
        keys = self.keys()
        on_a = self.history.on(keys, A)
        delivered = [k for k in keys if self.history.received(k) >= 1]
        twice = [k for k in keys if self.history.received(k) > 1]
        escaped = bridge[f"delay->{B}"] >= len(on_a) and all(g == B for g in self.first_from(on_a))
        late = self.lateness_s(keys)
        worst = f"{max(late):.2f} s" if late else "-"
        v = self.history.judge(DELAYED, DELAYED_CHECK)  # lost, twice, late or early
        return Invariant(
            "delayed",
            v.ok and escaped and bool(keys),
            f"{len(delivered)}/{len(keys)} delivered, {len(twice)} twice, "
            f"{A}'s escaped to {B}: {_yes(escaped)}, "
            f"latest {worst} late (limit {DELAY_TOLERANCE_S:.0f} s)",
        )


# ---- transactions -------------------------------------------------------------------------


class TransactionWork:
    """Two transactions left open on broker-a: the checker commits one and rolls
    back the other once the master is gone."""

    def __init__(self, workload: DemoTransactions, history: DemoHistory) -> None:
        self.w = workload
        self.history = history

    def on_a(self) -> list[str]:
        return self.w.planned("check-commit", "check-rollback")

    def commit(self) -> list[str]:
        return self.w.planned("check-commit")

    def rollback(self) -> list[str]:
        """By the checker (on broker-a) or at once (on broker-b)."""
        return self.w.planned("rollback", "check-rollback")

    def answered(self) -> bool:
        return {k for k, _, _ in self.w.asked} >= set(self.on_a())

    async def open(self) -> None:
        while len(self.on_a()) < 2 and self.w.sent < 12:
            await self.w.send_one()
        explicit = len(self.w.planned("rollback"))
        say(
            f"    transactions: {len(self.on_a())} open on {A} ({', '.join(self.on_a())}), "
            "the checker answers UNKNOWN while the master lives"
            + (f"; {explicit} that landed on {B} rolled back at once" if explicit else "")
        )

    def resolved(self) -> bool:
        return all(self.history.received(k) for k in self.commit()) and self.answered()

    async def wait_resolved(self) -> None:
        await within(self.resolved, 20)
        by = sorted({b for _, b, _ in self.w.asked})
        answers = ", ".join(f"{k} {a.name.lower()}" for k, _, a in self.w.asked)
        where = sorted(
            {
                str(first.value.get("broker"))
                for k in self.commit()
                if (first := self.history.first(k))
            }
        )
        say(
            f"    transactions: the checker was asked by {', '.join(by) or 'nobody'}: "
            f"{answers or '-'}; the committed one consumed from {', '.join(where) or '-'}"
            + (
                f" (before the kill: {self.w.unknown_answers} checks, UNKNOWN)"
                if self.w.unknown_answers
                else ""
            )
        )

    def invariant(self, bridge: Counter[str]) -> Invariant:
        commit, rollback = self.commit(), self.rollback()
        leaked = [k for k in rollback if self.history.received(k)]
        escaped = bridge[f"transaction_half->{B}"] >= len(self.on_a())
        v = self.history.judge(TRANSACTIONS, STRICT)  # lost, twice, leaked, unresolved
        return Invariant(
            "transactions",
            v.ok and bool(commit) and self.answered() and escaped,
            f"committed {len(commit)} delivered "
            f"{'/'.join(str(self.history.received(k)) for k in commit) or '-'}x (expected 1), "
            f"rolled back {len(rollback)} delivered {len(leaked)}, "
            f"open halves escaped to {B}: {_yes(escaped)}, resolved by the checker: "
            f"{_yes(self.answered())}",
        )


# ---- POP ----------------------------------------------------------------------------------


class PopWork:
    """POP messages received and acked through broker-a's acting slave; one is
    left un-acked and must come back, once, from the retry topic."""

    def __init__(self, producer: DemoProducer, history: DemoHistory) -> None:
        self.producer = producer
        self.history = history
        self.consumer: DemoPop | None = None
        self.retry_topic = retry_topic_of(POP_GROUP)

    def keys(self) -> list[str]:
        return sorted(self.producer.acked)

    def first_count(self, key: str) -> int:
        return self.history.received(key, POP_TOPIC)

    def again_count(self, key: str | None) -> int:
        return 0 if key is None else self.history.received(key, self.retry_topic)

    async def send(self) -> None:
        for _ in range(POP_MESSAGES):
            await self.producer.send_one()
        on_a = len(self.history.on(self.keys(), A))
        say(f"    POP: {POP_MESSAGES} messages on {POP_TOPIC} ({on_a} on {A}), not received yet")

    async def while_acting(self, namesrv: str, stack: contextlib.AsyncExitStack) -> None:
        pop = self.consumer = await stack.enter_async_context(DemoPop(namesrv, self.history))
        await within(lambda: all(self.first_count(k) for k in self.keys()), 20)
        firsts = [e for k in self.keys() for e in self.history.deliveries(k, POP_TOPIC)]
        from_a = sum(1 for e in firsts if e.value.get("broker") == A)
        say(
            f"    POP: received {len(firsts)} ({from_a} from {A}'s acting slave), "
            f"acked {len(pop.acked)}; left {pop.unacked} (on {A}) un-acked"
        )
        came_back = await within(lambda: self.again_count(pop.unacked) >= 1, POP_INVISIBLE_S + 15)
        await pop.pause()  # the redelivered one is acked by now
        if came_back:
            again = self.history.deliveries(pop.unacked or "", self.retry_topic)
            later = (again[0].t_ms - pop.unacked_ms) / 1000
            by = sorted({str(e.value.get("broker")) for e in again})
            say(
                f"    POP: {pop.unacked} came back from {self.retry_topic} "
                f"{later:.1f} s later (invisible {POP_INVISIBLE_S:.0f} s; revived by "
                f"{', '.join(by)}), acked"
            )
        else:
            say(f"    POP: {pop.unacked} did not come back")

    async def drain(self, seconds: float) -> None:
        """Keep receiving: anything that arrives now is a redelivery too many."""
        if self.consumer is not None:
            self.consumer.resume()
            await asyncio.sleep(seconds)
            await self.consumer.pause()

    def invariant(self, bridge: Counter[str]) -> Invariant:
        keys = self.keys()
        unacked = self.consumer.unacked if self.consumer is not None else None
        received = [k for k in keys if self.first_count(k)]
        twice = [k for k in keys if self.first_count(k) > 1]
        back = sum(self.again_count(k) for k in keys if k != unacked)
        revived = unacked is not None and self.again_count(unacked) == 1
        escaped = bridge[f"pop_ck->{B}"] >= 1 and bridge[f"pop_ack->{B}"] >= 1
        v = self.history.judge(POP, POP_CHECK)  # lost, redelivered after the ack
        ok = v.ok and len(received) == len(keys) and not twice and not back and revived
        return Invariant(
            "POP",
            ok and escaped,
            f"received {len(received)}/{len(keys)} ({len(twice)} more than once), "
            f"un-acked one redelivered {self.again_count(unacked)}x (expected 1), "
            f"acked ones redelivered {back}, CK/ACK escaped to {B}: {_yes(escaped)}",
        )


# ---- locks --------------------------------------------------------------------------------


class LockWork:
    """Client A holds broker-a's queues (strict mode); client B wants them too."""

    def __init__(self, routes: RouteCache, pool: ConnectionPool, history: DemoHistory) -> None:
        self.routes = routes
        self.history = history
        self.a = RecordingQueueLocker(history, "lock-A", routes, pool, LOCK_GROUP, "demo-client-A")
        self.b = RecordingQueueLocker(history, "lock-B", routes, pool, LOCK_GROUP, "demo-client-B")
        self.results: dict[str, bool] = {}

    async def _round(self, label: str, where: str) -> None:
        to_a = await self.a.lock(A_QUEUES)
        to_b = await self.b.lock(A_QUEUES)
        ok = to_a.granted == A_QUEUES and to_b.refused == A_QUEUES
        self.results[label] = ok
        say(
            f"    locks: client A {label} at {where}: granted {len(to_a.granted)}/4; "
            f"client B asks for them: refused {len(to_b.refused)}/4"
        )

    async def at_master(self) -> None:
        await self.routes.refresh(TOPIC)
        await self._round("locks", "the master")

    async def at_acting_slave(self, acting_addr: str) -> None:
        async def granted() -> bool:
            await self.routes.refresh(TOPIC)
            if self.routes.broker_addr_for_publish(A) != acting_addr:
                return False
            return (await self.a.lock(A_QUEUES)).granted == A_QUEUES

        await within(granted, 15)
        await self._round("renews", "the acting slave (2 of 3 members vote)")

    def invariant(self) -> Invariant:
        locks = [e for e in self.history.events if e.f in ("lock", "unlock")]
        v = check(locks, scenario="demo-locks", options=STRICT)  # no double grant
        ok = v.ok and self.results.get("locks", False) and self.results.get("renews", False)
        return Invariant(
            "locks",
            ok,
            f"A granted, B refused at the master: {_yes(self.results.get('locks'))}; "
            f"at the acting slave: {_yes(self.results.get('renews'))}",
        )


# ---- broker inspection ----------------------------------------------------------------------


OffsetKey = tuple[str, str, int]


async def consumer_offsets(pool: ConnectionPool, addr: str) -> dict[OffsetKey, int]:
    """The demo groups' committed offsets on one broker."""
    table = await pool.call_pb(
        addr,
        RequestCode.GET_ALL_CONSUMER_OFFSET,
        common_pb2.Empty(),
        broker_pb2.ConsumerOffsetTable,
        3000,
    )
    return {
        (e.consumer_group, e.topic, e.queue_id): e.offset
        for e in table.entries
        if e.consumer_group in (GROUP, POP_GROUP)
    }


async def delay_offset(pool: ConnectionPool, addr: str) -> int:
    table = await pool.call_pb(
        addr,
        RequestCode.GET_ALL_DELAY_OFFSET,
        common_pb2.Empty(),
        broker_pb2.DelayOffsetTable,
        3000,
    )
    return int(table.offsets.get(DELAY_LEVEL, 0))


async def http_json(session: aiohttp.ClientSession, handle: ProcessHandle, path: str) -> Any:
    async with session.get(f"http://{handle.http}{path}") as resp:
        resp.raise_for_status()
        return await resp.json()


async def escapes(session: aiohttp.ClientSession, handle: ProcessHandle) -> Counter[str]:
    """``hac_escape_messages_total{result="ok"}`` of one broker, by "kind->target"."""
    async with session.get(f"http://{handle.http}/metrics") as resp:
        text = await resp.text()
    out: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "hac_escape_messages_total" and s.labels.get("result") == "ok":
                out[f"{s.labels['kind']}->{s.labels['target']}"] += int(s.value)
    return out


async def replicated(session: aiohttp.ClientSession, master: ProcessHandle) -> bool:
    """Both slaves hold everything the master stored."""
    status = await http_json(session, master, "/api/v1/status")
    slaves = status["slaves"]
    top = int(status["commitLogMaxOffset"])
    return len(slaves) == 2 and all(int(s["ackedOffset"]) >= top for s in slaves)


class PreOnline:
    """The returning master: its pre-online steps and the offsets it adopted."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.slave_offsets: dict[OffsetKey, int] = {}
        self.master_offsets: dict[OffsetKey, int] = {}
        self.slave_delay = 0
        self.master_delay = -1

    async def watch(
        self, session: aiohttp.ClientSession, master: ProcessHandle, log_from: int
    ) -> bool:
        async def online() -> bool:
            status = await http_json(session, master, "/api/v1/status")
            step = str(status["preOnlineStep"])
            if not self.steps or self.steps[-1] != step:
                self.steps.append(step)
            return step == "online" and not status["isolated"]

        ok = await within(online, 30)
        say(f"    pre-online steps (/api/v1/status): {' -> '.join(self.steps)}")
        with master.log_path.open("rb") as log:
            log.seek(log_from)
            lines = log.read().decode(errors="replace").splitlines()
        for line in lines:  # what this start of the master adopted from the acting slave
            if "pre-online: " in line and "of slave 1 adopted" in line and "timer" not in line:
                say("      master log: " + line[line.index("pre-online: ") :])
        return ok

    def invariant(self) -> Invariant:
        behind = [k for k, v in self.slave_offsets.items() if self.master_offsets.get(k, -1) < v]
        ok = (
            bool(self.steps)
            and self.steps[-1] == "online"
            and not behind
            and self.master_delay >= self.slave_delay
        )
        return Invariant(
            "pre-online",
            ok,
            f"consumer offsets >= acting slave's on {len(self.slave_offsets) - len(behind)}/"
            f"{len(self.slave_offsets)} queues; delay offset {self.master_delay} >= "
            f"{self.slave_delay}: {_yes(self.master_delay >= self.slave_delay)}",
        )


# ---- the demo -------------------------------------------------------------------------------


async def show_route(ns: NameserverClient) -> None:
    route = await ns.route(TOPIC)
    for b in route.broker_datas:
        q = route.queue(b.broker_name)
        perm = "" if q is None else Perm.to_string(q.perm)
        addrs = "  ".join(f"id {i}={a}" for i, a in sorted(b.broker_addrs.items()))
        say(f"    route {b.broker_name}: {addrs}  perm {perm}")


async def run_demo(per_phase: int = 150, rate: float = 150.0) -> bool:
    """Run the whole demo; True when every invariant held."""
    workdir = make_workdir("hac-demo-")
    say(f"starting a nameserver and groups {A}, {B} (master + 2 slaves each) in {workdir}")
    cluster = DrillCluster(
        ClusterSpec(groups=(A, B), replicas=3, env=DEMO_ENV), log_dir=workdir / "logs"
    )
    history = DemoHistory(workdir / "history.jsonl")
    invariants: list[Invariant] | None = None
    summary: list[str] = []
    try:
        await asyncio.to_thread(cluster.start)
        summary, invariants = await _scenario(cluster, history, per_phase, rate)
    except EventuallyTimeout as exc:
        say(f"FAILED: the cluster did not get there: {exc} (see the logs)")
    finally:
        history.close()
        await asyncio.to_thread(cluster.close)
    ok = invariants is not None and all(i.ok for i in invariants)
    if invariants is not None:
        say("verdict:")
        for line in summary:
            say(f"    {line}")
        for inv in invariants:
            say(f"    {inv.name + ':':<14}{inv.detail}  {'ok' if inv.ok else 'FAILED'}")
        failed = [i.name for i in invariants if not i.ok]
        say(
            f"OK: every invariant held ({len(invariants)} checked)"
            if ok
            else f"FAILED: {', '.join(failed)}"
        )
    if ok:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        say(f"logs kept in {workdir}")
    return ok


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _scenario(
    cluster: DrillCluster, history: DemoHistory, per_phase: int, rate: float
) -> tuple[list[str], list[Invariant]]:
    namesrv = cluster.namesrv
    master_a = broker_target(A, 0)
    async with contextlib.AsyncExitStack() as stack:
        pool = await stack.enter_async_context(ConnectionPool(connect_timeout_ms=1000))
        ns = await stack.enter_async_context(NameserverClient([namesrv], pool))
        session = await stack.enter_async_context(
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3))
        )
        lock_routes = await stack.enter_async_context(
            RouteCache(NameserverClient([namesrv], pool), watch=False)
        )
        observer = await stack.enter_async_context(RoleObserver(cluster, history))
        observing = asyncio.get_running_loop().create_task(observer.run(), name="role-observer")
        stack.push_async_callback(_cancel, observing)
        nemesis = Nemesis(cluster, history, observer)

        async def both_masters() -> bool:
            groups = await ns.groups()
            return len(groups) == 2 and all(g.master_online for g in groups)

        await eventually(both_masters, timeout=30)
        await ns.create_topic(TOPIC, queues=4)
        await ns.create_topic(POP_TOPIC, queues=4)
        await eventually(lambda: _route_has(ns, 2), timeout=10)
        await show_route(ns)

        await stack.enter_async_context(
            PushWorkload(namesrv, TOPIC, GROUP, history, process="consumer")
        )
        normal = NormalWork(
            await stack.enter_async_context(DemoProducer(namesrv, TOPIC, history, process=NORMAL)),
            history,
        )
        delayed = DelayedWork(
            await stack.enter_async_context(
                DemoProducer(
                    namesrv, TOPIC, history, process=DELAYED, delay_level=DELAY_LEVEL, size=64
                )
            ),
            history,
        )
        txs = TransactionWork(
            await stack.enter_async_context(DemoTransactions(namesrv, history)), history
        )
        pop = PopWork(
            await stack.enter_async_context(
                DemoProducer(namesrv, POP_TOPIC, history, process=POP, size=64)
            ),
            history,
        )
        locks = LockWork(lock_routes, pool, history)
        pre = PreOnline()

        say(f"phase 1: producing {per_phase} messages to both groups while consuming")
        await normal.produce(per_phase, rate)
        await normal.all_consumed(20)
        say(f"    leaving special work on {A} before its master dies:")
        await locks.at_master()
        await pop.send()
        await txs.open()
        await delayed.send()
        # in-sync replicas are 2 of 3: wait until slave 1 (the one that will
        # act) has everything too, so the demo shows takeover, not lag
        await within(lambda: replicated(session, cluster.handle(master_a)), 5)

        say(f"phase 2: kill -9 the master of {A}")
        t_kill = time.monotonic()
        kill = await nemesis.inject("kill", master_a)
        txs.w.armed = True
        acting_slave = cluster.handle(broker_target(A, 1))

        async def acting() -> bool:
            r = await ns.route(TOPIC)
            b, q = r.broker(A), r.queue(A)
            return bool(
                b
                and q
                and b.broker_addrs.get(0) == acting_slave.rpc
                and not Perm.is_writeable(q.perm)
            )

        await eventually(acting, timeout=10, interval=0.01)
        say(
            "    nameserver shows slave 1 as id 0, read-only, after "
            f"{time.monotonic() - t_kill:.2f} s"
        )
        await show_route(ns)
        await locks.at_acting_slave(acting_slave.rpc)
        await pop.while_acting(namesrv, stack)
        await txs.wait_resolved()
        await delayed.wait_delivered()
        bridge = await escapes(session, acting_slave)
        say(
            "    escape bridge of the acting slave (hac_escape_messages_total): "
            + ("  ".join(f"{k} {v}" for k, v in sorted(bridge.items())) or "nothing")
        )
        say(
            f"    producing {per_phase} more: they go to {B}; "
            "consuming continues from the acting slave"
        )
        await normal.produce(per_phase, rate)
        await normal.all_consumed(30)

        say(f"phase 3: restart the master of {A} (pre-online first, then online)")
        pre.slave_offsets = await consumer_offsets(pool, acting_slave.rpc)
        pre.slave_delay = await delay_offset(pool, acting_slave.rpc)
        log_from = cluster.handle(master_a).log_path.stat().st_size
        await nemesis.heal(kill)  # restarts it on its store
        master = cluster.handle(master_a)
        if await pre.watch(session, master, log_from):
            pre.master_offsets = await consumer_offsets(pool, master.rpc)
            pre.master_delay = await delay_offset(pool, master.rpc)
        a_sum = sum(pre.master_offsets.values())
        s_sum = sum(pre.slave_offsets.values())
        say(
            f"    offsets of {GROUP}, {POP_GROUP} on {A}: master {a_sum} (sum), "
            f"acting slave reached {s_sum}; delay offset of level {DELAY_LEVEL}: "
            f"master {pre.master_delay}, acting slave reached {pre.slave_delay}"
        )

        async def master_back() -> bool:
            r = await ns.route(TOPIC)
            b, q = r.broker(A), r.queue(A)
            return bool(
                b and q and b.broker_addrs.get(0) == master.rpc and Perm.is_writeable(q.perm)
            )

        await eventually(master_back, timeout=30)
        await show_route(ns)
        say(f"    producing {per_phase} more to both groups")
        await normal.produce(per_phase, rate)
        await normal.all_consumed(30)
        say("    watching 2 s more for duplicates, replayed delays, re-checked transactions")
        await pop.drain(2.0)  # let any duplicate surface

    return normal.summary(), [
        normal.invariant(),
        delayed.invariant(bridge),
        txs.invariant(bridge),
        pop.invariant(bridge),
        locks.invariant(),
        pre.invariant(),
    ]


async def _route_has(ns: NameserverClient, groups: int) -> bool:
    with contextlib.suppress(HaError):
        return len((await ns.route(TOPIC)).broker_datas) == groups
    return False
