"""Renderers: pure functions from a Plan to the text of each generated file."""

from __future__ import annotations

from ..plan import Plan
from .ds_config import render_ds_config
from .megatron import render_megatron_args
from .report import render_plan_yaml
from .scripts import render_launch, render_sbatch


def render_all(plan: Plan, *, resize_flags: str = "") -> dict[str, str]:
    """File name -> content for a plan directory. The Megatron runtime reads no ds_config.json."""
    files = {
        "megatron_args.txt": render_megatron_args(plan),
        "launch.sh": render_launch(plan),
        "job.sbatch": render_sbatch(plan),
        "plan.yaml": render_plan_yaml(plan, resize_flags),
    }
    if plan.runtime == "deepspeed":
        files["ds_config.json"] = render_ds_config(plan)
    return dict(sorted(files.items()))
