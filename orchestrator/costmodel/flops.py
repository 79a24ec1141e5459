"""FLOPs of a training step.

Model FLOPs follow Megatron-LM's ``num_floating_point_operations`` (training.py, r0.8): every
GEMM counted 3x (forward, weight-gradient, data-gradient) at 2 FLOPs per multiply-add, with GQA,
SwiGLU and the logit layer; the s^2 attention term is counted non-causal as Megatron does, so MFU
figures compare with Megatron's. Recomputation adds forward FLOPs to the hardware count only
(PaLM, Chowdhery et al. 2022, App. B: MFU excludes rematerialization).
"""

from __future__ import annotations

from orchestrator.spec.model import ModelSpec


def layer_forward_flops_per_token(model: ModelSpec, seq_length: int) -> tuple[float, float]:
    """(GEMM FLOPs with weights, attention-score FLOPs) of one layer's forward pass, per token."""
    h, f = model.hidden_size, model.ffn_hidden_size
    kv_dim = model.kv_heads * model.head_dim
    weights = 2 * (h * h + 2 * h * kv_dim + h * h + (3 if model.gated else 2) * h * f)
    # QK^T and attention-times-V: 2 GEMMs of s x h per token, 2 FLOPs per multiply-add.
    scores = 2 * 2 * seq_length * h
    return float(weights), float(scores)


def logits_forward_flops_per_token(model: ModelSpec) -> float:
    return 2.0 * model.hidden_size * model.vocab_size


def model_flops_per_step(model: ModelSpec, seq_length: int, global_batch_size: int) -> float:
    """Model FLOPs of one optimizer step (no recomputation): 3 x forward."""
    w, sc = layer_forward_flops_per_token(model, seq_length)
    fwd = model.num_layers * (w + sc) + logits_forward_flops_per_token(model)
    return 3.0 * fwd * seq_length * global_batch_size
