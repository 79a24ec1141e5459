"""Renderers: pure functions from a Plan to the text of each generated file."""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.plan.make import Plan
from orchestrator.plandir.reader import sha256_text
from orchestrator.render.ds_config import render_ds_config
from orchestrator.render.megatron import render_megatron_args
from orchestrator.render.plan_md import render_plan_md
from orchestrator.render.report import regenerate_command, render_plan_yaml
from orchestrator.render.scripts import render_launch, render_sbatch
from orchestrator.runtimes import DS_CONFIG, MEGATRON_ARGS

# The renderer of each file a runtime ``renders`` (Runtime.renders), one registration per file.
RENDERERS: dict[str, Callable[[Plan], str]] = {
    DS_CONFIG: render_ds_config,
    "job.sbatch": render_sbatch,
    "launch.sh": render_launch,
    MEGATRON_ARGS: render_megatron_args,
}


def render_all(plan: Plan, unchecked: frozenset[str] = frozenset()) -> dict[str, str]:
    """File name -> content for a plan directory: the files the plan's runtime renders (the
    Megatron runtime reads no ds_config.json), then plan.md, which lists the sha256 of the files
    before it, and plan.yaml last, which records the sha256 of every other file. ``unchecked``: the
    spec's override flags that Megatron-LM's argument table does not know
    (orchestrator.validate.plan_dir.unchecked_flags), marked so in plan.md."""
    files = {name: RENDERERS[name](plan) for name in plan.runtime.renders}
    files["plan.md"] = render_plan_md(
        plan, {name: sha256_text(text) for name, text in sorted(files.items())}, regenerate_command(plan), unchecked
    )
    files["plan.yaml"] = render_plan_yaml(plan, {name: sha256_text(text) for name, text in sorted(files.items())})
    return dict(sorted(files.items()))
