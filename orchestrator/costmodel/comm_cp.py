"""Context parallelism's exchange per step, as Transformer Engine runs each training.cp_comm_type
(p2p ring, a2a, all_gather, hierarchical a2a+p2p) under Megatron-LM (costmodel/evaluate.py's
docstring: ``cp_comm``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.costmodel.compute import SEQUENTIAL_GEMM_OVERHEAD_S, _Compute
from orchestrator.costmodel.inputs import RECOMPUTE_CODES, _Inputs, attention_widths
from orchestrator.costmodel.links import _Links

# Host work of one step of Transformer Engine's context-parallel attention beyond the attention
# kernel itself: the step's correction kernel (softmax LSE and output), batch_isend_irecv's NCCL
# group launch and the wait on the other stream's event (context_parallel.py
# AttnFuncWithCPAndKVP2P.forward: two flash_attn_streams alternate, each step waits for the
# previous step's receive). Three launches at the per-kernel cost of SEQUENTIAL_GEMM_OVERHEAD_S;
# not fitted (the allowed published runs hold no bf16 dense run with cp > 1).
CP_STEP_OVERHEAD_S = 3 * SEQUENTIAL_GEMM_OVERHEAD_S


@dataclass(frozen=True, kw_only=True, slots=True)
class _CpPass:
    """Exposed seconds of one layer's context-parallel exchange per micro-batch: each forward pass of
    the attention (run again by recomputation) and the backward pass."""

    forward: np.ndarray
    backward: np.ndarray


def _cp_p2p(x: _Inputs, comp: _Compute, cp, kv_b, q_b, o_b, one_way, hbm) -> _CpPass:
    """cp_comm_type p2p (AttnFuncWithCPAndKVP2P): cp steps each way, every step the attention of this
    rank's queries against one rank's K and V chunk. The load-balanced causal split (each rank holds
    chunks i and 2cp-1-i of 2cp: get_batch_on_this_cp_rank) gives every step the same work (the
    diagonal step, and half of Q or of KV on the others), so a step is 1/cp of the layer's attention.
    Forward: steps 0..cp-2 send this KV chunk on while the step computes; the next step waits for it.
    Backward: step 0 sends KV, the middle steps KV and the dK/dV accumulated so far, the last dK/dV
    only, each overlapped with that step's backward block. Exposed: what a step's transfer takes
    beyond its block, the step's launches (CP_STEP_OVERHEAD_S), and the traffic the split adds at HBM
    bandwidth: every further step reads Q and writes a partial output (forward; Q, O, dO read and a
    partial dQ written backward), which the fp32 output correction reads back into its accumulator
    (read partial, read and write fp32 accumulator per step), and dQ, dK, dV accumulate per step.
    ``cp``: the ring's ranks (all of cp, or the outer level of a2a+p2p)."""
    block_f, block_b = comp.attention_forward_mb / cp, comp.attention_backward_mb / cp
    o_elems = o_b / float(x.act_bytes)
    forward = (
        (cp - 1) * np.maximum(0.0, one_way(kv_b) - block_f)
        + cp * CP_STEP_OVERHEAD_S
        + ((cp - 1) * (q_b + o_b) + cp * o_elems * (x.act_bytes + 8.0)) / hbm
    )
    backward = (
        2 * np.maximum(0.0, one_way(kv_b) - block_b)
        + np.maximum(cp - 2, 0.0) * np.maximum(0.0, one_way(2 * kv_b) - block_b)
        + cp * CP_STEP_OVERHEAD_S
        + ((cp - 1) * (2 * q_b + 2 * o_b) + cp * 3 * (q_b + kv_b)) / hbm
    )
    return _CpPass(forward=forward, backward=backward)


def _cp_a2a(n, kv_b, q_b, o_b, bw, lat, hbm) -> _CpPass:
    """cp_comm_type a2a (AttnFuncWithCPAndQKVOA2A, DeepSpeed-Ulysses): all-to-alls of Q, K and V
    before the attention (heads scattered, the sequence gathered) and of the output after it;
    backward, of dO before and of dQ, dK, dV after (flash_attn_a2a_communicate). Each rank keeps
    1/cp of what it holds and sends the rest; nothing overlaps the attention, which runs once on the
    whole sequence with a/cp heads (no shorter blocks). Each all-to-all's input is reordered into and
    out of the chunk order (reorder_seq_chunks_for_a2a_*: read and write at HBM). ``n``: the group's
    ranks (all of cp, or the inner level of a2a+p2p)."""
    share = (n - 1) / n
    moved = q_b + kv_b + o_b
    one_pass = share * moved / bw + 4 * lat + 2 * moved / hbm
    return _CpPass(forward=one_pass, backward=one_pass)


def _cp_all_gather(x: _Inputs, kv_b, bw, lat, hbm) -> _CpPass:
    """cp_comm_type all_gather (AttnFuncWithCPAndKVAllGather, Llama 3 paper Sec. 3.3.2): K and V
    all-gathered before the attention, exposed ("KV all-gather between CP ranks is exposed"), then
    reordered to sequence order (index_select: read and write the gathered K, V); the attention of
    this rank's two chunks as two steps. Backward gathers K and V again and reduce-scatters dK, dV."""
    cp = x.cp
    gather = (cp - 1) * kv_b / bw + 2 * (cp - 1) * lat
    reorder = 2 * cp * kv_b / hbm
    forward = gather + reorder + 2 * CP_STEP_OVERHEAD_S
    return _CpPass(forward=forward, backward=2 * gather + reorder + 2 * CP_STEP_OVERHEAD_S)


def cp_a2a_size(domain, tp, cp):
    """The inner (all-to-all) level of cp_comm_type a2a+p2p, arrays or scalars: the cp ranks of one
    NVLink domain (the cp group strides over tp ranks): the greatest common divisor of cp and the cp
    ranks a domain holds, so that --hierarchical-context-parallel-sizes a cp/a multiply to cp as
    Megatron's validate_args asserts."""
    fit = np.maximum(1, np.asarray(domain) // np.asarray(tp, dtype=np.int64))
    return np.gcd(np.asarray(cp, dtype=np.int64), fit)[()]


def _attention_forward_passes(x: _Inputs) -> np.ndarray:
    """Forward passes of a layer's attention per micro-batch: recomputation (selective recomputes
    the core attention, full the whole layer) runs it, and its context-parallel exchange, again."""
    selective = x.recompute == RECOMPUTE_CODES["selective"]
    return 1.0 + np.where(selective, 1.0, x.full_recompute_share(x.stage_layers))


def _cp_comm(x: _Inputs, links: _Links, comp: _Compute) -> np.ndarray:
    """Context parallelism, exposed seconds per step (training.cp_comm_type; Transformer Engine's
    context_parallel.py, as Megatron-LM's TEDotProductAttention calls it). The cp group spans tp*cp
    consecutive ranks (stride tp), inside the NVLink domain while that fits in it. Per layer and
    micro-batch, this rank's K and V chunk (s/cp tokens of its kv heads, 1/tp of them), Q and output
    likewise."""
    profile, tp, cp = x.profile, x.tp, x.cp
    T, e = x.s_local * x.micro_batch_size, float(x.act_bytes)
    m = x.model
    qkvo, _ = attention_widths(m)  # in multiples of h
    q_w, k_w, v_w, o_w = qkvo or (1.0, m.kv_heads / m.num_attention_heads, m.kv_heads / m.num_attention_heads, 1.0)
    width = T * float(m.hidden_size) / tp * e
    kv_b, q_b, o_b = (k_w + v_w) * width, q_w * width, o_w * width
    domain = profile.nvlink_domain
    cp_inside = (tp * cp <= domain) | (profile.world_size == domain)
    bw = np.where(cp_inside, links.nvlink, links.ib)
    lat = np.where(cp_inside, links.nvlink_latency, links.ib_latency)
    hbm = x.hbm
    kind = x.training.cp_comm_type
    if kind == "a2a":
        per = _cp_a2a(cp, kv_b, q_b, o_b, bw, lat, hbm)
    elif kind == "all_gather":
        per = _cp_all_gather(x, kv_b, bw, lat, hbm)
    elif kind == "a2a+p2p":
        # Hierarchical (TE's a2a+p2p, Megatron --hierarchical-context-parallel-sizes a r): all-to-alls
        # over the a cp ranks of one NVLink domain, then the p2p ring over the r = cp/a domains on the
        # NICs; after the all-to-all a rank holds a x s/cp tokens of 1/a of its heads, so its K, V,
        # Q and output chunks have the bytes they had, and a ring step is 1/r of the attention.
        a = cp_a2a_size(domain, tp, cp)
        r = cp / a
        inner = _cp_a2a(a, kv_b, q_b, o_b, links.nvlink, links.nvlink_latency, hbm)
        ring = _cp_p2p(x, comp, r, kv_b, q_b, o_b, lambda nbytes: nbytes / links.ib + links.ib_latency, hbm)
        per = _CpPass(forward=inner.forward + ring.forward, backward=inner.backward + ring.backward)
    else:
        per = _cp_p2p(x, comp, cp, kv_b, q_b, o_b, lambda nbytes: nbytes / bw + lat, hbm)
    layer = _attention_forward_passes(x) * per.forward + per.backward
    return np.where(cp > 1, x.grad_accum_steps * x.stage_layers * layer, 0.0)
