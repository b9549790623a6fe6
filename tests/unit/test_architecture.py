"""The house rules of docs/architecture.md, checked on the import graph and the tree.

* no import circle between modules (``TYPE_CHECKING`` imports included);
* the layers: a package imports only packages below it, never a sibling of its layer;
* no source file over 800 lines.

The graph is grimp's (import-linter's engine): it reads the imports from the source,
function-level ones included, without running anything.
"""

from __future__ import annotations

import sys
from pathlib import Path

import grimp
import pytest
from grimp import Layer

SRC = Path(__file__).resolve().parents[2] / "src" / "kubeproxy"

# Highest first; the packages of one layer are independent of each other. The same table
# is drawn in docs/architecture.md.
LAYERS = (
    Layer("__main__"),
    Layer("cli"),
    Layer("app", "lab"),
    Layer("explain", "metrics"),
    Layer("health", "runner", "sources", "backends"),
    Layer("config", "controlplane"),
    Layer("dataplane"),
    Layer("model"),
    Layer("logs", "oom", "profiling"),
)
MAX_LINES = 800


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("kubeproxy", exclude_type_checking_imports=False)


def test_every_package_of_kubeproxy_has_a_layer() -> None:
    placed = {m for layer in LAYERS for m in layer.module_tails}
    present = {p.stem for p in SRC.glob("*.py")} | {
        p.name for p in SRC.iterdir() if (p / "__init__.py").exists()
    }
    assert present - {"__init__"} == placed


def test_no_import_reaches_up_a_layer_or_across_one(graph: grimp.ImportGraph) -> None:
    illegal = graph.find_illegal_dependencies_for_layers(layers=LAYERS, containers={"kubeproxy"})
    found = sorted(
        f"{dep.importer} -> {dep.imported}: "
        + "; ".join(" -> ".join((*r.heads, *r.middle, *r.tails)) for r in dep.routes)
        for dep in illegal
    )
    assert found == []


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
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

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph.modules)))
    try:
        for module in sorted(graph.modules):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_no_import_circle(graph: grimp.ImportGraph) -> None:
    assert _cycles(graph) == []


def test_a_circle_is_found() -> None:
    g = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        g.add_import(importer=a, imported=b)
    assert _cycles(g) == [["p.a", "p.b", "p.c"]]


def test_no_source_file_over_800_lines() -> None:
    long = {
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
