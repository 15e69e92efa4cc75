"""The drill cluster: a nameserver and broker groups as real ``hactl`` processes.

Two placements (DESIGN.md §10):

- **loopback** (default): every process listens on ``127.0.0.1`` port 0 and reports its
  addresses through its ready file (:mod:`ha_controller.testing`); faults are process
  faults (kill -9 and restart, SIGSTOP/SIGCONT).
- **netns**: every process runs in its own network namespace
  (:class:`ha_controller.drills.netns.Network`) with its own address on a private
  bridge, listening on the default ports of that address and advertising it
  (``HAC_BROKER_IP1``); partitions and netem faults become possible and real.

Targets are named ``"nameserver"`` and ``"<group>/<id>"`` (``"broker-a/0"``).  Slaves
start before their master so that the master's pre-online finds them.  :meth:`close`
(idempotent, also on errors and interrupts) kills every process, removes the network
and the temporary stores; logs are kept in ``log_dir`` when one is given.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ha_controller.drills.netns import Host, Network, NetworkError
from ha_controller.protocol.errors import HaError
from ha_controller.testing import FAST_ENV, ProcessHandle, hactl_argv

__all__ = [
    "NAMESERVER",
    "ClusterSpec",
    "DrillCluster",
    "FaultUnsupported",
    "broker_target",
    "parse_target",
]

log = logging.getLogger(__name__)

NAMESERVER = "nameserver"

Replication = Literal["sync", "async"]


class FaultUnsupported(HaError, RuntimeError):
    """The fault needs something this cluster does not have (e.g. network namespaces)."""


def broker_target(group: str, broker_id: int) -> str:
    return f"{group}/{broker_id}"


def parse_target(target: str) -> tuple[str, int]:
    """``"broker-a/0"`` -> ``("broker-a", 0)``."""
    group, sep, bid = target.rpartition("/")
    if not sep or not group or not bid.isdigit():
        raise ValueError(f"not a broker target: {target!r} (want GROUP/ID)")
    return group, int(bid)


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What to start.  ``env`` applies to every process; ``broker_env`` per target."""

    groups: tuple[str, ...] = ("broker-a", "broker-b")
    replicas: int = 3
    replication: Replication = "sync"
    in_sync_replicas: int | None = None
    skip_pre_online: bool = False
    netns: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    broker_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("a drill cluster needs at least one broker group")
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.replication not in ("sync", "async"):
            raise ValueError(f"replication must be 'sync' or 'async', got {self.replication!r}")

    def common_env(self) -> dict[str, str]:
        env = {**FAST_ENV, "HAC_TOTAL_REPLICAS": str(self.replicas)}
        env["HAC_REPLICATION_MODE"] = self.replication
        isr = self.in_sync_replicas
        if isr is None:
            isr = 1 if self.replication == "async" or self.replicas < 2 else 2
        env["HAC_IN_SYNC_REPLICAS"] = str(isr)
        if self.skip_pre_online:
            env["HAC_SKIP_PRE_ONLINE"] = "true"
        env.update(self.env)
        return env


@dataclass
class _Proc:
    target: str
    handle: ProcessHandle
    host: Host | None


class DrillCluster:
    """Starts, faults and stops the processes of one drill.

    Blocking methods (process start/stop, ``ip`` commands): call them through
    ``asyncio.to_thread`` from async code.
    """

    def __init__(
        self,
        spec: ClusterSpec,
        *,
        log_dir: Path | None = None,
        keep_store: bool = False,
    ) -> None:
        self.spec = spec
        self._tmp = Path(tempfile.mkdtemp(prefix="hacd-"))
        self.workdir = self._tmp
        self.log_dir = log_dir if log_dir is not None else self._tmp / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.keep_store = keep_store
        self.network: Network | None = Network() if spec.netns else None
        self.env = spec.common_env()
        self._procs: dict[str, _Proc] = {}
        self._closed = False

    # ---- addresses ---------------------------------------------------------------

    @property
    def namesrv(self) -> str:
        return self._procs[NAMESERVER].handle.rpc

    @property
    def namesrv_http(self) -> str:
        return self._procs[NAMESERVER].handle.http

    def targets(self) -> list[str]:
        return list(self._procs)

    def broker_targets(self, group: str | None = None) -> list[str]:
        return [
            t
            for t in self._procs
            if t != NAMESERVER and (group is None or t.startswith(group + "/"))
        ]

    def handle(self, target: str) -> ProcessHandle:
        return self._procs[target].handle

    def http(self, target: str) -> str:
        return self._procs[target].handle.http

    def alive(self, target: str) -> bool:
        return self._procs[target].handle.alive()

    # ---- lifecycle ---------------------------------------------------------------

    def start(self) -> DrillCluster:
        """Start the nameserver, then per group the slaves and the master."""
        try:
            if self.network is not None:
                self.network.up()
            self._start(NAMESERVER)
            for group in self.spec.groups:
                for bid in [*range(1, self.spec.replicas), 0]:
                    self._start(broker_target(group, bid))
        except BaseException:
            self.close()
            raise
        return self

    def _host_name(self, target: str) -> str:
        if target == NAMESERVER:
            return "ns"
        group, bid = parse_target(target)
        return f"{group.removeprefix('broker-')[:6]}{bid}"

    def _make(self, target: str) -> _Proc:
        host: Host | None = None
        if self.network is not None:
            host = self.network.add_host(self._host_name(target))
        name = target.replace("/", "-")
        ready = self.workdir / f"{name}.ready.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("HAC_")}
        env.update(self.env)
        env["PYTHONUNBUFFERED"] = "1"
        ip = "127.0.0.1" if host is None else host.ip
        if target == NAMESERVER:
            port_rpc, port_http = ("0", "0") if host is None else ("9876", "9877")
            args = ["nameserver", "--listen", f"{ip}:{port_rpc}", "--http", f"{ip}:{port_http}"]
        else:
            group, bid = parse_target(target)
            env.update(self.spec.broker_env.get(target, {}))
            if host is not None:
                env["HAC_BROKER_IP1"] = host.ip
            ports = ("0", "0", "0") if host is None else ("10911", "10912", "10913")
            args = [
                "broker",
                "--cluster",
                "DrillCluster",
                "--broker-name",
                group,
                "--broker-id",
                str(bid),
                "--namesrv",
                self.namesrv,
                "--listen",
                f"{ip}:{ports[0]}",
                "--ha-listen",
                f"{ip}:{ports[1]}",
                "--http",
                f"{ip}:{ports[2]}",
                "--store-dir",
                str(self.workdir / "store" / name),
            ]
        argv = hactl_argv(*args, "--ready-file", str(ready))
        if host is not None:
            argv = [*host.exec_prefix(), *argv]
        handle = ProcessHandle(
            name=name,
            argv=argv,
            env=env,
            workdir=self.workdir,
            ready_file=ready,
            log_path=self.log_dir / f"{name}.log",
        )
        return _Proc(target, handle, host)

    def _start(self, target: str) -> ProcessHandle:
        proc = self._make(target)
        self._procs[target] = proc
        proc.handle.start(timeout=30.0)
        log.info("started %s (pid %d, rpc %s)", target, proc.handle.pid, proc.handle.rpc)
        return proc.handle

    def set_broker_env(self, target: str, env: Mapping[str, str]) -> None:
        """Environment for the next (re)start of ``target`` (e.g. skip pre-online)."""
        self._procs[target].handle.env.update(env)

    # ---- process faults ------------------------------------------------------------

    def kill(self, target: str) -> None:
        """kill -9 (a paused process is killed too)."""
        self._procs[target].handle.kill()

    def restart(self, target: str, timeout: float = 30.0) -> ProcessHandle:
        """Start ``target`` again on the same store (and, in netns, the same address)."""
        handle = self._procs[target].handle
        handle.kill()
        handle.start(timeout=timeout)
        log.info("restarted %s (pid %d, rpc %s)", target, handle.pid, handle.rpc)
        return handle

    def pause(self, target: str) -> None:
        self._procs[target].handle.pause()

    def resume(self, target: str) -> None:
        self._procs[target].handle.resume()

    # ---- network faults ------------------------------------------------------------

    def _host(self, target: str, what: str) -> tuple[Network, Host]:
        proc = self._procs[target]
        if self.network is None or proc.host is None:
            raise FaultUnsupported(f"{what} needs hosts in network namespaces (--netns)")
        return self.network, proc.host

    def partition(self, target: str) -> None:
        net, host = self._host(target, "a network partition")
        net.partition(host.name)

    def heal_partition(self, target: str) -> None:
        net, host = self._host(target, "a network partition")
        net.heal_partition(host.name)

    def netem(
        self, target: str, *, delay_ms: int = 0, jitter_ms: int = 0, loss_pct: float = 0
    ) -> str:
        """Delay and/or loss on the target's link; returns the mechanism used."""
        net, host = self._host(target, "netem")
        try:
            net.set_netem(host.name, delay_ms=delay_ms, jitter_ms=jitter_ms, loss_pct=loss_pct)
        except NetworkError as exc:
            if delay_ms or not loss_pct:
                raise FaultUnsupported(f"tc netem is not available here: {exc}") from exc
            try:
                net.set_loss(host.name, loss_pct)
            except NetworkError as exc2:
                raise FaultUnsupported(f"no way to drop packets here: {exc2}") from exc2
            return "iptables"
        return "netem"

    def clear_netem(self, target: str) -> None:
        net, host = self._host(target, "netem")
        net.clear_netem(host.name)
        net.clear_loss(host.name)

    # ---- teardown ----------------------------------------------------------------

    def close(self) -> None:
        """Kill every process, remove the network and the stores (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for proc in reversed(list(self._procs.values())):
            with contextlib.suppress(Exception):
                proc.handle.resume()
                proc.handle.kill()
        if self.network is not None:
            try:
                self.network.close()
            except NetworkError as exc:
                log.warning("network cleanup: %s", exc)
        if not self.keep_store:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def describe(self) -> list[str]:
        """One line per process, for the terminal."""
        return [
            f"{target:<12} pid {p.handle.pid:<7} rpc {p.handle.rpc}"
            for target, p in self._procs.items()
            if p.handle.proc is not None and p.handle.ready
        ]

    def __enter__(self) -> DrillCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
