"""The layer order of orchestrator/, enforced: no module imports a higher layer or a sibling of its
own layer, and nothing imports in a circle, not even inside a function (docs/ARCHITECTURE.md
draws the same layers).

Every ``import`` and ``from ... import`` statement anywhere in a module counts, read from the source
with ``ast``; ``from package import name`` counts as importing ``package.name`` where that is a
module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ..conftest import ROOT

PACKAGE = ROOT / "orchestrator"

# Lowest first. Packages on one line are siblings: neither may import the other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("orchestrator", "orchestrator.errors", "orchestrator.resources"),
    ("orchestrator.spec",),
    ("orchestrator.runtimes",),
    ("orchestrator.costmodel",),
    ("orchestrator.plan",),
    ("orchestrator.plandir",),
    ("orchestrator.render", "orchestrator.validate"),
    ("orchestrator.compose", "orchestrator.calibrate", "orchestrator.train"),
    ("orchestrator.run",),
    ("orchestrator.cli",),
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The orchestrator modules ``name`` imports, at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            out.add(source)
            out.update(f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in known)
    return {m for m in out if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _slot(module: str) -> tuple[int, str]:
    """(layer, the package of that layer) of a module: the longest prefix in LAYERS."""
    best: tuple[int, str] | None = None
    for level, packages in enumerate(LAYERS):
        for pkg in packages:
            if (module == pkg or module.startswith(pkg + ".")) and (best is None or len(pkg) > len(best[1])):
                best = (level, pkg)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add its package to LAYERS (and docs/ARCHITECTURE.md)")
    return best


def test_every_module_has_a_layer():
    for module in _modules():
        _slot(module)


def test_no_import_goes_up_or_across():
    bad = []
    for module, imported in sorted(_graph().items()):
        level, pkg = _slot(module)
        for other in sorted(imported):
            o_level, o_pkg = _slot(other)
            if o_level > level:
                bad.append(f"{module} -> {other} (up: layer {level} imports layer {o_level})")
            elif o_level == level and o_pkg != pkg and pkg != "orchestrator":
                bad.append(f"{module} -> {other} (across: siblings {pkg} and {o_pkg})")
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_nothing_imports_in_a_circle():
    # A package's __init__ that imports its own modules, which import the package's other modules
    # by their full names, is no circle; a module importing its own package's __init__ would be.
    assert _cycles(_graph()) == []


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
])
def test_the_circle_finder_finds_circles(graph, expected):
    assert _cycles(graph) == expected


def test_the_layer_check_sees_a_function_level_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from orchestrator.cli import main\n")
    assert "orchestrator.cli" in _imports("orchestrator.spec.m", source, {"orchestrator.cli", "orchestrator.spec.m"})
