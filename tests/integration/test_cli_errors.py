"""What goes wrong when starting or pointing ``hactl`` is one line on stderr, never a
traceback: a port in use, a store directory that is a file, a corrupt topic table, an
out-of-range flag, a nameserver nobody listens on."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ha_controller.testing import hactl_argv


def hactl(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        hactl_argv(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )


def one_line_error(out: subprocess.CompletedProcess[str], code: int) -> str:
    """The last stderr line (the service logs before it fail), checked."""
    assert out.returncode == code, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines, "no error on stderr"
    return lines[-1]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port someone listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
def closed_port() -> int:
    """A port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def broker_argv(store: Path, *extra: str) -> list[str]:
    return [
        "broker", "--broker-name", "b", "--broker-id", "0", "--namesrv", "127.0.0.1:1",
        "--listen", "127.0.0.1:0", "--ha-listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
        "--store-dir", str(store), "--log-level", "ERROR", *extra,
    ]  # fmt: skip


def test_nameserver_port_in_use(busy_port: int) -> None:
    out = hactl(
        "nameserver", "--listen", f"127.0.0.1:{busy_port}", "--http", "127.0.0.1:0",
        "--log-level", "ERROR",
    )  # fmt: skip
    assert out.stderr.strip() == (
        f"hactl nameserver: cannot listen on 127.0.0.1:{busy_port} (--listen): address already "
        "in use (another process holds it; choose another port, 0 = any free one)"
    )
    assert out.returncode == 1


def test_broker_port_in_use(busy_port: int, tmp_path: Path) -> None:
    argv = broker_argv(tmp_path / "store")
    argv[argv.index("--ha-listen") + 1] = f"127.0.0.1:{busy_port}"
    line = one_line_error(hactl(*argv), 1)
    assert line.startswith(
        f"hactl broker: cannot listen on 127.0.0.1:{busy_port} (--ha-listen): address already"
    )


@pytest.mark.skipif(importlib.util.find_spec("grpc") is None, reason="grpcio not installed")
def test_proxy_port_in_use(busy_port: int) -> None:
    out = hactl("proxy", "--listen", f"127.0.0.1:{busy_port}", "--namesrv", "127.0.0.1:1")
    line = one_line_error(out, 1)
    assert line.startswith(f"hactl proxy: cannot listen on 127.0.0.1:{busy_port}: ")


def test_store_dir_that_is_a_file(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.write_text("not a directory\n")
    line = one_line_error(hactl(*broker_argv(store)), 2)
    assert line == f"hactl: config error: store_dir: '{store}' is a file, not a directory"
    line = one_line_error(hactl(*broker_argv(store / "inside")), 2)
    assert f"'{store}' is a file, not a directory" in line


def test_corrupt_topic_table(tmp_path: Path) -> None:
    """On a broker without replicas to take it from (with them it waits for one:
    tests/integration/test_corrupt_metadata.py)."""
    store = tmp_path / "store"
    store.mkdir()
    alone = {"HAC_TOTAL_REPLICAS": "1", "HAC_IN_SYNC_REPLICAS": "1"}
    (store / "topics.json").write_text('{"topics": [')
    line = one_line_error(hactl(*broker_argv(store), env=alone), 1)
    assert line.startswith(f"hactl broker: StoreError: corrupt topic table {store}/topics.json")
    (store / "topics.json").write_text('{"topics": [{"perm": 6}], "dataVersion": {}}')
    line = one_line_error(hactl(*broker_argv(store), env=alone), 1)
    assert "missing key 'topicName'" in line


def test_delay_level_out_of_range() -> None:
    line = one_line_error(hactl("produce", "--topic", "T", "--delay-level", "99"), 2)
    assert line.endswith("argument --delay-level: must be 1..18, got 99")


@pytest.mark.parametrize(
    "argv",
    [
        ["groups"],
        ["route", "T"],
        ["topic", "list"],
        ["topic", "create", "T"],
        ["produce", "--topic", "T", "--count", "2"],
        ["consume", "--topic", "T", "--group", "g", "--count", "1", "--timeout", "2"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_unreachable_nameserver(argv: list[str], closed_port: int) -> None:
    out = hactl(*argv, "--namesrv", f"127.0.0.1:{closed_port}")
    [line] = out.stderr.strip().splitlines()
    assert out.returncode == 1
    assert f"cannot reach the nameserver at 127.0.0.1:{closed_port} (connection refused)" in line
    assert "BrokerUnavailable" not in line
