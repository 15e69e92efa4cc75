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

This module plans and runs; the parts it re-exports live beside it: the options,
errors and outcomes (:mod:`~ha_controller.drills.campaign_options`), the summary
(:mod:`~ha_controller.drills.campaign_summary`), resuming
(:mod:`~ha_controller.drills.campaign_resume`) and the table and page
(:mod:`~ha_controller.drills.campaign_report`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ha_controller.drills.campaign_options import (
    CAMPAIGN_FILE,
    INTERRUPTED_DIR,
    RESUME_FLAGS,
    SCENARIO,
    WINDOW_KEYS,
    CampaignError,
    CampaignInterrupted,
    CampaignOptions,
    CampaignResult,
    DrillOutcome,
    drill_index,
    drill_name,
    resume_command,
)
from ha_controller.drills.campaign_report import print_table, render_campaign, table_lines
from ha_controller.drills.campaign_resume import (
    PreviousRuns,
    exclusive,
    load_outcome,
    move_aside,
    previous_runs,
    recorded_options,
    resumed_options,
    write_atomic,
)
from ha_controller.drills.campaign_summary import (
    align_families,
    campaign_document,
    family_summary,
    fault_families,
)
from ha_controller.drills.checker import (
    FAILING_COUNTS,
    Verdict,
    check,
)
from ha_controller.drills.generator import (
    FAMILIES,
    Schedule,
    ScheduleGenerator,
)
from ha_controller.drills.history import iter_history
from ha_controller.drills.leftovers import cleanup_stale
from ha_controller.drills.needs import refusal, unavailable_families
from ha_controller.drills.report import timeline_strip, write_report

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
    "table_lines",
    "unavailable_families",
]

log = logging.getLogger(__name__)


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
        self.outcomes.sort(key=lambda o: drill_index(o.drill))
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
    with exclusive(out):
        return await _run_locked(options, out, say)


async def _run_locked(
    options: CampaignOptions, out: Path, say: Callable[[str], None] | None
) -> CampaignResult:
    from ha_controller.drills.runner import DrillOptions, generator_spec, run_drill

    prev = previous_runs(out, options) if options.resume else PreviousRuns()
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
        dest = move_aside(out, name, prev.runs)
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
        write_atomic(out / CAMPAIGN_FILE, json.dumps(result.document, indent=2) + "\n")
        write_atomic(out / "campaign.html", render_campaign(out, result.document))

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
    print_table(result.document, tell)
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
