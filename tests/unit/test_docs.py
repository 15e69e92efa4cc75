"""The docs stand alone and say what the code does.

- ``docs/configuration.md`` is generated from the config classes of
  ``ha_controller/config/`` (``ha_controller/config/doc.py``); a stale copy fails with
  the command that regenerates it.
- No page, and no other file of the repository, points at files users do not have
  (the project's internal design notes).
- The request-code and error tables of ``docs/protocol.md`` match
  ``ha_controller/protocol``; every metric the services export, and every HTTP
  route they serve, is in ``docs/http-and-metrics.md`` (and nothing else is).
- Relative links between the pages lead to files that exist.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ha_controller import config_doc
from ha_controller.config import config_keys
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import error_table

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
README = ROOT / "README.md"


def _page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    """The text under ``## heading`` up to the next ``## ``."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _rows(text: str) -> Iterator[list[str]]:
    """Cells of every markdown table row whose first cell is a number."""
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells and cells[0].isdigit():
                yield cells


# --- generated reference ---------------------------------------------------------------------


def test_configuration_reference_is_current() -> None:
    committed = (DOCS / "configuration.md").read_text(encoding="utf-8")
    fresh = config_doc.render()
    if committed != fresh:
        diff = difflib.unified_diff(
            committed.splitlines(),
            fresh.splitlines(),
            "docs/configuration.md (committed)",
            "docs/configuration.md (generated)",
            n=0,
            lineterm="",
        )
        pytest.fail(
            "docs/configuration.md is stale (a setting in ha_controller/config/ or "
            "ha_controller/rpc/limits.py changed); regenerate it with:\n"
            f"    {config_doc.COMMAND}\n" + "\n".join(list(diff)[:40])
        )


def test_configuration_reference_names_every_key() -> None:
    text = config_doc.render()
    for _, _, cls in config_doc.COMPONENTS:
        for key in config_keys(cls):
            assert f"| `{key}` |" in text, f"{cls.__name__}: {key} is not in the reference"


def test_every_cross_field_rule_is_read() -> None:
    for _, _, cls in config_doc.COMPONENTS:
        if "_rules" in vars(cls):
            rules = config_doc.rules_of(cls)
            assert rules, f"no rule of {cls.__name__}._rules was read"
            assert all(rule.keys and rule.message for rule in rules), rules


# --- standing alone --------------------------------------------------------------------------

FORBIDDEN = re.compile(r"\.\./shared|/work/shared|DESIGN\.md|\breference/")


@pytest.mark.parametrize("path", [*PAGES, README], ids=lambda p: p.name)
def test_no_page_points_at_files_users_do_not_have(path: Path) -> None:
    hits = [
        f"{path.name}:{n}: {line.strip()}"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if FORBIDDEN.search(line)
    ]
    assert not hits, "the docs must stand alone; these lines point elsewhere:\n  " + (
        "\n  ".join(hits)
    )


#: the internal notes by any of their names, for the code and the other files
CITED = re.compile(
    FORBIDDEN.pattern + r"|STYLE\.md|\b(?:rip32|rpc_clients|pyspark|ecosystem)\.md|\bseeds/"
)
SOURCES = ("*.py", "*.pyi", "*.toml", "*.yaml", "*.yml", "*.sh", "*.md", "*.json", "*.tpl", "*.txt")
SKIPPED_DIRS = {".git", ".venv", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache"}
#: files this test leaves out (none at the moment: each left once it was clean)
ELSEWHERE: set[str] = set()


def _repository_files() -> Iterator[Path]:
    """Every text file of the repository but this test (it names what it looks for)."""
    names = {"Makefile", "Dockerfile", "run"}
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            path = Path(top) / name
            rel = path.relative_to(ROOT).as_posix()
            elsewhere = any(rel == e or rel.startswith(e + "/") for e in ELSEWHERE)
            if elsewhere or path == Path(__file__):
                continue
            if name in names or any(path.match(pattern) for pattern in SOURCES):
                yield path


def test_no_file_points_at_the_internal_notes() -> None:
    """Docstrings, comments and configs say their point in place or link docs/."""
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _repository_files()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if CITED.search(line)
    ]
    assert not hits, "these lines send a reader to notes users do not have:\n  " + (
        "\n  ".join(hits)
    )


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")


@pytest.mark.parametrize("path", [*PAGES, README], ids=lambda p: p.name)
def test_relative_links_lead_to_files(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    broken = [
        target
        for target in LINK.findall(text)
        if "://" not in target and not (path.parent / target).exists()
    ]
    assert not broken, f"{path.name} links to missing files: {broken}"


# --- protocol tables -------------------------------------------------------------------------


def test_request_code_table_matches_the_code() -> None:
    rows = {
        (int(cells[0]), cells[1].strip("`"))
        for cells in _rows(_section(_page("protocol.md"), "Request codes"))
    }
    expected = {(int(code), code.name) for code in RequestCode}
    assert rows == expected, (
        f"docs/protocol.md request codes: missing {sorted(expected - rows)}, "
        f"not in ha_controller/protocol/codes.py {sorted(rows - expected)}"
    )


def test_error_table_matches_the_code() -> None:
    rows = {
        int(cells[0]): (cells[1].strip("`"), cells[2])
        for cells in _rows(_section(_page("protocol.md"), "Errors"))
    }
    expected = {
        code: (cls.__name__, "yes" if cls.retriable else "no")
        for code, cls in error_table().items()
    }
    assert rows == expected, (
        "docs/protocol.md errors differ from ha_controller/protocol/errors.py: "
        f"{sorted(set(rows.items()) ^ set(expected.items()))}"
    )


# --- HTTP and metrics ------------------------------------------------------------------------


def _exported_metrics() -> set[str]:
    from prometheus_client import CollectorRegistry

    from broker_agent.metrics import BrokerMetrics
    from ha_controller.rpc.metrics import RPC_METRICS
    from nameserver.controller import ControllerMetrics
    from nameserver.metrics import NameserverMetrics

    group = {
        "cluster": "c",
        "brokerName": "g",
        "actingBrokerId": 1,
        "masterOnline": False,
        "members": [{"brokerId": 1, "lastHeartbeatAgeMs": 5}],
    }
    controller = CollectorRegistry()  # a nameserver with etcd_endpoints
    ControllerMetrics(controller)
    broker = BrokerMetrics("c", "g", 0)
    broker.export_consumer_lag(lambda: None, lambda: 0, 10)
    registries = [
        broker.registry,
        NameserverMetrics(lambda: [group], lambda: {("c", "g"): 1.0}).registry,
        controller,
    ]
    names = set(RPC_METRICS)
    try:
        from ha_controller.proxy.metrics import ProxyMetrics
    except ImportError:  # grpcio missing: the gateway's table is then not checked
        pass
    else:
        registries.append(ProxyMetrics().registry)
    for registry in registries:
        for family in registry.collect():
            names.add(family.name + "_total" if family.type == "counter" else family.name)
    return names


def test_every_metric_is_documented() -> None:
    text = _page("http-and-metrics.md")
    documented = set(re.findall(r"^\| `((?:hac|rocketmq)_\w+)` \|", text, flags=re.MULTILINE))
    exported = _exported_metrics()
    missing = exported - documented
    assert not missing, f"docs/http-and-metrics.md lacks {sorted(missing)}"
    unknown = {m for m in documented - exported if not m.startswith("hac_proxy_")}
    assert not unknown, f"docs/http-and-metrics.md documents metrics nobody exports: {unknown}"


def test_every_http_route_is_documented() -> None:
    from broker_agent.listeners import http_routes as broker_routes
    from nameserver.app import http_routes as nameserver_routes

    text = _page("http-and-metrics.md")
    paths = [
        route.path
        for routes in (nameserver_routes(None), broker_routes(None))  # type: ignore[arg-type]
        for route in routes
    ]
    paths += ["/healthz", "/readyz", "/metrics"]
    missing = [p for p in paths if f"### `GET {p}`" not in text and f"`GET {p}`" not in text]
    assert not missing, f"docs/http-and-metrics.md has no section for {missing}"
