"""Every server says, once at start-up, what its configuration leaves unauthenticated.

Real ``hactl nameserver``, ``hactl broker`` (alone and as a container of two brokers)
and ``hactl proxy`` processes in open mode each write exactly one WARNING line naming
the open parts; a nameserver with every protection on writes none, and one with a
secret and an ACL that admits anonymous requests names only what is still open.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ha_controller.testing import (
    ProcessHandle,
    _base_env,
    hactl_argv,
    make_tls_files,
    openssl_missing,
    run_broker,
    run_container,
    run_nameserver,
)

SINGLE = {"HAC_TOTAL_REPLICAS": "1", "HAC_IN_SYNC_REPLICAS": "1"}


def warnings(handle: ProcessHandle) -> list[str]:
    """The log's "unauthenticated" WARNING lines (the process is ready: it has logged
    them, they come before any listener)."""
    text = handle.log_path.read_text(errors="replace")
    return [x for x in text.splitlines() if " WARNING " in x and "unauthenticated:" in x]


def parts(line: str) -> list[str]:
    body = line.split("unauthenticated: ", 1)[1]
    return [p.split(" (", 1)[0] for p in body.split("; ")]


def test_open_servers_warn_once_each(tmp_path: Path) -> None:
    ns = run_nameserver(tmp_path / "ns")
    ready = tmp_path / "proxy.ready.json"
    gateway = ProcessHandle(
        name="proxy",
        argv=hactl_argv(
            "proxy", "--namesrv", ns.rpc, "--listen", "127.0.0.1:0", "--ready-file", str(ready)
        ),
        env=_base_env(None),
        workdir=tmp_path,
        ready_file=ready,
        log_path=tmp_path / "proxy.log",
    )
    starting = [
        lambda: run_broker(ns.rpc, "open-a", 0, tmp_path / "broker", env=SINGLE),
        lambda: run_container(
            ns.rpc, [("open-b", 0), ("open-c", 0)], tmp_path / "container", env=SINGLE
        ),
        gateway.start,
    ]
    with ThreadPoolExecutor(len(starting)) as pool:  # the three start at once
        futures = [pool.submit(start) for start in starting]
    started = [f.result() for f in futures if f.exception() is None]
    try:
        assert len(started) == len(starting), [f.exception() for f in futures]
        broker, container, _ = started
        every = ["control plane", "data plane", "admin HTTP API", "every connection in clear"]
        for handle, expected, says in (
            (ns, every, "register brokers"),
            (broker, every, "HA-info exchanges"),
            (container, every, "HA-info exchanges"),  # one line for both brokers
            (gateway, [every[0], every[1], every[3]], "any gRPC client"),
        ):
            lines = warnings(handle)
            assert len(lines) == 1, (handle.name, lines)
            assert parts(lines[0]) == expected, lines[0]
            assert says in lines[0], lines[0]
    finally:
        for handle in [*started, ns]:
            handle.stop()


@pytest.mark.skipif(openssl_missing() is not None, reason=str(openssl_missing()))
def test_a_closed_server_says_nothing_and_a_half_closed_one_names_the_rest(
    tmp_path: Path,
) -> None:
    tls = make_tls_files(tmp_path / "tls", hosts=("127.0.0.1",))
    users = tmp_path / "acl.toml"
    users.write_text(
        '[[users]]\naccess_key = "ops"\nsecret_key = "ops-secret-key-1"\nadmin = true\n'
    )
    users.chmod(0o600)
    closed = {
        **tls.service_env(),
        "HAC_CLUSTER_SECRET": "open-mode test secret",
        "HAC_ACL_ENABLED": "true",
        "HAC_ACL_ALLOW_ANONYMOUS": "false",
        "HAC_ACL_FILE": str(users),
        "HAC_ADMIN_TOKEN": "open-mode-test-token",
    }
    half = {k: v for k, v in closed.items() if not k.startswith("HAC_TLS_")}
    half["HAC_ACL_ALLOW_ANONYMOUS"] = "true"
    with ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(run_nameserver, tmp_path / name, env=env)
            for name, env in (("closed", closed), ("half", half))
        ]
    started = [f.result() for f in futures if f.exception() is None]
    try:
        assert len(started) == 2, [f.exception() for f in futures]
        assert warnings(started[0]) == []
        (line,) = warnings(started[1])
        assert parts(line) == ["data plane", "every connection in clear"], line
        assert "acl.allow_anonymous = true" in line
    finally:
        for handle in started:
            handle.stop()
