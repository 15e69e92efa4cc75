"""The import architecture of ``ha_controller``, ``nameserver`` and ``broker_agent``.

Every module is parsed with :mod:`ast` (nothing is imported) and every static import
counts: module level, inside functions, under ``if TYPE_CHECKING:``.  Generated
``*_pb2*.py`` modules are left out.  An import of ``a.b.c`` is an edge to ``a.b.c``
and to the packages ``a`` and ``a.b`` whose ``__init__`` it runs, except the
importer's own enclosing packages (they are already being imported when it runs).
``from a.b import c`` is an edge to the module ``a.b.c`` when there is one, else to
``a.b`` (a name defined in its ``__init__``).

The layer rules are checked along import chains, so that a rule also catches what a
module pulls in through others (the client SDK must not load the config loader,
not even through ``ha_controller.rpc``); a failure names the whole chain.  One module
may cross a package line: ``ha_controller.cli.services``, the front door, starts the
servers (:data:`FRONT_DOOR`), inside the commands that run them.  No module hides an
import from this graph (``importlib.import_module`` or ``__import__`` of a module of
ours, or of a name computed at run time).
"""

from __future__ import annotations

import ast
import functools
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ha_controller", "nameserver", "broker_agent")
GENERATED = re.compile(r"_pb2(_grpc)?\.pyi?$")
#: The one module allowed to cross a package line, and what it may import there: the
#: ``hactl nameserver`` / ``broker`` commands start the servers.
FRONT_DOOR_MODULE = "ha_controller.cli.services"
FRONT_DOOR = frozenset(
    (FRONT_DOOR_MODULE, target)
    for target in (
        "nameserver",
        "nameserver.app",
        "broker_agent",
        "broker_agent.app",
        "broker_agent.container",
    )
)
#: Calls that import a module by a name given at run time.
DYNAMIC_IMPORTS = frozenset({"import_module", "__import__", "reload"})


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} (line {self.line})"


@dataclass(frozen=True)
class Graph:
    #: our modules (generated ones left out) -> their file
    files: dict[str, Path]
    #: every import of a module, by importer; targets may be outside our packages
    imports: dict[str, tuple[Edge, ...]]

    def edges(self, source: str) -> Iterator[Edge]:
        """Imports of ``source`` that are modules of ours (the graph's edges)."""
        return (e for e in self.imports[source] if e.target in self.files)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _ancestors(module: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module if is_package else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _targets(module: str, path: Path, all_modules: frozenset[str]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import statement anywhere in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, _is_package(path), node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in all_modules else base), node.lineno


def _edges_of(module: str, path: Path, all_modules: frozenset[str]) -> tuple[Edge, ...]:
    own_packages = set(_ancestors(module))
    out: dict[str, Edge] = {}
    for target, line in _targets(module, path, all_modules):
        for name in [*_ancestors(target), target]:
            if name != module and name not in own_packages and name not in out:
                out[name] = Edge(module, name, line)
    return tuple(out.values())


@functools.cache
def import_graph() -> Graph:
    every: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                every[_module_name(path)] = path
    all_modules = frozenset(every)  # generated ones too: "from x.proto import y_pb2"
    files = {m: p for m, p in every.items() if not GENERATED.search(p.name)}
    imports = {m: _edges_of(m, p, all_modules) for m, p in files.items()}
    return Graph(files, imports)


def _in(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def find_cycles(graph: Graph) -> list[list[Edge]]:
    """One cycle (as a closed chain of edges) per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(start: str) -> None:
        # Tarjan's algorithm, iterative (the graph is deep enough for the recursion limit
        # to matter some day).
        work: list[tuple[str, Iterator[Edge]]] = [(start, graph.edges(start))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            edge = next(edges, None)
            if edge is not None:
                nxt = edge.target
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, graph.edges(nxt)))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)

    for module in sorted(graph.files):
        if module not in index:
            connect(module)
    return [_cycle_in(graph, component) for component in components]


def _cycle_in(graph: Graph, component: set[str]) -> list[Edge]:
    """A shortest closed chain through the smallest module of ``component``."""
    start = min(component)
    came: dict[str, Edge] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for edge in graph.edges(node):
            if edge.target not in component:
                continue
            if edge.target == start:
                chain = [edge]
                while chain[0].source != start:
                    chain.insert(0, came[chain[0].source])
                return chain
            if edge.target not in came:
                came[edge.target] = edge
                queue.append(edge.target)
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def chain_to(
    graph: Graph,
    source: str,
    forbidden: tuple[str, ...],
    allowed: frozenset[tuple[str, str]] = frozenset(),
) -> list[Edge] | None:
    """A shortest import chain from ``source`` to a module under ``forbidden``, or None.

    The chain may end outside our modules (``asyncio``); it passes only through ours,
    and never along an ``allowed`` (importer, imported) edge.
    """
    came: dict[str, Edge] = {}
    queue = deque([source])
    seen = {source}
    while queue:
        node = queue.popleft()
        for edge in graph.imports[node]:
            if (edge.source, edge.target) in allowed:
                continue
            if any(_in(edge.target, f) for f in forbidden):
                chain = [edge]
                while chain[0].source != source:
                    chain.insert(0, came[chain[0].source])
                return chain
            if edge.target in graph.files and edge.target not in seen:
                seen.add(edge.target)
                came[edge.target] = edge
                queue.append(edge.target)
    return None


def _show(chain: list[Edge]) -> str:
    return " -> ".join([chain[0].source, *(f"{e.target} (line {e.line})" for e in chain)])


def assert_never_imports(sources: tuple[str, ...], forbidden: tuple[str, ...]) -> None:
    graph = import_graph()
    modules = [m for m in sorted(graph.files) if any(_in(m, s) for s in sources)]
    assert modules, f"no modules under {sources}"
    bad = []
    for module in modules:
        chain = chain_to(graph, module, forbidden, FRONT_DOOR)
        if chain is not None:
            bad.append(_show(chain))
    assert not bad, (
        f"{', '.join(sources)} must not import {', '.join(forbidden)}, "
        f"but {len(bad)} module(s) do:\n  " + "\n  ".join(bad)
    )


# --- the graph itself ----------------------------------------------------------------------


def test_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    assert {"ha_controller.config", "nameserver.service", "broker_agent.service"} <= set(
        graph.files
    )
    assert not [m for m in graph.files if "_pb2" in m]
    # a relative import inside a package, and its __init__ is not an edge of its own members
    store = {e.target for e in graph.edges("broker_agent.store.message_store")}
    assert "broker_agent.store.commitlog" in store
    assert "broker_agent.store" not in store
    # "from package import name" of a name defined in the package's __init__
    orderly = {e.target for e in graph.edges("ha_controller.client.orderly")}
    assert "ha_controller.rpc" in orderly
    # importing a submodule from outside runs the package's __init__ too
    assert "ha_controller.protocol" in orderly


def _dynamic_imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, what) of every call that imports by a run-time name: ``import_module``,
    ``__import__`` or ``reload`` (by any spelling: ``importlib.x``, an alias, a name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name not in DYNAMIC_IMPORTS:
            continue
        arg = node.args[0] if node.args else None
        what = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else ""
        yield node.lineno, what


def test_no_import_is_hidden_from_the_graph() -> None:
    """A module of ours imported by a run-time name is an edge the rules never see: it
    must be an import statement.  Only an optional third-party module named by a
    literal may be loaded so (``uvloop``, when it is installed)."""
    hidden = []
    for module, path in sorted(import_graph().files.items()):
        for line, what in _dynamic_imports(path):
            ours = any(_in(what, package) for package in PACKAGES)
            if not what or ours:
                hidden.append(f"{module} (line {line}): {what or 'a name computed at run time'}")
    assert not hidden, "imports hidden from the architecture test:\n  " + "\n  ".join(hidden)


def test_the_hidden_import_finder_sees_every_spelling(tmp_path: Path) -> None:
    path = tmp_path / "x.py"
    path.write_text(
        "import importlib\n"
        "from importlib import import_module as load\n"
        "importlib.import_module('nameserver.app')\n"
        "__import__(name)\n"
        "importlib.reload(mod)\n"
        "importlib.import_module('uvloop')\n"
    )
    assert list(_dynamic_imports(path)) == [(3, "nameserver.app"), (4, ""), (5, ""), (6, "uvloop")]


def test_the_front_door_imports_the_servers_only_when_a_command_runs() -> None:
    """``hactl --help`` and the client tools load no server: the front door's imports
    of the service packages are inside the commands."""
    graph = import_graph()
    crossing = {
        e.target for e in graph.imports[FRONT_DOOR_MODULE] if (e.source, e.target) in FRONT_DOOR
    }
    assert crossing == {t for _, t in FRONT_DOOR}, "tests/unit/test_architecture.py FRONT_DOOR"
    tree = ast.parse(graph.files[FRONT_DOOR_MODULE].read_text(encoding="utf-8"))
    top = [
        node.lineno
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        and any(
            _in(name, package)
            for package in ("nameserver", "broker_agent")
            for name in (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
        )
    ]
    assert not top, f"{FRONT_DOOR_MODULE} imports a server at module level (lines {top})"


def test_cycle_finder_reports_the_chain() -> None:
    path = ROOT / "x.py"
    edges = {
        "p": (Edge("p", "p.a", 1),),
        "p.a": (Edge("p.a", "p.b", 2),),
        "p.b": (Edge("p.b", "p.a", 3), Edge("p.b", "asyncio", 4)),
        "q": (Edge("q", "p", 5),),
    }
    graph = Graph(dict.fromkeys(edges, path), edges)
    [cycle] = find_cycles(graph)
    assert [str(e) for e in cycle] == ["p.a -> p.b (line 2)", "p.b -> p.a (line 3)"]
    chain = chain_to(graph, "q", ("asyncio",))
    assert chain is not None
    assert _show(chain) == "q -> p (line 5) -> p.a (line 1) -> p.b (line 2) -> asyncio (line 4)"


# --- the rules -------------------------------------------------------------------------------


def test_no_import_cycles() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, f"{len(cycles)} import cycle(s):\n  " + "\n  ".join(map(_show, cycles))


@pytest.mark.parametrize(
    ("sources", "forbidden"),
    [
        (("ha_controller",), ("nameserver", "broker_agent")),
        (("nameserver",), ("broker_agent",)),
        (("broker_agent",), ("nameserver",)),
    ],
    ids=["ha_controller", "nameserver", "broker_agent"],
)
def test_packages_stay_apart(sources: tuple[str, ...], forbidden: tuple[str, ...]) -> None:
    assert_never_imports(sources, forbidden)


@pytest.mark.parametrize(
    ("sources", "forbidden"),
    [
        (
            ("ha_controller.client",),
            (
                "ha_controller.proxy",
                "ha_controller.drills",
                "ha_controller.pipeline",
                "ha_controller.cli",
                "ha_controller.config",
                "nameserver",
                "broker_agent",
            ),
        ),
        (("ha_controller.protocol",), ("asyncio", "ha_controller.rpc")),
        (("ha_controller.rpc",), ("ha_controller.config",)),
    ],
    ids=["client", "protocol", "rpc"],
)
def test_layers(sources: tuple[str, ...], forbidden: tuple[str, ...]) -> None:
    assert_never_imports(sources, forbidden)


def test_special_services_do_not_import_the_broker_service() -> None:
    assert_never_imports(("broker_agent.special",), ("broker_agent.service",))


def test_membership_does_not_import_the_special_services() -> None:
    """Membership (registration, the member group, pre-online, forward sync) is below
    the special services: the broker service hands it their tables and the appliers of
    their progress records."""
    assert_never_imports(("broker_agent.membership",), ("broker_agent.special",))


def test_the_metadata_tables_sit_below_the_broker_parts() -> None:
    """metadata/ (the tables, their files, their sync) is handed what it needs through
    narrow ports: it never reaches the core, membership, the special services, the write
    path or the service."""
    assert_never_imports(
        ("broker_agent.metadata",),
        (
            "broker_agent.core",
            "broker_agent.membership",
            "broker_agent.special",
            "broker_agent.write_path",
            "broker_agent.service",
        ),
    )


def test_the_write_path_and_the_store_do_not_import_the_core() -> None:
    """The write path sees its broker through ``WriteCore`` (the unit tests run it over
    an in-memory store), the store sees nothing of the broker."""
    assert_never_imports(
        ("broker_agent.write_path", "broker_agent.store"),
        ("broker_agent.core", "broker_agent.service"),
    )


def test_only_the_write_path_puts_into_the_store() -> None:
    store_put = re.compile(r"\bstore\.put(?:_batch)?\(")
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted((ROOT / "broker_agent").rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if store_put.search(line)
    ]
    elsewhere = [h for h in hits if not h.startswith("broker_agent/write_path.py:")]
    assert not elsewhere, "only broker_agent/write_path.py may call store.put(...):\n  " + (
        "\n  ".join(elsewhere)
    )
    assert len(hits) == 1, (
        "expected exactly one store.put(...), in broker_agent/write_path.py:\n  "
        + ("\n  ".join(hits) or "(none)")
    )


def test_test_file_names_are_unique() -> None:
    """The test folders are not packages, so pytest imports each test file by its bare
    name: two files of one name in two folders fail the whole suite's collection."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    twice = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not twice, f"test files sharing a name: {twice}"
