"""Synthetic drill campaigns for the campaign tests on Spark (tests/pipeline): each
drill's history is written with the history writer from a schedule the real generator
drew, with traffic on two groups around the faults and a few planted anomalies, then
judged in-process as ``hactl drill campaign`` judges a drill."""

from __future__ import annotations

import json
import random
from pathlib import Path

from ha_controller.drills.campaign import (
    CAMPAIGN_FILE,
    DrillOutcome,
    align_families,
    campaign_document,
    fault_families,
)
from ha_controller.drills.checker import check
from ha_controller.drills.generator import FAMILIES, ScheduleGenerator
from ha_controller.drills.history import (
    Ack,
    EventType,
    Fault,
    HistoryWriter,
    Receive,
    SendInvoke,
    SendOk,
    SendOutcome,
    Subscribe,
    iter_history,
)
from ha_controller.drills.runner import GENERATED_CHECK, POP_GROUP

T0 = 1_700_000_000_000
GROUPS = ("broker-a", "broker-b")


def write_drill(directory: Path, seed: int) -> None:
    """One synthetic drill: history.jsonl and verdict.json as the campaign writes them."""
    rng = random.Random(seed)
    quota = {f: 1 for f in rng.sample(FAMILIES, 4)}
    schedule = ScheduleGenerator(seed).generate_quota(quota)
    directory.mkdir(parents=True)
    path = directory / "history.jsonl"
    with HistoryWriter(path) as h:
        for cg, topic in (("drill-push", "T"), (POP_GROUP, "P")):
            h.record("c", "info", Subscribe("c", cg, topic), t_ms=T0)
        # faults: (start, end, target) in ms
        down: list[tuple[int, int, str]] = []
        t = T0 + 1_000
        for step in schedule.steps:
            for f in step.faults:
                start = t + int(f.offset_s * 1000)
                end = start + int(f.duration_s * 1000)
                value = Fault(f.kind, f.target, family=f.family)
                h.record("nemesis", "info", value, t_ms=start)
                h.record("nemesis", "ok", Fault(f.kind, f.target, family=f.family), t_ms=end)
                down.append((start, end, f.target))
            t += int((step.span_s + step.gap_s) * 1000)
        end_t = t + 1_000
        n = 0
        offsets = dict.fromkeys(GROUPS, 0)
        for now in range(T0 + 200, end_t, 97):
            group = GROUPS[n % 2]
            key = f"k{n}"
            n += 1
            topic = "P" if n % 5 == 0 else "T"
            cg = POP_GROUP if topic == "P" else "drill-push"
            h.record("p", "invoke", SendInvoke(key, topic), t_ms=now)
            master_down = any(s <= now < e and tg == f"{group}/0" for s, e, tg in down)
            if master_down:
                outcome: EventType = "fail" if rng.random() < 0.5 else "info"
                h.record("p", outcome, SendOutcome(key, "down", group), t_ms=now + 40)
                continue
            qo = offsets[group]
            offsets[group] += 1
            h.record("p", "ok", SendOk(key, f"id{n}", group, 0, qo), t_ms=now + 3)
            if rng.random() < 0.003:  # planted: lost
                continue
            deliveries = 2 if rng.random() < 0.004 else 1  # planted: duplicated
            for d in range(deliveries):
                at = now + 30 + d * 500
                h.record("c", "ok", Receive(key, f"id{n}", group, 0, qo, "c", cg), t_ms=at)
                if cg == POP_GROUP and d == 0 and rng.random() < 0.5:
                    h.record("c", "ok", Ack(key, "c", cg), t_ms=at + 1)
    verdict = check(path, scenario="generated", options=GENERATED_CHECK)
    (directory / "verdict.json").write_text(verdict.to_json() + "\n", encoding="utf-8")


def write_campaign(root: Path, drills: int, seed: int = 5) -> dict[str, object]:
    outcomes = []
    for i in range(drills):
        name = f"drill-{i:03d}"
        write_drill(root / name, seed * 1000 + i)
        history = root / name / "history.jsonl"
        verdict = check(history, scenario="generated", options=GENERATED_CHECK)
        families = align_families(verdict.faults, fault_families(iter_history(history)))
        error = "RuntimeError: planted" if i == 1 else None
        outcomes.append(DrillOutcome(name, seed * 1000 + i, verdict, families, error))
    document = campaign_document(
        outcomes, families=FAMILIES, faults_per_family=1, seed=seed, skipped={}
    )
    (root / CAMPAIGN_FILE).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return document
