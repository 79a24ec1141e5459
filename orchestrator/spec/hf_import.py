"""A Hugging Face ``config.json`` to a dsorch model spec, offline (no hub, no transformers).

Families: Llama, Mistral, Qwen2, Gemma, GPT-NeoX (Pythia), GPT-2, Falcon. Each reader states
the key names and the defaults of that family's configuration class in transformers
(``configuration_<family>.py``), since a published config.json leaves out what equals the default.

What the spec cannot express is refused with the key that says it, when it changes the shapes or
the work (a mixture of experts, an explicit head_dim that is not hidden / heads, a norm shared by
attention and MLP, ALiBi, a sliding window shorter than the sequence trained). What changes only
the numerics of an otherwise equal model (RoPE scaling, partial rotary, Gemma's embedding scale)
is carried as a warning and into the spec's ``source``: memory and step time, what dsorch plans,
are the same.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import SpecError

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


class _Config:
    """The config's values, read with the error a user can act on."""

    def __init__(self, data: dict, path: Path, family: str):
        self.data, self.path, self.family = data, path, family
        self.window: int | None = None  # set by _window

    def refuse(self, key: str, why: str) -> SpecError:
        return SpecError(
            f"{self.path}: {key}: {why}. dsorch's model spec cannot express this {self.family} "
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


def _head_dim(c: _Config, hidden: int, heads: int) -> None:
    d = c.get("head_dim")
    if d is None or d * heads == hidden:
        return
    # Q and O are hidden x heads*head_dim, K and V hidden x kv_heads*head_dim (LlamaAttention,
    # GemmaAttention). The spec has no head_dim key: ModelSpec.head_dim is hidden / heads, so every
    # one of these matrices, and the attention's FLOPs and activations, would come out the wrong size.
    kv = c.integer("num_key_value_heads", default=heads)
    layers = c.integer("num_hidden_layers")
    gap = layers * 2 * hidden * (heads + kv) * (d - hidden / heads)
    raise c.refuse(
        "head_dim",
        f"{d}, but hidden_size {hidden} / num_attention_heads {heads} = {hidden / heads:g}: "
        f"the attention projects to {heads} heads x {d} = {d * heads} wide, not {hidden}. "
        f"The spec has no head_dim key; it always takes hidden_size / "
        f"num_attention_heads, so it would {'under' if gap > 0 else 'over'}count the "
        f"attention projections by {abs(gap) / 1e6:,.1f}M parameters over {layers} layers, "
        f"and the attention's FLOPs and activation memory with them",
    )


def _moe(c: _Config) -> None:
    # Checked before the family, so that Mixtral or Qwen2-MoE is refused for being a mixture of
    # experts, not for its model_type.
    for key in ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size"):
        if c.get(key):
            raise c.refuse(key, f"{c.data[key]}: a mixture of experts; the spec describes dense models")


def _rope(c: _Config, notes: list[str]) -> float:
    scaling = c.get("rope_scaling")
    if scaling:
        kind = scaling.get("rope_type") or scaling.get("type") if isinstance(scaling, dict) else scaling
        notes.append(
            f"rope_scaling {kind} (RoPE frequencies rescaled for long context): the spec's "
            f"RoPE is plain; memory and step time are the same"
        )
    return float(c.get("rope_theta", "rotary_emb_base", default=10000.0))


def _window(c: _Config, use_key: str | None = None) -> None:
    """The sliding window in effect (Mistral's sliding_window; Qwen2's only with use_sliding_window).
    Kept on the config, not refused here: whether full attention equals it depends on the sequence
    length, which spec_document knows."""
    used = c.get(use_key, default=False) if use_key else True
    if used and c.get("sliding_window") is not None:
        c.window = c.integer("sliding_window")


def _llama_like(c: _Config, family: str, notes: list[str]) -> dict:
    """Llama, Mistral, Qwen2 and Gemma share LlamaConfig's key names."""
    hidden = c.integer("hidden_size")
    heads = c.integer("num_attention_heads")
    _head_dim(c, hidden, heads)
    act = c.get("hidden_activation", "hidden_act", default="silu")
    if family == "gemma":
        if act not in ("gelu_pytorch_tanh", "gelu"):
            raise c.refuse("hidden_activation", f"{act!r}: Gemma's MLP is GeGLU (gelu_pytorch_tanh)")
        activation = "geglu"
        notes.append(
            "Gemma scales the embeddings by sqrt(hidden_size) and its RMSNorm by (1 + weight); the spec's "
            "are plain: memory and step time are the same"
        )
    elif act == "silu":
        activation = "swiglu"
    else:
        raise c.refuse(
            "hidden_act",
            f"{act!r}: a {family} MLP with silu is SwiGLU; another activation is not a {family} the spec knows",
        )
    attn_bias = bool(c.get("attention_bias", default=False))
    mlp_bias = bool(c.get("mlp_bias", default=False))
    if attn_bias != mlp_bias:
        raise c.refuse("attention_bias", f"{attn_bias} with mlp_bias {mlp_bias}: biases on one kind of layer only")
    model = {
        "num_layers": c.integer("num_hidden_layers"),
        "hidden_size": hidden,
        "ffn_hidden_size": c.integer("intermediate_size"),
        "num_attention_heads": heads,
        "num_kv_heads": c.integer("num_key_value_heads", default=heads),
        "vocab_size": c.integer("vocab_size"),
        "activation": activation,
        # Gemma ties its embeddings always (GemmaConfig's default); the others default to untied.
        "tied_embeddings": bool(c.get("tie_word_embeddings", default=family == "gemma")),
        "normalization": "rmsnorm",
        "position_embedding": "rope",
        "bias": attn_bias,
        "max_position_embeddings": c.integer("max_position_embeddings"),
        "rope_theta": _rope(c, notes),
        "init_method_std": float(c.get("initializer_range", default=0.02)),
    }
    if family == "qwen2":
        model["qkv_bias"] = True  # Qwen2Attention: q/k/v projections with bias=True, o_proj without
        _window(c, "use_sliding_window")
    else:
        _window(c)
    return model


def _gpt_neox(c: _Config, notes: list[str]) -> dict:
    hidden = c.integer("hidden_size")
    heads = c.integer("num_attention_heads")
    act = c.get("hidden_act", default="gelu")
    if not str(act).startswith("gelu"):
        raise c.refuse("hidden_act", f"{act!r}: the spec's non-gated MLP is GELU")
    pct = float(c.get("rotary_pct", "partial_rotary_factor", default=1.0))
    if pct != 1.0:
        notes.append(
            f"rotary_pct {pct:g}: GPT-NeoX rotates a part of each head, the spec all of it: memory and "
            f"step time are the same"
        )
    return {
        "num_layers": c.integer("num_hidden_layers"),
        "hidden_size": hidden,
        "ffn_hidden_size": c.integer("intermediate_size"),
        "num_attention_heads": heads,
        "vocab_size": c.integer("vocab_size"),
        "activation": "gelu",
        "tied_embeddings": bool(c.get("tie_word_embeddings", default=False)),
        "normalization": "layernorm",
        "position_embedding": "rope",
        "bias": bool(c.get("attention_bias", default=True)),
        "parallel_residual": bool(c.get("use_parallel_residual", default=True)),
        "max_position_embeddings": c.integer("max_position_embeddings"),
        "rope_theta": float(c.get("rotary_emb_base", "rope_theta", default=10000.0)),
        "init_method_std": float(c.get("initializer_range", default=0.02)),
    }


def _gpt2(c: _Config, notes: list[str]) -> dict:
    hidden = c.integer("n_embd", "hidden_size")
    act = c.get("activation_function", default="gelu_new")
    if not str(act).startswith("gelu"):
        raise c.refuse("activation_function", f"{act!r}: the spec's non-gated MLP is GELU")
    if act != "gelu":
        notes.append(
            f"activation_function {act} (the tanh approximation of GELU) becomes the spec's exact gelu: "
            f"memory and step time are the same"
        )
    return {
        "num_layers": c.integer("n_layer", "num_hidden_layers"),
        "hidden_size": hidden,
        "ffn_hidden_size": c.integer("n_inner", default=4 * hidden),  # GPT2Config: n_inner None means 4 x n_embd
        "num_attention_heads": c.integer("n_head", "num_attention_heads"),
        "vocab_size": c.integer("vocab_size"),
        "activation": "gelu",
        "tied_embeddings": bool(c.get("tie_word_embeddings", default=True)),
        "normalization": "layernorm",
        "position_embedding": "learned",
        "bias": True,
        "max_position_embeddings": c.integer("n_positions", "max_position_embeddings"),
        "init_method_std": float(c.get("initializer_range", default=0.02)),
    }


def _falcon(c: _Config, notes: list[str]) -> dict:
    if c.get("alibi", default=False):
        raise c.refuse("alibi", "true: ALiBi position biases; the spec's positions are RoPE or learned")
    hidden = c.integer("hidden_size")
    heads = c.integer("num_attention_heads", "n_head")
    new_arch = bool(c.get("new_decoder_architecture", default=False))
    # FalconDecoderLayer: the new architecture is a parallel block with ln_attn and ln_mlp unless
    # num_ln_in_parallel_attn says 1; the old one is parallel (one shared input_layernorm) when
    # parallel_attn, else sequential.
    parallel = new_arch or bool(c.get("parallel_attn", default=True))
    two_norms = new_arch and c.get("num_ln_in_parallel_attn", default=2) != 1
    if parallel and not two_norms:
        key = "num_ln_in_parallel_attn" if new_arch else "parallel_attn"
        raise c.refuse(
            key,
            "a parallel block with one layernorm shared by attention and MLP (Falcon-7B's); the "
            "spec's parallel residual has a norm for each (Falcon 40B/180B, GPT-NeoX)",
        )
    if new_arch:
        kv = c.integer("num_kv_heads", "n_head_kv", default=heads)
    else:
        kv = 1 if c.get("multi_query", default=True) else heads
    return {
        "num_layers": c.integer("num_hidden_layers", "n_layer"),
        "hidden_size": hidden,
        "ffn_hidden_size": c.integer("ffn_hidden_size", default=4 * hidden),  # FalconConfig: 4 x hidden_size
        "num_attention_heads": heads,
        "num_kv_heads": kv,
        "vocab_size": c.integer("vocab_size"),
        "activation": "gelu",
        "tied_embeddings": bool(c.get("tie_word_embeddings", default=True)),
        "normalization": "layernorm",
        "position_embedding": "rope",
        "bias": bool(c.get("bias", default=False)),
        "parallel_residual": parallel,
        "max_position_embeddings": c.integer("max_position_embeddings", default=2048),
        "rope_theta": float(c.get("rope_theta", default=10000.0)),
        "init_method_std": float(c.get("initializer_range", default=0.02)),
    }


# model_type -> (family, reader)
FAMILIES = {
    "llama": ("llama", lambda c, n: _llama_like(c, "llama", n)),
    "mistral": ("mistral", lambda c, n: _llama_like(c, "mistral", n)),
    "qwen2": ("qwen2", lambda c, n: _llama_like(c, "qwen2", n)),
    "gemma": ("gemma", lambda c, n: _llama_like(c, "gemma", n)),
    "gpt_neox": ("gpt-neox", _gpt_neox),
    "gpt2": ("gpt2", _gpt2),
    "falcon": ("falcon", _falcon),
    "RefinedWeb": ("falcon", _falcon),  # Falcon's configs before transformers 4.33
    "RefinedWebModel": ("falcon", _falcon),
}


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
    _moe(_Config(data, path, str(kind) if kind else "Hugging Face"))
    if kind not in FAMILIES:
        known = ", ".join(sorted(k for k in FAMILIES if k.islower()))
        raise SpecError(
            f"{path}: model_type {kind!r} is not a family dsorch imports ({known}); write the spec by "
            f"hand (see examples/)."
        )
    family, reader = FAMILIES[kind]
    notes: list[str] = []
    c = _Config(data, path, family)
    model = reader(c, notes)
    if name is None:
        ref = data.get("_name_or_path")
        name = (str(ref).rstrip("/").split("/")[-1] if ref else path.resolve().parent.name) or family
    return Imported(name, model, family, notes, path=path, window=c.window)


def spec_document(imp: Imported, source: str, seq_length: int | None, global_batch_size: int | None) -> dict:
    """The spec file's content: the imported model and a training section to edit."""
    mpe = imp.model.get("max_position_embeddings")
    seq = seq_length or min(mpe or DEFAULT_MAX_SEQ, DEFAULT_MAX_SEQ)
    if imp.window is not None and seq > imp.window:
        # A query at position i attends to the keys j <= i with j > i - window (transformers'
        # masking_utils.sliding_window_overlay on the causal mask; the Mistral 7B paper, Jiang et al.
        # 2023 sec. 2, counts one key more). In a sequence of seq tokens i - j <= seq - 1, so with
        # seq <= window every earlier key is inside the window: the mask is the causal mask, and the
        # spec's full attention is exact, FLOPs and memory alike. Longer sequences attend to fewer
        # keys than the spec would count.
        given = (
            f"--seq-length {seq}"
            if seq_length
            else (f"the default, max_position_embeddings {mpe} capped at {DEFAULT_MAX_SEQ}")
        )
        w = imp.window
        raise SpecError(
            f"{imp.path or 'config.json'}: sliding_window: {w}: each token attends only to the {w} "
            f"tokens up to it, and the spec would train sequences of {seq} ({given}), longer than the "
            f"window. dsorch's attention is full (causal), which equals a sliding window only for "
            f"sequences no longer than the window; pass --seq-length {w} (or less) to plan this "
            f"{imp.family} model exactly."
        )
    gbs = global_batch_size or max(1, DEFAULT_TOKENS_PER_STEP // seq)
    text = source + ("; not carried: " + "; ".join(imp.notes) if imp.notes else "")
    return {
        "name": imp.name,
        "source": text,
        "model": imp.model,
        "training": {"seq_length": seq, "global_batch_size": gbs, "precision": "bf16"},
    }
