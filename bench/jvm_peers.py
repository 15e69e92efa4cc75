"""Apache RocketMQ 5.5 and Apache Kafka 4, assembled from Maven Central, on loopback.

    .venv/bin/python bench/jvm_peers.py fetch         # fetch and check both (make bench does)
    .venv/bin/python bench/jvm_peers.py pin           # re-pin after changing a version

Fetching: each peer is a list of Maven artifacts (``PEERS``); ``mvn
dependency:copy-dependencies`` on a generated pom copies them with every dependency
into ``~/.cache/ha-controller/peers/<name>-<version>/lib`` (``HAC_TOOLS_CACHE``
overrides the cache), and every jar is checked against ``bench/peers.sha256``: a
jar that is missing, extra or of another sha256 fails the fetch.  A checked copy is
used again without Maven.

Deployments (every port on 127.0.0.1, every process in its own process group, stopped
by ``aclose()``; JVM heaps fixed small for a 2-core, 24 GiB machine, ``HEAP_MB``):

- RocketMQ, ``mode="acting"``: one nameserver, per group a SYNC_MASTER and a SLAVE
  with ``enableSlaveActingMaster=true`` (RIP-32, what ha-controller re-implements),
  and the gRPC proxy in cluster mode, which the official SDKs dial;
- RocketMQ, ``mode="controller"``: the same groups in controller mode (a DLedger
  controller inside the nameserver, ``allAckInSyncStateSet=true``): the controller
  elects a new master from the in-sync set when one dies;
- Kafka: three KRaft nodes, each broker and controller, replication factor 3,
  ``min.insync.replicas=2`` (the producer sends with ``acks=all``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peers import LOOPBACK, Proc, Unavailable, free_ports, peak_rss_of, wait_port

from ha_controller.testing import FAST_ENV

HERE = Path(__file__).resolve().parent
PINS = HERE / "peers.sha256"
#: the newest versions Maven Central serves whole (RocketMQ 5.5.1 is served in part:
#: rocketmq-namesrv, -proxy, -client and others of 5.5.1 are missing)
ROCKETMQ_VERSION = "5.5.0"
KAFKA_VERSION = "4.4.0"
PEERS: dict[str, tuple[str, list[str]]] = {
    "rocketmq": (
        ROCKETMQ_VERSION,
        [
            "org.apache.rocketmq:rocketmq-namesrv",
            "org.apache.rocketmq:rocketmq-broker",
            "org.apache.rocketmq:rocketmq-proxy",
            "org.apache.rocketmq:rocketmq-controller",
        ],
    ),
    "kafka": (KAFKA_VERSION, ["org.apache.kafka:kafka_2.13"]),
}
#: -Xms = -Xmx per process, MiB
HEAP_MB = {"rocketmq-namesrv": 256, "rocketmq-broker": 512, "rocketmq-proxy": 512, "kafka": 512}


def cache_root() -> Path:
    base = os.environ.get("HAC_TOOLS_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ha-controller"
    )
    return Path(base) / "peers"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _pins() -> dict[str, str]:
    out = {}
    if PINS.exists():
        for line in PINS.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                digest, name = line.split()
                out[name] = digest
    return out


def _pom(name: str) -> str:
    version, artifacts = PEERS[name]
    deps = "".join(
        "<dependency><groupId>{}</groupId><artifactId>{}</artifactId>"
        "<version>{}</version></dependency>\n".format(*a.split(":"), version)
        for a in artifacts
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>local.bench</groupId><artifactId>{name}-peer</artifactId><version>1"
        f"</version><packaging>pom</packaging><dependencies>\n{deps}</dependencies></project>\n"
    )


def _check(name: str, lib: Path, pins: dict[str, str]) -> str | None:
    """None when ``lib`` holds exactly the pinned jars of ``name``, else what differs."""
    prefix = f"{name}-{PEERS[name][0]}/"
    want = {k[len(prefix) :]: v for k, v in pins.items() if k.startswith(prefix)}
    if not want:
        return f"no sha256 pins for {prefix} in {PINS.name} (run: jvm_peers.py pin)"
    have = {p.name for p in lib.glob("*.jar")} if lib.is_dir() else set()
    if have != set(want):
        missing, extra = sorted(set(want) - have), sorted(have - set(want))
        return f"jars differ from the pins: missing {missing[:3]}, unpinned {extra[:3]}"
    for jar, digest in want.items():
        if _sha256(lib / jar) != digest:
            return f"{jar}: sha256 differs from its pin"
    return None


def _mvn_copy(name: str, out: Path, log: Path) -> None:
    if shutil.which("mvn") is None:
        raise Unavailable("mvn is not installed (apt-get install maven), so it cannot be fetched")
    pom = out / "pom.xml"
    pom.write_text(_pom(name))
    with log.open("ab") as f:
        proc = subprocess.run(
            [
                *("mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies"),
                f"-DoutputDirectory={out / 'lib'}",
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=900,
            check=False,
        )
    if proc.returncode != 0:
        raise Unavailable(f"mvn could not fetch {name} {PEERS[name][0]} (see {log})")


def fetch(name: str) -> Path:
    """The checked ``lib`` directory of peer ``name``, fetched on first use."""
    version = PEERS[name][0]
    home = cache_root() / f"{name}-{version}"
    pins = _pins()
    if _check(name, home / "lib", pins) is None:
        return home
    cache_root().mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache_root()))
    try:
        _mvn_copy(name, tmp, cache_root() / f"mvn-{name}.log")
        problem = _check(name, tmp / "lib", pins)
        if problem:
            raise Unavailable(f"{name} {version} from Maven Central: {problem}")
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        (tmp / "lib").rename(home / "lib")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return home


def pin() -> None:
    """Fetch every peer without the check and write ``bench/peers.sha256``."""
    lines = [f"# sha256 of every jar of the benchmark's JVM peers ({Path(__file__).name} pin)"]
    for name, (version, _) in PEERS.items():
        tmp = Path(tempfile.mkdtemp(prefix=f"pin-{name}-"))
        try:
            _mvn_copy(name, tmp, tmp / "mvn.log")
            for jar in sorted((tmp / "lib").glob("*.jar")):
                lines.append(f"{_sha256(jar)}  {name}-{version}/{jar.name}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    PINS.write_text("\n".join(lines) + "\n")


def java() -> str:
    exe = shutil.which("java")
    if exe is None:
        raise Unavailable("java is not installed (RocketMQ 5.5 and Kafka 4 need Java 17)")
    return exe


def java_version() -> str:
    out = subprocess.run([java(), "-version"], capture_output=True, text=True, check=False)
    first = (out.stderr or out.stdout).splitlines()
    return first[0] if first else ""


def jvm_argv(home: Path, heap_mb: int, main: str, *args: str, props: dict[str, str]) -> list[str]:
    return [
        java(),
        f"-Xms{heap_mb}m",
        f"-Xmx{heap_mb}m",
        "-XX:+UseG1GC",
        "-XX:MaxDirectMemorySize=256m",
        "-XX:-OmitStackTraceInFastThrow",
        "-Djava.net.preferIPv4Stack=true",
        *(f"-D{k}={v}" for k, v in props.items()),
        "-cp",
        str(home / "lib" / "*"),
        main,
        *args,
    ]


def port_blocks(n: int, width: int) -> list[int]:
    """``n`` base ports, each with ``base - 2 .. base + width - 1`` free (a RocketMQ
    broker listens on base, base - 2 (its fast channel) and base + 1 (HA))."""
    out: list[int] = []
    taken: set[int] = set()
    for _ in range(200):
        if len(out) == n:
            return out
        base = free_ports(1)[0]
        span = range(base - 2, base + width)
        if base < 3000 or taken & set(span):
            continue
        socks = []
        try:
            for p in span:
                s = socket.socket()
                s.bind((LOOPBACK, p))
                socks.append(s)
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        out.append(base)
        taken |= set(span)
    raise Unavailable("no free blocks of loopback ports")


# ---- RocketMQ remoting, for the few admin calls the benchmark needs --------------------------

UPDATE_AND_CREATE_TOPIC = 17
GET_ROUTEINFO_BY_TOPIC = 105
GET_BROKER_CLUSTER_INFO = 106


async def remoting_call(
    addr: str, code: int, ext: dict[str, str] | None = None, timeout_s: float = 5.0
) -> tuple[int, str, bytes]:
    """One RocketMQ remoting request (JSON header): (response code, remark, body)."""
    host, port = addr.rsplit(":", 1)
    header = json.dumps(
        {"code": code, "language": "PYTHON", "version": 500, "opaque": 1, "flag": 0}
        | ({"extFields": ext} if ext else {})
    ).encode()
    frame = struct.pack(">II", 4 + len(header), len(header)) + header
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(frame)
            total, head_len = struct.unpack(">II", await reader.readexactly(8))
            head_len &= 0xFFFFFF
            head = json.loads(await reader.readexactly(head_len))
            body = await reader.readexactly(total - 4 - head_len)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    return int(head.get("code", -1)), str(head.get("remark") or ""), body


def _fastjson(body: bytes) -> Any:
    """fastjson writes integer map keys bare ({0:"addr"}); quote them for json."""
    return json.loads(re.sub(rb"([{,])(-?\d+):", rb'\1"\2":', body))


# ---- RocketMQ --------------------------------------------------------------------------------


@dataclass
class RocketMQCluster:
    """A RocketMQ 5.5 nameserver, ``groups`` x (master + SYNC slave) and the gRPC proxy."""

    workdir: Path
    mode: str = "acting"  # or "controller"
    groups: tuple[str, ...] = ("broker-a", "broker-b")
    cluster_name: str = "BenchCluster"
    procs: dict[str, Proc] = field(default_factory=dict)
    broker_ports: dict[str, int] = field(default_factory=dict)
    namesrv: str = ""
    grpc_port: int = 0
    version: str = f"Apache RocketMQ {ROCKETMQ_VERSION}"

    @property
    def endpoint(self) -> str:
        """The proxy's gRPC endpoint (what the official SDKs dial)."""
        return f"{LOOPBACK}:{self.grpc_port}"

    def _env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "ROCKETMQ_HOME": str(self.workdir),
            "LANG": "C.UTF-8",
        }

    def _start(self, name: str, main: str, heap: str, *args: str) -> Proc:
        ndir = self.workdir / name
        ndir.mkdir(parents=True, exist_ok=True)
        argv = jvm_argv(
            self.home,
            HEAP_MB[heap],
            main,
            *args,
            # RocketMQ logs under ${user.home}/logs/rocketmqlogs
            props={"user.home": str(ndir), "rocketmq.home.dir": str(self.workdir)},
        )
        proc = Proc(name, argv, self._env(), ndir / "console.log").start()
        self.procs[name] = proc
        return proc

    async def start(self) -> None:
        self.home = await asyncio.to_thread(fetch, "rocketmq")
        java()
        self.workdir.mkdir(parents=True, exist_ok=True)
        ns_port, ctl_port, proxy_grpc, proxy_remoting = free_ports(4)
        self.namesrv = f"{LOOPBACK}:{ns_port}"
        ns_conf = self.workdir / "namesrv.conf"
        lines = [
            f"listenPort={ns_port}",
            # the expiry scan as often as ha-controller's in the benchmark (100 ms);
            # RocketMQ's default is 5 s
            "scanNotActiveBrokerInterval=100",
        ]
        if self.mode == "controller":
            lines += [
                "enableControllerInNamesrv=true",
                "controllerDLegerGroup=bench",
                f"controllerDLegerPeers=n0-{LOOPBACK}:{ctl_port}",
                "controllerDLegerSelfId=n0",
                f"controllerStorePath={self.workdir / 'controller'}",
            ]
        ns_conf.write_text("\n".join(lines) + "\n")
        ns = self._start(
            "namesrv",
            "org.apache.rocketmq.namesrv.NamesrvStartup",
            "rocketmq-namesrv",
            "-c",
            str(ns_conf),
        )
        await wait_port(ns_port, ns, 120)
        if self.mode == "controller":
            await wait_port(ctl_port, ns, 120)
        bases = port_blocks(2 * len(self.groups), 2)
        starts = []
        for gi, group in enumerate(self.groups):
            for bid in (0, 1):
                base = bases[2 * gi + bid]
                name = f"{group}-{bid}"
                store = self.workdir / name / "store"
                conf = self.workdir / f"{name}.conf"
                common = [
                    f"brokerClusterName={self.cluster_name}",
                    f"brokerName={group}",
                    f"namesrvAddr={self.namesrv}",
                    # brokerIP2: the HA address a master gives its slaves (default: the
                    # machine's first non-loopback address)
                    f"brokerIP1={LOOPBACK}",
                    f"brokerIP2={LOOPBACK}",
                    f"listenPort={base}",
                    f"storePathRootDir={store}",
                    f"storePathCommitLog={store / 'commitlog'}",
                    "flushDiskType=ASYNC_FLUSH",
                    # 64 MiB commit-log files instead of 1 GiB
                    "mappedFileSizeCommitLog=67108864",
                    "autoCreateTopicEnable=false",
                    "autoCreateSubscriptionGroup=true",
                ]
                if self.mode == "controller":
                    role = [
                        "brokerId=-1",
                        "brokerRole=SLAVE",
                        "enableControllerMode=true",
                        f"controllerAddr={LOOPBACK}:{ctl_port}",
                        "allAckInSyncStateSet=true",
                    ]
                else:
                    role = [
                        f"brokerId={bid}",
                        "brokerRole=" + ("SYNC_MASTER" if bid == 0 else "SLAVE"),
                        "enableSlaveActingMaster=true",
                        # the liveness settings of ha-controller's benchmark deployment
                        # (ha_controller.testing.FAST_ENV): heartbeat every 300 ms, a
                        # master not heard of for 2 s expires (RocketMQ: 1 s and 10 s)
                        f"brokerHeartbeatInterval={FAST_ENV['HAC_BROKER_HEARTBEAT_INTERVAL_MS']}",
                        "brokerNotActiveTimeoutMillis="
                        + FAST_ENV["HAC_BROKER_NOT_ACTIVE_TIMEOUT_MS"],
                        "totalReplicas=2",
                        "inSyncReplicas=2",
                    ]
                conf.write_text("\n".join(common + role) + "\n")
                self.broker_ports[name] = base
                starts.append(
                    self._start(
                        name,
                        "org.apache.rocketmq.broker.BrokerStartup",
                        "rocketmq-broker",
                        "-c",
                        str(conf),
                    )
                )
        for name, proc in zip(self.broker_ports, starts, strict=True):
            await wait_port(self.broker_ports[name], proc, 120)
        proxy_conf = self.workdir / "rmq-proxy.json"
        proxy_conf.write_text(
            json.dumps(
                {
                    "rocketMQClusterName": self.cluster_name,
                    "namesrvAddr": self.namesrv,
                    "grpcServerPort": proxy_grpc,
                    "remotingListenPort": proxy_remoting,
                    "proxyMode": "cluster",
                    "localServeAddr": LOOPBACK,
                }
            )
        )
        self.grpc_port = proxy_grpc
        proxy = self._start(
            "proxy",
            "org.apache.rocketmq.proxy.ProxyStartup",
            "rocketmq-proxy",
            "-pc",
            str(proxy_conf),
            "-pm",
            "cluster",
        )
        await self._await_groups(120)
        await wait_port(proxy_grpc, proxy, 120)

    async def cluster_info(self) -> dict[str, dict[int, str]]:
        """group -> {broker id -> address}, as the nameserver has it."""
        code, remark, body = await remoting_call(self.namesrv, GET_BROKER_CLUSTER_INFO)
        if code != 0:
            raise RuntimeError(f"GET_BROKER_CLUSTER_INFO: {code} {remark}")
        table = _fastjson(body).get("brokerAddrTable", {})
        return {
            g: {int(k): v for k, v in d.get("brokerAddrs", {}).items()} for g, d in table.items()
        }

    async def _await_groups(self, timeout: float) -> None:
        """Every group with its master (id 0) and its slave registered."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            for proc in self.procs.values():
                if not proc.alive():
                    raise Unavailable(f"{proc.name} exited:\n{proc.tail()}")
            with contextlib.suppress(OSError, RuntimeError, TimeoutError, ValueError):
                last = await self.cluster_info()
                if all(len(last.get(g, {})) == 2 and 0 in last[g] for g in self.groups):
                    return
            await asyncio.sleep(0.5)
        raise Unavailable(f"RocketMQ groups not registered within {timeout} s: {last}")

    async def create_topic(self, topic: str, queues: int = 4, message_type: str = "") -> None:
        """UPDATE_AND_CREATE_TOPIC on every group's master (``message_type``: RocketMQ
        5's topic attribute, e.g. FIFO; empty: NORMAL)."""
        ext = {
            "topic": topic,
            "defaultTopic": "TBW102",
            "readQueueNums": str(queues),
            "writeQueueNums": str(queues),
            "perm": "6",
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": "0",
            "order": "false",
        }
        if message_type:
            ext["attributes"] = f"+message.type={message_type}"
        info = await self.cluster_info()
        for group in self.groups:
            addr = info.get(group, {}).get(0)
            if addr is None:
                raise RuntimeError(f"{group} has no master")
            code, remark, _ = await remoting_call(addr, UPDATE_AND_CREATE_TOPIC, ext)
            if code != 0:
                raise RuntimeError(f"create topic {topic} on {group}: {code} {remark}")
        # until the nameserver routes it to every group (the brokers register it)
        deadline = time.monotonic() + 30
        while True:
            ask = {"topic": topic}
            code, _, body = await remoting_call(self.namesrv, GET_ROUTEINFO_BY_TOPIC, ask)
            if code == 0 and len(_fastjson(body).get("queueDatas", [])) == len(self.groups):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {topic} not routed to every group within 30 s")
            await asyncio.sleep(0.1)

    async def master_of(self, group: str) -> int:
        """The index (in ``broker_ports``) of ``group``'s master now (controller mode
        moves it)."""
        addr = (await self.cluster_info())[group][0]
        port = int(addr.rsplit(":", 1)[1])
        return list(self.broker_ports.values()).index(port)

    def _broker(self, index: int) -> Proc:
        return self.procs[list(self.broker_ports)[index]]

    def kill(self, index: int) -> str:
        proc = self._broker(index)
        proc.kill9()
        return f"{proc.name} (master, pid {proc.pid})"

    def pause(self, index: int) -> str:
        proc = self._broker(index)
        proc.pause()
        return f"{proc.name} (master, pid {proc.pid}, SIGSTOP)"

    def resume(self, index: int) -> None:
        self._broker(index).resume()

    def peak_rss(self) -> dict[str, dict[str, int]]:
        return peak_rss_of({n: p.pid for n, p in self.procs.items() if p.alive()}, sessions=True)

    async def aclose(self) -> None:
        for name in ["proxy", *self.broker_ports, "namesrv"]:
            proc = self.procs.get(name)
            if proc is not None:
                await asyncio.to_thread(proc.stop, 5)


# ---- Kafka -------------------------------------------------------------------------------------


@dataclass
class KafkaCluster:
    """Three Kafka 4 KRaft nodes (broker + controller each)."""

    workdir: Path
    size: int = 3
    procs: list[Proc] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    version: str = f"Apache Kafka {KAFKA_VERSION} (KRaft)"

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{LOOPBACK}:{p}" for p in self.ports)

    def bootstrap_from(self, prefer: int) -> str:
        order = [self.ports[(prefer + i) % self.size] for i in range(self.size)]
        return ",".join(f"{LOOPBACK}:{p}" for p in order)

    async def start(self) -> None:
        self.home = await asyncio.to_thread(fetch, "kafka")
        self.workdir.mkdir(parents=True, exist_ok=True)
        ports = free_ports(2 * self.size)
        self.ports = ports[: self.size]
        ctl = ports[self.size :]
        voters = ",".join(f"{i + 1}@{LOOPBACK}:{ctl[i]}" for i in range(self.size))
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        for i in range(self.size):
            ndir = self.workdir / f"kafka{i + 1}"
            ndir.mkdir(exist_ok=True)
            conf = ndir / "server.properties"
            conf.write_text(
                "\n".join(
                    [
                        "process.roles=broker,controller",
                        f"node.id={i + 1}",
                        f"controller.quorum.voters={voters}",
                        f"listeners=PLAINTEXT://{LOOPBACK}:{self.ports[i]},"
                        f"CONTROLLER://{LOOPBACK}:{ctl[i]}",
                        f"advertised.listeners=PLAINTEXT://{LOOPBACK}:{self.ports[i]}",
                        "controller.listener.names=CONTROLLER",
                        "inter.broker.listener.name=PLAINTEXT",
                        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                        f"log.dirs={ndir / 'data'}",
                        "num.partitions=4",
                        "default.replication.factor=3",
                        "min.insync.replicas=2",
                        "offsets.topic.replication.factor=3",
                        "offsets.topic.num.partitions=4",
                        "transaction.state.log.replication.factor=3",
                        "transaction.state.log.min.isr=2",
                        "group.initial.rebalance.delay.ms=0",
                        "auto.create.topics.enable=false",
                        "log.segment.bytes=67108864",
                    ]
                )
                + "\n"
            )
            fmt = await asyncio.to_thread(
                subprocess.run,
                jvm_argv(
                    self.home,
                    256,
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(conf),
                    props={},
                ),
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
                check=False,
            )
            if fmt.returncode != 0:
                raise Unavailable(f"kafka storage format: {fmt.stdout[-500:]}{fmt.stderr[-500:]}")
            argv = jvm_argv(
                self.home,
                HEAP_MB["kafka"],
                "kafka.Kafka",
                str(conf),
                props={"kafka.logs.dir": str(ndir / "logs")},
            )
            self.procs.append(Proc(f"kafka{i + 1}", argv, env, ndir / "server.log").start())
        for port, proc in zip(self.ports, self.procs, strict=True):
            await wait_port(port, proc, 120)
        await self._await_brokers(120)

    async def _await_brokers(self, timeout: float) -> None:
        from aiokafka.admin import AIOKafkaAdminClient

        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=3000)
            try:
                await admin.start()
                info = await admin.describe_cluster()
                if len(info.get("brokers", [])) == self.size:
                    return
                last = str(info)
            except Exception as exc:  # not up yet
                last = repr(exc)
            finally:
                with contextlib.suppress(Exception):
                    await admin.close()
            await asyncio.sleep(0.5)
        raise Unavailable(f"Kafka brokers not all registered within {timeout} s: {last}")

    def peak_rss(self) -> dict[str, dict[str, int]]:
        return peak_rss_of({p.name: p.pid for p in self.procs if p.alive()}, sessions=True)

    async def aclose(self) -> None:
        for proc in self.procs:
            await asyncio.to_thread(proc.stop, 5)


def main(argv: list[str]) -> int:
    if argv[:1] == ["pin"]:
        pin()
        print(f"wrote {PINS}")
        return 0
    if argv[:1] == ["fetch"]:
        for name in argv[1:] or list(PEERS):
            try:
                print(f"{name}: {fetch(name)}")
            except Unavailable as exc:
                print(f"{name}: UNAVAILABLE — {exc}")
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
