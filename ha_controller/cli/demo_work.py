"""The demo's parts (:mod:`.demo_scenario` tells the story): its topics, groups and short
timers, the history it keeps in memory too, the workloads it drives, and one class per
kind of work — normal, delayed and transactional messages, POP, queue locks — that leaves
its work on broker-a before the kill and then checks what became of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ha_controller.client.message import Message, MessageQueue, ReceivedMessage
from ha_controller.client.routes import RouteCache
from ha_controller.client.simple_consumer import retry_topic_of
from ha_controller.client.tools import body_for
from ha_controller.client.transaction import TransactionResolution
from ha_controller.drills.checker import CheckOptions, Verdict, check
from ha_controller.drills.history import Event, HistoryWriter, SendInvoke
from ha_controller.drills.workloads import (
    PopWorkload,
    ProducerWorkload,
    RecordingQueueLocker,
    TransactionWorkload,
)
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import EventuallyTimeout, eventually

__all__ = [
    "A",
    "B",
    "DELAYED",
    "DELAY_LEVEL",
    "DEMO_ENV",
    "DelayedWork",
    "DemoHistory",
    "DemoProducer",
    "DemoTransactions",
    "GROUP",
    "Invariant",
    "LockWork",
    "NORMAL",
    "NormalWork",
    "POP",
    "POP_GROUP",
    "POP_TOPIC",
    "PopWork",
    "TOPIC",
    "TransactionWork",
    "say",
    "within",
    "yes_no",
]

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


def yes_no(value: bool | None) -> str:
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
            f"{A}'s escaped to {B}: {yes_no(escaped)}, "
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
            f"open halves escaped to {B}: {yes_no(escaped)}, resolved by the checker: "
            f"{yes_no(self.answered())}",
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
            f"acked ones redelivered {back}, CK/ACK escaped to {B}: {yes_no(escaped)}",
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
            f"A granted, B refused at the master: {yes_no(self.results.get('locks'))}; "
            f"at the acting slave: {yes_no(self.results.get('renews'))}",
        )
