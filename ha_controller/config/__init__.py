"""Typed, validated configuration of the nameserver, the broker and the gRPC gateway.

One frozen dataclass per component (:class:`NameserverConfig`, :class:`BrokerConfig`,
:class:`ProxyConfig`) with nested tables (:class:`TlsConfig`, :class:`AclConfig`,
:class:`RpcLimits`).  Values come, lowest precedence first, from the field defaults, a
TOML file, ``HAC_<KEY>`` environment variables and command-line flags
(:mod:`~ha_controller.config.loader`).  Nothing is written per key: the loader, the
reference docs/configuration.md (:mod:`~ha_controller.config.doc`) and the Helm chart's
values schema (:mod:`~ha_controller.config.helm_schema`) all read the one
:func:`schema` of a class, which reads each field's type and its :func:`setting`.

Adding a key is one field in its component's class::

    # in ha_controller/config/broker.py, class BrokerConfig
    pull_batch_max: int = setting(
        32,
        ge=1,
        le=1024,
        doc="Most messages one pull returns.",
    )

Its type is one of ``bool``, ``int``, ``float``, ``str``, ``X | None`` (unset = absent
from the file), ``tuple[str, ...]`` or ``Literal[...]``; a name ending in ``_ms``,
``_s`` or ``_bytes`` carries its unit and is at least 1 unless ``ge`` says otherwise;
``check=checks.LISTEN`` (:mod:`~ha_controller.config.checks`) checks a format; a rule
between keys is a ``yield`` in the class's ``_rules``.  Then regenerate the two
generated files (the tests fail, naming the command, until they are current)::

    .venv/bin/python -m ha_controller.config_doc
    .venv/bin/python -m ha_controller.config.helm_schema

Naming rules:

* Durations carry their unit in the name, ``*_ms`` or ``*_s``, never mixed.
  RocketMQ's ``...Millis``/``...Period``/``...Interval`` settings keep their
  names in snake_case with ``_ms`` (``brokerNotActiveTimeoutMillis`` ->
  ``broker_not_active_timeout_ms``).
* A nested table ``[tls]`` holds ``cert_file``; the same key is ``tls.cert_file``
  in messages, ``HAC_TLS_CERT_FILE`` in the environment and ``tls_cert_file``
  as a flag.

Every bad value is one :class:`ConfigError` whose single-line message names
the key, where the value came from and what was expected.

:class:`~ha_controller.rpc.limits.RpcLimits` (the ``[limits]`` table) lives in
the RPC layer, which must not import this package; it is loaded and checked here
like the other tables and re-exported.
"""

from __future__ import annotations

from ha_controller.config.broker import BrokerConfig
from ha_controller.config.hostport import format_host_port, parse_host_port
from ha_controller.config.loader import (
    load_broker_config,
    load_broker_configs,
    load_nameserver_config,
    load_proxy_config,
)
from ha_controller.config.nameserver import NameserverConfig
from ha_controller.config.proxy import ProxyConfig
from ha_controller.config.schema import (
    ENV_PREFIX,
    GIB,
    KIB,
    MIB,
    Key,
    Schema,
    config_keys,
    env_var_name,
    schema,
    setting,
)
from ha_controller.config.tables import AclConfig, RpcLimits, TlsConfig
from ha_controller.config.toml_writer import dumps_toml, render_toml, to_toml_dict, toml_value
from ha_controller.config.values import FlushMode, LogLevel, ReplicationMode
from ha_controller.protocol.errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "GIB",
    "KIB",
    "MIB",
    "AclConfig",
    "BrokerConfig",
    "ConfigError",
    "FlushMode",
    "Key",
    "LogLevel",
    "NameserverConfig",
    "ProxyConfig",
    "ReplicationMode",
    "RpcLimits",
    "Schema",
    "TlsConfig",
    "config_keys",
    "dumps_toml",
    "env_var_name",
    "format_host_port",
    "load_broker_config",
    "load_broker_configs",
    "load_nameserver_config",
    "load_proxy_config",
    "parse_host_port",
    "render_toml",
    "schema",
    "setting",
    "to_toml_dict",
    "toml_value",
]
