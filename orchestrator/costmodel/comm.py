"""Tensor-parallel, pipeline and data-parallel communication per step, and what the engine
overlaps of it (costmodel/evaluate.py's docstring: ``tp_comm``, ``pp_comm``, ``dp_comm``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.costmodel.compute import _Compute
from orchestrator.costmodel.inputs import _Inputs
from orchestrator.costmodel.links import _hierarchical_time, _Links, _ring_time
from orchestrator.costmodel.pipe_schedule import exposed_transfers, partition_gathers


@dataclass(frozen=True, kw_only=True, slots=True)
class _Overlapped:
    exposed: np.ndarray  # what the step waits for
    total: np.ndarray  # before the engine overlaps any of it with compute


def _tp_comm_mb(x: _Inputs, links: _Links, comp: _Compute) -> _Overlapped:
    """Tensor-parallel collectives of the largest stage, per micro-batch. A MoE layer keeps the
    attention's two (forward and backward) and the shared experts' two; its routed experts need none
    on Megatron-Core (the all-to-all moves their tokens: ``_ep_comm``), while dsorch's entrypoint,
    whose experts are split over tp like its dense MLP, all-reduces their output, top_k copies per token."""
    T = x.s_local * x.micro_batch_size
    rerun = x.full_recompute_share(x.stage_layers)  # full recomputation's share of the stage's layers
    n_coll = 4 + 2 * rerun
    one = _ring_time(T * float(x.model.hidden_size) * float(x.act_bytes), x.tp, links.nvlink, links.nvlink_latency, 2.0)
    tp_layer_mb = n_coll * one
    tp_total_mb = x.stage_layers * tp_layer_mb
    moe = x.model.moe
    moe_layers = comp.moe_layers_stage if moe is not None else 0.0
    if moe is not None:
        per_pass = 1.0 + (1.0 if moe.shared_experts else 0.0)
        if x.runtime.experts_like_mlp:
            per_pass = per_pass + float(moe.top_k) * x.training.moe_load_imbalance
        moe_layer_mb = 2 * per_pass * (1.0 + rerun / 2.0) * one
        tp_total_mb = (x.stage_layers - moe_layers) * tp_layer_mb + moe_layers * moe_layer_mb
    # --tp-comm-overlap needs sequence parallelism (validate_args): only there do the userbuffers run.
    ub = x.sequence_parallel & x.eng.tp_overlap & (x.tp > 1)
    overlapped = (x.stage_layers - moe_layers) * _ub_exposed(x, links, comp.tp_blocks)
    overlapped = overlapped + moe_layers * _ub_exposed(x, links, comp.tp_blocks_moe)
    return _Overlapped(exposed=np.where(ub, overlapped, tp_total_mb), total=tp_total_mb)


def _ub_exposed(x: _Inputs, links: _Links, blocks) -> np.ndarray:
    """Exposed seconds of one layer's TP collectives per micro-batch under Transformer Engine's
    userbuffers, each paired with the GEMM TE overlaps it with (module/base.py initialize_ub, its
    default methods @ TE d0067d0). Per TP block (column-parallel GEMM, then row-parallel GEMM):
      forward   all-gather of the input by ring exchange, chunk by chunk inside the column GEMM
                (qkv_fprop, fc1_fprop: num_splits = tp, the local chunk's GEMM runs last uncovered);
                reduce-scatter of the output pipelined with the row GEMM in 4 splits (proj_fprop,
                fc2_fprop "pipeline": the last split's reduce-scatter follows the GEMM);
      backward  all-gather of the output gradient by ring exchange inside the row dgrad GEMM
                (proj_dgrad, fc2_dgrad; the row wgrad reuses it, "external"); all-gather of the saved
                input shard behind the column dgrad GEMM and reduce-scatter of the input gradient
                behind the column wgrad GEMM (qkv/fc1 dgrad and wgrad, "bulk").
    All-gather buffers are FP8 under an FP8 recipe (fp8_buf: layers_all_gather_overlap), the
    reduce-scatters 16-bit. A collective is exposed by what exceeds ``tp_overlap`` x its GEMM's
    time (the GEMM loses the 16 SMs pipeline and bulk overlaps take, num_sm, and a chunk's copy
    waits for its GEMM); each ring step keeps its latency. Full recompute repeats the forward."""
    T, h, tp, eta = x.s_local * x.micro_batch_size, float(x.model.hidden_size), x.tp, x.eff.tp_overlap
    ag_bytes = 1.0 if x.training.fp8 is not None else float(x.act_bytes)
    ag = _ring_time(T * h * ag_bytes, tp, links.nvlink, links.nvlink_latency, 1.0)
    rs = _ring_time(T * h * float(x.act_bytes), tp, links.nvlink, links.nvlink_latency, 1.0)
    ring_part = (tp - 1) / tp
    out = np.zeros_like(tp)
    for col, row in blocks:
        forward = np.maximum(0.0, ag - eta * ring_part * col) + rs / 4 + 0.75 * np.maximum(0.0, rs - eta * row)
        backward = (
            np.maximum(0.0, ag - eta * ring_part * row)
            + np.maximum(0.0, ag - eta * col)
            + np.maximum(0.0, rs - eta * col)
        )
        out = out + forward * (1.0 + x.full_recompute_share(x.stage_layers)) + backward
    return out


def _pp_comm(x: _Inputs, links: _Links) -> np.ndarray:
    """Pipeline point-to-point: neighbouring stages are tp*cp*dp ranks apart (Megatron's rank order
    tp-cp-dp-pp, parallel_state.py), so they sit on different nodes once that reaches a node."""
    profile, eng, tp, pp, vpp = x.profile, x.eng, x.tp, x.pp, x.vpp
    T, h, e = x.s_local * x.micro_batch_size, float(x.model.hidden_size), float(x.act_bytes)
    domain = profile.nvlink_domain
    cross = (tp * x.dpc >= domain) & (profile.world_size > domain)
    p2p_bw = np.where(cross, links.ib, links.nvlink)
    p2p_lat = np.where(cross, links.ib_latency, links.nvlink_latency)
    p2p_bytes = np.where(x.sequence_parallel | eng.p2p_scatter_gather, T * h / tp, T * h) * e
    if x.runtime.blocking_pipeline:
        return np.where(pp > 1, _deepspeed_pipe(x, links, p2p_bytes, p2p_bw, p2p_lat), 0.0)
    # Overlapped sends (interleaved schedule) hide behind the other direction's chunks in the steady
    # 1F1B phase only. In the warm-up (forward chunks only) and the cool-down (backward only) a chunk's
    # input comes back round the pp stages a lap later, after pp sends, while the stage has just pp
    # chunks of work: one send per chunk waits. Warm-up chunks of the first stage (Megatron-Core
    # schedules.py get_pp_rank_microbatches): 2 (pp - 1) + (vpp - 1) x pp, at most all gas x vpp.
    warmup = np.minimum(x.grad_accum_steps * vpp, 2 * (pp - 1) + (vpp - 1) * pp)
    sends = np.where(eng.p2p_overlap & (vpp > 1), warmup, x.grad_accum_steps * vpp + pp - 1)
    return np.where(pp > 1, 2 * sends * (p2p_bytes / p2p_bw + p2p_lat), 0.0)


def _deepspeed_pipe(x: _Inputs, links: _Links, p2p_bytes, p2p_bw, p2p_lat) -> np.ndarray:
    """What DeepSpeed's PipelineEngine adds to the compute and the bubble per step, as its
    TrainSchedule runs (costmodel/pipe_schedule.py, DeepSpeed 0.19 runtime/pipe/engine.py):

    * blocking point-to-point: ``exposed_transfers(pp, m)`` transfers on the critical path, each
      the message (b*s*h/t: pipe_partitioned sends each tp rank's slice, SP's output is already
      one; a small meta tensor goes first with pipe_partitioned: _exec_send_activations sends every
      element of the tuple) and one latency per message;
    * per micro-batch on the busiest stage (so ``m + pp - 1`` times, like the compute): the TP
      all-gathers that rebuild partitioned activations and gradients (``partition_gathers``) over
      NVLink, and the two copies of the received activation (_exec_recv_activations clones the
      buffer, _exec_forward_pass clones its inputs), read and written at HBM bandwidth;
    * after the flush: the tied embedding's gradient all-reduced between the first and the last
      stage (_exec_reduce_tied_grads; fp32 under the BF16 optimizer, whose ``_hp_grad`` it reduces),
      and the three scalar collectives every stage waits for: the gradient norm over the
      model-parallel group (the ZeRO optimizer's ``_model_parallel_all_reduce``), the loss over the
      data-parallel group and its broadcast over the pipe (_aggregate_total_loss), latency only.

    The data-parallel reduction after the flush is ``_dp_comm``'s (not overlapped: ReduceGrads is
    an instruction of its own after the last backward, the engine's ``dp_overlap_with_pp`` false)."""
    tp, pp, m = x.tp, x.pp, x.grad_accum_steps
    T, h, e = x.s_local * x.micro_batch_size, float(x.model.hidden_size), float(x.act_bytes)
    partitioned = (tp > 1) & ~x.sequence_parallel
    transfer = p2p_bytes / p2p_bw + np.where(partitioned, 2.0, 1.0) * p2p_lat
    hbm = x.hbm
    gather = _ring_time(T * h * e, tp, links.nvlink, links.nvlink_latency, 1.0)
    per_mb = np.where(partitioned, partition_gathers(pp) * gather, 0.0) + 2 * 2 * p2p_bytes / hbm
    domain = x.profile.nvlink_domain
    far = (tp * x.dpc * (pp - 1) >= domain) & (x.profile.world_size > domain)
    tied = 0.0
    if x.model.tied_embeddings:
        grad_b = np.where(_whole_grad_allreduce(x), x.grad_b, x.comm_grad_b)
        nbytes = float(x.model.vocab_size) * h / tp * grad_b
        tied = _ring_time(
            nbytes,
            2.0,
            np.where(far, links.ib, links.nvlink),
            np.where(far, links.ib_latency, links.nvlink_latency),
            2.0,
        )
    hops = lambda n: np.ceil(np.log2(np.maximum(n, 1.0)))  # noqa: E731  (a tree of scalars)
    scalars = (2 * hops(pp * tp) + 2 * hops(x.dpc) + hops(pp)) * np.where(far, links.ib_latency, links.nvlink_latency)
    return exposed_transfers(pp, m) * transfer + (m + pp - 1) * per_mb + tied + scalars


def _sharded_collectives(x: _Inputs, links: _Links, params, group, stride) -> np.ndarray:
    """Seconds per step of the data-parallel collectives of ``params`` parameters (per GPU) reduced
    over ``group`` ranks that stand ``stride`` ranks apart, as the layout's ZeRO stage runs them. The
    group's members in one NVLink domain (a node, or an NVL72 rack) talk over NVLink, the rest across
    domains (hierarchical collective, see _hierarchical_time)."""
    profile, gas, zero = x.profile, x.grad_accum_steps, x.zero_stage
    g = profile.nvlink_domain
    per_node = np.maximum(1.0, np.floor(g / stride))
    in_node = np.minimum(group, per_node)
    one_node = (profile.world_size == g) | (stride * group <= g)
    k = np.where(one_node, group, in_node)

    def coll(nbytes, factor, buckets):
        t = _hierarchical_time(nbytes, group, k, links.nvlink, links.nvlink_latency, links.ib, links.ib_latency, factor)
        # One latency chain per bucket (DeepSpeed reduce_bucket_size, Megatron's DDP buckets).
        lat = np.where(one_node, links.nvlink_latency, links.ib_latency) * factor * np.maximum(group - 1, 0.0)
        return t + np.maximum(buckets - 1, 0.0) * np.where(group > 1, lat, 0.0)

    bucket_elems = x.runtime.dp_bucket_elements(group)
    buckets = np.ceil(params / bucket_elems)
    grad_bytes = params * x.comm_grad_b
    weight_bytes = params * x.weight_b
    allreduce = coll(grad_bytes, 2.0, buckets)
    rs = coll(grad_bytes, 1.0, buckets)
    ag = coll(weight_bytes, 1.0, buckets)
    # ZeRO-1/2 (and Megatron's distributed optimizer): reduce-scatter gradients, all-gather updated
    # 16-bit weights. DeepSpeed's ZeRO-2 reduces every micro-batch (the gradients are partitioned
    # during each backward pass). ZeRO-3 gathers weights for forward and backward and
    # reduce-scatters gradients, every micro-batch.
    zero3_per_mb = 2 * ag + rs
    return np.select(
        [zero == 0, _whole_grad_allreduce(x), zero == 1, zero == 2, zero == 3],
        [allreduce, allreduce + ag, rs + ag, gas * rs + ag, gas * zero3_per_mb],
    )


def _whole_grad_allreduce(x: _Inputs) -> np.ndarray:
    """Where the optimizer all-reduces its whole gradient buffer after the last micro-batch, not
    overlapped (the runtime's ``whole_grad_allreduce``: DeepSpeed's BF16_Optimizer at ZeRO-1)."""
    return x.runtime.whole_grad_allreduce(x.training.precision, x.zero_stage)


def _dp_comm(x: _Inputs, links: _Links, comp: _Compute) -> _Overlapped:
    """Data-parallel collectives per step. A DP group strides over tp ranks; with cp the group is
    dp x cp ranks (the weights are replicated over the cp ranks), still strided by tp. The routed
    experts' gradients reduce over their expert data-parallel group instead, edp ranks etp x ep apart
    (Megatron-Core's expert rank order etp-ep-edp-pp; the entrypoint's expert groups likewise), in
    the same way and with the same overlap."""
    eff, eng = x.eff, x.eng
    pp, gas, zero = x.pp, x.grad_accum_steps, x.zero_stage
    dp_total = _sharded_collectives(x, links, x.params_stage, x.dpc, x.tp)
    if x.model.moe is not None:
        experts = _sharded_collectives(x, links, x.expert_stage, x.edp, x.ep * x.etp)
        dp_total = dp_total + np.where(x.expert_stage > 0, experts, 0.0)
    # What can hide it: the gradient reduction overlaps the last micro-batch's backward (2/3 of its
    # compute: DeepSpeed overlap_comm, Megatron --overlap-grad-reduce, which reduces only on the
    # last micro-batch); the weight all-gather overlaps the first forward (1/3) with Megatron's
    # --overlap-param-gather; DeepSpeed's ZeRO-2 reduces during every backward pass and ZeRO-3
    # prefetches over the whole step.
    compute, compute_mb = comp.per_step, comp.per_micro_batch
    can_overlap = eng.dp_overlap & ((pp == 1) | eng.dp_overlap_with_pp) & ~_whole_grad_allreduce(x)
    window = np.where(
        zero == 3,
        compute,
        np.where(
            zero == 2,
            compute * 2.0 / 3.0,
            compute_mb * (2.0 / 3.0 + np.where((zero == 1) & eng.param_gather_overlap, 1.0 / 3.0, 0.0)),
        ),
    )
    hide = np.where(can_overlap, window * eff.dp_overlap, 0.0)
    # ZeRO-3 / FSDP: every layer's weight all-gather (forward, backward) and gradient reduce-scatter
    # is its own collective per micro-batch, issued from the host between layers; what no bandwidth
    # term gives (launch, stream waits, FSDP's rate limiter) is a fitted stall per collective
    # (calibration.yaml, engine deepspeed-zero3, fitted to the published FSDP runs).
    stall = np.where(zero == 3, gas * x.stage_layers * 3.0 * eff.zero3_stall_us * 1e-6, 0.0)
    return _Overlapped(exposed=np.maximum(0.0, dp_total - hide) + stall, total=dp_total + stall)
