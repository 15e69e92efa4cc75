"""Helpers that start real ha-controller processes for tests, drills and demos.

Everything is started through the same CLI a user runs (``python -m
ha_controller.cli ...``), on port 0, and waited for through its ready file —
never by sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import ssl

    from pyspark.sql import SparkSession

    from ha_controller.client.message import MessageQueue, ReceivedMessage
    from ha_controller.client.pull_consumer import PullConsumer
    from ha_controller.rpc import Dispatcher, RpcLimits, RpcServer

T = TypeVar("T")
H = TypeVar("H", bound="ProcessHandle")


@contextlib.asynccontextmanager
async def serving(
    dispatcher: Dispatcher, *, limits: RpcLimits | None = None, name: str = "test"
) -> AsyncIterator[RpcServer]:
    """An in-process ``RpcServer`` of ``dispatcher`` on a loopback port (``server.bound``),
    closed on exit."""
    from ha_controller.rpc import RpcServer

    server = RpcServer(dispatcher, limits=limits, name=name)
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.aclose(grace_s=0.5)


class EventuallyTimeout(AssertionError):
    """The predicate never held within the deadline."""


def eventually_sync(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02) -> T:
    """Poll ``predicate`` until it returns a truthy value; return that value."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except AssertionError as exc:
            last_exc = exc
        if time.monotonic() > deadline:
            raise EventuallyTimeout(f"condition not met within {timeout} s") from last_exc
        time.sleep(interval)


async def eventually(
    predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02
) -> Any:
    """Async poll: ``predicate`` may be sync or async; exceptions that are
    AssertionError or ha-controller errors count as "not yet"."""
    from ha_controller.protocol.errors import HaError

    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if asyncio.iscoroutine(value) or isinstance(value, Awaitable):
                value = await value
            if value:
                return value
        except (AssertionError, HaError, ConnectionError) as exc:
            last_exc = exc
        if time.monotonic() > deadline:
            raise EventuallyTimeout(f"condition not met within {timeout} s") from last_exc
        await asyncio.sleep(interval)


@dataclass
class ProcessHandle:
    """A started service process and what its ready file said."""

    name: str
    argv: list[str]
    env: dict[str, str]
    workdir: Path
    ready_file: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    ready: dict[str, Any] = field(default_factory=dict)

    @property
    def rpc(self) -> str:
        return str(self.ready["rpc"])

    @property
    def http(self) -> str:
        return str(self.ready["http"])

    @property
    def ha(self) -> str:
        return str(self.ready["ha"])

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 20.0) -> ProcessHandle:
        """Start the process and wait for its ready file."""
        return self.spawn().wait_ready(timeout)

    def spawn(self) -> ProcessHandle:
        """Start the process without waiting (:func:`start_all` starts several at once)."""
        self.ready_file.unlink(missing_ok=True)
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir
            )
        finally:
            log.close()
        return self

    def wait_ready(self, timeout: float = 20.0) -> ProcessHandle:
        """Wait for the ready file of the process :meth:`spawn` started."""
        assert self.proc is not None, f"{self.name} was not started"
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} before it was ready:\n"
                    + self.log_tail()
                )
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{self.name} not ready within {timeout} s:\n" + self.log_tail())
            time.sleep(0.01)
        self.ready = json.loads(self.ready_file.read_text())
        return self

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """kill -9 and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, then SIGKILL."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def _base_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAC_")}
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


def hactl_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "ha_controller.cli", *args]


def make_workdir(prefix: str = "hac-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


def _hactl_handle(
    handle_type: type[H],
    name: str,
    workdir: Path,
    env: Mapping[str, str] | None,
    args: Sequence[str],
    extra_args: Sequence[str] = (),
) -> H:
    """A (not yet started) handle of ``hactl <args> --ready-file <name>.ready.json
    <extra_args>`` that runs in ``workdir`` and logs to ``<name>.log`` there."""
    ready = workdir / f"{name}.ready.json"
    return handle_type(
        name=name,
        argv=hactl_argv(*args, "--ready-file", str(ready), *extra_args),
        env=_base_env(env),
        workdir=workdir,
        ready_file=ready,
        log_path=workdir / f"{name}.log",
    )


def start_all(handles: Sequence[ProcessHandle], timeout: float = 20.0) -> None:
    """Start every process of ``handles`` at once and wait until each is ready (each
    within ``timeout`` of the start); on a failure the started ones are killed."""
    try:
        for handle in handles:
            handle.spawn()
        for handle in handles:
            handle.wait_ready(timeout)
    except BaseException:
        for handle in handles:
            if handle.proc is not None and handle.proc.poll() is None:
                handle.kill()
        raise


def run_nameserver(
    workdir: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    name: str = "nameserver",
    listen: str = "127.0.0.1:0",
    http: str = "127.0.0.1:0",
) -> ProcessHandle:
    """Start ``hactl nameserver`` on port 0 and wait for its ready file."""
    workdir = workdir or make_workdir()
    workdir.mkdir(parents=True, exist_ok=True)
    args = ("nameserver", "--listen", listen, "--http", http)
    return _hactl_handle(ProcessHandle, name, workdir, env, args, extra_args).start()


@contextlib.contextmanager
def nameserver_process(**kwargs: Any) -> Any:
    handle = run_nameserver(**kwargs)
    try:
        yield handle
    finally:
        handle.stop()


def run_broker(
    namesrv: str,
    broker_name: str,
    broker_id: int,
    workdir: Path,
    *,
    cluster: str = "DefaultCluster",
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    start: bool = True,
) -> ProcessHandle:
    """Start ``hactl broker`` on port 0 (RPC, HA, HTTP); its store lives in ``workdir``."""
    name = f"{broker_name}-{broker_id}"
    workdir.mkdir(parents=True, exist_ok=True)
    args = (
        "broker",
        "--cluster",
        cluster,
        "--broker-name",
        broker_name,
        "--broker-id",
        str(broker_id),
        "--namesrv",
        namesrv,
        "--listen",
        "127.0.0.1:0",
        "--ha-listen",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--store-dir",
        str(workdir / "store" / name),
    )
    handle = _hactl_handle(ProcessHandle, name, workdir, env, args, extra_args)
    return handle.start() if start else handle


def run_proxy(
    namesrv: str,
    workdir: Path,
    *,
    name: str = "proxy",
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> ProcessHandle:
    """Start ``hactl proxy`` (the RocketMQ 5 gRPC gateway) on port 0 in front of the
    nameserver ``namesrv`` and wait for its ready file; its ``rpc`` is the endpoint the
    official SDKs dial."""
    workdir.mkdir(parents=True, exist_ok=True)
    args = ("proxy", "--namesrv", namesrv, "--listen", "127.0.0.1:0")
    return _hactl_handle(ProcessHandle, name, workdir, env, args, extra_args).start()


@dataclass
class ContainerHandle(ProcessHandle):
    """A broker container process; its ready file lists every hosted broker."""

    def member(self, broker_name: str, broker_id: int) -> dict[str, Any]:
        """``{"name", "id", "rpc", "http", "ha"}`` of one hosted broker."""
        for entry in self.ready.get("brokers", []):
            if entry["name"] == broker_name and int(entry["id"]) == broker_id:
                return dict(entry)
        raise KeyError(f"{broker_name}/{broker_id} is not in container {self.name}")

    def rpc_of(self, broker_name: str, broker_id: int) -> str:
        return str(self.member(broker_name, broker_id)["rpc"])


def run_container(
    namesrv: str,
    brokers: Sequence[tuple[str, int]],
    workdir: Path,
    *,
    cluster: str = "DefaultCluster",
    name: str = "container",
    env: Mapping[str, str] | None = None,
    shared: Mapping[str, object] | None = None,
    per_broker: Mapping[tuple[str, int], Mapping[str, object]] | None = None,
    start: bool = True,
) -> ContainerHandle:
    """Start ``hactl broker --config <container.toml>`` hosting ``brokers`` (group
    name, id) in one process, every listener on port 0; stores live in ``workdir``.

    ``shared`` keys go to the top of the file (every broker), ``per_broker`` ones
    into that broker's ``[[brokers]]`` table.
    """
    from ha_controller.config import dumps_toml

    workdir.mkdir(parents=True, exist_ok=True)
    tables = [
        {
            "broker_name": broker_name,
            "broker_id": broker_id,
            "listen": "127.0.0.1:0",
            "ha_listen": "127.0.0.1:0",
            "http_listen": "127.0.0.1:0",
            "store_dir": str(workdir / "store" / f"{broker_name}-{broker_id}"),
            **((per_broker or {}).get((broker_name, broker_id), {})),
        }
        for broker_name, broker_id in brokers
    ]
    config = workdir / f"{name}.toml"
    config.write_text(dumps_toml({"cluster": cluster, **(shared or {}), "brokers": tables}))
    args = ("broker", "--config", str(config), "--namesrv", namesrv)
    handle = _hactl_handle(ContainerHandle, name, workdir, env, args)
    if start:
        handle.start()
    return handle


@dataclass(frozen=True)
class TlsFiles:
    """A throwaway CA and the certificates of a TLS test cluster (:func:`make_tls_files`).

    ``cert``/``key`` is the one certificate every service process serves and presents
    as a client (as one Kubernetes TLS Secret would be); ``client_cert``/``client_key``
    is a tool's (hactl, the SDK).  Both are signed by ``ca`` and name the test hosts
    (127.0.0.1, localhost).
    """

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path
    #: services demand client certificates (mutual TLS)
    mutual: bool = True

    def service_env(self) -> dict[str, str]:
        """``HAC_TLS_*`` that turn TLS on in a service process (every listener and every
        outgoing connection)."""
        return {
            "HAC_TLS_ENABLED": "true",
            "HAC_TLS_CERT_FILE": str(self.cert),
            "HAC_TLS_KEY_FILE": str(self.key),
            "HAC_TLS_CA_FILE": str(self.ca),
            "HAC_TLS_REQUIRE_CLIENT_CERT": "true" if self.mutual else "false",
        }

    def client_env(self) -> dict[str, str]:
        """``HAC_TLS_*`` for a tool (hactl) instead of its ``--tls-*`` flags."""
        return {
            "HAC_TLS_CA_FILE": str(self.ca),
            "HAC_TLS_CERT_FILE": str(self.client_cert),
            "HAC_TLS_KEY_FILE": str(self.client_key),
        }

    def hactl_args(self) -> list[str]:
        """hactl's ``--tls-ca``, ``--tls-cert`` and ``--tls-key``."""
        return [
            "--tls-ca",
            str(self.ca),
            "--tls-cert",
            str(self.client_cert),
            "--tls-key",
            str(self.client_key),
        ]

    def client_context(self) -> ssl.SSLContext:
        """What the SDK takes as ``tls=``: verify against ``ca``, present the client
        certificate."""
        from ha_controller.rpc.tls import client_context

        return client_context(str(self.ca), str(self.client_cert), str(self.client_key))


def openssl_missing() -> str | None:
    """Why :func:`make_tls_files` cannot run here, or None."""
    return None if shutil.which("openssl") else "the openssl CLI is not installed"


def make_tls_files(
    directory: Path,
    *,
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    mutual: bool = True,
) -> TlsFiles:
    """Make a CA and two certificates it signs (``node`` for the services, ``client``
    for tools) whose subjectAltNames list ``hosts`` (IP addresses as IP entries), with
    the openssl CLI; P-256 keys, valid for two days."""
    import ipaddress

    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-days", "2", "-keyout", "ca.key", "-out", "ca.pem",
            "-subj", "/CN=hac-test-ca")  # fmt: skip
    sans = []
    for host in hosts:
        try:
            ipaddress.ip_address(host)
            sans.append(f"IP:{host}")
        except ValueError:
            sans.append(f"DNS:{host}")
    for name in ("node", "client"):
        (directory / f"{name}.ext").write_text(f"subjectAltName={','.join(sans)}\n")
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN=hac-{name}")  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
                "-extfile", f"{name}.ext")  # fmt: skip
    return TlsFiles(
        ca=directory / "ca.pem",
        cert=directory / "node.pem",
        key=directory / "node.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        mutual=mutual,
    )


def http_get(
    addr: str, path: str, *, tls: TlsFiles | None = None, timeout: float = 5.0
) -> tuple[int, bytes]:
    """``GET`` an admin HTTP endpoint (blocking): ``https`` with ``tls`` (verifying the
    server against its CA and presenting the client certificate), else ``http``.
    Returns the status and the body, for error statuses too."""
    import urllib.error
    import urllib.request

    scheme = "https" if tls is not None else "http"
    context = tls.client_context() if tls is not None else None
    try:
        with urllib.request.urlopen(  # noqa: S310 - a URL we build from a bound address
            f"{scheme}://{addr}{path}", timeout=timeout, context=context
        ) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()


# Fast failure detection for tests and demos: 2 s heartbeat timeout, 500 ms scan.
FAST_ENV = {
    "HAC_BROKER_NOT_ACTIVE_TIMEOUT_MS": "2000",
    "HAC_BROKER_HEARTBEAT_INTERVAL_MS": "300",
    "HAC_SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS": "500",
    "HAC_SEGMENT_SIZE_BYTES": str(16 * 1024 * 1024),
}


@dataclass
class Cluster:
    """A nameserver and broker groups started as real processes."""

    workdir: Path
    nameserver: ProcessHandle
    brokers: dict[tuple[str, int], ProcessHandle]
    env: dict[str, str]
    broker_env: dict[tuple[str, int], dict[str, str]] = field(default_factory=dict)
    tls: TlsFiles | None = None

    @property
    def namesrv(self) -> str:
        return self.nameserver.rpc

    def broker(self, name: str, broker_id: int) -> ProcessHandle:
        return self.brokers[(name, broker_id)]

    def restart(self, name: str, broker_id: int) -> ProcessHandle:
        old = self.brokers[(name, broker_id)]
        old.kill()
        handle = run_broker(
            self.namesrv,
            name,
            broker_id,
            self.workdir,
            env={**self.env, **self.broker_env.get((name, broker_id), {})},
        )
        self.brokers[(name, broker_id)] = handle
        return handle

    def run_proxy(
        self, *args: str, env: Mapping[str, str] | None = None, name: str = "proxy"
    ) -> ProcessHandle:
        """``hactl proxy`` for this cluster (:func:`run_proxy`), with the cluster's
        environment (secret, ACL, TLS) under ``env`` and an admin HTTP port; ``args``
        are more flags."""
        return run_proxy(
            self.namesrv,
            self.workdir,
            name=name,
            env={**self.env, **(env or {})},
            extra_args=("--http", "127.0.0.1:0", *args),
        )

    def stop(self) -> None:
        for handle in self.brokers.values():
            handle.kill()
        self.nameserver.stop()

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Every group's master online at the nameserver and every one of its slaves
        attached to it, which is what a SYNC send needs.  A process is "started" once it
        serves; on a loaded machine its registration and the slaves' HA links come
        later, and a test that sends at once fails with TopicNotFound or
        InSyncReplicasNotEnough (seen on a fresh clone beside a drill campaign)."""
        from ha_controller.client.admin import NameserverClient

        replicas: dict[str, set[int]] = {}
        for name, broker_id in self.brokers:
            replicas.setdefault(name, set()).add(broker_id)
        tls = self.tls.client_context() if self.tls is not None else None

        def attached(name: str) -> bool:
            status, body = http_get(self.broker(name, 0).http, "/api/v1/status", tls=self.tls)
            if status != 200:
                return False
            st = json.loads(body)
            ids = {s["brokerId"] for s in st["slaves"]}
            if "syncStateSet" in st and len(st["syncStateSet"] or ()) < len(replicas[name]):
                return False  # controller mode: every member in the sync-state set
            return not st["isolated"] and ids >= replicas[name] - {0}

        async with NameserverClient([self.namesrv], tls=tls) as ns:

            async def ready() -> bool:
                online = {g.broker_name for g in await ns.groups() if g.master_online}
                if not set(replicas) <= online:
                    return False
                return all([await asyncio.to_thread(attached, name) for name in replicas])

            await eventually(ready, timeout=timeout)


def run_cluster(
    groups: Sequence[str] = ("broker-a",),
    replicas: int = 3,
    *,
    workdir: Path | None = None,
    env: Mapping[str, str] | None = None,
    broker_env: Mapping[tuple[str, int], Mapping[str, str]] | None = None,
    tls: TlsFiles | None = None,
) -> Cluster:
    """Start a nameserver and, per group, a master and ``replicas - 1`` slaves.

    Slaves start first so that each master's pre-online finds them (a master
    without live slaves goes online at once).  With ``tls`` every process serves and
    dials with TLS (``tls.service_env()``; restarts keep it)."""
    workdir = workdir or make_workdir()
    tls_env = tls.service_env() if tls is not None else {}
    merged = {**FAST_ENV, "HAC_TOTAL_REPLICAS": str(replicas), **tls_env, **(env or {})}
    if replicas < 2:
        merged.setdefault("HAC_IN_SYNC_REPLICAS", "1")
    ns = run_nameserver(workdir, env=merged)
    per_broker = {k: dict(v) for k, v in (broker_env or {}).items()}
    cluster = Cluster(workdir, ns, {}, merged, per_broker, tls)
    try:
        # the slaves of every group at once, then the masters at once: a process start is
        # mostly waiting (imports, binding, the first registration), not CPU
        # the slaves of every group at once, then the masters at once: a start is mostly
        # waiting (imports, binding, the first registration), not CPU
        for ids in (range(1, replicas), (0,)):
            batch = []
            for name in groups:
                for bid in ids:
                    env_b = {**merged, **per_broker.get((name, bid), {})}
                    handle = run_broker(ns.rpc, name, bid, workdir, env=env_b, start=False)
                    cluster.brokers[(name, bid)] = handle
                    batch.append(handle)
            start_all(batch)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def create_typed_topics(
    namesrv: str,
    topics: Mapping[str, str],
    *,
    queues: int = 4,
    orderly_groups: Iterable[str] = (),
) -> list[str]:
    """Create each topic of ``topics`` (name -> message type, as ``hactl topic create
    --message-type``) on every master, and set ``orderly_groups`` orderly (``hactl
    group update G --orderly``), in this process: one hactl subprocess per topic costs
    seconds.  Returns the broker groups the last change reached."""
    from ha_controller.client.admin import NameserverClient
    from ha_controller.protocol.topics import TopicMessageType

    async def create() -> list[str]:
        reached: list[str] = []
        async with NameserverClient([namesrv]) as ns:
            for topic, kind in topics.items():
                reached = await ns.create_topic(
                    topic, queues=queues, message_type=TopicMessageType(kind.upper())
                )
            for group in orderly_groups:
                reached = await ns.update_subscription_group(group, orderly=True)
        return reached

    return asyncio.run(create())


def unlike_rocketmq(outcomes: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """The cases of an SDK scenario answered otherwise than RocketMQ answers them.
    ``outcomes``: case -> ``{"ok", "code", ...}`` as the scenario saw it; ``expected``:
    case -> None (RocketMQ takes it), a v2 code (its proxy refuses it with that code) or
    ``"sdk"`` (the SDK itself refuses it, no code from the server)."""
    wrong = []
    for name, want in expected.items():
        got = outcomes[name]
        if want is None and not got["ok"]:
            wrong.append(f"{name}: refused, RocketMQ takes it: {got}")
        elif want == "sdk" and (got["ok"] or got["code"] is not None):
            wrong.append(f"{name}: the SDK itself should refuse it: {got}")
        elif isinstance(want, int) and (got["ok"] or got["code"] != want):
            wrong.append(f"{name}: want code {want}, got {got}")
    return wrong


def run_scenario(
    argv: Sequence[str], what: str, timeout: float, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Run an SDK scenario in a child (``argv``) and return what it printed as its one
    ``RESULT {json}`` line; a child that printed none fails the test with its output's
    tails.  (The official SDKs keep threads and timers: each scenario runs apart.)"""
    proc = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=None if env is None else dict(env),
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    raise AssertionError(
        f"{what} exited {proc.returncode} without a result:\n"
        + proc.stdout[-3000:]
        + proc.stderr[-3000:]
    )


def scenario_main(scenarios: Mapping[str, Callable[..., Any]]) -> None:
    """The child's side of :func:`run_scenario` for Python scenarios: ``argv`` is the
    scenario's name and its arguments as JSON; prints ``RESULT {json}`` and exits at
    once (the SDK's non-daemon threads must not keep the child alive)."""
    name, args = sys.argv[1], json.loads(sys.argv[2])
    result = scenarios[name](**args)
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)


async def stored_messages(
    pull: PullConsumer, queues: Iterable[MessageQueue], *, max_msgs: int = 64
) -> AsyncIterator[ReceivedMessage]:
    """Every message stored in ``queues``, queue by queue from offset 0, read with pulls
    (of up to ``max_msgs``) the broker does not hold: a queue ends at the first pull that
    finds nothing."""
    from ha_controller.client.pull_consumer import PullStatus

    for mq in queues:
        offset = 0
        while True:
            res = await pull.pull(mq, offset, max_msgs=max_msgs, suspend_timeout_ms=0)
            if res.status is not PullStatus.FOUND:
                break
            for m in res.messages:
                yield m
            offset = res.next_begin_offset


def spark_missing() -> str | None:
    """Why no local Spark session can run here (no pyspark, no JDK), or None."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (pip install -e '.[spark]')"
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        return "pyspark needs a JDK 17/21 (java on PATH or JAVA_HOME)"
    return None


@contextlib.contextmanager
def local_spark(workdir: Path, app_name: str) -> Iterator[SparkSession]:
    """A ``local[2]`` session sized for test histories (2 partitions, serial GC, quick
    JIT, ERROR logs), its scratch space under ``workdir``; stopped on exit."""
    from ha_controller.pipeline.session import build_session

    session = build_session(
        "local[2]",
        app_name=app_name,
        local_dir=workdir / "local",
        config={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
