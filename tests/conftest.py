"""Shared fixtures. Paths only; no global state to reset."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PROFILES = ROOT / "cluster_profiles"

# Validation imports DeepSpeed; on this CPU machine say so up front (silences its warning).
os.environ.setdefault("DS_ACCELERATOR", "cpu")


def load_script(name: str):
    """scripts/NAME.py as a module (the scripts are not a package), registered in sys.modules so
    that its dataclasses find their module."""
    spec = importlib.util.spec_from_file_location(f"dsorch_script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def spec_paths() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILES.glob("*.yaml"))


@pytest.fixture
def runner():
    from click.testing import CliRunner

    return CliRunner()


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in an empty directory with the examples reachable as ./examples."""
    (tmp_path / "examples").symlink_to(EXAMPLES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DSORCH_PROFILES_DIR", raising=False)
    return tmp_path


@pytest.fixture
def exp(in_tmp, runner, monkeypatch):
    """An experiment directory made with `dsorch init --cluster dgx16`."""
    from orchestrator.cli.main import main

    monkeypatch.delenv("DSORCH_CLUSTER", raising=False)
    r = runner.invoke(main, ["init", "--cluster", "dgx16"])
    assert r.exit_code == 0, r.output
    return in_tmp


def pytest_collection_modifyitems(config, items):
    """Every SLURM test is a `jobs` test too (scripts/test.sh runs those beside the rest)."""
    for item in items:
        if item.get_closest_marker("slurm") is not None and item.get_closest_marker("jobs") is None:
            item.add_marker(pytest.mark.jobs)
