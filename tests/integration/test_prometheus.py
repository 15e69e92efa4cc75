"""Issue 8 acceptance: every Grafana dashboard query returns data from a real
Prometheus scraping a real cluster through a failover.

Prometheus is Debian's ``prometheus`` binary (``apt-get install prometheus``),
found on PATH or at ``$PROMETHEUS``; without it the test is skipped. It
scrapes the nameserver and every broker each second. The test drives normal,
FIFO (queue locks) and delayed traffic, kills the master of ``broker-a``
(its slave acts; one delayed message is for a topic no other group serves,
so the escape bridge fails on it), brings the master back through pre-online, and
then evaluates every expression of every dashboard panel, annotation and
template variable through the HTTP API the way Grafana would, with the
template variables substituted.

The nameserver runs in controller mode (a one-member etcd from Debian's ``etcd-server``)
with ``auto_switch_after_ms = 0``: the groups get epochs and sync-state sets, the kill
still goes through RIP-32 acting, and a planned switch of ``broker-b`` at the end gives
the controller panels their switch and election data.

With ``HA_CONTROLLER_DASHBOARD_SNAPSHOT=/some/file.json`` the test also writes what it
queried; ``docs/render_dashboards.py`` turns that into the pictures in docs/.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message, ReceivedMessage
from ha_controller.client.orderly import OrderlyPushConsumer
from ha_controller.client.producer import Producer
from ha_controller.client.push_consumer import PushConsumer
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import HaError
from ha_controller.testing import Cluster, ProcessHandle, eventually, run_cluster
from ha_controller.testing.etcd import EtcdCluster

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))
GROUPS = ("broker-a", "broker-b")
TOPIC = "FlowTopic"
ONLY_A = "OnlyOnBrokerA"  # no other group serves it: the acting slave cannot escape it
CONSUMER = "flow-consumers"
FIFO_CONSUMER = "fifo-consumers"
SCRAPE_S = 1
# Grafana: $__rate_interval = max($__interval + scrape interval, 4 * scrape interval)
STEP_S = 1
RATE_INTERVAL = f"{max(STEP_S + SCRAPE_S, 4 * SCRAPE_S)}s"
ENV = {"HAC_DELAY_LEVELS": "1s 2s 3s 5s 10s"}
SHORT_DELAY = 2  # level 2: 2 s
LONG_DELAY = 4  # level 4: 5 s, due after the master is gone


def prometheus_binary() -> str:
    path = os.environ.get("PROMETHEUS") or shutil.which("prometheus")
    if not path:
        pytest.skip(
            "prometheus not found on PATH (Debian/Ubuntu: apt-get install prometheus; "
            "or set PROMETHEUS=/path/to/prometheus)"
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- dashboards -------------------------------------------------------------------------


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def variable_query(var: dict[str, Any]) -> str:
    query = var["query"]
    return str(query["query"] if isinstance(query, dict) else query)


LABEL_VALUES = re.compile(r"label_values\((.+),\s*(\w+)\)")


@dataclass
class Window:
    start: float
    end: float

    @property
    def builtins(self) -> dict[str, str]:
        range_s = int(self.end - self.start)
        return {
            "$__rate_interval": RATE_INTERVAL,
            "$__interval_ms": str(STEP_S * 1000),
            "$__interval": f"{STEP_S}s",
            "$__range_s": str(range_s),
            "$__range": f"{range_s}s",
        }


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace ``$name`` / ``${name}`` (longest names first, like ``$__range_s``)."""
    for name in sorted(values, key=len, reverse=True):
        bare = name.lstrip("$")
        expr = expr.replace("${" + bare + "}", values[name]).replace(name, values[name])
    assert "$" not in expr, f"unsubstituted variable in {expr!r}"
    return expr


def regex_of(values: list[str]) -> str:
    """A multi-value variable as Grafana's Prometheus datasource formats it."""
    escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


# --- Prometheus ---------------------------------------------------------------------------


class Prometheus:
    """A Prometheus process on loopback scraping file-discovered targets."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.targets = workdir / "targets.json"
        self.log = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def set_targets(self, nameserver: str, brokers: dict[str, str]) -> None:
        """Rewrite the file_sd file atomically; Prometheus notices the rename."""
        groups = [{"targets": [nameserver], "labels": {"job": "ha-controller-nameserver"}}]
        groups += [
            {"targets": [addr], "labels": {"job": "ha-controller-broker", "pod": pod}}
            for pod, addr in sorted(brokers.items())
        ]
        tmp = self.targets.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.targets)

    def start(self) -> None:
        config = self.workdir / "prometheus.yml"
        config.write_text(
            json.dumps(  # JSON is YAML
                {
                    "global": {
                        "scrape_interval": f"{SCRAPE_S}s",
                        "scrape_timeout": f"{SCRAPE_S}s",
                        "evaluation_interval": f"{SCRAPE_S}s",
                    },
                    "scrape_configs": [
                        {
                            "job_name": "ha-controller",
                            "file_sd_configs": [
                                {"files": [str(self.targets)], "refresh_interval": "1s"}
                            ],
                        }
                    ],
                }
            )
        )
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
        return ""


class PromAPI:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url

    async def get(self, path: str, **params: Any) -> Any:
        async with self.session.get(f"{self.url}{path}", params=params) as resp:
            body = await resp.json()
        assert body.get("status") == "success", f"{path} {params}: {body}"
        return body["data"]

    async def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        data = await self.get("/api/v1/query", query=expr, time=f"{at:.3f}")
        assert data["resultType"] == "vector", expr
        return list(data["result"])

    async def query_range(self, expr: str, window: Window) -> list[dict[str, Any]]:
        data = await self.get(
            "/api/v1/query_range",
            query=expr,
            start=f"{window.start:.3f}",
            end=f"{window.end:.3f}",
            step=f"{STEP_S}s",
        )
        assert data["resultType"] == "matrix", expr
        return list(data["result"])

    async def label_values(self, query: str, window: Window) -> list[str]:
        """Grafana's ``label_values(selector, label)`` through the series API."""
        m = LABEL_VALUES.fullmatch(query.strip())
        assert m, query
        selector, label = m.groups()
        data = await self.get(
            f"/api/v1/label/{label}/values",
            **{"match[]": selector, "start": f"{window.start:.3f}", "end": f"{window.end:.3f}"},
        )
        return sorted(data)

    async def healthy_targets(self) -> set[str]:
        data = await self.get("/api/v1/targets", state="active")
        return {t["scrapeUrl"] for t in data["activeTargets"] if t["health"] == "up"}


@pytest.fixture
async def prom(tmp_path: Path) -> AsyncIterator[Prometheus]:
    binary = prometheus_binary()
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    p = Prometheus(binary, workdir)
    try:
        yield p
    finally:
        await asyncio.to_thread(p.stop)


# --- traffic -------------------------------------------------------------------------------


async def create_topic_on(pool: Any, addr: str, topic: str, queues: int) -> None:
    config = common_pb2.TopicConfig(
        topic_name=topic, read_queue_nums=queues, write_queue_nums=queues, perm=6
    )
    await pool.call_pb(
        addr,
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        broker_pb2.CreateTopicRequest(topic=config),
        common_pb2.Empty,
    )


class Traffic:
    """A steady producer (with a delayed message now and then) and two consumer groups."""

    def __init__(self, namesrv: str) -> None:
        self.namesrv = namesrv
        self.producer = Producer(namesrv, group="flow-producer")
        self.sent = 0
        self.failed = 0
        self.received = 0
        self.fifo_received = 0

        async def on_message(m: ReceivedMessage) -> bool:
            self.received += 1
            return True

        async def on_fifo(m: ReceivedMessage) -> bool:
            self.fifo_received += 1
            return True

        self.consumer = PushConsumer(
            namesrv, CONSUMER, TOPIC, on_message, commit_interval_s=0.5, rebalance_interval_s=1
        )
        self.fifo = OrderlyPushConsumer(
            namesrv,
            FIFO_CONSUMER,
            TOPIC,
            on_fifo,
            lock_renew_interval_s=2.0,
            commit_interval_s=0.5,
            rebalance_interval_s=1,
        )
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.producer.start()
        await self.consumer.start()
        await self.fifo.start()
        self._task = asyncio.create_task(self._produce(), name="traffic")

    async def send(self, message: Message) -> None:
        try:
            await self.producer.send(message)
        except HaError:
            self.failed += 1
        else:
            self.sent += 1

    async def _produce(self, rate: float = 40.0) -> None:
        seq = 0
        while True:
            seq += 1
            level = SHORT_DELAY if seq % 40 == 0 else 0
            await self.send(Message(TOPIC, b"x" * 200, keys=(f"m{seq}",), delay_level=level))
            await asyncio.sleep(1 / rate)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for closer in (self.fifo.aclose, self.consumer.aclose, self.producer.aclose):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(closer(), 10)


# --- the test ------------------------------------------------------------------------------


def broker_targets(cluster: Cluster) -> dict[str, str]:
    return {f"{name}-{bid}": h.http for (name, bid), h in cluster.brokers.items() if h.alive()}


async def group_state(ns: NameserverClient, name: str) -> tuple[bool, int | None]:
    for g in await ns.groups():
        if g.broker_name == name:
            return g.master_online, g.acting_broker_id
    return False, None


async def test_every_dashboard_query_returns_data(
    prom: Prometheus, etcd: EtcdCluster, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    # broker-b's master does not auto-create topics (as in production), so the
    # acting slave's escape of ONLY_A's delayed message to it fails.
    cluster = await asyncio.to_thread(
        run_cluster,
        GROUPS,
        3,
        workdir=tmp_path,
        # controller mode keeping the groups' states, electing nobody by itself
        env={**ENV, "HAC_ETCD_ENDPOINTS": etcd.endpoints, "HAC_AUTO_SWITCH_AFTER_MS": "0"},
        broker_env={("broker-b", 0): {"HAC_AUTO_CREATE_TOPIC": "false"}},
    )
    traffic: Traffic | None = None
    snapshot: dict[str, Any] = {}
    try:
        prom.set_targets(cluster.nameserver.http, broker_targets(cluster))
        await asyncio.to_thread(prom.start)
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session,
            NameserverClient([cluster.namesrv]) as ns,
        ):
            api = PromAPI(session, prom.url)

            async def all_up() -> bool:
                assert prom.proc is not None and prom.proc.poll() is None, prom.log_tail()
                try:
                    healthy = await api.healthy_targets()
                except aiohttp.ClientError:
                    return False  # not listening yet
                return len(healthy) == 1 + len(cluster.brokers)

            await eventually(all_up, timeout=20, interval=0.2)
            start = time.time()

            async def masters() -> bool:
                return all([(await group_state(ns, g))[0] for g in GROUPS])

            await eventually(masters, timeout=30, interval=0.1)
            await ns.create_topic(TOPIC, queues=4)
            a0 = cluster.broker("broker-a", 0)
            await create_topic_on(ns.pool, a0.rpc, ONLY_A, 1)

            async def routes() -> bool:
                return (
                    len((await ns.route(TOPIC)).broker_datas) == 2
                    and len((await ns.route(ONLY_A)).broker_datas) == 1
                )

            await eventually(routes, timeout=10, interval=0.1)

            # Phase 1: both masters online.
            traffic = Traffic(cluster.namesrv)
            await traffic.start()
            await asyncio.sleep(8)
            # Delayed messages due only after the master is gone: broker-a's acting
            # slave escapes those of TOPIC to broker-b, and cannot escape ONLY_A's.
            for i in range(8):
                await traffic.send(
                    Message(TOPIC, b"later", keys=(f"d{i}",), delay_level=LONG_DELAY)
                )
            await traffic.send(Message(ONLY_A, b"stranded", delay_level=LONG_DELAY))

            # Phase 2: kill -9 the master of broker-a; slave 1 acts for it.
            await asyncio.to_thread(a0.kill)
            prom.set_targets(cluster.nameserver.http, broker_targets(cluster))

            async def acting() -> bool:
                return await group_state(ns, "broker-a") == (False, 1)

            await eventually(acting, timeout=15, interval=0.1)
            t_acting = time.time()
            await asyncio.sleep(22)
            acting_snapshot = time.time()

            # Phase 3: the master comes back through pre-online.
            handle: ProcessHandle = await asyncio.to_thread(cluster.restart, "broker-a", 0)
            prom.set_targets(cluster.nameserver.http, broker_targets(cluster))

            async def back() -> bool:
                return await group_state(ns, "broker-a") == (True, None)

            await eventually(back, timeout=30, interval=0.1)
            assert handle.alive()
            await asyncio.sleep(8)
            # Phase 4: a planned switch of broker-b to member 1 (controller panels).
            switched = await ns.switch_master("DefaultCluster", "broker-b", 1)
            assert switched.controller.state.master_member == 1
            await asyncio.sleep(3)
            await traffic.aclose()
            traffic = None
            await asyncio.sleep(2 * SCRAPE_S)
            window = Window(start, time.time())

            snapshot = await evaluate_dashboards(api, window, acting_snapshot)
            # The failover is in the data, not only "some series".
            acting_ids = {
                float(v)
                for s in await api.query_range(
                    'max by (broker_name) (hac_group_acting_master{broker_name="broker-a"})', window
                )
                for _, v in s["values"]
            }
            assert {-1.0, 1.0} <= acting_ids
            assert window.start < t_acting < window.end
    finally:
        if traffic is not None:
            await traffic.aclose()
        await asyncio.to_thread(cluster.stop)
    elapsed = time.monotonic() - t0
    out = os.environ.get("HA_CONTROLLER_DASHBOARD_SNAPSHOT")
    if out:
        snapshot["elapsed_s"] = elapsed
        Path(out).write_text(json.dumps(snapshot))
    assert elapsed < 90, f"took {elapsed:.1f} s"


async def evaluate_dashboards(api: PromAPI, window: Window, instant_at: float) -> dict[str, Any]:
    """Evaluate every query of every dashboard; assert each one returns data."""
    empty: list[str] = []
    out: dict[str, Any] = {"window": [window.start, window.end], "dashboards": []}
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        values = dict(window.builtins)
        variables: dict[str, list[str]] = {}
        # Template variables in order: each may use the ones before it (All selected).
        for var in dashboard["templating"]["list"]:
            if var["type"] != "query":
                continue
            query = substitute(variable_query(var), values)
            found = await api.label_values(query, window)
            if not found:
                empty.append(f"{path.name}: variable {var['name']}: {query}")
                found = [".*"]
            variables[var["name"]] = found
            values["$" + var["name"]] = regex_of(found)
        annotations = []
        for ann in dashboard["annotations"]["list"]:
            if "expr" not in ann:
                continue
            expr = substitute(ann["expr"], values)
            result = await api.query_range(expr, window)
            if not result:
                empty.append(f"{path.name}: annotation {ann['name']}: {expr}")
            annotations.append({"name": ann["name"], "expr": expr, "result": result})
        panels = []
        for panel in all_panels(dashboard["panels"]):
            targets: list[dict[str, Any]] = []
            entry = {k: panel.get(k) for k in ("id", "title", "type", "gridPos", "options")}
            entry["defaults"] = panel.get("fieldConfig", {}).get("defaults", {})
            entry["targets"] = targets
            for target in panel.get("targets", []):
                expr = substitute(target["expr"], values)
                where = f"{path.name}: panel {panel['title']!r} {target.get('refId')}: {expr}"
                result = await api.query_range(expr, window)
                if not result:
                    empty.append(where + " (range)")
                if target.get("instant"):
                    # Stats show the value at the end of the time range; check it mid-failover.
                    if not await api.query(expr, instant_at):
                        empty.append(where + " (instant)")
                targets.append(
                    {
                        "expr": expr,
                        "legendFormat": target.get("legendFormat", ""),
                        "instant": bool(target.get("instant")),
                        "result": result,
                    }
                )
            panels.append(entry)
        out["dashboards"].append(
            {
                "file": path.name,
                "title": dashboard["title"],
                "variables": variables,
                "annotations": annotations,
                "panels": panels,
            }
        )
    assert empty == [], "queries without data:\n" + "\n".join(empty)
    return out
