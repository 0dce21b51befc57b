"""The import graph of ``bridge/``, read with ``ast`` (every import counts: module level, inside
functions and under ``TYPE_CHECKING``): no cycles, and no adapter imports the composer."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "bridge"
ADAPTERS = (
    "bridge.server.ws_impl",
    "bridge.server.grpc_impl",
    "bridge.server.ingest",
    "bridge.server.push_impl",
    "bridge.server.subscribers",
    "bridge.server.http_impl",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    """Python modules, and extension modules by their stubs (``_native.pyi``)."""
    return {
        _module_name(p): p
        for pattern in ("*.py", "*.pyi")
        for p in PACKAGE.rglob(pattern)
        if "v1" not in p.relative_to(PACKAGE).parts[:1]  # generated protobuf code
    }


def imports_of(source: str, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The known modules that ``source`` (module ``name``) imports anywhere in its text."""
    package = name if is_package else name.rpartition(".")[0]
    edges: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.append(sub if sub in known else base)
        for target in targets:
            while target and target not in known:  # "import a.b.c" where c is a name
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
    return edges


def import_graph() -> dict[str, set[str]]:
    """Module -> the ``bridge`` modules it imports (resolved to a module, not a name in it)."""
    modules = _modules()
    known = set(modules)
    return {
        name: imports_of(path.read_text(), name, path.stem == "__init__", known)
        for name, path in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_checker_counts_type_checking_and_function_level_imports() -> None:
    source = """
from typing import TYPE_CHECKING
from . import b
if TYPE_CHECKING:
    from p.c import Thing
def later():
    import p.d.e
"""
    known = {"p", "p.a", "p.b", "p.c", "p.d"}
    assert imports_of(source, "p.a", False, known) == {"p.b", "p.c", "p.d"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_inside_bridge() -> None:
    assert cycles(import_graph()) == []


def test_no_adapter_imports_the_composer() -> None:
    graph = import_graph()
    offenders = {m for m in ADAPTERS if "bridge.server.app" in graph[m]}
    assert not offenders, (
        f"adapters must use bridge.server.ports, not bridge.server.app: {sorted(offenders)}"
    )
