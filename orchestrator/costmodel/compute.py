"""Compute time of the slowest pipeline stage: every GEMM at the additive roofline (FLOPs at peak x
``gemm`` plus operand and result bytes at HBM bandwidth x ``hbm``), attention scores, element-wise
work, FP8 quantizations, the MoE layer's router, experts and permutations, and what recomputation
runs again (costmodel/evaluate.py's docstring: ``compute``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.costmodel.flops import window_fraction
from orchestrator.costmodel.inputs import RC_TORCHTITAN_OP, RECOMPUTE_CODES, _Inputs
from orchestrator.spec.cluster import ClusterProfile


def _peak_flops(profile: ClusterProfile, precision: str) -> float:
    """Dense peak of the training precision, FLOP/s: what MFU divides by (for FP8 GEMMs too: the
    model is bf16, MFU against the bf16 peak)."""
    return getattr(profile.gpu.peak_tflops, precision) * 1e12


def fp8_peak_flops(profile: ClusterProfile) -> float | None:
    fp8 = profile.gpu.peak_tflops.fp8
    return None if fp8 is None else fp8 * 1e12


@dataclass(frozen=True, kw_only=True, slots=True)
class _Work:
    """Seconds and FLOPs of some GEMMs (of one micro-batch on one GPU)."""

    seconds: np.ndarray
    flops: np.ndarray

    def __add__(self, other: _Work) -> _Work:
        return _Work(seconds=self.seconds + other.seconds, flops=self.flops + other.flops)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Roofline:
    """The rates a layout's work runs at: GEMM FLOPs at the peak of their precision x ``gemm``,
    bytes at HBM bandwidth x ``hbm``."""

    peak: float  # dense FLOP/s of the training precision
    flop_rate: np.ndarray  # 16-bit GEMMs
    layer_rate: np.ndarray  # the layers' linear GEMMs: FP8 where the training asks for it
    hbm: np.ndarray  # bytes/s
    act_bytes: float  # bytes of a 16-bit (or fp32) activation element
    fp8: bool
    grouped_rate: np.ndarray  # the experts' grouped GEMMs (FP8 where the layers' linears are)

    def gemm(self, m, n, k, count=1.0, *, linear: bool = False, grouped: bool = False) -> _Work:
        """``count`` GEMMs (m x k) @ (k x n): FLOPs at the GEMM rate plus operand and result bytes at
        the HBM rate. Symmetric in m, n, k, so the two backward GEMMs of a linear layer (dgrad,
        wgrad: the same three dimensions permuted) cost what its forward does. ``linear``: a
        layer's linear GEMM, in FP8 (1-byte operands) with training.fp8."""
        rate = self.grouped_rate if grouped else self.layer_rate if linear else self.flop_rate
        operand_bytes = 1.0 if (linear or grouped) and self.fp8 else self.act_bytes
        flops = 2.0 * m * n * k * count
        return _Work(seconds=flops / rate + (m * k + k * n + m * n) * operand_bytes * count / self.hbm, flops=flops)


def _roofline(x: _Inputs) -> _Roofline:
    peak = _peak_flops(x.profile, x.training.precision)
    flop_rate = peak * x.eff.gemm
    fp8 = x.training.fp8 is not None
    # The layers' linear GEMMs in FP8 (Transformer Engine's Linear modules, and the experts' grouped
    # GEMMs); attention (DotProductAttention without fp8_dpa), the output layer (Megatron-Core builds
    # it as a tensor-parallel linear outside the fp8 autocast of the layers) and the router stay in
    # bf16. An FP8 GEMM reaches ``fp8_gemm`` of the bf16 GEMM's fraction of peak.
    fp8_peak = fp8_peak_flops(x.profile)
    if fp8 and fp8_peak is None:  # rules.check_training refuses this before planning
        raise ValueError(f"training.fp8 needs gpu.peak_tflops.fp8 in profile '{x.profile.name}'")
    return _Roofline(
        peak=peak,
        flop_rate=flop_rate,
        layer_rate=fp8_peak * x.eff.gemm * x.eff.fp8_gemm if fp8 else flop_rate,
        hbm=x.hbm,
        act_bytes=float(x.act_bytes),
        fp8=fp8,
        grouped_rate=(fp8_peak * x.eff.fp8_gemm if fp8 else peak) * x.eff.grouped_gemm,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _Attention:
    """One layer's attention scores (QK^T, softmax, PV) per micro-batch."""

    forward: _Work
    backward: _Work
    # Seconds of the forward's memory-bound work on the scores; a scalar 0.0 with FlashAttention, which
    # keeps the scores on chip (it broadcasts against the other terms' arrays).
    elementwise: np.ndarray | float


def _attention(x: _Inputs, roof: _Roofline) -> _Attention:
    model, training = x.model, x.training
    s, s_local, mbs, e = float(training.seq_length), x.s_local, x.micro_batch_size, roof.act_bytes
    h, kv_dim, d_head = float(model.hidden_size), float(model.kv_heads) * float(model.head_dim), float(model.head_dim)
    heads_local = float(model.num_attention_heads) / x.tp
    if training.flash_attention:
        # FlashAttention: QK^T and PV of the causal half on chip; only Q, K, V, O cross HBM.
        # Backward recomputes S and runs 5 GEMMs to the forward's 2 (Dao 2023, Sec. 3.1.2).
        # With cp, each rank's s/cp queries against the whole sequence, the causal half of it on
        # every rank (the 2 x cp chunk assignment balances it).
        if model.mla is None and model.sliding_window is None:
            sc_flops_f = 0.5 * 4.0 * mbs * heads_local * s_local * s * d_head
        else:
            # QK^T over the query/key head width, PV over the value head width (MLA: 192 and 128 on
            # DeepSeek-V3); sliding-window layers see at most the window (window_fraction).
            dq, dv = float(model.head_dim), float(model.v_head_dim)
            sc_flops_f = 0.5 * 2.0 * mbs * heads_local * s_local * s * (dq + dv) * window_fraction(model, s)
        sc_bytes_f = s_local * mbs * (2 * h + 2 * kv_dim) / x.tp * e
        score_f = sc_flops_f / (roof.peak * x.eff.attention) + sc_bytes_f / roof.hbm
        return _Attention(
            forward=_Work(seconds=score_f, flops=sc_flops_f),
            backward=_Work(seconds=2.5 * score_f, flops=2.5 * sc_flops_f),
            elementwise=0.0,
        )
    # Batched per head: (s x d) @ (d x s) and (s x s) @ (s x d), full s x s computed.
    forward = roof.gemm(s, s, d_head, mbs * heads_local) + roof.gemm(s, d_head, s, mbs * heads_local)
    # Fused scale-mask-softmax reads and writes the scores; attention dropout reads them,
    # writes its output and a 1-byte mask (Korthikanti et al. 2022, Sec. 4.1).
    drop = (2 * e + 1) if training.attention_dropout > 0 else 0.0
    return _Attention(
        forward=forward,
        backward=_Work(seconds=2 * forward.seconds, flops=2 * forward.flops),
        elementwise=mbs * heads_local * s * s * (2 * e + drop) / roof.hbm,
    )


def _elementwise_forward(x: _Inputs, roof: _Roofline, f: float | np.ndarray | None = None) -> np.ndarray:
    """Seconds of a layer's forward element-wise work per micro-batch, at HBM bandwidth: bytes per
    token of two norms (read + write h), two residual adds (read 2h, write h), rotary on Q and K,
    the activation (GeLU reads and writes f, SwiGLU reads 2f and writes f), dropout masks. Norms and
    residuals are sharded by SP only. ``f``: the activation's width per token (a MoE layer's is
    top_k x the expert's plus the shared experts'), the model's ffn_hidden_size by default."""
    model, training, tp, e = x.model, x.training, x.tp, roof.act_bytes
    h = float(model.hidden_size)
    f = float(model.ffn_hidden_size) if f is None else f
    kv_dim = float(model.kv_heads) * float(model.head_dim)
    swiglu = model.gated
    replicated = (2 * 2 * h + 2 * 3 * h) * e + (2 * h if training.hidden_dropout > 0 else 0.0)
    rotary = 2 * (h + kv_dim) * e if model.position_embedding == "rope" else 0.0
    sharded = ((3 * f if swiglu else 2 * f) * e + rotary) / tp
    T = x.s_local * x.micro_batch_size
    return T * (np.where(x.sequence_parallel, replicated / tp, replicated) + sharded) / roof.hbm


# Bytes per element of Transformer Engine's FP8 quantization of a 16-bit tensor, per recipe: read it
# and write the row-wise and the column-wise (transposed, for dgrad and wgrad) FP8 copies, 2 + 1 + 1
# (Hopper's FP8 GEMMs take only TN operands; MXFP8's scales run along K, so both copies there too);
# current scaling ("tensorwise") first reads the tensor once more for its amax, since the scale must
# be known before any element is cast. Delayed scaling takes its scale from past steps and fuses
# the amax into the cast. Block scales (blockwise, mxfp8) are local to the block: one pass.
FP8_CAST_BYTES = {"delayed": 4.0, "tensorwise": 6.0, "blockwise": 4.0, "mxfp8": 4.0}
# ... of a LayerNorm/RMSNorm output that feeds a linear layer (TE LayerNormLinear): delayed scaling
# quantizes inside the norm kernel (csrc/extensions/normalization.cpp: Impl::FULLY_FUSED for
# Float8Quantizer), current scaling computes the amax in the norm and then casts
# (FUSED_NORM_AMAX_FP8), MXFP8 norms then casts (UNFUSED unless NVTE_NORM_FWD_USE_CUDNN).
FP8_NORM_CAST_BYTES = {"delayed": 0.0, "tensorwise": 4.0, "blockwise": 4.0, "mxfp8": 4.0}


def _fp8_casts(x: _Inputs, roof: _Roofline, norm_fed, cast) -> np.ndarray:
    """Seconds of one layer's FP8 quantizations per micro-batch, forward and backward, as a third
    (the layer charges its forward element-wise work three times: forward, twice backward).
    ``norm_fed``: widths per token of the linear inputs a norm produces; ``cast``: of the other
    quantized tensors (the remaining linear inputs forward, the output gradients backward)."""
    recipe = x.training.fp8_recipe
    per_token = norm_fed * FP8_NORM_CAST_BYTES[recipe] + cast * FP8_CAST_BYTES[recipe]
    return x.s_local * x.micro_batch_size * per_token / 3.0 / roof.hbm


def _fp8_layer_casts(x: _Inputs, roof: _Roofline) -> tuple[np.ndarray, np.ndarray]:
    """A dense layer's and a MoE layer's FP8 quantizations (``_fp8_casts``), on the widths Megatron-
    Core's TE layers quantize per token: the QKV and FC1 inputs from their fused norms (sequence-
    sharded with SP, before the FP8 all-gather), the output projection's and FC2's inputs, and the
    four output gradients (column-parallel ones head-sharded, row-parallel ones sequence-sharded).
    A MoE layer's pre-MLP norm is its own module (TENorm): its experts quantize the dispatched token
    copies (top_k per token), their FC2 inputs and both output gradients."""
    if x.training.fp8 is None:
        return 0.0 * x.tp, 0.0 * x.tp
    model, tp = x.model, x.tp
    h, f = float(model.hidden_size), float(model.ffn_hidden_size)
    q_dim = float(model.num_attention_heads) * float(model.head_dim)
    kv_dim = float(model.kv_heads) * float(model.head_dim)
    h_in = np.where(x.sequence_parallel, h / tp, h)
    attention = q_dim / tp + (q_dim + 2 * kv_dim) / tp + h_in
    fc1_out = 2 * f if model.gated else f
    dense = _fp8_casts(x, roof, 2 * h_in, attention + f / tp + fc1_out / tp + h_in)
    moe = model.moe
    if moe is None:
        return dense, dense
    k = float(moe.top_k) * x.training.moe_load_imbalance
    f_e = float(moe.ffn_hidden_size) / x.etp
    experts = k * (2 * h + f_e + (2 * f_e if model.gated else f_e))
    shared = float(moe.shared_ffn) / tp
    shared_casts = h_in + shared + (2 * shared if model.gated else shared) + h_in if moe.shared_experts else 0.0
    return dense, _fp8_casts(x, roof, h_in, attention + experts + shared_casts)


def _attention_gemms(x: _Inputs, roof: _Roofline, T) -> tuple[_Work, _Work]:
    """One layer's attention projections per micro-batch: the column-parallel ones (QKV; MLA's down
    and up projections) and the row-parallel output projection, the two GEMMs of its TP block."""
    model, tp = x.model, x.tp
    h = float(model.hidden_size)
    a = float(model.num_attention_heads)
    if model.mla is not None:
        # DeepSeek-V2 Sec. 2.1: down-projections to the latents (replicated over tp in Megatron-Core's
        # MLASelfAttention), up-projections to the heads (column parallel), output (row parallel).
        m = model.mla
        dq, dv = float(m.qk_head_dim), float(m.v_head_dim)
        work = roof.gemm(T, m.kv_lora_rank + m.qk_rope_head_dim, h, linear=True)
        work = work + roof.gemm(T, a * (m.qk_nope_head_dim + dv) / tp, m.kv_lora_rank, linear=True)
        if m.q_lora_rank is None:
            work = work + roof.gemm(T, a * dq / tp, h, linear=True)
        else:
            work = work + roof.gemm(T, m.q_lora_rank, h, linear=True)
            work = work + roof.gemm(T, a * dq / tp, m.q_lora_rank, linear=True)
        return work, roof.gemm(T, h, a * dv / tp, linear=True)
    kv_dim = float(model.kv_heads) * float(model.head_dim)
    q_dim = a * float(model.head_dim)
    return roof.gemm(T, (q_dim + 2 * kv_dim) / tp, h, linear=True), roof.gemm(T, h, q_dim / tp, linear=True)


def _mlp_gemms(x: _Inputs, roof: _Roofline, T, f: float) -> tuple[_Work, _Work]:
    """A (gated) MLP of intermediate size f split over tp: up (+gate) column parallel, down row parallel."""
    h = float(x.model.hidden_size)
    return roof.gemm(T, (2 * f if x.model.gated else f) / x.tp, h, linear=True), roof.gemm(T, h, f / x.tp, linear=True)


# cuBLAS launch and tail per GEMM when a rank's experts run one after another (Megatron-Core's
# SequentialMLP, without --moe-grouped-gemm): 3 GEMMs per expert forward, 6 backward.
SEQUENTIAL_GEMM_OVERHEAD_S = 5e-6


def _moe_work(x: _Inputs, roof: _Roofline, T) -> tuple[_Work, np.ndarray]:
    """One MoE layer's feed-forward per micro-batch on one GPU (forward GEMMs; element-wise seconds):
    the router (h x E, on the tokens that enter this GPU), the shared experts as a dense MLP, and the
    E/ep local experts on their routed tokens as one grouped GEMM (Megatron-Core --moe-grouped-gemm;
    Shazeer et al. 2017's experts, tokens permuted so each expert's are contiguous) at the grouped
    rate. Expert FLOPs follow the active parameters: top_k experts per token."""
    model, training = x.model, x.training
    moe = model.moe
    assert moe is not None
    h, e = float(model.hidden_size), roof.act_bytes
    r, t_in = x.routed, x.router_tokens
    local = float(moe.num_experts) / x.ep
    per_expert = r * x.etp / local  # tokens each local expert processes (etp ranks gather theirs)
    f_e = float(moe.ffn_hidden_size) / x.etp
    experts = roof.gemm(per_expert, 2 * f_e if model.gated else f_e, h, local, grouped=True)
    experts = experts + roof.gemm(per_expert, h, f_e, local, grouped=True)
    if not training.moe_grouped_gemm:
        experts = _Work(seconds=experts.seconds + 3 * local * SEQUENTIAL_GEMM_OVERHEAD_S, flops=experts.flops)
    work = roof.gemm(t_in, float(moe.num_experts), h) + experts
    if moe.shared_experts:
        up, down = _mlp_gemms(x, roof, T, float(moe.shared_ffn))
        work = work + up + down
    # Permute into expert order and back, and the weighted combine: read and write h per copy, twice.
    permute = 4.0 * r * x.etp * h * e / roof.hbm
    f_act = float(moe.top_k) * training.moe_load_imbalance * float(moe.ffn_hidden_size) + float(moe.shared_ffn)
    return work, _elementwise_forward(x, roof, f_act) + permute


@dataclass(frozen=True, kw_only=True, slots=True)
class _Compute:
    per_micro_batch: np.ndarray  # seconds of the slowest stage
    per_step: np.ndarray
    flops_step: np.ndarray  # FLOPs of that stage per step, for the at-peak bound
    attention_forward_mb: np.ndarray  # seconds of one layer's attention per micro-batch, forward
    attention_backward_mb: np.ndarray  # ... and backward
    moe_layer_mb: np.ndarray  # seconds of one MoE layer per micro-batch, forward and backward (0: dense)
    moe_layers_stage: np.ndarray  # MoE layers of the slowest stage (MTP modules included)
    # A layer's TP blocks (attention; MLP, or a MoE layer's shared experts): the forward seconds of
    # each block's column-parallel and row-parallel GEMMs, which its TP collectives pair with.
    tp_blocks: tuple[tuple[np.ndarray, np.ndarray], ...]
    tp_blocks_moe: tuple[tuple[np.ndarray, np.ndarray], ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class _LayerTime:
    seconds: np.ndarray  # forward, backward and recomputation of one layer and micro-batch
    flops: np.ndarray


def _layer_time(
    x: _Inputs, roof: _Roofline, att: _Attention, gemms: _Work, elem_f, op: _Work | None, rc=None
) -> _LayerTime:
    """A layer's forward, backward (twice the forward's GEMMs and element-wise traffic) and what its
    recompute level (the layout's, or ``rc``) runs again."""
    rc = x.recompute if rc is None else rc
    layer_f = gemms.seconds + att.forward.seconds + elem_f
    layer_b = 2 * gemms.seconds + att.backward.seconds + 2 * elem_f
    full_rc, sel_rc, op_rc = rc == 2, rc == 1, rc == RC_TORCHTITAN_OP
    op_s = op.seconds + elem_f if op is not None else layer_f
    op_flops = op.flops if op is not None else gemms.flops + att.forward.flops
    layer_rc = np.where(
        full_rc,
        layer_f,
        np.where(sel_rc, att.forward.seconds + att.elementwise, np.where(op_rc, op_s, 0.0)),
    )
    sc_flops_f = att.forward.flops
    flops = (
        3 * gemms.flops
        + sc_flops_f
        + att.backward.flops
        + np.where(full_rc, gemms.flops + sc_flops_f, np.where(sel_rc, sc_flops_f, np.where(op_rc, op_flops, 0.0)))
    )
    return _LayerTime(seconds=layer_f + layer_b + layer_rc, flops=flops)


def _tp_blocks(x: _Inputs, roof: _Roofline, T, attn: tuple[_Work, _Work], mlp: tuple[_Work, _Work]):
    """The (column-parallel, row-parallel) GEMM pairs of a dense layer and of a MoE layer, in seconds,
    that Transformer Engine's userbuffers pair TP collectives with (``_ub_exposed``): attention's and
    the MLP's; a MoE layer's routed experts need no TP collective, its shared experts do."""
    blocks = ((attn[0].seconds, attn[1].seconds), (mlp[0].seconds, mlp[1].seconds))
    moe_blocks: tuple[tuple[np.ndarray, np.ndarray], ...] = blocks[:1]
    if x.model.moe is not None and x.model.moe.shared_experts:
        s_up, s_down = _mlp_gemms(x, roof, T, float(x.model.moe.shared_ffn))
        moe_blocks = (blocks[0], (s_up.seconds, s_down.seconds))
    return blocks, moe_blocks


def _compute(x: _Inputs) -> _Compute:
    """GEMMs, attention and element-wise work of the slowest stage."""
    model, tp, gas = x.model, x.tp, x.grad_accum_steps
    h, f, V = float(model.hidden_size), float(model.ffn_hidden_size), float(model.vocab_size)
    kv_dim = float(model.kv_heads) * float(model.head_dim)
    roof = _roofline(x)
    T = x.s_local * x.micro_batch_size  # tokens per micro-batch on this rank
    attn_pair = _attention_gemms(x, roof, T)  # (column-parallel, row-parallel)
    attn = attn_pair[0] + attn_pair[1]
    att = _attention(x, roof)
    fp8_dense, fp8_moe = _fp8_layer_casts(x, roof)
    elem_f = _elementwise_forward(x, roof) + att.elementwise + fp8_dense
    # torchtitan's op SAC counts the mms of each layer and recomputes every second one (wk, wo and
    # the MLP's w3 in Llama's order wq, wk, wv, wo, w1, w3, w2) and every non-mm op; attention
    # (SDPA) is saved.
    op = roof.gemm(T, kv_dim / tp, h) + roof.gemm(T, h, h / tp, linear=True) + roof.gemm(T, f / tp, h)
    up, down = _mlp_gemms(x, roof, T, f)
    kept = np.zeros_like(x.recompute)  # the layers full recomputation leaves out (recompute_layers)
    dense = _layer_time(x, roof, att, attn + up + down, elem_f, op)
    dense_kept = _layer_time(x, roof, att, attn + up + down, elem_f, op, kept)
    blocks, moe_blocks = _tp_blocks(x, roof, T, attn_pair, (up, down))
    if model.moe is not None:
        moe_gemms, moe_elem = _moe_work(x, roof, T)
        moe_elem = moe_elem + att.elementwise + fp8_moe
        moe = _layer_time(x, roof, att, attn + moe_gemms, moe_elem, None)
        moe_kept = _layer_time(x, roof, att, attn + moe_gemms, moe_elem, None, kept)
        host = 0.0 if x.eng.moe_cuda_graphs else x.eff.moe_layer_us * 1e-6
        moe = _LayerTime(seconds=moe.seconds + host, flops=moe.flops)
        moe_kept = _LayerTime(seconds=moe_kept.seconds + host, flops=moe_kept.flops)
    else:
        moe = moe_kept = _LayerTime(seconds=np.zeros_like(tp), flops=np.zeros_like(tp))
    # Logits on the last stage (vocab-parallel): one GEMM three times, and the fused cross-entropy
    # reading the 16-bit logits and writing fp32 softmax and its gradient.
    logit = roof.gemm(T, V / tp, h)
    logit_time_mb = 3 * logit.seconds + T * V / tp * (roof.act_bytes + 3 * 4) / roof.hbm
    # The MTP modules (last stage): a layer of the model's kind, the 2h -> h projection, and logits.
    kind = moe if model.moe is not None else dense
    proj = roof.gemm(T, h / tp, 2 * h, linear=True)
    mtp_s = x.mtp * (kind.seconds + 3 * proj.seconds + logit_time_mb)
    mtp_flops = x.mtp * (kind.flops + 3 * proj.flops + 3 * logit.flops)

    def stage(layers, moe_layers):
        # Full recomputation of the first recompute_layers of each virtual stage only: the rest run
        # as without recomputation.
        rerun = np.where(x.recompute == RECOMPUTE_CODES["full"], x.full_recompute_share(layers), 1.0)
        d_s, d_fl = (
            rerun * a + (1 - rerun) * b
            for a, b in ((dense.seconds, dense_kept.seconds), (dense.flops, dense_kept.flops))
        )
        m_s, m_fl = (
            rerun * a + (1 - rerun) * b for a, b in ((moe.seconds, moe_kept.seconds), (moe.flops, moe_kept.flops))
        )
        return (layers - moe_layers) * d_s + moe_layers * m_s, (layers - moe_layers) * d_fl + moe_layers * m_fl

    (f_s, f_fl), (m_s, m_fl), (l_s, l_fl) = (
        stage(x.lf, x.moe_first),
        stage(x.lm, x.moe_middle),
        stage(x.ll, x.moe_last),
    )
    pp1 = x.pp == 1
    if model.mtp_layers:
        f_s, f_fl = f_s + np.where(pp1, mtp_s, 0.0), f_fl + np.where(pp1, mtp_flops, 0.0)
        l_s, l_fl = l_s + mtp_s, l_fl + mtp_flops
    compute_mb = np.maximum(m_s, np.maximum(f_s, l_s + logit_time_mb))
    flops_step = gas * np.maximum(np.maximum(m_fl, f_fl), l_fl + 3 * logit.flops)
    slowest = np.argmax(np.stack([f_s, m_s, l_s + logit_time_mb]), axis=0)
    mtp_moe = x.mtp if model.moe is not None else 0.0
    moe_stage = np.choose(slowest, [x.moe_first + np.where(pp1, mtp_moe, 0.0), x.moe_middle, x.moe_last + mtp_moe])
    return _Compute(
        per_micro_batch=compute_mb,
        per_step=gas * compute_mb,
        flops_step=flops_step,
        attention_forward_mb=att.forward.seconds,
        attention_backward_mb=att.backward.seconds,
        moe_layer_mb=moe.seconds,
        moe_layers_stage=moe_stage,
        tp_blocks=blocks,
        tp_blocks_moe=moe_blocks,
    )
