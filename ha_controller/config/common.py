"""Keys that several services declare alike: declared here once, used by each class.

Each function returns a fresh field (a dataclass field belongs to one class), so a
class says ``log_level: LogLevel = common.log_level()``.
"""

from __future__ import annotations

from typing import Any

from ha_controller.config import checks
from ha_controller.config.schema import setting

__all__ = ["admin_token", "log_level"]


def admin_token() -> Any:
    """The admin HTTP API's bearer token (nameserver, broker)."""
    return setting(
        None,
        check=checks.NOT_EMPTY,
        secret=True,
        doc=(
            "Bearer token of the admin HTTP API: with it set, every endpoint but `/healthz`, "
            "`/readyz` and `/metrics` answers 401 without `Authorization: Bearer <token>`. "
            "Unset = no token required."
        ),
    )


def log_level() -> Any:
    """The process's log level (every service)."""
    return setting("INFO", doc="Log level of the process.")
