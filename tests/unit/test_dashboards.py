"""Grafana dashboards, provisioning and alert rules, checked structurally.

Every query may only use metric names ha-controller exports (docs/http-and-metrics.md)
with the labels those metrics carry. When `promtool` is on PATH (Debian:
`apt-get install prometheus`, or point PROMTOOL at it) the queries are also
parsed by Prometheus itself and the alert rules' unit tests are run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is needed (dev extra)")

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "grafana" / "dashboards"
ALERTS = ROOT / "grafana" / "alerts"
PROVISIONING = ROOT / "grafana" / "provisioning"
DASHBOARD_FILES = sorted(DASHBOARDS.glob("*.json"))

IDENTITY = frozenset({"cluster", "broker_name", "broker_id"})
# metric -> labels it carries (docs/http-and-metrics.md). Broker metrics carry the
# broker identity; target labels (instance, job, ...) exist on every series.
METRICS: dict[str, frozenset[str]] = {
    # nameserver
    "hac_group_member_up": IDENTITY,
    "hac_group_acting_master": frozenset({"cluster", "broker_name"}),
    "hac_group_master_online": frozenset({"cluster", "broker_name"}),
    "hac_group_acting_master_since_seconds": frozenset({"cluster", "broker_name"}),
    "hac_broker_heartbeat_age_seconds": IDENTITY,
    "hac_min_broker_id_changes_total": frozenset({"cluster", "broker_name"}),
    "hac_min_broker_id_notifications_total": frozenset({"result"}),
    "hac_broker_expired_total": frozenset({"reason"}),
    "hac_broker_registrations_total": frozenset({"result"}),
    "hac_route_watchers": frozenset(),
    # nameserver, controller mode (etcd_endpoints)
    "hac_controller_epoch": frozenset({"cluster", "broker_name"}),
    "hac_controller_master_member": frozenset({"cluster", "broker_name"}),
    "hac_controller_sync_state_set_size": frozenset({"cluster", "broker_name"}),
    "hac_controller_switches_total": frozenset({"cluster", "broker_name", "kind"}),
    "hac_controller_unclean_elections_total": frozenset({"cluster", "broker_name"}),
    "hac_controller_election_duration_seconds_bucket": frozenset({"kind", "le"}),
    "hac_controller_election_duration_seconds_count": frozenset({"kind"}),
    "hac_controller_election_duration_seconds_sum": frozenset({"kind"}),
    "hac_controller_leader": frozenset(),
    "hac_controller_etcd_up": frozenset(),
    # broker
    "hac_broker_role": IDENTITY | {"role"},
    "hac_broker_isolated": IDENTITY,
    "hac_messages_in_total": IDENTITY | {"topic"},
    "hac_messages_out_total": IDENTITY | {"topic", "group"},
    "hac_replication_lag_bytes": IDENTITY,
    "hac_escape_messages_total": IDENTITY | {"kind", "target", "result"},
    "hac_lock_requests_total": IDENTITY | {"mode", "result"},
    "hac_preonline_syncs_total": IDENTITY | {"result"},
    "hac_pull_held_requests": IDENTITY,
    "hac_store_writable": IDENTITY,
    "hac_broker_epoch": IDENTITY,
    "hac_broker_sync_state_set_size": IDENTITY,
    # broker, consumer lag (RocketMQ 5's names for the per-topic series)
    "rocketmq_consumer_lag_messages": IDENTITY
    | {"consumer_group", "topic", "is_retry", "is_system"},
    "rocketmq_consumer_lag_latency": IDENTITY
    | {"consumer_group", "topic", "is_retry", "is_system"},
    "hac_consumer_queue_lag_messages": IDENTITY | {"consumer_group", "topic", "queue_id"},
    "hac_consumer_queue_oldest_age_seconds": IDENTITY | {"consumer_group", "topic", "queue_id"},
    "hac_consumer_lag_queues_dropped": IDENTITY,
    "hac_consumer_lag_overflows_total": IDENTITY,
}
TARGET_LABELS = frozenset({"instance", "job", "namespace", "pod", "service", "container"})
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
EXPECTED_UIDS = {
    "ha-controller-groups.json": "ha-controller-groups",
    "ha-controller-flow.json": "ha-controller-flow",
}
BUILTIN_VARS = {"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"}

METRIC_RE = re.compile(r"\b(?:hac|rocketmq)_[a-z0-9_]+")
SELECTOR_RE = re.compile(r"\b((?:hac|rocketmq)_[a-z0-9_]+)\s*\{([^}]*)\}")
MATCHER_RE = re.compile(r'([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"')
VAR_RE = re.compile(r"\$\{?(\w+)")


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def all_panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for panel in panels:
        out.append(panel)
        out += all_panels(panel.get("panels", []))
    return out


def query_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in all_panels(dashboard["panels"]) if p["type"] != "row"]


def expressions(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in query_panels(dashboard) for t in p["targets"]]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    exprs += [
        v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        for v in dashboard["templating"]["list"]
        if v["type"] == "query"
    ]
    return exprs


def promql_problems(expr: str) -> list[str]:
    """Unknown metric names, labels a metric does not carry, unbalanced brackets."""
    problems = []
    names = set(METRIC_RE.findall(expr))
    if not names:
        problems.append(f"no hac_ or rocketmq_ metric in {expr!r}")
    problems += [f"unknown metric {n} in {expr!r}" for n in sorted(names - METRICS.keys())]
    for metric, matchers in SELECTOR_RE.findall(expr):
        allowed = METRICS.get(metric, frozenset()) | TARGET_LABELS
        for label in MATCHER_RE.findall(matchers):
            if label not in allowed:
                problems.append(f"{metric} has no label {label!r}")
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    for o, c in ("()", "[]", "{}"):
        if bare.count(o) != bare.count(c):
            problems.append(f"unbalanced {o}{c} in {expr!r}")
    return problems


# --- dashboards --------------------------------------------------------------------------


def test_the_two_dashboards_exist() -> None:
    assert {p.name for p in DASHBOARD_FILES} == set(EXPECTED_UIDS)


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_dashboard_model(path: Path) -> None:
    raw = path.read_text()
    dashboard = json.loads(raw)
    assert dashboard["uid"] == EXPECTED_UIDS[path.name]
    assert dashboard["title"].startswith("HA Controller / ")
    assert dashboard["schemaVersion"] >= 38
    assert "ha-controller" in dashboard["tags"]
    # Export-for-sharing placeholders are not resolved by file/sidecar provisioning.
    assert "${DS_" not in raw
    assert "__inputs" not in dashboard
    assert dashboard.get("id") is None


def test_dashboard_uids_are_unique() -> None:
    uids = [load(p)["uid"] for p in DASHBOARD_FILES]
    assert len(uids) == len(set(uids))


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_template_variables(path: Path) -> None:
    variables = {v["name"]: v for v in load(path)["templating"]["list"]}
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    for name, label in (("cluster", "cluster"), ("group", "broker_name")):
        var = variables[name]
        assert var["type"] == "query"
        assert var["datasource"] == DATASOURCE
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        assert re.fullmatch(rf"label_values\(hac_\w+(\{{.*\}})?, {label}\)", query), query
    # group depends on cluster
    group_query = variables["group"]["query"]
    assert "$cluster" in json.dumps(group_query)


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_every_panel_queries_prometheus_through_the_variable(path: Path) -> None:
    dashboard = load(path)
    panels = query_panels(dashboard)
    assert len(panels) >= 6
    ids = [p["id"] for p in all_panels(dashboard["panels"])]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    defined = {v["name"] for v in dashboard["templating"]["list"]} | BUILTIN_VARS
    for panel in panels:
        title = panel["title"]
        assert panel["datasource"] == DATASOURCE, title
        assert panel["targets"], f"{title}: no query"
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, title
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, title
            expr = target["expr"]
            assert expr.strip(), title
            assert promql_problems(expr) == [], title
            assert set(VAR_RE.findall(expr)) <= defined, f"{title}: undefined variable"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_every_query_uses_known_metrics(path: Path) -> None:
    for expr in expressions(load(path)):
        assert promql_problems(expr) == []


def test_the_docs_keda_query_uses_known_metrics() -> None:
    """The ScaledObject of docs/deploy.md (its schema: tests/unit/test_helm_real.py)."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)
    queries = [
        trigger["metadata"]["query"]
        for block in blocks
        if "kind: ScaledObject" in block
        for trigger in yaml.safe_load(block)["spec"]["triggers"]
        if trigger["type"] == "prometheus"
    ]
    assert queries
    for query in queries:
        assert promql_problems(query) == []


def test_query_check_rejects_unknown_metrics_and_labels() -> None:
    assert promql_problems("rate(hac_messages_in_total[5m])") == []
    assert promql_problems("rate(hac_messages_total[5m])")
    assert promql_problems('hac_group_acting_master{broker_id="1"}')
    assert promql_problems("sum(rate(hac_messages_in_total[5m])")
    assert promql_problems("up")
    assert promql_problems('rocketmq_consumer_lag_messages{consumer_group="g"}') == []
    assert promql_problems('rocketmq_consumer_lag_messages{group="g"}')


def metrics_of(path: Path) -> set[str]:
    return {m for e in expressions(load(path)) for m in METRIC_RE.findall(e)}


def test_groups_dashboard_covers_membership() -> None:
    path = DASHBOARDS / "ha-controller-groups.json"
    assert {
        "hac_group_member_up",
        "hac_group_acting_master",
        "hac_group_master_online",
        "hac_broker_heartbeat_age_seconds",
        "hac_min_broker_id_changes_total",
        "hac_broker_isolated",
        "hac_replication_lag_bytes",
        "hac_broker_role",
    } <= metrics_of(path)
    panels = query_panels(load(path))
    timelines = [
        p for p in panels if p["type"] == "state-timeline" and "acting" in p["title"].lower()
    ]
    assert timelines and "hac_group_acting_master" in timelines[0]["targets"][0]["expr"]
    since = [
        p for p in panels if "hac_group_acting_master_since_seconds" in p["targets"][0]["expr"]
    ]
    assert since, "a panel shows since when a slave is acting"
    # The take-over time the nameserver recorded, not "a change in the last N minutes"
    # (whose latest match is N minutes after the change) nor a subquery whose
    # resolution misses a short master-online history.
    assert since[0]["targets"][0]["expr"].startswith("time() - ")


def test_groups_dashboard_covers_controller_mode() -> None:
    path = DASHBOARDS / "ha-controller-groups.json"
    assert {
        "hac_controller_epoch",
        "hac_controller_master_member",
        "hac_controller_sync_state_set_size",
        "hac_controller_switches_total",
        "hac_controller_unclean_elections_total",
        "hac_controller_election_duration_seconds_bucket",
        "hac_controller_leader",
        "hac_controller_etcd_up",
    } <= metrics_of(path)
    dashboard = load(path)
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert any("controller" in r.lower() for r in rows)
    for panel in query_panels(dashboard):
        for target in panel["targets"]:
            expr = target["expr"]
            # the counters count what each nameserver decided: summed, never maxed
            if "_total" in expr and "hac_controller_" in expr:
                assert expr.startswith("sum by"), panel["title"]
            if "histogram_quantile" in expr:
                assert "sum by (le," in expr, panel["title"]


def test_flow_dashboard_covers_message_flow() -> None:
    path = DASHBOARDS / "ha-controller-flow.json"
    assert {
        "hac_messages_in_total",
        "hac_messages_out_total",
        "hac_pull_held_requests",
        "hac_escape_messages_total",
        "hac_lock_requests_total",
        "rocketmq_consumer_lag_messages",
        "rocketmq_consumer_lag_latency",
    } <= metrics_of(path)
    # Lag is exported by one broker per group at a time, whose id changes with a
    # failover: a panel aggregates without broker_id, and leaves the brokers' own
    # groups (revive, schedule) out.
    lag = [
        t["expr"]
        for p in query_panels(load(path))
        for t in p["targets"]
        if "rocketmq_consumer_lag" in t["expr"]
    ]
    assert len(lag) == 2
    for expr in lag:
        assert re.match(r"(sum|max) by \(consumer_group, topic\) \(rocketmq_", expr), expr
        assert 'is_system="false"' in expr and 'consumer_group=~"$consumer_group"' in expr
    assert any(e.endswith("/ 1000") for e in lag), "the latency (ms) is shown in seconds"


# --- provisioning ------------------------------------------------------------------------


def test_dashboard_provisioning() -> None:
    cfg = yaml.safe_load((PROVISIONING / "dashboards" / "ha-controller.yaml").read_text())
    assert cfg["apiVersion"] == 1
    (provider,) = cfg["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"].startswith("/")


def test_datasource_provisioning() -> None:
    cfg = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    assert cfg["apiVersion"] == 1
    (ds,) = cfg["datasources"]
    assert ds["type"] == "prometheus"
    assert ds["uid"] == "prometheus"
    assert ds["url"]


# --- alert rules -------------------------------------------------------------------------


def rules() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load((ALERTS / "ha-controller.rules.yml").read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"]}


def test_alert_rules() -> None:
    by_name = rules()
    expected = {
        "HacGroupNoLiveMember": ("hac_group_member_up", None),
        "HacActingMasterTooLong": ("hac_group_acting_master", "10m"),
        "HacMasterStuckInPreOnline": ("hac_broker_isolated", "5m"),
        "HacReplicationLagHigh": ("hac_replication_lag_bytes", None),
        "HacEscapeFailures": ("hac_escape_messages_total", None),
        "HacBrokerHeartbeatStale": ("hac_broker_heartbeat_age_seconds", None),
        "HacStoreNotWritable": ("hac_store_writable", "1m"),
        "HacControllerUncleanElection": ("hac_controller_unclean_elections_total", "0m"),
        "HacControllerNoLeader": ("hac_controller_leader", "1m"),
        "HacControllerEtcdDown": ("hac_controller_etcd_up", "1m"),
        "HacControllerSwitchFlapping": ("hac_controller_switches_total", "0m"),
        "HacControllerNoInSyncSlave": ("hac_controller_sync_state_set_size", "5m"),
        "HacConsumerLagTooOld": ("rocketmq_consumer_lag_latency", "10m"),
    }
    assert expected.keys() <= by_name.keys()
    for name, (metric, duration) in expected.items():
        rule = by_name[name]
        assert metric in rule["expr"], name
        if duration is not None:
            assert rule["for"] == duration, name
    assert ">= 0" in by_name["HacActingMasterTooLong"]["expr"]
    assert '{result!="ok"}' in by_name["HacEscapeFailures"]["expr"]
    assert "== 1" in by_name["HacMasterStuckInPreOnline"]["expr"]
    # One broker of a group exports lag at a time and its id changes with a failover.
    lag = by_name["HacConsumerLagTooOld"]["expr"]
    assert lag.startswith("max by (cluster, consumer_group, topic) (") and "broker_id" not in lag
    assert 'is_system="false"' in lag
    # A group of one member always has a sync-state set of one: only groups that had
    # more members alert.
    assert "hac_group_member_up" in by_name["HacControllerNoInSyncSlave"]["expr"]
    # Leader and etcd gauges carry no group: one alert per nameserver fleet / nameserver.
    assert by_name["HacControllerNoLeader"]["expr"].startswith("max by (namespace, job)")
    for name, rule in by_name.items():
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"], name
        assert promql_problems(rule["expr"]) == [], name


# --- promtool ----------------------------------------------------------------------------


def promtool() -> str:
    path = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if not path:
        pytest.skip(
            "promtool not found on PATH (Debian/Ubuntu: apt-get install prometheus; "
            "or set PROMTOOL=/path/to/promtool)"
        )
    return path


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_promtool_checks_the_alert_rules() -> None:
    result = run(promtool(), "check", "rules", "ha-controller.rules.yml", cwd=ALERTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = run(promtool(), "test", "rules", "ha-controller.rules.test.yml", cwd=ALERTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_catch_a_shorter_for(tmp_path: Path) -> None:
    """The acting-master test really pins `for: 10m`: with 8m it must fail."""
    tool = promtool()
    text = (ALERTS / "ha-controller.rules.yml").read_text()
    rule = "expr: max by (cluster, broker_name) (hac_group_acting_master) >= 0\n        for: 10m"
    assert rule in text
    (tmp_path / "ha-controller.rules.yml").write_text(text.replace(rule, rule[:-3] + "8m"))
    shutil.copy(ALERTS / "ha-controller.rules.test.yml", tmp_path)
    result = run(tool, "test", "rules", "ha-controller.rules.test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert "HacActingMasterTooLong" in result.stdout + result.stderr


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    tool = promtool()
    substitutions = {
        "$__rate_interval": "1m",
        "$__interval": "1m",
        "$__range": "1h",
        "$cluster": ".*",
        "$group": ".*",
        "$consumer_group": ".*",
    }
    rules_ = []
    for path in DASHBOARD_FILES:
        for i, expr in enumerate(expressions(load(path))):
            if expr.startswith("label_values("):
                continue
            for var, value in substitutions.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, expr
            rules_.append({"record": f"dashboard:{path.stem.replace('-', '_')}:{i}", "expr": expr})
    assert len(rules_) >= 15
    (tmp_path / "queries.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules_}]})
    )
    result = run(tool, "check", "rules", "queries.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_links_to_its_runbook_section() -> None:
    """Each alert's `runbook` annotation names a section of docs/runbook.md that exists
    (GitHub's anchor rule: the heading lower-cased, spaces to dashes)."""
    runbook = ALERTS.parents[1] / "docs" / "runbook.md"
    anchors = {
        line.lstrip("#").strip().lower().replace(" ", "-")
        for line in runbook.read_text().splitlines()
        if line.startswith("## ")
    }
    for name, rule in rules().items():
        link = rule["annotations"].get("runbook", "")
        assert link == f"docs/runbook.md#{name.lower()}", name
        assert name.lower() in anchors, f"docs/runbook.md has no section for {name}"
