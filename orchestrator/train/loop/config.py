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
from orchestrator.runtimes import runtime_named


def check_trainable(pd: PlanDir) -> None:
    """What the bundled entrypoint cannot train, as one error with the fix."""
    t = pd.spec.training
    runtime = runtime_named(pd.runtime)
    if not runtime.bundled_trainer:
        raise InvalidFile(
            f"{pd.path} is a plan for the {runtime.name} runtime; the bundled entrypoint trains "
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
    untrained = untrained_features(pd.spec.model)
    if untrained:
        raise InvalidFile(
            f"{pd.path}: the bundled entrypoint does not train {'; '.join(untrained)}. Plan the model with "
            "--runtime megatron (Megatron-LM trains them), or drop these keys from the model spec"
        )
    problems = expert_layout_problems(pd.spec.model, pd.layout)
    if problems:
        raise InvalidFile(f"{pd.path}: layout {pd.layout.short()}: {'; '.join(problems)}")


def untrained_features(model) -> list[str]:
    """The model spec's keys the bundled entrypoint's model (train/model/decoder.py, train/model/moe.py) has no
    layer for, each with what it is. The planner plans them all; Megatron-LM trains them."""
    out = []
    if model.mla is not None:
        out.append("model.mla (multi-latent attention, DeepSeek-V2/V3)")
    if model.mtp_layers:
        out.append(f"model.mtp_layers {model.mtp_layers} (DeepSeek-V3's multi-token prediction modules)")
    if model.sliding_window is not None:
        out.append(f"model.sliding_window {model.sliding_window} (sliding-window attention)")
    if model.attention_sinks:
        out.append("model.attention_sinks (GPT-OSS's learned attention sinks)")
    if model.activation == "quick_geglu":
        out.append("model.activation quick_geglu (GPT-OSS's x sigmoid(1.702 x) gate)")
    if model.activation_clamp is not None:
        out.append(f"model.activation_clamp {model.activation_clamp} (GPT-OSS's clamped GLU)")
    if model.glu_linear_offset:
        out.append(f"model.glu_linear_offset {model.glu_linear_offset} (GPT-OSS's offset on the GLU's linear half)")
    if model.moe is not None and model.moe.expert_bias:
        out.append(
            "model.moe.expert_bias (auxiliary-loss-free balancing, Wang et al. 2024: a per-expert routing "
            "bias updated between steps from the expert loads; the entrypoint balances with the auxiliary "
            "loss only, so set moe.load_balancing aux_loss or seq_aux_loss instead)"
        )
    return out


def expert_layout_problems(model, layout) -> list[str]:
    """What of the expert axes the bundled entrypoint cannot train (train/model/moe.py says why): its
    experts are split over the tp group (etp = tp) and carved from the data-parallel ranks (ep
    divides dp), and DeepSpeed handles their gradients at ZeRO-1 and ZeRO-2 only."""
    if model.moe is None:
        return [] if layout.ep == layout.etp == 1 else ["a dense model has no experts: plan it with --ep 1 --etp 1"]
    problems = []
    e = model.moe.num_experts
    if e % layout.ep:
        problems.append(f"ep {layout.ep} does not divide the {e} experts of a MoE layer; use an ep dividing {e}")
    if layout.dp % layout.ep:
        problems.append(
            f"ep {layout.ep} does not divide dp {layout.dp}: the entrypoint's expert groups are ep consecutive "
            f"data-parallel ranks; use an ep dividing {layout.dp}"
        )
    if layout.etp != layout.tp:
        problems.append(
            f"etp {layout.etp} differs from tp {layout.tp}: the entrypoint splits each expert over the tensor-parallel "
            f"group like the dense MLP (etp = tp); plan with --etp {layout.tp} or use --runtime megatron"
        )
    if layout.ep > 1 and layout.zero_stage not in (1, 2):
        problems.append(
            f"ZeRO-{layout.zero_stage} with ep {layout.ep}: DeepSpeed reduces and partitions expert parameters at "
            "ZeRO-1 and ZeRO-2 only (ZeRO-3 refuses its MoE layers, engine.py _validate_zero3_moe_compatibility; "
            "at ZeRO-0 its fp32 gradient clipping averages each rank's norm instead of summing the experts', "
            "runtime/utils.py clip_grad_norm_); plan with --zero 1 or --zero 2"
        )
    return problems


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
