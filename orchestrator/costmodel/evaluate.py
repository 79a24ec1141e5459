"""Memory and step time of many layouts at once (numpy), for one model, training and cluster.

Pure: arrays in, arrays out. ``Candidates`` holds one entry per layout; ``evaluate`` returns the
memory stack (bytes per GPU on the most loaded pipeline stage) and the time stack (seconds per
step) of every one of them.

Time model (all per optimizer step, on the slowest pipeline stage):
  compute       GEMM FLOPs / (peak x efficiency), efficiency capped by a roofline on the GEMM's
                arithmetic intensity (small hidden sizes and micro-batches run below peak), plus
                memory-bound element-wise work at HBM bandwidth;
  tp_comm       4 ring all-reduces (or reduce-scatter + all-gather with SP, same volume) of
                b*s*h per layer and micro-batch, 6 with full recompute (Narayanan et al. 2021,
                Sec. 4: 8bsh(t-1)/t bytes per layer per device), over NVLink, not overlapped;
  bubble        (pp-1)/vpp micro-batch times (Narayanan et al. 2021, Sec. 2.2: bubble fraction
                (pp-1)/(m*vpp) of m micro-batch times);
  pp_comm       point-to-point activations b*s*h (b*s*h/t with SP) per micro-batch and chunk,
                forward and backward, over InfiniBand when neighbouring stages sit on other nodes;
  dp_comm       gradient reduction (ring, 2(d-1)/d of the gradient bytes; ZeRO-3 gathers weights
                each micro-batch, 3(d-1)/d, ZeRO paper Sec. 7), minus the part hidden behind the
                backward pass;
  optimizer     Adam reads and writes ~32 bytes per local parameter at HBM bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ..specs import ClusterProfile, ModelSpec, TrainingSpec
from .flops import layer_forward_flops_per_token, logits_forward_flops_per_token, model_flops_per_step
from .memory import STATE_BYTES, activation_bytes_per_layer, in_flight_micro_batches, model_state_bytes

RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}

# DeepSpeed ZeRO-1/2 communication buckets, in elements; dsorch writes these into ds_config.json.
# (DeepSpeed's default is 5e8 elements, 1 GB each in bf16; 2e8 keeps the buffers at 400 MB.)
ZERO_BUCKET_ELEMENTS = 200_000_000
# DeepSpeed ZeRO-3 keeps at most this many gathered parameters alive (stage3_max_live_parameters).
ZERO3_MAX_LIVE_PARAMETERS = 1_000_000_000
OPTIMIZER_BYTES_PER_PARAM = 32.0


@dataclass(frozen=True)
class Candidates:
    """One entry per layout. ``layers_*`` come from ``rules.stage_split``."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    vpp: np.ndarray
    zero: np.ndarray
    mbs: np.ndarray
    gas: np.ndarray
    rc: np.ndarray  # 0 none, 1 selective, 2 full
    sp: np.ndarray  # bool
    layers_first: np.ndarray
    layers_middle: np.ndarray
    layers_last: np.ndarray

    def __len__(self) -> int:
        return int(np.asarray(self.tp).size)

    def take(self, idx) -> "Candidates":
        return Candidates(**{f.name: np.asarray(getattr(self, f.name))[idx] for f in fields(self)})


@dataclass(frozen=True)
class Evaluation:
    # memory, bytes per GPU on the binding stage
    params: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    overhead: np.ndarray
    total: np.ndarray
    # time, seconds per step
    compute: np.ndarray
    tp_comm: np.ndarray
    bubble: np.ndarray
    pp_comm: np.ndarray
    dp_comm: np.ndarray
    optimizer_step: np.ndarray
    step_time: np.ndarray
    # derived
    tokens_per_s: np.ndarray
    mfu: np.ndarray
    compute_at_peak: np.ndarray  # model+recompute FLOPs on the binding stage at 100% of peak

    def take(self, idx) -> "Evaluation":
        return Evaluation(**{f.name: np.asarray(getattr(self, f.name))[idx] for f in fields(self)})


def _peak_flops(profile: ClusterProfile, precision: str) -> float:
    return getattr(profile.gpu.peak_tflops, precision) * 1e12


def _ring_time(nbytes, n, bw, latency, factor):
    """Ring collective: ``factor * (n-1)/n * bytes / bw`` plus a latency per step of a tree."""
    n = np.asarray(n, dtype=np.float64)
    steps = np.where(n > 1, np.ceil(np.log2(np.maximum(n, 2))), 0.0)
    return np.where(n > 1, factor * (n - 1) / n * nbytes / bw + 2 * steps * latency, 0.0)


def evaluate(model: ModelSpec, training: TrainingSpec, profile: ClusterProfile, runtime: str,
             c: Candidates) -> Evaluation:
    f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    tp, pp, dp, vpp = f64(c.tp), f64(c.pp), f64(c.dp), f64(c.vpp)
    mbs, gas, zero, rc, sp = f64(c.mbs), f64(c.gas), np.asarray(c.zero), np.asarray(c.rc), np.asarray(c.sp, dtype=bool)
    s = float(training.seq_length)
    h, f, a, kv, V = (float(model.hidden_size), float(model.ffn_hidden_size), float(model.num_attention_heads),
                      float(model.kv_heads), float(model.vocab_size))
    precision = training.precision
    act_bytes = 4 if precision == "fp32" else 2
    weight_b, grad_b, opt_b = STATE_BYTES[(runtime, precision)]

    # ---------------- memory -----------------
    norms = (2 if model.normalization == "layernorm" else 1) * 2 * h
    layer_params_local = (model.params_per_layer - norms) / tp + norms
    emb_local = model.embedding_params / tp
    out_local = model.output_params / tp
    # With tied embeddings and pp > 1 the last stage keeps its own copy of the embedding matrix
    # for the output layer, synchronized by an extra all-reduce (Megatron-LM, Shoeybi 2019).
    tied_copy = np.where((pp > 1) & model.tied_embeddings, model.vocab_size * h / tp, 0.0)

    act_layer = activation_bytes_per_layer(
        s, mbs, h, f, a, kv, tp, sp, rc, swiglu=model.activation == "swiglu", flash=training.flash_attention,
        hidden_dropout=training.hidden_dropout > 0, attention_dropout=training.attention_dropout > 0,
        act_bytes=act_bytes)
    # Backward working set: the layer being back-propagated holds gradient buffers about the size
    # of its full activations (and, under recomputation, its rematerialized activations). Counted
    # once per stage, the same for every recompute level, so recompute never looks worse than none.
    working_layer = activation_bytes_per_layer(
        s, mbs, h, f, a, kv, tp, sp, np.zeros_like(rc), swiglu=model.activation == "swiglu",
        flash=training.flash_attention, hidden_dropout=training.hidden_dropout > 0,
        attention_dropout=training.attention_dropout > 0, act_bytes=act_bytes)
    sbh_local = np.where(sp, s * mbs * h / tp, s * mbs * h) * act_bytes
    # Logits of one micro-batch on the last stage: the 16-bit output and the fp32 copy the
    # vocab-parallel cross-entropy keeps for its backward pass.
    logits = s * mbs * V / tp * (act_bytes + 4)

    def stage_memory(layers, params_local, stage_index, extra_act):
        w, g, o = model_state_bytes(params_local, dp, zero, weight_b, grad_b, opt_b)
        inflight = in_flight_micro_batches(pp, vpp, gas, stage_index)
        act = layers * act_layer * inflight + working_layer + extra_act
        return w, g, o, act

    first_params = f64(c.layers_first) * layer_params_local + emb_local + np.where(pp == 1, out_local, 0.0)
    middle_params = f64(c.layers_middle) * layer_params_local
    last_params = f64(c.layers_last) * layer_params_local + out_local + tied_copy
    first = stage_memory(f64(c.layers_first), first_params, 0.0,
                         sbh_local * in_flight_micro_batches(pp, vpp, gas, 0.0) + np.where(pp == 1, logits, 0.0))
    middle = stage_memory(f64(c.layers_middle), middle_params, np.minimum(1.0, pp - 1), 0.0)
    last = stage_memory(f64(c.layers_last), last_params, pp - 1, logits)
    params_stage = np.maximum(np.maximum(first_params, middle_params), np.where(pp > 1, last_params, 0.0))

    # Communication buffers (DeepSpeed only; Megatron's DDP reduces in place in its grad buffer).
    if runtime == "deepspeed":
        bucket = np.minimum(ZERO_BUCKET_ELEMENTS, params_stage) * grad_b
        buffers = np.where((zero == 1) | (zero == 2), 2 * bucket, 0.0)
        # ZeRO-3 gathers one layer ahead (prefetch) besides the one in use.
        gathered = np.minimum(ZERO3_MAX_LIVE_PARAMETERS, 2 * layer_params_local) * weight_b
        buffers = buffers + np.where(zero == 3, gathered, 0.0)
    else:
        buffers = np.zeros_like(tp)
    overhead = profile.memory_overhead_gib * (1 << 30) + buffers

    totals = [st[0] + st[1] + st[2] + st[3] for st in (first, middle, last)]
    stacked = np.stack(totals)
    which = np.argmax(stacked, axis=0)
    pick = lambda k: np.choose(which, [first[k], middle[k], last[k]])  # noqa: E731
    params_b, grads_b, opt_bytes, act_b = pick(0), pick(1), pick(2), pick(3)
    total = params_b + grads_b + opt_bytes + act_b + overhead

    # ---------------- time -----------------
    peak = _peak_flops(profile, precision)
    eff = profile.efficiency
    hbm = profile.gpu.hbm_bandwidth_gbps * 1e9
    w_flops, sc_flops = layer_forward_flops_per_token(model, training.seq_length)
    tokens_mb = s * mbs
    # Roofline on the MLP up-projection GEMM (M = tokens, N = f/t, K = h, 16-bit operands):
    # intensity = MNK / (MK + KN + MN) FLOP per byte; below the ridge point peak/HBM the GEMM is
    # memory bound.
    M, N, K = tokens_mb, f / tp, h
    intensity = M * N * K / (M * K + K * N + M * N)
    gemm_eff = eff.gemm * np.minimum(1.0, intensity * hbm / peak)
    rc_extra = np.where(rc == 2, 1.0, 0.0)  # full recompute: one more forward of each layer
    sel_extra = np.where(rc == 1, 1.0, 0.0)  # selective: one more forward of the score GEMMs
    layer_flops_mb = tokens_mb * ((3 + rc_extra) * w_flops + (3 + rc_extra + sel_extra) * sc_flops) / tp
    # Element-wise work (norms, rotary, activation, residual adds, dropout): ~ (24h + 6f) bytes
    # read+written per token per forward, 3x with backward, sharded by TP (norms only with SP).
    elem_bytes_mb = 3 * tokens_mb * (np.where(sp, 24 * h / tp, 24 * h) + 6 * f / tp) * act_bytes / 2
    layer_time_mb = layer_flops_mb / (peak * gemm_eff) + elem_bytes_mb / hbm
    logit_flops_mb = 3 * tokens_mb * logits_forward_flops_per_token(model) / tp
    logit_time_mb = logit_flops_mb / (peak * gemm_eff)

    # Tensor-parallel collectives, per layer per micro-batch.
    nvlink = profile.intra_node.bandwidth_gbps * 1e9 / 2 * eff.intra_node_comm  # one direction
    lat_intra = profile.intra_node.latency_us * 1e-6
    n_coll = 4 + 2 * rc_extra
    tp_layer_mb = n_coll * _ring_time(tokens_mb * h * act_bytes, tp, nvlink, lat_intra, 1.0)

    stage_layers = np.maximum(np.maximum(f64(c.layers_first), f64(c.layers_middle)), f64(c.layers_last))
    compute_mb = np.maximum(f64(c.layers_middle) * layer_time_mb,
                            np.maximum(f64(c.layers_first) * layer_time_mb,
                                       f64(c.layers_last) * layer_time_mb + logit_time_mb))
    tp_mb = stage_layers * tp_layer_mb
    mb_time = compute_mb + tp_mb
    compute = gas * compute_mb
    tp_comm = gas * tp_mb
    bubble = (pp - 1) / vpp * mb_time

    # Pipeline point-to-point: neighbouring stages are tp*dp ranks apart (Megatron's rank order
    # tp, dp, pp), so they sit on different nodes once tp*dp >= gpus_per_node.
    g = profile.gpus_per_node
    ib_per_gpu = (profile.inter_node.bandwidth_gbps / 8 * 1e9 * profile.inter_node.nics_per_node / g
                  * eff.inter_node_comm)
    lat_inter = profile.inter_node.latency_us * 1e-6
    cross = (tp * dp >= g) & (profile.nodes > 1)
    p2p_bw = np.where(cross, ib_per_gpu, nvlink)
    p2p_lat = np.where(cross, lat_inter, lat_intra)
    p2p_bytes = np.where(sp, tokens_mb * h / tp, tokens_mb * h) * act_bytes
    pp_comm = np.where(pp > 1, 2 * (gas * vpp + pp - 1) * (p2p_bytes / p2p_bw + p2p_lat), 0.0)

    # Data-parallel reduction. A DP group strides over tp ranks, so it leaves the node once
    # tp*dp > gpus_per_node; across nodes each GPU gets its share of the node's NICs.
    spans_nodes = tp * dp > g
    dp_bw = np.where(spans_nodes, ib_per_gpu, nvlink)
    dp_lat = np.where(spans_nodes, lat_inter, lat_intra)
    grad_bytes = params_stage * grad_b
    weight_bytes = params_stage * weight_b
    allreduce = _ring_time(grad_bytes, dp, dp_bw, dp_lat, 2.0)
    # ZeRO-1/2: reduce-scatter gradients, all-gather updated 16-bit weights (same volume as an
    # all-reduce when they are the same width). ZeRO-2 reduces every micro-batch (DeepSpeed
    # reduces gradients during each backward pass once they are partitioned).
    rs = _ring_time(grad_bytes, dp, dp_bw, dp_lat, 1.0)
    ag = _ring_time(weight_bytes, dp, dp_bw, dp_lat, 1.0)
    zero3_per_mb = 2 * ag + rs  # gather for forward and for backward, reduce-scatter gradients
    dp_total = np.select([zero == 0, zero == 1, zero == 2, zero == 3],
                         [allreduce, rs + ag, gas * rs + ag, gas * zero3_per_mb])
    # Overlap: the last micro-batch's backward (2/3 of its compute) hides the reduction
    # (DeepSpeed overlap_comm, Megatron overlap-grad-reduce); ZeRO-3 prefetches over the whole step.
    hide = np.where(zero == 3, compute, compute_mb * 2.0 / 3.0) * eff.dp_overlap
    dp_comm = np.maximum(0.0, dp_total - hide)

    opt_params = params_stage / np.where(zero >= 1, dp, 1.0)
    optimizer_step = opt_params * OPTIMIZER_BYTES_PER_PARAM / hbm

    step = compute + tp_comm + bubble + pp_comm + dp_comm + optimizer_step
    tokens = training.global_batch_size * s
    mflops = model_flops_per_step(model, training.seq_length, training.global_batch_size)
    world = tp * pp * dp
    mfu = mflops / (step * world * peak)
    compute_at_peak = gas * np.maximum(f64(c.layers_middle) * layer_flops_mb,
                                       f64(c.layers_last) * layer_flops_mb + logit_flops_mb) / peak
    return Evaluation(params_b, grads_b, opt_bytes, act_b, overhead, total,
                      compute, tp_comm, bubble, pp_comm, dp_comm, optimizer_step, step,
                      tokens / step, mfu, compute_at_peak)


def invariant_violations(c: Candidates, ev: Evaluation) -> list[str]:
    """Facts every evaluation must satisfy; a violation is a bug in the cost model, not bad input.

    Checked by the solver after each evaluation (cheap: a few array comparisons).
    """
    bad: list[str] = []
    tp = np.asarray(c.tp)
    if np.any(ev.tp_comm[tp == 1] != 0):
        bad.append("tensor-parallel traffic with tp = 1")
    if np.any(ev.total < ev.params):
        bad.append("total memory below the local parameter shard")
    for name in ("params", "grads", "optimizer", "activations", "overhead", "compute", "tp_comm", "bubble",
                 "pp_comm", "dp_comm", "optimizer_step"):
        arr = getattr(ev, name)
        if np.any(~np.isfinite(arr)) or np.any(arr < 0):
            bad.append(f"{name} negative or not finite")
    if np.any(ev.step_time < ev.compute_at_peak * (1 - 1e-9)):
        bad.append("step time below compute at peak")
    return bad
