"""Structural checks of the Helm chart, without a helm binary.

The files are read directly: the values validate against values.schema.json
(defaults and every example), the schema's `config` maps are generated from the
config dataclasses (so a typo in `broker.config` fails at lint/template time),
template actions are balanced, every `.Values` path a template reads exists,
the TOML the ConfigMaps render only holds real config keys and loads with the
real config loaders, and the chart's copies of the dashboards and alert rules
equal the sources in grafana/. tests/unit/test_helm_real.py runs the real helm
(`make tools`) on the chart.

The schema's config definitions are written by `ha_controller.config.helm_schema`;
regenerate them after a config key changes:

    .venv/bin/python -m ha_controller.config.helm_schema
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from ha_controller.config import (
    BrokerConfig,
    ConfigError,
    NameserverConfig,
    config_keys,
    dumps_toml,
    env_var_name,
    helm_schema,
    load_broker_config,
    load_nameserver_config,
)
from ha_controller.config import schema as config_schema

yaml = pytest.importorskip("yaml", reason="pyyaml is needed (dev extra)")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is needed (dev extra)")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "ha-controller"
TEMPLATES = CHART / "templates"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
TEMPLATE_FILES = sorted(
    p for p in TEMPLATES.rglob("*") if p.is_file() and p.suffix in {".yaml", ".tpl", ".txt"}
)

RELEASE = "hac"
NAMESPACE = "messaging"
TLS_DIR = "/etc/ha-controller/tls/"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def default_values() -> dict[str, Any]:
    values: dict[str, Any] = load_yaml(CHART / "values.yaml")
    return values


def schema() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return doc


def helm_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Merge user values over the defaults as Helm does: maps deep, lists replaced."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = helm_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def validator() -> Any:
    s = schema()
    jsonschema.Draft7Validator.check_schema(s)
    return jsonschema.Draft7Validator(s)


# --- Chart.yaml, values and schema -------------------------------------------------------


def test_chart_yaml_is_a_v2_application_chart() -> None:
    chart = load_yaml(CHART / "Chart.yaml")
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "ha-controller"
    assert chart["type"] == "application"
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])
    assert chart["appVersion"]


def test_default_values_validate_against_the_schema() -> None:
    errors = [e.message for e in validator().iter_errors(default_values())]
    assert errors == []


def test_default_values_have_the_documented_shape() -> None:
    values = default_values()
    assert values["nameserver"]["replicas"] >= 1
    assert values["groups"], "at least one broker group"
    for group in values["groups"]:
        assert group["replicas"] == 3  # master + two slaves: sync replication to two copies
    assert values["clusterSecret"]["enabled"] is True
    assert values["metrics"]["serviceMonitor"]["enabled"] is False
    assert values["metrics"]["prometheusRule"]["enabled"] is False
    dashboards = values["metrics"]["grafana"]["dashboards"]
    assert (dashboards["label"], dashboards["labelValue"]) == ("grafana_dashboard", "1")
    assert values["broker"]["pdb"]["maxUnavailable"] == 1
    assert values["broker"]["podAntiAffinity"] == "soft"


def test_there_are_examples_and_the_docs_reference_each() -> None:
    assert len(EXAMPLES) >= 2
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for example in EXAMPLES:
        assert f"examples/{example.name}" in docs, f"docs/deploy.md does not show {example.name}"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_validates_against_the_schema(example: Path) -> None:
    values = helm_merge(default_values(), load_yaml(example))
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator().iter_errors(values)]
    assert errors == []


@pytest.mark.parametrize(
    ("override", "where"),
    [
        ({"nameserver": {"replica": 2}}, "nameserver"),  # typo: additionalProperties false
        ({"nameserver": {"replicas": 0}}, "nameserver"),
        ({"groups": []}, "groups"),
        ({"groups": [{"replicas": 3}]}, "groups"),  # no name
        ({"groups": [{"name": "Broker_A"}]}, "groups"),  # not a DNS label
        ({"groups": [{"name": "a", "replicas": 0}]}, "groups"),
        ({"groups": [{"name": "a", "storage": {"size": "ten"}}]}, "groups"),
        ({"broker": {"podAntiAffinity": "always"}}, "broker"),
        ({"broker": {"config": {"Lock-In-Strict": True}}}, "broker"),
        ({"broker": {"config": {"lock_in_strict": True}}}, "broker"),  # typo of a real key
        ({"broker": {"config": {"limits": {"deep": {"er": 1}}}}}, "broker"),
        ({"broker": {"config": {"limits": {"max_conections": 10}}}}, "broker"),
        ({"broker": {"config": {"flush_interval_ms": "500"}}}, "broker"),
        ({"broker": {"config": {"register_name_server_period_ms": 5000}}}, "broker"),
        ({"groups": [{"name": "a", "config": {"replication_mode": "semi"}}]}, "groups"),
        ({"groups": [{"name": "a", "config": {"auto_create_topics": False}}]}, "groups"),
        ({"nameserver": {"config": {"scan_not_active_broker_interval": 5}}}, "nameserver"),
        ({"nameserver": {"config": {"lock_in_strict_mode": True}}}, "nameserver"),  # broker key
        ({"clusterName": "has space"}, "clusterName"),
        ({"metrics": {"serviceMonitor": {"enabled": "yes"}}}, "metrics"),
        ({"unknownTopLevel": 1}, ""),
    ],
)
def test_schema_rejects_bad_values(override: dict[str, Any], where: str) -> None:
    values = helm_merge(default_values(), override)
    errors = list(validator().iter_errors(values))
    assert errors, f"schema accepted {override}"
    if where:
        assert any(list(e.absolute_path)[:1] == [where] for e in errors)


# --- the `config` maps of the schema, generated from the config classes ------------------

#: values.schema.json definition -> config class whose keys a values `config` map may hold.
CONFIG_DEFINITIONS = helm_schema.DEFINITIONS


def schema_keys(node: dict[str, Any], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, sub in node["properties"].items():
        if sub.get("type") == "object" and "properties" in sub:
            keys |= schema_keys(sub, f"{prefix}{name}.")
        else:
            keys.add(prefix + name)
    return keys


def test_schema_config_definitions_are_generated_from_the_config_classes() -> None:
    current = (CHART / "values.schema.json").read_text()
    assert helm_schema.render(current) == current, (
        f"values.schema.json is stale: run {helm_schema.COMMAND}"
    )


@pytest.mark.parametrize(("definition", "cls"), CONFIG_DEFINITIONS.items())
def test_schema_config_keys_equal_the_config_keys(definition: str, cls: type) -> None:
    node = schema()["definitions"][definition]
    assert node["additionalProperties"] is False
    assert schema_keys(node) == set(config_keys(cls))


def test_every_config_map_of_the_values_uses_the_generated_definitions() -> None:
    s = schema()["properties"]
    assert s["broker"]["properties"]["config"] == {"$ref": "#/definitions/brokerConfig"}
    assert s["groups"]["items"]["properties"]["config"] == {"$ref": "#/definitions/brokerConfig"}
    assert s["nameserver"]["properties"]["config"] == {"$ref": "#/definitions/nameserverConfig"}


def _bounded_keys(node: dict[str, Any], prefix: str = "") -> list[tuple[str, str, int]]:
    out = []
    for name, sub in node["properties"].items():
        if "properties" in sub:
            out += _bounded_keys(sub, f"{prefix}{name}.")
        for word, step in (("minimum", -1), ("maximum", 1)):
            if word in sub:
                out.append((prefix + name, word, sub[word] + step))
    return out


@pytest.mark.parametrize(("definition", "cls"), CONFIG_DEFINITIONS.items())
def test_schema_bounds_are_the_loader_bounds(definition: str, cls: type, tmp_path: Path) -> None:
    """Just outside each bound of the schema the loader refuses the value, naming the key."""
    loader = load_broker_config if cls is BrokerConfig else load_nameserver_config
    base = {"broker_name": "b", "broker_id": 0, "namesrv_addrs": ["n:9876"]}
    bounded = _bounded_keys(schema()["definitions"][definition])
    assert bounded
    for key, _, value in bounded:
        table: dict[str, Any] = dict(base) if cls is BrokerConfig else {}
        *parents, leaf = key.split(".")
        node = table
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
        path = tmp_path / "c.toml"
        path.write_text(to_toml(table, tmp_path))
        with pytest.raises(ConfigError, match=re.escape(key)):
            loader(path, {}, {})


# --- template syntax ---------------------------------------------------------------------

ACTION_RE = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
BLOCK_OPENERS = {"if", "range", "with", "define", "block"}


def actions(text: str) -> list[str]:
    """Template actions with trim markers removed; comments dropped."""
    out = []
    for m in ACTION_RE.finditer(text):
        body = m.group(1)
        body = body.removeprefix("-").removesuffix("-").strip()
        if body.startswith("/*"):
            assert body.endswith("*/"), f"unterminated comment: {body[:40]!r}"
            continue
        out.append(body)
    return out


@pytest.mark.parametrize("path", TEMPLATE_FILES, ids=lambda p: p.name)
def test_template_actions_are_balanced(path: Path) -> None:
    text = path.read_text()
    assert text.count("{{") == text.count("}}"), "unbalanced {{ }}"
    stack: list[str] = []
    for body in actions(text):
        word = body.split(None, 1)[0] if body else ""
        if word in BLOCK_OPENERS:
            stack.append(body)
        elif word == "end":
            assert stack, "'end' without an open block"
            stack.pop()
        elif word == "else":
            assert stack, "'else' outside a block"
        for ch_open, ch_close in ("()", "[]"):
            stripped = re.sub(r'"(?:[^"\\]|\\.)*"', '""', body)
            assert stripped.count(ch_open) == stripped.count(ch_close), body
    assert stack == [], f"blocks not closed by end: {stack}"


def test_helpers_define_what_templates_include() -> None:
    defined = set()
    used = set()
    for path in TEMPLATE_FILES:
        for body in actions(path.read_text()):
            defined |= set(re.findall(r'^define "([^"]+)"', body))
            used |= set(re.findall(r'(?:include|template) "([^"]+)"', body))
    assert used, "templates include helpers"
    assert used <= defined, f"included but not defined: {sorted(used - defined)}"


# --- .Values paths -----------------------------------------------------------------------

VALUES_REF_RE = re.compile(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
RANGE_VAR_RE = re.compile(r"^range\s+\$(\w+)\s*:=\s*\$?\.Values((?:\.\w+)+)\s*$")
ALIAS_RE = re.compile(r"^\$(\w+)\s*:=\s*\$?\.Values((?:\.\w+)+)\s*$")
VAR_FIELD_RE = re.compile(r"\$(\w+)((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def lookup(values: Any, path: list[str]) -> bool:
    node = values
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def schema_at(s: dict[str, Any], path: list[str]) -> dict[str, Any]:
    node = s
    for part in path:
        node = node["properties"][part]
    return node


def values_refs_problems(text: str, values: dict[str, Any], s: dict[str, Any]) -> list[str]:
    """Every .Values path exists in values.yaml; `$item.x` of `range $item := .Values.list`
    is a property of the list's item schema; `$alias.x` of `$alias := .Values.a` is a.x."""
    problems = []
    frames: list[dict[str, tuple[str, list[str]]]] = [{}]

    def resolve(var: str) -> tuple[str, list[str]] | None:
        for frame in reversed(frames):
            if var in frame:
                return frame[var]
        return None

    for body in actions(text):
        word = body.split(None, 1)[0] if body else ""
        for m in VALUES_REF_RE.finditer(body):
            path = m.group(1).strip(".").split(".")
            if not lookup(values, path):
                problems.append(f".Values.{'.'.join(path)} is not in values.yaml")
        if word in BLOCK_OPENERS:
            frames.append({})
            ranged = RANGE_VAR_RE.match(body)
            if ranged:
                list_path = ranged.group(2).strip(".").split(".")
                frames[-1][ranged.group(1)] = ("item", list_path)
        elif word == "end":
            frames.pop()
        else:
            alias = ALIAS_RE.match(body)
            if alias:
                frames[-1][alias.group(1)] = ("alias", alias.group(2).strip(".").split("."))
        for m in VAR_FIELD_RE.finditer(body):
            bound = resolve(m.group(1))
            if bound is None:
                continue
            kind, base = bound
            fields = m.group(2).strip(".").split(".")
            if kind == "alias":
                if not lookup(values, base + fields):
                    problems.append(f"${m.group(1)}.{'.'.join(fields)}: {base + fields} missing")
            else:
                item = schema_at(s, base)["items"]
                if fields[0] not in item["properties"]:
                    problems.append(
                        f"${m.group(1)}.{fields[0]}: not a property of {'.'.join(base)} items"
                    )
    return problems


@pytest.mark.parametrize("path", TEMPLATE_FILES, ids=lambda p: p.name)
def test_values_paths_used_in_templates_exist(path: Path) -> None:
    assert values_refs_problems(path.read_text(), default_values(), schema()) == []


def test_values_path_check_catches_a_missing_path() -> None:
    text = (
        "{{ .Values.nameserver.replicaz }}"
        "{{- range $g := .Values.groups }}{{ $g.storageSize }}{{ $g.name }}{{- end }}"
        "{{- $sm := .Values.metrics.serviceMonitor }}{{ $sm.intervall }}"
    )
    problems = values_refs_problems(text, default_values(), schema())
    assert len(problems) == 3, problems
    assert "replicaz" in problems[0]
    assert "storageSize" in problems[1]
    assert "intervall" in problems[2]


def test_every_values_section_is_used_by_a_template() -> None:
    text = "\n".join(p.read_text() for p in TEMPLATE_FILES)
    used = {m.group(1).strip(".") for m in VALUES_REF_RE.finditer(text)}
    values = default_values()
    # toYaml'd wholesale: their sub-keys are Kubernetes fields, not ours.
    whole = {"podSecurityContext", "containerSecurityContext", "imagePullSecrets", "groups"}
    unused = []
    for key, sub in values.items():
        if not any(u == key or u.startswith(key + ".") for u in used):
            unused.append(key)
        elif isinstance(sub, dict) and key not in whole:
            unused += [
                f"{key}.{k}"
                for k in sub
                if not any(u == f"{key}.{k}" or u.startswith(f"{key}.{k}.") for u in used)
            ]
    # broker.storage and groups[].storage are merged into $storage, read field by field.
    assert unused == []


# --- rendered TOML -----------------------------------------------------------------------

SET_RE = re.compile(r'set \$(\w+) "([a-z0-9_]+)"')


def template_config_keys() -> dict[str, set[str]]:
    """Config keys the chart itself sets, per TOML file, from its `set $var "key"` calls."""
    sets: dict[str, set[str]] = {}
    for path in (TEMPLATES / "configmap.yaml", TEMPLATES / "_helpers.tpl"):
        for body in actions(path.read_text()):
            for var, key in SET_RE.findall(body):
                sets.setdefault(var, set()).add(key)
    tls = {f"tls.{k}" for k in sets["tls"]}
    acl = {f"acl.{k}" for k in sets["acl"]}
    assert "tls" in sets["cfg"], "the broker file gets the [tls] table"
    assert "tls" in sets["ns"], "the nameserver file gets the [tls] table"
    assert "acl" in sets["cfg"] and "acl" in sets["ns"], "both files get the [acl] table"
    return {
        "broker": (sets["cfg"] - {"tls", "acl"}) | tls | acl,
        "nameserver": (sets["ns"] - {"tls", "acl"}) | tls | acl,
    }


def fullname(values: dict[str, Any]) -> str:
    if values.get("fullnameOverride"):
        return str(values["fullnameOverride"])[:20].rstrip("-")
    name = values.get("nameOverride") or "ha-controller"
    full = RELEASE if name in RELEASE else f"{RELEASE}-{name}"
    return full[:20].rstrip("-")


def namesrv_addrs(values: dict[str, Any]) -> list[str]:
    full = fullname(values)
    return [
        f"{full}-nameserver-{i}.{full}-nameserver-headless.{NAMESPACE}.svc."
        f"{values['clusterDomain']}:9876"
        for i in range(values["nameserver"]["replicas"])
    ]


def tls_table(values: dict[str, Any]) -> dict[str, Any]:
    # the CA is always there: every outgoing connection verifies its server with it
    table: dict[str, Any] = {
        "enabled": True,
        "cert_file": TLS_DIR + "tls.crt",
        "key_file": TLS_DIR + "tls.key",
        "ca_file": TLS_DIR + "ca.crt",
    }
    if values["tls"]["requireClientCert"]:
        table |= {"require_client_cert": True}
    return table


ACL_DIR = "/etc/ha-controller/acl/"


def acl_table(values: dict[str, Any]) -> dict[str, Any]:
    return {
        "enabled": True,
        "allow_anonymous": values["acl"]["allowAnonymous"],
        "file": ACL_DIR + values["acl"]["key"],
    }


def deep_merge(dst: dict[str, Any], src: dict[str, Any]) -> dict[str, Any]:
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            deep_merge(dst[key], value)
        else:
            dst[key] = copy.deepcopy(value)
    return dst


def chart_nameserver_config(values: dict[str, Any]) -> dict[str, Any]:
    """What templates/configmap.yaml builds for nameserver.toml, before user config."""
    cfg: dict[str, Any] = {"listen": "0.0.0.0:9876", "http_listen": "0.0.0.0:9877"}
    if values["tls"]["enabled"]:
        cfg["tls"] = tls_table(values)
    if values["acl"]["enabled"]:
        cfg["acl"] = acl_table(values)
    return cfg


def chart_broker_config(values: dict[str, Any], group: dict[str, Any]) -> dict[str, Any]:
    """What templates/configmap.yaml builds for broker-<group>.toml, before user config."""
    replicas = group.get("replicas", 3)
    cfg: dict[str, Any] = {
        "cluster": values["clusterName"],
        "broker_name": group["name"],
        "namesrv_addrs": namesrv_addrs(values),
        "listen": "0.0.0.0:10911",
        "ha_listen": "0.0.0.0:10912",
        "http_listen": "0.0.0.0:10913",
        "store_dir": "/data/store",
        "total_replicas": replicas,
        "in_sync_replicas": min(2, replicas),
    }
    if values["tls"]["enabled"]:
        cfg["tls"] = tls_table(values)
    if values["acl"]["enabled"]:
        cfg["acl"] = acl_table(values)
    return cfg


def flat_keys(table: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for key, value in table.items():
        if isinstance(value, dict):
            keys |= flat_keys(value, f"{prefix}{key}.")
        else:
            keys.add(prefix + key)
    return keys


def to_toml(table: dict[str, Any], tls_dir: Path) -> str:
    """The same layout as the chart's "ha-controller.toml" helper: scalars, then [tables],
    each in key order; the TLS and ACL paths moved to scratch directories."""

    def local(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: local(v) for k, v in sorted(value.items())}
        if isinstance(value, str) and value.startswith(TLS_DIR):
            return str(tls_dir / value.removeprefix(TLS_DIR))
        if isinstance(value, str) and value.startswith(ACL_DIR):  # beside the TLS files
            return str(tls_dir.parent / "acl" / value.removeprefix(ACL_DIR))
        return value

    return dumps_toml(local(table))


ALL_VALUES = [("values.yaml", {})] + [(p.name, load_yaml(p)) for p in EXAMPLES]


def test_chart_config_keys_are_real_config_keys() -> None:
    keys = template_config_keys()
    assert keys["broker"] <= set(config_keys(BrokerConfig)), keys["broker"] - set(
        config_keys(BrokerConfig)
    )
    assert keys["nameserver"] <= set(config_keys(NameserverConfig))
    # The file leaves out exactly the per-pod identity: broker_id (--broker-id,
    # from the pod ordinal) and broker_ip1 (HAC_BROKER_IP1, the pod DNS name).
    assert {"broker_id", "broker_ip1"}.isdisjoint(keys["broker"])
    assert {"cluster", "broker_name", "namesrv_addrs", "store_dir"} <= keys["broker"]


def owned_keys(component: str) -> dict[str, str]:
    """The chart's "ha-controller.ownedKeys.<component>" list: key -> where it comes from."""
    text = (TEMPLATES / "_helpers.tpl").read_text()
    body = text.split(f'define "ha-controller.ownedKeys.{component}" -}}}}\n')[1]
    return dict(yaml.safe_load(body.split("{{- end }}")[0]))


@pytest.mark.parametrize(
    ("component", "cls"), [("broker", BrokerConfig), ("nameserver", NameserverConfig)]
)
def test_config_maps_may_not_set_what_the_chart_sets(component: str, cls: type) -> None:
    """Refused: every key the chart renders (in_sync_replicas excepted: a group may lower
    it), the per-pod identity, the secrets (which come from Secrets as env vars) and the
    keys the component's StatefulSet passes as env vars (controller mode's etcd)."""
    rendered = {k.split(".")[0] for k in template_config_keys()[component]}
    own = {key.name for key in config_schema(cls).keys.values() if key.per_broker or key.secret}
    sts = (TEMPLATES / f"{component}-statefulset.yaml").read_text()
    env = {k for k in config_keys(cls) if f"name: {env_var_name(k)}\n" in sts}
    if component == "nameserver":
        assert {"etcd_endpoints", "auto_switch_after_ms"} <= env
    expected = (rendered - {"in_sync_replicas"}) | own | env
    assert set(owned_keys(component)) == expected
    assert all(owned_keys(component).values())
    helpers = (TEMPLATES / "_helpers.tpl").read_text()
    for where in ('"broker.config"', '"nameserver.config"', '(printf "groups[%d].config" $i)'):
        assert f'include "ha-controller.validateConfig" (dict "where" {where}' in helpers


def test_python_mirror_sets_the_same_keys_as_the_template() -> None:
    """The mirror used below to load configs must not drift from the template."""
    keys = template_config_keys()
    broker: set[str] = set()
    nameserver: set[str] = set()
    for _, override in ALL_VALUES:
        values = helm_merge(default_values(), override)
        nameserver |= flat_keys(chart_nameserver_config(values))
        for group in values["groups"]:
            broker |= flat_keys(chart_broker_config(values, group))
    assert broker == keys["broker"]
    assert nameserver == keys["nameserver"]
    helpers = (TEMPLATES / "_helpers.tpl").read_text()
    assert '"%s-%d.%s.%s.svc.%s:9876" $fullname $i $headless' in helpers
    assert '"in_sync_replicas" (min 2 $replicas)' in helpers
    assert '"total_replicas" $replicas' in helpers
    assert "int (default 3 $group.replicas)" in helpers
    configmap = (TEMPLATES / "configmap.yaml").read_text()
    assert 'include "ha-controller.brokerToml" $ctx' in configmap
    assert 'include "ha-controller.nameserverToml" .' in configmap


def broker_env(values: dict[str, Any], group: dict[str, Any], ordinal: int) -> dict[str, str]:
    """The environment the broker container command builds (pod DNS name as advertised host)."""
    full = fullname(values)
    pod = f"{full}-{group['name']}-{ordinal}"
    host = f"{pod}.{full}-{group['name']}-headless.{NAMESPACE}.svc.{values['clusterDomain']}"
    return {
        "HAC_BROKER_IP1": host,
        "HAC_CLUSTER_SECRET": "s3cret",
        "HOSTNAME": pod,
    }


@pytest.mark.parametrize(("name", "override"), ALL_VALUES, ids=[n for n, _ in ALL_VALUES])
def test_rendered_config_loads(name: str, override: dict[str, Any], tmp_path: Path) -> None:
    values = helm_merge(default_values(), override)
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    for f in ("tls.crt", "tls.key", "ca.crt"):
        (tls_dir / f).write_text("placeholder\n")
    acl_dir = tmp_path / "acl"
    acl_dir.mkdir()
    (acl_dir / values["acl"]["key"]).write_text(
        '[[users]]\naccess_key = "ops"\nsecret_key = "0123456789abcdef"\nadmin = true\n'
    )

    ns_table = deep_merge(chart_nameserver_config(values), values["nameserver"]["config"])
    ns_file = tmp_path / "nameserver.toml"
    ns_file.write_text(to_toml(ns_table, tls_dir))
    ns = load_nameserver_config(ns_file, {}, {"HAC_CLUSTER_SECRET": "s3cret"})
    assert ns.listen == "0.0.0.0:9876"
    assert ns.http_listen == "0.0.0.0:9877"
    assert ns.tls.enabled is values["tls"]["enabled"]
    assert ns.acl.enabled is values["acl"]["enabled"]
    assert ns.acl.allow_anonymous is (values["acl"]["allowAnonymous"] or not ns.acl.enabled)

    for group in values["groups"]:
        table = chart_broker_config(values, group)
        deep_merge(table, values["broker"]["config"])
        deep_merge(table, group.get("config", {}))
        path = tmp_path / f"broker-{group['name']}.toml"
        path.write_text(to_toml(table, tls_dir))
        replicas = group.get("replicas", 3)
        for ordinal in range(replicas):
            env = broker_env(values, group, ordinal)
            # The container runs: hactl broker --config F --broker-id "${HOSTNAME##*-}"
            broker_id = int(env["HOSTNAME"].rsplit("-", 1)[1])
            cfg = load_broker_config(path, {"broker_id": broker_id}, env)
            assert cfg.broker_id == ordinal
            assert cfg.is_master is (ordinal == 0)
            assert cfg.cluster == values["clusterName"]
            assert cfg.broker_name == group["name"]
            assert cfg.total_replicas == replicas
            assert cfg.in_sync_replicas <= cfg.total_replicas
            assert cfg.namesrv_addrs == tuple(namesrv_addrs(values))
            assert cfg.broker_ip1 == env["HAC_BROKER_IP1"]
            assert str(cfg.store_path) == "/data/store"
            assert cfg.cluster_secret == "s3cret"
            for key, value in {**values["broker"]["config"], **group.get("config", {})}.items():
                if not isinstance(value, dict):
                    assert getattr(cfg, key) == value, key


def test_broker_command_matches_the_mirror() -> None:
    sts = (TEMPLATES / "broker-statefulset.yaml").read_text()
    assert (
        'exec hactl broker --config /etc/ha-controller/broker.toml --broker-id "${HOSTNAME##*-}"'
        in sts
    )
    assert (
        'export HAC_BROKER_IP1="${HOSTNAME}.{{ $headless }}.${POD_NAMESPACE}.svc.'
        '{{ $.Values.clusterDomain }}"'
    ) in sts
    assert "subPath: broker-{{ $group.name }}.toml" in sts
    assert "broker-{{ $group.name }}.toml: |" in (TEMPLATES / "configmap.yaml").read_text()
    assert "mountPath: /data\n" in sts


def test_environment_variables_in_templates_are_config_keys() -> None:
    env_names = {env_var_name(k) for k in config_keys(BrokerConfig) + config_keys(NameserverConfig)}
    text = "\n".join(p.read_text() for p in TEMPLATE_FILES)
    used = set(re.findall(r"\bHAC_[A-Z0-9_]+", text))
    assert {"HAC_CLUSTER_SECRET", "HAC_BROKER_IP1"} <= used
    # hactl's credentials (the helm test pod) are a tool's variables, not config keys
    tool_env = {"HAC_ACCESS_KEY", "HAC_SECRET_KEY"}
    assert used - tool_env <= env_names, used - tool_env - env_names


def test_config_overrides_cannot_smuggle_secrets_into_the_configmap() -> None:
    # cluster_secret comes from the Secret as an env var, never from rendered TOML.
    keys = template_config_keys()
    assert "cluster_secret" not in keys["broker"] | keys["nameserver"]
    helpers = (TEMPLATES / "_helpers.tpl").read_text()
    assert "secretKeyRef" in helpers


# --- Kubernetes objects ------------------------------------------------------------------


def test_container_ports_match_the_config_defaults() -> None:
    ns = NameserverConfig()
    broker = BrokerConfig(broker_name="b", broker_id=0, namesrv_addrs=("n:9876",))
    ns_sts = (TEMPLATES / "nameserver-statefulset.yaml").read_text()
    broker_sts = (TEMPLATES / "broker-statefulset.yaml").read_text()
    for addr in (ns.listen, ns.http_listen):
        assert f"containerPort: {addr.rsplit(':', 1)[1]}" in ns_sts
    for addr in (broker.listen, broker.ha_listen, broker.http_listen):
        assert f"containerPort: {addr.rsplit(':', 1)[1]}" in broker_sts


def test_one_broker_statefulset_per_group_with_ordinal_ids() -> None:
    sts = (TEMPLATES / "broker-statefulset.yaml").read_text()
    assert "{{- range $group := .Values.groups }}" in sts
    assert "kind: StatefulSet" in sts
    assert "podManagementPolicy: Parallel" in sts
    assert "volumeClaimTemplates:" in sts
    assert "storage: {{ $storage.size }}" in sts
    assert "serviceName: {{ $headless }}" in sts


@pytest.mark.parametrize(
    ("template", "port"),
    [("nameserver-statefulset.yaml", 9877), ("broker-statefulset.yaml", 10913)],
)
def test_probes_use_healthz_and_readyz(template: str, port: int) -> None:
    text = (TEMPLATES / template).read_text()
    probes = dict(
        re.findall(
            r'(\w+Probe):\n\s+\{\{- include "ha-controller.probeHandler" \(dict .*?"path" "(/\w+)"',
            text,
        )
    )
    assert probes == {
        "startupProbe": "/healthz",
        "livenessProbe": "/healthz",
        "readinessProbe": "/readyz",
    }
    assert f'"port" {port})' in text
    helpers = (TEMPLATES / "_helpers.tpl").read_text()
    handler = helpers.split('define "ha-controller.probeHandler"')[1]
    assert "httpGet:" in handler
    assert "port: http" in handler


def test_headless_services_publish_not_ready_pods() -> None:
    for name in ("broker-service.yaml", "nameserver-service.yaml"):
        text = (TEMPLATES / name).read_text()
        assert "clusterIP: None" in text
        assert "publishNotReadyAddresses: true" in text
    ns = (TEMPLATES / "nameserver-service.yaml").read_text()
    assert ns.count("kind: Service") == 2, "headless + client Service"


def test_pdb_per_group_and_for_nameservers() -> None:
    text = (TEMPLATES / "pdb.yaml").read_text()
    assert "{{- range $group := .Values.groups }}" in text
    assert text.count("kind: PodDisruptionBudget") == 2
    assert "maxUnavailable: {{ $.Values.broker.pdb.maxUnavailable }}" in text
    assert "maxUnavailable: {{ .Values.nameserver.pdb.maxUnavailable }}" in text
    assert 'include "ha-controller.group.selectorLabels" $ctx' in text


def test_anti_affinity_is_preferred_or_required() -> None:
    helpers = (TEMPLATES / "_helpers.tpl").read_text()
    block = helpers.split('define "ha-controller.podAntiAffinity"')[1].split("{{- end }}\n\n")[0]
    assert 'eq .mode "hard"' in block
    assert "requiredDuringSchedulingIgnoredDuringExecution" in block
    assert 'eq .mode "soft"' in block
    assert "preferredDuringSchedulingIgnoredDuringExecution" in block
    sts = (TEMPLATES / "broker-statefulset.yaml").read_text()
    assert '"mode" $.Values.broker.podAntiAffinity' in sts
    assert '"labels" $selector' in sts  # spreads the pods of one group


def test_secret_is_referenced_not_inlined() -> None:
    secret = (TEMPLATES / "secret.yaml").read_text()
    assert "kind: Secret" in secret
    assert "lookup" in secret  # generated value kept across upgrades
    for name in ("nameserver-statefulset.yaml", "broker-statefulset.yaml"):
        assert 'include "ha-controller.secretEnv"' in (TEMPLATES / name).read_text()


def test_monitoring_objects_are_optional() -> None:
    sm = (TEMPLATES / "servicemonitor.yaml").read_text()
    assert sm.startswith("{{- if .Values.metrics.serviceMonitor.enabled }}")
    assert sm.count("kind: ServiceMonitor") == 2
    assert "path: /metrics" in sm
    for label in ("cluster", "broker_name", "broker_id"):
        assert f"targetLabel: {label}" in sm
    rule = (TEMPLATES / "prometheusrule.yaml").read_text()
    assert "{{- if .Values.metrics.prometheusRule.enabled }}" in rule
    assert "kind: PrometheusRule" in rule
    assert '.Files.Get "files/alerts/ha-controller.rules.yml"' in rule
    dash = (TEMPLATES / "grafana-dashboards.yaml").read_text()
    assert "{{- if .Values.metrics.grafana.dashboards.enabled }}" in dash
    assert '(.Files.Glob "files/dashboards/*.json").AsConfig' in dash
    assert "{{ $d.label }}: {{ $d.labelValue | quote }}" in dash


def test_chart_copies_of_dashboards_equal_the_sources() -> None:
    sources = {p.name: p.read_bytes() for p in (ROOT / "grafana" / "dashboards").glob("*.json")}
    copies = {p.name: p.read_bytes() for p in (CHART / "files" / "dashboards").glob("*.json")}
    assert sources, "grafana/dashboards/*.json"
    assert copies.keys() == sources.keys()
    for name, data in sources.items():
        assert copies[name] == data, f"helm/ha-controller/files/dashboards/{name} is stale"


def test_chart_copy_of_alert_rules_equals_the_source() -> None:
    source = (ROOT / "grafana" / "alerts" / "ha-controller.rules.yml").read_bytes()
    copy_ = (CHART / "files" / "alerts" / "ha-controller.rules.yml").read_bytes()
    assert copy_ == source
    # A PrometheusRule spec is {groups: [...]}: the file must be exactly that.
    assert list(yaml.safe_load(source)) == ["groups"]


def test_helm_test_hook_produces_and_consumes() -> None:
    text = (TEMPLATES / "tests" / "smoke-test.yaml").read_text()
    assert "helm.sh/hook: test" in text
    assert "restartPolicy: Never" in text
    consume = text.index("hactl consume")
    produce = text.index("hactl produce")
    assert consume < produce, "the consumer is started before the producer"
    assert '--count "$COUNT"' in text[consume:produce]
    assert 'wait "$consumer"' in text  # the pod fails when consume fails
    assert "set -eu" in text


def test_notes_explain_how_to_reach_the_cluster() -> None:
    notes = (TEMPLATES / "NOTES.txt").read_text()
    for needle in ("port-forward", "hactl groups", "helm test", "dashboards", "/metrics"):
        assert needle in notes


# --- image -------------------------------------------------------------------------------


def test_dockerfile() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert re.search(r"pip install '?\.(\[[a-z,]+\])?'?", text)
    user = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert user and user[-1].split(":")[0] not in {"root", "0"}
    exposed = {int(p) for line in re.findall(r"^EXPOSE\s+(.+)$", text, re.M) for p in line.split()}
    assert exposed == {9876, 9877, 10911, 10912, 10913}
    assert re.search(r'^ENTRYPOINT \["hactl"\]', text, re.M)
    values = default_values()
    assert values["podSecurityContext"]["runAsUser"] == int(user[-1].split(":")[0])
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert {".git/", ".venv/"} <= set(ignore)
