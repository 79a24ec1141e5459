"""Megatron-LM's argument table, read from ``megatron_args.json``, and the parsed flags' values by
argparse ``dest`` with the table's defaults behind them (``Args``), which every family of checks in
``megatron_*.py`` reads.

The table is generated from the pinned megatron-core wheel by ``scripts/refresh_megatron_args.py``;
see its header for the version and sha256. It lives beside this module, as package data of
``orchestrator.validate`` (pyproject.toml).
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

_TABLE_FILE = "megatron_args.json"


@functools.lru_cache(maxsize=1)
def load_table() -> dict[str, Any]:
    """The checked-in argument table (works for editable and regular installs)."""
    text = resources.files(__package__).joinpath(_TABLE_FILE).read_text(encoding="utf-8")
    return json.loads(text)


@functools.lru_cache(maxsize=1)
def by_option() -> dict[str, dict[str, Any]]:
    """Each option string (``--bf16``, ``--no-bias-gelu-fusion``) to its record in the table."""
    return {opt: rec for rec in load_table()["arguments"] for opt in rec["option_strings"]}


def megatron_version() -> str:
    return load_table()["megatron_core_version"]


def known_flags() -> frozenset[str]:
    return frozenset(by_option())


class Args:
    """Parsed values by argparse ``dest``; ``get`` falls back to the table's default."""

    def __init__(self, values: dict[str, Any], given: dict[str, str]):
        self.values, self.given = values, given
        self._defaults = {rec["dest"]: rec.get("default") for rec in load_table()["arguments"]}

    def get(self, dest: str, default: Any = None) -> Any:
        if dest in self.values:
            return self.values[dest]
        value = self._defaults.get(dest)
        return default if value is None else value

    def has(self, dest: str) -> bool:
        return dest in self.values

    def flag(self, dest: str) -> str:
        """The flag spelling the user wrote (or the table's first one) for messages."""
        if dest in self.given:
            return self.given[dest]
        for rec in load_table()["arguments"]:
            if rec["dest"] == dest:
                return rec["option_strings"][0]
        return "--" + dest.replace("_", "-")
