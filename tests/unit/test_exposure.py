"""What a server's configuration leaves unauthenticated (ha_controller/exposure.py): the
parts named for each component and setting, and one line for a whole process."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from ha_controller.config import AclConfig, BrokerConfig, NameserverConfig, ProxyConfig, TlsConfig
from ha_controller.exposure import open_parts, warn_if_open


@pytest.fixture
def closed(tmp_path: Path) -> dict[str, object]:
    """Every part closed: a secret, the ACL without anonymous access, TLS."""
    for name in ("cert.pem", "key.pem", "ca.pem"):
        (tmp_path / name).write_text("not read here")
    users = tmp_path / "acl.toml"
    users.write_text('[[users]]\naccess_key = "a"\nsecret_key = "0123456789abcdef"\nadmin = true\n')
    users.chmod(0o600)
    return {
        "cluster_secret": "s",
        "acl": AclConfig(enabled=True, allow_anonymous=False, file=str(users)),
        "tls": TlsConfig(
            enabled=True,
            cert_file=str(tmp_path / "cert.pem"),
            key_file=str(tmp_path / "key.pem"),
            ca_file=str(tmp_path / "ca.pem"),
        ),
    }


def broker(name: str = "b", /, **fields: Any) -> BrokerConfig:
    return BrokerConfig(
        broker_name=name,
        broker_id=0,
        namesrv_addrs=("127.0.0.1:9876",),
        **fields,
    )


def test_the_defaults_name_every_part_for_each_component() -> None:
    ns = open_parts(NameserverConfig())
    assert [p.split(" (", 1)[0] for p in ns] == [
        "control plane",
        "data plane",
        "admin HTTP API",
        "every connection in clear",
    ]
    assert "register brokers" in ns[0] and "topics" in ns[1]
    b = open_parts(broker())
    assert "HA-info exchanges" in b[0] and "reset any group's offsets" in b[1]
    px = open_parts(ProxyConfig())
    assert [p.split(" (", 1)[0] for p in px] == [
        "control plane",
        "data plane",
        "every connection in clear",
    ]  # the gateway's admin HTTP has no mutating endpoint
    assert "gRPC client" in px[1]


def test_nothing_is_said_when_every_part_is_closed(
    closed: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        assert warn_if_open(NameserverConfig(admin_token="t", **closed)) is None
        assert warn_if_open(broker(admin_token="t", **closed)) is None
        assert warn_if_open(ProxyConfig(**closed)) is None
    assert not caplog.records


def test_anonymous_access_and_each_missing_part_are_named(closed: dict[str, Any]) -> None:
    anonymous = AclConfig(enabled=True, allow_anonymous=True, file=closed["acl"].file)
    parts = open_parts(ProxyConfig(**{**closed, "acl": anonymous}))
    assert parts == [
        "data plane (acl.allow_anonymous = true: unsigned requests are served as if there "
        "were no ACL)"
    ]
    assert open_parts(broker(**{**closed, "tls": TlsConfig()})) == [
        "admin HTTP API (no admin_token: its mutating endpoints take any caller)",
        "every connection in clear (tls.enabled = false)",
    ]


def test_one_warning_line_for_a_process_of_several_brokers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="ha_controller.exposure"):
        line = warn_if_open([broker(), broker("c")])
    assert [r.getMessage() for r in caplog.records] == [line]
    assert line is not None and line.startswith("unauthenticated: control plane")
    assert line.count("control plane") == 1 and line.endswith(". See docs/security.md.")
