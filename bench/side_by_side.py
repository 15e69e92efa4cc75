"""Side-by-side drill: one generated fault schedule against Apache RocketMQ 5.5 (slave
acting master) and against ha-controller, both driven through the official RocketMQ 5
Python SDK and judged by the same checker.

    .venv/bin/python bench/side_by_side.py                 # seed 7, 4 faults, both targets
    .venv/bin/python bench/side_by_side.py --seed 3 --faults 6 --families kill,pause

The schedule comes from ``ha_controller.drills.generator`` (families kill, pause,
pause-past-expiry by default; the network-namespace families are not offered here: the
JVM peers are not started inside namespaces).  Each target gets a fresh deployment of
two groups (master + SYNC slave; RocketMQ with ``enableSlaveActingMaster=true`` and its
gRPC proxy, ours with ``hactl proxy``), the same workload — normal, delayed (3 s) and
transactional sends with unique keys, one POP SimpleConsumer group on all three topics
acknowledging what it receives — and the same faults at the same offsets (kill -9 healed
by a restart on the same store; SIGSTOP healed by SIGCONT).  Each history is written in
the drill format (``ha_controller.drills.history``) and judged by
``ha_controller.drills.checker`` with the generated drills' POP options (duplicates count
after the first ack; 5 s timer tolerance); ``pop_redeliveries`` counts deliveries of a
key before its first ack beyond the first one.

Writes ``<out>/<target>/{history.jsonl,verdict.json}``, ``<out>/schedule.json`` and
``<out>/comparison.{json,md}``; every process started is stopped on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jvm_peers import ROCKETMQ_VERSION, RocketMQCluster
from peers import GatewayCluster, Proc

from ha_controller.drills.checker import CheckOptions, Verdict, check
from ha_controller.drills.generator import GeneratorSpec, Schedule, ScheduleGenerator
from ha_controller.drills.history import (
    Ack,
    EndTx,
    Event,
    Fault,
    HistoryWriter,
    Receive,
    SendInvoke,
    SendOk,
    SendOutcome,
    Subscribe,
    read_history,
)
from ha_controller.testing import FAST_ENV

HERE = Path(__file__).resolve().parent
TOPICS = {"sbs-normal": "NORMAL", "sbs-delay": "DELAY", "sbs-tx": "TRANSACTION"}
GROUP = "sbs-pop"
CONSUMER = "consumer-1"
PRODUCER = "producer-1"
DELAY_MS = 3000
CHECK = CheckOptions(timer_tolerance_ms=5000, level_tolerance_ms=5000, redelivery="after_ack")
#: both deployments' not-active timeout (RocketMQ's brokerNotActiveTimeoutMillis is set
#: to ours, bench/jvm_peers.py): "pause" stays below it, "pause-past-expiry" goes past it
NOT_ACTIVE_TIMEOUT_MS = int(FAST_ENV["HAC_BROKER_NOT_ACTIVE_TIMEOUT_MS"])


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def keep_system_properties() -> None:
    """The SDK's received Message drops the queue id, offset and store host of the
    protobuf it was made from; keep them (``hac_system``) for the history."""
    from rocketmq.v5.model import message as sdk_message

    original = sdk_message.Message.fromProtobuf
    if getattr(original, "hac_patched", False):
        return

    def from_protobuf(self: Any, pb: Any) -> Any:
        out = original(self, pb)
        self.hac_system = pb.system_properties
        return out

    from_protobuf.hac_patched = True  # type: ignore[attr-defined]
    sdk_message.Message.fromProtobuf = from_protobuf


# ---- targets --------------------------------------------------------------------------------


class RocketMQTarget:
    name = "rocketmq"

    def __init__(self, workdir: Path) -> None:
        self.cluster = RocketMQCluster(workdir, mode="acting")
        self.version = f"Apache RocketMQ {ROCKETMQ_VERSION} (slave acting master)"

    async def start(self) -> None:
        await self.cluster.start()
        for topic, kind in TOPICS.items():
            await self.cluster.create_topic(topic, message_type=kind)

    @property
    def endpoint(self) -> str:
        return self.cluster.endpoint

    def store_groups(self) -> dict[str, str]:
        return {f"127.0.0.1:{p}": n.rsplit("-", 1)[0] for n, p in self.cluster.broker_ports.items()}

    def _proc(self, target: str) -> Proc:
        group, bid = target.split("/")
        return self.cluster.procs[f"{group}-{bid}"]

    def kill(self, target: str) -> None:
        self._proc(target).kill9()

    async def restart(self, target: str) -> None:
        old = self._proc(target)
        self.cluster.procs[old.name] = Proc(old.name, old.argv, old.env, old.log).start()

    def pause(self, target: str) -> None:
        self._proc(target).pause()

    def resume(self, target: str) -> None:
        self._proc(target).resume()

    async def aclose(self) -> None:
        await self.cluster.aclose()


class OursTarget:
    name = "ha-controller"

    def __init__(self, workdir: Path) -> None:
        self.cluster = GatewayCluster(workdir, ("broker-a", "broker-b"))
        self.version = ""

    async def start(self) -> None:
        await self.cluster.start()
        self.version = self.cluster.version
        for topic in TOPICS:
            await self.cluster.create_topic(topic)

    @property
    def endpoint(self) -> str:
        return self.cluster.endpoint

    def store_groups(self) -> dict[str, str]:
        c: Any = self.cluster.cluster
        return {h.rpc: name for (name, _), h in c.brokers.items()}

    def _handle(self, target: str) -> Any:
        group, bid = target.split("/")
        return self.cluster.broker(group, int(bid))

    def kill(self, target: str) -> None:
        self._handle(target).kill()

    async def restart(self, target: str) -> None:
        group, bid = target.split("/")
        c: Any = self.cluster.cluster
        await asyncio.to_thread(c.restart, group, int(bid))

    def pause(self, target: str) -> None:
        self._handle(target).pause()

    def resume(self, target: str) -> None:
        self._handle(target).resume()

    async def aclose(self) -> None:
        await self.cluster.aclose()


# ---- the workload (the SDK is synchronous: two threads) ----------------------------------------


class Workload:
    def __init__(
        self,
        endpoint: str,
        history: HistoryWriter,
        rate: float,
        groups: Callable[[], dict[str, str]],
    ) -> None:
        self.endpoint = endpoint
        self.history = history
        self.rate = rate
        self.groups = groups
        self.stop_sending = threading.Event()
        self.stop_receiving = threading.Event()
        self.last_receive = time.monotonic()
        self.errors: Counter[str] = Counter()
        self.threads: list[threading.Thread] = []

    def _config(self) -> Any:
        from rocketmq import ClientConfiguration, Credentials

        return ClientConfiguration(self.endpoint, Credentials(), request_timeout=3)

    def start(self) -> None:
        from rocketmq import FilterExpression, Producer, SimpleConsumer, TransactionChecker
        from rocketmq.grpc_protocol import TransactionResolution

        history = self.history

        class Checker(TransactionChecker):  # type: ignore[misc]
            def check(self, message: Any) -> Any:
                key = next(iter(message.keys), "")
                history.record(PRODUCER, "ok", EndTx(key, True), t_ms=None)
                return TransactionResolution.COMMIT

        self.producer = Producer(self._config(), tuple(TOPICS), checker=Checker())
        self.producer.startup()
        # one POP consumer (and group) per topic, each with two receive loops: a
        # SimpleConsumer receive long-polls one topic on one broker (at least 5 s at
        # RocketMQ's proxy: a shorter call deadline is a BAD_REQUEST), so one loop
        # would leave a due message on the other broker waiting for its turn
        self.consumers = {}
        for topic in TOPICS:
            group = f"{GROUP}-{topic}"
            consumer = SimpleConsumer(
                self._config(), group, {topic: FilterExpression()}, await_duration=5
            )
            consumer.startup()
            self.consumers[group] = consumer
            history.record(CONSUMER, "info", Subscribe(CONSUMER, group, topic))
        loops = [self._send_loop] + [
            lambda g=g, c=c: self._receive_loop(g, c)
            for g, c in self.consumers.items()
            for _ in range(2)
        ]
        for target in loops:
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self.threads.append(thread)

    def _send_loop(self) -> None:
        from rocketmq import Message

        n = 0
        period = 1 / self.rate
        while not self.stop_sending.is_set():
            started = time.monotonic()
            key = f"k{n}"
            kind = "tx" if n % 7 == 3 else "delay" if n % 5 == 2 else "normal"
            topic = f"sbs-{kind}"
            msg = Message()
            msg.topic = topic
            msg.body = key.encode()
            msg.keys = key
            due = None
            if kind == "delay":
                # whole seconds: rocketmq-python-client 5.1.2 puts this value into the
                # protobuf Timestamp's seconds unchanged (its docs say ms; RocketMQ's
                # proxy rejects ms there, our gateway takes them)
                due_s = int(time.time() + DELAY_MS / 1000)
                msg.delivery_timestamp = due_s
                due = due_s * 1000
            self.history.record(
                PRODUCER, "invoke", SendInvoke(key, topic, due_ts_ms=due, tx=kind == "tx" or None)
            )
            try:
                tx = self.producer.begin_transaction() if kind == "tx" else None
                receipt = self.producer.send(msg, tx)
                mq = receipt.message_queue.message_queue0()  # the SDK's own protobuf of it
                self.history.record(
                    PRODUCER,
                    "ok",
                    SendOk(
                        key,
                        str(receipt.message_id),
                        mq.broker.name,
                        mq.id,
                        int(receipt.offset or 0),
                    ),
                )
                if tx is not None:
                    self.history.record(PRODUCER, "invoke", EndTx(key, True))
                    try:
                        tx.commit()
                        self.history.record(PRODUCER, "ok", EndTx(key, True))
                    except Exception as exc:  # the broker's check-back resolves it
                        self.history.record(PRODUCER, "info", EndTx(key, True))
                        self.errors[f"commit: {type(exc).__name__}"] += 1
            except Exception as exc:
                self.history.record(PRODUCER, "info", SendOutcome(key, error=str(exc)[:200]))
                self.errors[f"send: {type(exc).__name__}"] += 1
            n += 1
            left = period - (time.monotonic() - started)
            if left > 0:
                time.sleep(left)

    def _receive_loop(self, group: str, consumer: Any) -> None:
        while not self.stop_receiving.is_set():
            try:
                messages = consumer.receive(32, 15)
            except Exception as exc:
                self.errors[f"receive: {type(exc).__name__}"] += 1
                time.sleep(0.2)
                continue
            for m in messages or []:
                self.last_receive = time.monotonic()
                sysp = getattr(m, "hac_system", None)
                host = str(getattr(sysp, "store_host", "")) if sysp is not None else ""
                key = next(iter(m.keys), "") if m.keys else m.body.decode(errors="replace")
                self.history.record(
                    CONSUMER,
                    "ok",
                    Receive(
                        key,
                        str(m.message_id),
                        self.groups().get(host, host or "?"),
                        int(getattr(sysp, "queue_id", -1)),
                        int(getattr(sysp, "queue_offset", -1)),
                        CONSUMER,
                        group,
                        topic=m.topic,
                        due_ts_ms=m.delivery_timestamp,
                    ),
                )
                try:
                    consumer.ack(m)
                    self.history.record(CONSUMER, "ok", Ack(key, CONSUMER, group))
                except Exception as exc:  # it comes back after its invisible time
                    self.errors[f"ack: {type(exc).__name__}"] += 1

    def close(self) -> None:
        self.stop_sending.set()
        self.stop_receiving.set()
        for thread in self.threads:
            thread.join(30)
        for client in (self.producer, *self.consumers.values()):
            with contextlib.suppress(Exception):
                client.shutdown()


# ---- one target --------------------------------------------------------------------------------


async def run_target(
    target: Any, schedule: Schedule, out: Path, rate: float, settle_s: float
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "history.jsonl").unlink(missing_ok=True)
    say(f"{target.name}: starting")
    t0 = time.monotonic()
    await target.start()
    say(f"{target.name}: up in {time.monotonic() - t0:.0f} s ({target.version})")
    history = HistoryWriter(out / "history.jsonl", columnar=False)
    # store host -> group, asked again on each receive (a restarted broker of ours
    # listens on a new port)
    work = Workload(target.endpoint, history, rate, target.store_groups)
    await asyncio.to_thread(work.start)
    try:
        await asyncio.sleep(5)  # a steady stream first
        for i, step in enumerate(schedule.steps):
            say(f"{target.name}: step {i + 1}: " + "; ".join(f.describe() for f in step.faults))
            start = time.monotonic()
            events = sorted(
                [(f.offset_s, "inject", f) for f in step.faults]
                + [(f.end_s, "heal", f) for f in step.faults],
                key=lambda e: e[0],
            )
            for at, action, fault in events:
                await asyncio.sleep(max(0.0, start + at - time.monotonic()))
                value = Fault(fault.kind, fault.target, family=fault.family)
                if action == "inject":
                    if fault.kind == "kill":
                        target.kill(fault.target)
                    else:
                        target.pause(fault.target)
                    history.record("nemesis", "info", value)
                else:
                    if fault.kind == "kill":
                        await target.restart(fault.target)
                    else:
                        target.resume(fault.target)
                    history.record("nemesis", "ok", value)
            await asyncio.sleep(step.gap_s)
        # the stream goes on after the last heal (does every group take writes again?)
        await asyncio.sleep(settle_s)
        work.stop_sending.set()
        # drain: until 30 s without a delivery, at most 120 s
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and time.monotonic() - work.last_receive < 30:
            await asyncio.sleep(1)
    finally:
        await asyncio.to_thread(work.close)
        history.close()
        await target.aclose()
    verdict = check(out / "history.jsonl", scenario=f"side-by-side {target.name}", options=CHECK)
    (out / "verdict.json").write_text(verdict.to_json())
    doc = summarize(verdict, read_history(out / "history.jsonl"))
    doc["version"] = target.version
    doc["client_errors"] = dict(work.errors)
    return doc


def summarize(verdict: Verdict, events: list[Event]) -> dict[str, Any]:
    """The verdict's counts and windows plus POP redeliveries (before the first ack)."""
    first_ack: dict[str, int] = {}
    for ev in events:
        if ev.f == "ack" and ev.type == "ok":
            first_ack.setdefault(str(ev.value.get("key")), ev.t_ms)
    before_ack: Counter[str] = Counter()
    for ev in events:
        if ev.f == "receive" and ev.type == "ok":
            key = str(ev.value.get("key"))
            if ev.t_ms <= first_ack.get(key, 1 << 62):
                before_ack[key] += 1
    d = verdict.to_dict()
    return {
        "ok": d["ok"],
        "counts": d["counts"],
        "pop_redeliveries": sum(n - 1 for n in before_ack.values() if n > 1),
        "availability": d["availability"],
        "faults": d["faults"],
    }


def comparison_md(doc: dict[str, Any]) -> str:
    targets = list(doc["targets"])
    lines = [
        f"# Side-by-side drill, seed {doc['seed']}: {', '.join(targets)}",
        "",
        f"Command: `{doc['command']}`  ",
        "Schedule: " + " / ".join(doc["schedule"]) + "  ",
        "Clients: the official RocketMQ 5 Python SDK (rocketmq-python-client "
        f"{doc['sdk']}) for both; checker: ha_controller.drills.checker (POP options).",
        "",
        "| | " + " | ".join(f"{t} ({doc['targets'][t]['version']})" for t in targets) + " |",
        "|---|" + "---|" * len(targets),
    ]
    rows = [
        ("verdict ok", lambda d: "yes" if d["ok"] else "**no**"),
        *(
            (name, lambda d, n=name: str(d["counts"][n]))
            for name in (
                "acknowledged",
                "delivered",
                "lost",
                "duplicated",
                "unexpected",
                "recovered",
                "late_delayed",
                "unresolved_transactions",
            )
        ),
        ("POP redeliveries (before the first ack)", lambda d: str(d["pop_redeliveries"])),
    ]
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(cell(doc["targets"][t]) for t in targets) + " |")
    kinds = sorted({k for t in targets for k in doc["targets"][t]["availability"]})
    for kind in kinds:
        for stat in ("max", "p50"):
            vals = [doc["targets"][t]["availability"].get(kind, {}).get(stat) for t in targets]
            lines.append(
                f"| {kind} {stat} | "
                + " | ".join("n/a" if v is None else str(v) for v in vals)
                + " |"
            )
    lines.append(
        "| client errors | "
        + " | ".join(
            ", ".join(f"{k} {v}" for k, v in doc["targets"][t]["client_errors"].items()) or "none"
            for t in targets
        )
        + " |"
    )
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> int:
    from importlib import metadata

    keep_system_properties()
    spec = GeneratorSpec(
        groups=("broker-a", "broker-b"),
        replicas=2,
        not_active_timeout_ms=NOT_ACTIVE_TIMEOUT_MS,
        overlap_ratio=0.0,
        fault_s=(4.0, 8.0),
    )
    schedule = ScheduleGenerator(args.seed, spec).generate(args.families.split(","), args.faults)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "schedule.json").write_text(schedule.to_json())
    say("schedule: " + " / ".join(schedule.describe()))
    workdir = Path(tempfile.mkdtemp(prefix="hac-sbs-"))
    doc: dict[str, Any] = {
        "seed": args.seed,
        "command": " ".join(sys.argv),
        "schedule": schedule.describe(),
        "sdk": metadata.version("rocketmq-python-client"),
        "targets": {},
    }
    makers = {"rocketmq": RocketMQTarget, "ours": OursTarget}
    for name in args.targets:
        target = makers[name](workdir / name)
        try:
            doc["targets"][target.name] = await run_target(
                target, schedule, out / target.name, args.rate, args.settle
            )
        except Exception as exc:
            say(f"{target.name}: FAILED {exc!r}")
            doc["targets"][target.name] = {"error": repr(exc)}
    ok = {t: d for t, d in doc["targets"].items() if "error" not in d}
    (out / "comparison.json").write_text(json.dumps(doc, indent=2))
    if ok:
        md = comparison_md({**doc, "targets": ok})
        (out / "comparison.md").write_text(md)
        print(md)
    say(f"histories and verdicts in {out}; server logs in {workdir}")
    return 0 if len(ok) == len(doc["targets"]) else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--faults", type=int, default=4)
    p.add_argument("--families", default="kill,pause,pause-past-expiry")
    p.add_argument("--rate", type=float, default=20.0, help="sends per second")
    p.add_argument(
        "--settle", type=float, default=40.0, help="seconds of sends after the last heal"
    )
    p.add_argument(
        "--targets", nargs="+", default=["rocketmq", "ours"], choices=["rocketmq", "ours"]
    )
    p.add_argument("--out", default=str(HERE / "results" / "side-by-side"))
    args = p.parse_args()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
