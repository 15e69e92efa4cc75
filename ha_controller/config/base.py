"""The base of the config classes: every key checked when an instance is made.

Type, bounds and format of each key (:mod:`ha_controller.config.schema`), then the
class's cross-field rules (:meth:`Validated._rules`); the first problem is one
:class:`ConfigError` naming the key and, when a loader is building the instance, where
its value came from.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar

from ha_controller.config.schema import schema
from ha_controller.config.values import Unfit, bounds_problem, coerce, describe
from ha_controller.protocol.errors import ConfigError

__all__ = ["BUILD_CONTEXT", "DEFAULT_SOURCE", "Problem", "Validated", "fail"]

DEFAULT_SOURCE = "default"

#: ``(keys, problem)``: what a cross-field rule yields
Problem = tuple[tuple[str, ...], str]

# While a loader builds a config, the source of each key ("file x.toml",
# "env HAC_X", "flag --x", "default") and the key prefix of the class being
# built ("" or "tls."), so that a failing __post_init__ can name them.
BUILD_CONTEXT: ContextVar[tuple[Mapping[str, str], str] | None] = ContextVar(
    "ha_controller_config_build", default=None
)


def fail(keys: Sequence[str], problem: str) -> ConfigError:
    """The error naming ``keys`` (and their sources, inside a loader)."""
    context = BUILD_CONTEXT.get()
    if context is None:
        return ConfigError(f"{', '.join(keys)}: {problem}")
    sources, prefix = context
    named = []
    for key in keys:
        full = key if "." in key else prefix + key
        named.append(f"{full} ({sources.get(full, DEFAULT_SOURCE)})")
    return ConfigError(f"{', '.join(named)}: {problem}")


class Validated:
    """Base of the config classes: type, bounds, checks and cross-field rules at init."""

    def __post_init__(self) -> None:
        s = schema(type(self))
        for name in s.fields:
            key = s.keys.get(name)
            raw = getattr(self, name)
            try:
                value = coerce(raw, key.tp if key is not None else s.tables[name], name)
            except Unfit as bad:
                got = type(raw).__name__ if key is not None and key.secret else describe(raw)
                raise fail((name,), f"expected {bad}, got {got}") from None
            object.__setattr__(self, name, value)
            if key is None:
                continue
            problem = bounds_problem(key, value)
            if problem is None and key.check is not None and value is not None:
                problem = key.check(value)
            if problem is not None:
                raise fail((name,), problem)
        rule = next(self._rules(), None)
        if rule is not None:
            raise fail(*rule)

    def _rules(self) -> Iterator[Problem]:
        """Cross-field rules: yield ``(keys, problem)``; the first one is raised."""
        return iter(())
