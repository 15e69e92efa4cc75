"""The drill cluster: a nameserver and broker groups as real ``hactl`` processes.

Two placements:

- **loopback** (default): every process listens on ``127.0.0.1`` port 0 and reports its
  addresses through its ready file (:mod:`ha_controller.testing`); faults are process
  faults (kill -9 and restart, SIGSTOP/SIGCONT).
- **netns**: every process runs in its own network namespace
  (:class:`ha_controller.drills.netns.Network`) with its own address on a private
  bridge, listening on the default ports of that address and advertising it
  (``HAC_BROKER_IP1``); partitions and netem faults become possible and real.

Targets are named ``"nameserver"`` (``"nameserver-1"`` for a second one,
``ClusterSpec.nameservers=2``) and ``"<group>/<id>"`` (``"broker-a/0"``).  Every broker
and every client is given every nameserver.  Slaves start before their master so that
the master's pre-online finds them.  :meth:`close` (idempotent, also on errors and
interrupts) kills every process, removes the network and the temporary stores; logs are
kept in ``log_dir`` when one is given.

Disk faults (``ClusterSpec.tmpfs_store_mb``): each broker's store directory
(``<workdir>/store/<group>-<id>``) is a tmpfs of that size, mounted before the broker
first starts and unmounted by :meth:`close`.  :meth:`fill_disk` fills it with a filler
file (``.drill-disk-filler``) that leaves ``keep_free_pct`` of it free — below the
store's hard reserve, so the store is full — and :meth:`free_disk` deletes the filler.
Mounting needs root (CAP_SYS_ADMIN); :func:`tmpfs_available` says why not otherwise.

Power loss (``ClusterSpec.lazyfs_stores``): each broker's store directory is a FUSE
mount (:class:`ha_controller.drills.lazyfs.LazyMount`) over ``<workdir>/backing/<group>-
<id>`` (itself the tmpfs, with ``tmpfs_store_mb``) that keeps unsynced writes apart.
:meth:`power_off` kills the brokers in its scope (one broker, every broker of a group,
or with ``"cluster"`` every broker and nameserver) and then their mounts' daemons:
what they had not synced is gone.  :meth:`power_on` mounts the stores again and starts
the nameservers, then each group's slaves, then its master, as :meth:`start` does.

Corruption: :meth:`corrupt` damages a broker's store (:mod:`ha_controller.drills.
corruption`), stopped first (kill -9) or while it runs; :meth:`restart` brings it back
on what is left.

Controller mode (``ClusterSpec.etcd_members``): an etcd cluster of that many members
(:mod:`ha_controller.testing.etcd`; with netns each member on a host of its own,
``etcd0``...) starts first, and every process gets ``HAC_ETCD_ENDPOINTS`` and
``HAC_AUTO_SWITCH_AFTER_MS``: the nameservers run the controller.  Targets ``"etcd-<i>"``
name the members; :meth:`stop_etcd` kills them all (kill -9), :meth:`start_etcd` starts
them again on their data.  :meth:`isolate` cuts a broker off together with one etcd
member from every other host while the drill's clients still reach it (netns).

Clocks (``ClusterSpec.clock_shim``): every process runs with the clock shim preloaded
and a control file of its own (:class:`ha_controller.drills.clock.ClockControl`);
:meth:`step_clock` steps one process's wall clock, :meth:`reset_clock` puts it back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import shutil
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ha_controller.config import BrokerConfig
from ha_controller.drills.clock import ClockControl
from ha_controller.drills.corruption import corrupt_store
from ha_controller.drills.lazyfs import LazyfsError, LazyMount
from ha_controller.drills.leftovers import workdir_prefix
from ha_controller.drills.netns import Direction, Host, Network, NetworkError
from ha_controller.protocol.errors import HaError
from ha_controller.testing import FAST_ENV, ProcessHandle, hactl_argv, start_all
from ha_controller.testing.etcd import EtcdCluster, run_etcd

__all__ = [
    "CLUSTER",
    "ETCD",
    "FILLER",
    "NAMESERVER",
    "ClusterSpec",
    "DrillCluster",
    "FaultUnsupported",
    "broker_target",
    "etcd_target",
    "is_nameserver",
    "nameserver_target",
    "parse_target",
    "tmpfs_available",
]

log = logging.getLogger(__name__)

NAMESERVER = "nameserver"
#: the target of every etcd member at once (and the prefix of one's, ``"etcd-0"``)
ETCD = "etcd"
#: the power-loss target of every broker and nameserver
CLUSTER = "cluster"
#: the filler file that makes a tmpfs store full
FILLER = ".drill-disk-filler"

Replication = Literal["sync", "async"]


class FaultUnsupported(HaError, RuntimeError):
    """The fault needs something this cluster does not have (e.g. network namespaces)."""


def broker_target(group: str, broker_id: int) -> str:
    return f"{group}/{broker_id}"


def nameserver_target(index: int) -> str:
    """``0`` -> ``"nameserver"``, ``1`` -> ``"nameserver-1"``."""
    return NAMESERVER if index == 0 else f"{NAMESERVER}-{index}"


def etcd_target(index: int) -> str:
    """``0`` -> ``"etcd-0"``: an etcd member of a controller-mode drill."""
    return f"{ETCD}-{index}"


def is_nameserver(target: str) -> bool:
    return target == NAMESERVER or target.startswith(NAMESERVER + "-")


def tmpfs_available() -> str | None:
    """``None`` when this process may mount a tmpfs, else the reason why not."""
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount/umount are not installed"
    if os.geteuid() != 0:
        return "mounting a tmpfs store needs root (CAP_SYS_ADMIN)"
    probe = Path(tempfile.mkdtemp(prefix="hacd-tmpfs-probe-"))
    try:
        done = _mount_tmpfs(probe, 1)
        if done is not None:
            return f"cannot mount a tmpfs here: {done}"
        _umount(probe)
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    return None


def _mount_tmpfs(path: Path, size_mb: int) -> str | None:
    """Mount a tmpfs of ``size_mb`` on ``path``; the error text, or None."""
    try:
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"exit {proc.returncode}")


def _umount(path: Path) -> None:
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=15, check=False)


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
    #: nameservers to run (1 or 2); every broker registers with all of them
    nameservers: int = 1
    #: each broker's store on its own tmpfs of this many MiB (disk-full faults); None: no
    tmpfs_store_mb: int | None = None
    #: each broker's store through the FUSE layer that loses unsynced writes (power loss)
    lazyfs_stores: bool = False
    #: every process with a wall clock of its own (clock faults)
    clock_shim: bool = False
    #: controller mode: etcd members to run (0: none, RIP-32 acting only)
    etcd_members: int = 0
    #: controller mode: ``auto_switch_after_ms`` of the nameservers
    auto_switch_after_ms: int = 500

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("a drill cluster needs at least one broker group")
        if self.nameservers not in (1, 2):
            raise ValueError(f"nameservers must be 1 or 2, got {self.nameservers}")
        if self.tmpfs_store_mb is not None and self.tmpfs_store_mb < 32:
            raise ValueError(f"tmpfs_store_mb must be >= 32, got {self.tmpfs_store_mb}")
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.replication not in ("sync", "async"):
            raise ValueError(f"replication must be 'sync' or 'async', got {self.replication!r}")
        if self.etcd_members < 0:
            raise ValueError(f"etcd_members must be >= 0, got {self.etcd_members}")

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

    def store_mode(self) -> tuple[str, int]:
        """``(flush_mode, flush_interval_ms)`` the brokers run with (their defaults
        unless ``env`` sets ``HAC_FLUSH_MODE`` / ``HAC_FLUSH_INTERVAL_MS``)."""
        defaults = {f.name: f.default for f in dataclasses.fields(BrokerConfig)}
        env = self.common_env()
        mode = env.get("HAC_FLUSH_MODE", str(defaults["flush_mode"]))
        interval = env.get("HAC_FLUSH_INTERVAL_MS", str(defaults["flush_interval_ms"]))
        return mode, int(interval)


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
        # named after this process, so that what a SIGKILL leaves is found (leftovers.py)
        self._tmp = Path(tempfile.mkdtemp(prefix=workdir_prefix()))
        self.workdir = self._tmp
        self.log_dir = log_dir if log_dir is not None else self._tmp / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.keep_store = keep_store
        self.network: Network | None = Network() if spec.netns else None
        self.env = spec.common_env()
        self._procs: dict[str, _Proc] = {}
        self._mounts: list[Path] = []
        self._lazy: dict[str, LazyMount] = {}
        self._clocks: dict[str, ClockControl] = {}
        self.etcd: EtcdCluster | None = None
        self._etcd_hosts: list[Host] = []
        #: broker target -> the hosts :meth:`isolate` cut off with it
        self._isolated: dict[str, list[str]] = {}
        self._closed = False
        #: set by :meth:`abort_start` (from another thread): start spawns nothing more
        self._start_aborted = threading.Event()

    # ---- addresses ---------------------------------------------------------------

    @property
    def namesrv(self) -> str:
        """Every nameserver's address, comma-separated (as brokers and clients take it)."""
        return ",".join(self.namesrv_addrs)

    @property
    def namesrv_addrs(self) -> list[str]:
        return [self._procs[t].handle.rpc for t in self.nameserver_targets()]

    @property
    def namesrv_http(self) -> str:
        """The first nameserver's admin HTTP address."""
        return self._procs[NAMESERVER].handle.http

    def nameserver_targets(self) -> list[str]:
        return [t for t in self._procs if is_nameserver(t)]

    def targets(self) -> list[str]:
        return list(self._procs)

    def broker_targets(self, group: str | None = None) -> list[str]:
        return [
            t
            for t in self._procs
            if not is_nameserver(t) and (group is None or t.startswith(group + "/"))
        ]

    def store_dir(self, target: str) -> Path:
        """The store directory of broker ``target`` (a tmpfs with ``tmpfs_store_mb``)."""
        parse_target(target)
        return self.workdir / "store" / target.replace("/", "-")

    def backing_dir(self, target: str) -> Path:
        """Where ``target``'s store really is: under its FUSE mount with
        ``lazyfs_stores`` (what survives a power loss), else the store directory."""
        if not self.spec.lazyfs_stores:
            return self.store_dir(target)
        return self.workdir / "backing" / target.replace("/", "-")

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
            if self.spec.etcd_members:
                self._start_etcd_cluster()
            for i in range(self.spec.nameservers):
                self._start(nameserver_target(i))
            # every group's slaves at once, then the masters (a master's pre-online
            # finds its slaves)
            groups = self.spec.groups
            for ids in (range(1, self.spec.replicas), (0,)):
                self._start_brokers([broker_target(g, bid) for g in groups for bid in ids])
        except BaseException:
            self.close()
            raise
        return self

    def abort_start(self) -> None:
        """Stop a :meth:`start` running in another thread (Ctrl-C during a drill's
        start): it spawns nothing more, and every process it spawned is killed, so that
        its wait for their ready files ends at once.  Before, the group's masters,
        spawned just after a Ctrl-C reached the nameserver and the slaves, waited in
        pre-online for a nameserver that was gone, and the start waited 30 s for them
        (``test_campaign_interrupt.py``, ctrl-c, seen twice in a full suite)."""
        self._start_aborted.set()
        for proc in list(self._procs.values()):
            with contextlib.suppress(Exception):
                proc.handle.resume()
                proc.handle.kill()

    def _check_start(self) -> None:
        if self._start_aborted.is_set():
            raise RuntimeError("the drill cluster's start was aborted")

    def _start_etcd_cluster(self) -> None:
        hosts: list[tuple[str, list[str]]] = []
        if self.network is not None:
            for i in range(self.spec.etcd_members):
                host = self.network.add_host(f"etcd{i}")
                self._etcd_hosts.append(host)
                hosts.append((host.ip, host.exec_prefix()))
        etcd_dir = self.workdir / "etcd"
        etcd_dir.mkdir(parents=True, exist_ok=True)
        self.etcd = run_etcd(etcd_dir, self.spec.etcd_members, hosts=hosts, log_dir=self.log_dir)
        self.env["HAC_ETCD_ENDPOINTS"] = self.etcd.endpoints
        self.env["HAC_AUTO_SWITCH_AFTER_MS"] = str(self.spec.auto_switch_after_ms)
        log.info("etcd %s", self.etcd.endpoints)

    # ---- etcd (controller mode) ----------------------------------------------------

    def etcd_targets(self) -> list[str]:
        members = [] if self.etcd is None else self.etcd.members
        return [etcd_target(i) for i in range(len(members))]

    def _etcd(self) -> EtcdCluster:
        if self.etcd is None:
            raise FaultUnsupported("an etcd fault needs controller mode (etcd_members)")
        return self.etcd

    def stop_etcd(self) -> None:
        """kill -9 every etcd member: the controller can decide nothing."""
        for m in self._etcd().members:
            m.kill()

    def start_etcd(self, timeout: float = 30.0) -> None:
        """Start every etcd member that is down, on its data, and wait until they serve."""
        cluster = self._etcd()
        for m in cluster.members:
            if not m.alive():
                m.start()
        cluster.wait_healthy(timeout)

    def isolate(self, target: str, etcd_index: int) -> None:
        """Cut broker ``target`` and etcd member ``etcd_index`` off from every other host
        (they still reach each other, and clients still reach them)."""
        net, host = self._host(target, "isolating a master with an etcd member")
        if not 0 <= etcd_index < len(self._etcd_hosts):
            raise FaultUnsupported(f"no etcd member {etcd_index} in a namespace of its own")
        names = [host.name, self._etcd_hosts[etcd_index].name]
        net.isolate(names)
        self._isolated[target] = names

    def heal_isolation(self, target: str) -> None:
        names = self._isolated.pop(target, [])
        if names and self.network is not None:
            self.network.heal_isolation(names)

    def _host_name(self, target: str) -> str:
        if is_nameserver(target):
            return "ns" + target.removeprefix(NAMESERVER).removeprefix("-")
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
        if is_nameserver(target):
            port_rpc, port_http = ("0", "0") if host is None else ("9876", "9877")
            args = ["nameserver", "--listen", f"{ip}:{port_rpc}", "--http", f"{ip}:{port_http}"]
        else:
            group, bid = parse_target(target)
            env.update(self.spec.broker_env.get(target, {}))
            if host is not None:
                env["HAC_BROKER_IP1"] = host.ip
            ports = ("0", "0", "0") if host is None else ("10911", "10912", "10913")
            store = self.store_dir(target)
            if self.spec.tmpfs_store_mb is not None:
                self._mount_store(self.backing_dir(target), self.spec.tmpfs_store_mb)
            if self.spec.lazyfs_stores:
                self._mount_lazy(target)
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
                str(store),
            ]
        if self.spec.clock_shim:
            clock = ClockControl(self.workdir / "clock" / name)
            self._clocks[target] = clock
            env.update(clock.env())
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

    def _start_brokers(self, targets: list[str]) -> None:
        self._check_start()
        for target in targets:
            self._procs[target] = self._make(target)
        start_all([self._procs[t].handle for t in targets], timeout=30.0, abort=self._start_aborted)
        for target in targets:
            handle = self._procs[target].handle
            log.info("started %s (pid %d, rpc %s)", target, handle.pid, handle.rpc)

    def _start(self, target: str) -> ProcessHandle:
        self._check_start()
        proc = self._make(target)
        self._procs[target] = proc
        handle = proc.handle
        handle.spawn().wait_ready(30.0, self._start_aborted)
        if is_nameserver(target) and proc.host is None:
            # a restarted nameserver must come back where brokers and clients know it:
            # the ports bound on the first start are kept (the listeners reuse addresses)
            argv = handle.argv
            argv[argv.index("--listen") + 1] = handle.rpc
            argv[argv.index("--http") + 1] = handle.http
        log.info("started %s (pid %d, rpc %s)", target, handle.pid, handle.rpc)
        return handle

    def _mount_store(self, store: Path, size_mb: int) -> None:
        store.mkdir(parents=True, exist_ok=True)
        error = _mount_tmpfs(store, size_mb)
        if error is not None:
            raise FaultUnsupported(f"cannot mount a tmpfs store on {store}: {error}")
        self._mounts.append(store)
        log.info("store %s is a tmpfs of %d MiB", store, size_mb)

    def _mount_lazy(self, target: str) -> None:
        mount = LazyMount(
            self.backing_dir(target),
            self.store_dir(target),
            self.log_dir / f"lazyfs-{target.replace('/', '-')}.log",
        )
        try:
            mount.mount()
        except LazyfsError as exc:
            raise FaultUnsupported(f"cannot mount {target}'s store through lazyfs: {exc}") from exc
        self._lazy[target] = mount

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

    # ---- power, corruption, clocks ----------------------------------------------------

    def power_scope(self, target: str) -> list[str]:
        """The processes a power loss of ``target`` takes down: a broker, every broker of
        a group (``"broker-a"``), or every process (``"cluster"``)."""
        if target == CLUSTER:
            return list(self._procs)
        if target in self.spec.groups:
            return self.broker_targets(target)
        parse_target(target)
        return [target]

    def power_off(self, target: str) -> list[str]:
        """Power loss of ``target``'s scope: kill -9 its processes, then kill the FUSE
        daemons of their stores (unsynced writes are gone); the processes hit."""
        if not self.spec.lazyfs_stores:
            raise FaultUnsupported("a power loss needs the stores on lazyfs (lazyfs_stores)")
        hit = self.power_scope(target)
        for t in hit:
            self._procs[t].handle.kill()
        for t in hit:
            if t in self._lazy:
                self._lazy[t].power_cut()
        return hit

    def power_on(self, target: str, timeout: float = 30.0) -> None:
        """Power back: mount the stores again, then start the nameservers, then the
        slaves, then the masters (each wave at once)."""
        hit = self.power_scope(target)
        for t in hit:
            if t in self._lazy:
                self._lazy[t].mount()
        waves = [
            [t for t in hit if is_nameserver(t)],
            [t for t in hit if not is_nameserver(t) and parse_target(t)[1] != 0],
            [t for t in hit if not is_nameserver(t) and parse_target(t)[1] == 0],
        ]
        for wave in filter(None, waves):  # each wave at once, as power comes back
            with ThreadPoolExecutor(max_workers=len(wave)) as pool:
                for done in [pool.submit(self.restart, t, timeout) for t in wave]:
                    done.result()

    def corrupt(self, target: str, variant: str, *, stopped: bool, seed: int) -> str:
        """Damage ``target``'s store (:func:`~ha_controller.drills.corruption.corrupt_store`),
        after kill -9 when ``stopped``; what was done, in words."""
        parse_target(target)
        if stopped:
            self._procs[target].handle.kill()
        done = corrupt_store(self.store_dir(target), variant, random.Random(seed))
        return f"{done} ({'stopped' if stopped else 'while running'})"

    def _clock(self, target: str) -> ClockControl:
        clock = self._clocks.get(target)
        if clock is None:
            raise FaultUnsupported("a clock fault needs the clock shim (clock_shim)")
        return clock

    def step_clock(self, target: str, seconds: float) -> None:
        """Step ``target``'s wall clock by ``seconds`` (its monotonic clock never moves)."""
        self._clock(target).step(seconds)

    def reset_clock(self, target: str) -> None:
        """Put ``target``'s wall clock back on the real one."""
        self._clock(target).set_offset(0.0)

    # ---- network faults ------------------------------------------------------------

    def _host(self, target: str, what: str) -> tuple[Network, Host]:
        proc = self._procs[target]
        if self.network is None or proc.host is None:
            raise FaultUnsupported(f"{what} needs hosts in network namespaces (--netns)")
        return self.network, proc.host

    def partition(self, target: str, direction: Direction = "both") -> None:
        """Cut ``target`` off; ``direction`` ``in``/``out`` cuts one way only."""
        net, host = self._host(target, "a network partition")
        try:
            net.partition(host.name, direction)
        except NetworkError as exc:
            if direction == "both":
                raise
            raise FaultUnsupported(f"no one-way partition here: {exc}") from exc

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
                try:
                    net.start_blackouts(host.name, loss_pct)
                except NetworkError as exc3:
                    raise FaultUnsupported(
                        f"no way to drop packets here: {exc}; {exc2}; {exc3}"
                    ) from exc3
                return "blackouts"
            return "iptables"
        return "netem"

    def clear_netem(self, target: str) -> None:
        net, host = self._host(target, "netem")
        net.clear_netem(host.name)
        net.clear_loss(host.name)

    # ---- disk faults ---------------------------------------------------------------

    def _tmpfs_store(self, target: str) -> Path:
        store = self.backing_dir(target)
        if store not in self._mounts:
            raise FaultUnsupported(
                "a disk-full fault needs the brokers' stores on tmpfs (tmpfs_store_mb)"
            )
        return store

    def fill_disk(self, target: str, *, keep_free_pct: float = 1.0) -> int:
        """Fill ``target``'s tmpfs store until ``keep_free_pct`` % of it is free; returns
        the bytes the filler file took."""
        store = self._tmpfs_store(target)
        st = os.statvfs(store)
        free = st.f_bavail * st.f_frsize
        keep = int(st.f_blocks * st.f_frsize * keep_free_pct / 100)
        size = max(free - keep, 0) // 4096 * 4096
        with (store / FILLER).open("ab") as fh:
            if size:
                os.posix_fallocate(fh.fileno(), fh.tell(), size)
        return size

    def free_disk(self, target: str) -> None:
        """Delete the filler file of ``target``'s store (idempotent)."""
        (self._tmpfs_store(target) / FILLER).unlink(missing_ok=True)

    # ---- teardown ----------------------------------------------------------------

    def close(self, keep_stores: Path | None = None) -> None:
        """Kill every process, remove the network and the stores (idempotent).

        With ``keep_stores`` the stores are first archived there (a gzipped tar of
        ``store/``, written once the processes are gone): what a failing drill's brokers
        held, for reading its commit logs and tables afterwards."""
        if self._closed:
            return
        self._closed = True
        for proc in reversed(list(self._procs.values())):
            with contextlib.suppress(Exception):
                proc.handle.resume()
                proc.handle.kill()
        if self.etcd is not None:
            for member in self.etcd.members:
                with contextlib.suppress(Exception):
                    member.kill()
        if keep_stores is not None:
            try:
                keep_stores.parent.mkdir(parents=True, exist_ok=True)
                with tarfile.open(keep_stores, "w:gz") as tar:
                    tar.add(self.workdir / "store", arcname="store")
            except OSError as exc:
                log.warning("stores not kept in %s: %s", keep_stores, exc)
        if self.network is not None:
            try:
                self.network.close()
            except NetworkError as exc:
                log.warning("network cleanup: %s", exc)
        for mount in self._lazy.values():
            mount.unmount()
        self._lazy.clear()
        for store in self._mounts:  # a tmpfs store goes with its mount, keep_store or not
            _umount(store)
        self._mounts.clear()
        if not self.keep_store:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def describe(self) -> list[str]:
        """One line per process, for the terminal."""
        etcd = [] if self.etcd is None else self.etcd.members
        return [
            *(
                f"{etcd_target(i):<12} pid {m.proc.pid if m.proc else '-':<7} client {m.endpoint}"
                for i, m in enumerate(etcd)
            ),
            *(
                f"{target:<12} pid {p.handle.pid:<7} rpc {p.handle.rpc}"
                for target, p in self._procs.items()
                if p.handle.proc is not None and p.handle.ready
            ),
        ]

    def __enter__(self) -> DrillCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
