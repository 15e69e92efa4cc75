"""Turn a results dict into a markdown table (absolute figures and ratios) and a PNG chart."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

OURS = "ha-controller"
OURS_SDK = "ha-controller (official SDK)"
ROCKETMQ = "RocketMQ"
ROCKETMQ_CTL = "RocketMQ controller"
#: ours in controller mode (one group of three, etcd): the failover and switch trials
OURS_CTL = "ha-controller controller"
KAFKA = "Kafka"
RABBIT = "RabbitMQ"
NATS = "NATS JetStream"
#: the same-client rows: ours through the official SDK against RocketMQ through it
SAME_CLIENT = {ROCKETMQ: OURS_SDK, ROCKETMQ_CTL: OURS_SDK}

# (workload, key in each run, name in the summary, label, higher is better)
METRICS: list[tuple[str, str, str, str, bool]] = [
    ("throughput", "produce_msgs_s", "produce_msgs_s", "produce msgs/s (durable, acked)", True),
    ("throughput", "produce_mb_s", "produce_mb_s", "produce MB/s", True),
    ("throughput", "consume_msgs_s", "consume_msgs_s", "consume msgs/s", True),
    ("throughput", "consume_mb_s", "consume_mb_s", "consume MB/s", True),
    ("latency", "p50_ms", "p50_ms", "e2e latency p50 ms", False),
    ("latency", "p99_ms", "p99_ms", "e2e latency p99 ms", False),
    ("latency", "p999_ms", "p999_ms", "e2e latency p999 ms", False),
    ("failover", "next_send_s", "next_send_s", "failover (kill -9): next successful send s", False),
    (
        "failover",
        "next_receive_s",
        "next_receive_s",
        "failover (kill -9): next successful receive s",
        False,
    ),
    ("pause", "next_send_s", "pause_next_send_s", "pause (SIGSTOP): next successful send s", False),
    (
        "pause",
        "next_receive_s",
        "pause_next_receive_s",
        "pause (SIGSTOP): next successful receive s",
        False,
    ),
    ("pause", "max_send_s", "pause_max_send_s", "pause (SIGSTOP): longest send after it s", False),
    (
        "switch",
        "unavailable_s",
        "switch_unavailable_s",
        "planned switch (hactl group switch): writes unavailable s",
        False,
    ),
    ("rss", "max_mib", "rss_max_mib", "peak RSS, largest server process MiB", False),
    ("rss", "total_mib", "rss_total_mib", "peak RSS, all server processes MiB", False),
]


def rss_summary(peaks: dict[str, dict[str, int]]) -> dict[str, float]:
    """Largest and summed VmHWM (MiB) of a system's server processes."""
    kib = [p["kib"] for p in peaks.values()]
    if not kib:
        return {"max_mib": math.nan, "total_mib": math.nan}
    return {"max_mib": max(kib) / 1024, "total_mib": sum(kib) / 1024}


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    values = [
        r[key] for r in runs if isinstance(r.get(key), int | float) and not math.isnan(r[key])
    ]
    return statistics.median(values) if values else math.nan


def summary(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """system -> metric key -> median over rounds."""
    out: dict[str, dict[str, float]] = {}
    for system, per in results["systems"].items():
        if per.get("unavailable"):
            continue
        row: dict[str, float] = {}
        runs = {**per, "rss": [rss_summary(per.get("peak_rss", {}))]}
        for workload, key, name, _, _ in METRICS:
            row[name] = median_of(runs.get(workload, []), key)
        row["acting_slave_read_s"] = median_of(per.get("failover", []), "acting_slave_read_s")
        row["pause_acting_slave_read_s"] = median_of(per.get("pause", []), "acting_slave_read_s")
        row["not_active_timeout_s"] = median_of(per.get("pause", []), "not_active_timeout_s")
        out[system] = row
    return out


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if value >= 0.1 else f"{value:.3f}"


def pairs(stats: dict[str, Any]) -> list[tuple[str, str]]:
    """(ours, peer) for each ratio: RocketMQ's rows against ours through the same
    official SDK, every other peer against ours through our own SDK."""
    out = []
    for peer in stats:
        mine = SAME_CLIENT.get(peer, OURS)
        if peer not in (OURS, OURS_SDK, OURS_CTL) and mine in stats:
            out.append((mine, peer))
    return out


def ratios(results: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """peer -> metric name -> ours / peer (None when either is missing); for RocketMQ,
    ours is ha-controller through the same official SDK."""
    stats = summary(results)
    out: dict[str, dict[str, float | None]] = {}
    for mine, peer in pairs(stats):
        out[peer] = {}
        for _, _, name, _, _ in METRICS:
            a, b = stats[mine].get(name, math.nan), stats[peer].get(name, math.nan)
            ok = not (math.isnan(a) or math.isnan(b)) and b != 0
            out[peer][name] = a / b if ok else None
    return out


def markdown(results: dict[str, Any]) -> str:
    stats = summary(results)
    systems = list(stats)
    ratio_pairs = pairs(stats)
    short = {OURS: "ours", OURS_SDK: "ours (SDK)"}
    head = ["metric", *systems, *(f"{short[m]} / {p}" for m, p in ratio_pairs)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, _, key, label, higher in METRICS:
        cells = [label + (" (higher better)" if higher else " (lower better)")]
        cells += [_fmt(stats[s][key]) for s in systems]
        for mine, peer in ratio_pairs:
            ours, theirs = stats[mine][key], stats[peer][key]
            ratio = ours / theirs if theirs and not math.isnan(theirs) else math.nan
            cells.append("n/a" if math.isnan(ratio) else f"{ratio:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    acting = stats.get(OURS, {}).get("acting_slave_read_s", math.nan)
    notes = []
    if not math.isnan(acting):
        notes.append(
            f"- ha-controller: the killed master's group served reads again through its "
            f"acting slave after {_fmt(acting)} s."
        )
    paused = stats.get(OURS, {}).get("pause_acting_slave_read_s", math.nan)
    if not math.isnan(paused):
        limit = stats[OURS]["not_active_timeout_s"]
        notes.append(
            f"- ha-controller: the frozen master's group served reads again through its "
            f"acting slave after {_fmt(paused)} s (not-active timeout {_fmt(limit)} s; "
            f"goal: within {_fmt(limit + 0.3)} s)."
        )
    for trial_kind, what in (("failover", "kill -9"), ("pause", "SIGSTOP"), ("switch", "switch")):
        for trial in results["systems"].get(OURS_CTL, {}).get(trial_kind, []):
            settings = ", ".join(f"{k} {v}" for k, v in trial.get("settings", {}).items())
            notes.append(
                f"- {OURS_CTL}, {what}: next send to the same group's queues "
                f"{_fmt(trial['next_send_s'])} s, writes unavailable "
                f"{_fmt(trial.get('unavailable_s', math.nan))} s at "
                f"{trial['rate']:.0f} msg/s; {trial.get('acknowledged', 0)} acknowledged, "
                f"lost {trial.get('lost', 'n/a')}, duplicated {trial.get('duplicated', 'n/a')}"
                + (f" ({settings})" if settings else "")
                + "."
            )
    for system, per in results["systems"].items():
        for trial in per.get("pause", []):
            missing = [k for k in ("next_send_s", "next_receive_s") if math.isnan(trial[k])]
            if missing:
                notes.append(
                    f"- {system}, pause trial: no {' and no '.join(m[5:-2] for m in missing)} "
                    f"within {trial['limit_s']:.0f} s of the SIGSTOP ({trial['send_errors']} "
                    f"sends failed meanwhile)."
                )
        peaks = per.get("peak_rss") or {}
        if peaks:
            listed = ", ".join(
                f"{name} {p['kib'] / 1024:.0f}"
                + (f" ({p['processes']} procs)" if p["processes"] > 1 else "")
                for name, p in sorted(peaks.items())
            )
            notes.append(f"- {system} peak RSS per server process (MiB, VmHWM): {listed}.")
    for system, per in results["systems"].items():
        if per.get("unavailable"):
            notes.append(f"- **{system}: unavailable** — {per['unavailable']}")
        elif per.get("notes"):
            notes.extend(f"- {system}: {n}" for n in per["notes"])
    return "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else "") + "\n"


def chart(results: dict[str, Any], path: Path) -> str | None:
    """Three panels: throughput, latency percentiles, failover; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"matplotlib not installed ({exc})"
    stats = summary(results)
    systems = list(stats)
    colours = {
        OURS: "#2a7ab9",
        OURS_SDK: "#7fb3dc",
        OURS_CTL: "#1b4f72",
        ROCKETMQ: "#c0392b",
        ROCKETMQ_CTL: "#e6a0a0",
        KAFKA: "#555555",
        RABBIT: "#f28c28",
        NATS: "#3aa655",
    }
    panels = [
        ("Throughput (msgs/s, higher is better)", ["produce_msgs_s", "consume_msgs_s"]),
        ("End-to-end latency (ms, lower is better)", ["p50_ms", "p99_ms", "p999_ms"]),
        (
            "Failover: kill -9 and SIGSTOP (s, lower is better)",
            ["next_send_s", "next_receive_s", "pause_next_send_s", "pause_next_receive_s"],
        ),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    for ax, (title, keys) in zip(axes, panels, strict=True):
        width = 0.8 / max(1, len(systems))
        for i, system in enumerate(systems):
            xs = [k + i * width for k in range(len(keys))]
            ys = [0 if math.isnan(stats[system][k]) else stats[system][k] for k in keys]
            bars = ax.bar(xs, ys, width, label=system, color=colours.get(system))
            ax.bar_label(bars, labels=[_fmt(stats[system][k]) for k in keys], fontsize=7)
        ax.set_xticks([k + width * (len(systems) - 1) / 2 for k in range(len(keys))])
        ax.set_xticklabels([k.replace("_", " ") for k in keys], fontsize=8)
        ax.set_title(title, fontsize=10)
        if "latency" in title:
            ax.set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(results["meta"]["title"], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
