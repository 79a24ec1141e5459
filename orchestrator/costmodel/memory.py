"""Per-GPU memory of a layout, vectorized over many layouts at once.

Every function takes numpy arrays (or plain scalars: the same code serves one layout) and
returns bytes. No I/O, no state.

Sources:
* Model states: Rajbhandari et al. 2020 (ZeRO), Sec. 3.1 and Fig. 1: mixed-precision Adam keeps
  2 + 2 + K bytes per parameter with K = 12, sharded over the data-parallel degree N_d by stage.
  Megatron-LM's distributed optimizer (docs/source/api-guide/dist_optimizer.md) keeps fp32 main
  gradients for bf16 (2 + 4 + 12 bytes, 6 + 12/d when distributed).
* Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", Sec. 4 and Table 2, generalized to GQA, SwiGLU and FlashAttention term by term (see
  ``activation_bytes_per_layer``).
"""

from __future__ import annotations

import numpy as np

GIB = float(1 << 30)
# Bytes of one element (a weight, an activation) of each training precision (TrainingSpec.precision).
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def model_state_bytes(params, dp, zero_stage, weight_b, grad_b, opt_b):
    """(weights, grads, optimizer) bytes per GPU for ``params`` parameters on this GPU before DP
    sharding. ZeRO-1 shards optimizer states, ZeRO-2 also gradients, ZeRO-3 also weights
    (ZeRO paper, Fig. 1); Megatron's distributed optimizer is zero_stage 1."""
    params = np.asarray(params, dtype=np.float64)
    dp = np.asarray(dp, dtype=np.float64)
    z = np.asarray(zero_stage)
    w = params * weight_b / np.where(z >= 3, dp, 1.0)
    g = params * grad_b / np.where(z >= 2, dp, 1.0)
    o = params * opt_b / np.where(z >= 1, dp, 1.0)
    return w, g, o


def _attention_bytes(sbh, scale, a, kv, qkvo):
    """Q, K, V and the attention output, 16-bit, per layer (widths ``qkvo`` in h, or GQA's)."""
    if qkvo is None:
        return (2 + 2 * kv / a + 2 * kv / a + 2) * sbh * scale
    q, k, v, o = qkvo
    return (2 * q + 2 * k + 2 * v + 2 * o) * sbh * scale


def activation_bytes_per_layer(
    s,
    b,
    h,
    f,
    a,
    kv,
    t,
    sp,
    recompute,
    *,
    swiglu=True,
    flash=True,
    hidden_dropout=False,
    attention_dropout=False,
    act_bytes=2,
    fp8=False,
    qkvo=None,
    latent=0.0,
):
    """Activation bytes one transformer layer keeps for one micro-batch, Korthikanti et al. 2022.

    ``recompute`` is 0 (none), 1 (selective) or 2 (full); ``sp`` is sequence parallelism.
    With GeLU, f = 4h, a = kv, no FlashAttention and both dropouts this is exactly Table 2:
    sbh(34 + 5as/h) without parallelism, sbh(10 + 24/t + 5as/(ht)) with TP, sbh/t(34 + 5as/h)
    with TP+SP, sbh(10 + 24/t) with selective recompute, and 2sbh with full recompute.

    The 34 decomposes (Sec. 4.1) into terms that stay replicated across TP ranks unless SP
    shards them (layer-norm inputs 4, QKV input 2, MLP input 2, two dropout masks 1+1) and terms
    TP always shards (Q and K 4, V 2, output-projection input 2, MLP 16). Generalized:
    * GQA: K and V are kv/a of the query size.
    * MLP: GeLU stores its input and output, 2 x 2sbf; SwiGLU stores the fused gate/up output
      (2f wide) and the down-projection input, 2 x 2sbf + 2sbf.
    * Attention scores: 2as^2b softmax output, plus as^2b mask and 2as^2b dropout output with
      attention dropout. FlashAttention stores none of them, only the softmax log-sum-exp in fp32
      (4asb); selective recompute recomputes them.
    * Attention widths: ``qkvo`` gives the widths of Q, K, V and the attention output as multiples of
      h (default 1, kv/a, kv/a, 1; Qwen3's 32 x 128 heads on h = 2048 make Q and O 2h wide). Multi-
      latent attention (DeepSeek-V2 Sec. 2.1) saves its per-head Q, K, V and output the same way,
      and besides them the low-rank latents each RMSNorm and up-projection keeps, ``latent`` x h
      elements per token, replicated over tp (the down-projections are not split).
    * FP8 (Transformer Engine): each Linear saves its input cast to FP8, 1 byte: the QKV and MLP
      inputs (the layer-norm outputs) and the down-projection input take 1 byte instead of 2; the
      output projection's FP8 input is saved beside the attention output the fused attention
      keeps (2 + 1).
    """
    s = np.asarray(s, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)
    sp = np.asarray(sp, dtype=bool)
    rc = np.asarray(recompute)
    sbh = s * b * h
    scale = act_bytes / 2.0  # the paper assumes 16-bit activations
    mask = 1.0 if hidden_dropout else 0.0
    lin_in = 1.0 if fp8 else 2.0 * scale  # a Linear's saved input, bytes per element
    replicated = (4 * scale + 2 * lin_in) * sbh + 2 * mask * sbh  # dropout masks are 1 byte each
    q_k_v_o = _attention_bytes(sbh, scale, a, kv, qkvo) + (1.0 if fp8 else 0.0) * sbh
    if latent:
        replicated = replicated + 2 * 2 * latent * sbh * scale
    mlp = ((4.0 if swiglu else 2.0) * scale + lin_in) * s * b * f
    sharded = q_k_v_o + mlp
    if flash:
        scores = 4.0 * a * s * b  # fp32 log-sum-exp per query row and head
    else:
        scores = (2 + (3 if attention_dropout else 0)) * a * s * s * b * scale
    # Selective recomputation checkpoints the whole core attention (Megatron-LM attention.py
    # _checkpointed_attention_forward; the entrypoint's model.py likewise), so FlashAttention's
    # log-sum-exp is recomputed with the scores: nothing of it is kept (measured:
    # tests/system/test_activation_census.py, none - selective = 4asb exactly).
    kept = np.where(rc == 1, 0.0, scores)
    per_layer = np.where(sp, replicated / t, replicated) + sharded / t + kept / t
    # Full recompute keeps only the layer input: 2sbh, sharded along the sequence with SP.
    full = np.where(sp, 2 * sbh * scale / t, 2 * sbh * scale)
    # torchtitan's op SAC (calibration only, evaluate.RC_TORCHTITAN_OP) keeps the layer input, the
    # outputs of every other mm (wq, wv, w1, w2 in Llama's order) and SDPA's output and log-sum-exp.
    op = (
        np.where(sp, 2 * sbh * scale / t, 2 * sbh * scale)
        + ((2 + 2 * kv / a + 2 + 2) * sbh * scale + 2 * s * b * f * scale + scores) / t
    )
    return np.where(rc == 2, full, np.where(rc == 3, op, per_layer))


def entrypoint_extra_bytes_per_layer(s, b, d, t, sp, recompute, *, rmsnorm=True, rope=True, act_bytes=2):
    """What dsorch's bundled entrypoint keeps per layer and micro-batch beyond
    ``activation_bytes_per_layer``, counted tensor by tensor by tests/system/test_activation_census.py
    (train/loop/census.py saved_activations), to the byte, at tp 1 and 2, with and without SP: the bf16
    cos/sin tables of RoPE, cast from the fp32 buffers in every forward (DeepSpeed casts parameters,
    not buffers) and kept by the rotations, 2 x s x head_dim; each RMSNorm's fp32 1/rms per token
    (Megatron's fused norms keep it too, as rsigma; the paper counts no s x b terms), on the
    sequence shard under SP. Nothing else: its layer keeps what Megatron-LM's fused one keeps
    (train/model/decoder.py: _RMSNorm keeps its input and 1/rms,
    _GatedActivation the gate/up output, v is copied out of the fused QKV output;
    train/model/tensor_parallel.py _SPColumnLinear keeps the sequence shard under SP). Full
    recomputation keeps only the layer input, as the formula says.
    """
    s = np.asarray(s, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)
    rc = np.asarray(recompute)
    # An fp32 model saves the fp32 buffers themselves, which are no activations.
    extra = 2 * s * d * act_bytes if rope and act_bytes != 4 else np.zeros_like(s)
    if rmsnorm:
        extra = extra + 2 * 4 * np.where(np.asarray(sp, dtype=bool), s / t, s) * b
    return np.where(rc == 2, 0.0, extra)


def moe_activation_bytes_per_layer(
    s,
    b,
    h,
    t,
    sp,
    recompute,
    *,
    num_experts,
    top_k,
    expert_ffn,
    shared_ffn=0,
    shared_gate=False,
    swiglu=True,
    router="softmax",
    norm_top_k=True,
    load_balancing="aux_loss",
    sent=None,
    received=None,
    act_bytes=2,
):
    """What a mixture-of-experts feed-forward keeps for backward, per layer and micro-batch, beyond
    what ``activation_bytes_per_layer`` counts with ``f = 0`` (attention, the norms' inputs and the
    MLP input, i.e. the post-attention norm's output, which the router keeps in the MLP's place).
    A MoE layer of the bundled entrypoint (train/model/moe.py) keeps formula(f = 0) + entrypoint extras +
    this, to the byte (tests/system/test_activation_census.py, at tp 1, tp 2 with and without
    sequence parallelism, and ep 2).

    T = s b tokens of the micro-batch: the entrypoint routes the whole micro-batch on every tp rank
    (under SP it gathers the sequence first), so the routing terms are not divided by t. ``sent``:
    the token copies this rank routes (T top_k, fewer when a capacity drops some); ``received``: the
    copies its experts process (with ep > 1 what the other ranks of the expert group send; balanced
    routing gives ``sent``; Megatron's moe_load_imbalance is their ratio on the busiest rank). The
    terms, with the op that keeps each (a = act_bytes; router scores and probabilities are fp32,
    indices int64):

    * router scores, 4 T E: the softmax / sigmoid output over all experts (their backward reads it);
    * chosen experts, 8 T top_k: the index of the gather that takes the chosen scores;
    * renormalisation (norm_top_k, top_k > 1), 4 T top_k + 4 T: the chosen scores and their sum,
      both kept by the division;
    * load-balancing loss: the routed fractions f_i, 4 E (``aux_loss``) or 4 b E per sequence
      (``seq_aux_loss``), kept by the product f_i P_i; with a sigmoid router also the per-token sum
      its scores are normalised by, 4 T. Pass ``load_balancing="none"`` when aux_loss_coeff is 0;
    * dispatch indices, 8 T top_k + 8 sent: the sort order of all routes (a view of it keeps it
      whole) and the token of each sent copy (the dispatch gather and the combining scatter);
    * the experts' inputs, a received h: the permuted copies (ep 1), or the received ones regrouped
      by expert (ep > 1; the copies sent and the raw received block are not kept);
    * the experts' GEMMs, a received (3 or 2) f_e / t: the fused gate/up output and the
      down-projection input (SwiGLU), or GeLU's input and output, per copy, as the dense MLP per
      token (each expert split over the tp group, etp = tp);
    * combining, a sent (h + 1): the expert outputs back on this rank and the probabilities, cast
      to the activations' dtype, both kept by their product;
    * shared experts, a s b (3 or 2) f_s / t: the dense MLP's terms for their intermediate size
      (their input is the MLP input already counted); with the sigmoid gate also the gate and the
      shared output, a s b (h + 1), both over t under SP;
    * sequence parallelism: + a s b h, the gathered sequence the router keeps, and - a s b h / t
      without shared experts, whose column-parallel GEMM is what keeps the sequence shard the
      formula counts as the MLP input.

    Full recomputation keeps only the layer input (counted by the formula): 0 here.
    """
    s, b, t = (np.asarray(v, dtype=np.float64) for v in (s, b, t))
    sp = np.asarray(sp, dtype=bool)
    a, e, k = act_bytes, num_experts, top_k
    tokens = s * b
    sent = tokens * k if sent is None else np.asarray(sent, dtype=np.float64)
    received = sent if received is None else np.asarray(received, dtype=np.float64)
    per_token = 3.0 if swiglu else 2.0  # expert GEMM outputs kept per token, in units of f
    routing = 4 * tokens * e + 8 * tokens * k + (4 * tokens * k + 4 * tokens if norm_top_k and k > 1 else 0.0)
    if load_balancing != "none":
        routing = routing + (4 * b * e if load_balancing == "seq_aux_loss" else 4 * e)
        routing = routing + (4 * tokens if router == "sigmoid" else 0.0)
    dispatch = 8 * tokens * k + 8 * sent + a * received * h + a * received * per_token * expert_ffn / t
    combine = a * sent * (h + 1)
    shared = a * tokens * per_token * shared_ffn / t
    if shared_gate:
        shared = shared + a * np.where(sp, tokens / t, tokens) * (h + 1)
    gathered = np.where(sp, a * tokens * h - (0.0 if shared_ffn else a * tokens * h / t), 0.0)
    total = routing + dispatch + combine + shared + gathered
    return np.where(np.asarray(recompute) == 2, 0.0, total)


def in_flight_micro_batches(pp, vpp, m, stage):
    """Micro-batches (in whole-stage units) whose activations a pipeline stage holds at peak.

    1F1B (PipeDream-Flush) runs pp - i - 1 warm-up forwards on stage i and then one more before
    its first backward: pp - i micro-batches (Narayanan et al. 2021, Sec. 2.2.1). The interleaved
    schedule runs 2(pp - i - 1) + (vpp - 1) pp warm-up forwards of model chunks, each 1/vpp of
    the stage's layers, and never more than the m vpp chunks that exist (Megatron-LM
    core/pipeline_parallel/schedules.py get_pp_rank_microbatches: num_warmup_microbatches, capped
    at total_num_microbatches): min(pp + (pp - 2i - 1)/vpp, m) stages' worth. On the first stage
    that is Korthikanti et al. 2022's (1 + (pp-1)/(pp vpp)) x pp (Sec. 4.2.3); with as few
    micro-batches as stages every chunk of every micro-batch is in flight at once, no more than m.
    """
    pp = np.asarray(pp, dtype=np.float64)
    vpp = np.asarray(vpp, dtype=np.float64)
    m = np.asarray(m, dtype=np.float64)
    one_f_one_b = np.minimum(pp - stage, m)
    interleaved = np.minimum(pp + (pp - 2 * stage - 1) / vpp, m)
    return np.maximum(np.where(vpp > 1, interleaved, one_f_one_b), 1.0)


def moe_mlp_activation_bytes(r, t_in, h, f_e, num_experts, etp, recompute, *, gated=True, act_bytes=2, fp8=False):
    """Activation bytes the routed part of one MoE layer keeps for one micro-batch on one GPU, as
    Megatron-Core's MoELayer saves them (core/transformer/moe/: router.py, token_dispatcher.py
    MoEAlltoAllTokenDispatcher, experts.py GroupedMLP/TEGroupedMLP), for ``r`` routed token copies
    on this GPU (its share of top_k x tokens, times the load imbalance) out of ``t_in`` tokens that
    entered its router:

    * router: the fp32 logits and the fp32 scores after softmax/sigmoid it back-propagates through,
      4 + 4 bytes per token and expert (TopKRouter.routing keeps both under autograd);
    * experts: the permuted tokens (fc1's input, h), fc1's output (the gate and up halves, 2 f_e, or
      f_e ungated) and the activation's output (fc2's input, f_e), per routed copy; FP8 saves fc1's
      and fc2's inputs as 1-byte copies;
    * combine: the experts' output, h per copy, which the weighted unpermute multiplies by the
      routing probabilities and keeps for their gradient.

    The MoE layer's input norm and residual are the dense formula's (activation_bytes_per_layer with
    f = 0); the shared experts are a dense MLP of their size. ``recompute`` 2 (full) keeps none of
    it: the layer input only, counted by the dense formula.
    """
    r = np.asarray(r, dtype=np.float64)
    scale = act_bytes / 2.0
    lin_in = 1.0 if fp8 else 2.0 * scale
    router = 8.0 * np.asarray(t_in, dtype=np.float64) * num_experts
    fc1_out = (4.0 if gated else 2.0) * scale * f_e
    # Expert tensor parallelism gathers the copies of its etp ranks and splits f_e over them: the
    # h-wide tensors are held etp times, the f_e-wide ones once in total.
    etp = np.asarray(etp, dtype=np.float64)
    per_copy = (lin_in * h + 2.0 * scale * h) * etp + fc1_out + lin_in * f_e
    kept = router + r * per_copy
    return np.where(np.asarray(recompute) == 2, 0.0, kept)
