"""A Hugging Face ``config.json`` to a dsorch model spec, offline (no hub, no transformers).

Families: Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE, DeepSeek-V3, GPT-OSS, Gemma,
GPT-NeoX (Pythia), GPT-2, Falcon. Each reader states the key names and the defaults of that family's
configuration class in transformers (``configuration_<family>.py``; DeepSeek-V3's own
``configuration_deepseek.py`` for the keys transformers' class lacks), since a published config.json
leaves out what equals the default.

What the spec cannot express is refused with the key that says it, when it changes the shapes or the
work (a norm shared by attention and MLP, ALiBi, chunked attention, Mamba layers, an expert setting
a family's reader does not map, a pattern of MoE layers the spec's cannot reproduce). What changes
only the numerics of an otherwise equal model (RoPE scaling, partial rotary, Gemma's embedding
scale, router jitter) is carried as a warning and into the spec's ``source``: memory and step time,
what dsorch plans, are the same.

Here: the refusals no family's reader gets to, the table of families by model_type (``HF_FAMILIES``)
and the spec document. The readers are in spec/hf_families.py, the accessor they share and the keys
every reader reads alike in spec/hf_config.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import SpecError
from orchestrator.spec.hf_config import HFConfig
from orchestrator.spec.hf_families import (
    read_deepseek_v3,
    read_falcon,
    read_gpt2,
    read_gpt_neox,
    read_gpt_oss,
    read_llama_like,
    read_mixtral,
    read_qwen_moe,
)

# Sequence and batch the imported spec trains with unless the flags say otherwise: the config
# states the architecture, not the training run. About 4M tokens per step (Llama 3's 8K x 512).
DEFAULT_MAX_SEQ = 8192
DEFAULT_TOKENS_PER_STEP = 4 * 1024 * 1024


@dataclass
class Imported:
    name: str
    model: dict[str, Any]
    family: str
    notes: list[str] = field(default_factory=list)  # numerics the spec does not carry
    path: Path | None = None  # the config.json, for errors about it
    # The attention window in tokens (Mistral's sliding_window), None for full attention. Whether the
    # spec can carry it depends on the sequence trained, which spec_document decides.
    window: int | None = None


# ---- what no family imports ----

# Keys of the hybrid state-space models (transformers' configuration_jamba.py, configuration_zamba.py,
# configuration_zamba2.py, configuration_nemotron_h.py, configuration_falcon_h1.py,
# configuration_bamba.py, configuration_granitemoehybrid.py): which layers are Mamba and which
# attention, and the Mamba blocks' sizes. The first one a config sets is named.
_HYBRID_KEYS = (
    "layers_block_type",
    "attn_layer_period",
    "attn_layer_offset",
    "hybrid_override_pattern",
    "layer_types",
    "mamba_d_ssm",
    "mamba_d_state",
    "mamba_n_heads",
    "mamba_num_heads",
    "ssm_state_size",
    "mamba_expand",
)
# layer_types values that are attention: GPT-OSS's, Gemma 2/3's, Qwen2's (transformers'
# configuration_utils.ALLOWED_LAYER_TYPES also lists "chunked_attention", Llama 4's, refused below).
_ATTENTION_LAYERS = {"full_attention", "sliding_attention"}


def _hybrid(c: HFConfig) -> None:
    for key in _HYBRID_KEYS:
        v = c.data.get(key)
        if v in (None, [], ""):
            continue
        if key == "layer_types" and isinstance(v, list) and set(v) <= _ATTENTION_LAYERS:
            continue  # full and sliding attention: GPT-OSS's reader maps it
        shown = repr(v) if not isinstance(v, list | str) or len(v) <= 8 else f"{v[:8]!r}... ({len(v)} entries)"
        raise c.refuse(
            key,
            f"{shown}: a hybrid of state-space (Mamba) or linear-attention layers and attention layers; "
            f"every layer the spec describes is a softmax-attention layer, so the other layers' "
            f"parameters, FLOPs and state would be counted as attention's",
        )


def _chunked(c: HFConfig) -> None:
    """Llama 4 (configuration_llama4.py): attention within chunks of attention_chunk_size tokens,
    and layers without RoPE (no_rope_layers) among the rotary ones, in a text_config inside the
    multimodal config."""
    text = c.data.get("text_config")
    inner = HFConfig(text, c.path, c.family, "text_config.") if isinstance(text, dict) else c
    if inner.get("attention_chunk_size") is not None:
        n = inner.get("attention_chunk_size")
        raise inner.refuse(
            "attention_chunk_size",
            f"{n}: chunked attention (each token attends only within its block of {n} tokens on the "
            f"layers with RoPE); the spec's attention is causal over the whole sequence, or a sliding "
            f"window, never blocks",
        )
    nope = inner.get("no_rope_layers")
    if isinstance(nope, list) and 0 in nope:
        raise inner.refuse(
            "no_rope_layers",
            f"{nope.count(0)} of {len(nope)} layers without RoPE (interleaved NoPE layers); the spec's "
            f"position embedding is one kind for every layer",
        )


# ---- the families ----

Reader = Callable[[HFConfig, list[str]], dict]


@dataclass(frozen=True)
class _Family:
    name: str
    read: Reader
    # The expert (and MTP) keys this family's reader maps; any other such key the config sets is refused.
    moe_keys: frozenset[str] = frozenset()


_MIXTRAL_KEYS = {
    "num_local_experts",
    "num_experts",
    "num_experts_per_tok",
    "router_aux_loss_coef",
    "router_jitter_noise",
}
_QWEN_MOE_KEYS = {
    *("num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"),
    *("mlp_only_layers", "norm_topk_prob", "router_aux_loss_coef"),
}
_DEEPSEEK_KEYS = {
    *("n_routed_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts"),
    *("first_k_dense_replace", "moe_layer_freq", "scoring_func", "topk_method", "n_group", "topk_group"),
    *("routed_scaling_factor", "norm_topk_prob", "num_nextn_predict_layers", "aux_loss_alpha", "seq_aux"),
}
_GPT_OSS_KEYS = {"num_local_experts", "num_experts", "experts_per_token", "num_experts_per_tok", "router_aux_loss_coef"}
_FALCON = _Family("falcon", read_falcon)
HF_FAMILIES = {
    "llama": _Family("llama", lambda c, n: read_llama_like(c, "llama", n)),
    "mistral": _Family("mistral", lambda c, n: read_llama_like(c, "mistral", n)),
    "mixtral": _Family("mixtral", read_mixtral, frozenset(_MIXTRAL_KEYS)),
    "qwen2": _Family("qwen2", lambda c, n: read_llama_like(c, "qwen2", n)),
    "qwen2_moe": _Family(
        "qwen2-moe",
        lambda c, n: read_qwen_moe(c, "qwen2_moe", n),
        frozenset(_QWEN_MOE_KEYS | {"shared_expert_intermediate_size"}),
    ),
    "qwen3": _Family("qwen3", lambda c, n: read_llama_like(c, "qwen3", n)),
    "qwen3_moe": _Family("qwen3-moe", lambda c, n: read_qwen_moe(c, "qwen3_moe", n), frozenset(_QWEN_MOE_KEYS)),
    "deepseek_v3": _Family("deepseek-v3", read_deepseek_v3, frozenset(_DEEPSEEK_KEYS)),
    "gpt_oss": _Family("gpt-oss", read_gpt_oss, frozenset(_GPT_OSS_KEYS)),
    "gemma": _Family("gemma", lambda c, n: read_llama_like(c, "gemma", n)),
    "gpt_neox": _Family("gpt-neox", read_gpt_neox),
    "gpt2": _Family("gpt2", read_gpt2),
    "falcon": _FALCON,
    "RefinedWeb": _FALCON,  # Falcon's configs before transformers 4.33
    "RefinedWebModel": _FALCON,
}

# Keys that set experts, their routing and balancing, or multi-token prediction in some family's
# configuration class (num_local_experts, n_routed_experts, moe_intermediate_size, router_*,
# topk_*, decoder_sparse_step, first_k_dense_replace, num_nextn_predict_layers, ...).
_MOE_KEY = re.compile(r"expert|moe|router|routed|topk|top_k|n_group|sparse_step|mlp_only|dense_replace|scoring_func"
                      r"|aux_loss|seq_aux|nextn|mtp")  # fmt: skip
# What an inference server reads (which outputs forward() returns; DeepSeek's expert-parallel size for
# its own inference code): nothing about the model trained.
_INFERENCE_ONLY = frozenset({"output_router_logits", "ep_size"})


def _unmapped_moe(c: HFConfig, family: _Family) -> None:
    for key, v in c.data.items():
        if key in family.moe_keys or key in _INFERENCE_ONLY or not _MOE_KEY.search(key):
            continue
        if v in (None, False, 0, [], {}):
            continue  # unset: the family's default, no experts
        what = "a mixture-of-experts setting" if not re.search("nextn|mtp", key) else "multi-token prediction"
        mapped = ", ".join(sorted(family.moe_keys)) or "none: it reads dense models"
        raise c.refuse(
            key,
            f"{v!r}: {what} that dsorch's {family.name} import does not map (the expert keys it maps: "
            f"{mapped}); the spec would describe a different model",
        )


def read_config(path: Path) -> dict:
    from orchestrator.spec.yamlio import read_input

    raw = read_input(path)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecError(f"{path}: not a JSON file ({e}); give the model's config.json.") from e
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a config.json is a JSON object; this is a {type(data).__name__}.")
    return data


def import_config(path: Path, name: str | None = None) -> Imported:
    data = read_config(path)
    kind = data.get("model_type")
    # Checked before the family, so that Jamba is refused for its Mamba layers and Llama 4 for its
    # chunked attention, not for their model_type.
    first = HFConfig(data, path, str(kind) if kind else "Hugging Face")
    _chunked(first)  # first: transformers 5 writes Llama 4's layer_types as "chunked_attention"
    _hybrid(first)
    if kind not in HF_FAMILIES:
        known = ", ".join(sorted(k for k in HF_FAMILIES if k.islower()))
        raise SpecError(
            f"{path}: model_type {kind!r} is not a family dsorch imports ({known}); write the spec by "
            f"hand (see examples/)."
        )
    family = HF_FAMILIES[kind]
    notes: list[str] = []
    c = HFConfig(data, path, family.name)
    _unmapped_moe(c, family)
    model = family.read(c, notes)
    if name is None:
        ref = data.get("_name_or_path")
        name = (str(ref).rstrip("/").split("/")[-1] if ref else path.resolve().parent.name) or family.name
    return Imported(name, model, family.name, notes, path=path, window=c.window)


def spec_document(imp: Imported, source: str, seq_length: int | None, global_batch_size: int | None) -> dict:
    """The spec file's content: the imported model and a training section to edit."""
    mpe = imp.model.get("max_position_embeddings")
    seq = seq_length or min(mpe or DEFAULT_MAX_SEQ, DEFAULT_MAX_SEQ)
    model = dict(imp.model)
    if imp.window is not None and seq > imp.window:
        # A query at position i attends to the keys j <= i with j > i - window (transformers'
        # masking_utils.sliding_window_overlay on the causal mask; the Mistral 7B paper, Jiang et al.
        # 2023 sec. 2, counts one key more). In a sequence of seq tokens i - j <= seq - 1, so with
        # seq <= window every earlier key is inside the window: the mask is the causal mask, and the
        # spec's full attention is exact, FLOPs and memory alike. Longer sequences attend to fewer
        # keys: the spec carries the window (every layer), and the planner counts the keys it sees.
        model["sliding_window"] = imp.window
    gbs = global_batch_size or max(1, DEFAULT_TOKENS_PER_STEP // seq)
    text = source + ("; not carried: " + "; ".join(imp.notes) if imp.notes else "")
    return {
        "name": imp.name,
        "source": text,
        "model": model,
        "training": {"seq_length": seq, "global_batch_size": gbs, "precision": "bf16"},
    }
