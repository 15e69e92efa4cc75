"""What a campaign is: its options, its errors, its drills' outcomes and its files.

:class:`CampaignOptions` are what ``hactl drill campaign`` asks for (and what
``campaign.json`` records, ``"options"``, for a resume); :class:`DrillOutcome` is one
finished drill as the summary sees it.  The campaign itself:
:mod:`ha_controller.drills.campaign`.
"""

from __future__ import annotations

import logging
import re
import shlex
import signal
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from ha_controller.drills.checker import (
    Verdict,
)
from ha_controller.drills.generator import (
    DEFAULT_FAMILIES,
    GeneratorSpec,
)
from ha_controller.protocol.errors import HaError

__all__ = [
    "CAMPAIGN_FILE",
    "DEFAULTS",
    "DRILL_DIR",
    "INTERRUPTED_DIR",
    "LOCK_FILE",
    "RESUME_FLAGS",
    "SCENARIO",
    "WINDOW_KEYS",
    "CampaignError",
    "CampaignInterrupted",
    "CampaignOptions",
    "CampaignResult",
    "DrillOutcome",
    "FaultKey",
    "drill_index",
    "drill_name",
    "resume_command",
]


log = logging.getLogger(__name__)

CAMPAIGN_FILE: Final = "campaign.json"
#: where a resumed campaign keeps the drill directories an interruption cut short
INTERRUPTED_DIR: Final = "interrupted"
LOCK_FILE: Final = ".campaign.lock"
DRILL_DIR: Final = re.compile(r"drill-(\d{3,})")
#: the keys of a family's ``write_unavailable_ms`` / ``read_unavailable_ms``
WINDOW_KEYS: Final[tuple[str, ...]] = ("p50", "p99", "max", "unrecovered")
SCENARIO: Final = "generated"

FaultKey = tuple[int, str, str]  # (start_ms, kind, target)


@dataclass(frozen=True, slots=True)
class CampaignOptions:
    #: faults to inject per family
    faults: int
    families: tuple[str, ...] = DEFAULT_FAMILIES
    seed: int = 0
    out: Path | None = None
    netns: bool = False
    faults_per_drill: int = 8
    rate: float = 30.0
    drain_timeout_s: float = 30.0
    #: stop after this many drills even if some family is short (None: 4x the drills
    #: the quota needs)
    max_drills: int | None = None
    #: give up after this many drills in a row that broke before injecting any fault
    #: (the cluster does not start: running on would only repeat that)
    max_broken_in_a_row: int = 3
    #: print each drill's own lines (else one line per drill)
    verbose: bool = False
    quiet: bool = False
    generator: GeneratorSpec | None = None
    #: continue the campaign recorded in ``out`` (``out/campaign.json``) instead of
    #: starting one; the other fields must match the record (:func:`resumed_options`)
    resume: bool = False
    #: ``families`` were asked for (``--families``): every one must run (module docstring)
    families_asked: bool = False
    #: the brokers' ``flush_mode`` (None: the broker's default, ``async``)
    flush_mode: str | None = None

    def __post_init__(self) -> None:
        if self.faults < 1:
            raise ValueError(f"faults must be >= 1, got {self.faults}")
        if self.faults_per_drill < 1:
            raise ValueError(f"faults_per_drill must be >= 1, got {self.faults_per_drill}")
        if not self.families:
            raise ValueError("a campaign needs at least one family")
        if self.flush_mode not in (None, "sync", "async"):
            raise ValueError(f"flush_mode must be 'sync' or 'async', got {self.flush_mode!r}")

    def drill_seed(self, index: int) -> int:
        return self.seed * 1000 + index

    def record(self) -> dict[str, Any]:
        """What ``campaign.json`` records (``"options"``) for a resume to rebuild these."""
        return {
            "faults": self.faults,
            "families": list(self.families),
            "seed": self.seed,
            "netns": self.netns,
            "faults_per_drill": self.faults_per_drill,
            "rate": self.rate,
            "drain_timeout_s": self.drain_timeout_s,
            "max_drills": self.max_drills,
            "generator": None if self.generator is None else _as_json(asdict(self.generator)),
            "families_asked": self.families_asked,
            "flush_mode": self.flush_mode,
        }


def _as_json(record: Mapping[str, Any]) -> dict[str, Any]:
    """Tuples as lists: the record equals what ``json.loads`` gives back."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in record.items()}


#: the defaults of what a summary from before ``"options"`` was recorded does not say
DEFAULTS: Final = CampaignOptions(faults=1)


class CampaignError(HaError, ValueError):
    """A campaign that cannot start or resume as asked; nothing was changed."""


class CampaignInterrupted(HaError, RuntimeError):
    """Ctrl-C or SIGTERM stopped the campaign; ``campaign.json`` keeps what finished."""

    def __init__(self, out: Path, signal_name: str) -> None:
        super().__init__(f"campaign interrupted ({signal_name})")
        self.out = out
        self.signal_name = signal_name

    @property
    def exit_code(self) -> int:
        """128 + the signal number, as a shell reports a process its signal ended."""
        return 128 + int(getattr(signal, self.signal_name, signal.SIGTERM))


#: the ``hactl drill campaign`` flag of each recorded option (resume conflicts name it)
RESUME_FLAGS: Final[Mapping[str, str]] = {
    "faults": "--faults",
    "families": "--families",
    "seed": "--seed",
    "netns": "--netns",
    "faults_per_drill": "--faults-per-drill",
    "rate": "--rate",
    "drain_timeout_s": "--drain-timeout",
    "max_drills": "--max-drills",
    "generator": "generator",
    "flush_mode": "--flush-mode",
}


def resume_command(out: Path) -> str:
    """The command that continues the campaign in ``out`` (from any directory)."""
    return f"hactl drill campaign --resume --out {shlex.quote(str(out.absolute()))}"


@dataclass(frozen=True, slots=True)
class DrillOutcome:
    """One drill as the campaign summary sees it."""

    drill: str
    seed: int
    verdict: Verdict
    #: the family of each of ``verdict.faults`` (None: a fault without one)
    families: tuple[str | None, ...]
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict.ok and self.error is None

    def family_counts(self) -> Counter[str]:
        return Counter(f for f in self.families if f is not None)


@dataclass(slots=True)
class CampaignResult:
    out: Path
    document: dict[str, Any]
    outcomes: list[DrillOutcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.document["ok"])


def drill_name(index: int) -> str:
    return f"drill-{index:03d}"


def drill_index(name: str) -> int:
    return int(name.removeprefix("drill-"))
