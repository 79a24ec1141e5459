"""Every module of orchestrator/ is named in docs/ARCHITECTURE.md's module map, so that a newcomer
finds each file's one job there (issue 36: 12 of 97 were missing).

The rule, for the rows of the "Module map" table: a row's first column names modules in backticks,
the first one by its path under orchestrator/ (`cli/submit.py`) and those after it either by their
path or by their file name in the first one's folder (`cli/submit.py`, `jobs.py` names
cli/jobs.py). A row whose first column is a bare folder (`render/`) names, in its second column,
the modules of that folder by their path below it (`ds_config.py`). A package's ``__init__.py`` needs
a name only when it defines something (a function or a class); a docstring and imports are its
package's row."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ..conftest import ROOT
from .test_import_layers import LAYERS

PACKAGE = ROOT / "orchestrator"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"


def _map_rows(text: str) -> list[list[str]]:
    """The cells of each row of the module map (between "## Module map" and the next heading)."""
    section = text.split("\n## Module map\n", 1)[1].split("\n## ", 1)[0]
    return [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| `")
    ]


def _named(rows: list[list[str]]) -> set[str]:
    """Paths under orchestrator/ that the rows name, by the rule in the module docstring."""
    named: set[str] = set()
    for cells in rows:
        first = re.findall(r"`([^`]+)`", cells[0])
        if not first:
            continue
        folder = first[0].rpartition("/")[0]
        folder = f"{folder}/" if folder else ""
        tokens = list(first)
        if first == [folder]:
            tokens += re.findall(r"`([^`]+)`", " ".join(cells[1:]))
        named.update(t if t.startswith(folder) else folder + t for t in tokens if t.endswith(".py"))
    return named


def _needs_a_name(path: Path) -> bool:
    if path.name != "__init__.py":
        return True
    body = ast.parse(path.read_text(), str(path)).body
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in body)


def _unnamed(modules: dict[str, Path], text: str) -> list[str]:
    named = _named(_map_rows(text))
    return [m for m, path in sorted(modules.items()) if m not in named and _needs_a_name(path)]


def test_every_module_is_in_the_module_map():
    modules = {p.relative_to(PACKAGE).as_posix(): p for p in sorted(PACKAGE.rglob("*.py"))}
    missing = _unnamed(modules, ARCHITECTURE.read_text())
    assert not missing, f"not in docs/ARCHITECTURE.md's module map: {missing}; add a row (or name it in its folder's row)"


def test_the_module_map_rule_reads_grouped_and_folder_rows(tmp_path):
    text = "\n".join([
        "# x",
        "## Module map",
        "| module | its one job |",
        "|---|---|",
        "| `errors.py`, `resources.py` | ground |",
        "| `cli/submit.py`, `jobs.py` | two commands; not `cli/trial.py` here: `plan.py` is in the job |",
        "| `render/` | `ds_config.py`, `megatron.py`, from `templates/` |",
        "| `train/data/indexed.py` | one file of a subpackage |",
        "## Flow",
        "| `ports.py` | after the map: not in it |",
    ])
    empty_init = tmp_path / "__init__.py"
    empty_init.write_text('"""A package."""\nfrom os import path\n')
    busy = tmp_path / "busy" / "__init__.py"
    busy.parent.mkdir()
    busy.write_text("def f():\n    pass\n")
    modules = {
        name: empty_init if name == "cli/__init__.py" else busy if name == "render/__init__.py" else tmp_path / "m.py"
        for name in [
            "errors.py", "resources.py", "ports.py", "cli/__init__.py", "cli/submit.py", "cli/jobs.py",
            "cli/plan.py", "render/__init__.py", "render/ds_config.py", "render/megatron.py",
            "render/plan_md.py", "train/data/indexed.py", "train/data/loader.py",
        ]
    }
    assert _unnamed(modules, text) == [
        "cli/plan.py", "ports.py", "render/__init__.py", "render/plan_md.py", "train/data/loader.py",
    ]


def test_the_layer_table_is_the_one_the_import_test_enforces():
    """docs/ARCHITECTURE.md's "Layers" table, numbered from 1 at the ground, names the entries of
    test_import_layers.LAYERS, layer by layer."""
    text = ARCHITECTURE.read_text()
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    table = {
        int(cells[0]): set(re.findall(r"`([^`]+)`", cells[1]))
        for cells in ([c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines())
        if cells[0].isdigit()
    }
    assert table == {level + 1: set(entries) for level, entries in enumerate(LAYERS)}
