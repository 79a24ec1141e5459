"""FLOPs of a training step.

Model FLOPs follow Megatron-LM's ``num_floating_point_operations`` (training.py, r0.8): every
GEMM counted 3x (forward, weight-gradient, data-gradient) at 2 FLOPs per multiply-add, with GQA,
SwiGLU and the logit layer; the s^2 attention term is counted non-causal as Megatron does, so MFU
figures compare with Megatron's. Recomputation adds forward FLOPs to the hardware count only
(PaLM, Chowdhery et al. 2022, App. B: MFU excludes rematerialization).

Mixture-of-experts layers count the parameters a token passes through: the router, top_k routed
experts and the shared experts (Megatron-LM's count: moe_ffn_hidden_size x topk + the shared
experts' size); multi-latent attention its down- and up-projections; the MTP modules (DeepSeek-V3)
one more layer, projection and logits each.
"""

from __future__ import annotations

from orchestrator.spec.model import ModelSpec


def window_fraction(model: ModelSpec, s: float) -> float:
    """The causal attention work of the average layer relative to full causal attention over s tokens:
    1 without a sliding window; a window of w tokens leaves s w - w^2 / 2 of the s^2 / 2 query-key
    pairs in each sliding layer (GPT-OSS alternates them with full layers, w = 128)."""
    w = model.sliding_window
    if w is None or w >= s:
        return 1.0
    sliding = model.num_sliding_layers / model.num_layers
    return sliding * (2 * w / s - (w / s) ** 2) + (1 - sliding)


def _attention_gemm_params(model: ModelSpec) -> int:
    """Weights of one layer's attention projections (no biases, norms or sinks)."""
    h, a = model.hidden_size, model.num_attention_heads
    if model.mla is not None:
        m = model.mla
        q = h * a * m.qk_head_dim if m.q_lora_rank is None else (h + a * m.qk_head_dim) * m.q_lora_rank
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)
        return q + kv + a * m.v_head_dim * h
    q, kv_dim = a * model.head_dim, model.kv_heads * model.head_dim
    return h * q + 2 * h * kv_dim + q * h


def _mlp_gemm_params(model: ModelSpec, f: int) -> int:
    return (3 if model.gated else 2) * model.hidden_size * f


def layer_forward_flops_per_token(model: ModelSpec, seq_length: int, *, moe: bool = False) -> tuple[float, float]:
    """(GEMM FLOPs with weights, attention-score FLOPs) of one layer's forward pass, per token; the
    MoE layer's with ``moe``, for the average layer's attention window."""
    h, f = model.hidden_size, model.ffn_hidden_size
    attention = _attention_gemm_params(model)
    # QK^T over the query/key head width and attention-times-V over the value head width, per token
    # and head, 2 FLOPs per multiply-add (4 s h for plain attention), of the average layer's window.
    heads = model.num_attention_heads
    scores = 2 * seq_length * heads * (model.head_dim + model.v_head_dim) * window_fraction(model, seq_length)
    if moe and model.moe is not None:
        e = model.moe
        mlp = model.hidden_size * e.num_experts + e.top_k * _mlp_gemm_params(model, e.ffn_hidden_size)
        mlp += _mlp_gemm_params(model, e.shared_ffn) if e.shared_experts else 0
    else:
        mlp = (3 if model.gated else 2) * h * f
    return float(2 * (attention + mlp)), float(scores)


def logits_forward_flops_per_token(model: ModelSpec) -> float:
    return 2.0 * model.hidden_size * model.vocab_size


def model_flops_per_step(model: ModelSpec, seq_length: int, global_batch_size: int, *, causal: bool = False) -> float:
    """Model FLOPs of one optimizer step (no recomputation): 3 x forward. ``causal``: the s^2
    attention terms halved, the query-key pairs a causal mask leaves (FlashAttention skips the
    masked blocks; FlashAttention-2, Dao 2023, Sec. 4.1 counts causal attention so), for the MFU of that
    convention; the default counts them whole, as Megatron-LM's num_floating_point_operations does."""
    w, sc = layer_forward_flops_per_token(model, seq_length)
    wm, scm = layer_forward_flops_per_token(model, seq_length, moe=True)
    if causal:
        sc, scm = sc / 2, scm / 2
    moe_layers = model.num_moe_layers
    fwd = (model.num_layers - moe_layers) * (w + sc) + moe_layers * (wm + scm) + logits_forward_flops_per_token(model)
    # Each MTP module: a layer of the model's kind, the 2h -> h projection, and its own logits.
    mtp_layer = (wm + scm) if model.moe is not None else (w + sc)
    h = model.hidden_size
    fwd += model.mtp_layers * (mtp_layer + 2.0 * 2 * h * h + logits_forward_flops_per_token(model))
    return 3.0 * fwd * seq_length * global_batch_size
