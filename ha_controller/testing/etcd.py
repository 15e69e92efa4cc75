"""Real etcd servers for tests, drills and benchmarks (controller mode).

The binary is Debian's ``etcd-server`` package (``make tools`` installs it); one
member on loopback for tests, three for drills.  Ports are picked free on loopback
(etcd cannot report a port 0 it bound), each member's data in its own directory.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["EtcdCluster", "EtcdMember", "etcd_binary", "etcd_missing", "run_etcd"]

#: where Debian's etcd-server puts it, when it is not on PATH
_DEBIAN = Path("/usr/bin/etcd")


def etcd_binary() -> str | None:
    """``HAC_ETCD_BINARY`` when set (None when it is not an executable file), else
    ``etcd`` on PATH, else Debian's."""
    given = os.environ.get("HAC_ETCD_BINARY")
    if given:
        return given if os.access(given, os.X_OK) and Path(given).is_file() else None
    found = shutil.which("etcd")
    if found:
        return found
    return str(_DEBIAN) if _DEBIAN.exists() else None


def etcd_missing() -> str | None:
    """Why no etcd can be started here (a one-line skip reason), or None."""
    if etcd_binary() is None:
        given = os.environ.get("HAC_ETCD_BINARY")
        if given:
            return f"HAC_ETCD_BINARY={given} is not an executable file"
        return "etcd not found (Debian: apt-get install etcd-server; make tools does it)"
    return None


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    argv: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    def start(self) -> None:
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def healthy(self) -> bool:
        try:
            req = urllib.request.Request(
                f"http://{self.endpoint}/v3/maintenance/status", data=b"{}", method="POST"
            )
            with urllib.request.urlopen(req, timeout=1) as resp:  # noqa: S310 (http://, ours)
                return "leader" in json.loads(resp.read() or b"{}")
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class EtcdCluster:
    members: list[EtcdMember]

    @property
    def endpoints(self) -> str:
        """``HOST:PORT,...`` for ``--etcd-endpoints``."""
        return ",".join(m.endpoint for m in self.members)

    def stop(self) -> None:
        for m in self.members:
            m.stop()

    def wait_healthy(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(m.healthy() for m in self.members if m.alive()):
                return
            for m in self.members:
                if m.proc is not None and m.proc.poll() is not None:
                    raise RuntimeError(f"etcd {m.name} exited:\n{m.log_tail()}")
            time.sleep(0.1)
        raise RuntimeError(
            "etcd not healthy in time:\n" + "\n".join(m.log_tail() for m in self.members)
        )


def run_etcd(
    workdir: Path,
    members: int = 1,
    *,
    name: str = "etcd",
    hosts: Sequence[tuple[str, Sequence[str]]] = (),
    log_dir: Path | None = None,
) -> EtcdCluster:
    """Start ``members`` etcd members on loopback and wait until they serve.

    ``hosts``: one ``(ip, exec_prefix)`` per member, to run each on a host of its own
    (a drill's network namespace, :mod:`ha_controller.drills.netns`) on etcd's standard
    ports; empty: every member on loopback on free ports.  ``log_dir``: where the
    members' logs go (default ``workdir``)."""
    binary = etcd_binary()
    if binary is None:
        raise RuntimeError(etcd_missing())
    if hosts and len(hosts) != members:
        raise ValueError(f"{members} etcd members need {members} hosts, got {len(hosts)}")
    ports = [p for _ in hosts for p in (2379, 2380)] or _free_ports(2 * members)
    logs = log_dir if log_dir is not None else workdir
    nodes = [
        EtcdMember(
            f"{name}{i}",
            ports[2 * i],
            ports[2 * i + 1],
            workdir / f"{name}{i}.data",
            logs / f"{name}{i}.log",
            host=hosts[i][0] if hosts else "127.0.0.1",
        )
        for i in range(members)
    ]
    initial = ",".join(f"{m.name}=http://{m.host}:{m.peer_port}" for m in nodes)
    for i, m in enumerate(nodes):
        m.argv = [
            *(hosts[i][1] if hosts else ()),
            binary,
            "--name",
            m.name,
            "--data-dir",
            str(m.data_dir),
            "--listen-client-urls",
            f"http://{m.host}:{m.client_port}",
            "--advertise-client-urls",
            f"http://{m.host}:{m.client_port}",
            "--listen-peer-urls",
            f"http://{m.host}:{m.peer_port}",
            "--initial-advertise-peer-urls",
            f"http://{m.host}:{m.peer_port}",
            "--initial-cluster",
            initial,
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            f"{name}-{ports[0]}",
            # a loaded test machine: fewer spurious elections
            "--heartbeat-interval",
            "100",
            "--election-timeout",
            "1000",
        ]
        m.start()
    cluster = EtcdCluster(nodes)
    try:
        cluster.wait_healthy()
    except BaseException:
        for m in nodes:
            m.kill()
        raise
    return cluster
