"""Shared fixtures. Paths only; no global state to reset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PROFILES = ROOT / "cluster_profiles"

# Validation imports DeepSpeed; on this CPU machine say so up front (silences its warning).
os.environ.setdefault("DS_ACCELERATOR", "cpu")


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
