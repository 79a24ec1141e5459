"""The megatron runtime: Megatron-LM's pretrain_gpt.py (Megatron-Core) with dsorch's flags; the
distributed optimizer for ZeRO-1, interleaved pipelines, context and expert parallelism."""

from __future__ import annotations

from dataclasses import dataclass, replace

from orchestrator.runtimes.base import Engine, Runtime
from orchestrator.spec.model import TrainingSpec

# Megatron-LM: bf16 reduces and accumulates gradients in fp32 (validate_args sets
# accumulate_allreduce_grads_in_fp32 for bf16); fp16 keeps fp16 grads, and fp32 master + Adam
# (12) across steps. Checked term by term against Megatron-Core
# (core/distributed/param_and_grad_buffer.py _ParamAndGradBuffer: with the distributed optimizer
# the bf16 params live in one param_data buffer and the grads in one grad_data buffer of
# grad_dtype, both whole on every rank, reduce-scattered in place, nothing freed;
# core/optimizer/distrib_optimizer.py: fp32 main params and the Adam moments for this rank's shard
# only). Bucket-end padding (core/optimizer/param_layout.py pad_bucket_end: to lcm(dp, 128)
# elements per bucket of >= 40M) and 64-element parameter alignment add under 0.1 %, left out.
# bf16 with --grad-reduce-in-bf16: BF16_GRADS.
STATE_BYTES = {
    "bf16": (2, 4, 12),
    "fp16": (2, 2, 12),
    "fp32": (4, 4, 8),
}

# Megatron-LM bf16 with --grad-reduce-in-bf16 (TrainingSpec.grad_reduce_in_fp32 false): the DDP grad
# buffer takes the parameters' dtype (core/distributed/param_and_grad_buffer.py group_params_for_buffers:
# grad_dtype = float if grad_reduce_in_fp32 else param.dtype), 2 bytes, whole on every rank; the fp32
# main params and the two Adam moments, 12 sharded, stay across steps.
BF16_GRADS = (2, 2, 12)
# ... and with 16-bit grads (fp16, or bf16 reduced in bf16) the optimizer step makes an fp32 main-grad
# copy of this rank's shard (core/optimizer/distrib_optimizer.py _copy_model_grads_to_main_grads:
# shard_main_param.grad = shard_model_grad.float(); optimizer.py Float16OptimizerWithFloat16Params
# likewise, unsharded), 4 bytes per parameter, which the next step's zero_grad frees (set_to_none on
# shard_fp32_from_float16_groups) before its first forward (training.py train_step: zero_grad_buffer,
# then optimizer.zero_grad). It lives while the activations do not: dist_optimizer.md's "4 + 16/d" for
# 16-bit grads counts it as if it stayed. With fp32 grads the copy is a view of the grad buffer
# (.float() of an fp32 tensor is itself): nothing.
MAIN_GRAD_COPY = 4


@dataclass(frozen=True)
class MegatronRuntime(Runtime):
    def engine_for(self, training: TrainingSpec) -> Engine:
        """--tp-comm-overlap and the interleaved schedule's p2p overlap as the spec sets them."""
        return replace(self.engine, tp_overlap=training.tp_comm_overlap, p2p_overlap=training.overlap_p2p_comm)

    def state_bytes(self, precision: str, zero_stage, grad_reduce_in_fp32: bool = True):
        if precision == "bf16" and not grad_reduce_in_fp32:
            return BF16_GRADS
        return STATE_BYTES[precision]

    def step_transient_bytes(self, precision: str, grad_reduce_in_fp32: bool = True) -> float:
        sixteen_bit_grads = precision == "fp16" or (precision == "bf16" and not grad_reduce_in_fp32)
        return float(MAIN_GRAD_COPY) if sixteen_bit_grads else 0.0


MEGATRON = MegatronRuntime(
    name="megatron",
    label="Megatron-LM",
    # --overlap-grad-reduce / --overlap-param-gather with the distributed optimizer; --tp-comm-overlap
    # only where the spec asks (it needs Transformer Engine userbuffers: costmodel applies
    # training.tp_comm_overlap and overlap_p2p_comm). Megatron-Core sends the whole (s, b, h)
    # activation between stages, s/tp only with sequence parallelism (pipeline_parallel/schedules.py
    # get_tensor_shapes): the 2021 scatter/gather optimization is gone.
    engine=Engine(
        dp_overlap=True,
        dp_overlap_with_pp=True,
        param_gather_overlap=True,
        tp_overlap=False,
        p2p_scatter_gather=False,
        p2p_overlap=True,
    ),
    bundled_trainer=False,
    calibration_engines=("megatron",),
)
