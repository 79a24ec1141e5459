"""`dsorch replan`: a run goes on with another number of nodes. The same spec is planned for the new
world (the global batch kept: the spec's), the fastest layout whose checkpoint DeepSpeed can
convert is chosen, and the run's newest intact checkpoint is converted to it (DeepSpeed's
universal checkpoint, orchestrator/train/reshard.py). `dsorch submit NEW_PLAN --resume-from
RUN_DIR` then continues the same run directory: the step, the LR schedule's position and the
optimizer state come from the checkpoint; the data position is a function of the step and the
global batch (train/data.py), so no sample is skipped or repeated; metrics.jsonl goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import DsorchError


@dataclass(frozen=True)
class Replanned:
    plan: object  # plan.Plan
    out: Path
    run_dir: Path
    step: int
    source: object  # Layout
    universal: Path


def find_run(project, ref: str) -> Path:
    """A run directory, or the run directory of a job (registry key or scheduler id)."""
    p = Path(ref)
    if p.is_dir():
        return p
    from orchestrator.run.registry import Registry

    rec = Registry(project.root).get(ref)  # unknown: one paragraph naming the known ids
    if not rec.run_dir:
        raise DsorchError(f"job {rec.job_id} has no run directory (its submission never reached the scheduler).")
    return Path(rec.run_dir)


def replan(
    project,
    run_dir: Path,
    nodes: int | None,
    gpus_per_node: int | None,
    pins,
    out: Path | None,
    profiles_dir: str | None,
) -> Replanned:
    from orchestrator.compose import plan_files
    from orchestrator.plan.layout import Layout, Pins
    from orchestrator.plan.solver import search
    from orchestrator.plandir.reader import load_plan_dir
    from orchestrator.plandir.writer import spec_path_in, write_plan_dir
    from orchestrator.spec.cluster import load_profile
    from orchestrator.spec.model import load_spec
    from orchestrator.train import checkpoint, reshard

    ckpt_dir = run_dir / "checkpoints"
    native = checkpoint.newest_intact(ckpt_dir)
    if native is None:
        raise DsorchError(
            f"{ckpt_dir}: no intact checkpoint to convert. A run writes one at its end, when it is "
            f"stopped (`dsorch cancel`, SLURM's time-limit warning) and every --save-interval steps."
        )
    man = checkpoint.manifest_of(native)
    if "plan" not in man:
        raise DsorchError(
            f"{native} was written by an older dsorch that did not record its plan and layout; "
            f"resume it with the plan that wrote it."
        )
    step, source = int(man["step"]), Layout(**man["layout"])
    try:
        old = load_plan_dir(man["plan"])
    except DsorchError as e:
        raise DsorchError(f"the plan that wrote {native} does not load ({e}); restore it to re-plan.") from None
    spec_path = (old.path / old.doc.inputs.model_spec.path).resolve()
    spec, loaded_spec = load_spec(spec_path)
    if loaded_spec.sha256 != old.doc.inputs.model_spec.sha256:
        raise DsorchError(
            f"{spec_path} changed since {old.path} was planned; the checkpoint is of the old spec. "
            f"Restore the spec to re-plan this run."
        )
    lp = load_profile(old.doc.cluster.name, profiles_dir)
    if out is None:  # named after what changed
        suffix = (f"-{nodes}n" if nodes else "") + (f"-{gpus_per_node}g" if gpus_per_node else "")
        out = old.path.parent / f"{old.path.name}{suffix}"
    gpn = gpus_per_node or old.doc.inputs.gpus_per_node
    nodes = nodes or old.doc.inputs.nodes  # --gpus-per-node alone keeps the run's node count
    profile = lp.profile.resized(nodes, gpn)
    ranked = search(
        spec.model,
        spec.training,
        profile,
        "deepspeed",
        pins,
        keep=1_000_000,
        memory_margin_gib=old.doc.inputs.memory_margin_gib,
    ).ranked
    target = next((s.layout for s in ranked if not reshard.convertible(source, s.layout)), None)
    if target is None:
        why = (
            reshard.convertible(source, ranked[0].layout)[0]
            if ranked
            else f"no layout of {spec.name} fits {profile.nodes} x {profile.gpus_per_node} GPUs of {profile.name} "
            f"(`dsorch plan {spec_path} --cluster {profile.name} --nodes {profile.nodes}` says why)"
        )
        raise DsorchError(f"cannot re-plan {run_dir} for {profile.nodes} node(s): {why}.")
    the_plan, files = plan_files(
        spec,
        spec_path_in(spec_path, out),
        loaded_spec.sha256,
        lp,
        "deepspeed",
        Pins.of(target),
        nodes=nodes,
        gpus_per_node=gpn,
        memory_margin_gib=old.doc.inputs.memory_margin_gib,
        keep=8,
        shown_path=str(spec_path),
    )
    write_plan_dir(out, files)
    universal = ckpt_dir / f"{checkpoint.UNIVERSAL_PREFIX}{native.name}"
    reshard.convert(
        native,
        universal,
        reshard.naming(target.pp),
        spec.model.tied_embeddings,
        {"step": step, "layout": source.as_dict(), "plan": str(out.resolve())},
    )
    return Replanned(the_plan, out, run_dir, step, source, universal)
