"""ds_config.json for the chosen layout (DeepSpeed runtime only).

Every key that matters is written out, so that a reviewer does not need DeepSpeed's defaults in
their head. Reference: https://www.deepspeed.ai/docs/config-json/ and the pydantic config
classes in deepspeed/runtime/{config,zero/config,precision_config}.py (0.19).
"""

from __future__ import annotations

import json

from orchestrator.plan.make import Plan
from orchestrator.render.overrides import merge_ds_config
from orchestrator.runtimes.deepspeed import ZERO3_MAX_LIVE_PARAMETERS, ZERO_BUCKET_ELEMENTS

STEPS_PER_PRINT = 10


def ds_config(plan: Plan) -> dict:
    L = plan.layout
    t = plan.spec.training
    opt = t.optimizer
    cfg: dict = {
        # DeepSpeed checks train_batch_size == micro-batch x accumulation x data-parallel size.
        "train_batch_size": t.global_batch_size,
        "train_micro_batch_size_per_gpu": L.micro_batch_size,
        "gradient_accumulation_steps": L.grad_accum_steps,
        "steps_per_print": STEPS_PER_PRINT,
        "gradient_clipping": opt.grad_clip,
        "prescale_gradients": False,
        "bf16": _bf16(plan),
        "fp16": {
            "enabled": t.precision == "fp16",
            # Dynamic loss scaling (loss_scale 0), DeepSpeed's documented defaults made explicit.
            "loss_scale": 0,
            "initial_scale_power": 16,
            "loss_scale_window": 1000,
            "hysteresis": 2,
            "min_loss_scale": 1,
        },
        "data_types": {
            # Accumulate gradients in fp32 over the micro-batches of a step where DeepSpeed can (it
            # refuses at ZeRO-0 with bf16, where dsorch plans one micro-batch per step): bf16
            # accumulation loses gradient (measured, DeepSpeed 0.19.8: 37% of the true norm after
            # 1024 micro-batches), and DeepSpeed itself warns that it is unsafe. Megatron-LM does
            # the same (accumulate_allreduce_grads_in_fp32 for bf16).
            "grad_accum_dtype": "fp32" if _fp32_accumulation(plan) else None,
        },
        "optimizer": {
            "type": "AdamW",
            "params": _optimizer_params(plan),
        },
        # No "scheduler": the entrypoint sets the rate from Megatron-LM's formula
        # (train/loop/lr_schedule.py), the one both runtimes follow. DeepSpeed's WarmupCosineLR starts
        # its warmup a step late (steps 1 and 2 at rate 0) and has no WSD or linear decay to
        # min_lr; given a client scheduler DeepSpeed would ignore a configured one anyway
        # (engine.py _configure_lr_scheduler).
        "zero_optimization": _zero(plan),
        "activation_checkpointing": {
            # Off: dsorch's entrypoint checkpoints with torch.utils.checkpoint and keeps each
            # layer input whole on every tp rank (2sbh per layer, Korthikanti et al. Table 2, as
            # the memory model counts it); DeepSpeed's partitioned checkpointing is not used.
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
            "number_checkpoints": None,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        },
        "pipeline": {
            # Checkpoint every layer's input under full recompute (DeepSpeed PipelineModule's
            # activation_checkpoint_interval); selective recompute is done inside the layer.
            "activation_checkpoint_interval": 1 if L.recompute == "full" else 0,
            # Send only a 1/tp slice of activations and gradients between stages, then all-gather
            # over NVLink (Narayanan et al. 2021, Sec. 4.1 scatter/gather optimization). Not with
            # sequence parallelism: DeepSpeed's PartitionedTensor assumes the activation is the
            # same on every tp rank, while SP ranks each hold a different sequence shard, already
            # 1/tp of it (measured: wrong losses from step 1 with tp2 x pp2 + SP).
            "pipe_partitioned": L.tp > 1 and not L.sequence_parallel,
            "grad_partitioned": L.tp > 1 and not L.sequence_parallel,
        },
        "wall_clock_breakdown": False,
        "dump_state": False,
    }
    return cfg


def _fp32_accumulation(plan: Plan) -> bool:
    return plan.spec.training.precision == "bf16" and plan.layout.zero_stage >= 1


def _bf16(plan: Plan) -> dict:
    cfg: dict = {"enabled": plan.spec.training.precision == "bf16"}
    if _fp32_accumulation(plan) and plan.layout.zero_stage == 1:
        # ZeRO-1 with fp32 accumulation runs in DeepSpeed's BF16_Optimizer: add each micro-batch's
        # bf16 gradient into the fp32 buffer at once and drop it, so that no full bf16 copy stays
        # beside the buffer (bf16_optimizer.py accumulate_hp_grads_and_remove_lp; 2 bytes per
        # parameter less, the memory model counts 4).
        cfg["immediate_grad_update"] = True
    return cfg


def _optimizer_params(plan: Plan) -> dict:
    opt = plan.spec.training.optimizer
    params = {"lr": opt.lr, "betas": list(opt.betas), "eps": opt.eps, "weight_decay": opt.weight_decay}
    if plan.profile.backend == "gloo":
        # On CPU, torch's AdamW instead of DeepSpeed's fused CPU Adam, which compiles a C++
        # extension for ~80 s on first use; the update is the same (deepspeed/ops/adam).
        params["torch_adam"] = True
    return params


def _zero(plan: Plan) -> dict:
    z = plan.layout.zero_stage
    cfg: dict = {"stage": z}
    if z >= 1:
        cfg.update(
            {
                # Overlap the gradient reduction with the backward pass; keep gradients contiguous to
                # avoid fragmentation (DeepSpeed ZeRO docs).
                "overlap_comm": True,
                "contiguous_gradients": True,
                "reduce_scatter": True,
                # Buckets in elements; dsorch's memory model counts them (costmodel/peak_memory.py _comm_buffers).
                "reduce_bucket_size": ZERO_BUCKET_ELEMENTS,
                "allgather_bucket_size": ZERO_BUCKET_ELEMENTS,
                "round_robin_gradients": False,
            }
        )
    if z == 3:
        cfg.update(
            {
                "stage3_prefetch_bucket_size": 50_000_000,
                "stage3_param_persistence_threshold": 100_000,
                "stage3_max_live_parameters": ZERO3_MAX_LIVE_PARAMETERS,
                "stage3_max_reuse_distance": ZERO3_MAX_LIVE_PARAMETERS,
                "stage3_gather_16bit_weights_on_model_save": True,
            }
        )
    return cfg


def render_ds_config(plan: Plan) -> str:
    """ds_config.json: dsorch's config with the spec's overrides merged in."""
    return json.dumps(merge_ds_config(ds_config(plan), plan.spec.overrides), indent=2) + "\n"
