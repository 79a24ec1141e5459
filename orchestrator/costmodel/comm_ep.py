"""Expert parallelism: Megatron-Core's token dispatcher of a layout, whether the EP overlap applies,
and the dispatch and combine traffic per step (costmodel/evaluate.py's docstring)."""

from __future__ import annotations

import numpy as np

from orchestrator.costmodel.comm import _Overlapped
from orchestrator.costmodel.compute import _Compute
from orchestrator.costmodel.inputs import RECOMPUTE_CODES, _Inputs
from orchestrator.costmodel.links import _hierarchical_time, _Links, _ring_time
from orchestrator.spec.cluster import ClusterProfile
from orchestrator.spec.model import ModelSpec
from orchestrator.spec.training import TrainingSpec


def token_dispatcher(training: TrainingSpec, profile: ClusterProfile, ep, etp):
    """Megatron-Core's token dispatcher (--moe-token-dispatcher-type) for MoE layouts (arrays or
    scalars): the spec's training.moe_dispatcher, else flex (DeepEP) where the profile says the
    cluster has DeepEP, else alltoall. Flex needs expert-TP x EP > 1 (MoEFlexTokenDispatcher asserts
    "DeepEP dispatcher requires TPxEP > 1", core/transformer/moe/token_dispatcher.py), so a layout
    that keeps every expert on every rank has no dispatch to hand to DeepEP and takes alltoall."""
    if training.moe_dispatcher is not None:
        return np.full(np.shape(ep), training.moe_dispatcher, dtype=object)[()]
    flex = profile.features.deepep & (np.asarray(ep) * np.asarray(etp) > 1)
    return np.where(flex, "flex", "alltoall").astype(object)[()]


def ep_overlap_applies(model: ModelSpec, training: TrainingSpec, profile: ClusterProfile, ep, etp, recompute, pp, vpp):
    """Where --overlap-moe-expert-parallel-comm applies (arrays or scalars): asked for by the spec and
    accepted by TransformerConfig.__post_init__: expert parallelism, the alltoall or flex dispatcher,
    no full recomputation, bf16/fp16, at most one MTP layer, and the interleaved schedule whenever
    there is a pipeline."""
    if model.moe is None or not training.moe_overlap_ep_comm or training.precision == "fp32" or model.mtp_layers > 1:
        return np.zeros(np.shape(ep), dtype=bool)[()]
    dispatcher = token_dispatcher(training, profile, ep, etp)
    pp, vpp = np.asarray(pp), np.asarray(vpp)
    return (
        (np.asarray(ep) > 1)
        & (dispatcher != "allgather")
        & (np.asarray(recompute) != RECOMPUTE_CODES["full"])
        & ((pp == 1) | (vpp > 1))
    )


def _ep_comm(x: _Inputs, links: _Links, comp: _Compute) -> _Overlapped:
    """Expert parallelism, seconds per step of the slowest stage: per MoE layer and micro-batch the
    token dispatcher sends every routed copy to the rank of its expert and back (dispatch and combine
    all-to-all forward, and both again backward: Megatron-Core MoEAlltoAllTokenDispatcher; Megatron-
    Core's MoE paper, Sec. 3), each copy h wide, the (ep - 1)/ep of them whose expert is elsewhere.
    The ep group spans ep x etp consecutive ranks: peers inside the NVLink domain are reached over
    NVLink, the rest over the GPU's share of the node's NICs, both at once (the slower one binds).
    DeepEP (the flex dispatcher) sends a token once per remote domain, not once per expert there
    (DeepSeek-V3 Sec. 3.2.2's node-limited routing: at most group_top_k groups). The allgather
    dispatcher gathers every token of the group instead. With etp > 1 the copies are also gathered
    and reduce-scattered over the etp ranks (NVLink). Full recomputation runs the forward pair again.
    Overlapped with another micro-batch's compute (--overlap-moe-expert-parallel-comm), ``ep_overlap``
    of it hides behind the layer's compute."""
    moe, training = x.model.moe, x.training
    if moe is None:
        zero = np.zeros_like(x.tp)
        return _Overlapped(exposed=zero, total=zero)
    h, e = float(x.model.hidden_size), float(x.act_bytes)
    r, t_in = x.routed, x.router_tokens
    ep, etp = x.ep, x.etp
    domain = float(x.profile.nvlink_domain)
    k_in = np.minimum(ep, np.maximum(1.0, np.floor(domain / etp)))
    copy_bytes = r * x.tp * h * e / np.where(x.sequence_parallel, x.tp, 1.0)  # this GPU's routed copies
    local = copy_bytes * (k_in - 1) / ep
    remote = copy_bytes * (ep - k_in) / ep
    dispatcher = token_dispatcher(training, x.profile, ep, etp)
    flex = dispatcher == "flex"
    if np.any(flex):
        domains = np.maximum(1.0, ep / k_in)
        copies_per_remote = float(moe.top_k) * (domains - 1) / domains
        reach = float(moe.group_top_k) if moe.group_top_k else float(moe.top_k)
        distinct = (domains - 1) * (1 - (1 - 1 / domains) ** min(reach, float(moe.top_k)))
        dedup = np.where(copies_per_remote > 0, distinct / np.maximum(copies_per_remote, 1e-9), 1.0)
        remote = remote * np.where(flex, dedup, 1.0)
    one = np.maximum(local / links.nvlink, remote / links.ib) + np.where(
        remote > 0, links.ib_latency, links.nvlink_latency
    )
    if training.moe_dispatcher == "allgather":
        gather = t_in * h * e
        one = _hierarchical_time(
            gather,
            ep * etp,
            np.minimum(ep * etp, domain),
            links.nvlink,
            links.nvlink_latency,
            links.ib,
            links.ib_latency,
            1.0,
        )
    one = np.where(ep > 1, one, 0.0)
    etp_coll = _ring_time(copy_bytes * etp, etp, links.nvlink, links.nvlink_latency, 1.0)
    passes = 4.0 + 2.0 * x.full_recompute_share(x.stage_layers)
    per_layer = passes * (one + etp_coll)
    overlap = ep_overlap_applies(x.model, training, x.profile, ep, etp, x.recompute, x.pp, x.vpp)
    hidden = np.where(overlap, x.eff.ep_overlap * np.minimum(per_layer, comp.moe_layer_mb), 0.0)
    layers = comp.moe_layers_stage
    return _Overlapped(exposed=layers * (per_layer - hidden), total=layers * per_layer)
