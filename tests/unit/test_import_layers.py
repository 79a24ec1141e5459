"""The layer order of orchestrator/, enforced: no module imports a higher layer or a sibling of its
own layer, and nothing imports in a circle, not even inside a function (docs/ARCHITECTURE.md
draws the same layers).

Every ``import`` and ``from ... import`` statement anywhere in a module counts, read from the source
with ``ast``; ``from package import name`` counts as importing ``package.name`` where that is a
module. Each check is a function of a graph, and each has a test on a small made-up graph that it
fails, so that a check which cannot fail shows."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ..conftest import ROOT

PACKAGE = ROOT / "orchestrator"

# Lowest first, written as docs/ARCHITECTURE.md's layer table writes them: "spec/" is that folder
# and everything below it (new subpackages join their parent's layer), "errors.py" that one file.
# Entries on one line are siblings: neither may import the other, except on the ground line, whose
# modules import only the standard library and each other (ports.py raises errors.py's JobError;
# the circle test still holds them). A module that no entry names fails
# test_every_module_has_a_layer: a new top-level module needs a deliberate place here.
LAYERS: tuple[tuple[str, ...], ...] = (
    # ports.py: the master port of a job, for render/scripts.py (job.sbatch's lines) and
    # run/scheduler.py (submitit's); it imports only errors.py, so it is ground, below both.
    ("__init__.py", "errors.py", "resources.py", "ports.py"),
    ("spec/",),
    ("runtimes/",),
    ("costmodel/",),
    ("plan/",),
    ("plandir/",),
    ("render/", "validate/"),
    ("compose.py", "calibrate/", "train/"),
    ("run/",),
    ("cli/",),
)
GROUND = 0


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


def _relative(path: Path) -> str:
    """A module's path as LAYERS writes it: relative to orchestrator/, with "/"."""
    return path.relative_to(PACKAGE).as_posix()


def _slot(relative: str, layers=LAYERS) -> tuple[int, str] | None:
    """(layer, entry) of a module's path relative to orchestrator/; None if no entry names it."""
    for level, entries in enumerate(layers):
        for entry in entries:
            if relative == entry or (entry.endswith("/") and relative.startswith(entry)):
                return level, entry
    return None


def _unplaced(relatives, layers=LAYERS) -> list[str]:
    return [r for r in sorted(relatives) if _slot(r, layers) is None]


def _against_the_order(graph: dict[str, set[str]], slots: dict[str, tuple[int, str]]) -> list[str]:
    """Each edge of ``graph`` that imports a higher layer (up) or a sibling of its own (across); a module
    without a slot is test_every_module_has_a_layer's to report."""
    bad = []
    for module, imported in sorted(graph.items()):
        if module not in slots:
            continue
        level, entry = slots[module]
        for other in sorted(o for o in imported if o in slots):
            o_level, o_entry = slots[other]
            if o_level > level:  # numbered from 1, as docs/ARCHITECTURE.md's table
                bad.append(f"{module} -> {other} (up: layer {level + 1} imports layer {o_level + 1})")
            elif o_level == level and o_entry != entry and level != GROUND:
                bad.append(f"{module} -> {other} (across: siblings {entry} and {o_entry})")
    return bad


def test_every_module_has_a_layer():
    missing = _unplaced(_relative(p) for p in _modules().values())
    assert not missing, f"in no layer: {missing}; add each to LAYERS (and docs/ARCHITECTURE.md's table)"


def test_no_import_goes_up_or_across():
    slots = {name: _slot(_relative(path)) for name, path in _modules().items() if _slot(_relative(path))}
    bad = _against_the_order(_graph(), slots)
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_a_module_outside_every_layer_is_caught():
    # orchestrator/__init__.py is the ground's entry, not a prefix of every module (it once was).
    modules = ["__init__.py", "errors.py", "spec/model.py", "spec/new/deep.py", "scheduler.py", "specs/x.py"]
    assert _unplaced(modules) == ["scheduler.py", "specs/x.py"]


def test_an_import_up_or_across_is_caught():
    slots = {
        "errors": (0, "errors.py"),
        "ports": (0, "ports.py"),
        "spec.model": (1, "spec/"),
        "spec.cluster": (1, "spec/"),
        "render.a": (6, "render/"),
        "validate.b": (6, "validate/"),
    }
    graph = {
        "errors": set(),
        "ports": {"errors"},  # ground modules may import each other
        "spec.model": {"errors", "spec.cluster"},  # down, and within its own package
        "spec.cluster": {"render.a"},  # up
        "render.a": {"validate.b", "spec.model"},  # across, and down
        "validate.b": set(),
    }
    assert _against_the_order(graph, slots) == [
        "render.a -> validate.b (across: siblings render/ and validate/)",
        "spec.cluster -> render.a (up: layer 2 imports layer 7)",
    ]


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


# Module sizes (issue 36): a module past these has grown two jobs; split it by what it does, as
# costmodel/evaluate.py was split by stack. The cost model's numeric modules are held tighter.
MAX_LINES = 800
MAX_LINES_IN = {"costmodel": 600}


def _oversized(lengths: dict[str, int]) -> list[str]:
    """The modules (paths under orchestrator/) longer than their limit, with both figures."""
    out = []
    for rel, n in sorted(lengths.items()):
        limit = MAX_LINES_IN.get(rel.split("/")[0], MAX_LINES)
        if n > limit:
            out.append(f"{rel}: {n} lines (limit {limit})")
    return out


def test_no_module_is_over_its_size_limit():
    lengths = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert _oversized(lengths) == [], "split these modules by what they do:\n" + "\n".join(_oversized(lengths))


def test_the_size_check_catches_an_oversized_module():
    assert _oversized({"costmodel/x.py": 601, "costmodel/y.py": 600, "spec/z.py": 801, "cli/w.py": 800}) == [
        "costmodel/x.py: 601 lines (limit 600)",
        "spec/z.py: 801 lines (limit 800)",
    ]
