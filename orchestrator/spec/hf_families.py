"""The reader of each Hugging Face model family ``dsorch import-hf`` knows: a config.json's keys to a
model spec's, with the key names and defaults of that family's configuration class in transformers
(``configuration_<family>.py``; DeepSeek-V3's own ``configuration_deepseek.py`` for the keys
transformers' class lacks). The dense families (Llama-like, GPT-NeoX, GPT-2, Falcon), then the
mixtures of experts (Mixtral, Qwen2/3-MoE, DeepSeek-V3, GPT-OSS). spec/hf_import.py's ``HF_FAMILIES``
names each reader by model_type.
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import SpecError
from orchestrator.spec.hf_config import (
    HFConfig,
    note_quantized,
    read_biases,
    read_kv_channels,
    read_norm_epsilon,
    read_rope,
    read_window,
)

# head_dim when the config omits it: Qwen3Config's 128; the others hidden / heads.
_HEAD_DIM_DEFAULT = {"qwen3": 128}


def read_llama_like(c: HFConfig, family: str, notes: list[str]) -> dict:
    """Llama, Mistral, Mixtral, Qwen2(-MoE), Qwen3(-MoE) and Gemma share LlamaConfig's key names."""
    hidden = c.integer("hidden_size")
    heads = c.integer("num_attention_heads")
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
    bias = read_biases(c)
    model: dict[str, Any] = {
        "num_layers": c.integer("num_hidden_layers"),
        "hidden_size": hidden,
        "ffn_hidden_size": c.integer("intermediate_size"),
        "num_attention_heads": heads,
        "num_kv_heads": c.integer("num_key_value_heads", default=heads),
    }
    kv_channels = read_kv_channels(c, hidden, heads, _HEAD_DIM_DEFAULT.get(family))
    if kv_channels is not None:
        model["kv_channels"] = kv_channels
    model.update(
        {
            "vocab_size": c.integer("vocab_size"),
            "activation": activation,
            # Gemma ties its embeddings always (GemmaConfig's default); the others default to untied.
            "tied_embeddings": bool(c.get("tie_word_embeddings", default=family == "gemma")),
            "normalization": "rmsnorm",
            "position_embedding": "rope",
            "bias": bias,
        }
    )
    if family in ("qwen2", "qwen2_moe") and not bias:
        # Qwen2Attention / Qwen2MoeAttention: q/k/v projections with bias (Qwen2MoeConfig.qkv_bias,
        # default true), o_proj without.
        model["qkv_bias"] = bool(c.get("qkv_bias", default=True))
    if family in ("qwen3", "qwen3_moe"):
        model["qk_norm"] = True  # Qwen3Attention: q_norm and k_norm, RMSNorm over head_dim
    model["max_position_embeddings"] = c.integer("max_position_embeddings")
    model["rope_theta"] = read_rope(c, notes)
    model["norm_epsilon"] = read_norm_epsilon(c, "rms_norm_eps", 1e-5 if family == "mixtral" else 1e-6)
    model["init_method_std"] = float(c.get("initializer_range", default=0.02))
    read_window(c, "use_sliding_window" if family.startswith("qwen") else None)
    note_quantized(c, notes)
    return model


def read_gpt_neox(c: HFConfig, notes: list[str]) -> dict:
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
        "norm_epsilon": read_norm_epsilon(c, "layer_norm_eps", 1e-5),
        "init_method_std": float(c.get("initializer_range", default=0.02)),
    }


def read_gpt2(c: HFConfig, notes: list[str]) -> dict:
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
        "norm_epsilon": read_norm_epsilon(c, "layer_norm_epsilon", 1e-5),
        "init_method_std": float(c.get("initializer_range", default=0.02)),
    }


def read_falcon(c: HFConfig, notes: list[str]) -> dict:
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
        "norm_epsilon": read_norm_epsilon(c, "layer_norm_epsilon", 1e-5),
        "init_method_std": float(c.get("initializer_range", default=0.02)),
    }


# ---- mixtures of experts ----


def _moe_layers(c: HFConfig, moe: list[bool], key: str) -> dict[str, int] | None:
    """The spec's MoE-layer pattern (the first dense_leading_layers dense, then every layer_freq-th
    MoE: ModelSpec.is_moe_layer, Megatron-LM's --moe-layer-freq after the dense leading layers)
    reproducing a family's list of MoE layers exactly, or a refusal naming ``key``. None when no
    layer is MoE (the model is dense)."""
    idx = [i for i, m in enumerate(moe) if m]
    if not idx:
        return None
    k = idx[0]
    # With one MoE layer any frequency past the last layer leaves it alone.
    freq = idx[1] - idx[0] if len(idx) > 1 else len(moe) - k
    if [i >= k and (i - k) % freq == 0 for i in range(len(moe))] != moe:
        shown = ", ".join(map(str, idx[:12])) + (", ..." if len(idx) > 12 else "")
        raise c.refuse(
            key,
            f"{c.data.get(key)!r} makes layers {shown} mixture-of-experts ({len(idx)} of {len(moe)}); the spec's "
            f"MoE layers are the first dense_leading_layers dense and then every layer_freq-th, which "
            f"cannot give this set",
        )
    out = {}
    if k:
        out["dense_leading_layers"] = k
    if freq > 1:
        out["layer_freq"] = freq
    return out


def _with_moe(model: dict, moe: dict) -> dict:
    """The model with its moe section where DeepSeek-V3's and GPT-OSS's readers put it: after the
    layer's shapes, before the positions."""
    tail = ("max_position_embeddings", "rope_theta", "norm_epsilon", "init_method_std")
    out = {k: v for k, v in model.items() if k not in tail}
    return {**out, "moe": moe, **{k: v for k, v in model.items() if k not in out}}


def _experts(
    c: HFConfig,
    experts_keys: tuple[str, ...],
    top_k_keys: tuple[str, ...],
    ffn: int,
    default_top_k: int,
    default_experts: int,
) -> dict:
    # Each key with its alias in the configuration class's attribute_map (MixtralConfig, GptOssConfig:
    # num_experts -> num_local_experts; DeepseekV3Config: num_local_experts -> n_routed_experts).
    return {
        "num_experts": c.integer(*experts_keys, default=default_experts),
        "top_k": c.integer(*top_k_keys, default=default_top_k),
        "ffn_hidden_size": ffn,
    }


def _aux_loss(c: HFConfig, key: str, default: float) -> dict:
    # Switch Transformer's load-balancing loss over the batch, weighted by the family's coefficient
    # (MixtralForCausalLM / Qwen2MoeForCausalLM: load_balancing_loss_func times router_aux_loss_coef).
    return {"load_balancing": "aux_loss", "aux_loss_coeff": c.number(key, default)}


def read_mixtral(c: HFConfig, notes: list[str]) -> dict:
    """MixtralConfig: num_local_experts (8) experts of intermediate_size, num_experts_per_tok (2);
    MixtralSparseMoeBlock: softmax over the experts, top-k, renormalized; every layer MoE."""
    model = read_llama_like(c, "mixtral", notes)
    jitter = c.number("router_jitter_noise", 0.0)
    if jitter:
        notes.append(f"router_jitter_noise {jitter:g} (noise on the router's inputs in training): numerics only")
    moe = {
        **_experts(c, ("num_local_experts", "num_experts"), ("num_experts_per_tok",), model["ffn_hidden_size"], 2, 8),
        "router": "softmax",
        "norm_top_k": True,
        **_aux_loss(c, "router_aux_loss_coef", 0.001),
    }
    return _with_moe(model, moe)


def _qwen_moe_layers(c: HFConfig, layers: int) -> dict[str, int] | None:
    # Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer: layer i is sparse when it is not in mlp_only_layers
    # and (i + 1) % decoder_sparse_step == 0.
    step = c.integer("decoder_sparse_step", default=1)
    dense = c.get("mlp_only_layers", default=[])
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        raise SpecError(f"{c.path}: mlp_only_layers: {dense!r} is not a list of layer indices.")
    moe = [i not in dense and (i + 1) % step == 0 for i in range(layers)]
    return _moe_layers(c, moe, "mlp_only_layers" if dense else "decoder_sparse_step")


def read_qwen_moe(c: HFConfig, family: str, notes: list[str]) -> dict:
    """Qwen2MoeConfig / Qwen3MoeConfig: num_experts experts of moe_intermediate_size, top
    num_experts_per_tok, softmax router renormalized only with norm_topk_prob (default false);
    Qwen2-MoE adds one shared expert of shared_expert_intermediate_size behind a sigmoid gate
    (Qwen2MoeSparseMoeBlock.shared_expert_gate, a 1 x hidden linear)."""
    model = read_llama_like(c, family, notes)
    qwen2 = family == "qwen2_moe"
    if c.get("num_experts", "num_local_experts") == 0:
        return model  # Qwen2MoeDecoderLayer: sparse only with num_experts > 0
    moe = {
        **_experts(
            c,
            ("num_experts", "num_local_experts"),
            ("num_experts_per_tok",),
            c.integer("moe_intermediate_size", default=1408 if qwen2 else 768),
            4 if qwen2 else 8,
            60 if qwen2 else 128,
        ),
    }
    if qwen2:
        moe.update(
            shared_experts=1,
            shared_ffn_hidden_size=c.integer("shared_expert_intermediate_size", default=5632),
            shared_expert_gate=True,
        )
    pattern = _qwen_moe_layers(c, model["num_layers"])
    if pattern is None:
        return model  # no sparse layer: the dense model of intermediate_size
    moe.update(pattern)
    moe.update(router="softmax", norm_top_k=bool(c.get("norm_topk_prob", default=False)))
    moe.update(_aux_loss(c, "router_aux_loss_coef", 0.001))
    return _with_moe(model, moe)


def _deepseek_router(c: HFConfig) -> dict:
    """DeepSeek-V3's MoEGate (configuration_deepseek.py defaults): sigmoid scores, the top
    topk_group of n_group expert groups, top-k within them, renormalized, times routed_scaling_factor;
    topk_method noaux_tc adds the per-expert bias of auxiliary-loss-free balancing (DeepSeek-V3
    Sec. 2.1.2), with a small sequence-wise balance loss beside it (seq_aux)."""
    scoring = c.get("scoring_func", default="sigmoid")
    if scoring not in ("sigmoid", "softmax"):
        raise c.refuse("scoring_func", f"{scoring!r}: the spec's routers score by softmax or sigmoid")
    method = c.get("topk_method", default="noaux_tc")
    if method not in ("noaux_tc", "group_limited_greedy", "greedy"):
        raise c.refuse("topk_method", f"{method!r}: the spec routes by top-k, grouped top-k, or noaux_tc")
    router: dict[str, Any] = {"router": scoring, "norm_top_k": bool(c.get("norm_topk_prob", default=True))}
    if method != "greedy":
        router["groups"] = c.integer("n_group", default=8)
        router["group_top_k"] = c.integer("topk_group", default=4)
    scale = c.number("routed_scaling_factor", 2.5)
    if scale != 1.0:
        router["scale"] = scale
    # The sequence-wise loss of DeepSeek-V3 (seq_aux, default true in DeepSeek's MoEGate); its weight
    # is aux_loss_alpha where the config states it, else the report's alpha = 0.0001 (Sec. 4.2).
    seq = bool(c.get("seq_aux", default=True))
    router["load_balancing"] = "seq_aux_loss" if seq else "aux_loss"
    router["aux_loss_coeff"] = c.number("aux_loss_alpha", 0.0001)
    if method == "noaux_tc":
        router["expert_bias"] = True
    return router


def _mla(c: HFConfig) -> dict:
    """Multi-head latent attention (DeepseekV3Attention): q_lora_rank null means a full Q projection."""
    mla: dict[str, Any] = {}
    if c.data.get("q_lora_rank", 1536) is not None:  # null: DeepSeek-V2-Lite's full Q projection
        mla["q_lora_rank"] = c.integer("q_lora_rank", default=1536)
    mla.update(
        kv_lora_rank=c.integer("kv_lora_rank", default=512),
        qk_nope_head_dim=c.integer("qk_nope_head_dim", default=128),
        qk_rope_head_dim=c.integer("qk_rope_head_dim", default=64),
        v_head_dim=c.integer("v_head_dim", default=128),
    )
    return mla


def read_deepseek_v3(c: HFConfig, notes: list[str]) -> dict:
    """DeepseekV3Config (transformers) and DeepSeek's configuration_deepseek.py: MLA attention,
    first_k_dense_replace dense layers of intermediate_size, then MoE layers (i % moe_layer_freq == 0)
    of n_routed_experts routed experts and n_shared_experts shared ones, all of
    moe_intermediate_size; num_nextn_predict_layers multi-token-prediction modules."""
    heads = c.integer("num_attention_heads", default=128)
    kv = c.integer("num_key_value_heads", default=heads)
    if kv != heads:
        raise c.refuse("num_key_value_heads", f"{kv} of {heads} heads: MLA gives every head its own key and value")
    if c.get("attention_bias", default=False):
        raise c.refuse(
            "attention_bias", "true: biases on MLA's projections only, which the spec's bias flag cannot say"
        )
    act = c.get("hidden_act", default="silu")
    if act != "silu":
        raise c.refuse("hidden_act", f"{act!r}: DeepSeek-V3's MLP with silu is SwiGLU")
    layers = c.integer("num_hidden_layers", default=61)
    first_dense = c.get("first_k_dense_replace", default=3)
    if isinstance(first_dense, bool) or not isinstance(first_dense, int) or first_dense < 0:
        raise SpecError(f"{c.path}: first_k_dense_replace: {first_dense!r} is not a layer count.")
    freq = c.integer("moe_layer_freq", default=1)
    # DeepseekV3DecoderLayer: MoE when layer_idx >= first_k_dense_replace and layer_idx % moe_layer_freq == 0.
    pattern = _moe_layers(c, [i >= first_dense and i % freq == 0 for i in range(layers)], "moe_layer_freq")
    model: dict[str, Any] = {
        "num_layers": layers,
        "hidden_size": c.integer("hidden_size", default=7168),
        "ffn_hidden_size": c.integer("intermediate_size", default=18432),
        "num_attention_heads": heads,
        "vocab_size": c.integer("vocab_size", default=129280),
        "activation": "swiglu",
        "tied_embeddings": bool(c.get("tie_word_embeddings", default=False)),
        "normalization": "rmsnorm",
        "position_embedding": "rope",
        "bias": False,
        "mla": _mla(c),
    }
    # n_routed_experts null: a dense model (DeepseekV3DecoderLayer's first condition).
    if pattern is not None and c.data.get("n_routed_experts", 256) is not None:
        ffn = c.integer("moe_intermediate_size", default=2048)
        shared = c.integer("n_shared_experts", default=1) if c.data.get("n_shared_experts", 1) else 0
        model["moe"] = {
            **_experts(c, ("n_routed_experts", "num_local_experts"), ("num_experts_per_tok",), ffn, 8, 256),
            **({"shared_experts": shared} if shared else {}),
            **pattern,
            **_deepseek_router(c),
        }
    mtp = c.get("num_nextn_predict_layers", default=0)
    if mtp:
        model["mtp_layers"] = c.integer("num_nextn_predict_layers")
    model["max_position_embeddings"] = c.integer("max_position_embeddings", default=4096)
    model["rope_theta"] = read_rope(c, notes)
    model["norm_epsilon"] = read_norm_epsilon(c, "rms_norm_eps", 1e-6)
    model["init_method_std"] = float(c.get("initializer_range", default=0.02))
    note_quantized(c, notes)
    return model


def _windows(c: HFConfig, layers: int) -> dict[str, int]:
    """sliding_window and the spec's global_attention_every N (layer i full when (i + 1) % N == 0,
    ModelSpec.is_sliding_layer) from GPT-OSS's layer_types; GptOssConfig's default alternates
    sliding (even layers) and full (odd ones)."""
    if c.data.get("sliding_window", 128) is None:
        return {}
    types = c.get("layer_types", default=None)
    if types is None:
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers:
        raise SpecError(f"{c.path}: layer_types: {types!r} is not one entry per layer ({layers}).")
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    if len(full) == layers:
        return {}  # no layer slides
    window = {"sliding_window": c.integer("sliding_window", default=128)}
    if not full:
        return window
    n = full[0] + 1
    if n < 2 or [(i + 1) % n == 0 for i in range(layers)] != [t == "full_attention" for t in types]:
        raise c.refuse(
            "layer_types",
            f"full attention on layers {', '.join(map(str, full[:12]))}{', ...' if len(full) > 12 else ''}; the "
            f"spec's full-attention layers are every global_attention_every-th (the last of each group), "
            f"which cannot give this set",
        )
    return {**window, "global_attention_every": n}


def read_gpt_oss(c: HFConfig, notes: list[str]) -> dict:
    """GptOssConfig and modeling_gpt_oss.py: every layer MoE (GptOssMLP: a router with bias, top-k of
    its logits softmaxed; experts of intermediate_size with biases on both projections); attention
    with biases (attention_bias), a learned sink logit per head, head_dim wide heads, and a
    sliding window on the layers layer_types says."""
    hidden = c.integer("hidden_size", default=2880)
    heads = c.integer("num_attention_heads", default=64)
    layers = c.integer("num_hidden_layers", default=36)
    if not c.get("attention_bias", default=True):
        raise c.refuse(
            "attention_bias",
            "false: GptOssExperts and GptOssTopKRouter carry biases whatever attention_bias says, and the "
            "spec's bias flag is one for attention, experts and router",
        )
    ffn = c.integer("intermediate_size", default=2880)
    model: dict[str, Any] = {
        "num_layers": layers,
        "hidden_size": hidden,
        "ffn_hidden_size": ffn,
        "num_attention_heads": heads,
        "num_kv_heads": c.integer("num_key_value_heads", default=8),
    }
    kv_channels = read_kv_channels(c, hidden, heads, default=64)
    if kv_channels is not None:
        model["kv_channels"] = kv_channels
    alpha = c.number("swiglu_alpha", 1.702)
    if alpha != 1.702:
        notes.append(f"swiglu_alpha {alpha:g}: the spec's quick_geglu gate is x * sigmoid(1.702 x); numerics only")
    model.update(
        {
            "vocab_size": c.integer("vocab_size", default=201088),
            # GptOssExperts._apply_gate: (clamp(up, -limit, limit) + 1) * g * sigmoid(1.702 g) with
            # g = clamp(gate, max=limit): Megatron-LM's --quick-geglu with --glu-linear-offset 1 and
            # --activation-func-clamp-value limit.
            "activation": "quick_geglu",
            "activation_clamp": c.number("swiglu_limit", 7.0),
            "glu_linear_offset": 1.0,
            "tied_embeddings": bool(c.get("tie_word_embeddings", default=False)),
            "normalization": "rmsnorm",
            "position_embedding": "rope",
            "bias": True,
        }
    )
    model.update(_windows(c, layers))
    model["attention_sinks"] = True  # GptOssAttention.sinks: one learned logit per head
    model["moe"] = {
        **_experts(c, ("num_local_experts", "num_experts"), ("num_experts_per_tok", "experts_per_token"), ffn, 4, 128),
        "router": "softmax",
        "norm_top_k": True,  # softmax over the top-k logits: the renormalized top-k of the full softmax
        **_aux_loss(c, "router_aux_loss_coef", 0.001),
    }
    model["max_position_embeddings"] = c.integer("max_position_embeddings", default=131072)
    # GptOssConfig: default_theta 150000 and, without rope_parameters, YaRN (factor 32).
    model["rope_theta"] = read_rope(c, notes, theta=150000.0, default_scaling="yarn")
    model["norm_epsilon"] = read_norm_epsilon(c, "rms_norm_eps", 1e-5)
    model["init_method_std"] = float(c.get("initializer_range", default=0.02))
    note_quantized(c, notes)
    return model
