"""What a plan decided for its chosen layout besides the layout: the efficiencies it was predicted
with, the model's FLOPs per step, and the engine settings the cost model charged (Megatron-Core's
token dispatcher, expert-parallel overlap, context parallelism's all-to-all group).

``decide`` runs once, in ``plan.make.make_plan``; the renderers (render/megatron.py, notes.py,
explain.py, report.py) read ``Plan.decisions``, so the files say what the prediction assumed
rather than asking the cost model again.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.costmodel.calibration import Resolved, engine_of, resolve_efficiency
from orchestrator.costmodel.evaluate import RECOMPUTE_CODES, cp_a2a_size, ep_overlap_applies, token_dispatcher
from orchestrator.costmodel.flops import model_flops_per_step
from orchestrator.plan.layout import Layout
from orchestrator.runtimes import Runtime
from orchestrator.spec.cluster import ClusterProfile
from orchestrator.spec.model import SpecFile


@dataclass(frozen=True, kw_only=True, slots=True)
class Decisions:
    """The chosen layout's decisions beside its degrees (``decide``)."""

    # The efficiencies of the layout's calibration engine, and where each comes from.
    efficiency: Resolved
    model_flops: float  # per step, attention counted whole (Megatron-LM's count: the MFU plan.yaml states)
    model_flops_causal: float  # per step, the causal mask's half of the attention (costmodel.flops)
    dispatcher: str | None  # Megatron-Core's --moe-token-dispatcher-type; None for a dense model
    ep_overlap: bool  # --overlap-moe-expert-parallel-comm applies (Megatron-Core accepts it)
    cp_a2a_size: int | None  # the all-to-all level of cp_comm_type a2a+p2p; None for another exchange


def decide(spec: SpecFile, profile: ClusterProfile, runtime: Runtime | str, layout: Layout) -> Decisions:
    """The decisions for ``layout``, as the cost model made them when it predicted the layout
    (costmodel.comm_ep token_dispatcher and ep_overlap_applies, costmodel.comm_cp cp_a2a_size)."""
    m, t, L = spec.model, spec.training, layout
    moe = m.moe is not None
    return Decisions(
        efficiency=resolve_efficiency(profile, str(engine_of(runtime, L.zero_stage, L.pp).item())),
        model_flops=model_flops_per_step(m, t.seq_length, t.global_batch_size),
        model_flops_causal=model_flops_per_step(m, t.seq_length, t.global_batch_size, causal=True),
        dispatcher=str(token_dispatcher(t, profile, L.ep, L.etp)) if moe else None,
        ep_overlap=moe
        and bool(ep_overlap_applies(m, t, profile, L.ep, L.etp, RECOMPUTE_CODES[L.recompute], L.pp, L.vpp)),
        cp_a2a_size=(
            int(cp_a2a_size(profile.nvlink_domain, L.tp, L.cp)) if L.cp > 1 and t.cp_comm_type == "a2a+p2p" else None
        ),
    )
