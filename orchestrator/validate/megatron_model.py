"""The model's checks of Megatron-LM's flags: the sizes Megatron requires, attention heads and query
groups against tensor parallelism, multi-latent attention, sliding windows and the MLP's activation
(megatron/training/arguments.py validate_args, TransformerConfig.__post_init__,
argument_utils.core_transformer_config_from_args).
"""

from __future__ import annotations

import math

from orchestrator.validate.megatron_table import Args


def required_model_size_checks(a: Args) -> list[str]:
    """validate_args: required_args list.  A hybrid pattern derives num_layers,
    encoder_num_layers stands in for num_layers."""
    F = a.flag
    hybrid = a.get("hybrid_layer_pattern") or a.get("hybrid_override_pattern")
    required = ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings")
    return [
        f"{F(dest)} is required by Megatron-LM: add '{F(dest)} N'"
        for dest in required
        if a.get(dest) is None and not (dest == "num_layers" and (hybrid or a.get("encoder_num_layers")))
    ]


def attention_checks(a: Args, tp: int) -> list[str]:
    errors: list[str] = []
    F = a.flag
    heads, hidden = a.get("num_attention_heads"), a.get("hidden_size")
    if heads is None:
        return errors
    if tp and heads % tp:
        # TransformerConfig.__post_init__: "num_attention_heads must be a multiple of
        # tensor_model_parallel_size"
        errors.append(
            f"{F('num_attention_heads')} {heads} is not divisible by "
            f"{F('tensor_model_parallel_size')} {tp}: choose a tensor-parallel size "
            f"that divides {heads}"
        )
    if hidden is not None and a.get("kv_channels") is None and heads and hidden % heads:
        # validate_args: kv_channels defaults to hidden_size // num_attention_heads and
        # asserts hidden_size % num_attention_heads == 0.
        errors.append(
            f"{F('hidden_size')} {hidden} is not divisible by "
            f"{F('num_attention_heads')} {heads}: set --kv-channels or fix the sizes"
        )
    if a.get("group_query_attention"):
        groups = a.get("num_query_groups", 1)
        if groups <= 0 or heads % groups:
            # megatron/core/transformer/attention.py Attention.__init__ divides
            # num_attention_heads by num_query_groups.
            errors.append(
                f"{F('num_attention_heads')} {heads} is not divisible by "
                f"{F('num_query_groups')} {groups}: use a divisor of {heads}"
            )
        elif groups % tp and tp % groups:
            # TransformerConfig.__post_init__: "num_query_groups must be a multiple or divisor
            # of tensor_model_parallel_size"
            errors.append(
                f"{F('num_query_groups')} {groups} is neither a multiple nor a "
                f"divisor of {F('tensor_model_parallel_size')} {tp}: change one of "
                "them"
            )
    elif a.has("num_query_groups"):
        # argument_utils.py core_transformer_config_from_args sets num_query_groups = None
        # unless args.group_query_attention: the value would be silently ignored.
        errors.append(
            f"{F('num_query_groups')} has no effect without --group-query-attention: "
            "add --group-query-attention or drop the flag"
        )
    return errors


# MLA's shape flags: read by MLATransformerConfig only.
_MLA_DESTS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")


def mla_checks(a: Args) -> list[str]:
    """validate_args and (MLA)TransformerConfig.__post_init__ on multi-latent attention."""
    F = a.flag
    if not a.get("multi_latent_attention"):
        return [
            f"{F(d)} has no effect without --multi-latent-attention: add it or drop {F(d)}"
            for d in _MLA_DESTS
            if a.has(d)
        ]
    errors = []
    if a.get("group_query_attention"):
        errors.append(
            "--multi-latent-attention and --group-query-attention are mutually exclusive (every MLA head "
            "has its own key and value from the latent): drop --group-query-attention"
        )
    if a.get("rotary_interleaved"):
        errors.append("--rotary-interleaved does not work with --multi-latent-attention: drop it")
    if a.get("apply_rope_fusion", True) and a.get("rope_type") not in (None, "yarn"):
        errors.append(
            f"{F('rope_type')} {a.get('rope_type')} with --multi-latent-attention needs --no-rope-fusion "
            "(MLA's fused RoPE is YaRN's): add --no-rope-fusion or drop --rope-type"
        )
    for dest in _MLA_DESTS:
        value = a.get(dest)
        if value is not None and value <= 0:
            errors.append(f"{F(dest)} {value} must be positive")
    return errors


def window_checks(a: Args) -> list[str]:
    """Sliding-window attention: --window-size (left, right) on the layers --window-attn-skip-freq
    does not skip (core/transformer/utils.py is_layer_window_attention)."""
    F = a.flag
    window, skip = a.get("window_size"), a.get("window_attn_skip_freq")
    if window is None:
        if skip is not None:
            return [f"{F('window_attn_skip_freq')} has no effect without --window-size: add it or drop the flag"]
        return []
    errors = []
    if len(window) != 2 or min(window) < -1:
        errors.append(
            f"{F('window_size')} takes the window's left and right extent (-1: unbounded), e.g. 127,0; "
            f"got {','.join(map(str, window))}"
        )
    num_layers = a.get("num_layers")
    if isinstance(skip, int) and skip < 1:
        errors.append(f"{F('window_attn_skip_freq')} {skip} must be at least 1 (every freq-th layer is full)")
    elif isinstance(skip, list) and num_layers is not None and len(skip) != num_layers:
        errors.append(
            f"{F('window_attn_skip_freq')} lists {len(skip)} layers but {F('num_layers')} is {num_layers}: "
            "give one entry per layer"
        )
    return errors


def _dense_mlp(a: Args) -> bool:
    """Whether the model has a dense MLP: no experts, dense layers among them, or shared experts."""
    freq = a.get("moe_layer_freq", 1)
    return (
        not a.get("num_experts")
        or (isinstance(freq, int) and freq > 1)
        or (isinstance(freq, list) and 0 in freq)
        or a.get("moe_shared_expert_intermediate_size") is not None
    )


def activation_checks(a: Args) -> list[str]:
    """argument_utils.core_transformer_config_from_args and TransformerConfig.__post_init__ on the
    activation; MLP.forward's fused bias-activation path."""
    F = a.flag
    swiglu, quick = a.get("swiglu"), a.get("quick_geglu")
    if swiglu and quick:
        return ["--swiglu and --quick-geglu are two activations: keep one"]
    fusion = a.get("bias_swiglu_fusion", True) if swiglu else a.get("bias_gelu_fusion", True)
    clamp, offset = a.get("activation_func_clamp_value"), a.get("glu_linear_offset", 0.0)
    errors = []
    if swiglu and clamp is not None:
        if not math.isfinite(clamp) or clamp <= 0:
            errors.append(f"{F('activation_func_clamp_value')} {clamp} must be finite and positive")
        if not a.get("num_experts"):
            errors.append(f"{F('activation_func_clamp_value')} with --swiglu is for MoE models only (--num-experts)")
        if offset:
            errors.append(f"{F('glu_linear_offset')} must be 0 when --swiglu is clamped")
    if offset and fusion and not quick:
        errors.append(
            f"{F('glu_linear_offset')} {offset} needs --quick-geglu with the fused bias-activation kernel: "
            "use --quick-geglu or add --no-bias-swiglu-fusion/--no-bias-gelu-fusion"
        )
    if quick and fusion and _dense_mlp(a):
        errors.append(
            "--quick-geglu in a dense MLP (or shared experts) needs --no-bias-gelu-fusion: Megatron-Core fuses "
            "only gelu and swiglu there"
        )
    return errors
