"""Who may import whom, read from the code's own import statements (module level and inside
functions alike, as ``ast`` sees them):

- the product (``bridge/``, ``loadgen/``) imports no benchmark and no test;
- a test imports no benchmark, unless it is a test of that benchmark's own code (named
  ``test_bench_*.py``) or one of the container end-to-end runs (``tests/e2e/``); product tests
  take their stubs and synthetic inputs from ``tests/support/``;
- benchmarks take from ``tests/`` only ``tests.support``;
- no import cycle in ``bridge/``, ``loadgen/`` or ``benchmarks/``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GRAPHED = ("bridge", "loadgen", "benchmarks")

#: Tests outside the rule for now (none at present), each with its reason; they leave the list when
#: their files settle (another engineer is changing each).
TEMPORARY: dict[str, str] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    """Every module of the graphed packages, stubs of compiled extensions (``.pyi``) included."""
    found: dict[str, Path] = {}
    for top in GRAPHED:
        for path in sorted((ROOT / top).rglob("*.py*")):
            if path.suffix in (".py", ".pyi"):
                found.setdefault(_module_name(path), path)
    return found


def _imports(path: Path, modules: dict[str, Path] | None = None) -> Iterator[tuple[str, int]]:
    """(imported module, line) for each import in ``path``; ``from a import b`` names ``a.b``
    when that is a module of ``modules``, else ``a``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full if modules is not None and full in modules else base), node.lineno


def _importers_of(roots: tuple[str, ...], files: list[Path]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for path in files
        for target, line in _imports(path)
        if target.split(".")[0] in roots
    ]


def test_the_product_imports_no_benchmark_and_no_test() -> None:
    files = sorted([*(ROOT / "bridge").rglob("*.py"), *(ROOT / "loadgen").rglob("*.py")])
    assert _importers_of(("benchmarks", "tests"), files) == []


def test_tests_import_no_benchmark() -> None:
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[1] == "e2e" or path.name.startswith("test_bench_") or str(rel) in TEMPORARY:
            continue
        offenders += _importers_of(("benchmarks",), [path])
    assert offenders == [], "move what the test needs to tests/support/"


def test_temporary_exceptions_still_need_to_be_exceptions() -> None:
    """An exception that no longer imports a benchmark leaves the list."""
    for rel in TEMPORARY:
        path = ROOT / rel
        assert path.exists() and _importers_of(("benchmarks",), [path]), rel


def test_benchmarks_take_from_tests_only_its_support() -> None:
    found = _importers_of(("tests",), sorted((ROOT / "benchmarks").rglob("*.py")))
    assert [f for f in found if not f.endswith("tests.support") and ".support." not in f] == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan; the graph is a few hundred modules deep at most
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        if path.suffix != ".py":
            continue
        for target, _ in _imports(path, modules):
            if target in modules and target != name:
                graph[name].add(target)
    return graph


def test_no_import_cycle() -> None:
    assert _cycles(import_graph()) == []


def test_the_cycle_finder_finds_one() -> None:
    """The check above can fail: a two-module loop and a three-module loop are both found."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert _cycles(graph) == [["a", "b"], ["c", "d", "e"]]


def test_the_graph_sees_function_level_and_relative_imports() -> None:
    graph = import_graph()
    assert "loadgen.aio" in graph["loadgen.procs"]
    assert "bridge.decimate.filecli" in graph["bridge.cli"]  # imported inside _decimate()
    assert len(graph) > 150 and sum(map(len, graph.values())) > 300


#: The layers of ``bridge/`` and what each may import (besides itself). ``protocol`` is what every
#: side shares; ``server`` is the data plane, and only the CLI that starts it imports it.
LAYERS_MAY_IMPORT: dict[str, set[str]] = {
    "v1": set(),
    "logs": set(),
    "protogen": set(),
    "protocol": {"v1"},
    "config": {"protocol"},
    "decimate": {"protocol", "v1"},
    "client": {"protocol", "v1"},
    "view": {"protocol", "v1", "client", "logs"},
    "resources": {"protocol", "config"},
    "server": {"protocol", "config", "decimate", "resources", "v1", "logs"},
    # The supervisor: light (its memory counts against the pod's limit), so no data plane.
    "pod": {"protocol", "config", "resources", "logs"},
    "cli": set(),  # starts every product: may import any layer
}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return None if parts[0] != "bridge" or len(parts) == 1 else parts[1]


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        here = _layer(module)
        if here is None or here == "cli":
            continue
        assert here in LAYERS_MAY_IMPORT, f"{module}: a layer the house does not know"
        for target in sorted(targets):
            there = _layer(target)
            if there not in (None, here) and there not in LAYERS_MAY_IMPORT[here]:
                found.append(f"{module} imports {target} ({here} may not import {there})")
    return found


def test_each_layer_imports_only_what_it_may() -> None:
    assert layer_violations(import_graph()) == []


def test_the_layer_check_finds_a_violation() -> None:
    graph = {
        "bridge.protocol.wire": {"bridge.server.core"},
        "bridge.client.core": {"bridge.protocol.wire"},
        "bridge.view.feed": {"bridge.server.ring", "bridge.client.core"},
    }
    assert layer_violations(graph) == [
        "bridge.protocol.wire imports bridge.server.core (protocol may not import server)",
        "bridge.view.feed imports bridge.server.ring (view may not import server)",
    ]
