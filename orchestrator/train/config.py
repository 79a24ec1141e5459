"""The plan directory as the entrypoint trains it, and what the entrypoint refuses.

The directory is read by the one loader every dsorch command uses (orchestrator.plandir): it
checks plan.yaml's schema and the sha256 of every generated file, so a hand-edited plan is
refused rather than half-applied. The model and training settings come from the spec plan.yaml
carries, the layout from its layout section, ``ds_config.json`` goes to DeepSpeed unchanged.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.errors import InvalidFile
from orchestrator.plan.rules import stage_split
from orchestrator.plandir.reader import PlanDir, load_plan_dir


def check_trainable(pd: PlanDir) -> None:
    """What the bundled entrypoint cannot train, as one error with the fix."""
    t = pd.spec.training
    if pd.runtime != "deepspeed":
        raise InvalidFile(
            f"{pd.path} is a plan for the {pd.runtime} runtime; the bundled entrypoint trains "
            "deepspeed plans (re-plan with --runtime deepspeed)"
        )
    for name, value in (
        ("training.hidden_dropout", t.hidden_dropout),
        ("training.attention_dropout", t.attention_dropout),
    ):
        if value:
            raise InvalidFile(
                f"{name} {value}: the bundled entrypoint trains without dropout (its tensor-parallel layers keep "
                "no per-rank RNG tracker); set dropout to 0 in the model spec or use --runtime megatron"
            )
    if pd.layout.vpp != 1:
        raise InvalidFile(
            "vpp > 1 (interleaved 1F1B) is not in DeepSpeed's pipeline engine; "
            "plan with --vpp 1 or use --runtime megatron"
        )


def stage_layers(pd: PlanDir) -> tuple[int, ...]:
    """Decoder layers on each pipeline stage (rules.stage_split, the planner's own split)."""
    pp = pd.layout.pp
    split = stage_split(pd.spec.model.num_layers, pp)
    if split is None:  # the loader's schema and the planner agree, so only a bug gets here
        raise InvalidFile(f"{pd.path}: {pd.spec.model.num_layers} layers do not split over pp={pp}")
    if pp == 1:
        return (split.first,)
    return (split.first, *([split.middle] * (pp - 2)), split.last)


def ds_config(pd: PlanDir) -> dict:
    """The plan's ds_config.json. The loader requires one of a deepspeed plan, the only runtime
    check_trainable lets through, so only a bug gets here without it."""
    config = pd.ds_config
    if config is None:
        raise InvalidFile(f"{pd.path}: no ds_config.json; regenerate the plan directory with `dsorch plan`")
    return config


def load_plan(plan_dir: str | Path) -> PlanDir:
    pd = load_plan_dir(plan_dir)
    check_trainable(pd)
    return pd
