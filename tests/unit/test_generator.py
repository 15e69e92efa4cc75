"""The schedule generator as a plain object: determinism, coverage and its rules."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict

import pytest

from ha_controller.drills.generator import (
    CLUSTER,
    CONTROLLER_FAMILIES,
    CORRUPTIONS,
    ETCD_MEMBERS,
    FAMILIES,
    FLAP_KILLS,
    GeneratorSpec,
    PlannedFault,
    Schedule,
    ScheduleGenerator,
    parse_families,
    power_scope,
    target_group_of,
)

SEEDS = range(200)
TIMEOUT_S = GeneratorSpec().not_active_timeout_ms / 1000
#: the families that overlap each other (controller families run their steps alone)
RIP32_FAMILIES = tuple(f for f in FAMILIES if f not in CONTROLLER_FAMILIES)


def held(f: PlannedFault) -> str:
    """What a fault holds: a group, ``nameserver``, or everything (``*``)."""
    if f.family == "power-loss" and power_scope(f.target) != "broker":
        return "*" if f.target == CLUSTER else f.target
    return target_group_of(f.target) or "nameserver"


def every_family(seed: int, per_family: int = 3) -> Schedule:
    return ScheduleGenerator(seed).generate_quota(dict.fromkeys(FAMILIES, per_family))


def rip32_families(seed: int, per_family: int = 3) -> Schedule:
    return ScheduleGenerator(seed).generate_quota(dict.fromkeys(RIP32_FAMILIES, per_family))


def test_same_seed_same_schedule() -> None:
    for seed in (0, 1, 42, 2**31 - 1):
        a = every_family(seed)
        b = every_family(seed)
        assert a == b
        assert a.to_json() == b.to_json()
        assert ScheduleGenerator(seed).generate(FAMILIES, 11) == ScheduleGenerator(seed).generate(
            FAMILIES, 11
        )


def test_different_seeds_differ() -> None:
    schedules = {every_family(seed).to_json() for seed in range(20)}
    assert len(schedules) == 20


def test_json_round_trip() -> None:
    schedule = every_family(7)
    again = Schedule.from_dict(json.loads(schedule.to_json()))
    assert again == schedule


@pytest.mark.parametrize("seed", range(20))
def test_quota_is_exact(seed: int) -> None:
    quota = {"kill": 2, "pause": 1, "partition": 3, "nameserver": 2, "disk-full": 1}
    schedule = ScheduleGenerator(seed).generate_quota(quota)
    assert schedule.family_counts() == Counter(quota)
    assert schedule.families == tuple(f for f in FAMILIES if f in quota)


def test_generate_spreads_faults_over_families() -> None:
    for seed in range(30):
        counts = ScheduleGenerator(seed).generate(FAMILIES, 2 * len(FAMILIES)).family_counts()
        assert counts == Counter(dict.fromkeys(FAMILIES, 2))
        uneven = ScheduleGenerator(seed).generate(("kill", "slave", "loss"), 7).family_counts()
        assert sorted(uneven.values()) == [2, 2, 3]


def test_every_family_covered_and_shaped() -> None:
    """Each family gets its kind of fault on its kind of target."""
    seen: dict[str, set[str]] = defaultdict(set)
    for seed in SEEDS:
        for f in every_family(seed).faults():
            seen[f.family].add(f.kind)
            check_shape(f)
    assert set(seen) == set(FAMILIES)
    assert seen["kill"] == {"kill"}
    assert seen["pause"] == seen["pause-past-expiry"] == {"pause"}
    assert seen["partition"] == {"partition"}
    assert seen["loss"] == {"netem"}
    assert seen["disk-full"] == {"disk"}
    assert seen["slave"] == seen["nameserver"] == {"kill", "pause"}
    assert (seen["power-loss"], seen["corruption"], seen["clock"]) == (
        {"power"},
        {"corrupt"},
        {"clock"},
    )
    assert seen["controller-kill"] == seen["controller-leader-kill"] == {"kill"}
    assert seen["controller-flap"] == {"kill"}
    assert seen["controller-isolate"] == {"isolate"}
    assert seen["controller-slave-behind"] == {"pause", "kill"}
    assert seen["etcd-down"] == {"etcd", "kill"}


def test_new_families_cover_their_variants() -> None:
    scopes: Counter[str] = Counter()
    variants: Counter[tuple[str, bool]] = Counter()
    clock_targets: Counter[str] = Counter()
    steps: list[float] = []
    for seed in SEEDS:
        for f in every_family(seed).faults():
            if f.family == "power-loss":
                scopes[power_scope(f.target)] += 1
            elif f.family == "corruption":
                variants[(f.variant, f.stopped)] += 1
            elif f.family == "clock":
                kind = "nameserver" if target_group_of(f.target) is None else f.target[-1]
                clock_targets["master" if kind == "0" else kind] += 1
                steps.append(f.clock_step_s)
    assert set(scopes) == {"broker", "group", "cluster"}
    assert set(variants) == {(v, stopped) for v in CORRUPTIONS for stopped in (True, False)}
    assert {"nameserver", "master", "1", "2"} == set(clock_targets)
    assert min(steps) <= -10 and max(steps) >= 10
    assert all(10 <= abs(s) <= 60 for s in steps)


def check_shape(f: PlannedFault) -> None:
    group = target_group_of(f.target)
    if f.family in CONTROLLER_FAMILIES:
        return  # test_controller_steps
    if f.family == "nameserver":
        assert f.target in ("nameserver", "nameserver-1")
        return
    if f.family == "power-loss":
        assert f.target == CLUSTER or f.target in GeneratorSpec().groups or group is not None
        return
    if f.family == "clock":
        assert f.target == "nameserver" or group is not None
        assert f.clock_step_s != 0
        return
    assert group in GeneratorSpec().groups
    bid = int(f.target.rpartition("/")[2])
    if f.family == "slave":
        assert bid in (1, 2)
    elif f.family not in ("disk-full", "corruption"):
        assert bid == 0
    if f.family == "pause":
        assert 0 < f.duration_s < 0.6 * TIMEOUT_S, f  # well below the not-active timeout
    if f.family == "pause-past-expiry":
        assert f.duration_s >= 1.5 * TIMEOUT_S, f
    if f.family == "loss":
        assert 20 <= f.loss_pct <= 40
    else:
        assert f.loss_pct == 0
    if f.family != "partition":
        assert f.direction == "both"


def test_one_way_partitions_and_disk_on_slaves_occur() -> None:
    directions: Counter[str] = Counter()
    disk_targets: Counter[str] = Counter()
    for seed in SEEDS:
        for f in every_family(seed).faults():
            if f.family == "partition":
                directions[f.direction] += 1
            if f.family == "disk-full":
                disk_targets["master" if f.target.endswith("/0") else "slave"] += 1
    assert set(directions) == {"both", "in", "out"}
    assert directions["both"] > directions["in"] + directions["out"] > 0
    assert disk_targets["master"] > disk_targets["slave"] > 0


def test_no_overlap_on_one_target_or_group_and_never_both_nameservers() -> None:
    overlapped = 0
    for seed in SEEDS:
        schedule = rip32_families(seed)
        for step in schedule.steps:
            assert 1 <= len(step.faults) <= 2
            assert step.gap_s > 0
            if len(step.faults) == 1:
                assert step.faults[0].offset_s == 0
                continue
            overlapped += 1
            a, b = step.faults
            # the second starts while the first is in effect: they overlap, intentionally
            assert a.offset_s == 0 < b.offset_s < a.end_s
            assert a.target != b.target
            assert held(a) != "*" and held(b) != "*", step  # a cluster power loss is alone
            assert held(a) != held(b), step  # two groups, or a group and a nameserver
    assert overlapped > len(SEEDS)  # overlap_ratio 0.3 of ~20 steps per schedule


def test_single_group_overlaps_only_with_a_nameserver() -> None:
    spec = GeneratorSpec(groups=("broker-a",), overlap_ratio=1.0)
    for seed in range(50):
        schedule = ScheduleGenerator(seed, spec).generate_quota(dict.fromkeys(RIP32_FAMILIES, 2))
        for step in schedule.steps:
            if len(step.faults) == 2:
                assert {held(f) for f in step.faults} == {"broker-a", "nameserver"}


def test_no_overlap_without_overlap_ratio() -> None:
    spec = GeneratorSpec(overlap_ratio=0.0)
    schedule = ScheduleGenerator(3, spec).generate_quota(dict.fromkeys(RIP32_FAMILIES, 3))
    assert all(len(step.faults) == 1 for step in schedule.steps)
    assert len(schedule.steps) == 3 * len(RIP32_FAMILIES)


def test_controller_steps() -> None:
    """A controller family's step holds its own faults only, aimed by role, in the shape
    the family is named for; the other families never overlap them."""
    shapes: Counter[str] = Counter()
    for seed in range(100):
        schedule = every_family(seed, per_family=4)
        assert schedule.family_counts() == Counter(dict.fromkeys(FAMILIES, 4))
        for step in schedule.steps:
            families = {f.family for f in step.faults}
            if not families & CONTROLLER_FAMILIES:
                continue
            assert len(families) == 1, step  # never overlapped by another family
            (family,) = families
            faults = step.faults
            assert faults[0].offset_s == 0
            shapes[family] += 1
            roles = [f.role for f in faults]
            if family == "controller-kill":
                assert [(f.kind, f.role) for f in faults] == [("kill", "master")]
                assert faults[0].target.endswith("/0")
            elif family == "controller-leader-kill":
                assert roles == ["leader", "master"][: len(faults)]
                assert faults[0].target == "nameserver"
                assert all(f.kind == "kill" and f.offset_s == 0 for f in faults)
            elif family == "controller-isolate":
                (f,) = faults
                assert (f.kind, f.role) == ("isolate", "master")
                assert f.variant in {f"etcd-{i}" for i in range(ETCD_MEMBERS)}
            elif family == "controller-slave-behind":
                assert roles == ["slave", "master"][: len(faults)]
                assert not faults[0].target.endswith("/0")
                if len(faults) == 2:  # the master dies about when the slave resumes
                    assert faults[0].end_s - 1.0 <= faults[1].offset_s <= faults[0].end_s + 0.5
            elif family == "etcd-down":
                assert (faults[0].kind, faults[0].target) == ("etcd", "etcd")
                if len(faults) == 2:  # the master dies while etcd is down
                    assert 0 < faults[1].offset_s < faults[0].end_s
            else:
                assert family == "controller-flap"
                assert 1 <= len(faults) <= FLAP_KILLS
                assert all((f.kind, f.role) == ("kill", "master") for f in faults)
                for a, b in itertools.pairwise(faults):
                    assert b.offset_s > a.end_s  # killed again once restarted
    assert set(shapes) == CONTROLLER_FAMILIES


def test_controller_quota_is_exact_with_short_last_steps() -> None:
    for seed in range(30):
        quota = {"controller-flap": 4, "controller-leader-kill": 3, "etcd-down": 1, "kill": 2}
        schedule = ScheduleGenerator(seed).generate_quota(quota)
        assert schedule.family_counts() == Counter(quota)


def test_cluster_needs() -> None:
    schedule = ScheduleGenerator(1).generate_quota({"kill": 1, "pause": 1})
    assert (schedule.nameservers, schedule.needs_tmpfs, schedule.needs_netns) == (1, False, False)
    schedule = ScheduleGenerator(1).generate_quota({"nameserver": 1, "disk-full": 1, "loss": 1})
    assert (schedule.nameservers, schedule.needs_tmpfs, schedule.needs_netns) == (2, True, True)
    assert schedule.estimated_s() > sum(s.gap_s for s in schedule.steps)
    assert len(schedule.describe()) == len(schedule.steps)
    assert not schedule.needs_controller
    schedule = ScheduleGenerator(1).generate_quota({"controller-kill": 1, "etcd-down": 1})
    assert (schedule.needs_controller, schedule.nameservers, schedule.needs_netns) == (
        True,
        1,
        False,
    )
    schedule = ScheduleGenerator(1).generate_quota(
        {"controller-leader-kill": 2, "controller-isolate": 1}
    )
    assert (schedule.needs_controller, schedule.nameservers, schedule.needs_netns) == (
        True,
        2,
        True,
    )


def test_parse_families_and_bad_input() -> None:
    assert parse_families("slave, kill") == ("kill", "slave")
    with pytest.raises(ValueError, match="unknown fault families"):
        parse_families("kill,meteor")
    with pytest.raises(ValueError, match="at least one"):
        parse_families(" , ")
    with pytest.raises(ValueError, match="no fault"):
        ScheduleGenerator(0).generate_quota({"kill": 0})
    with pytest.raises(ValueError, match="fault_s"):
        GeneratorSpec(fault_s=(5.0, 1.0))
    with pytest.raises(ValueError, match="replicas"):
        GeneratorSpec(replicas=1)
