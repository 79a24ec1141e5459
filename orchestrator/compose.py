"""From loaded inputs to the files of a plan directory: search, render, validate.

The CLI resolves the inputs (orchestrator.cli.project, orchestrator.spec.model) and decides what to do
with the files (write, --check, print); this is what happens in between. It lives apart from
``orchestrator.plan.make`` because the renderers read ``Plan``: plan -> render -> pipeline, no cycle.
"""

from __future__ import annotations

from orchestrator.errors import DsorchError
from orchestrator.plan.make import Plan, make_plan
from orchestrator.render import render_all
from orchestrator.plan.layout import Pins
from orchestrator.spec.cluster import LoadedProfile
from orchestrator.spec.model import SpecFile
from orchestrator.validate.plan_dir import validate_files


def plan_files(spec: SpecFile, spec_path: str, spec_sha256: str, profile: LoadedProfile, runtime: str, pins: Pins,
               *, nodes: int | None, gpus_per_node: int | None, memory_margin_gib: float, keep: int,
               shown_path: str) -> tuple[Plan, dict[str, str]]:
    """The chosen plan and its files, each validated by DeepSpeed's and Megatron-LM's own rules.
    ``spec_path`` is the spec as the files name it (relative to the plan directory),
    ``shown_path`` as the user gave it (for errors)."""
    the_plan = make_plan(spec, spec_path, spec_sha256, profile, runtime, pins, nodes=nodes,
                         gpus_per_node=gpus_per_node, memory_margin_gib=memory_margin_gib, keep=keep,
                         shown_path=shown_path)
    return the_plan, checked_files(the_plan)


def checked_files(the_plan: Plan) -> dict[str, str]:
    """The files of a plan, rendered and validated (a plan made by make_plan, or one changed after)."""
    files = render_all(the_plan)
    errors = validate_files(files, dp=the_plan.layout.dp, world_size=the_plan.profile.world_size,
                            runtime=the_plan.runtime)
    if errors:
        raise DsorchError("the generated files do not validate (a dsorch bug; please report it with the spec and "
                          "profile):\n  " + "\n  ".join(errors))
    return files
