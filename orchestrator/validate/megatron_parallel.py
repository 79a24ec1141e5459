"""The parallel layout's checks of Megatron-LM's flags: the model-parallel sizes against the world
size, the batch over the data-parallel ranks, the sequence over context parallelism, and the split
of the layers over (virtual) pipeline stages (megatron/training/arguments.py validate_args,
TransformerConfig.__post_init__, core/transformer/pipeline_parallel_layer_layout.py).
"""

from __future__ import annotations

import re

from orchestrator.validate.megatron_flags import MAX_PATTERN
from orchestrator.validate.megatron_table import Args


def world_size_checks(a: Args, world_size: int, tp: int, pp: int, cp: int) -> tuple[list[str], int | None]:
    """Errors for the model-parallel size, and the data-parallel size (None where it has none).

    validate_args: "world size is not divisible by total_model_size"; total = tp * pp * cp *
    gtp_weight_remat_size, the latter derived from --tensor-parallel-num-weight-shards by
    model_parallel_config.py resolve_tensor_parallel_weight_shards."""
    errors, F = [], a.flag
    gtp = 1
    shards = a.get("tensor_parallel_num_weight_shards")
    if shards is not None:
        if shards < tp or shards % tp:
            errors.append(
                f"{F('tensor_parallel_num_weight_shards')} {shards} must be a multiple "
                f"of {F('tensor_model_parallel_size')} {tp}: use {tp} or a multiple"
            )
        else:
            gtp = shards // tp
    model_size = tp * pp * cp * gtp
    if world_size <= 0:
        errors.append(f"world size {world_size} must be positive")
    elif world_size % model_size:
        errors.append(
            f"world size {world_size} is not divisible by {F('tensor_model_parallel_size')} {tp} "
            f"x {F('pipeline_model_parallel_size')} {pp} x {F('context_parallel_size')} {cp}"
            + (f" x weight-shard factor {gtp}" if gtp > 1 else "")
            + f" = {model_size}: choose sizes whose product divides {world_size}"
        )
    else:
        # validate_args: args.data_parallel_size = args.world_size // total_model_size
        return errors, world_size // model_size
    return errors, None


def batch_size_checks(a: Args, dp: int | None) -> list[str]:
    """validate_args asserts micro_batch_size is set and > 0; num_microbatches_calculator.py
    ConstantNumMicroBatchesCalculator asserts global_batch_size % (micro_batch_size *
    data_parallel_size) == 0 unless --decrease-batch-size-if-needed; the ramp-up calculator has
    its own schedule."""
    F = a.flag
    mbs, gbs = a.get("micro_batch_size"), a.get("global_batch_size")
    if mbs is None:
        return ["--micro-batch-size is required by Megatron-LM: add '--micro-batch-size N'"]
    if mbs <= 0:
        return [f"{F('micro_batch_size')} {mbs} must be positive"]
    if (
        dp is not None
        and gbs is not None
        and not a.get("decrease_batch_size_if_needed")
        and a.get("rampup_batch_size") is None
        and gbs % (mbs * dp)
    ):
        return [
            f"{F('global_batch_size')} {gbs} is not divisible by {F('micro_batch_size')} "
            f"{mbs} x data-parallel size {dp} = {mbs * dp}: use a multiple of {mbs * dp}"
        ]
    return []


def seq_length_checks(a: Args, cp: int) -> list[str]:
    errors, F = [], a.flag
    seq, max_pos = a.get("seq_length"), a.get("max_position_embeddings")
    if seq is not None and max_pos is not None and max_pos < seq:
        # validate_args: "max_position_embeddings must be greater than or equal to seq_length"
        errors.append(
            f"{F('max_position_embeddings')} {max_pos} is smaller than "
            f"{F('seq_length')} {seq}: set it to at least {seq}"
        )
    if seq is not None and cp > 1 and seq % (2 * cp):
        # validate_args: "seq-length should be a multiple of 2 * context-parallel-size"
        errors.append(
            f"{F('seq_length')} {seq} is not a multiple of 2 x "
            f"{F('context_parallel_size')} {cp} = {2 * cp}: pick a multiple of {2 * cp}"
        )
    return errors


# The three ways to give virtual pipeline stages; at most one may be set (validate_args).
_VPP_SPECS = (
    "num_layers_per_virtual_pipeline_stage",
    "num_virtual_stages_per_pipeline_rank",
    "pipeline_model_parallel_layout",
)


def pipeline_checks(a: Args, pp: int) -> list[str]:
    """Layer split over pipeline stages, mirroring validate_args' 'Uneven virtual pipeline
    parallelism' block and TransformerConfig.__post_init__ '# Uneven PP'."""
    F = a.flag
    num_layers = a.get("num_layers")
    if num_layers is None or a.get("hybrid_layer_pattern") or a.get("hybrid_override_pattern"):
        return []  # a hybrid pattern defines the split itself (validated by Megatron)
    set_ = [d for d in _VPP_SPECS if a.get(d) is not None]
    if len(set_) > 1:
        return [
            f"{' and '.join(F(d) for d in set_)} cannot be combined: "
            "keep only one way of specifying virtual pipeline stages"
        ]
    if a.get("pipeline_model_parallel_layout") is not None:
        return _layout_checks(a, num_layers, pp)
    vpp, errors = _virtual_pipeline_degree(a, num_layers, pp)
    first = a.get("decoder_first_pipeline_num_layers")
    last = a.get("decoder_last_pipeline_num_layers")
    if first is not None or last is not None:
        errors += _uneven_pp_checks(a, num_layers, pp, first, last, vpp)
    if vpp is not None:
        errors += _interleaving_checks(a, pp)
    return errors


def layout_stages(text: str) -> list[str] | None:
    """core/transformer/pipeline_parallel_layer_layout.py parse_str_to_list: commas dropped, (x)*n and
    c*n unrolled, stages split on '|'; None where a character is not E, t, m or L."""

    def unroll(r: re.Match) -> str:
        if len(r.group(1)) * int(r.group(2)) > MAX_PATTERN:
            raise ValueError("layout too long")
        return r.group(1) * int(r.group(2))

    text = text.replace(",", "")
    try:
        for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
            text = re.sub(pattern, unroll, text)
            if len(text) > MAX_PATTERN:
                return None
    except ValueError:
        return None
    stages = text.split("|")
    return stages if all(set(st) <= set("EtmL") for st in stages) else None


def _layout_checks(a: Args, num_layers: int, pp: int) -> list[str]:
    """--pipeline-model-parallel-layout against validate_args and PipelineParallelLayerLayout
    (validate_layer_layout): whole virtual stages per rank, the embedding first, the loss last, every
    decoder layer and MTP module once, MTP after the decoder layers; no other split flags beside it."""
    F, text = a.flag, a.get("pipeline_model_parallel_layout")
    flag = F("pipeline_model_parallel_layout")
    errors = [
        f"{flag} cannot be combined with {F(d)}: the layout places every layer itself"
        for d in (
            "account_for_embedding_in_pipeline_split",
            "account_for_loss_in_pipeline_split",
            "decoder_first_pipeline_num_layers",
            "decoder_last_pipeline_num_layers",
        )
        if a.get(d)
    ]
    stages = layout_stages(text)
    if stages is None:
        return errors + [
            f"{flag} {text!r} is not a layout: it may hold only E (embedding), t (layer), m (MTP), L (loss), |, "
            "(...)*n and c*n, for at most a million slots"
        ]
    if len(stages) % pp:
        errors.append(f"{flag} has {len(stages)} stages, not a multiple of {F('pipeline_model_parallel_size')} {pp}")
    flat = "".join(stages)
    mtp = a.get("mtp_num_layers") or 0
    if not flat.startswith("E") or not flat.endswith("L") or flat.count("E") != 1 or flat.count("L") != 1:
        errors.append(f"{flag} must start with the embedding (E) and end with the loss (L), once each")
    if flat.count("t") != num_layers:
        errors.append(f"{flag} places {flat.count('t')} layers (t) but {F('num_layers')} is {num_layers}")
    if flat.count("m") != mtp:
        errors.append(f"{flag} places {flat.count('m')} MTP modules (m) but {F('mtp_num_layers')} is {mtp}")
    elif mtp and "t" in flat[flat.index("m") :]:
        errors.append(f"{flag} puts an MTP module (m) before a decoder layer (t): MTP comes after the layers")
    return errors


def _virtual_pipeline_degree(a: Args, num_layers: int, pp: int) -> tuple[int | None, list[str]]:
    """The virtual pipeline degree the flags give (None: no interleaving, or the flags are wrong)
    and what is wrong with them."""
    errors: list[str] = []
    F = a.flag
    per_vstage = a.get("num_layers_per_virtual_pipeline_stage")
    vstages = a.get("num_virtual_stages_per_pipeline_rank")
    first = a.get("decoder_first_pipeline_num_layers")
    last = a.get("decoder_last_pipeline_num_layers")
    # account_for_* add one pseudo-layer each to the split (validate_args).
    total = (
        num_layers
        + int(bool(a.get("account_for_embedding_in_pipeline_split")))
        + int(bool(a.get("account_for_loss_in_pipeline_split")))
    )
    vpp = None
    if per_vstage is not None:
        if first is not None or last is not None:
            errors.append(
                f"{F('num_layers_per_virtual_pipeline_stage')} cannot be used with "
                "uneven first/last pipeline stages: use "
                "--num-virtual-stages-per-pipeline-rank instead"
            )
        elif total % pp:
            errors.append(
                f"{F('num_layers')} {total} is not divisible by "
                f"{F('pipeline_model_parallel_size')} {pp}: choose a pipeline size "
                f"that divides {total}"
            )
        elif per_vstage <= 0 or (total // pp) % per_vstage:
            errors.append(
                f"{F('num_layers_per_virtual_pipeline_stage')} {per_vstage} does not divide the "
                f"{total // pp} layers per pipeline stage ({F('num_layers')} {total} / "
                f"{F('pipeline_model_parallel_size')} {pp}): choose a divisor of {total // pp}"
            )
        else:
            vpp = (total // pp) // per_vstage
    elif vstages is not None:
        vpp = vstages
    elif first is None and last is None and total % pp:
        errors.append(
            f"{F('num_layers')} {total} is not divisible by "
            f"{F('pipeline_model_parallel_size')} {pp}: choose a pipeline size that "
            f"divides {total}, or set --decoder-first/last-pipeline-num-layers"
        )
    if vpp == 1:
        vpp = None  # validate_args: "if args.virtual_pipeline_model_parallel_size == 1: None"
    return vpp, errors


def _interleaving_checks(a: Args, pp: int) -> list[str]:
    """validate_args: interleaved schedule needs pp > 1 with p2p overlap (the default,
    --no-overlap-p2p-communication turns it off) and pp > 2 without it."""
    F = a.flag
    overlap = a.get("overlap_p2p_comm", True)
    minimum = 1 if overlap else 2
    if pp > minimum:
        return []
    flag = (
        F("num_layers_per_virtual_pipeline_stage")
        if a.get("num_layers_per_virtual_pipeline_stage") is not None
        else F("num_virtual_stages_per_pipeline_rank")
    )
    return [
        f"{flag} enables the interleaved schedule, which needs "
        f"{F('pipeline_model_parallel_size')} > {minimum}"
        + ("" if overlap else " when --no-overlap-p2p-communication is set")
        + f" (got {pp}): drop {flag} or raise the pipeline size"
    ]


def _uneven_pp_checks(a: Args, num_layers: int, pp: int, first, last, vpp) -> list[str]:
    """TransformerConfig.__post_init__ '# Uneven PP' block."""
    errors, F = [], a.flag
    if a.get("account_for_embedding_in_pipeline_split") or a.get("account_for_loss_in_pipeline_split"):
        errors.append(
            "--decoder-first/last-pipeline-num-layers cannot be combined with "
            "--account-for-embedding/loss-in-pipeline-split: use one or the other"
        )
    middle_layers, middle_stages = num_layers, pp
    for dest, n in (("decoder_first_pipeline_num_layers", first), ("decoder_last_pipeline_num_layers", last)):
        if n is None:
            continue
        if n <= 0:
            errors.append(f"{F(dest)} {n} must be larger than 0")
        elif vpp is not None and n % vpp:
            errors.append(
                f"{F(dest)} {n} is not divisible by the virtual pipeline degree {vpp}: use a multiple of {vpp}"
            )
        middle_layers -= n
        middle_stages -= 1
    if bool(middle_layers) != bool(middle_stages) or middle_layers < 0 or middle_stages < 0:
        errors.append(
            f"uneven pipeline split leaves {middle_layers} layers for {middle_stages} "
            f"middle stages ({F('num_layers')} {num_layers}, "
            f"{F('pipeline_model_parallel_size')} {pp}): adjust the first/last stage "
            "layer counts"
        )
    elif middle_stages and middle_layers % middle_stages:
        errors.append(
            f"the {middle_layers} middle layers are not divisible by the "
            f"{middle_stages} middle pipeline stages: adjust the first/last stage "
            "layer counts"
        )
    elif middle_stages and vpp is not None and (middle_layers // middle_stages) % vpp:
        errors.append(
            f"{middle_layers // middle_stages} layers per middle pipeline rank are "
            f"not divisible by the virtual pipeline degree {vpp}"
        )
    return errors


def interleaved(a: Args, pp: int) -> bool:
    """Whether the flags ask for more than one virtual stage per rank (validate_args)."""
    layout = a.get("pipeline_model_parallel_layout")
    if layout is not None:
        return len(layout_stages(layout) or []) > pp
    if (a.get("num_virtual_stages_per_pipeline_rank") or 1) > 1:
        return True
    num_layers = a.get("num_layers")
    return num_layers is not None and _virtual_pipeline_degree(a, num_layers, pp)[0] is not None
