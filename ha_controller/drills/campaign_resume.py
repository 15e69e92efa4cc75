"""Resuming a campaign: what ``campaign.json`` recorded, what a run left in ``DIR``,
and the directory lock (the rules: :mod:`ha_controller.drills.campaign`,
"Interruptions").  Nothing here changes a campaign directory except
:func:`move_aside` and :func:`write_atomic`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ha_controller.drills.campaign_options import (
    CAMPAIGN_FILE,
    DEFAULTS,
    DRILL_DIR,
    INTERRUPTED_DIR,
    LOCK_FILE,
    RESUME_FLAGS,
    CampaignError,
    CampaignOptions,
    DrillOutcome,
    drill_index,
)
from ha_controller.drills.campaign_summary import align_families, fault_families
from ha_controller.drills.checker import (
    Verdict,
)
from ha_controller.drills.generator import (
    GeneratorSpec,
    parse_families,
)
from ha_controller.drills.history import iter_history

__all__ = [
    "PreviousRuns",
    "exclusive",
    "load_outcome",
    "move_aside",
    "previous_runs",
    "recorded_options",
    "resumed_options",
    "write_atomic",
]


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
            "faults_per_drill": doc.get("faults_per_drill", DEFAULTS.faults_per_drill),
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
            faults_per_drill=int(rec.get("faults_per_drill", DEFAULTS.faults_per_drill)),
            rate=float(rec.get("rate", DEFAULTS.rate)),
            drain_timeout_s=float(rec.get("drain_timeout_s", DEFAULTS.drain_timeout_s)),
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
class PreviousRuns:
    """What the runs before this one left: the campaign's state at the start of a run."""

    outcomes: list[DrillOutcome] = field(default_factory=list)
    runs: int = 0
    elapsed_s: float = 0.0
    interrupted: list[dict[str, Any]] = field(default_factory=list)
    #: drill directories of drills not recorded as finished (moved aside, run again)
    unfinished: list[str] = field(default_factory=list)
    #: a recorded drill that could not be loaded -> why
    unreadable: dict[str, str] = field(default_factory=dict)


def previous_runs(out: Path, options: CampaignOptions) -> PreviousRuns:
    """Read (never change) the campaign in ``out`` for a resume (module docstring)."""
    doc = _read_record(out)
    resumed_options(recorded_options(out), {k: getattr(options, k) for k in RESUME_FLAGS})
    prev = PreviousRuns(
        runs=int(doc.get("runs") or 1),
        elapsed_s=float(doc.get("elapsed_s") or 0.0),
        interrupted=list(doc.get("interrupted") or ()),
    )
    loaded: set[str] = set()
    for entry in doc.get("drills") or ():
        name = str(entry.get("drill"))
        if not DRILL_DIR.fullmatch(name):
            raise CampaignError(f"{out / CAMPAIGN_FILE}: {name!r} is not a drill of a campaign")
        if name in loaded:
            continue
        try:
            prev.outcomes.append(load_outcome(out / name, entry))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            prev.unreadable[name] = f"{type(exc).__name__}: {exc}"
            continue
        loaded.add(name)
    prev.outcomes.sort(key=lambda o: drill_index(o.drill))
    prev.unfinished = sorted(
        (p.name for p in out.iterdir() if p.is_dir() and DRILL_DIR.fullmatch(p.name)),
        key=drill_index,
    )
    prev.unfinished = [n for n in prev.unfinished if n not in loaded]
    return prev


def move_aside(out: Path, name: str, run: int) -> Path:
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
def exclusive(out: Path) -> Iterator[None]:
    """Hold ``out/.campaign.lock`` (one campaign per directory; a killed holder's lock
    goes with it)."""
    path = out / LOCK_FILE
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


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` whole: a kill in the middle leaves the old or the new file."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)
