"""Real ha-controller processes (and an in-process RPC server) for tests, drills and demos:
started through the CLI a user runs, on port 0, waited for through their ready files.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import (
    AsyncIterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ha_controller.rpc import Dispatcher, RpcLimits, RpcServer
    from ha_controller.testing.tls import TlsFiles

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

    def wait_ready(
        self, timeout: float = 20.0, abort: threading.Event | None = None
    ) -> ProcessHandle:
        """Wait for the ready file of the process :meth:`spawn` started (killed, and
        RuntimeError, once ``abort`` is set)."""
        assert self.proc is not None, f"{self.name} was not started"
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            if abort is not None and abort.is_set():
                self.kill()
                raise RuntimeError(f"{self.name}: start aborted")
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


def start_all(
    handles: Sequence[ProcessHandle],
    timeout: float = 20.0,
    abort: threading.Event | None = None,
) -> None:
    """Start every process of ``handles`` at once and wait until each is ready (each
    within ``timeout`` of the start); on a failure, or once ``abort`` is set, the
    started ones are killed."""
    try:
        for handle in handles:
            handle.spawn()
        for handle in handles:
            handle.wait_ready(timeout, abort)
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
