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

The verdict has one line per invariant; the demo exits 0 only if all held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message, MessageQueue, ReceivedMessage
from ha_controller.client.orderly import QueueLocker
from ha_controller.client.producer import Producer, TransactionResolution
from ha_controller.client.push_consumer import PushConsumer
from ha_controller.client.routes import RouteCache
from ha_controller.client.simple_consumer import SimpleConsumer, retry_topic_of
from ha_controller.client.tools import body_for
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import HaError
from ha_controller.routing import Perm
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import (
    Cluster,
    EventuallyTimeout,
    ProcessHandle,
    eventually,
    make_workdir,
    run_cluster,
)

TOPIC = "DemoTopic"  # normal, delayed and transactional messages: one push consumer
POP_TOPIC = "DemoPop"
GROUP = "demo-consumers"
POP_GROUP = "demo-pop"
LOCK_GROUP = "demo-orderly"
A, B = "broker-a", "broker-b"
A_QUEUES = frozenset(MessageQueue(TOPIC, A, i) for i in range(4))

DELAY_LEVEL = 3  # 3 s with the levels below: due after the kill
DELAY_LEVELS = "1s 2s 3s 4s 5s 6s 7s 8s 9s 10s"
DELAY_S = 3.0
DELAY_TOLERANCE_S = 3.0  # "on time": at most this late (never early)
POP_INVISIBLE_S = 2.0
POP_MESSAGES = 16

# The cluster runs with short timers so that every special service acts within
# seconds (production defaults are 30 s transaction checks, 1 s revive, ...).
DEMO_ENV = {
    "HAC_DELAY_LEVELS": DELAY_LEVELS,
    "HAC_LOCK_IN_STRICT_MODE": "true",
    "HAC_TRANSACTION_CHECK_INTERVAL_MS": "300",
    "HAC_TRANSACTION_TIMEOUT_MS": "1000",
    "HAC_TRANSACTION_CHECK_MAX": "1000",
    "HAC_POP_REVIVE_INTERVAL_MS": "200",
}


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def now_ms() -> int:
    return int(time.time() * 1000)


def clock(ts_ms: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts_ms / 1000))


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


@dataclass
class Delivery:
    broker_name: str
    received_ms: int


@dataclass
class Tally:
    """Everything the push consumer of DemoTopic received, by business key."""

    acked: dict[str, str] = field(default_factory=dict)  # normal key -> broker
    failed: int = 0
    received: Counter[str] = field(default_factory=Counter)
    received_from: Counter[str] = field(default_factory=Counter)  # normal messages only
    first: dict[str, Delivery] = field(default_factory=dict)

    async def listener(self, m: ReceivedMessage) -> bool:
        self.received[m.key] += 1
        self.first.setdefault(m.key, Delivery(m.broker_name, now_ms()))
        if m.key.startswith("demo-"):
            self.received_from[m.broker_name] += 1
        return True

    def normal_received(self) -> int:
        return sum(1 for k in self.acked if k in self.received)

    def invariant(self) -> Invariant:
        lost = [k for k in self.acked if k not in self.received]
        dup = sum(self.received[k] - 1 for k in self.acked if self.received[k] > 1)
        return Invariant("normal", not lost and dup == 0, f"lost {len(lost)}  duplicated {dup}")


# ---- delayed ------------------------------------------------------------------


class DelayedWork:
    """Delayed messages on both groups; broker-a's are due after its master died."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.due_ms: dict[str, int] = {}
        self.sent_to: dict[str, str] = {}

    def on(self, group: str) -> list[str]:
        return [k for k, g in self.sent_to.items() if g == group]

    async def send(self, producer: Producer, at_least_on_a: int = 4) -> None:
        while len(self.on(A)) < at_least_on_a and len(self.sent_to) < 4 * at_least_on_a:
            key = f"delay-{len(self.sent_to):02d}"
            due = now_ms() + int(DELAY_S * 1000)  # the broker's due time is >= this
            r = await producer.send(
                Message(TOPIC, body_for(key, 64), keys=(key,), delay_level=DELAY_LEVEL)
            )
            self.due_ms[key], self.sent_to[key] = due, r.broker_name
        say(
            f"    delayed: {len(self.sent_to)} messages at level {DELAY_LEVEL} ({DELAY_S:.0f} s), "
            f"{len(self.on(A))} of them on {A}, due at {clock(max(self.due_ms.values()))} "
            "(after the kill)"
        )

    def lateness_s(self, keys: Iterable[str]) -> list[float]:
        return [
            (self.tally.first[k].received_ms - self.due_ms[k]) / 1000
            for k in keys
            if k in self.tally.first
        ]

    async def wait_delivered(self) -> None:
        await within(lambda: all(k in self.tally.first for k in self.due_ms), DELAY_S + 15)
        for group, how in ((A, f"by the acting slave through {B}"), (B, f"by {B} itself")):
            keys = self.on(group)
            if not keys:
                continue
            late = self.lateness_s(keys)
            via = sorted({self.tally.first[k].broker_name for k in keys if k in self.tally.first})
            span = f"{min(late):.2f}..{max(late):.2f} s late" if late else "-"
            say(
                f"    delayed: {len(late)}/{len(keys)} of {group} delivered {how} "
                f"(consumed from {', '.join(via) or '-'}), {span}"
            )

    def invariant(self, bridge: Counter[str]) -> Invariant:
        keys = list(self.due_ms)
        delivered = [k for k in keys if self.tally.received[k] >= 1]
        twice = [k for k in keys if self.tally.received[k] > 1]
        escaped = bridge[f"delay->{B}"] >= len(self.on(A)) and all(
            self.tally.first[k].broker_name == B for k in self.on(A) if k in delivered
        )
        late = self.lateness_s(keys)
        on_time = all(-0.1 <= s <= DELAY_TOLERANCE_S for s in late)
        worst = f"{max(late):.2f} s" if late else "-"
        ok = len(delivered) == len(keys) and not twice and escaped and on_time and bool(keys)
        return Invariant(
            "delayed",
            ok,
            f"{len(delivered)}/{len(keys)} delivered, {len(twice)} twice, "
            f"{A}'s escaped to {B}: {_yes(escaped)}, "
            f"latest {worst} late (limit {DELAY_TOLERANCE_S:.0f} s)",
        )


# ---- transactions ---------------------------------------------------------------


class Checker:
    """The producer's transaction checker: UNKNOWN while broker-a's master lives,
    then the decision the demo made for each transaction."""

    def __init__(self) -> None:
        self.armed = False
        self.decisions: dict[str, TransactionResolution] = {}
        self.unknown_answers = 0
        self.asked: list[tuple[str, str, TransactionResolution]] = []  # key, broker, answer

    async def __call__(self, m: ReceivedMessage) -> TransactionResolution:
        if not self.armed:
            self.unknown_answers += 1
            return TransactionResolution.UNKNOWN
        answer = self.decisions.get(m.key, TransactionResolution.ROLLBACK)
        self.asked.append((m.key, m.broker_name, answer))
        return answer


class TransactionWork:
    """Two transactions left open on broker-a: the checker commits one and rolls
    back the other once the master is gone."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.checker = Checker()
        self.commit: list[str] = []
        self.rollback: list[str] = []  # by the checker (on broker-a) or at once (on broker-b)

    async def open(self, producer: Producer) -> None:
        explicit = 0
        for i in range(12):
            if len(self.checker.decisions) == 2:
                break
            key = f"tx-{i:02d}"
            tx = producer.begin_transaction()
            r = await producer.send(Message(TOPIC, body_for(key, 64), keys=(key,)), transaction=tx)
            if r.broker_name != A:
                await tx.rollback()
                self.rollback.append(key)
                explicit += 1
            elif not self.commit:
                self.commit.append(key)
                self.checker.decisions[key] = TransactionResolution.COMMIT
            else:
                self.rollback.append(key)
                self.checker.decisions[key] = TransactionResolution.ROLLBACK
        on_a = list(self.checker.decisions)
        say(
            f"    transactions: {len(on_a)} open on {A} ({', '.join(on_a)}), the checker "
            "answers UNKNOWN while the master lives"
            + (f"; {explicit} that landed on {B} rolled back at once" if explicit else "")
        )

    def resolved(self) -> bool:
        asked = {k for k, _, _ in self.checker.asked}
        return all(self.tally.received[k] for k in self.commit) and asked >= set(
            self.checker.decisions
        )

    async def wait_resolved(self) -> None:
        await within(self.resolved, 20)
        by = sorted({b for _, b, _ in self.checker.asked})
        answers = ", ".join(f"{k} {a.name.lower()}" for k, _, a in self.checker.asked)
        where = sorted(
            {self.tally.first[k].broker_name for k in self.commit if k in self.tally.first}
        )
        say(
            f"    transactions: the checker was asked by {', '.join(by) or 'nobody'}: "
            f"{answers or '-'}; the committed one consumed from {', '.join(where) or '-'}"
            + (
                f" (before the kill: {self.checker.unknown_answers} checks, UNKNOWN)"
                if self.checker.unknown_answers
                else ""
            )
        )

    def invariant(self, bridge: Counter[str]) -> Invariant:
        once = [k for k in self.commit if self.tally.received[k] == 1]
        leaked = [k for k in self.rollback if self.tally.received[k]]
        answered = {k for k, _, _ in self.checker.asked} >= set(self.checker.decisions)
        escaped = bridge[f"transaction_half->{B}"] >= len(self.checker.decisions)
        ok = (
            bool(self.commit)
            and len(once) == len(self.commit)
            and not leaked
            and answered
            and escaped
        )
        return Invariant(
            "transactions",
            ok,
            f"committed {len(self.commit)} delivered "
            f"{'/'.join(str(self.tally.received[k]) for k in self.commit) or '-'}x (expected 1), "
            f"rolled back {len(self.rollback)} delivered {len(leaked)}, "
            f"open halves escaped to {B}: {_yes(escaped)}, resolved by the checker: "
            f"{_yes(answered)}",
        )


# ---- POP ------------------------------------------------------------------------


class PopWork:
    """POP messages received and acked through broker-a's acting slave; one is
    left un-acked and must come back, once, from the retry topic."""

    def __init__(self) -> None:
        self.sent_to: dict[str, str] = {}
        self.first: Counter[str] = Counter()
        self.first_from: Counter[str] = Counter()
        self.again: Counter[str] = Counter()  # from %RETRY%<group>
        self.again_from: set[str] = set()
        self.unacked: str | None = None
        self.unacked_at = 0.0
        self.ack_failures = 0
        self.consumer: SimpleConsumer | None = None

    async def send(self, producer: Producer) -> None:
        for i in range(POP_MESSAGES):
            key = f"pop-{i:02d}"
            r = await producer.send(Message(POP_TOPIC, key.encode(), keys=(key,)))
            self.sent_to[key] = r.broker_name
        on_a = sum(1 for g in self.sent_to.values() if g == A)
        say(f"    POP: {POP_MESSAGES} messages on {POP_TOPIC} ({on_a} on {A}), not received yet")

    async def _ack(self, consumer: SimpleConsumer, m: ReceivedMessage) -> None:
        try:
            await consumer.ack(m)
        except HaError:
            self.ack_failures += 1

    async def _receive_round(self) -> None:
        assert self.consumer is not None
        for m in await self.consumer.receive(POP_MESSAGES, wait_s=0.3):
            key = m.body.decode(errors="replace")
            if m.topic == retry_topic_of(POP_GROUP):
                self.again[key] += 1
                self.again_from.add(m.broker_name)
            else:
                self.first[key] += 1
                self.first_from[m.broker_name] += 1
                if self.unacked is None and m.broker_name == A:
                    self.unacked, self.unacked_at = key, time.monotonic()
                    continue  # left un-acked on purpose
            await self._ack(self.consumer, m)

    async def while_acting(self, namesrv: str) -> None:
        self.consumer = SimpleConsumer(
            namesrv, POP_GROUP, [POP_TOPIC], invisible_duration_s=POP_INVISIBLE_S
        )

        async def all_received() -> bool:
            await self._receive_round()
            return set(self.first) >= set(self.sent_to)

        await within(all_received, 20)
        acked = sum(self.first.values()) - (self.unacked is not None) - self.ack_failures
        say(
            f"    POP: received {sum(self.first.values())} ({self.first_from[A]} from {A}'s "
            f"acting slave), acked {acked}; left {self.unacked} (on {A}) un-acked"
        )

        async def came_back() -> bool:
            await self._receive_round()
            return self.unacked is not None and self.again[self.unacked] >= 1

        if await within(came_back, POP_INVISIBLE_S + 15):
            say(
                f"    POP: {self.unacked} came back from {retry_topic_of(POP_GROUP)} "
                f"{time.monotonic() - self.unacked_at:.1f} s later (invisible "
                f"{POP_INVISIBLE_S:.0f} s; revived by {', '.join(sorted(self.again_from))}), acked"
            )
        else:
            say(f"    POP: {self.unacked} did not come back")

    async def drain(self, seconds: float) -> None:
        """Keep receiving: anything that arrives now is a redelivery too many."""
        deadline = time.monotonic() + seconds
        while self.consumer is not None and time.monotonic() < deadline:
            await self._receive_round()

    async def __aenter__(self) -> PopWork:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.consumer is not None:
            await self.consumer.aclose()

    def invariant(self, bridge: Counter[str]) -> Invariant:
        twice = [k for k, c in self.first.items() if c > 1]
        back = {k: c for k, c in self.again.items() if k != self.unacked}
        revived = self.unacked is not None and self.again[self.unacked] == 1
        escaped = bridge[f"pop_ck->{B}"] >= 1 and bridge[f"pop_ack->{B}"] >= 1
        ok = set(self.first) == set(self.sent_to) and not twice and not back and revived and escaped
        return Invariant(
            "POP",
            ok,
            f"received {len(self.first)}/{len(self.sent_to)} ({len(twice)} more than once), "
            f"un-acked one redelivered {self.again[self.unacked or '']}x (expected 1), "
            f"acked ones redelivered {sum(back.values())}, CK/ACK escaped to {B}: "
            f"{_yes(escaped)}",
        )


# ---- locks ----------------------------------------------------------------------


class LockWork:
    """Client A holds broker-a's queues (strict mode); client B wants them too."""

    def __init__(self, routes: RouteCache, pool: ConnectionPool) -> None:
        self.routes = routes
        self.a = QueueLocker(routes, pool, LOCK_GROUP, "demo-client-A")
        self.b = QueueLocker(routes, pool, LOCK_GROUP, "demo-client-B")
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
        ok = self.results.get("locks", False) and self.results.get("renews", False)
        return Invariant(
            "locks",
            ok,
            f"A granted, B refused at the master: {_yes(self.results.get('locks'))}; "
            f"at the acting slave: {_yes(self.results.get('renews'))}",
        )


def _yes(value: bool | None) -> str:
    return "yes" if value else "NO"


# ---- broker inspection ------------------------------------------------------------


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


# ---- the demo -----------------------------------------------------------------------


async def show_route(ns: NameserverClient) -> None:
    route = await ns.route(TOPIC)
    for b in route.broker_datas:
        q = route.queue(b.broker_name)
        perm = "" if q is None else Perm.to_string(q.perm)
        addrs = "  ".join(f"id {i}={a}" for i, a in sorted(b.broker_addrs.items()))
        say(f"    route {b.broker_name}: {addrs}  perm {perm}")


async def run_demo(per_phase: int = 150, rate: float = 150.0) -> bool:
    workdir = make_workdir("hac-demo-")
    say(f"starting a nameserver and groups {A}, {B} (master + 2 slaves each) in {workdir}")
    cluster: Cluster = await asyncio.to_thread(
        run_cluster, (A, B), 3, workdir=workdir, env=DEMO_ENV
    )
    invariants: list[Invariant] | None = None
    try:
        summary, invariants = await _scenario(cluster, per_phase, rate)
    except EventuallyTimeout as exc:
        say(f"FAILED: the cluster did not get there: {exc} (see the logs)")
    finally:
        await asyncio.to_thread(cluster.stop)
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


async def _scenario(
    cluster: Cluster, per_phase: int, rate: float
) -> tuple[list[str], list[Invariant]]:
    tally = Tally()
    delayed = DelayedWork(tally)
    txs = TransactionWork(tally)
    pop = PopWork()
    pre = PreOnline()
    async with (
        ConnectionPool(connect_timeout_ms=1000) as pool,
        NameserverClient([cluster.namesrv], pool) as ns,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session,
        RouteCache(NameserverClient([cluster.namesrv], pool), watch=False) as lock_routes,
    ):

        async def both_masters() -> bool:
            groups = await ns.groups()
            return len(groups) == 2 and all(g.master_online for g in groups)

        await eventually(both_masters, timeout=30)
        await ns.create_topic(TOPIC, queues=4)
        await ns.create_topic(POP_TOPIC, queues=4)
        await eventually(lambda: _route_has(ns, 2), timeout=10)
        await show_route(ns)

        consumer = PushConsumer(
            cluster.namesrv, GROUP, TOPIC, tally.listener, commit_interval_s=0.5
        )
        producer = Producer(cluster.namesrv, group="demo-producer")
        tx_producer = Producer(
            cluster.namesrv,
            group="demo-tx-producer",
            checker=txs.checker,
            heartbeat_interval_s=0.5,
            topics=[TOPIC],
        )
        locks = LockWork(lock_routes, pool)
        async with consumer, producer, tx_producer, pop:
            seq = 0

            async def produce(n: int) -> None:
                nonlocal seq
                for _ in range(n):
                    key = f"demo-{seq:06d}"
                    seq += 1
                    try:
                        r = await producer.send(Message(TOPIC, body_for(key, 256), keys=(key,)))
                    except HaError:
                        tally.failed += 1
                    else:
                        tally.acked[key] = r.broker_name
                    await asyncio.sleep(1 / rate)

            async def all_consumed(timeout: float) -> None:
                await within(lambda: tally.normal_received() >= len(tally.acked), timeout)
                say(f"    acknowledged {len(tally.acked)}, consumed {tally.normal_received()}")

            say(f"phase 1: producing {per_phase} messages to both groups while consuming")
            await produce(per_phase)
            await all_consumed(20)
            say(f"    leaving special work on {A} before its master dies:")
            await locks.at_master()
            await pop.send(producer)
            await txs.open(tx_producer)
            await delayed.send(producer)
            # in-sync replicas are 2 of 3: wait until slave 1 (the one that will
            # act) has everything too, so the demo shows takeover, not lag
            await within(lambda: replicated(session, cluster.broker(A, 0)), 5)

            say(f"phase 2: kill -9 the master of {A}")
            t_kill = time.monotonic()
            cluster.broker(A, 0).kill()
            txs.checker.armed = True
            acting_slave = cluster.broker(A, 1)

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
            await pop.while_acting(cluster.namesrv)
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
            await produce(per_phase)
            await all_consumed(30)

            say(f"phase 3: restart the master of {A} (pre-online first, then online)")
            pre.slave_offsets = await consumer_offsets(pool, acting_slave.rpc)
            pre.slave_delay = await delay_offset(pool, acting_slave.rpc)
            log_from = cluster.broker(A, 0).log_path.stat().st_size
            master = await asyncio.to_thread(cluster.restart, A, 0)
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
            await produce(per_phase)
            await all_consumed(30)
            say("    watching 2 s more for duplicates, replayed delays, re-checked transactions")
            await pop.drain(2.0)  # let any duplicate surface

    summary = [
        f"sent {len(tally.acked) + tally.failed}  acknowledged {len(tally.acked)}  "
        f"failed (not acknowledged) {tally.failed}",
        f"consumed {tally.normal_received()}  by group {dict(tally.received_from)}",
    ]
    return summary, [
        tally.invariant(),
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


def main() -> int:
    logging.basicConfig(level=logging.ERROR, format="    (%(name)s: %(message)s)")
    return 0 if asyncio.run(run_demo()) else 1


if __name__ == "__main__":
    sys.exit(main())
