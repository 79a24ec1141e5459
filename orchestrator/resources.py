"""Where the shipped templates and cluster profiles are.

In a source checkout (and an editable install) they are the top-level ``templates/`` and
``cluster_profiles/`` folders; a regular ``pip install .`` puts them inside the package as
``orchestrator/_templates`` and ``orchestrator/_profiles`` (see pyproject.toml).
"""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _find(installed: str, checkout: str) -> Path:
    inside = _PKG / installed
    return inside if inside.is_dir() else _PKG.parent / checkout


def templates_dir() -> Path:
    return _find("_templates", "templates")


def shipped_profiles_dir() -> Path:
    return _find("_profiles", "cluster_profiles")
