"""A Hugging Face ``config.json``'s values as ``dsorch import-hf``'s readers see them (``HFConfig``:
each value read with an error a user can act on, and the refusal of what the spec cannot express),
and the keys every family's reader shares: head width, RoPE, the norms' epsilon, quantization, the
sliding window, biases.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.errors import SpecError


class HFConfig:
    """The config's values, read with the error a user can act on."""

    def __init__(self, data: dict, path: Path, family: str, prefix: str = ""):
        self.data, self.path, self.family = data, path, family
        self.prefix = prefix  # "text_config." when the model is nested in a multimodal config
        self.window: int | None = None  # set by read_window

    def refuse(self, key: str, why: str) -> SpecError:
        return SpecError(
            f"{self.path}: {self.prefix}{key}: {why}. dsorch's model spec cannot express this {self.family} "
            f"model; plan a model without it, or write the spec by hand (see examples/)."
        )

    def get(self, *keys: str, default: Any = None, required: bool = False) -> Any:
        for k in keys:
            if self.data.get(k) is not None:
                return self.data[k]
        if required:
            raise SpecError(
                f"{self.path}: no {' or '.join(keys)}; a {self.family} config.json states it. Is this "
                f"the model's config.json?"
            )
        return default

    def integer(self, *keys: str, default: int | None = None) -> int:
        v = self.get(*keys, default=default, required=default is None)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise SpecError(f"{self.path}: {keys[0]}: {v!r} is not a positive integer.")
        return v

    def number(self, key: str, default: float) -> float:
        v = self.get(key, default=default)
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            raise SpecError(f"{self.path}: {key}: {v!r} is not a non-negative number.")
        return float(v)


def read_kv_channels(c: HFConfig, hidden: int, heads: int, default: int | None = None) -> int | None:
    """An explicit head width (head_dim) when it is not hidden / heads: Q and O are
    hidden x heads*head_dim, K and V hidden x kv_heads*head_dim (LlamaAttention, Qwen3Attention,
    GemmaAttention), which the spec's kv_channels sets (Megatron-LM --kv-channels)."""
    if c.get("head_dim", default=default) is None:
        return None
    d = c.integer("head_dim", default=default)
    return None if d * heads == hidden else d


def read_rope(c: HFConfig, notes: list[str], theta: float = 10000.0, default_scaling: str | None = None) -> float:
    """rope_theta (the configuration class's default ``theta``), and a note for rope_scaling (the
    class's ``default_scaling`` when the config has none)."""
    # transformers 5 writes both into rope_parameters; published configs before it, rope_theta and
    # rope_scaling.
    params = c.get("rope_parameters")
    scaling = c.get("rope_scaling") or params or default_scaling
    if isinstance(scaling, dict):
        kind = scaling.get("rope_type") or scaling.get("type")
    else:
        kind = scaling
    if kind and kind != "default":
        notes.append(
            f"rope_scaling {kind} (RoPE frequencies rescaled for long context): the spec's "
            f"RoPE is plain; memory and step time are the same"
        )
    if isinstance(params, dict) and params.get("rope_theta") is not None:
        theta = params["rope_theta"]
    return float(c.get("rope_theta", "rotary_emb_base", default=theta))


def read_norm_epsilon(c: HFConfig, key: str, default: float) -> float:
    """The norms' epsilon (``key``; ``default``: the configuration class's, e.g. LlamaConfig.rms_norm_eps
    1e-6, MixtralConfig's and GPT-NeoX's 1e-5). The spec's model.norm_epsilon."""
    v = c.number(key, default)
    if not 0 < v < 1:
        raise SpecError(f"{c.path}: {c.prefix}{key}: {v!r} is not an epsilon between 0 and 1.")
    return v


def note_quantized(c: HFConfig, notes: list[str]) -> None:
    q = c.get("quantization_config")
    if isinstance(q, dict) and q.get("quant_method"):
        notes.append(
            f"quantization_config {q['quant_method']} (how the published weights are stored): the spec "
            f"trains at training.precision"
        )


def read_window(c: HFConfig, use_key: str | None = None) -> None:
    """The sliding window in effect (Mistral's sliding_window; Qwen2's only with use_sliding_window).
    Kept on the config, not refused here: whether full attention equals it depends on the sequence
    length, which spec_document knows."""
    used = c.get(use_key, default=False) if use_key else True
    if used and c.get("sliding_window") is not None:
        c.window = c.integer("sliding_window")


def read_biases(c: HFConfig) -> bool:
    """The spec's bias flag puts biases on every linear layer; LlamaConfig's attention_bias and
    mlp_bias set them on the attention and on the MLP apart."""
    attn_bias = bool(c.get("attention_bias", default=False))
    mlp_bias = bool(c.get("mlp_bias", default=False))
    if attn_bias != mlp_bias:
        raise c.refuse("attention_bias", f"{attn_bias} with mlp_bias {mlp_bias}: biases on one kind of layer only")
    return attn_bias
