"""DataVersion: (stateVersion, counter, timestamp), compared in that order.

RocketMQ's ``DataVersion``.  Used for topic configs
(nameserver change detection) and for every metadata table an acting slave
can advance (consumer offsets, delay offsets, timer checkpoint, transaction
offsets), so that a returning master adopts the newer one in pre-online.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(order=False)
class DataVersion:
    state_version: int = 0
    counter: int = 0
    timestamp_ms: int = field(default_factory=_now_ms)

    def next_version(self, state_version: int | None = None) -> None:
        """Move the version on: new timestamp, counter + 1."""
        if state_version is not None:
            self.state_version = state_version
        self.counter += 1
        self.timestamp_ms = _now_ms()

    def take_over(self) -> None:
        """An acting slave takes over a table: move the state version on, so that its
        table outranks anything the absent master wrote since the last sync, however
        many steps the master's counter moved (compared before the counter)."""
        self.next_version(self.state_version + 1)

    def assign(self, other: DataVersion) -> None:
        self.state_version = other.state_version
        self.counter = other.counter
        self.timestamp_ms = other.timestamp_ms

    def copy(self) -> DataVersion:
        return DataVersion(self.state_version, self.counter, self.timestamp_ms)

    def key(self) -> tuple[int, int, int]:
        return (self.state_version, self.counter, self.timestamp_ms)

    def compare(self, other: DataVersion) -> int:
        """-1, 0 or 1 as self is older than, equal to or newer than other."""
        a, b = self.key(), other.key()
        return (a > b) - (a < b)

    def to_dict(self) -> dict[str, int]:
        return {
            "stateVersion": self.state_version,
            "counter": self.counter,
            "timestamp": self.timestamp_ms,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataVersion:
        return cls(
            int(data.get("stateVersion", 0)),
            int(data.get("counter", 0)),
            int(data.get("timestamp", 0)),
        )


class SteppedVersion:
    """A DataVersion that moves every ``step`` updates (500 for consumer offsets,
    200 for delay offsets)."""

    def __init__(self, step: int, version: DataVersion | None = None) -> None:
        if step < 1:
            raise ValueError("step must be >= 1")
        self.step = step
        self.version = version if version is not None else DataVersion()
        self._updates = 0

    def touch(self) -> bool:
        """Count one update; return True when the version moved."""
        self._updates += 1
        if self._updates % self.step == 0:
            self.version.next_version()
            return True
        return False
