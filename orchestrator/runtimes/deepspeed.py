"""The deepspeed runtime: dsorch's bundled entrypoint (orchestrator/train) on DeepSpeed's engine,
ZeRO stages 0-3 and DeepSpeed's PipelineEngine for pp > 1."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.runtimes.base import COMMON_FILES, DS_CONFIG, Engine, Runtime

# Bytes per parameter: (weights, gradients, optimizer states) before any sharding.
# The ZeRO paper counts 2 + 2 + K with K = 12 (fp32 master, momentum, variance); DeepSpeed's
# implementation also converts its gradient partition to fp32 for the optimizer step
# (stage_1_and_2.py: single_grad_partition ... .to(fp32); stage3.py: _prepare_fp32_grad_for_sub_group),
# which its own estimator counts ("18 = 2_grads_16bit + 4_grads_32bit + 4_params_32bit +
# 8_optimizer_states_32bit", estimate_zero2_model_states_mem_needs). dsorch counts that fp32
# gradient with the optimizer states it is sharded like: 2 + 2 + 16.
# fp32 training: 4 + 4 + 8 (momentum and variance; the weights are the master copy).
STATE_BYTES = {
    # bf16 at ZeRO-0 (only with one micro-batch per step; see rules.zero_stages). From ZeRO-1 on see
    # BF16_FP32_ACCUM below.
    "bf16": (2, 2, 16),
    "fp16": (2, 2, 16),
    "fp32": (4, 4, 8),
}

# DeepSpeed with bf16 and ``data_types.grad_accum_dtype: fp32`` (what dsorch's ds_config sets from
# ZeRO-1 on), read in deepspeed 0.19 and measured by walking the optimizer's tensors (dp=2):
# * ZeRO-1 is BF16_Optimizer (engine.py _do_optimizer_sanity_check), not the ZeRO optimizer: a
#   full-size fp32 accumulation buffer (bf16_optimizer.py: fp32_flat_buffer = zeros_like(bf16
#   flat, dtype=grad_acc_dtype)), 4 bytes per parameter not sharded; with bf16.immediate_grad_update
#   (set by dsorch) no bf16 .grad stays besides it. fp32 master + Adam moments, sharded: 12.
# * ZeRO-2/3 keep the fp32 gradient partition itself (stage_1_and_2.py compact grad partition
#   buffer, stage3.py grad_partitions_flat_buffer): 4 sharded, and it is what the optimizer steps
#   on, so no extra fp32 copy: 12 for master + moments.
BF16_FP32_ACCUM = (2, 4, 12)

# DeepSpeed's ZeRO optimizers keep an fp32 master partition of their own even when the model is
# fp32 (stage_1_and_2.py single_partition_of_fp32_groups is a clone of the flat partition;
# stage3.py fp32_partitioned_groups_flat): 4 + 8 bytes of optimizer state per parameter, sharded.
# Measured by train/loop/census.py (tests/system/test_census.py): 12 bytes per parameter over dp at ZeRO-1/2.
FP32_ZERO_OPTIMIZER = 12

# DeepSpeed ZeRO-1/2 communication buckets, in elements; dsorch writes these into ds_config.json.
# (DeepSpeed's default is 5e8 elements, 1 GB each in bf16; 2e8 keeps the buffers at 400 MB.)
ZERO_BUCKET_ELEMENTS = 200_000_000
# DeepSpeed ZeRO-3 keeps at most this many gathered parameters alive (stage3_max_live_parameters).
ZERO3_MAX_LIVE_PARAMETERS = 1_000_000_000


@dataclass(frozen=True)
class DeepSpeedRuntime(Runtime):
    def zero_stages(
        self, pp: int, precision: str, grad_accum_steps: int, pinned: int | None = None, fp8_param_gather=False
    ) -> list[int]:
        # DeepSpeed's pipeline engine asserts stage < 2 (pipe/engine.py). With bf16, dsorch accumulates
        # gradients in fp32 (ds_config data_types.grad_accum_dtype), which DeepSpeed refuses at ZeRO-0
        # ("unsupported mix of model_dtype=torch.bfloat16 and grad_accum_dtype=torch.float32",
        # engine.py _do_optimizer_sanity_check); bf16 accumulation loses gradient over many
        # micro-batches (measured with DeepSpeed 0.19.8: 37% of the true gradient norm after 1024), so
        # ZeRO-0 stays only where nothing accumulates.
        stages = [0, 1] if pp > 1 else [0, 1, 2, 3]
        if precision == "bf16" and grad_accum_steps > 1:
            stages.remove(0)
        return stages

    def zero_refusal(self, zero_stage: int, pp: int, grad_accum_steps: int, fp8_param_gather: bool) -> str:
        if pp > 1 and zero_stage > 1:
            return (
                f"zero_stage={zero_stage} cannot be combined with pp={pp} in DeepSpeed's pipeline engine "
                f"(it refuses ZeRO-2/3 with pipeline parallelism); use pp=1 or zero_stage<=1"
            )
        return (
            f"zero_stage=0 with bf16 and {grad_accum_steps} micro-batches per step: DeepSpeed accumulates "
            f"gradients in fp32 only from ZeRO-1 on, and bf16 accumulation loses gradient over many "
            f"micro-batches; use zero_stage>=1 (or one micro-batch per step)"
        )

    def expert_zero_ok(self, ep: int, zero_stage: int) -> bool:
        """DeepSpeed runs expert parallelism at ZeRO-1 and 2 only: 0.19's engine refuses MoE layers at
        ZeRO-3 (engine.py _validate_zero3_moe_compatibility), and at ZeRO-0 its gradient clipping
        averages the ranks' norms instead of summing the experts' (measured: 0.48973 against the true
        0.49012 at ep 2 dp 2). At ep 1 the entrypoint's MoE layer is a plain module: every stage."""
        return ep == 1 or zero_stage in (1, 2)

    def state_bytes(self, precision: str, zero_stage, grad_reduce_in_fp32: bool = True):
        w, g, o = STATE_BYTES[precision]
        z = np.asarray(zero_stage)
        if precision == "fp32":
            return w, g, np.where(z >= 1, FP32_ZERO_OPTIMIZER, o)
        if precision == "bf16":
            fw, fg, fo = BF16_FP32_ACCUM
            return np.where(z >= 1, fw, w), np.where(z >= 1, fg, g), np.where(z >= 1, fo, o)
        return w, g, o

    def dp_bucket_elements(self, group):
        """DeepSpeed's reduce_bucket_size, whatever the group."""
        return ZERO_BUCKET_ELEMENTS

    def whole_grad_allreduce(self, precision: str, zero_stage) -> np.ndarray:
        """DeepSpeed's BF16_Optimizer (bf16 with fp32 accumulation at ZeRO-1) all-reduces its whole
        gradient buffer after the last micro-batch (engine.py buffered_allreduce_fallback), not
        overlapped, then all-gathers the updated bf16 weights (bf16_optimizer.py)."""
        return (precision == "bf16") & (np.asarray(zero_stage) == 1)

    def saves_fp32_master(self, precision: str, zero_stage: int) -> bool:
        """Also in fp32 from ZeRO-1 on: DeepSpeed's ZeRO optimizers keep a cloned fp32 partition
        (FP32_ZERO_OPTIMIZER), saved as SINGLE_PARTITION_OF_FP32_GROUPS."""
        return precision != "fp32" or zero_stage >= 1

    def calibration_engine(self, zero_stage, pp=1) -> np.ndarray:
        """DeepSpeed's PipelineEngine runs whenever pp > 1 (train/loop/entry.py), ZeRO-3 never with a
        pipeline."""
        z = np.asarray(zero_stage)
        pipe = np.broadcast_to(np.asarray(pp), z.shape) > 1
        return np.where(z >= 3, "deepspeed-zero3", np.where(pipe, "deepspeed-pipeline", "deepspeed")).astype(object)


DEEPSPEED = DeepSpeedRuntime(
    name="deepspeed",
    label="DeepSpeed",
    # ZeRO overlap_comm (dsorch's ds_config sets it) overlaps the reduction with the backward pass,
    # but the pipeline engine reduces only after the pipeline flush (PipelineEngine._exec_reduce_grads
    # is the last instruction of its TrainSchedule). With tp > 1 dsorch's ds_config sets
    # pipeline.pipe_partitioned/grad_partitioned, so each tp rank sends 1/tp of the activation and
    # the receiver all-gathers it over NVLink (the same scatter/gather as Megatron's); with SP the
    # activation is already sequence-sharded, 1/tp.
    engine=Engine(
        dp_overlap=True,
        dp_overlap_with_pp=False,
        param_gather_overlap=False,
        tp_overlap=False,
        p2p_scatter_gather=True,
        p2p_overlap=False,
    ),
    bundled_trainer=True,
    calibration_engines=("deepspeed", "deepspeed-zero3", "deepspeed-pipeline"),
    # DeepSpeed reduces in the model's 16-bit type (communication_data_type defaults to it,
    # engine.py; the ZeRO buckets stay bf16, stage_1_and_2.py _gradient_reduction_buffer_dtype) even
    # where it accumulates in fp32.
    grads_reduced_in_weight_dtype=True,
    # The entrypoint's loss (train/model/tensor_parallel.py _VocabParallelCrossEntropy) is PyTorch-side.
    in_place_cross_entropy=False,
    # The pipeline engine keeps the output of every in-flight micro-batch in its pipe buffers until
    # that micro-batch's backward (pipe/engine.py _exec_forward_pass: pipe_buffers['outputs']), 1/tp
    # of it with pipe_partitioned.
    keeps_pipe_outputs=True,
    blocking_pipeline=True,
    own_reduce_buckets=True,
    renders=tuple(sorted((*COMMON_FILES, DS_CONFIG))),
    reads=DS_CONFIG,
    # The entrypoint is one SLURM task per GPU (run/jobs.py TrainingJob) and stops itself.
    launch_per_node=False,
    stop_handler="orchestrator/train/stop.py: USR2 and TERM",
    fsdp_zero_stage=None,
    # Plain data parallelism first, then each stage shards more (DeepSpeed's own default is ZeRO-0).
    zero_simplest_first=(0, 1, 2, 3),
    # DeepSpeed's pipeline engine runs plain 1F1B; the entrypoint has no ring attention, no
    # Transformer Engine, and checkpoints every decoder layer under full recomputation
    # (PipelineModule activation_checkpoint_interval); it accumulates in fp32 from ZeRO-1 on.
    interleaved_schedule=False,
    context_parallel=False,
    partial_recompute=False,
    fp8=False,
    tp_comm_overlap=False,
    grad_reduce_in_bf16=False,
    needs_train_steps=False,
    moe_needs_sp=False,
    # The entrypoint's experts split over the tp group like its dense MLP, its expert groups are
    # data-parallel ranks (orchestrator/train/model/moe.py).
    experts_like_mlp=True,
)
