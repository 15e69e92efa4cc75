"""Drill hosts in Linux network namespaces, so that partitions are real.

One :class:`Network` per drill run: a bridge in the root namespace with the address
``<prefix>.1/24`` and, per host, a namespace ``hacd-<owner>-<host>`` joined to the bridge
by a veth pair (``eth0`` inside, with ``<prefix>.<n>/24``).  The prefix is a private
/24 (``10.77.<k>``) that no route of this machine uses; an ``unreachable`` route for it
(high metric) guards against traffic leaking to the default route if the bridge ever
went away while something still talked.  Nothing here ever reaches outside the bridge:
the namespaces have no default route.

``owner`` is the drill process's pid in hex, so :func:`cleanup_stale` can remove what a
killed drill left behind (namespaces, veths, bridge, guard route) without touching the
resources of a drill that is still running.

Faults on a host: :meth:`Network.partition` takes the root side of its veth down (the
host can reach no one and no one reaches it; its processes keep running), or, one way
only, puts a ``pfifo limit 0`` queue (it drops every packet) on one direction of the
link: ``direction="in"`` on the root side of the veth (the host hears nothing, what it
sends still arrives), ``"out"`` on the host's ``eth0`` (it sends nothing, it still
hears).  ``pfifo`` is in every kernel that has ``tc`` at all, unlike netem.
:meth:`Network.isolate` cuts a set of hosts off from the other hosts only (iptables in
each): they still reach each other and the root namespace, so clients keep talking to
a minority side (apache/rocketmq#7017: a master cut off with one etcd member).
:meth:`Network.set_netem` adds ``tc netem`` delay/loss on both directions of its link
when the kernel has ``sch_netem``; :meth:`Network.set_loss` falls back to an iptables
``statistic`` DROP rule inside the host namespace (OpenChaos's loss fault) when netem is
missing; :meth:`Network.start_blackouts` is the last resort when neither exists: both
directions of the link drop everything (``pfifo limit 0``) for ``loss_pct`` % of every
``period_ms`` — burst loss of the same average rate, not independent per-packet loss.
Every command is run with a timeout and logged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Final, Literal

from ha_controller.protocol.errors import HaError

__all__ = [
    "NS_PREFIX",
    "Direction",
    "Host",
    "Network",
    "NetworkError",
    "cleanup_stale",
    "netns_available",
    "owner_alive",
]

log = logging.getLogger(__name__)

NS_PREFIX: Final = "hacd-"
_LINK_PREFIX: Final = "hd"
_GUARD_METRIC: Final = 4242
_CMD_TIMEOUT_S: Final = 15.0
_ISOLATION_CHAIN: Final = "HACISO"

#: which way a partition cuts: ``both``, ``in`` (the host hears nothing) or ``out`` (it
#: sends nothing)
Direction = Literal["both", "in", "out"]
DIRECTIONS: Final[tuple[Direction, ...]] = ("both", "in", "out")


class NetworkError(HaError, RuntimeError):
    """A network-namespace command failed (or namespaces are not permitted here)."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    log.debug("net: %s", " ".join(argv))
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=_CMD_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetworkError(f"{' '.join(argv)}: {exc}") from exc
    if check and proc.returncode != 0:
        raise NetworkError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def netns_available() -> str | None:
    """``None`` when this process may create network namespaces, else the reason why not."""
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
    probe = f"{NS_PREFIX}{os.getpid():x}-probe"
    try:
        proc = _run("ip", "netns", "add", probe, check=False)
    except NetworkError as exc:
        return str(exc)
    if proc.returncode != 0:
        return f"'ip netns add' is not permitted here: {proc.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def owner_alive(owner_hex: str) -> bool:
    """Whether the drill process of an owner tag (its pid in hex) still runs."""
    try:
        pid = int(owner_hex, 16)
    except ValueError:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale() -> list[str]:
    """Remove the namespaces, links and guard routes of drills whose process is gone.

    Returns what was removed.  Resources of a live drill process are left alone.
    """
    removed: list[str] = []
    if shutil.which("ip") is None:
        return removed
    listing = _run("ip", "netns", "list", check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"{NS_PREFIX}([0-9a-f]+)-.+", name)
        if m and not owner_alive(m.group(1)):
            _run("ip", "netns", "del", name, check=False)
            removed.append(f"netns {name}")
    links = _run("ip", "-o", "link", "show", check=False).stdout
    for line in links.splitlines():
        m = re.match(rf"\d+: ({_LINK_PREFIX}([0-9a-f]+)[hb][0-9a-z]*)[@:]", line)
        if m and not owner_alive(m.group(2)):
            _run("ip", "link", "del", m.group(1), check=False)
            removed.append(f"link {m.group(1)}")
    routes = _run("ip", "route", "show", "metric", str(_GUARD_METRIC), check=False).stdout
    for line in routes.splitlines():
        m = re.match(r"unreachable (10\.77\.\d+\.0/24)", line)
        if m and not _subnet_in_use(m.group(1)):
            _run("ip", "route", "del", "unreachable", m.group(1), "metric", str(_GUARD_METRIC))
            removed.append(f"route {m.group(1)}")
    if removed:
        log.warning("removed what a stopped drill left behind: %s", ", ".join(removed))
    return removed


def _subnet_in_use(cidr: str) -> bool:
    """A bridge of a live drill still carries ``cidr``."""
    out = _run("ip", "route", "show", cidr, check=False).stdout
    return any(line.strip() and not line.startswith("unreachable") for line in out.splitlines())


@dataclass
class Host:
    """One namespace on the bridge."""

    name: str
    netns: str
    ip: str
    veth: str  # root-side end, on the bridge
    partitioned: bool = False
    #: the one-way partition in place (``in``/``out``), None when none
    one_way: Literal["in", "out"] | None = None
    shaped: bool = False
    #: cut off from the other hosts but not from the root namespace (:meth:`Network.isolate`)
    isolated: bool = False
    loss_rule: list[str] | None = None
    blackout: _Blackouts | None = None

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns]


@dataclass
class Network:
    """A bridge and hosts in namespaces; :meth:`close` removes all of it (idempotent)."""

    owner: str = field(default_factory=lambda: f"{os.getpid():x}")
    prefix: str = ""
    bridge: str = ""
    hosts: dict[str, Host] = field(default_factory=dict)
    _up: bool = False
    _guard: bool = False

    def __post_init__(self) -> None:
        self.bridge = f"{_LINK_PREFIX}{self.owner}b"

    # ---- setup -------------------------------------------------------------------

    def up(self) -> None:
        """Create the bridge and the guard route."""
        reason = netns_available()
        if reason is not None:
            raise NetworkError(reason)
        cleanup_stale()
        self.prefix = self._free_prefix()
        cidr = f"{self.prefix}.0/24"
        try:
            _run("ip", "route", "add", "unreachable", cidr, "metric", str(_GUARD_METRIC))
            self._guard = True
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            self._up = True
            _run("ip", "addr", "add", f"{self.prefix}.1/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise
        log.info("drill network %s on bridge %s", cidr, self.bridge)

    def _free_prefix(self) -> str:
        used = _run("ip", "route", "show", check=False).stdout
        start = int(self.owner, 16) % 200
        for i in range(200):
            k = 20 + (start + i) % 200
            if f"10.77.{k}." not in used:
                return f"10.77.{k}"
        raise NetworkError("no free 10.77.x.0/24 subnet for the drill network")

    def add_host(self, name: str) -> Host:
        """A namespace with ``eth0`` on the bridge and ``lo`` up."""
        if not self._up:
            raise NetworkError("network is not up")
        index = len(self.hosts) + 2
        host = Host(
            name=name,
            netns=f"{NS_PREFIX}{self.owner}-{name}",
            ip=f"{self.prefix}.{index}",
            veth=f"{_LINK_PREFIX}{self.owner}h{index}",
        )
        peer = f"{_LINK_PREFIX}{self.owner}p{index}"
        self.hosts[name] = host
        _run("ip", "netns", "add", host.netns)
        _run("ip", "link", "add", host.veth, "type", "veth", "peer", "name", peer)
        _run("ip", "link", "set", peer, "netns", host.netns)
        _run("ip", "-n", host.netns, "link", "set", peer, "name", "eth0")
        _run("ip", "-n", host.netns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        _run("ip", "-n", host.netns, "link", "set", "lo", "up")
        _run("ip", "-n", host.netns, "link", "set", "eth0", "up")
        _run("ip", "link", "set", host.veth, "master", self.bridge)
        _run("ip", "link", "set", host.veth, "up")
        return host

    # ---- faults ------------------------------------------------------------------

    def partition(self, name: str, direction: Direction = "both") -> None:
        """Cut ``name`` off from every other host (and from the drill's clients); one way
        only with ``direction`` ``in`` or ``out`` (module docstring)."""
        host = self.hosts[name]
        if direction == "both":
            _run("ip", "link", "set", host.veth, "down")
            host.partitioned = True
        elif direction == "in" or direction == "out":
            _drop_all(host, direction, on=True)
            host.one_way = direction
        else:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")

    def heal_partition(self, name: str) -> None:
        host = self.hosts[name]
        if host.one_way is not None:
            _drop_all(host, host.one_way, on=False)
            host.one_way = None
        _run("ip", "link", "set", host.veth, "up")
        host.partitioned = False

    def set_netem(
        self, name: str, *, delay_ms: int = 0, jitter_ms: int = 0, loss_pct: float = 0
    ) -> None:
        """``tc netem`` on both directions of the host's link; NetworkError without sch_netem."""
        host = self.hosts[name]
        spec: list[str] = []
        if delay_ms:
            spec += ["delay", f"{delay_ms}ms"] + ([f"{jitter_ms}ms"] if jitter_ms else [])
        if loss_pct:
            spec += ["loss", f"{loss_pct}%"]
        if not spec:
            return
        _run("tc", "qdisc", "replace", "dev", host.veth, "root", "netem", *spec)
        host.shaped = True
        try:
            _run(
                "ip",
                "netns",
                "exec",
                host.netns,
                "tc",
                "qdisc",
                "replace",
                "dev",
                "eth0",
                "root",
                "netem",
                *spec,
            )
        except NetworkError:
            self.clear_netem(name)
            raise

    def clear_netem(self, name: str) -> None:
        host = self.hosts[name]
        if host.shaped:
            _run("tc", "qdisc", "del", "dev", host.veth, "root", check=False)
            _run(
                "ip",
                "netns",
                "exec",
                host.netns,
                "tc",
                "qdisc",
                "del",
                "dev",
                "eth0",
                "root",
                check=False,
            )
            host.shaped = False

    def set_loss(self, name: str, loss_pct: float) -> None:
        """Drop ``loss_pct`` % of the host's incoming packets with iptables (no netem needed)."""
        host = self.hosts[name]
        if shutil.which("iptables") is None:
            raise NetworkError("packet loss needs tc netem (sch_netem) or iptables")
        rule = [
            "INPUT",
            "-i",
            "eth0",
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            f"{loss_pct / 100:.4f}",
            "-j",
            "DROP",
        ]
        _run("ip", "netns", "exec", host.netns, "iptables", "-A", *rule)
        host.loss_rule = rule

    def clear_loss(self, name: str) -> None:
        host = self.hosts[name]
        if host.loss_rule is not None:
            _run("ip", "netns", "exec", host.netns, "iptables", "-D", *host.loss_rule, check=False)
            host.loss_rule = None
        if host.blackout is not None:
            host.blackout.stop()
            host.blackout = None

    def isolate(self, names: list[str]) -> None:
        """Cut the hosts ``names`` off from every other host, but not from each other nor
        from the root namespace (the drill's clients): a minority side that clients
        still reach (iptables in each host, chain ``HACISO``)."""
        if shutil.which("iptables") is None:
            raise NetworkError("a partial partition needs iptables")
        inside = {self.hosts[n].ip for n in names}
        others = [h.ip for h in self.hosts.values() if h.ip not in inside]
        for name in names:
            host = self.hosts[name]
            ipt = ["ip", "netns", "exec", host.netns, "iptables"]
            _run(*ipt, "-N", _ISOLATION_CHAIN)
            for ip in others:
                _run(*ipt, "-A", _ISOLATION_CHAIN, "-s", ip, "-j", "DROP")
                _run(*ipt, "-A", _ISOLATION_CHAIN, "-d", ip, "-j", "DROP")
            _run(*ipt, "-I", "INPUT", "-j", _ISOLATION_CHAIN)
            _run(*ipt, "-I", "OUTPUT", "-j", _ISOLATION_CHAIN)
            host.isolated = True

    def heal_isolation(self, names: list[str]) -> None:
        """Undo :meth:`isolate` on ``names`` (idempotent)."""
        for name in names:
            host = self.hosts[name]
            if not host.isolated:
                continue
            ipt = ["ip", "netns", "exec", host.netns, "iptables"]
            _run(*ipt, "-D", "INPUT", "-j", _ISOLATION_CHAIN, check=False)
            _run(*ipt, "-D", "OUTPUT", "-j", _ISOLATION_CHAIN, check=False)
            _run(*ipt, "-F", _ISOLATION_CHAIN, check=False)
            _run(*ipt, "-X", _ISOLATION_CHAIN, check=False)
            host.isolated = False

    def start_blackouts(self, name: str, loss_pct: float, *, period_ms: int = 1000) -> None:
        """Drop everything on both directions of the host's link for ``loss_pct`` % of each
        ``period_ms`` (needs only ``tc`` with ``pfifo``); :meth:`clear_loss` stops it."""
        host = self.hosts[name]
        if not 0 < loss_pct < 100:
            raise ValueError(f"loss_pct must be in (0, 100), got {loss_pct}")
        if host.blackout is not None:
            host.blackout.stop()
        _drop_all(host, "in", on=True)  # fails here, not in the thread, without tc/pfifo
        _drop_all(host, "in", on=False)
        host.blackout = _Blackouts(host, loss_pct / 100, period_ms / 1000)
        host.blackout.start()

    # ---- teardown ----------------------------------------------------------------

    def close(self) -> None:
        """Remove the namespaces, veths, bridge and guard route (idempotent).

        Call it only once the processes inside the namespaces are gone.
        """
        for host in list(self.hosts.values()):
            if host.blackout is not None:
                host.blackout.stop()
                host.blackout = None
            _run("ip", "netns", "del", host.netns, check=False)
            _run("ip", "link", "del", host.veth, check=False)
        self.hosts.clear()
        if self._up:
            _run("ip", "link", "del", self.bridge, check=False)
            self._up = False
        if self._guard:
            _run(
                "ip",
                "route",
                "del",
                "unreachable",
                f"{self.prefix}.0/24",
                "metric",
                str(_GUARD_METRIC),
                check=False,
            )
            self._guard = False

    def __enter__(self) -> Network:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(NetworkError):
            self.close()


def _drop_all(host: Host, direction: Literal["in", "out"], *, on: bool) -> None:
    """Put (``on``) or remove a ``pfifo limit 0`` root queue, which drops every packet,
    on one direction of ``host``'s link: ``in`` on the root side of the veth (traffic to
    the host), ``out`` on its ``eth0`` (traffic from it)."""
    if direction == "in":
        where = ["tc", "qdisc", "replace" if on else "del", "dev", host.veth, "root"]
    else:
        where = [*host.exec_prefix(), "tc", "qdisc", "replace" if on else "del", "dev", "eth0"]
        where.append("root")
    _run(*where, *(["pfifo", "limit", "0"] if on else []), check=on)


class _Blackouts:
    """A thread that cuts both directions of a link for ``share`` of every ``period_s``."""

    def __init__(self, host: Host, share: float, period_s: float) -> None:
        self.host = host
        self.share = share
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"blackouts-{host.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                _drop_all(self.host, "in", on=True)
                _drop_all(self.host, "out", on=True)
                self._stop.wait(self.period_s * self.share)
            except NetworkError as exc:
                log.warning("blackout on %s: %s", self.host.name, exc)
            finally:
                _drop_all(self.host, "in", on=False)
                _drop_all(self.host, "out", on=False)
            self._stop.wait(self.period_s * (1 - self.share))

    def stop(self) -> None:
        """Stop and leave the link open (idempotent)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=_CMD_TIMEOUT_S * 3)
        _drop_all(self.host, "in", on=False)
        _drop_all(self.host, "out", on=False)
