"""From loaded inputs to the files of a plan directory: search, render, validate.

The CLI resolves the inputs (orchestrator.cli.project, orchestrator.spec.model) and decides what to do
with the files (write, --check, print); this is what happens in between. It lives apart from
``orchestrator.plan.make`` because the renderers read ``Plan``: plan -> render -> pipeline, no cycle.

``replan`` takes its inputs from a plan directory instead (`dsorch plan --check PLAN_DIR`):
``recorded_inputs`` reads what plan.yaml recorded, and ``replan`` makes it a ``PlanRequest`` again.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import DsorchError, InvalidFile, SpecError
from orchestrator.plan.layout import Pins
from orchestrator.plan.make import Plan, make_plan
from orchestrator.plan.request import KEEP, PlanRequest
from orchestrator.plandir.reader import PLAN_FILE, load_plan_dir
from orchestrator.render import render_all
from orchestrator.render.ds_config import render_ds_config
from orchestrator.render.megatron import render_megatron_args
from orchestrator.render.overrides import invalid_message, refusal_message, refusals
from orchestrator.runtimes import Runtime, runtime_named
from orchestrator.spec.cluster import load_profile
from orchestrator.spec.model import load_spec
from orchestrator.spec.overrides import Overrides
from orchestrator.validate.plan_dir import unchecked_flags, validate_files


def plan_files(request: PlanRequest) -> tuple[Plan, dict[str, str]]:
    """The chosen plan and its files, each validated by DeepSpeed's and Megatron-LM's own rules.
    ``request.spec_path`` is the spec as the files name it (relative to the plan directory),
    ``request.shown`` as the user gave it (for errors)."""
    the_plan = make_plan(request)
    return the_plan, checked_files(the_plan, request.shown)


def _errors(the_plan: Plan, files: dict[str, str]) -> list[str]:
    return validate_files(
        files,
        dp=the_plan.layout.dp,
        world_size=the_plan.profile.world_size,
        runtime=the_plan.runtime,
        overrides=the_plan.spec.overrides,
    )


def checked_files(the_plan: Plan, shown_path: str | None = None) -> dict[str, str]:
    """The files of a plan, rendered and validated (a plan made by make_plan, or one changed after).
    The spec's overrides are refused where they set the layout, and blamed (by ``shown_path``, the
    spec as the user gave it) where the files validate without them and not with them."""
    overrides = the_plan.spec.overrides
    spec = shown_path or the_plan.spec_path
    refused = refusals(overrides)
    if refused:
        raise SpecError(refusal_message(spec, refused))
    files = render_all(the_plan, unchecked_flags(overrides))
    errors = _errors(the_plan, files)
    if errors and not overrides.empty:
        bare = dataclasses.replace(the_plan, spec=the_plan.spec.model_copy(update={"overrides": Overrides()}))
        own = {"megatron_args.txt": render_megatron_args(bare)}
        if "ds_config.json" in files:
            own["ds_config.json"] = render_ds_config(bare)
        if not _errors(bare, own):
            raise SpecError(invalid_message(spec, overrides, errors))
    if errors:
        raise DsorchError(
            "the generated files do not validate (a dsorch bug; please report it with the spec and "
            "profile):\n  " + "\n  ".join(errors)
        )
    return files


@dataclass(frozen=True, kw_only=True, slots=True)
class Recorded:
    """What a plan directory was planned from, as plan.yaml's ``inputs`` record it: ``replan`` loads
    the spec and the profile and makes a ``PlanRequest`` of it."""

    spec: Path  # the model spec file, found from the plan directory
    spec_path: str  # as plan.yaml records it: relative to the plan directory
    cluster: str  # the profile's name, looked up again as `--cluster NAME` would be
    runtime: Runtime
    nodes: int  # the node count planned for
    # --nodes was given (a re-plan keeps the count) or not (it follows the profile); None: a plan.yaml
    # written before dsorch recorded which (``given_nodes``).
    nodes_given: bool | None
    gpus_per_node: int | None  # --gpus-per-node, when it was given
    pins: Pins
    memory_margin_gib: float | None  # None: the default margin, derived again
    keep: int  # layouts kept: plan.yaml lists the chosen one and keep - 1 alternatives

    def given_nodes(self, profile_nodes: int) -> int | None:
        """--nodes for a re-plan on a profile of ``profile_nodes`` nodes, None for the profile's count.
        A plan.yaml that does not record whether --nodes was given: a count other than the profile's
        came from --nodes (the profile's own count may have changed since, but a plan is far more often
        resized by --nodes), and the profile's own count gives the same plan either way."""
        given = self.nodes != profile_nodes if self.nodes_given is None else self.nodes_given
        return self.nodes if given else None


def recorded_inputs(plan_dir: Path) -> Recorded:
    """The inputs ``plan_dir`` was planned from. A plan `dsorch trial` chose from measured runs is
    refused: planning from the inputs alone cannot repeat its measurements."""
    plan_dir = Path(plan_dir)
    # strict=False: a generated file edited since is a difference for --check to show, not a reason
    # to refuse the directory.
    doc = load_plan_dir(plan_dir, strict=False).doc
    if doc.evidence is not None:
        raise InvalidFile(
            f"{plan_dir} was chosen by `dsorch trial` from measured runs (evidence in its plan.yaml), "
            f"which planning from its inputs alone cannot repeat; leave it out of `dsorch plan --check "
            f"PLAN_DIR...`, or collect the trials again (`dsorch trial --collect`)."
        )
    inputs = doc.inputs
    spec_path, cluster = inputs.model_spec.path, inputs.cluster_profile.name
    if spec_path is None or cluster is None:
        missing = "model spec path" if spec_path is None else "cluster profile name"
        raise InvalidFile(
            f"{plan_dir / PLAN_FILE}: records no {missing} to plan from; re-plan it with `dsorch plan "
            f"SPEC --out {plan_dir}`."
        )
    try:
        pins = Pins(**inputs.pinned)
    except TypeError:
        raise InvalidFile(
            f"{plan_dir / PLAN_FILE}: inputs.pinned names an axis this dsorch does not pin "
            f"({', '.join(inputs.pinned)}); re-plan it with `dsorch plan SPEC --out {plan_dir}`."
        ) from None
    return Recorded(
        spec=plan_dir / spec_path,
        spec_path=spec_path,
        cluster=cluster,
        runtime=runtime_named(doc.runtime),
        nodes=inputs.nodes,
        nodes_given=inputs.nodes_given,
        gpus_per_node=inputs.gpus_per_node,
        pins=pins,
        memory_margin_gib=None if inputs.memory_margin_derived else inputs.memory_margin_gib,
        # --top decides how many alternatives plan.yaml and plan.md list; the count listed gives it
        # back (plans written before the regenerate line said --top included; the default when fewer
        # layouts were legal than kept gives the same list).
        keep=max(KEEP, 1 + len(doc.alternatives)),
    )


def replan(plan_dir: Path, profiles_dir: str | Path | None) -> tuple[Plan, dict[str, str]]:
    """The plan and files ``plan_dir``'s recorded inputs give now: its model spec as it is now, and
    its cluster profile looked up by name in ``profiles_dir`` and the shipped ones. Whatever changed
    since (the spec, the profile, dsorch) shows as a difference from the files in ``plan_dir``."""
    r = recorded_inputs(plan_dir)
    shown = os.path.normpath(r.spec)
    if not r.spec.is_file():
        raise InvalidFile(
            f"{plan_dir / PLAN_FILE} records the model spec {r.spec_path} (relative to the plan "
            f"directory), and {shown} is not a file; restore it, or re-plan with `dsorch plan SPEC "
            f"--out {plan_dir}`."
        )
    spec, loaded = load_spec(r.spec)
    try:
        profile = load_profile(r.cluster, profiles_dir)
    except DsorchError as e:
        raise type(e)(f"{plan_dir} was planned on cluster profile '{r.cluster}': {e}") from None
    return plan_files(
        PlanRequest(
            spec=spec,
            spec_path=r.spec_path,
            spec_sha256=loaded.sha256,
            profile=profile,
            runtime=r.runtime,
            pins=r.pins,
            nodes=r.given_nodes(profile.profile.nodes),
            gpus_per_node=r.gpus_per_node,
            memory_margin_gib=r.memory_margin_gib,
            keep=r.keep,
            shown_path=shown,
        )
    )
