"""ha_controller.config: defaults, precedence, error messages, env parsing, round trip."""

from __future__ import annotations

import dataclasses
import logging
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ha_controller.config import (
    MIB,
    AclConfig,
    BrokerConfig,
    NameserverConfig,
    ProxyConfig,
    RpcLimits,
    TlsConfig,
    config_keys,
    env_var_name,
    format_host_port,
    load_broker_config,
    load_broker_configs,
    load_nameserver_config,
    load_proxy_config,
    parse_host_port,
    render_toml,
    to_toml_dict,
)
from ha_controller.protocol.errors import ConfigError, HaError, error_table
from ha_controller.protocol.properties import DEFAULT_DELAY_LEVELS, DELAY_LEVELS_MS

BROKER_FLAGS: dict[str, object] = {
    "broker_name": "broker-a",
    "broker_id": 0,
    "namesrv_addrs": "127.0.0.1:9876",
}


def write(tmp_path: Path, text: str, name: str = "hac.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def broker(**overrides: Any) -> BrokerConfig:
    kwargs: dict[str, Any] = {
        "broker_name": "broker-a",
        "broker_id": 0,
        "namesrv_addrs": ("127.0.0.1:9876",),
    }
    kwargs.update(overrides)
    return BrokerConfig(**kwargs)


def assert_one_clear_error(exc: ConfigError, *needles: str) -> None:
    message = str(exc)
    assert "\n" not in message, message
    assert "Traceback" not in message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    # Raised `from None`: no chained internal exception for the CLI to print.
    assert exc.__cause__ is None
    assert exc.__suppress_context__ or exc.__context__ is None


# --- defaults -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        # RocketMQ NamesrvConfig
        ("scan_not_active_broker_interval_ms", 5000),
        # on here, false in RocketMQ: this product exists for them
        ("support_acting_master", True),
        ("notify_min_broker_id_changed", True),
        ("notify_timeout_ms", 3000),
        ("listen", "0.0.0.0:9876"),
        ("http_listen", "0.0.0.0:9877"),
        ("cluster_secret", None),
        ("log_level", "INFO"),
    ],
)
def test_nameserver_defaults(key: str, expected: object) -> None:
    assert getattr(NameserverConfig(), key) == expected


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        # RocketMQ BrokerConfig / MessageStoreConfig defaults kept
        ("broker_heartbeat_interval_ms", 1000),
        ("broker_not_active_timeout_ms", 10_000),
        ("send_heartbeat_timeout_ms", 1000),
        ("sync_broker_member_group_period_ms", 1000),
        ("register_name_server_period_ms", 30_000),
        ("register_broker_timeout_ms", 24_000),
        ("load_balance_poll_name_server_interval_ms", 30_000),
        ("lock_in_strict_mode", False),
        ("skip_pre_online", False),
        ("consumer_offset_update_version_step", 500),
        ("delay_offset_update_version_step", 200),
        ("lock_max_live_time_ms", 60_000),
        ("pop_revive_interval_ms", 1000),
        ("escape_max_attempts", 10),
        ("escape_send_timeout_ms", 3000),
        ("cluster", "DefaultCluster"),
        # deviations: the RIP-32 switches on (false in RocketMQ), replication favours no loss
        ("enable_slave_acting_master", True),
        ("enable_remote_escape", True),
        ("compatible_with_old_namesrv", False),
        ("replication_mode", "sync"),
        ("in_sync_replicas", 2),
        ("total_replicas", 3),
        ("flush_mode", "async"),
        # the default ports (docs/architecture.md), topics and long polling
        ("listen", "0.0.0.0:10911"),
        ("ha_listen", "0.0.0.0:10912"),
        ("http_listen", "0.0.0.0:10913"),
        ("auto_create_topic", True),
        ("default_topic_queue_nums", 4),
        ("long_polling_enable", True),
        ("long_polling_check_interval_ms", 5000),
        ("short_polling_check_interval_ms", 1000),
        ("segment_size_bytes", 64 * MIB),
    ],
)
def test_broker_defaults(key: str, expected: object) -> None:
    assert getattr(broker(), key) == expected


def test_rpc_limit_and_tls_defaults() -> None:
    assert RpcLimits() == RpcLimits(
        max_frame_bytes=32 * MIB,
        max_list_size=3584,
        max_block_bytes=8192,
        max_inflight_requests=1024,
        default_timeout_ms=3000,
    )
    tls = TlsConfig()
    assert (tls.enabled, tls.cert_file, tls.key_file, tls.ca_file, tls.require_client_cert) == (
        False,
        None,
        None,
        None,
        False,
    )


def test_delay_levels_parsed_like_rocketmq() -> None:
    cfg = broker()
    assert cfg.max_delay_level == 18
    assert cfg.delay_level_ms(1) == 1000
    assert cfg.delay_level_ms(3) == 10_000
    assert cfg.delay_level_ms(5) == 60_000
    assert cfg.delay_level_ms(18) == 7_200_000
    assert cfg.delay_level_ms(99) == 7_200_000  # clamped to the highest, as RocketMQ does
    with pytest.raises(ValueError, match="level"):
        cfg.delay_level_ms(0)
    custom = broker(delay_levels="500ms 2s  1d")
    assert custom.delay_levels_ms == (500, 2000, 86_400_000)


def test_durations_carry_units_in_their_names() -> None:
    timeish = re.compile(r"(interval|timeout|period|time|wait|backoff|millis|mills)")
    for cls in (NameserverConfig, BrokerConfig):
        for key in config_keys(cls):
            leaf = key.rsplit(".", 1)[-1]
            if timeish.search(leaf):
                assert leaf.endswith(("_ms", "_s")), key


def test_config_is_frozen_and_hides_secrets() -> None:
    cfg = broker(cluster_secret="s3cr3t-value", admin_token="tok-value")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.broker_id = 1  # type: ignore[misc]
    assert "s3cr3t-value" not in repr(cfg)
    assert "tok-value" not in repr(cfg)


def test_direct_construction_is_validated_and_normalised() -> None:
    with pytest.raises(ConfigError, match=r"broker_id: must be >= 0, got -1"):
        broker(broker_id=-1)
    cfg = broker(namesrv_addrs=["a:1", " b:2"], log_level="debug")
    assert cfg.namesrv_addrs == ("a:1", "b:2")
    assert cfg.log_level == "DEBUG"
    hash(cfg)  # frozen and hashable after normalisation


def test_config_error_is_a_registered_value_error() -> None:
    assert issubclass(ConfigError, HaError)
    assert issubclass(ConfigError, ValueError)
    assert error_table()[ConfigError.code] is ConfigError


def test_lock_quorum_follows_total_replicas() -> None:
    assert broker().lock_quorum == 2
    assert broker(total_replicas=5, in_sync_replicas=1).lock_quorum == 3


# --- precedence -----------------------------------------------------------------------------


def test_file_then_env_then_flags(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        broker_name = "from-file"
        broker_id = 1
        namesrv_addrs = ["10.0.0.1:9876"]
        listen = "127.0.0.1:1111"
        ha_listen = "127.0.0.1:2222"
        lock_in_strict_mode = true
        [tls]
        ca_file = "/file/ca.pem"
        """,
    )
    env = {
        "HAC_LISTEN": "127.0.0.1:3333",
        "HAC_BROKER_ID": "2",
        "HAC_TLS_CA_FILE": "/env/ca.pem",
        "HAC_OTHER_THING": "ignored",
    }
    flags: dict[str, object] = {
        "broker_id": 3,
        "ha_listen": None,  # not given
        "config": str(path),  # not a config key: ignored
        "ready_file": "/tmp/ready.json",
    }
    cfg = load_broker_config(path, flags, env)
    assert cfg.broker_name == "from-file"  # file only
    assert cfg.lock_in_strict_mode is True  # file only
    assert cfg.ha_listen == "127.0.0.1:2222"  # flag None does not override
    assert cfg.listen == "127.0.0.1:3333"  # env beats file
    assert cfg.tls.ca_file == "/env/ca.pem"  # env beats file, nested
    assert cfg.broker_id == 3  # flag beats env and file


def test_nameserver_file_then_env_then_flags(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "listen = '127.0.0.1:1'\nhttp_listen = '127.0.0.1:2'\nnotify_retries = 7\n"
        "[limits]\nmax_list_size = 10\n",
    )
    env = {
        "HAC_LISTEN": "127.0.0.1:3",
        "HAC_HTTP_LISTEN": "127.0.0.1:4",
        "HAC_LIMITS_MAX_LIST_SIZE": "20",
    }
    cfg = load_nameserver_config(path, {"http": "127.0.0.1:5"}, env)
    assert cfg.notify_retries == 7  # file
    assert cfg.listen == "127.0.0.1:3"  # env over file
    assert cfg.limits.max_list_size == 20  # env over file, nested
    assert cfg.http_listen == "127.0.0.1:5"  # flag over env


def test_flag_aliases_and_string_flags() -> None:
    flags: dict[str, object] = {
        "broker_name": "b",
        "broker_id": "2",  # argparse without type=int
        "namesrv": "h1:9876,h2:9876",  # --namesrv
        "http": "127.0.0.1:0",  # --http
        "lock_in_strict_mode": "true",
        "tls_ca_file": "/x/ca.pem",
    }
    cfg = load_broker_config(None, flags, {})
    assert cfg.broker_id == 2
    assert cfg.namesrv_addrs == ("h1:9876", "h2:9876")
    assert cfg.http_listen == "127.0.0.1:0"
    assert cfg.lock_in_strict_mode is True
    assert cfg.tls.ca_file == "/x/ca.pem"
    ns = load_nameserver_config(None, {"listen": "127.0.0.1:0", "http": "127.0.0.1:0"}, {})
    assert (ns.listen, ns.http_listen) == ("127.0.0.1:0", "127.0.0.1:0")


def test_no_file_uses_defaults() -> None:
    assert load_nameserver_config(None, {}, {}) == NameserverConfig()


# --- env parsing by type --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        ("Yes", True),
        ("false", False),
        ("False", False),
        ("0", False),
        ("no", False),
        ("NO", False),
    ],
)
def test_env_bool(text: str, expected: bool) -> None:
    cfg = load_broker_config(None, BROKER_FLAGS, {"HAC_LOCK_IN_STRICT_MODE": text})
    assert cfg.lock_in_strict_mode is expected


def test_env_every_type() -> None:
    env = {
        "HAC_SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS": "1000",  # int (duration)
        "HAC_NOTIFY_RETRIES": " 0 ",  # int, whitespace tolerated
        "HAC_SUPPORT_ACTING_MASTER": "no",  # bool
        "HAC_LISTEN": "127.0.0.1:0",  # str
        "HAC_CLUSTER_SECRET": "s3cret",  # str | None
        "HAC_ADMIN_TOKEN": "",  # str | None: empty = unset
        "HAC_LOG_LEVEL": "debug",  # Literal, case-insensitive
        "HAC_TLS_REQUIRE_CLIENT_CERT": "false",  # nested bool
        "HAC_LIMITS_MAX_LIST_SIZE": "100",  # nested int
    }
    ns = load_nameserver_config(None, {}, env)
    assert ns.scan_not_active_broker_interval_ms == 1000
    assert ns.notify_retries == 0
    assert ns.support_acting_master is False
    assert ns.listen == "127.0.0.1:0"
    assert ns.cluster_secret == "s3cret"
    assert ns.admin_token is None
    assert ns.log_level == "DEBUG"
    assert ns.tls.require_client_cert is False
    assert ns.limits.max_list_size == 100

    cfg = load_broker_config(
        None,
        {},
        {
            "HAC_BROKER_NAME": "b",
            "HAC_BROKER_ID": "1",
            "HAC_NAMESRV_ADDRS": "h1:1, h2:2,",  # tuple, comma-separated
            "HAC_REPLICATION_MODE": "ASYNC",
        },
    )
    assert cfg.namesrv_addrs == ("h1:1", "h2:2")
    assert cfg.replication_mode == "async"


def _env_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


@pytest.mark.parametrize("cls", [NameserverConfig, BrokerConfig])
def test_every_key_is_settable_from_env(cls: type[NameserverConfig] | type[BrokerConfig]) -> None:
    base = broker() if cls is BrokerConfig else NameserverConfig()
    flat = {}
    for key, value in to_toml_dict(base).items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    env = {
        env_var_name(key): _env_text(tuple(v) if isinstance(v, list) else v)
        for key, v in flat.items()
    }
    unset = set(config_keys(cls)) - set(flat)
    assert unset <= {
        "cluster_secret",
        "admin_token",
        "store_dir",
        "broker_ip1",
        "acl.file",
        "warn_free_disk_ratio",
        "tls.cert_file",
        "tls.key_file",
        "tls.ca_file",
    }
    for key in unset:
        env[env_var_name(key)] = ""  # empty = unset for optional keys
    loader = load_broker_config if cls is BrokerConfig else load_nameserver_config
    assert loader(None, {}, env) == base
    assert "HAC_LOCK_IN_STRICT_MODE" in env or cls is NameserverConfig
    assert "HAC_TLS_CERT_FILE" in env


def test_unknown_hac_env_var_close_to_a_key_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ha_controller.config"):
        cfg = load_broker_config(None, BROKER_FLAGS, {"HAC_LOCK_IN_STRICT_MOD": "true"})
    assert cfg.lock_in_strict_mode is False
    assert "HAC_LOCK_IN_STRICT_MODE" in caplog.text


# --- error paths: one ConfigError naming the key, its source and what was expected ----------

BROKER_HEAD = 'broker_name = "b"\nbroker_id = 1\nnamesrv_addrs = ["h:9876"]\n'

FILE_ERRORS = [
    # unknown keys, with and without a suggestion
    ("lock_in_strict_mod = true", ["'lock_in_strict_mod'", "did you mean 'lock_in_strict_mode'"]),
    ("[tls]\ncert = 'x'", ["'tls.cert'", "did you mean 'tls.cert_file'"]),
    ("tls_cert_file = 'x'", ["'tls_cert_file'", "did you mean 'tls.cert_file'"]),
    ("zzzzzz = 1", ["unknown key 'zzzzzz'"]),
    # wrong types
    ("default_topic_queue_nums = 'four'", ["default_topic_queue_nums", "an integer", "'four'"]),
    ("lock_in_strict_mode = 'yes'", ["lock_in_strict_mode", "true or false", "'yes'"]),
    ("namesrv_addrs = 9876", ["namesrv_addrs", "list of strings", "9876"]),
    ("replication_mode = 'quorum'", ["replication_mode", "'sync', 'async'", "'quorum'"]),
    ("tls = 'on'", ["tls", "expected a [tls] table"]),
    ("cluster = 'bad name!'", ["cluster", "letters, digits"]),
    # bad durations and sizes
    ("broker_heartbeat_interval_ms = 1.5", ["broker_heartbeat_interval_ms", "milliseconds", "1.5"]),
    ("broker_heartbeat_interval_ms = '1s'", ["broker_heartbeat_interval_ms", "milliseconds"]),
    ("broker_heartbeat_interval_ms = 0", ["broker_heartbeat_interval_ms", ">= 1 ms"]),
    ("pop_revive_interval_ms = -5", ["pop_revive_interval_ms", ">= 1 ms", "-5 ms"]),
    ("register_name_server_period_ms = 5000", ["register_name_server_period_ms", ">= 10000 ms"]),
    ("register_name_server_period_ms = 90000", ["register_name_server_period_ms", "<= 60000 ms"]),
    ("lock_max_live_time_ms = 20000", ["lock_max_live_time_ms", ">= 30000 ms"]),
    ("segment_size_bytes = 100", ["segment_size_bytes", ">= 65536 bytes"]),
    ("delay_levels = '1s 5x'", ["delay_levels", "'5x'"]),
    ("delay_levels = ''", ["delay_levels", "at least one"]),
    # cross-field rules
    (
        "broker_heartbeat_interval_ms = 10000",
        ["broker_heartbeat_interval_ms", "broker_not_active_timeout_ms (default)", "less than"],
    ),
    ("in_sync_replicas = 3\ntotal_replicas = 2", ["in_sync_replicas", "total_replicas"]),
    ("total_replicas = 1", ["in_sync_replicas (default)", "total_replicas"]),
    ("escape_backoff_initial_ms = 20000", ["escape_backoff_initial_ms", "escape_backoff_max_ms"]),
    ("segment_size_bytes = 1048576", ["max_message_bytes (default)", "segment_size_bytes"]),
    ("[limits]\nmax_frame_bytes = 1048576", ["max_message_bytes", "limits.max_frame_bytes"]),
    ("[limits]\nmax_block_bytes = 99999999", ["limits.max_block_bytes", "limits.max_frame_bytes"]),
    ("listen = '0.0.0.0:7000'\nha_listen = '127.0.0.1:7000'", ["listen", "ha_listen", "7000"]),
    # host:port
    ("listen = 'localhost'", ["listen", "host:port"]),
    ("listen = 'localhost:70000'", ["listen", "0..65535"]),
    ("listen = '::1:80'", ["listen", "brackets"]),
    ("listen = 'bad host:80'", ["listen", "host name"]),
    ("http_listen = ':80'", ["http_listen", "host:port"]),
    ("broker_ip1 = '1.2.3.4:5'", ["broker_ip1"]),
    ("namesrv_addrs = ['h:0']", ["namesrv_addrs", "port 0"]),
    ("namesrv_addrs = []", ["namesrv_addrs", "at least one"]),
    # TLS half-configured
    ("[tls]\ncert_file = '/c.pem'", ["tls.cert_file", "tls.key_file (default)", "key_file"]),
    ("[tls]\nkey_file = '/k.pem'", ["tls.key_file", "cert_file"]),
    ("[tls]\nenabled = true", ["tls.enabled", "cert_file"]),
    ("[tls]\nrequire_client_cert = true", ["tls.require_client_cert", "ca_file"]),
    (
        "[tls]\nenabled = true\ncert_file = '/nope/c.pem'\nkey_file = '/nope/k.pem'",
        ["tls.cert_file", "no such file"],
    ),
    # secrets
    ("cluster_secret = ''", ["cluster_secret", "must not be empty"]),
]


@pytest.mark.parametrize(("body", "needles"), FILE_ERRORS)
def test_file_errors_name_key_and_file(tmp_path: Path, body: str, needles: list[str]) -> None:
    # Keep the required keys the body does not set itself (TOML forbids duplicates).
    head = [line for line in BROKER_HEAD.splitlines() if line.split(" ")[0] not in body]
    path = write(tmp_path, "\n".join([*head, body, ""]))
    with pytest.raises(ConfigError) as info:
        load_broker_config(path, {}, {})
    assert_one_clear_error(info.value, str(path), *needles)


@pytest.mark.parametrize(
    ("env", "needles"),
    [
        ({"HAC_LOCK_IN_STRICT_MODE": "maybe"}, ["lock_in_strict_mode", "true/false", "'maybe'"]),
        ({"HAC_BROKER_ID": "one"}, ["broker_id", "an integer", "'one'"]),
        ({"HAC_BROKER_ID": "-1"}, ["broker_id", ">= 0"]),
        (
            {"HAC_SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS": "5s"},
            ["scan_not_active_broker_interval_ms", "milliseconds", "'5s'"],
        ),
        ({"HAC_TLS_KEY_FILE": "/k.pem"}, ["tls.key_file (env HAC_TLS_KEY_FILE)", "cert_file"]),
        ({"HAC_LISTEN": "nohost"}, ["listen", "host:port"]),
        ({"HAC_FLUSH_MODE": "never"}, ["flush_mode", "'async', 'sync'"]),
    ],
)
def test_env_errors_name_variable(env: dict[str, str], needles: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        if "SCAN" in next(iter(env)):
            load_nameserver_config(None, {}, env)
        else:
            # Required keys from env too: a flag would beat the env value under test.
            base = {"HAC_BROKER_NAME": "b", "HAC_BROKER_ID": "1", "HAC_NAMESRV_ADDRS": "h:1"}
            load_broker_config(None, {}, {**base, **env})
    assert_one_clear_error(info.value, f"env {next(iter(env))}", *needles)


def test_flag_errors_name_flag() -> None:
    with pytest.raises(ConfigError) as info:
        load_broker_config(None, {**BROKER_FLAGS, "broker_id": -2}, {})
    assert_one_clear_error(info.value, "broker_id (flag --broker-id)", ">= 0", "-2")
    with pytest.raises(ConfigError) as info:
        load_broker_config(None, {"broker_name": "b", "broker_id": 0, "namesrv": "nope"}, {})
    assert_one_clear_error(info.value, "namesrv_addrs (flag --namesrv)", "host:port")


def test_cross_field_error_names_each_source(tmp_path: Path) -> None:
    path = write(tmp_path, BROKER_HEAD + "broker_not_active_timeout_ms = 3000\n")
    with pytest.raises(ConfigError) as info:
        load_broker_config(path, {}, {"HAC_BROKER_HEARTBEAT_INTERVAL_MS": "5000"})
    assert_one_clear_error(
        info.value,
        "broker_heartbeat_interval_ms (env HAC_BROKER_HEARTBEAT_INTERVAL_MS)",
        f"broker_not_active_timeout_ms (file {path})",
        "5000 ms",
        "3000 ms",
    )


def test_missing_required_key() -> None:
    with pytest.raises(ConfigError) as info:
        load_broker_config(None, {"broker_name": "b", "broker_id": 0}, {})
    assert_one_clear_error(info.value, "namesrv_addrs", "required", "HAC_NAMESRV_ADDRS")


def test_secret_value_is_not_echoed(tmp_path: Path) -> None:
    path = write(tmp_path, BROKER_HEAD + "admin_token = 12345678\n")
    with pytest.raises(ConfigError) as info:
        load_broker_config(path, {}, {})
    assert_one_clear_error(info.value, "admin_token", "a string")
    assert "12345678" not in str(info.value)


def test_bad_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_nameserver_config(tmp_path / "missing.toml", {}, {})
    assert_one_clear_error(info.value, "missing.toml", "does not exist")
    path = write(tmp_path, "listen = \n")
    with pytest.raises(ConfigError) as info:
        load_nameserver_config(path, {}, {})
    assert_one_clear_error(info.value, str(path), "not valid TOML")


def test_nameserver_unknown_key_and_clash(tmp_path: Path) -> None:
    path = write(tmp_path, "suport_acting_master = false\n")
    with pytest.raises(ConfigError) as info:
        load_nameserver_config(path, {}, {})
    assert_one_clear_error(info.value, "did you mean 'support_acting_master'")
    with pytest.raises(ConfigError) as info:
        load_nameserver_config(None, {"http": "0.0.0.0:9876"}, {})
    assert_one_clear_error(info.value, "listen (default)", "http_listen (flag --http)", "9876")


def test_port_zero_listeners_never_clash() -> None:
    cfg = broker(listen="127.0.0.1:0", ha_listen="127.0.0.1:0", http_listen="127.0.0.1:0")
    assert parse_host_port(cfg.ha_listen) == ("127.0.0.1", 0)


# --- host:port ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9876", ("127.0.0.1", 9876)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("broker-a.ns.svc.cluster.local:10911", ("broker-a.ns.svc.cluster.local", 10911)),
        ("[::1]:65535", ("::1", 65535)),
        (" localhost:1 ", ("localhost", 1)),
    ],
)
def test_parse_host_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(text) == expected
    assert parse_host_port(format_host_port(*expected)) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "9876",
        "host:",
        ":9876",
        "host:65536",
        "host:-1",
        "host:9x",
        "::1:80",
        "[::1]80",
        "[h]:1",
    ],
)
def test_parse_host_port_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="host:port"):
        parse_host_port(text)


# --- render -> load round trip --------------------------------------------------------------


def test_round_trip_defaults(tmp_path: Path) -> None:
    ns = NameserverConfig()
    assert load_nameserver_config(write(tmp_path, render_toml(ns)), {}, {}) == ns
    b = broker()
    assert load_broker_config(write(tmp_path, render_toml(b), "b.toml"), {}, {}) == b


def test_round_trip_non_defaults(tmp_path: Path) -> None:
    for name in ("c.pem", "k.pem", "ca.pem"):
        (tmp_path / name).write_text("x")
    tls = TlsConfig(
        enabled=True,
        cert_file=str(tmp_path / "c.pem"),
        key_file=str(tmp_path / "k.pem"),
        ca_file=str(tmp_path / "ca.pem"),
        require_client_cert=True,
    )
    cfg = broker(
        cluster="c1",
        broker_id=2,
        namesrv_addrs=("10.0.0.1:9876", "[::1]:9876"),
        listen="127.0.0.1:0",
        store_dir=str(tmp_path / "store"),
        broker_ip1="10.1.1.1",
        lock_in_strict_mode=True,
        compatible_with_old_namesrv=True,
        replication_mode="async",
        flush_mode="sync",
        total_replicas=5,
        in_sync_replicas=3,
        cluster_secret='quote " back\\slash \t tab \x01 ctl \u00e9 \x7f',
        admin_token="t",
        delay_levels="1s 2s",
        tls=tls,
        limits=RpcLimits(max_list_size=10, default_timeout_ms=50),
        log_level="DEBUG",
    )
    text = render_toml(cfg)
    assert tomllib.loads(text) == to_toml_dict(cfg)
    loaded = load_broker_config(write(tmp_path, text), {}, {})
    assert loaded == cfg
    assert loaded.cluster_secret == cfg.cluster_secret
    assert loaded.delay_levels_ms == (1000, 2000)


@settings(max_examples=60, deadline=None)
@given(
    secret=st.text(min_size=1, max_size=40),
    name=st.from_regex(r"[A-Za-z0-9_.\-]{1,20}", fullmatch=True),
    broker_id=st.integers(min_value=0, max_value=2**40),
    strict=st.booleans(),
    heartbeat=st.integers(min_value=1, max_value=9_999),
)
def test_round_trip_property(
    secret: str, name: str, broker_id: int, strict: bool, heartbeat: int
) -> None:
    cfg = broker(
        broker_name=name,
        broker_id=broker_id,
        cluster_secret=secret,
        lock_in_strict_mode=strict,
        broker_heartbeat_interval_ms=heartbeat,
    )
    doc = tomllib.loads(render_toml(cfg))
    assert doc == to_toml_dict(cfg)
    assert BrokerConfig(**_from_doc(doc)) == cfg


def _from_doc(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = dict(doc)
    out["tls"] = TlsConfig(**doc["tls"])
    out["acl"] = AclConfig(**doc["acl"])
    out["limits"] = RpcLimits(**doc["limits"])
    return out


# --- broker container -----------------------------------------------------------------------

CONTAINER = """
cluster = "c1"
namesrv_addrs = ["127.0.0.1:9876"]
lock_in_strict_mode = true

[tls]
ca_file = "/shared/ca.pem"

[[brokers]]
broker_name = "broker-a"
broker_id = 0
listen = "127.0.0.1:10911"
ha_listen = "127.0.0.1:10912"
http_listen = "127.0.0.1:10913"

[[brokers]]
broker_name = "broker-b"
broker_id = 1
listen = "127.0.0.1:20911"
ha_listen = "127.0.0.1:20912"
http_listen = "127.0.0.1:20913"
lock_in_strict_mode = false

[brokers.tls]
ca_file = "/b/ca.pem"
"""


def test_container_with_two_brokers(tmp_path: Path) -> None:
    path = write(tmp_path, CONTAINER)
    a, b = load_broker_configs(path, {}, {"HAC_DEFAULT_TOPIC_QUEUE_NUMS": "8"})
    assert (a.broker_name, a.broker_id, b.broker_name, b.broker_id) == (
        "broker-a",
        0,
        "broker-b",
        1,
    )
    assert a.cluster == b.cluster == "c1"
    assert a.namesrv_addrs == b.namesrv_addrs == ("127.0.0.1:9876",)
    assert a.lock_in_strict_mode is True  # shared default
    assert b.lock_in_strict_mode is False  # per-broker override
    assert a.tls.ca_file == "/shared/ca.pem"
    assert b.tls.ca_file == "/b/ca.pem"
    assert a.default_topic_queue_nums == b.default_topic_queue_nums == 8  # env for all
    assert a.store_path != b.store_path


def test_container_round_trip(tmp_path: Path) -> None:
    configs = load_broker_configs(write(tmp_path, CONTAINER), {}, {})
    doc = to_toml_dict(configs)
    assert doc["cluster"] == "c1"
    assert [entry["broker_name"] for entry in doc["brokers"]] == ["broker-a", "broker-b"]
    again = load_broker_configs(write(tmp_path, render_toml(configs), "again.toml"), {}, {})
    assert again == configs


def test_container_rejects_identity_from_env_and_flags(tmp_path: Path) -> None:
    path = write(tmp_path, CONTAINER)
    with pytest.raises(ConfigError) as info:
        load_broker_configs(path, {}, {"HAC_BROKER_ID": "3"})
    assert_one_clear_error(info.value, "broker_id (env HAC_BROKER_ID)", "[[brokers]]")
    with pytest.raises(ConfigError) as info:
        load_broker_configs(path, {"listen": "127.0.0.1:1"}, {})
    assert_one_clear_error(info.value, "listen (flag --listen)", "2 brokers")


def test_container_errors_name_the_entry(tmp_path: Path) -> None:
    path = write(tmp_path, CONTAINER.replace("broker_id = 1", "broker_id = 1\nbroker_idd = 2"))
    with pytest.raises(ConfigError) as info:
        load_broker_configs(path, {}, {})
    assert_one_clear_error(info.value, "brokers[1]", "did you mean 'broker_id'")

    path = write(
        tmp_path, CONTAINER.replace('"broker-b"', '"broker-a"').replace("id = 1", "id = 0")
    )
    with pytest.raises(ConfigError) as info:
        load_broker_configs(path, {}, {})
    assert_one_clear_error(info.value, "brokers[0]", "brokers[1]", "broker-a id 0")

    path = write(tmp_path, CONTAINER.replace("20912", "10912"))
    with pytest.raises(ConfigError) as info:
        load_broker_configs(path, {}, {})
    assert_one_clear_error(info.value, "brokers[0].ha_listen", "brokers[1].ha_listen", "10912")

    path = write(tmp_path, 'namesrv_addrs = ["h:1"]\nbrokers = [1, 2]\n')
    with pytest.raises(ConfigError) as info:
        load_broker_configs(path, {}, {})
    assert_one_clear_error(info.value, "brokers", "[[brokers]] tables")


def test_single_broker_loader_refuses_a_container(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_broker_config(write(tmp_path, CONTAINER), {}, {})
    assert_one_clear_error(info.value, "2 brokers", "load_broker_configs")


def test_plain_broker_file_is_a_container_of_one(tmp_path: Path) -> None:
    (only,) = load_broker_configs(write(tmp_path, BROKER_HEAD), {"broker_id": 4}, {})
    assert (only.broker_name, only.broker_id) == ("b", 4)


# --- RpcLimits lives in ha_controller.rpc.limits --------------------------------------------


def test_rpc_limits_is_the_rpc_layers_class() -> None:
    from ha_controller.rpc import RpcLimits as FromRpc
    from ha_controller.rpc.limits import RpcLimits as FromLimits

    assert RpcLimits is FromRpc is FromLimits
    loaded = load_nameserver_config(None, {}, {"HAC_LIMITS_MAX_LIST_SIZE": "20"})
    assert type(loaded.limits) is RpcLimits  # not the loader's checking twin
    assert loaded.limits == RpcLimits(max_list_size=20)


@pytest.mark.parametrize(
    ("kwargs", "needles"),
    [
        ({"max_frame_bytes": 5}, ["max_frame_bytes: must be >= 1024 bytes, got 5 bytes"]),
        ({"default_timeout_ms": 0}, ["default_timeout_ms: must be >= 1 ms"]),
        ({"max_list_size": "7"}, ["max_list_size", "integer", "'7'"]),
        ({"max_block_bytes": 64 * MIB}, ["max_block_bytes, max_frame_bytes", "cannot exceed"]),
    ],
)
def test_rpc_limits_direct_construction_is_validated(
    kwargs: dict[str, Any], needles: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        RpcLimits(**kwargs)
    assert_one_clear_error(info.value, *needles)


def test_default_delay_levels_are_the_shared_table() -> None:
    assert broker().delay_levels == DEFAULT_DELAY_LEVELS
    assert broker().delay_levels_ms == DELAY_LEVELS_MS
    assert len(DELAY_LEVELS_MS) == 18
    assert DELAY_LEVELS_MS[0] == 1000
    assert DELAY_LEVELS_MS[-1] == 7_200_000


# --- the gRPC gateway (hactl proxy) ---------------------------------------------------------

PROXY_FLAGS: dict[str, object] = {"namesrv": "127.0.0.1:9876"}


def test_proxy_defaults_are_the_gateways() -> None:
    cfg = load_proxy_config(None, PROXY_FLAGS, {})
    assert cfg == ProxyConfig(
        namesrv_addrs=("127.0.0.1:9876",),
        listen="0.0.0.0:8081",
        http_listen=None,
        fifo_groups=(),
        long_polling_timeout_ms=20_000,
        default_invisible_ms=30_000,
        send_attempts=3,
        route_ttl_ms=1000,
        heartbeat_broker_interval_ms=5000,
        broker_timeout_ms=3000,
        log_level="INFO",
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.send_attempts = 1  # type: ignore[misc]


def test_proxy_durations_carry_units_and_are_whole_numbers() -> None:
    timeish = re.compile(r"(interval|timeout|ttl|invisible|time)")
    hints = {f.name: f.type for f in dataclasses.fields(ProxyConfig)}
    for key in config_keys(ProxyConfig):
        if timeish.search(key):
            assert key.endswith("_ms"), key
            assert hints[key] == "int", key


def test_proxy_file_then_env_then_flags(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'namesrv_addrs = ["10.0.0.1:9876"]\n'
        'http_listen = "127.0.0.1:8082"\n'
        'fifo_groups = ["g1", "g2"]\n'
        "send_attempts = 5\n"
        "route_ttl_ms = 0\n"
        "long_polling_timeout_ms = 10000\n",
    )
    env = {"HAC_SEND_ATTEMPTS": "4", "HAC_HEARTBEAT_BROKER_INTERVAL_MS": "2500"}
    flags = {
        "namesrv": "a:1,b:2",  # the alias of namesrv_addrs, comma separated
        "listen": "127.0.0.1:0",
        "http": None,  # not given: the file's value stays
        "long_polling_timeout_ms": 5000,
        "ready_file": "ignored",  # not a setting
    }
    cfg = load_proxy_config(path, flags, env)
    assert cfg.namesrv_addrs == ("a:1", "b:2")
    assert cfg.listen == "127.0.0.1:0"
    assert cfg.http_listen == "127.0.0.1:8082"
    assert cfg.fifo_groups == ("g1", "g2")
    assert cfg.send_attempts == 4
    assert cfg.route_ttl_ms == 0  # 0 = ask the nameserver for every route
    assert cfg.heartbeat_broker_interval_ms == 2500
    assert cfg.long_polling_timeout_ms == 5000
    assert load_proxy_config(None, {**PROXY_FLAGS, "fifo_groups": "x, y,"}, {}).fifo_groups == (
        "x",
        "y",
    )


def test_proxy_round_trip(tmp_path: Path) -> None:
    cfg = ProxyConfig(
        namesrv_addrs=("10.0.0.1:9876", "[::1]:9876"),
        listen="127.0.0.1:0",
        http_listen="127.0.0.1:0",
        fifo_groups=("orders",),
        long_polling_timeout_ms=7000,
        log_level="DEBUG",
    )
    text = render_toml(cfg)
    assert tomllib.loads(text) == to_toml_dict(cfg)
    assert load_proxy_config(write(tmp_path, text), {}, {}) == cfg


def test_every_proxy_key_is_settable_from_env() -> None:
    base = load_proxy_config(None, PROXY_FLAGS, {})
    flat = {}
    for key, value in to_toml_dict(base).items():
        if isinstance(value, dict):  # the [tls] table
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    env = {
        env_var_name(key): _env_text(tuple(v) if isinstance(v, list) else v)
        for key, v in flat.items()
    }
    unset = set(config_keys(ProxyConfig)) - set(flat)
    assert unset == {
        "http_listen",
        "cluster_secret",
        "tls.cert_file",
        "tls.key_file",
        "tls.ca_file",
        "acl.file",
    }
    for key in unset:
        env[env_var_name(key)] = ""  # empty = unset for optional keys
    env["HAC_NAMESRV_ADDRS"] = "10.0.0.9:9876"
    base = dataclasses.replace(base, namesrv_addrs=("10.0.0.9:9876",))
    assert load_proxy_config(None, {}, env) == base


@pytest.mark.parametrize(
    ("source", "value", "needles"),
    [
        ("file", "long_polling_timeout_ms = 500", ["long_polling_timeout_ms", ">= 1000 ms"]),
        ("file", "long_polling_timeout_s = 20", ["unknown key", "long_polling_timeout_ms"]),
        ("file", "send_attempts = 0", ["send_attempts", ">= 1"]),
        ("file", "broker_timeout_ms = 1.5", ["broker_timeout_ms", "milliseconds", "1.5"]),
        ("file", "route_ttl_ms = -1", ["route_ttl_ms", ">= 0 ms"]),
        ("file", "namesrv_addrs = []", ["namesrv_addrs", "at least one"]),
        ("file", "fifo_groups = 3", ["fifo_groups", "list of strings"]),
        ("file", "http_listen = '0.0.0.0:8081'", ["listen", "http_listen", "port 8081"]),
        ("env", "HAC_DEFAULT_INVISIBLE_MS=30s", ["default_invisible_ms", "env HAC_DEFAULT_"]),
        ("env", "HAC_LISTEN=nohost", ["listen (env HAC_LISTEN)", "host:port"]),
        ("env", "HAC_LOG_LEVEL=loud", ["log_level", "'INFO'"]),
        ("flag", "send_attempts=0", ["send_attempts (flag --send-attempts)", ">= 1"]),
        ("flag", "http=localhost", ["http_listen (flag --http)", "host:port"]),
    ],
)
def test_proxy_errors_name_key_and_source(
    tmp_path: Path, source: str, value: str, needles: list[str]
) -> None:
    path = None
    env: dict[str, str] = {}
    flags: dict[str, object] = dict(PROXY_FLAGS)
    if source == "file":
        head = 'namesrv_addrs = ["h:9876"]\n' if "namesrv_addrs" not in value else ""
        path = write(tmp_path, head + value + "\n")
        flags = {}
        needles = [*needles, f"file {path}"]
    elif source == "env":
        name, _, text = value.partition("=")
        env[name] = text
    else:
        name, _, text = value.partition("=")
        flags[name] = text
    with pytest.raises(ConfigError) as info:
        load_proxy_config(path, flags, env)
    assert_one_clear_error(info.value, *needles)


def test_proxy_nameserver_defaults_to_hactls_and_cannot_be_empty() -> None:
    assert load_proxy_config(None, {}, {}).namesrv_addrs == ("127.0.0.1:9876",)
    with pytest.raises(ConfigError) as info:
        load_proxy_config(None, {}, {"HAC_NAMESRV_ADDRS": " , "})
    assert_one_clear_error(info.value, "namesrv_addrs (env HAC_NAMESRV_ADDRS)", "at least one")


def test_proxy_keeps_hactls_old_constructor() -> None:
    pytest.importorskip("grpc")
    from ha_controller.proxy import app

    cfg = app.ProxyConfig(
        namesrv=("127.0.0.1:9876",),
        listen="127.0.0.1:0",
        http=None,
        fifo_groups=frozenset({"b", "a"}),
        long_polling_timeout_s=5,
    )
    assert isinstance(cfg, ProxyConfig)
    assert (cfg.fifo_groups, cfg.long_polling_timeout_ms) == (("a", "b"), 5000)
    flags = {"namesrv": "127.0.0.1:9876", "listen": "127.0.0.1:0", "fifo_groups": "a,b"}
    assert load_proxy_config(None, {**flags, "long_polling_timeout_ms": 5000}, {}) == cfg
