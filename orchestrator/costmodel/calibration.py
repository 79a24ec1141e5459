"""The fitted efficiencies of the time model, as data, and the rule that picks them for a profile.

The values live in ``calibration.yaml`` next to this file (package data, parsed once: it is a
constant of the package, like a table in code, but written by ``scripts/fit_calibration.py``
rather than by hand). Resolution, field by field, first hit wins:

1. the profile's own ``efficiency`` section (after ``extends`` merging, so a user profile that
   extends a shipped one inherits what that one states);
2. the first ``hardware`` entry of the table whose ``gpus`` list contains the profile's
   ``gpu.name`` (case-insensitive) and whose ``inter_node`` kind matches the profile's;
3. the first entry matching the GPU name alone (link efficiencies are fractions of the profile's
   own link bandwidth, so they carry over to another fabric better than nothing);
4. the table's ``default`` entry.

Nothing here reads the environment or writes anything.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import yaml

from ..specs import ClusterProfile

FIELDS = ("gemm", "attention", "hbm", "intra_node_comm", "inter_node_comm", "dp_overlap", "tp_overlap")
TABLE_FILE = "calibration.yaml"


@dataclass(frozen=True)
class Resolved:
    """Efficiencies the cost model uses for one profile, and where each came from."""

    gemm: float
    attention: float
    hbm: float
    intra_node_comm: float
    inter_node_comm: float
    dp_overlap: float
    tp_overlap: float
    sources: tuple[tuple[str, str], ...]  # (field, "profile" | "calibration:<entry id>" | "default")
    entry: str | None  # the calibration entry used for the GPU, if any
    # Step-time error of the model on the entry's calibration set (fractions), for "within error".
    mean_rel_error: float | None
    max_rel_error: float | None

    def values(self) -> dict[str, float]:
        return {f: getattr(self, f) for f in FIELDS}


@functools.lru_cache(maxsize=1)
def calibration_table() -> dict:
    """The parsed calibration.yaml (cached; it is package data and never changes at run time)."""
    text = resources.files(__package__).joinpath(TABLE_FILE).read_text(encoding="utf-8")
    return yaml.safe_load(text)


def _matches(entry: dict, profile: ClusterProfile, with_fabric: bool) -> bool:
    names = {n.lower() for n in entry.get("gpus", [])}
    if profile.gpu.name.lower() not in names:
        return False
    return not with_fabric or entry.get("inter_node") == profile.inter_node.kind


def hardware_entry(profile: ClusterProfile, table: dict | None = None) -> dict | None:
    table = calibration_table() if table is None else table
    for with_fabric in (True, False):
        for entry in table.get("hardware", []):
            if _matches(entry, profile, with_fabric):
                return entry
    return None


def resolve_efficiency(profile: ClusterProfile, table: dict | None = None) -> Resolved:
    table = calibration_table() if table is None else table
    entry = hardware_entry(profile, table)
    default = table["default"]["efficiency"]
    values: dict[str, float] = {}
    sources = []
    for f in FIELDS:
        explicit = getattr(profile.efficiency, f)
        if explicit is not None:
            values[f], src = float(explicit), "profile"
        elif entry is not None and f in entry["efficiency"]:
            values[f], src = float(entry["efficiency"][f]), f"calibration:{entry['id']}"
        else:
            values[f], src = float(default[f]), "default"
        sources.append((f, src))
    err = (entry or {}).get("step_time_error") or table["default"].get("step_time_error") or {}
    return Resolved(**values, sources=tuple(sources), entry=None if entry is None else entry["id"],
                    mean_rel_error=err.get("mean"), max_rel_error=err.get("max"))
