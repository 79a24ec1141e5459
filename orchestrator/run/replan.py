"""`dsorch replan`: a run goes on with another number of nodes. The same spec is planned for the new
world (the global batch kept: the spec's), the fastest layout whose checkpoint DeepSpeed can
convert is chosen, and the run's newest intact checkpoint is converted to it (DeepSpeed's
universal checkpoint, orchestrator/train/checkpoint/reshard.py). `dsorch submit NEW_PLAN --resume-from
RUN_DIR` then continues the same run directory: the step, the LR schedule's position and the
optimizer state come from the checkpoint; the data position is a function of the step and the
global batch (train/data/datasets.py), so no sample is skipped or repeated; the step records go on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import CheckpointError, DsorchError, JobError, NoFeasibleLayout, SpecError
from orchestrator.plandir.rundir import RunDir

if TYPE_CHECKING:  # imported where they are used: re-planning loads the solver and the renderers
    from orchestrator.plan.layout import Layout, Pins
    from orchestrator.plan.make import Plan
    from orchestrator.plandir.reader import PlanDir
    from orchestrator.spec.cluster import ClusterProfile
    from orchestrator.spec.model import SpecFile


@dataclass(frozen=True)
class Replanned:
    plan: Plan
    out: Path
    run_dir: Path
    step: int
    source: Layout
    universal: Path


def find_run(project, ref: str) -> Path:
    """A run directory, or the run directory of a job (registry key or scheduler id)."""
    p = Path(ref)
    if p.is_dir():
        return p
    from orchestrator.run.registry import Registry

    rec = Registry(project.root).get(ref)  # unknown: one paragraph naming the known ids
    if not rec.run_dir:
        raise JobError(f"job {rec.job_id} has no run directory (its submission never reached the scheduler).")
    return Path(rec.run_dir)


@dataclass(frozen=True)
class _Checkpoint:
    """The checkpoint a re-plan converts: the newest intact one, its step and layout, and the plan
    directory that wrote it (from its manifest)."""

    path: Path
    step: int
    layout: Layout
    plan: PlanDir


def replan(
    project,
    run_dir: Path,
    nodes: int | None,
    gpus_per_node: int | None,
    pins: Pins,
    out: Path | None,
    profiles_dir: str | None,
) -> Replanned:
    from orchestrator.compose import plan_files
    from orchestrator.plan.layout import Pins
    from orchestrator.plan.request import PlanRequest
    from orchestrator.plandir.writer import spec_path_in, write_plan_dir
    from orchestrator.runtimes import DEEPSPEED
    from orchestrator.spec.cluster import load_profile
    from orchestrator.train.checkpoint import reshard
    from orchestrator.train.checkpoint import store as checkpoint

    ckpt_dir = RunDir(run_dir).checkpoints
    ckpt = newest_checkpoint(ckpt_dir)
    old = ckpt.plan
    spec_path, spec, spec_sha256 = _unchanged_spec(old)
    lp = load_profile(old.doc.cluster.name, profiles_dir)
    if out is None:  # named after what changed
        suffix = (f"-{nodes}n" if nodes else "") + (f"-{gpus_per_node}g" if gpus_per_node else "")
        out = old.path.parent / f"{old.path.name}{suffix}"
    gpn = gpus_per_node or old.doc.inputs.gpus_per_node
    nodes = nodes or old.doc.inputs.nodes  # --gpus-per-node alone keeps the run's node count
    profile = lp.profile.resized(nodes, gpn)
    target = _convertible_target(spec, spec_path, profile, pins, ckpt, run_dir)
    the_plan, files = plan_files(
        PlanRequest(
            spec=spec,
            spec_path=spec_path_in(spec_path, out),
            spec_sha256=spec_sha256,
            profile=lp,
            runtime=DEEPSPEED,  # the bundled entrypoint's checkpoint is what is resharded
            pins=Pins.of(target),
            nodes=nodes,
            gpus_per_node=gpn,
            memory_margin_gib=None if old.doc.inputs.memory_margin_derived else old.doc.inputs.memory_margin_gib,
            shown_path=str(spec_path),
        )
    )
    write_plan_dir(out, files)
    universal = ckpt_dir / f"{checkpoint.UNIVERSAL_PREFIX}{ckpt.path.name}"
    reshard.convert(
        ckpt.path,
        universal,
        reshard.naming(target.pp),
        spec.model.tied_embeddings,
        # The data fingerprint goes along, so that a resume from the conversion is checked as one
        # from the native checkpoint is (train/data/fingerprint.py).
        {
            "step": ckpt.step,
            "layout": ckpt.layout.as_dict(),
            "plan": str(out.resolve()),
            "data": checkpoint.manifest_of(ckpt.path).get("data"),
        },
    )
    return Replanned(the_plan, out, run_dir, ckpt.step, ckpt.layout, universal)


def newest_checkpoint(ckpt_dir: Path) -> _Checkpoint:
    """The run's newest intact checkpoint and the plan that wrote it; an error says why there is
    none to convert."""
    from orchestrator.plan.layout import Layout
    from orchestrator.plandir.reader import load_plan_dir
    from orchestrator.train.checkpoint import store as checkpoint

    native = checkpoint.newest_intact(ckpt_dir)
    if native is None:
        raise CheckpointError(
            f"{ckpt_dir}: no intact checkpoint to convert. A run writes one at its end, when it is "
            f"stopped (`dsorch cancel`, SLURM's time-limit warning) and every --save-interval steps."
        )
    man = checkpoint.manifest_of(native)
    if "plan" not in man:
        raise CheckpointError(
            f"{native} was written by an older dsorch that did not record its plan and layout; "
            f"resume it with the plan that wrote it."
        )
    step, source = int(man["step"]), Layout(**man["layout"])
    try:
        old = load_plan_dir(man["plan"])
    except DsorchError as e:
        raise CheckpointError(f"the plan that wrote {native} does not load ({e}); restore it to re-plan.") from None
    return _Checkpoint(native, step, source, old)


def _unchanged_spec(old: PlanDir) -> tuple[Path, SpecFile, str]:
    """The model spec ``old`` was planned from (its path, the spec, its sha256), refused when it
    changed since: the checkpoint is of the spec as it was."""
    from orchestrator.plandir.reader import PLAN_FILE
    from orchestrator.spec.model import load_spec

    recorded = old.doc.inputs.model_spec
    if recorded.path is None:  # dsorch records it; only a hand-edited plan.yaml lacks it
        raise CheckpointError(
            f"{old.path / PLAN_FILE}: records no model spec path; restore the plan that wrote the "
            f"checkpoint to re-plan this run."
        )
    spec_path = (old.path / recorded.path).resolve()
    spec, loaded_spec = load_spec(spec_path)
    if loaded_spec.sha256 != recorded.sha256:
        raise SpecError(
            f"{spec_path} changed since {old.path} was planned; the checkpoint is of the old spec. "
            f"Restore the spec to re-plan this run."
        )
    return spec_path, spec, loaded_spec.sha256


def _convertible_target(
    spec: SpecFile, spec_path: Path, profile: ClusterProfile, pins: Pins, ckpt: _Checkpoint, run_dir: Path
) -> Layout:
    """The fastest layout for ``profile`` that the checkpoint's layout converts to (the global
    batch kept: the spec's); an error says why there is none."""
    from orchestrator.plan.solver import search
    from orchestrator.runtimes import DEEPSPEED
    from orchestrator.train.checkpoint import reshard

    source = ckpt.layout
    ranked = search(
        spec.model,
        spec.training,
        profile,
        DEEPSPEED,
        pins,
        keep=1_000_000,
        memory_margin_gib=ckpt.plan.doc.inputs.memory_margin_gib,
    ).ranked
    target = next((s.layout for s in ranked if not reshard.convertible(source, s.layout)), None)
    if target is None:
        why = (
            reshard.convertible(source, ranked[0].layout)[0]
            if ranked
            else f"no layout of {spec.name} fits {profile.nodes} x {profile.gpus_per_node} GPUs of {profile.name} "
            f"(`dsorch plan {spec_path} --cluster {profile.name} --nodes {profile.nodes}` says why)"
        )
        raise NoFeasibleLayout(f"cannot re-plan {run_dir} for {profile.nodes} node(s): {why}.")
    return target
