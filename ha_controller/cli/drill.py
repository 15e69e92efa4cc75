"""``hactl drill`` and ``hactl analyze``: run a failover drill or a campaign of generated
drills, judge a drill's (or a whole campaign's) histories with PySpark.

Dependencies point one way: this module imports :mod:`ha_controller.drills` (the runner,
its scenarios and their checker options) and :mod:`ha_controller.pipeline`; neither
imports the CLI, and the drills never import the pipeline.  Both are imported when a
command runs, so ``hactl --help`` loads neither the runner nor pyspark.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ha_controller.cli.common import add_parser, float_above, int_range

if TYPE_CHECKING:
    from ha_controller.drills.campaign import CampaignOptions
    from ha_controller.drills.checker import CheckOptions

__all__ = ["SCENARIO_NAMES", "add_commands", "cmd_analyze", "cmd_drill", "scenario_options"]

#: Scenario names for ``--help`` (the runner's SCENARIOS is the source of truth).
SCENARIO_NAMES = (
    "kill-master",
    "pause-master",
    "partition-master",
    "loss-master",
    "kill-slave",
    "pause-nameserver",
    "master-return",
    "kill-after-ack",
    "delayed-acting",
    "transactions-acting",
    "pop-acting",
    "strict-lock",
    "generated",
)


def add_commands(sub: Any) -> None:
    """Add ``drill`` and ``analyze`` to the ``hactl`` sub-parsers."""
    dr = add_parser(
        sub,
        "drill",
        help="run a failover drill and judge its history (exit 0 only when ok)",
        description="Start a cluster, run workloads, inject faults, heal, drain and check. "
        "Writes DIR/history.jsonl, DIR/verdict.json, DIR/report.html and DIR/logs/.  "
        "'hactl drill campaign --faults N' runs generated drills (one cluster each) until "
        "every fault family had N faults and writes DIR/<drill>/... for each, "
        "DIR/campaign.json and DIR/campaign.html; it exits 0 only when the campaign is ok, 1 "
        "when it is not, 2 when it cannot start (or resume) as asked, 130/143 when Ctrl-C/"
        "SIGTERM stopped it (its last line is then the command that continues it: "
        "'hactl drill campaign --resume --out DIR').",
    )
    dr.add_argument(
        "scenario",
        metavar="SCENARIO",
        help="one of: " + ", ".join(SCENARIO_NAMES) + "; or 'campaign': generated drills "
        "until --faults faults of every family were injected (DIR/campaign.json)",
    )
    dr.add_argument(
        "--duration", type=float_above(0), default=60.0, metavar="S", help="seconds of faults"
    )
    dr.add_argument(
        "--seed", type=int, default=0, action=_Given, help="seed for fault timing jitter"
    )
    dr.add_argument("--out", type=Path, help="output directory (default: a new temp dir)")
    dr.add_argument(
        "--netns",
        action="store_true",
        help="run every process in its own network namespace (root; needed for partitions)",
    )
    dr.add_argument("--repeat", type=int_range(1), default=1, help="run N times (DIR/run-1 ...)")
    dr.add_argument("--replication", choices=("sync", "async"), default="sync")
    dr.add_argument(
        "--skip-pre-online",
        action="store_true",
        help="brokers skip pre-online (a returning master keeps its stale metadata)",
    )
    dr.add_argument(
        "--rate",
        type=float_above(0),
        metavar="MSGS_PER_S",
        action=_Given,
        help="messages per second of the main producer (default 100; campaign: 30)",
    )
    dr.add_argument(
        "--fault-seconds",
        type=float_above(0),
        default=8.0,
        metavar="S",
        help="how long a fault lasts",
    )
    dr.add_argument(
        "--drain-timeout",
        type=float_above(0),
        default=30.0,
        action=_Given,
        metavar="S",
        help="seconds to drain",
    )
    dr.add_argument("--no-fifo", action="store_true", help="skip the FIFO workload")
    dr.add_argument(
        "--send-attempts",
        type=int_range(1),
        default=1,
        help="attempts per send (default 1: every outcome recorded; the client's 3 retries "
        "an unknown outcome on another group, which can duplicate)",
    )
    dr.add_argument(
        "--no-strict",
        action="store_true",
        help="strict-lock: brokers lock queues without strict mode (documents the double "
        "grant risk; the verdict is expected to fail)",
    )
    dr.add_argument(
        "--faults",
        type=int_range(1),
        action=_Given,
        metavar="N",
        help="campaign: faults to inject per family (required); generated: faults in the "
        "schedule (default 8)",
    )
    dr.add_argument(
        "--families",
        action=_Given,
        metavar="F,F",
        help="campaign/generated: fault families (default: every one this machine can "
        "fault; families given here must all run, else exit 2): kill,pause,"
        "pause-past-expiry,partition,loss (--netns),disk-full (root),slave,nameserver,"
        "power-loss (root, /dev/fuse, make tools),corruption,clock (make tools); controller "
        "mode (etcd, make tools): controller-kill,controller-leader-kill,controller-isolate "
        "(--netns),controller-slave-behind,etcd-down,controller-flap",
    )
    dr.add_argument(
        "--flush-mode",
        choices=("sync", "async"),
        action=_Given,
        help="the brokers' store flush mode (default: the broker's, async): sync syncs "
        "before every acknowledgement, so a power loss loses nothing acknowledged; async "
        "syncs every flush interval and a power loss of a whole group may lose what was "
        "acknowledged in that interval (reported as unsynced_lost)",
    )
    dr.add_argument(
        "--faults-per-drill",
        type=int_range(1),
        default=8,
        action=_Given,
        metavar="K",
        help="campaign: faults in each drill's generated schedule (one cluster per drill)",
    )
    dr.add_argument(
        "--max-drills",
        type=int_range(1),
        action=_Given,
        metavar="N",
        help="campaign: stop after N drills (default: 4x what the quota needs)",
    )
    dr.add_argument(
        "--resume",
        action="store_true",
        help="campaign: continue the campaign recorded in --out DIR (DIR/campaign.json) after "
        "an interruption (Ctrl-C, SIGTERM, kill -9, a lost session): finished drills are "
        "kept, one cut short is moved to DIR/interrupted/ and run again, and the drills go "
        "on until every family has its faults.  The parameters (--faults, --families, "
        "--seed, --netns, --faults-per-drill, --rate, --drain-timeout) come from "
        "campaign.json; a flag that contradicts them is refused, except --faults, which may "
        "be raised to extend the campaign, and --max-drills",
    )
    dr.add_argument(
        "--schedule",
        type=Path,
        metavar="FILE",
        help="generated: run this schedule.json (a campaign drill's, to reproduce it)",
    )
    dr.add_argument("-v", "--verbose", action="store_true", help="log client warnings")
    dr.set_defaults(func=cmd_drill, given=())

    an = add_parser(
        sub,
        "analyze",
        help="compute DIR/verdict.spark.json (or a campaign's campaign.spark.json) with PySpark",
        description="Judge DIR/history*.jsonl on Spark as the drill judged it (read from "
        "the Parquet copy the drill wrote beside each file, history*.parquet, while it is "
        "current; from the JSON lines otherwise), write "
        "DIR/verdict.spark.json and compare it whole with DIR/verdict.json.  On a campaign "
        "directory (DIR/campaign.json) every drill is judged in one Spark job and "
        "DIR/campaign.spark.json is written and compared with campaign.json.  Exit 0 only "
        "when the verdict (campaign) is ok and equals the recorded one.  Spark logs only "
        "errors (log4j at ERROR).  In local mode the driver JVM runs the serial garbage "
        "collector unless spark-defaults.conf sets spark.driver.extraJavaOptions.",
    )
    an.add_argument("dir", type=Path, metavar="DIR", help="a drill or campaign output directory")
    an.add_argument("--master", help="Spark master URL or sc:// address (default local[*])")
    an.add_argument("--scenario", help="scenario name (default: from DIR/verdict.json)")
    an.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    an.set_defaults(func=cmd_analyze)


class _Given(argparse.Action):
    """``store``, and the option's name in ``namespace.given``: ``--resume`` compares the
    flags that were given (not their defaults) with the campaign's recorded ones."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        namespace.given = (*getattr(namespace, "given", ()), self.dest)


def cmd_drill(args: argparse.Namespace) -> int:
    from ha_controller.drills.runner import SCENARIOS

    logging.basicConfig(
        level=logging.WARNING if args.verbose else logging.CRITICAL,
        format="    (%(name)s: %(message)s)",
    )
    if args.scenario == "campaign":
        return cmd_campaign(args)
    if args.resume:
        print(
            "hactl drill: --resume continues a campaign ('hactl drill campaign')", file=sys.stderr
        )
        return 2
    if args.scenario not in SCENARIOS:
        print(
            f"hactl drill: unknown scenario {args.scenario!r}; known: {', '.join(SCENARIOS)}",
            file=sys.stderr,
        )
        return 2
    if args.repeat < 1:
        print("hactl drill: --repeat must be >= 1", file=sys.stderr)
        return 2
    from ha_controller.drills.cluster import FaultUnsupported

    try:
        return _run_drills(args)
    except FaultUnsupported as exc:  # asked for what this machine cannot do
        print(f"hactl drill {args.scenario}: {exc}", file=sys.stderr)
        return 2


def _run_drills(args: argparse.Namespace) -> int:
    from ha_controller.drills.runner import DrillOptions, run_drill_sync

    all_ok = True
    for i in range(args.repeat):
        out = args.out
        if out is not None and args.repeat > 1:
            out = out / f"run-{i + 1}"
        options = DrillOptions(
            scenario=args.scenario,
            duration_s=args.duration,
            seed=args.seed + i,
            out=out,
            netns=args.netns,
            replication=args.replication,
            skip_pre_online=args.skip_pre_online,
            rate=args.rate or 100.0,
            fault_s=args.fault_seconds,
            drain_timeout_s=args.drain_timeout,
            fifo=not args.no_fifo,
            send_attempts=args.send_attempts,
            strict_locks=not args.no_strict,
            flush_mode=args.flush_mode,
            **_generated_options(args),
        )
        result = run_drill_sync(options)
        all_ok = all_ok and result.ok
    return 0 if all_ok else 1


def _generated_options(args: argparse.Namespace) -> dict[str, Any]:
    """DrillOptions fields of the ``generated`` scenario from the command line."""
    out: dict[str, Any] = {}
    if args.families:
        from ha_controller.drills.generator import parse_families

        out["families"] = parse_families(args.families)
    if args.faults is not None:
        out["faults"] = args.faults
    if args.schedule is not None:
        from ha_controller.drills.generator import Schedule

        out["schedule"] = Schedule.from_dict(json.loads(args.schedule.read_text(encoding="utf-8")))
    return out


def cmd_campaign(args: argparse.Namespace) -> int:
    """``hactl drill campaign --faults N ...`` (or ``--resume --out DIR``): exit 0 only
    when the campaign is ok; 2 when it cannot start or resume as asked; 128 + the signal
    when Ctrl-C or SIGTERM stopped it (the last line says how to resume)."""
    from ha_controller.drills.campaign import (
        CampaignError,
        CampaignInterrupted,
        resume_command,
        run_campaign_sync,
    )

    try:
        options = _campaign_options(args)
        return 0 if run_campaign_sync(options).ok else 1
    except CampaignError as exc:
        print(f"hactl drill campaign: {exc}", file=sys.stderr)
        return 2
    except CampaignInterrupted as exc:
        print(
            f"campaign interrupted ({exc.signal_name}): {exc.out / 'campaign.json'} keeps the "
            "drills that finished",
            flush=True,
        )
        print(f"resume with: {resume_command(exc.out)}", flush=True)
        return exc.exit_code


def _campaign_options(args: argparse.Namespace) -> CampaignOptions:
    """The campaign the command line asks for (CampaignError when it cannot be)."""
    from ha_controller.drills.campaign import (
        CampaignError,
        CampaignOptions,
        recorded_options,
        resumed_options,
    )
    from ha_controller.drills.generator import DEFAULT_FAMILIES, parse_families

    try:
        families = parse_families(args.families) if args.families else DEFAULT_FAMILIES
    except ValueError as exc:
        raise CampaignError(str(exc)) from exc
    if args.resume:
        if args.out is None:
            raise CampaignError("--resume needs the campaign's directory: --out DIR")
        options = resumed_options(recorded_options(args.out), _campaign_given(args, families))
        return replace(options, verbose=args.verbose)
    if args.faults is None:
        raise CampaignError("--faults N is required")
    return CampaignOptions(
        faults=args.faults,
        families=families,
        seed=args.seed,
        out=args.out,
        netns=args.netns,
        faults_per_drill=args.faults_per_drill,
        rate=args.rate or 30.0,
        drain_timeout_s=args.drain_timeout,
        max_drills=args.max_drills,
        verbose=args.verbose,
        families_asked=bool(args.families),
        flush_mode=args.flush_mode,
    )


def _campaign_given(args: argparse.Namespace, families: tuple[str, ...]) -> dict[str, Any]:
    """The campaign options given on the command line (not defaulted), by option name."""
    dests = {
        "faults": "faults",
        "families": "families",
        "seed": "seed",
        "faults_per_drill": "faults_per_drill",
        "rate": "rate",
        "drain_timeout": "drain_timeout_s",
        "max_drills": "max_drills",
        "flush_mode": "flush_mode",
    }
    given: dict[str, Any] = {
        dests[d]: getattr(args, d)
        for d in args.given
        if d in dests and getattr(args, d) is not None
    }
    if "families" in given:
        given["families"] = families
    if args.netns:
        given["netns"] = True
    return given


def cmd_analyze(args: argparse.Namespace) -> int:
    """Judge ``DIR`` on Spark (``DIR/verdict.spark.json``) as the drill judged it: with the
    scenario's checker options (e.g. ``pop-acting``'s ``redelivery="after_ack"``)."""
    directory: Path = args.dir
    if (directory / "campaign.json").is_file():
        return _analyze_campaign(args)
    history = directory / "history.jsonl"
    if not history.is_file():
        print(f"hactl analyze: {history} not found", file=sys.stderr)
        return 2
    scenario = args.scenario
    local = directory / "verdict.json"
    if scenario is None and local.is_file():
        scenario = json.loads(local.read_text(encoding="utf-8")).get("scenario")
    scenario = scenario or directory.name
    options = scenario_options(scenario)
    started = time.monotonic()

    def judge(spark: Any) -> Any:
        from ha_controller.pipeline.verdict import compute_dir_verdict

        return compute_dir_verdict(spark, directory, scenario=scenario, options=options)

    try:
        verdict = _on_spark(args, f"analyze {directory}", "judging the history", judge)
    except _NoSpark:
        return 2
    print(f"analyzed in {time.monotonic() - started:.1f} s", file=sys.stderr)
    print(verdict.to_json())
    differ: list[str] = []
    if local.is_file():
        from ha_controller.drills.checker import Verdict

        recorded = Verdict.from_dict(json.loads(local.read_text(encoding="utf-8")))
        differ = verdict.mismatches(recorded)
        _print_mismatches(differ, local)
    return 0 if verdict.ok and not differ else 1


class _NoSpark(Exception):
    """The pipeline could not be imported (said on stderr already)."""


def _on_spark(args: argparse.Namespace, title: str, step: str, job: Callable[[Any], Any]) -> Any:
    """Run ``job(spark)`` in a local Spark session with a progress line, and stop it."""
    from ha_controller.cli.progress import reporter

    bar = reporter(
        f"{title} on {args.master or 'local[*]'}",
        unit="",
        enabled=not args.no_progress,
        interval_s=10,
    )
    try:
        try:
            from ha_controller.pipeline.session import build_session
        except ImportError as exc:
            print(f"hactl analyze: the pipeline needs pyspark ({exc})", file=sys.stderr)
            raise _NoSpark from exc
        bar.update(0, "starting Spark")
        spark = build_session(args.master, log_level="ERROR")
        try:
            bar.update(0, step)
            try:
                result = job(spark)
            except ImportError as exc:
                print(f"hactl analyze: the pipeline needs pyspark ({exc})", file=sys.stderr)
                raise _NoSpark from exc
        finally:
            spark.stop()
        bar.update(0, "done")
        return result
    finally:
        bar.close()


def _print_mismatches(differ: list[str], recorded: Path, what: str = "verdict") -> None:
    if not differ:
        print(f"{what} equals {recorded} (counts, faults, windows, availability)", file=sys.stderr)
        return
    print(f"{what} DIFFERS from {recorded} (Spark != recorded):", file=sys.stderr)
    for line in differ[:50]:
        print(f"  {line}", file=sys.stderr)
    if len(differ) > 50:
        print(f"  ... {len(differ) - 50} more", file=sys.stderr)


def _analyze_campaign(args: argparse.Namespace) -> int:
    """``hactl analyze DIR`` on a campaign: every drill in one Spark job."""
    directory: Path = args.dir
    started = time.monotonic()

    def judge(spark: Any) -> Any:
        from ha_controller.pipeline.campaign import analyze_campaign

        return analyze_campaign(spark, directory, options_for=scenario_options)

    try:
        result = _on_spark(args, f"analyze campaign {directory}", "judging every drill", judge)
    except _NoSpark:
        return 2
    from ha_controller.drills.campaign import table_lines
    from ha_controller.pipeline.campaign import SPARK_FILE

    print(
        f"analyzed {len(result.verdicts)} drills in {time.monotonic() - started:.1f} s",
        file=sys.stderr,
    )
    for line in table_lines(result.document):
        print(line)
    print(f"campaign {'OK' if result.ok else 'FAILED'}: {directory / SPARK_FILE}")
    _print_mismatches(
        result.mismatches,
        directory / "campaign.json",
        "the Spark summary (and every drill's verdict)",
    )
    return 0 if result.ok and not result.mismatches else 1


def scenario_options(scenario: str) -> CheckOptions | None:
    """The checker options the drill runner judges ``scenario`` with (None: unknown
    scenario, the defaults)."""
    from ha_controller.drills.runner import SCENARIOS

    known = SCENARIOS.get(scenario)
    return known.check if known is not None else None
