"""The deepspeed runtime: dsorch's bundled entrypoint (orchestrator/train) on DeepSpeed's engine,
ZeRO stages 0-3 and DeepSpeed's PipelineEngine for pp > 1."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.runtimes.base import Engine, Runtime

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
# Measured by train/census.py (tests/system/test_census.py): 12 bytes per parameter over dp at ZeRO-1/2.
FP32_ZERO_OPTIMIZER = 12


@dataclass(frozen=True)
class DeepSpeedRuntime(Runtime):
    def state_bytes(self, precision: str, zero_stage, grad_reduce_in_fp32: bool = True):
        w, g, o = STATE_BYTES[precision]
        z = np.asarray(zero_stage)
        if precision == "fp32":
            return w, g, np.where(z >= 1, FP32_ZERO_OPTIMIZER, o)
        if precision == "bf16":
            fw, fg, fo = BF16_FP32_ACCUM
            return np.where(z >= 1, fw, w), np.where(z >= 1, fg, g), np.where(z >= 1, fo, o)
        return w, g, o

    def calibration_engine(self, zero_stage, pp=1) -> np.ndarray:
        """DeepSpeed's PipelineEngine runs whenever pp > 1 (train/entry.py), ZeRO-3 never with a
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
)
