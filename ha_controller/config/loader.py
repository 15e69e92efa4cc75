"""Loading a component's config: defaults < TOML file < ``HAC_*`` environment < flags.

Each source becomes a layer (key -> value and where it came from); the merged layer
builds the config class, whose checks then name the key and that source.  A broker
file may hold several ``[[brokers]]`` tables (a broker container).
"""

from __future__ import annotations

import difflib
import logging
import os
import tomllib
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ha_controller.config.base import BUILD_CONTEXT
from ha_controller.config.broker import BrokerConfig
from ha_controller.config.checks import listener_clash
from ha_controller.config.nameserver import NameserverConfig
from ha_controller.config.proxy import ProxyConfig
from ha_controller.config.schema import ENV_PREFIX, env_var_name, schema
from ha_controller.config.tables import TWINS
from ha_controller.config.values import Unfit, describe, parse_text
from ha_controller.protocol.errors import ConfigError

__all__ = [
    "COMPONENTS",
    "load_broker_config",
    "load_broker_configs",
    "load_nameserver_config",
    "load_proxy_config",
]

log = logging.getLogger(__name__)

_C = TypeVar("_C")
# key -> (value, source); a layer is one of: file, env, flags.
_Layer = dict[str, tuple[object, str]]

#: the config class of every service process
COMPONENTS: tuple[type, ...] = (NameserverConfig, BrokerConfig, ProxyConfig)


def _read_toml(path: str | Path) -> dict[str, Any]:
    try:
        with Path(path).open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {exc.strerror}") from None


def _unknown_key(key: str, where: str, candidates: Sequence[str]) -> ConfigError:
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"unknown key {key!r} in {where}{hint}")


def _file_layer(table: Mapping[str, object], cls: type, where: str, prefix: str = "") -> _Layer:
    s = schema(cls)
    out: _Layer = {}
    for name, value in table.items():
        full = prefix + name
        if full in s.keys:
            out[full] = (value, where)
        elif full in s.tables:
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{full} ({where}): expected a [{full}] table, got {describe(value)}"
                )
            out.update(_file_layer(value, cls, where, full + "."))
        else:
            raise _unknown_key(full, where, [*s.keys, *s.tables])
    return out


def _env_layer(cls: type, env: Mapping[str, str]) -> _Layer:
    out: _Layer = {}
    for key in schema(cls).keys.values():
        text = env.get(key.env)
        if text is None:
            continue
        source = f"env {key.env}"
        try:
            out[key.name] = (parse_text(text, key.tp, key.name), source)
        except Unfit as bad:
            raise ConfigError(f"{key.name} ({source}): expected {bad}, got {text!r}") from None
    return out


def _flag_layer(cls: type, flags: Mapping[str, object]) -> _Layer:
    """Flags arrive parsed by argparse; ``None`` means "not given".

    Keys are config keys (nested ones with ``_``: ``tls_cert_file``) or a
    field's flag alias (``namesrv``, ``http``).  Other keys (``config``,
    ``ready_file``, ...) are not ours and are ignored, so ``vars(args)`` can be
    passed as it is.
    """
    out: _Layer = {}
    for key in schema(cls).keys.values():
        for flag in key.flags:
            value = flags.get(flag)
            if value is None:
                continue
            source = f"flag --{flag.replace('_', '-')}"
            if isinstance(value, str):
                try:
                    value = parse_text(value, key.tp, key.name)
                except Unfit as bad:
                    raise ConfigError(
                        f"{key.name} ({source}): expected {bad}, got {value!r}"
                    ) from None
            out[key.name] = (value, source)
            break
    return out


def _warn_unknown_env(env: Mapping[str, str]) -> None:
    # Only near-misses of a real key are reported: other HAC_* variables may
    # belong to tools (drills, tests) and are not ours to reject.
    known = frozenset(k.env for c in COMPONENTS for k in schema(c).keys.values())
    for name in env:
        if name.startswith(ENV_PREFIX) and name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
            if close:
                log.warning(
                    "environment variable %s is not a setting; did you mean %s?", name, close[0]
                )


def _build(cls: type[_C], layer: _Layer, prefix: str = "") -> _C:
    s = schema(cls)
    kwargs: dict[str, object] = {}
    for name in s.fields:
        full = prefix + name
        table = s.tables.get(name)
        if table is not None:
            kwargs[name] = _build(table, layer, full + ".")
        elif full in layer:
            kwargs[name] = layer[full][0]
        elif s.keys[name].required:
            raise ConfigError(
                f"{full}: required but not set (give it in the config file, "
                f"as {env_var_name(full)} or as a flag)"
            )
    sources = {key: source for key, (_, source) in layer.items()}
    token = BUILD_CONTEXT.set((sources, prefix))
    try:
        twin = TWINS.get(cls)
        if twin is None:
            return typing.cast("Callable[..., _C]", cls)(**kwargs)
        checked = twin(**kwargs)
    finally:
        BUILD_CONTEXT.reset(token)
    # The twin has checked and normalised every value; hand them to the real class.
    values = {name: getattr(checked, name) for name in kwargs}
    return typing.cast("Callable[..., _C]", cls)(**values)


def _load_one(
    cls: type[_C],
    path: str | Path | None,
    flags: Mapping[str, object],
    env: Mapping[str, str],
) -> _C:
    _warn_unknown_env(env)
    file_layer = {} if path is None else _file_layer(_read_toml(path), cls, f"file {path}")
    layer = {**file_layer, **_env_layer(cls, env), **_flag_layer(cls, flags)}
    return _build(cls, layer)


def load_nameserver_config(
    path: str | Path | None,
    flags: Mapping[str, object],
    env: Mapping[str, str] = os.environ,
) -> NameserverConfig:
    """Defaults < TOML file ``path`` < ``HAC_*`` env < flags (``None`` = not given)."""
    return _load_one(NameserverConfig, path, flags, env)


def load_proxy_config(
    path: str | Path | None,
    flags: Mapping[str, object],
    env: Mapping[str, str] = os.environ,
) -> ProxyConfig:
    """The gRPC gateway's settings: defaults < TOML file ``path`` < ``HAC_*`` env < flags.

    As for the other loaders, a flag whose value is ``None`` is "not given", flag keys
    are config keys or their aliases (``namesrv``, ``http``), and string values are
    parsed like environment values (``fifo_groups="g1,g2"``).
    """
    return _load_one(ProxyConfig, path, flags, env)


def load_broker_configs(
    path: str | Path | None,
    flags: Mapping[str, object],
    env: Mapping[str, str] = os.environ,
) -> tuple[BrokerConfig, ...]:
    """The brokers of a broker container (one process hosting several brokers).

    The file's top-level keys (and tables) are defaults shared by every
    ``[[brokers]]`` table; a ``[[brokers]]`` table overrides them; env and flags
    override both for every broker, except keys that identify one broker
    (name, id, listeners, store) which env/flags cannot set when the container
    holds more than one.  A file without ``[[brokers]]`` is a single broker.
    """
    _warn_unknown_env(env)
    where = f"file {path}"
    table = {} if path is None else dict(_read_toml(path))
    entries = table.pop("brokers", None)
    if entries is None:
        entry_layers: list[_Layer] = [{}]
    elif (
        isinstance(entries, list) and entries and all(isinstance(entry, dict) for entry in entries)
    ):
        entry_layers = [
            _file_layer(entry, BrokerConfig, f"{where}, brokers[{i}]")
            for i, entry in enumerate(entries)
        ]
    else:
        raise ConfigError(
            f"brokers ({where}): expected one or more [[brokers]] tables, got {describe(entries)}"
        )
    shared = _file_layer(table, BrokerConfig, where)
    overrides = {**_env_layer(BrokerConfig, env), **_flag_layer(BrokerConfig, flags)}
    if len(entry_layers) > 1:
        keys = schema(BrokerConfig).keys
        for name, (_, source) in overrides.items():
            if keys[name].per_broker:
                raise ConfigError(
                    f"{name} ({source}): would give all {len(entry_layers)} brokers of the "
                    f"container the same {name}; set it in each [[brokers]] table instead"
                )
    configs = tuple(
        _build(BrokerConfig, {**shared, **entry, **overrides}) for entry in entry_layers
    )
    _check_container(configs, where)
    return configs


def load_broker_config(
    path: str | Path | None,
    flags: Mapping[str, object],
    env: Mapping[str, str] = os.environ,
) -> BrokerConfig:
    """Defaults < TOML file ``path`` < ``HAC_*`` env < flags (``None`` = not given)."""
    configs = load_broker_configs(path, flags, env)
    if len(configs) != 1:
        raise ConfigError(
            f"brokers (file {path}): lists {len(configs)} brokers (a broker container); "
            "load it with load_broker_configs"
        )
    return configs[0]


def _check_container(configs: Sequence[BrokerConfig], where: str) -> None:
    identities: dict[tuple[str, int], int] = {}
    stores: dict[Path, int] = {}
    listeners: dict[str, str] = {}
    for i, cfg in enumerate(configs):
        other = identities.setdefault((cfg.broker_name, cfg.broker_id), i)
        if other != i:
            raise ConfigError(
                f"brokers[{other}].broker_name/broker_id, brokers[{i}].broker_name/broker_id "
                f"({where}): both are {cfg.broker_name} id {cfg.broker_id}"
            )
        other = stores.setdefault(cfg.store_path, i)
        if other != i:
            raise ConfigError(
                f"brokers[{other}].store_dir, brokers[{i}].store_dir ({where}): "
                f"both use {str(cfg.store_path)!r}"
            )
        for key in ("listen", "ha_listen", "http_listen"):
            listeners[f"brokers[{i}].{key}"] = getattr(cfg, key)
    clash = listener_clash(listeners)
    if clash is not None:
        raise ConfigError(f"{', '.join(clash[0])} ({where}): {clash[1]}")
