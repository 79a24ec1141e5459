"""The plan directory's reader (orchestrator/plandir/reader.py): plan.yaml's schema, and the plan
directories older versions wrote."""

from __future__ import annotations

import dataclasses

import pydantic
import pytest

from orchestrator.plandir.reader import PlanLayout

from .test_layout import EVERY_AXIS


def test_old_plan_directories_without_a_later_axis_still_load():
    """cp, ep, etp and recompute_layers came after 0.1: a plan.yaml without them means 1 (0: every layer
    recomputed); the axes of 0.1 stay required."""
    later = ("cp", "ep", "etp", "recompute_layers")
    old = dataclasses.replace(EVERY_AXIS, cp=1, ep=1, etp=1, recompute_layers=0)
    layout = {k: v for k, v in old.as_dict().items() if k not in later}
    doc = PlanLayout(**layout)
    assert (doc.cp, doc.ep, doc.etp, doc.recompute_layers) == (1, 1, 1, 0)
    with pytest.raises(pydantic.ValidationError):
        PlanLayout(**{k: v for k, v in layout.items() if k != "tp"})
