"""Framing and RPC bounds of a connection (DESIGN section 3; TubeMQ's listSize/block limits).

Here, not in :mod:`ha_controller.config`, so that the RPC layer and the client SDK do not
load the TOML/env configuration machinery.  :mod:`ha_controller.config` loads these as
the ``[limits]`` table of the nameserver and broker configs and re-exports the class.

Bounds are field metadata (``ge``/``le``), read both by this class's own check and by the
config loader, which names the key and where its value came from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from ha_controller.protocol.errors import ConfigError

__all__ = ["RpcLimits"]

_KIB: Final = 1024
_MIB: Final = 1024 * _KIB
_GIB: Final = 1024 * _MIB


def _bounded(default: int, *, ge: int, le: int | None = None) -> int:
    metadata = {"ge": ge} if le is None else {"ge": ge, "le": le}
    return field(default=default, metadata=metadata)


def _unit(name: str) -> str:
    for suffix, unit in (("_ms", " ms"), ("_bytes", " bytes")):
        if name.endswith(suffix):
            return unit
    return ""


@dataclass(frozen=True, kw_only=True)
class RpcLimits:
    """Framing and RPC bounds; invalid values raise :class:`ConfigError` naming the key."""

    max_frame_bytes: int = _bounded(32 * _MIB, ge=1 * _KIB, le=1 * _GIB)
    max_list_size: int = _bounded(3584, ge=1)
    max_block_bytes: int = _bounded(8192, ge=16)
    max_inflight_requests: int = _bounded(1024, ge=1)
    default_timeout_ms: int = _bounded(3000, ge=1)

    def __post_init__(self) -> None:
        problem = next(self._field_problems(), None) or next(self._rules(), None)
        if problem is not None:
            keys, text = problem
            raise ConfigError(f"{', '.join(keys)}: {text}")

    def _field_problems(self) -> Iterator[tuple[tuple[str, ...], str]]:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            unit = _unit(f.name)
            if not isinstance(value, int) or isinstance(value, bool):
                yield (f.name,), f"expected an integer, got {type(value).__name__} {value!r}"
                continue
            ge, le = f.metadata.get("ge"), f.metadata.get("le")
            if ge is not None and value < ge:
                yield (f.name,), f"must be >= {ge}{unit}, got {value}{unit}"
            elif le is not None and value > le:
                yield (f.name,), f"must be <= {le}{unit}, got {value}{unit}"

    def _rules(self) -> Iterator[tuple[tuple[str, ...], str]]:
        """Cross-field rules: ``(keys, problem)``; the config loader reports them too."""
        if self.max_block_bytes > self.max_frame_bytes:
            yield (
                ("max_block_bytes", "max_frame_bytes"),
                f"a block ({self.max_block_bytes}) cannot exceed the frame limit "
                f"({self.max_frame_bytes})",
            )
