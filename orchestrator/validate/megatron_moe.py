"""The mixture-of-experts checks of Megatron-LM's flags: the expert mesh, which layers are MoE and the
shared experts, the router and its load balancing, the token dispatcher and the expert-parallel
all-to-all overlap (validate_args' "MoE Spec check" and "Expert parallelism check",
core/parallel_state.py initialize_model_parallel, TransformerConfig.__post_init__'s MoE block).
"""

from __future__ import annotations

from orchestrator.validate.megatron_parallel import interleaved
from orchestrator.validate.megatron_table import Args


def _one(value):
    """validate_args turns a one-element --moe-router-load-balancing-type/--moe-aux-loss-coeff
    list into its element."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def moe_checks(a: Args, world_size: int, tp: int, pp: int) -> list[str]:
    """validate_args' "MoE Spec check" and "Expert parallelism check", the expert mesh of
    core/parallel_state.py initialize_model_parallel, and TransformerConfig.__post_init__'s MoE
    block."""
    F = a.flag
    experts = a.get("num_experts") or None  # validate_args: --num-experts 0 means no MoE
    ep = a.get("expert_model_parallel_size", 1)
    etp = a.get("expert_tensor_parallel_size") or tp  # validate_args: defaults to tp
    bad = [
        f"{F(k)} {v} must be at least 1"
        for k, v in (("expert_model_parallel_size", ep), ("expert_tensor_parallel_size", etp))
        if v < 1
    ]
    if bad:
        return bad
    if experts is None:
        return _moe_flags_without_experts(a, ep)
    errors = []
    if experts < 0:
        return [f"{F('num_experts')} {experts} must be positive"]
    if experts % ep:
        errors.append(
            f"{F('num_experts')} {experts} is not divisible by {F('expert_model_parallel_size')} {ep}: "
            f"each expert-parallel rank holds the same number of experts; choose an ep dividing {experts}"
        )
    mesh = etp * ep * pp
    if world_size > 0 and world_size % mesh:
        errors.append(
            f"world size {world_size} is not divisible by {F('expert_tensor_parallel_size')} {etp} x "
            f"{F('expert_model_parallel_size')} {ep} x {F('pipeline_model_parallel_size')} {pp} = {mesh}: "
            f"Megatron-Core carves each pipeline stage's {world_size // pp} GPUs into expert-TP x EP x "
            f"expert-data-parallel groups; choose etp x ep dividing {world_size // pp}"
        )
    if a.get("add_bias_linear", True) and etp > 1:
        errors.append(
            f"biased linear layers (no --disable-bias-linear) in the experts need "
            f"{F('expert_tensor_parallel_size')} 1 (Megatron-Core: bias in MoE is only supported with "
            f"ETP 1): use --expert-tensor-parallel-size 1 or --disable-bias-linear"
        )
    errors += _moe_layer_checks(a)
    errors += _router_checks(a, experts)
    errors += _dispatcher_checks(a, ep, etp)
    if a.get("overlap_moe_expert_parallel_comm"):
        errors += _ep_overlap_checks(a, ep, pp)
    return errors


def _moe_flags_without_experts(a: Args, ep: int) -> list[str]:
    F = a.flag
    errors = []
    if ep > 1:
        # validate_args: "num_experts must be non None to use expert model parallelism"
        errors.append(
            f"{F('expert_model_parallel_size')} {ep} splits experts and there are none: add --num-experts "
            "or use --expert-model-parallel-size 1"
        )
    # Megatron reads the --moe-* settings only when a MoE layer exists; --moe-ffn-hidden-size alone
    # is an error of TransformerConfig.__post_init__ (unless --moe-layer-freq leaves layers dense).
    for dest in sorted(a.given):
        if dest.startswith("moe_") or dest == "overlap_moe_expert_parallel_comm":
            errors.append(f"{a.given[dest]} has no effect without --num-experts: add --num-experts or drop the flag")
    return errors


def _moe_layer_checks(a: Args) -> list[str]:
    """Which layers are MoE and the shared experts beside the routed ones."""
    errors, F = [], a.flag
    freq, num_layers = a.get("moe_layer_freq", 1), a.get("num_layers")
    if isinstance(freq, int) and freq < 1:
        # gpt_layer_specs.py: layer i is MoE when i % moe_layer_freq == 0
        errors.append(f"{F('moe_layer_freq')} {freq} must be at least 1 (every freq-th layer is MoE)")
    elif isinstance(freq, list):
        if num_layers is not None and len(freq) != num_layers:
            # gpt_layer_specs.py get_gpt_decoder_layer_specs: "Invalid length of moe_layer_pattern"
            errors.append(
                f"{F('moe_layer_freq')} lists {len(freq)} layers but {F('num_layers')} is {num_layers}: "
                "give one 0 (dense) or 1 (MoE) per layer"
            )
        if any(v not in (0, 1) for v in freq):
            errors.append(f"{F('moe_layer_freq')} may hold only 0 (dense layer) and 1 (MoE layer)")
    shared = a.get("moe_shared_expert_intermediate_size")
    if shared is None:
        errors += [
            f"{F(d)} has no effect without --moe-shared-expert-intermediate-size: drop it or add shared experts"
            for d in ("moe_shared_expert_gate", "moe_shared_expert_overlap")
            if a.get(d)
        ]
        return errors
    if shared <= 0:
        errors.append(f"{F('moe_shared_expert_intermediate_size')} {shared} must be positive")
    if a.get("add_bias_linear", True):
        # SharedExpertMLP.__init__: "bias is not supported in the shared experts"
        errors.append(
            "shared experts take no biases in Megatron-Core: add --disable-bias-linear or drop "
            f"{F('moe_shared_expert_intermediate_size')}"
        )
    if a.get("moe_shared_expert_overlap") and a.get("moe_token_dispatcher_type", "allgather") not in (
        "alltoall",
        "flex",
    ):
        errors.append(
            f"{F('moe_shared_expert_overlap')} overlaps the shared experts with the alltoall or flex "
            "dispatcher only: set --moe-token-dispatcher-type alltoall or drop it"
        )
    return errors


# Load balancing that leaves the tokens to the capacity check (TransformerConfig.__post_init__).
_CAPACITY_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")


def _router_checks(a: Args, experts: int) -> list[str]:
    """TransformerConfig.__post_init__ on the router; moe_utils.topk_routing_with_score_function."""
    errors, F = [], a.flag
    topk, score = a.get("moe_router_topk", 2), a.get("moe_router_score_function", "softmax")
    balancing, coeff = _one(a.get("moe_router_load_balancing_type", "aux_loss")), _one(a.get("moe_aux_loss_coeff"))
    if not 1 <= topk <= experts:
        errors.append(f"{F('moe_router_topk')} {topk} must be between 1 and {F('num_experts')} {experts}")
    pre = a.get("moe_router_pre_softmax")
    if topk == 1 and score == "softmax" and not pre and balancing != "sinkhorn":
        errors.append(
            f"{F('moe_router_topk')} 1 with the softmax router needs --moe-router-pre-softmax: a softmax over "
            "the one chosen expert is always 1 and gives the router no gradient"
        )
    if pre and score != "softmax":
        errors.append(
            f"{F('moe_router_pre_softmax')} has no effect with {F('moe_router_score_function')} {score} "
            "(its scores are renormalized over the top k anyway): drop it"
        )
    errors += _group_topk_checks(a, experts)
    if a.get("moe_router_enable_expert_bias") and score not in ("sigmoid", "sqrtsoftplus"):
        errors.append(
            f"{F('moe_router_enable_expert_bias')} (auxiliary-loss-free balancing) works with the sigmoid or "
            f"sqrtsoftplus score function only: set --moe-router-score-function sigmoid or drop it"
        )
    if isinstance(balancing, list) and (not isinstance(coeff, list) or len(coeff) != len(balancing)):
        errors.append(
            f"{F('moe_router_load_balancing_type')} lists {len(balancing)} types: give "
            f"{F('moe_aux_loss_coeff')} one coefficient for each"
        )
    errors += _capacity_checks(a, balancing)
    return errors


def _group_topk_checks(a: Args, experts: int) -> list[str]:
    F = a.flag
    groups, group_topk = a.get("moe_router_num_groups"), a.get("moe_router_group_topk")
    if group_topk is None:
        if groups is not None:
            return [f"{F('moe_router_num_groups')} has no effect without --moe-router-group-topk: add it or drop it"]
        return []
    if not groups:
        return [f"{F('moe_router_group_topk')} needs --moe-router-num-groups (group-limited routing)"]
    errors = []
    if experts % groups:
        errors.append(
            f"{F('num_experts')} {experts} is not divisible by {F('moe_router_num_groups')} {groups}: "
            "choose a group count dividing the experts"
        )
    if group_topk > groups:
        errors.append(f"{F('moe_router_group_topk')} {group_topk} is above {F('moe_router_num_groups')} {groups}")
    return errors


def _capacity_checks(a: Args, balancing) -> list[str]:
    errors, F = [], a.flag
    capacity = a.get("moe_expert_capacity_factor")
    if capacity is not None and capacity < 0:
        # TransformerConfig.__post_init__ turns a negative factor into None (dropless), silently.
        errors.append(
            f"{F('moe_expert_capacity_factor')} {capacity} is negative, which Megatron reads as dropless: "
            "drop the flag for dropless routing, or give a positive factor"
        )
    elif capacity is not None:
        types = balancing if isinstance(balancing, list) else [balancing]
        if any(t not in _CAPACITY_BALANCING for t in types):
            errors.append(
                f"{F('moe_expert_capacity_factor')} works with the load-balancing types "
                f"{', '.join(_CAPACITY_BALANCING)} only: change {F('moe_router_load_balancing_type')}"
            )
    if a.get("moe_pad_expert_input_to_capacity") and (capacity is None or capacity < 0):
        errors.append(
            f"{F('moe_pad_expert_input_to_capacity')} needs --moe-expert-capacity-factor: set a capacity or drop it"
        )
    return errors


def _dispatcher_checks(a: Args, ep: int, etp: int) -> list[str]:
    """TransformerConfig.__post_init__ on the flex dispatcher; MoEFlexTokenDispatcher.__init__."""
    errors, F = [], a.flag
    dispatcher = a.get("moe_token_dispatcher_type", "allgather")
    backend = a.get("moe_flex_dispatcher_backend", "deepep")
    if dispatcher != "flex":
        errors += [
            f"{F(d)} needs --moe-token-dispatcher-type flex: set it or drop {F(d)}"
            for d in ("moe_enable_deepep", "moe_flex_dispatcher_backend")
            if a.has(d) and a.get(d)
        ]
        return errors
    if a.get("moe_enable_deepep"):
        backend = "deepep"
    if backend in ("deepep", "ncclep") and etp * ep == 1:
        # "DeepEP dispatcher requires TPxEP > 1" (its expert-TP x EP group)
        errors.append(
            f"the flex dispatcher ({backend}) sends tokens over the expert-TP x EP group, here 1 rank "
            f"({F('expert_tensor_parallel_size')} {etp}, {F('expert_model_parallel_size')} {ep}): use "
            "--moe-token-dispatcher-type alltoall or expert parallelism"
        )
    if backend == "deepep" and a.get("moe_pad_expert_input_to_capacity"):
        errors.append(
            f"DeepEP does not pad to capacity: drop {F('moe_pad_expert_input_to_capacity')} or use "
            "--moe-token-dispatcher-type alltoall"
        )
    return errors


def _ep_overlap_checks(a: Args, ep: int, pp: int) -> list[str]:
    """TransformerConfig.__post_init__'s overlap_moe_expert_parallel_comm block: the dispatch and
    combine all-to-alls of one micro-batch hide behind another's compute."""
    F = a.flag
    flag = F("overlap_moe_expert_parallel_comm")
    needs = []
    if ep <= 1:
        needs.append("--expert-model-parallel-size > 1")
    if a.get("moe_token_dispatcher_type", "allgather") not in ("alltoall", "flex"):
        needs.append("--moe-token-dispatcher-type alltoall or flex")
    if pp > 1 and not interleaved(a, pp):
        needs.append("the interleaved schedule (virtual pipeline stages) with a pipeline")
    if a.get("recompute_granularity") == "full" or a.get("recompute_method") or a.get("recompute_num_layers"):
        needs.append("no full recomputation (--recompute-granularity/method/num-layers)")
    if "moe" in (a.get("recompute_modules") or []):
        needs.append("no 'moe' in --recompute-modules")
    if not (a.get("bf16") or a.get("fp16")):
        needs.append("--bf16 or --fp16")
    if a.get("moe_shared_expert_overlap"):
        needs.append("no --moe-shared-expert-overlap")
    if (a.get("mtp_num_layers") or 0) > 1:
        needs.append("at most one MTP layer (--mtp-num-layers)")
    return [f"{flag} needs {n}: provide it or drop {flag}" for n in needs]
