"""The megatron runtime: Megatron-LM's pretrain_gpt.py (Megatron-Core) with dsorch's flags; the
distributed optimizer for ZeRO-1, interleaved pipelines, context and expert parallelism."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from orchestrator.runtimes.base import COMMON_FILES, MEGATRON_ARGS, Engine, Runtime
from orchestrator.spec.model import ModelSpec
from orchestrator.spec.training import TrainingSpec

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

# Megatron-LM's DDP bucket (core/distributed/distributed_data_parallel.py: bucket_size default
# max(40M, 1M x dp) elements, "so that the per-rank chunk is large enough"); only its count of
# collectives (latency) matters here.
MEGATRON_BUCKET_ELEMENTS = 40_000_000
MEGATRON_BUCKET_PER_DP = 1_000_000

# Megatron-LM's ZeRO-2: Megatron-FSDP with --data-parallel-sharding-strategy optim_grads, which
# shards the fp32 main gradients as well as the optimizer states over the dp x cp group and keeps
# the bf16 weights whole (megatron/core/distributed/fsdp/src/docs/mfsdp_design.md, "ZeRO-2 /
# optim_grads"). This is how Llama 3 405B trained beside TP8 PP16 (Llama 3 paper, Sec. 3.3.2: FSDP
# shards optimizer states and gradients, the weights are not resharded after the forward pass).
# Searched only when pinned (--zero 2): Megatron-LM's validate_args accepts it with pipeline and
# tensor parallelism but warns against TP with it, and its functional tests run it only at pp=1.
MEGATRON_FSDP_ZERO = 2


@dataclass(frozen=True)
class MegatronRuntime(Runtime):
    def engine_for(self, training: TrainingSpec) -> Engine:
        """--tp-comm-overlap and the interleaved schedule's p2p overlap as the spec sets them."""
        return replace(self.engine, tp_overlap=training.tp_comm_overlap, p2p_overlap=training.overlap_p2p_comm)

    def zero_stages(
        self, pp: int, precision: str, grad_accum_steps: int, pinned: int | None = None, fp8_param_gather=False
    ) -> list[int]:
        # 0: plain DDP; 1: the distributed optimizer; 2: Megatron-FSDP optim_grads, only when asked.
        # --fp8-param-gather needs the distributed optimizer or Megatron-FSDP (validate_args).
        stages = [0, 1, MEGATRON_FSDP_ZERO] if pinned == MEGATRON_FSDP_ZERO else [0, 1]
        return stages[1:] if fp8_param_gather else stages

    def zero_refusal(self, zero_stage: int, pp: int, grad_accum_steps: int, fp8_param_gather: bool) -> str:
        if zero_stage == 0 and fp8_param_gather:
            return (
                "zero_stage=0 with training.fp8_param_gather: Megatron-LM's --fp8-param-gather needs the distributed "
                "optimizer (validate_args); use zero_stage 1 or set fp8_param_gather false"
            )
        return (
            f"zero_stage={zero_stage}: on Megatron-LM dsorch plans zero_stage 1 (the distributed "
            f"optimizer) and 2 (Megatron-FSDP optim_grads: gradients sharded too); Megatron-FSDP's "
            f"optim_grads_params (ZeRO-3) is not modelled: use zero_stage 0, 1 or 2, or the deepspeed runtime"
        )

    def model_problems(self, model: ModelSpec) -> list[str]:
        problems = []
        # megatron/training/arguments.py offers --swiglu and --quick-geglu (a different GeGLU), and
        # its GPT layer is sequential (attention, then MLP).
        if model.activation == "geglu":
            problems.append(
                "model.activation geglu (Gemma's tanh GeGLU) has no Megatron-LM flag; use the deepspeed runtime"
            )
        if model.parallel_residual:
            problems.append("model.parallel_residual: Megatron-LM's GPT layer is sequential; use the deepspeed runtime")
        problems += _activation_limits(model)
        problems += _moe_limits(model)
        if model.mla is not None and model.qk_norm:
            # gpt_layer_specs.py: with MLA, --qk-layernorm normalizes the query and key-value latents
            # (always emitted for MLA); a per-head QK-norm on top has no switch.
            problems.append(
                "model.qk_norm with model.mla: Megatron-LM's --qk-layernorm is MLA's latent norms, and a "
                "per-head QK-norm on MLA has no flag; drop qk_norm or use the deepspeed runtime"
            )
        return problems

    def dp_bucket_elements(self, group):
        """Megatron sizes its buckets by the dp-cp group (training.py resolve_ddp_bucket_size)."""
        return np.maximum(MEGATRON_BUCKET_ELEMENTS, MEGATRON_BUCKET_PER_DP * group)

    def state_bytes(self, precision: str, zero_stage, grad_reduce_in_fp32: bool = True):
        if precision == "bf16" and not grad_reduce_in_fp32:
            return BF16_GRADS
        return STATE_BYTES[precision]

    def step_transient_bytes(self, precision: str, grad_reduce_in_fp32: bool = True) -> float:
        sixteen_bit_grads = precision == "fp16" or (precision == "bf16" and not grad_reduce_in_fp32)
        return float(MAIN_GRAD_COPY) if sixteen_bit_grads else 0.0


def _activation_limits(model: ModelSpec) -> list[str]:
    """Megatron-Core clamps and offsets the halves of a GLU (mlp.py, moe/experts.py); its
    TransformerConfig.__post_init__ allows the clamp on SwiGLU only in MoE models and without an
    offset, and the offset with the fused bias-activation kernel only for quick-GeGLU."""
    problems = []
    if model.activation == "gelu" and (model.activation_clamp is not None or model.glu_linear_offset):
        problems.append(
            "model.activation_clamp/glu_linear_offset act on the two halves of a gated MLP and model.activation "
            "gelu has no gate; drop them or use a gated activation"
        )
    elif model.activation == "swiglu" and model.glu_linear_offset:
        problems.append(
            "model.glu_linear_offset with activation swiglu: Megatron-LM's fused SwiGLU has no offset "
            "(--glu-linear-offset goes with --quick-geglu); use activation quick_geglu or the deepspeed runtime"
        )
    elif model.activation == "swiglu" and model.activation_clamp is not None and model.moe is None:
        problems.append(
            "model.activation_clamp with swiglu: Megatron-LM clamps SwiGLU only in mixture-of-experts models "
            "(TransformerConfig); drop activation_clamp or use the deepspeed runtime"
        )
    return problems


def _moe_limits(model: ModelSpec) -> list[str]:
    """Routers and experts Megatron-Core does not build (core/transformer/moe/moe_utils.py
    topk_routing_with_score_function, TransformerConfig.__post_init__, shared_experts.py)."""
    moe = model.moe
    if moe is None:
        return []
    problems = []
    if moe.router == "sigmoid" and not moe.norm_top_k and moe.top_k > 1:
        problems.append(
            "model.moe.norm_top_k false with router sigmoid: Megatron-LM always renormalizes sigmoid scores over "
            "the chosen top_k; set norm_top_k true or use the deepspeed runtime"
        )
    if moe.router == "softmax" and moe.top_k == 1 and moe.norm_top_k:
        problems.append(
            "model.moe.norm_top_k true with top_k 1: a softmax over the one chosen expert is always 1 and gives "
            "the router no gradient, which Megatron-LM refuses; set norm_top_k false (Switch's router)"
        )
    if moe.expert_bias and moe.router != "sigmoid":
        problems.append(
            "model.moe.expert_bias (auxiliary-loss-free balancing) needs router sigmoid in Megatron-LM; set "
            "model.moe.router sigmoid or drop expert_bias"
        )
    if model.bias and moe.shared_experts:
        problems.append(
            "model.bias with model.moe.shared_experts: Megatron-Core's shared experts take no biases; set "
            "bias false or use the deepspeed runtime"
        )
    return problems


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
    # Megatron-LM reduces its fp32 main grads as they are.
    grads_reduced_in_weight_dtype=False,
    # Megatron-LM's vocab-parallel cross-entropy works in place (core/tensor_parallel/cross_entropy.py:
    # the fp32 copy of the logits becomes exp, then softmax, then the gradient).
    in_place_cross_entropy=True,
    # Megatron-LM frees each sent output and keeps only its autograd node (deallocate_pipeline_outputs,
    # always set for GPT: training/argument_utils.py).
    keeps_pipe_outputs=False,
    blocking_pipeline=False,
    # Its DDP and distributed optimizer reduce in place in their grad buffer.
    own_reduce_buckets=False,
    renders=COMMON_FILES,
    reads=MEGATRON_ARGS,
    # launch.sh's torchrun starts a node's ranks (run/megatron_job.py MegatronJob).
    launch_per_node=True,
    stop_handler="Megatron-LM's --exit-signal-handler with --exit-signal SIGUSR2; job.sbatch turns TERM into USR2",
    fsdp_zero_stage=MEGATRON_FSDP_ZERO,
    # The distributed optimizer (zero_stage 1) before plain DDP: it is how Megatron-LM recipes run
    # (Megatron-Bridge recipes/utils/optimizer_utils.py and NeMo's recipes/optim/adam.py:
    # distributed_fused_adam_with_cosine_annealing sets use_distributed_optimizer=True), and it only
    # shards the optimizer states, so ZeRO-0 is never the simpler of two near-equal layouts (issue 37:
    # ZeRO-0 chosen for a pinned recipe cost 22.6 GiB per GPU). Megatron-FSDP (2) last.
    zero_simplest_first=(1, 0, MEGATRON_FSDP_ZERO),
    interleaved_schedule=True,
    context_parallel=True,
    partial_recompute=True,  # --recompute-method block --recompute-num-layers N
    fp8=True,
    tp_comm_overlap=True,
    grad_reduce_in_bf16=True,
    # megatron/training/training.py (pretrain): "either train-iters or train-samples should be provided".
    needs_train_steps=True,
    # Megatron-Core's MoE layer refuses to train with tensor parallelism without sequence
    # parallelism, whatever ep (core/transformer/moe/moe_layer.py MoELayer.forward raises; with ep > 1
    # ModelParallelConfig.__post_init__ also warns "When using expert parallelism and tensor
    # parallelism for training, sequence parallelism must be used").
    moe_needs_sp=True,
    # Megatron-Core carves the expert mesh from the tp x cp x dp ranks of the attention
    # (core/parallel_state.py initialize_model_parallel: expert_tensor_model_pipeline_parallel groups
    # over the same world).
    experts_like_mlp=False,
)
