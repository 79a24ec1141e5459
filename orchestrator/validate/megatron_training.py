"""The training settings' checks of Megatron-LM's flags: deprecated flags validate_args rejects,
precision, sequence parallelism and TP overlap, activation recomputation, and Megatron-FSDP with its
checkpoint format (megatron/training/arguments.py validate_args, TransformerConfig.__post_init__).
"""

from __future__ import annotations

from orchestrator.validate.megatron_table import Args, megatron_version


def deprecated_flag_checks(a: Args) -> list[str]:
    """Deprecated flags validate_args rejects outright (megatron/training/arguments.py
    validate_args: "assert args.batch_size is None", warmup, model_parallel_size, and
    checkpoint_activations which prints and exit()s)."""
    errors, F = [], a.flag
    for dest, use in (
        ("batch_size", "--micro-batch-size"),
        ("warmup", "--lr-warmup-fraction"),
        ("model_parallel_size", "--tensor-model-parallel-size"),
        ("checkpoint_activations", "--recompute-granularity"),
    ):
        if a.has(dest) and a.get(dest) not in (None, False):
            errors.append(f"{F(dest)} is no longer valid in Megatron-LM {megatron_version()}: use {use} instead")
    return errors


def precision_and_recompute_checks(a: Args, tp: int) -> list[str]:
    errors, F = [], a.flag
    if a.get("fp16") and a.get("bf16"):
        # validate_args: "if args.fp16: assert not args.bf16" (and TransformerConfig).
        errors.append("--fp16 and --bf16 are mutually exclusive: keep only one")

    if a.get("sequence_parallel") and tp == 1:
        # validate_args: "Disabling sequence parallelism because tensor model parallelism is
        # disabled" -- Megatron silently turns it off, so emitting it is a planner bug.
        errors.append(
            f"{F('sequence_parallel')} requires {F('tensor_model_parallel_size')} > 1 "
            "(Megatron silently disables it at tp 1): drop --sequence-parallel"
        )
    if a.get("tp_comm_overlap") and not (a.get("sequence_parallel") and tp > 1):
        # validate_args: "Tensor parallel communication/GEMM overlap can happen only when
        # sequence parallelism is enabled"
        errors.append(
            f"{F('tp_comm_overlap')} requires --sequence-parallel with tp > 1: add "
            "--sequence-parallel or drop --tp-comm-overlap"
        )

    granularity = a.get("recompute_granularity")
    if a.get("recompute_activations"):
        granularity = "selective"  # validate_args maps --recompute-activations to selective
    method, nlayers = a.get("recompute_method"), a.get("recompute_num_layers")
    if granularity == "full":
        # TransformerConfig.__post_init__: full recompute needs recompute_method in
        # {uniform, block} and recompute_num_layers set.
        if method is None:
            errors.append(
                "--recompute-granularity full needs --recompute-method "
                "(uniform or block): add '--recompute-method uniform'"
            )
        if nlayers is None:
            errors.append("--recompute-granularity full needs --recompute-num-layers: add '--recompute-num-layers 1'")
        elif nlayers < 1:
            errors.append(f"{F('recompute_num_layers')} {nlayers} must be at least 1")
        elif method == "block" and a.get("num_layers"):
            per_rank = a.get("num_layers") // max(a.get("pipeline_model_parallel_size", 1), 1)
            if nlayers > per_rank:
                # TransformerConfig's message: "recompute_num_layers must be between 1 and
                # num_layers_per_pipeline_rank"
                errors.append(
                    f"{F('recompute_num_layers')} {nlayers} exceeds the {per_rank} "
                    "layers per pipeline rank for --recompute-method block: use at "
                    f"most {per_rank}"
                )
    elif granularity == "selective":
        if method is not None:
            # validate_args: "recompute method is not yet supported for selective
            # recomputing granularity"
            errors.append(
                f"{F('recompute_method')} is not supported with "
                "--recompute-granularity selective: drop --recompute-method"
            )
        if nlayers is not None:
            # TransformerConfig.__post_init__: selective -> "recompute_num_layers must be None"
            errors.append(
                f"{F('recompute_num_layers')} must not be set with "
                "--recompute-granularity selective: drop --recompute-num-layers"
            )
    else:
        for dest in ("recompute_method", "recompute_num_layers"):
            if a.has(dest):
                # Without a granularity TransformerConfig never looks at these.
                errors.append(
                    f"{F(dest)} has no effect without --recompute-granularity full: "
                    "add '--recompute-granularity full' or drop the flag"
                )
    if a.get("distribute_saved_activations") and (tp <= 1 or granularity != "full"):
        # validate_args: distribute_saved_activations needs tp > 1 and full recompute.
        errors.append(
            "--distribute-saved-activations needs --tensor-model-parallel-size > 1 and --recompute-granularity full"
        )
    return errors


def megatron_fsdp_checks(a: Args) -> list[str]:
    """validate_args on Megatron-FSDP (--use-megatron-fsdp) and its checkpoint format."""
    errors, F = [], a.flag
    fsdp, fmt = a.get("use_megatron_fsdp"), a.get("ckpt_format", "torch_dist")
    if fsdp and fmt != "fsdp_dtensor":
        # "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format."
        errors.append(
            f"{F('use_megatron_fsdp')} saves only in the fsdp_dtensor format: add '--ckpt-format fsdp_dtensor'"
        )
    if fmt == "fsdp_dtensor" and not fsdp:
        # "--ckpt-format fsdp_dtensor is only tested with Megatron FSDP."
        errors.append("--ckpt-format fsdp_dtensor is only for Megatron-FSDP: add --use-megatron-fsdp or use torch_dist")
    if fsdp and a.get("optimizer", "adam") not in ("sgd", "adam"):
        # "Megatron-FSDP does not support the {optimizer} optimizer yet."
        errors.append(f"{F('use_megatron_fsdp')} supports only the adam and sgd optimizers: use --optimizer adam")
    if fsdp and a.get("megatron_fsdp_version", 1) == 2 and a.get("use_distributed_optimizer"):
        # "--megatron-fsdp-version 2 is not compatible with --use-distributed-optimizer"
        errors.append(
            "--megatron-fsdp-version 2 does not run on the distributed optimizer: drop "
            "--use-distributed-optimizer or use version 1"
        )
    return errors
