"""What a plan says beside its numbers: the near-ties it resolved, the memory margin it kept and
why, the MFU convention, how sure it is (a GEMM rate only runs of another precision or GPU measured;
a predicted MFU above the best the calibration data measured), with the one command that would
measure it, and a SLURM warning that leaves too little of each allocation for training.

``notes_doc`` is plan.yaml's (and --json's) ``explain.notes`` section; ``notes_text`` the same as
sentences, which `dsorch plan` prints under the chosen layout and plan.md lists under "How sure".
Pure functions of a ``Plan``: nothing is evaluated again but the FLOP count of the other convention.
"""

from __future__ import annotations

from orchestrator.costmodel.calibration import (
    PRECISION_WORDS,
    best_measured_mfu,
    engine_of,
    resolve_efficiency,
)
from orchestrator.plan.make import Plan
from orchestrator.plan.request import TRIAL_STEPS
from orchestrator.render.overrides import leaf_paths
from orchestrator.runtimes import DS_CONFIG
from orchestrator.spec.sbatch import parse_slurm_time


def _r(x: float, nd: int = 4) -> float:
    return float(round(float(x), nd))


def _near_ties(plan: Plan) -> dict | None:
    nt = plan.result.near_ties
    if nt is None:
        return None
    return {
        "band": _r(nt.band),
        "basis": nt.basis,
        "within_band": nt.count,
        "fastest": nt.fastest.layout.short(),
        "chosen_vs_fastest": _r(plan.chosen.step_time_s / nt.fastest.step_time_s - 1.0),
        "others": [s.layout.short() for s in nt.others],
    }


def _mfu(plan: Plan) -> dict:
    """MFU as the plan states it (attention counted non-causally, as Megatron-LM's
    num_floating_point_operations and its reported MFU do), and the causal figure (half the s^2
    attention FLOPs: what the causal mask lets FlashAttention skip; PaLM's App. B convention)."""
    d = plan.decisions
    return {
        "convention": "attention counted non-causally (Megatron-LM's count)",
        "mfu": _r(plan.chosen.mfu),
        "mfu_causal": _r(plan.chosen.mfu * d.model_flops_causal / d.model_flops),
    }


def _trial(plan: Plan) -> dict:
    """The one command that measures the chosen layout on the user's cluster, and its price, TRIAL_STEPS
    steps of each layout on the whole cluster by the plan's predictions. The deepspeed runtime:
    `dsorch trial --top 1`, the chosen layout and the best of every other family that fits
    (run/trial.py select_trials). A trial runs dsorch's entrypoint only, so a megatron plan is
    measured by submitting it for a few steps (Megatron-LM's iteration lines become the run's
    metrics, run/megatron_log.py) and calibrating the profile from that run."""
    if not plan.runtime.bundled_trainer:
        runs = [plan.chosen]
        command = (
            f"dsorch submit PLAN_DIR --steps {TRIAL_STEPS} --wait, then dsorch calibrate RUN_DIR --cluster "
            f"{plan.profile.name}"
        )
    else:
        runs = [plan.chosen] + [fb.scored for fb in plan.result.families if fb.rank is not None and fb.rank > 1]
        command = f"dsorch trial {plan.spec_path} --cluster {plan.profile.name}{plan.resize_flags} --top 1"
    seconds = sum(TRIAL_STEPS * s.step_time_s for s in runs)
    return {"command": command, "layouts": len(runs), "gpu_hours": _r(seconds * plan.profile.world_size / 3600.0, 2)}


def _unmeasured_runtime(plan: Plan) -> str | None:
    """The deepspeed runtime's kernels are dsorch's own entrypoint (PyTorch RMSNorm and SwiGLU, no
    Transformer Engine), but its efficiencies are those fitted to torchtitan's and MosaicML's FSDP
    runs (calibration.BORROWS). The entrypoint's one GPU measurement is a single H200 (scripts/
    gpu_check.sh, docs/measurements/gpu-check-NVIDIA-H200-2026-12-04.yaml): a 0.9B model at 2K
    tokens, six one-GPU layouts, predicted 10 % fast to 21 % slow; nothing at scale. Until a trial
    calibrates the profile (its efficiencies then come from the profile), say so."""
    if not plan.runtime.bundled_trainer:
        return None
    # The entry of the engine without the pipeline (pp 1), as the sentence says: a pipeline layout's
    # own entry (plan.decisions.efficiency, deepspeed-pipeline) has its GEMM rate fitted to DeepSpeed's
    # pipeline runs and borrows the rest from this one (costmodel/calibration.yaml borrowed_from).
    eff = resolve_efficiency(plan.profile, str(engine_of(plan.runtime, plan.layout.zero_stage).item()))
    if eff.domain in ("profile", "adjusted"):
        return None
    return (
        "the deepspeed runtime runs dsorch's own entrypoint (PyTorch RMSNorm and SwiGLU, no Transformer "
        f"Engine), whose GPU speed at scale no run has measured: its efficiencies are "
        f"{eff.entry or 'the defaults'}'s, fitted to torchtitan and MosaicML FSDP runs, so this prediction "
        "can be optimistic (it can come out faster than Megatron-Core's for the same layout); on one H200 "
        "(a 0.9B model, six one-GPU layouts) it was 10 % fast to 21 % slow"
    )


def _rate_transfer(plan: Plan) -> dict | None:
    """Where the chosen layout's GEMM rate comes only from runs of another precision or another GPU
    (costmodel/calibration.py Resolved.transfer), what it rests on; None where a run like the plan
    vouches for it. Issue 37: Llama 3 70B in BF16 on GB200 was predicted at 71.7 % MFU with a GEMM
    rate of 0.95 borrowed from GB300 runs that were all FP8, under the GB200 entry's +-2 % (its two
    MoE runs). No allowed run measures how far a rate carries across precisions or GPUs (that would be
    a fit of one set's values scored on another's runs), so no widening is derived: the layout is
    outside the fitted domain (plan/solver.py takes ``beyond``'s clause) and states no interval."""
    eff, t = plan.decisions.efficiency, plan.spec.training
    moved = eff.transfer(t.fp8 is not None, plan.spec.model.moe is not None)
    if moved is None:
        return None
    held = eff.held_out_max if eff.held_out_max is not None else eff.max_rel_error
    return {
        "entry": moved.entry,
        "borrowed": not moved.own,
        "gemm": _r(moved.gemm),
        "precision": "fp8" if t.fp8 is not None else t.precision,
        "gpu": moved.gpu,
        "runs": [r.id for r in moved.runs],
        "runs_text": moved.runs_text(),
        "other_precision": moved.other_precision,
        "other_gpu": moved.other_gpu,
        "target": moved.target,
        "entry_interval": None if eff.entry is None or held is None else _r(held),
        "plan_entry": eff.entry,
    }


def _rate_transfer_text(plan: Plan, m: dict) -> str:
    how = "borrowed from" if m["borrowed"] else "from"
    interval = (
        f"{m['plan_entry']}'s ±{100 * m['entry_interval']:.1f} % was measured on other runs and does not cover it"
        if m["entry_interval"] is not None
        else "none was measured"
    )
    # The solver leaves such a layout without an interval (Resolved.beyond names the transfer); a
    # profile that states its own values has none either way.
    stated = "states no interval" if plan.chosen.interval is None else "has no interval that covers it"
    return (
        f"{plan.spec.name} in {PRECISION_WORDS[m['precision']]} on {m['gpu']} is predicted at "
        f"{100 * plan.chosen.mfu:.1f} % MFU with a GEMM efficiency, {m['gemm']:.2f}, {how} {m['entry']}, whose "
        f"{m['runs_text']} are the only runs behind it: no published run measures that rate carried to "
        f"{m['target']}, so this plan {stated} ({interval})"
    )


def _mfu_above_measured(plan: Plan) -> dict | None:
    """The chosen layout's predicted MFU against the best any published run of the calibration files
    measured on the plan's hardware in its precision (costmodel/calibration.py best_measured_mfu, the
    same MFU convention); the figures where the prediction is above it (issue 37, "Plausibility"),
    else None."""
    t = plan.spec.training
    best = best_measured_mfu(plan.profile.gpu.name, t.precision, t.fp8 is not None)
    if best is None or plan.chosen.mfu <= best.mfu:
        return None
    return {
        "predicted": _r(plan.chosen.mfu),
        "best_measured": _r(best.mfu),
        "run": best.id,
        "gpu": best.gpu,
        "precision": best.precision,
    }


def _checkpoint(plan: Plan) -> dict:
    """How often the run checkpoints, and why (costmodel/checkpoint.py)."""
    ck = plan.checkpoint
    return {
        "interval_steps": ck.steps,
        "interval_hours": _r(ck.interval_s / 3600.0),
        "basis": "training.checkpoint.interval" if ck.given else ("young_daly_capped" if ck.capped else "young_daly"),
        "young_daly_steps": ck.optimum_steps,
        "size_gb": _r(ck.size_bytes / 1e9, 6),
        "write_gbps": plan.profile.filesystem.write_gbps,
        "write_s": _r(ck.write_s, 6),
        "job_mtbf_hours": _r(ck.mtbf_s / 3600.0, 2),
        "allocation_hours": None if ck.limit_s is None else _r(ck.limit_s / 3600.0),
        # Daly 2006's approximation: a failure lands uniformly inside the interval.
        "lost_per_failure_hours": _r(ck.lost_s / 3600.0),
        "warnings": ck.warnings(),
    }


def _checkpoint_text(plan: Plan) -> list[str]:
    """The checkpoint interval as sentences: what it is, what it rests on, and what is wrong with it."""
    c = _checkpoint(plan)
    how = {
        "training.checkpoint.interval": "as the spec sets it",
        "young_daly": "Young/Daly's sqrt(2 x write x MTBF)",
        "young_daly_capped": (
            f"Young/Daly's {c['young_daly_steps']} steps, capped so that a checkpoint lands in each allocation"
        ),
    }[c["basis"]]
    first = (
        f"checkpoint every {c['interval_steps']} steps ({c['interval_hours']:.3g} h; {how}): a {c['size_gb']:.4g} GB "
        f"write takes {c['write_s']:.3g} s at {c['write_gbps']:g} GB/s (filesystem.write_gbps), the job's MTBF is "
        f"{c['job_mtbf_hours']:.4g} h (reliability.node_mtbf_hours / nodes), and a failure loses "
        f"{c['lost_per_failure_hours']:.3g} h of work on average (half an interval plus the write, Daly 2006)"
    )
    return [first, *c["warnings"]]


def _signal_delay(plan: Plan) -> str | None:
    """job.sbatch asks SLURM to warn it ``slurm.signal_delay_s`` before the time limit and then
    checkpoints and requeues: where that leaves less than half of each allocation, most of the
    job's time goes to start-ups and checkpoints (measured on the loopback cluster: a 2-minute
    limit with the default 90 s trained 20-50 steps an allocation, 26 requeues in 14 minutes)."""
    s = plan.profile.slurm
    if not plan.profile.slurm_batch:
        return None
    limit_s = parse_slurm_time(s.time) * 60
    if 2 * s.signal_delay_s <= limit_s:
        return None
    return (
        f"slurm.signal_delay_s {s.signal_delay_s} s leaves {limit_s - s.signal_delay_s} s of the {s.time} time limit "
        f"for training (less than half; SLURM may warn up to 60 s earlier still): each allocation goes mostly to "
        f"start-up and checkpointing; raise slurm.time or lower slurm.signal_delay_s (one step and one checkpoint "
        f"save must fit in it)"
    )


def notes_doc(plan: Plan) -> dict:
    """plan.yaml's ``explain.notes``."""
    c = plan.chosen
    return {
        "near_ties": _near_ties(plan),
        "memory_margin": {
            "gib": plan.memory_margin_gib,
            "origin": plan.memory_margin_origin or "--memory-margin",
        },
        "mfu": _mfu(plan),
        "outside_fitted_domain": c.interval is None,
        "unmeasured_runtime": _unmeasured_runtime(plan),
        "rate_transfer": _rate_transfer(plan),
        "mfu_above_measured": _mfu_above_measured(plan),
        "measure": _trial(plan) if (c.interval is None or _unmeasured_runtime(plan)) else None,
        "checkpoint": _checkpoint(plan),
        "signal_delay": _signal_delay(plan),
    }


def notes_text(plan: Plan) -> list[str]:
    """The notes as sentences (no trailing period), in the order `dsorch plan` prints them."""
    doc = notes_doc(plan)
    out = []
    nt = doc["near_ties"]
    if nt is not None and nt["within_band"] > 1:
        head = (
            f"{nt['within_band']} layouts that fit are within {100 * nt['band']:.1f} % of the fastest (the "
            f"{nt['basis']}), too close for the model to tell apart"
        )
        if nt["fastest"] != plan.chosen.layout.short():
            out.append(
                f"{head}: chose the simplest, {100 * nt['chosen_vs_fastest']:.1f} % slower by prediction than "
                f"the fastest, {nt['fastest']}"
            )
        else:
            out.append(f"{head}: the fastest is also the simplest; the nearest: {', '.join(nt['others'][:3])}")
    m = doc["memory_margin"]
    out.append(f"memory margin {m['gib']:g} GiB per GPU kept free ({m['origin']})")
    f = doc["mfu"]
    out.append(
        f"MFU {100 * f['mfu']:.1f} % counts attention non-causally, as Megatron-LM reports it; "
        f"counted causally it is {100 * f['mfu_causal']:.1f} %"
    )
    if doc["unmeasured_runtime"]:
        out.append(doc["unmeasured_runtime"])
    if doc["rate_transfer"] is not None:
        out.append(_rate_transfer_text(plan, doc["rate_transfer"]))
    above = doc["mfu_above_measured"]
    if above is not None:
        out.append(
            f"the predicted MFU, {100 * above['predicted']:.1f} %, is above the best any published run of the "
            f"calibration data measured on this hardware in {PRECISION_WORDS[above['precision']]}, "
            f"{100 * above['best_measured']:.1f} % ({above['run']}, {above['gpu']}): treat it as optimistic until "
            "a run on your cluster confirms it"
        )
    if doc["signal_delay"]:
        out.append(doc["signal_delay"])
    if doc["outside_fitted_domain"]:
        out.append(f"the chosen layout is {plan.chosen.basis}")
    trial = doc["measure"]
    if trial is not None:
        out.append(
            f"measure it on your cluster: {trial['command']} ({trial['layouts']} "
            f"layout{'s' if trial['layouts'] > 1 else ''} x {TRIAL_STEPS} steps, about {trial['gpu_hours']:.3g} "
            f"GPU-hours by this plan's predictions{'' if plan.runtime.bundled_trainer else ', start-up apart'})"
        )
    out += _checkpoint_text(plan)
    ov = plan.spec.overrides
    has_ds_config = DS_CONFIG in plan.runtime.renders
    if ov.megatron_args or (ov.ds_config and has_ds_config):
        # A megatron plan has no ds_config.json to set keys in (plan.md says so).
        n = len(ov.megatron_args) + (sum(1 for _ in leaf_paths(ov.ds_config)) if has_ds_config else 0)
        out.append(
            f"the spec's overrides set {n} value{'s' if n > 1 else ''} in the generated files (plan.md lists "
            f"them under Overrides, with what each replaced)"
        )
    init_from = plan.spec.training.init_from
    if init_from and not plan.runtime.bundled_trainer:
        # Rendered into nothing rather than refused, so that one spec plans for both runtimes:
        # Megatron-LM starts from its own checkpoint format (--load / --pretrained-checkpoint), which
        # a Hugging Face directory is not until converted (Megatron-Bridge's AutoBridge does that).
        out.append(
            f"training.init_from {init_from} is read by the deepspeed runtime's bundled entrypoint only: this "
            "Megatron-LM plan starts from random weights unless you convert the model to a Megatron checkpoint "
            "and add --load / --pretrained-checkpoint"
        )
    return out
