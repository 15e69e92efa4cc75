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
import shutil
import time
from collections import Counter
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ha_controller.cli.demo_work import (
    DELAY_LEVEL,
    DELAYED,
    DEMO_ENV,
    GROUP,
    NORMAL,
    POP,
    POP_GROUP,
    POP_TOPIC,
    TOPIC,
    A,
    B,
    DelayedWork,
    DemoHistory,
    DemoProducer,
    DemoTransactions,
    Invariant,
    LockWork,
    NormalWork,
    PopWork,
    TransactionWork,
    say,
    within,
    yes_no,
)
from ha_controller.client.admin import NameserverClient
from ha_controller.client.routes import RouteCache
from ha_controller.drills.cluster import ClusterSpec, DrillCluster, broker_target
from ha_controller.drills.nemesis import Nemesis, RoleObserver
from ha_controller.drills.workloads import (
    PushWorkload,
)
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import HaError
from ha_controller.routing import Perm
from ha_controller.rpc import ConnectionPool
from ha_controller.testing import EventuallyTimeout, ProcessHandle, eventually, make_workdir

__all__ = ["run_demo"]


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
            f"{self.slave_delay}: {yes_no(self.master_delay >= self.slave_delay)}",
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
