"""Fault campaigns: generated drills until every fault family had ``N`` faults.

``hactl drill campaign --faults N [--families ...] [--seed S] [--out DIR] [--netns]``
runs drills of the ``generated`` scenario (:mod:`ha_controller.drills.runner`), one
cluster and one generated schedule (:mod:`ha_controller.drills.generator`) of up to
``faults_per_drill`` faults per drill, until ``N`` faults of every family were injected,
and writes::

    DIR/<drill>/history.jsonl, verdict.json, report.html, schedule.json, strip.svg, logs/
    DIR/campaign.json
    DIR/campaign.html

Drill ``i`` (``drill-000``, ``drill-001``, ...) has the seed ``S * 1000 + i`` and a quota
of the families still short of ``N``: one fault of each in turn (starting at a family
that rotates with ``i``) until ``faults_per_drill``.  ``DIR/<drill>/schedule.json``
reproduces it: ``hactl drill generated --schedule DIR/<drill>/schedule.json``.

Families are counted from the history, not from the plan: a fault counts once its
``fault`` info event (with its ``family``) is recorded.  Families *asked for*
(``--families``, ``families_asked``) must all run: one this machine cannot fault
(:mod:`ha_controller.drills.needs`: partition and loss without ``--netns``, disk-full
without tmpfs mounts, power-loss without the FUSE layer, clock without the clock shim)
refuses the campaign before anything starts (:class:`CampaignError`, exit 2), and one
whose faults a drill had to skip (a ``fault`` fail event) leaves the campaign
incomplete, never ok.  With the default families, one that cannot run is skipped up
front with the reason, and one whose faults a drill had to skip is skipped from then
on with the drill's reason.

Attribution (``campaign.json`` ``families``), per family F:

``faults``
    faults of family F in all drills;
``drills``
    drills holding at least one fault of F;
``lost`` ... ``corrupt_deliveries``, ``unsynced_lost``
    the sum of those drills' counts: a drill's counts are attributed whole to every
    family that had a fault in it (a drill cannot tell which of its faults caused a
    lost message), so a drill with a kill and a partition adds its lost messages to
    both, and the families' sums may exceed the campaign's;
``write_unavailable_ms`` / ``read_unavailable_ms``
    ``p50``, ``p99`` (nearest rank) and ``max`` over the faults of F of each fault's
    worst window (its largest group or cluster window, as in a verdict's
    ``availability``), and ``unrecovered``: the faults of F with a window that never
    closed;
``errors``
    drills holding a fault of F that ended in an error (no complete verdict).

``ok`` is true when every drill's verdict is ok, no drill ended in an error and every
family that was not skipped got its ``N`` faults (every family, when they were asked
for).  ``flush_mode`` states how the brokers' stores synced (``--flush-mode``).
After ``max_broken_in_a_row`` drills in a row that broke before injecting anything (a
cluster that does not start) the campaign gives up (``gave_up`` says why).
``failing_seeds`` lists the seeds of the drills that were not ok.  The same summary is
computed from Spark verdicts by ``hactl analyze DIR`` (``campaign.spark.json``),
through :func:`campaign_document`.

Interruptions.  ``campaign.json`` is replaced whole (never half-written) when the
campaign starts, when a drill starts (``running`` names it) and after every drill; it
records the campaign's parameters (``options``), how many times it was started or
resumed (``runs``) and the accumulated ``elapsed_s``.  Ctrl-C or SIGTERM cleans up the
drill in progress, writes ``campaign.json`` with the drills that finished and raises
:class:`CampaignInterrupted`.  ``CampaignOptions(resume=True)`` (``hactl drill campaign
--resume --out DIR``) continues a campaign: the recorded drills whose ``verdict.json``
and ``history.jsonl`` are there are loaded, not run again (:func:`load_outcome`); a
drill directory that is not recorded as finished (the process was killed in it) is
moved to ``DIR/interrupted/<drill>-<run>/`` (listed in ``interrupted``) and that drill
runs again with its index and seed; quotas and skipped families follow from the loaded
drills as if the campaign had never stopped.  The options must match the recorded ones
except ``faults`` (may be raised) and ``max_drills`` (:func:`resumed_options`).  One
campaign at a time holds ``DIR`` (``DIR/.campaign.lock``).  Every campaign first
removes what killed drills left on this machine (:mod:`ha_controller.drills.leftovers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import html
import json
import logging
import os
import re
import shlex
import signal
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

from ha_controller.drills.checker import (
    FAILING_COUNTS,
    REPORTED_COUNTS,
    FaultWindow,
    Verdict,
    availability_summary,
    check,
)
from ha_controller.drills.generator import (
    FAMILIES,
    GeneratorSpec,
    Schedule,
    ScheduleGenerator,
    parse_families,
)
from ha_controller.drills.history import Event, iter_history
from ha_controller.drills.leftovers import cleanup_stale
from ha_controller.drills.needs import refusal, unavailable_families
from ha_controller.drills.report import FAMILY_COLOURS, timeline_strip, write_report
from ha_controller.protocol.errors import HaError

if TYPE_CHECKING:  # the runner (and the client SDK) only when a campaign runs
    from ha_controller.drills.runner import DrillOptions, DrillResult

__all__ = [
    "CAMPAIGN_FILE",
    "INTERRUPTED_DIR",
    "RESUME_FLAGS",
    "WINDOW_KEYS",
    "CampaignError",
    "CampaignInterrupted",
    "CampaignOptions",
    "CampaignResult",
    "DrillOutcome",
    "Progress",
    "align_families",
    "campaign_document",
    "drill_name",
    "drill_quota",
    "family_summary",
    "fault_families",
    "load_outcome",
    "recorded_options",
    "render_campaign",
    "resume_command",
    "resumed_options",
    "run_campaign",
    "run_campaign_sync",
    "unavailable_families",
]

log = logging.getLogger(__name__)

CAMPAIGN_FILE: Final = "campaign.json"
#: where a resumed campaign keeps the drill directories an interruption cut short
INTERRUPTED_DIR: Final = "interrupted"
_LOCK_FILE: Final = ".campaign.lock"
_DRILL_DIR: Final = re.compile(r"drill-(\d{3,})")
#: the keys of a family's ``write_unavailable_ms`` / ``read_unavailable_ms``
WINDOW_KEYS: Final[tuple[str, ...]] = ("p50", "p99", "max", "unrecovered")
SCENARIO: Final = "generated"

FaultKey = tuple[int, str, str]  # (start_ms, kind, target)


@dataclass(frozen=True, slots=True)
class CampaignOptions:
    #: faults to inject per family
    faults: int
    families: tuple[str, ...] = FAMILIES
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
_DEFAULTS: Final = CampaignOptions(faults=1)


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


# ---- attribution (shared with the Spark analysis) --------------------------------------


def fault_families(events: Iterable[Event]) -> dict[FaultKey, list[str | None]]:
    """``(start_ms, kind, target)`` -> the families of the faults that started so, from
    the ``fault`` info events of a history."""
    out: dict[FaultKey, list[str | None]] = defaultdict(list)
    for e in events:
        if e.f != "fault" or e.type != "info":
            continue
        kind, target, family = (e.value.get(k) for k in ("kind", "target", "family"))
        if isinstance(kind, str) and isinstance(target, str):
            out[(e.t_ms, kind, target)].append(family if isinstance(family, str) else None)
    return out


def align_families(
    faults: Sequence[FaultWindow], families: Mapping[FaultKey, Sequence[str | None]]
) -> tuple[str | None, ...]:
    """The family of each fault of a verdict (faults with one key take theirs in turn)."""
    taken: Counter[FaultKey] = Counter()
    out: list[str | None] = []
    for fw in faults:
        key = (fw.start_ms, fw.kind, fw.target)
        found = sorted(families.get(key, ()), key=lambda f: f or "")
        i = taken[key]
        out.append(found[i] if i < len(found) else None)
        taken[key] += 1
    return tuple(out)


def _windows(faults: Sequence[FaultWindow]) -> dict[str, dict[str, int | None]]:
    summary = availability_summary(faults)
    return {
        kind: {k: summary[kind][k] for k in WINDOW_KEYS}
        for kind in ("write_unavailable_ms", "read_unavailable_ms")
    }


def family_summary(
    outcomes: Sequence[DrillOutcome], families: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """``campaign.json``'s ``families`` (the attribution rule: module docstring)."""
    out: dict[str, dict[str, Any]] = {}
    for family in families:
        drills = [o for o in outcomes if family in o.families]
        faults = [
            fw
            for o in outcomes
            for fw, f in zip(o.verdict.faults, o.families, strict=True)
            if f == family
        ]
        entry: dict[str, Any] = {"faults": len(faults), "drills": len(drills)}
        for name in (*FAILING_COUNTS, *REPORTED_COUNTS):
            entry[name] = sum(int(o.verdict.counts.get(name, 0)) for o in drills)
        entry.update(_windows(faults))
        entry["errors"] = sum(1 for o in drills if o.error is not None)
        out[family] = entry
    return out


def campaign_document(
    outcomes: Sequence[DrillOutcome],
    *,
    families: Sequence[str],
    faults_per_family: int,
    seed: int,
    skipped: Mapping[str, str],
    extra: Mapping[str, Any] | None = None,
    asked: bool = False,
) -> dict[str, Any]:
    """``campaign.json``: ``{"ok", "families", "failing_seeds", ...}`` (module docstring);
    ``asked``: the families were asked for, so a skipped one leaves it incomplete."""
    summary = family_summary(outcomes, families)
    complete = all(
        summary[f]["faults"] >= faults_per_family for f in families if asked or f not in skipped
    )
    return {
        "ok": complete and all(o.ok for o in outcomes),
        "families": summary,
        "failing_seeds": sorted({o.seed for o in outcomes if not o.ok}),
        "complete": complete,
        "faults_per_family": faults_per_family,
        "seed": seed,
        "skipped_families": dict(skipped),
        "families_asked": asked,
        "drills": [
            {
                "drill": o.drill,
                "seed": o.seed,
                "ok": o.ok,
                "error": o.error,
                "faults": dict(sorted(o.family_counts().items())),
                "failing_counts": {
                    k: int(o.verdict.counts[k]) for k in FAILING_COUNTS if o.verdict.counts.get(k)
                },
            }
            for o in outcomes
        ],
        **(extra or {}),
    }


# ---- planning ------------------------------------------------------------------------


def drill_quota(remaining: Mapping[str, int], faults: int, rotate: int = 0) -> dict[str, int]:
    """Up to ``faults`` faults over the families with some ``remaining``: one of each in
    turn, in :data:`FAMILIES` order rotated by ``rotate``."""
    short = [f for f in FAMILIES if remaining.get(f, 0) > 0]
    if not short:
        return {}
    k = rotate % len(short)
    order = short[k:] + short[:k]
    left = {f: remaining[f] for f in order}
    quota: Counter[str] = Counter()
    n = 0
    while n < faults and any(left.values()):
        for f in order:
            if n >= faults:
                break
            if left[f] > 0:
                quota[f] += 1
                left[f] -= 1
                n += 1
    return dict(quota)


@dataclass(slots=True)
class Progress:
    """Where a campaign stands (bookkeeping only, no I/O): its finished drills in index
    order, the faults each family still needs and the families skipped, with why."""

    remaining: dict[str, int]
    skipped: dict[str, str]
    outcomes: list[DrillOutcome] = field(default_factory=list)

    @classmethod
    def start(cls, families: Iterable[str], faults: int, skipped: Mapping[str, str]) -> Progress:
        return cls({f: faults for f in families if f not in skipped}, dict(skipped))

    @property
    def left(self) -> int:
        """Faults still to inject."""
        return sum(self.remaining.values())

    def next_index(self) -> int:
        """The lowest drill index not finished yet."""
        done = {o.drill for o in self.outcomes}
        return next(i for i in range(len(done) + 1) if drill_name(i) not in done)

    def quota(self, index: int, faults_per_drill: int) -> dict[str, int]:
        return drill_quota(self.remaining, faults_per_drill, rotate=index)

    def add(self, outcome: DrillOutcome, skipped_in: Mapping[str, str]) -> list[str]:
        """Count a finished drill's faults; a family whose faults it had to skip
        (``skipped_in``: family -> reason) and injected none of is skipped from then on.
        Returns the families skipped now."""
        self.outcomes.append(outcome)
        self.outcomes.sort(key=lambda o: _drill_index(o.drill))
        injected = outcome.family_counts()
        for family, n in injected.items():
            if family in self.remaining:
                self.remaining[family] = max(self.remaining[family] - n, 0)
        now: list[str] = []
        for family, reason in skipped_in.items():
            if family in self.remaining and not injected.get(family):
                self.skipped[family] = reason
                self.remaining.pop(family)
                now.append(family)
        return now


def drill_name(index: int) -> str:
    return f"drill-{index:03d}"


def _drill_index(name: str) -> int:
    return int(name.removeprefix("drill-"))


# ---- resuming -----------------------------------------------------------------------------


def _read_record(out: Path) -> dict[str, Any]:
    path = out / CAMPAIGN_FILE
    if not path.is_file():
        raise CampaignError(f"{out} holds no campaign to resume ({CAMPAIGN_FILE} not found)")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CampaignError(f"cannot read {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise CampaignError(f"{path} is not a campaign summary (not a JSON object)")
    return doc


def recorded_options(out: Path) -> CampaignOptions:
    """The options of the campaign recorded in ``out/campaign.json`` (its ``"options"``;
    a summary written before those were recorded gives what it has, the rest defaults).
    :class:`CampaignError` when there is no campaign or it cannot be read."""
    doc = _read_record(out)
    rec = doc.get("options")
    if not isinstance(rec, dict):
        rec = {
            "faults": doc.get("faults_per_family"),
            "families": list(doc.get("families") or ()),
            "seed": doc.get("seed"),
            "netns": doc.get("netns", False),
            "faults_per_drill": doc.get("faults_per_drill", _DEFAULTS.faults_per_drill),
        }
    try:
        families = tuple(str(f) for f in rec["families"])
        parse_families(families)  # every one known
        generator = rec.get("generator")
        max_drills = rec.get("max_drills")
        return CampaignOptions(
            faults=int(rec["faults"]),
            families=families,
            seed=int(rec["seed"]),
            out=out,
            netns=bool(rec.get("netns", False)),
            faults_per_drill=int(rec.get("faults_per_drill", _DEFAULTS.faults_per_drill)),
            rate=float(rec.get("rate", _DEFAULTS.rate)),
            drain_timeout_s=float(rec.get("drain_timeout_s", _DEFAULTS.drain_timeout_s)),
            max_drills=None if max_drills is None else int(max_drills),
            generator=None if generator is None else _generator_spec(generator),
            families_asked=bool(rec.get("families_asked", False)),
            flush_mode=None if rec.get("flush_mode") is None else str(rec["flush_mode"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CampaignError(
            f"{out / CAMPAIGN_FILE}: cannot rebuild the campaign's options: {exc}"
        ) from exc


def _generator_spec(record: Mapping[str, Any]) -> GeneratorSpec:
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}
    return GeneratorSpec(**fields)


def _show(name: str, value: object) -> str:
    flag = RESUME_FLAGS[name]
    if name == "netns":
        return flag if value else f"no {flag}"
    if name == "families" and isinstance(value, Sequence):
        return f"{flag} {','.join(map(str, value))}"
    if name == "generator":
        shown = asdict(value) if isinstance(value, GeneratorSpec) else None
        return f"{flag} {json.dumps(shown, sort_keys=True)}"
    return f"{flag} {value}"


def resumed_options(recorded: CampaignOptions, given: Mapping[str, Any]) -> CampaignOptions:
    """``recorded`` with what was ``given`` (option name -> value, names of
    :data:`RESUME_FLAGS`) for a resume: ``faults`` may be raised, ``max_drills``
    changed; any other given value must equal the recorded one.  :class:`CampaignError`
    naming the flag and both values otherwise."""
    where = f"the campaign in {recorded.out}" if recorded.out is not None else "the campaign"
    problems: list[str] = []
    for name, value in given.items():
        mine = getattr(recorded, name)
        if name == "faults":
            if value < mine:
                problems.append(
                    f"--faults {value} is below the {mine} faults per family of {where} "
                    "(a resumed campaign may only raise it)"
                )
        elif name == "max_drills":
            pass
        elif name == "families" and set(value) == set(mine):
            pass
        elif value != mine:
            problems.append(
                f"{_show(name, value)} contradicts {where}, recorded with {_show(name, mine)}"
            )
    if problems:
        raise CampaignError(
            "; ".join(problems) + " (--resume takes the campaign's parameters from "
            f"{CAMPAIGN_FILE}: leave those flags out)"
        )
    changed = {k: given[k] for k in ("faults", "max_drills") if k in given}
    return replace(recorded, **changed, resume=True)


def load_outcome(drill_dir: Path, entry: Mapping[str, Any]) -> DrillOutcome:
    """A finished drill as the campaign saw it, from its ``verdict.json`` and
    ``history.jsonl`` (the families of its faults as :func:`_run_one` attributes them)
    and its ``campaign.json`` entry (seed, error)."""
    verdict = Verdict.from_dict(json.loads((drill_dir / "verdict.json").read_text("utf-8")))
    history = drill_dir / "history.jsonl"
    families = align_families(verdict.faults, fault_families(iter_history(history)))
    error = entry.get("error")
    return DrillOutcome(
        str(entry["drill"]),
        int(entry["seed"]),
        verdict,
        families,
        None if error is None else str(error),
    )


@dataclass(slots=True)
class _Previous:
    """What the runs before this one left: the campaign's state at the start of a run."""

    outcomes: list[DrillOutcome] = field(default_factory=list)
    runs: int = 0
    elapsed_s: float = 0.0
    interrupted: list[dict[str, Any]] = field(default_factory=list)
    #: drill directories of drills not recorded as finished (moved aside, run again)
    unfinished: list[str] = field(default_factory=list)
    #: a recorded drill that could not be loaded -> why
    unreadable: dict[str, str] = field(default_factory=dict)


def _previous(out: Path, options: CampaignOptions) -> _Previous:
    """Read (never change) the campaign in ``out`` for a resume (module docstring)."""
    doc = _read_record(out)
    resumed_options(recorded_options(out), {k: getattr(options, k) for k in RESUME_FLAGS})
    prev = _Previous(
        runs=int(doc.get("runs") or 1),
        elapsed_s=float(doc.get("elapsed_s") or 0.0),
        interrupted=list(doc.get("interrupted") or ()),
    )
    loaded: set[str] = set()
    for entry in doc.get("drills") or ():
        name = str(entry.get("drill"))
        if not _DRILL_DIR.fullmatch(name):
            raise CampaignError(f"{out / CAMPAIGN_FILE}: {name!r} is not a drill of a campaign")
        if name in loaded:
            continue
        try:
            prev.outcomes.append(load_outcome(out / name, entry))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            prev.unreadable[name] = f"{type(exc).__name__}: {exc}"
            continue
        loaded.add(name)
    prev.outcomes.sort(key=lambda o: _drill_index(o.drill))
    prev.unfinished = sorted(
        (p.name for p in out.iterdir() if p.is_dir() and _DRILL_DIR.fullmatch(p.name)),
        key=_drill_index,
    )
    prev.unfinished = [n for n in prev.unfinished if n not in loaded]
    return prev


def _move_aside(out: Path, name: str, run: int) -> Path:
    """``out/<name>`` -> ``out/interrupted/<name>-<run>`` (``-<run>.2`` ... if taken)."""
    base = out / INTERRUPTED_DIR / f"{name}-{run}"
    dest, n = base, 1
    while dest.exists():
        n += 1
        dest = base.with_name(f"{base.name}.{n}")
    dest.parent.mkdir(exist_ok=True)
    (out / name).rename(dest)
    return dest


@contextlib.contextmanager
def _exclusive(out: Path) -> Iterator[None]:
    """Hold ``out/.campaign.lock`` (one campaign per directory; a killed holder's lock
    goes with it)."""
    path = out / _LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = path.read_text(encoding="utf-8").strip() or "?"
            raise CampaignError(
                f"{out} is in use by a running campaign (pid {holder}); stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)


def _write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` whole: a kill in the middle leaves the old or the new file."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


# ---- running ------------------------------------------------------------------------------


async def run_campaign(
    options: CampaignOptions, *, say: Callable[[str], None] | None = None
) -> CampaignResult:
    """Run drills until every family had its faults, or continue the campaign recorded in
    ``options.out`` with ``options.resume`` (module docstring).  :class:`CampaignError`
    (before anything changed) when the directory holds a campaign and ``resume`` is not
    set, holds none and it is, is used by a running campaign, or when ``options``
    contradict the recorded ones."""
    if options.resume and options.out is None:
        raise CampaignError("resuming a campaign needs its directory (--out DIR)")
    if options.families_asked and (refused := refusal(options.families, netns=options.netns)):
        raise CampaignError(f"--families: {refused}")
    out = options.out or Path(tempfile.mkdtemp(prefix="campaign-"))
    if options.resume and not (out / CAMPAIGN_FILE).is_file():
        raise CampaignError(f"{out} holds no campaign to resume ({CAMPAIGN_FILE} not found)")
    if not options.resume and (out / CAMPAIGN_FILE).exists():
        raise CampaignError(
            f"{out} already holds a campaign ({CAMPAIGN_FILE}); continue it with "
            f"'{resume_command(out)}' or choose another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    with _exclusive(out):
        return await _run_locked(options, out, say)


async def _run_locked(
    options: CampaignOptions, out: Path, say: Callable[[str], None] | None
) -> CampaignResult:
    from ha_controller.drills.runner import DrillOptions, generator_spec, run_drill

    prev = _previous(out, options) if options.resume else _Previous()
    started = time.monotonic()
    tell: Callable[[str], None] = say if say is not None else _print
    if options.quiet:
        tell = _silent
    for line in cleanup_stale():
        tell(f"removed what a killed drill left behind: {line}")
    runs = prev.runs + 1
    interrupted = prev.interrupted
    for name, why in prev.unreadable.items():
        tell(f"{name} is recorded but cannot be loaded ({why}): it runs again")
    for name in prev.unfinished:
        dest = _move_aside(out, name, prev.runs)
        interrupted.append({"drill": name, "dir": str(dest.relative_to(out)), "run": prev.runs})
        tell(f"{name} did not finish in run {prev.runs}: moved aside to {dest}; it runs again")
    skipped = unavailable_families(options.families, netns=options.netns)
    for family, reason in skipped.items():
        tell(f"family {family} skipped: {reason}")
    families = options.families
    progress = Progress.start(families, options.faults, skipped)
    per_drill = options.faults_per_drill
    max_drills = options.max_drills
    if max_drills is None:
        max_drills = 4 * -(-progress.left // per_drill) + 1
    for outcome in prev.outcomes:
        progress.add(outcome, _skipped_in(out / outcome.drill / "history.jsonl"))
    if options.resume:
        tell(
            f"resuming {out} (run {runs}): {len(prev.outcomes)} drills done, "
            f"{progress.left} faults still to inject"
        )
    result = CampaignResult(out, {}, progress.outcomes)
    broken_in_a_row = 0
    gave_up: str | None = None
    running: str | None = None

    def write() -> None:
        result.document = campaign_document(
            progress.outcomes,
            families=families,
            faults_per_family=options.faults,
            seed=options.seed,
            skipped=progress.skipped,
            asked=options.families_asked,
            extra={
                "flush_mode": options.flush_mode or "async",
                "netns": options.netns,
                "faults_per_drill": per_drill,
                "elapsed_s": round(prev.elapsed_s + time.monotonic() - started, 1),
                "gave_up": gave_up,
                "options": options.record(),
                "runs": runs,
                "running": running,
                "interrupted": interrupted,
            },
        )
        _write_atomic(out / CAMPAIGN_FILE, json.dumps(result.document, indent=2) + "\n")
        _write_atomic(out / "campaign.html", render_campaign(out, result.document))

    write()
    try:
        while progress.left > 0 and len(progress.outcomes) < max_drills:
            index = progress.next_index()
            name = drill_name(index)
            seed = options.drill_seed(index)
            base = DrillOptions(
                scenario=SCENARIO,
                seed=seed,
                out=out / name,
                netns=options.netns,
                rate=options.rate,
                drain_timeout_s=options.drain_timeout_s,
                quiet=not options.verbose,
                generator=options.generator,
                flush_mode=cast(Any, options.flush_mode),
            )
            schedule = ScheduleGenerator(seed, generator_spec(base)).generate_quota(
                progress.quota(index, per_drill)
            )
            running = name
            write()
            (out / name).mkdir(parents=True, exist_ok=True)
            (out / name / "schedule.json").write_text(schedule.to_json() + "\n", "utf-8")
            plan = ", ".join(f"{f} x{n}" for f, n in sorted(schedule.family_counts().items()))
            tell(f"{name} (seed {seed}): {len(schedule.steps)} steps: {plan}")
            outcome = await _run_one(base, name, schedule, run_drill, tell)
            for family in progress.add(outcome, _skipped_in(out / name / "history.jsonl")):
                tell(f"family {family} skipped from now on: {progress.skipped[family]}")
            _write_strip(out / name)
            running = None
            bad = {k: v for k, v in outcome.verdict.counts.items() if k in FAILING_COUNTS and v}
            status = "OK" if outcome.ok else f"FAILED {bad or ''} {outcome.error or ''}".strip()
            tell(f"{name}: {status}; {progress.left} faults still to inject")
            injected = outcome.family_counts()
            broken_in_a_row = broken_in_a_row + 1 if outcome.error and not injected else 0
            if broken_in_a_row >= options.max_broken_in_a_row:
                gave_up = (
                    f"{broken_in_a_row} drills in a row broke before any fault "
                    f"(last: {outcome.error})"
                )
                tell(f"giving up: {gave_up}")
                break
            write()
    finally:
        write()
    _print_table(result.document, tell)
    status = "OK" if result.ok else "FAILED"
    tell(f"campaign {status}: {out / CAMPAIGN_FILE}  {out / 'campaign.html'}")
    return result


def _print(text: str) -> None:
    print(text, flush=True)


def _silent(_text: str) -> None:
    pass


async def _run_one(
    base: DrillOptions,
    name: str,
    schedule: Schedule,
    run_drill: Callable[[DrillOptions], Awaitable[DrillResult]],
    tell: Callable[[str], None],
) -> DrillOutcome:
    from ha_controller.drills.runner import SCENARIOS

    assert base.out is not None
    options = replace(base, schedule=schedule)
    error: str | None = None
    verdict: Verdict | None = None
    try:
        verdict = (await run_drill(options)).verdict
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a drill that breaks is a finding, not the end of the campaign
        error = f"{type(exc).__name__}: {exc}"
        log.warning("%s failed", name, exc_info=True)
        tell(f"{name}: ERROR {error}")
    history = base.out / "history.jsonl"
    if verdict is None:  # judge what the broken drill recorded
        verdict = check(history, scenario=SCENARIO, options=SCENARIOS[SCENARIO].check)
        (base.out / "verdict.json").write_text(verdict.to_json() + "\n", encoding="utf-8")
        with contextlib.suppress(OSError):
            write_report(base.out / "report.html", list(iter_history(history)), verdict)
    families = align_families(verdict.faults, fault_families(iter_history(history)))
    return DrillOutcome(name, base.seed, verdict, families, error)


def _skipped_in(history: Path) -> dict[str, str]:
    """family -> reason of the faults a drill recorded as skipped (``fault`` fail)."""
    out: dict[str, str] = {}
    if not history.is_file():
        return out
    for e in iter_history(history):
        if e.f == "fault" and e.type == "fail":
            family, detail = e.value.get("family"), e.value.get("detail")
            if isinstance(family, str):
                out.setdefault(family, str(detail or "skipped"))
    return out


def _write_strip(drill_dir: Path) -> None:
    history = drill_dir / "history.jsonl"
    if history.is_file():
        svg = timeline_strip(list(iter_history(history)), width=900)
        (drill_dir / "strip.svg").write_text(svg + "\n", encoding="utf-8")


# ---- output ------------------------------------------------------------------------------


def _fmt(v: object) -> str:
    return "-" if v is None else str(v)


def table_lines(document: Mapping[str, Any]) -> list[str]:
    """The per-family table as text lines."""
    counts = list(FAILING_COUNTS)
    short = {
        "order_violations": "order",
        "late_delayed": "late",
        "unresolved_transactions": "unres_tx",
        "double_lock_grants": "dbl_lock",
        "offset_rollbacks": "off_rb",
    }
    head = ["family", "faults", "drills", *(short.get(c, c) for c in counts)]
    head += ["write p50/p99/max ms", "read p50/p99/max ms"]
    rows = [head]
    for family, e in document["families"].items():
        w, r = e["write_unavailable_ms"], e["read_unavailable_ms"]
        rows.append(
            [
                family,
                str(e["faults"]),
                str(e["drills"]),
                *(str(e[c]) for c in counts),
                "/".join(_fmt(w[k]) for k in ("p50", "p99", "max")),
                "/".join(_fmt(r[k]) for k in ("p50", "p99", "max")),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]


def _print_table(document: Mapping[str, Any], tell: Callable[[str], None]) -> None:
    for line in table_lines(document):
        tell(line)
    for family, reason in document.get("skipped_families", {}).items():
        tell(f"skipped {family}: {reason}")


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def render_campaign(out: Path, document: Mapping[str, Any]) -> str:
    """``campaign.html``: the per-family table and one timeline strip per drill."""
    ok = bool(document["ok"])
    colour = "#2e7d32" if ok else "#c62828"
    heads = "".join(f"<th>{_esc(c)}</th>" for c in FAILING_COUNTS)
    fam_rows = []
    for family, e in document["families"].items():
        swatch = FAMILY_COLOURS.get(family, "#999")
        cells = "".join(
            f"<td class='n{' bad' if e[c] else ''}'>{e[c]}</td>" for c in FAILING_COUNTS
        )
        windows = "".join(
            f"<td class='n'>{'/'.join(_fmt(e[kind][k]) for k in ('p50', 'p99', 'max'))}"
            f"{' (' + str(e[kind]['unrecovered']) + ' never)' if e[kind]['unrecovered'] else ''}"
            "</td>"
            for kind in ("write_unavailable_ms", "read_unavailable_ms")
        )
        fam_rows.append(
            f"<tr><td><span class='sw' style='background:{swatch}'></span>{_esc(family)}</td>"
            f"<td class='n'>{e['faults']}</td><td class='n'>{e['drills']}</td>{cells}"
            f"{windows}<td class='n'>{e.get('errors', 0)}</td></tr>"
        )
    drill_rows = []
    for d in document.get("drills", []):
        strip_path = out / str(d["drill"]) / "strip.svg"
        strip = strip_path.read_text(encoding="utf-8") if strip_path.is_file() else ""
        status = "OK" if d["ok"] else "FAILED"
        detail = ", ".join(f"{k}={v}" for k, v in d.get("failing_counts", {}).items())
        if d.get("error"):
            detail = f"{detail} error: {d['error']}".strip()
        faults = ", ".join(f"{k} x{v}" for k, v in d.get("faults", {}).items())
        drill_rows.append(
            f"<tr><td><a href='{_esc(d['drill'])}/report.html'>{_esc(d['drill'])}</a><br>"
            f"seed {d['seed']}<br><b class='{'ok' if d['ok'] else 'bad'}'>{status}</b>"
            f"<br><small>{_esc(faults)}</small><br><small>{_esc(detail)}</small></td>"
            f"<td>{strip}</td></tr>"
        )
    skipped = "".join(
        f"<li>{_esc(f)}: {_esc(r)}</li>" for f, r in document.get("skipped_families", {}).items()
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>campaign: {"OK" if ok else "FAILED"}</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; }}
h1 span {{ color: {colour}; }}
table {{ border-collapse: collapse; margin: 8px 0 16px 0; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; vertical-align: top; }}
td.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
td.bad, b.bad {{ color: #c62828; font-weight: bold; }}
b.ok {{ color: #2e7d32; }}
span.sw {{ display: inline-block; width: 10px; height: 10px; margin-right: 6px; }}
</style></head><body>
<h1>campaign: <span>{"OK" if ok else "FAILED"}</span></h1>
<p>{len(document.get("drills", []))} drills, {document.get("faults_per_family")} faults
per family wanted, seed {document.get("seed")}; failing seeds:
{_esc(document.get("failing_seeds") or "none")}.  A drill's counts are attributed to every
family that had a fault in it; windows are each fault's worst (largest group or cluster)
window, p50/p99/max in ms over the family's faults.</p>
<table><tr><th>family</th><th>faults</th><th>drills</th>{heads}
<th>write unavailable ms<br>p50/p99/max</th><th>read unavailable ms<br>p50/p99/max</th>
<th>errors</th></tr>{"".join(fam_rows)}</table>
{f"<p>Skipped families:</p><ul>{skipped}</ul>" if skipped else ""}
<h2>Drills</h2>
<p>Each strip: acknowledged sends per second, failed or unknown sends as red ticks at the
top, and one bar per fault in its target's lane, coloured by family (table above).</p>
<table>{"".join(drill_rows)}</table>
</body></html>
"""


def run_campaign_sync(options: CampaignOptions) -> CampaignResult:
    """Run a campaign from synchronous code.  Ctrl-C or SIGTERM stop it: the drill in
    progress is cleaned up, ``campaign.json`` keeps the drills that finished and
    :class:`CampaignInterrupted` is raised (:func:`resume_command` continues it)."""
    if options.out is None:
        options = replace(options, out=Path(tempfile.mkdtemp(prefix="campaign-")))
    assert options.out is not None
    terminated = False

    async def main() -> CampaignResult:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_sigterm() -> None:
            nonlocal terminated
            terminated = True
            task.cancel()

        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        try:
            return await run_campaign(options)
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGTERM)

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        raise CampaignInterrupted(options.out, "SIGINT") from None
    except asyncio.CancelledError:
        if terminated:
            raise CampaignInterrupted(options.out, "SIGTERM") from None
        raise
