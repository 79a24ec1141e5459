"""What a training runtime is to dsorch: one object per runtime (``orchestrator.runtimes``) carries
every fact that differs between runtimes, so rules, the cost model, renderers, calibration and run/
ask the object instead of testing its name. Plain facts are fields; answers that depend on the
layout are methods, overridden per runtime (``deepspeed.py``, ``megatron.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.spec.model import ModelSpec
from orchestrator.spec.training import TrainingSpec

# The generated files a runtime's program reads its settings from (render/ renders them,
# plandir/reader.py requires them, validate/plan_dir.py checks them).
DS_CONFIG = "ds_config.json"
MEGATRON_ARGS = "megatron_args.txt"
# Rendered for every runtime: the node-side script and the batch script, and megatron_args.txt
# (under the deepspeed runtime the same layout as Megatron-LM flags, for a reader to compare).
COMMON_FILES = ("job.sbatch", "launch.sh", MEGATRON_ARGS)


@dataclass(frozen=True)
class Engine:
    """What the training engine overlaps and how it sends activations; each runtime's defaults are
    its ``engine``, calibration rows pass the settings of the published run."""

    dp_overlap: bool  # gradient reduction overlaps the last micro-batch's backward
    dp_overlap_with_pp: bool  # ... also when pp > 1
    param_gather_overlap: bool  # distributed optimizer's weight all-gather overlaps the next forward
    tp_overlap: bool  # TP collectives overlap GEMMs (Megatron-Core --tp-comm-overlap), with tp > 1 and SP
    p2p_scatter_gather: bool  # stage boundaries send b*s*h/t (Megatron scatter/gather, Sec. 4.1)
    # The interleaved schedule's sends overlap compute (Megatron-Core's default overlap_p2p_comm,
    # which it turns off without interleaving): only the fill and drain sends stay exposed.
    p2p_overlap: bool = False
    # CUDA graphs capture the MoE router and the dispatcher's preprocessing (Megatron-Core
    # --cuda-graph-impl transformer_engine --cuda-graph-scope moe_router moe_preprocess): no host
    # work per MoE layer (``moe_layer_us``). Calibration rows set it where the published run did.
    moe_cuda_graphs: bool = False

    def overlaps_dp(self, pp) -> bool:
        """Whether the gradient reduction overlaps the backward pass at this pipeline degree."""
        return self.dp_overlap and (self.dp_overlap_with_pp or pp == 1)


@dataclass(frozen=True)
class Runtime:
    """One training runtime. Subclasses override the methods whose answer depends on the layout;
    plain facts are fields. ``name`` is how the CLI, specs, plan.yaml and records spell it."""

    name: str
    label: str  # in prose: "DeepSpeed", "Megatron-LM"
    engine: Engine  # overlap settings as dsorch's generated files set them
    # dsorch's bundled entrypoint (python -m orchestrator.train) trains its plans, and `dsorch trial`
    # measures them; otherwise the runtime's own program does (Megatron-LM's pretrain_gpt.py from
    # $MEGATRON_LM), started by launch.sh.
    bundled_trainer: bool
    # The calibration entries (costmodel/calibration.yaml engines) this runtime's layouts use.
    calibration_engines: tuple[str, ...]
    # -- what the cost model asks (costmodel/) ---------------------------------------------------
    # Gradients go over the wire and into the reduce buckets in the weights' 16-bit type even where
    # they accumulate in fp32 (True), or in their own type (False).
    grads_reduced_in_weight_dtype: bool
    # The loss's vocab-parallel cross-entropy works in place: the 16-bit logits and one fp32 tensor
    # per logit (True), else the logits, their fp32 copy, the shifted logits and exp at once.
    in_place_cross_entropy: bool
    # A pipeline stage keeps the output of every in-flight micro-batch until its backward (True), or
    # frees each sent output and keeps only its autograd node (False).
    keeps_pipe_outputs: bool
    # Pipeline sends block on the critical path as DeepSpeed's TrainSchedule runs them
    # (costmodel/pipe_schedule.py; costmodel/comm.py _deepspeed_pipe), else they follow Megatron-Core's
    # 1F1B and interleaved schedules.
    blocking_pipeline: bool
    # The ZeRO optimizer reduces through buckets of its own (double-buffered, and ZeRO-3's prefetch),
    # as DeepSpeed's does (costmodel/peak_memory.py _comm_buffers), not in place in its grad buffer.
    own_reduce_buckets: bool
    # The files render/ writes for it besides plan.md and plan.yaml (sorted), and the one its
    # program reads its settings from.
    renders: tuple[str, ...]
    reads: str
    # How a job starts it: one SLURM task per GPU that joins the ranks from SLURM's environment
    # (False), or one task per node running launch.sh, whose torchrun starts the node's ranks (True).
    launch_per_node: bool
    stop_handler: str  # who catches SIGUSR2 in the ranks (launch.sh's comment)
    # The ZeRO stage run on Megatron-FSDP (sharded gradients) instead of the distributed
    # optimizer, searched only when pinned; None where the runtime has none.
    fsdp_zero_stage: int | None
    # The ZeRO stages from the simplest to run to the least simple: the order in which the search's
    # near-ties and equal layouts prefer them (plan/solver.py, ``zero_simplicity``), each runtime's
    # default first. Every stage the runtime can run is in it.
    zero_simplest_first: tuple[int, ...]
    # Features dsorch plans only where the runtime has them (plan/rules.py asks).
    interleaved_schedule: bool  # vpp > 1
    context_parallel: bool  # cp > 1
    partial_recompute: bool  # recompute_layers > 0: full recomputation of only some layers
    fp8: bool  # training.fp8, fp8_param_gather: Transformer Engine's FP8 GEMMs
    tp_comm_overlap: bool  # training.tp_comm_overlap
    grad_reduce_in_bf16: bool  # training.grad_reduce_in_fp32 false
    needs_train_steps: bool  # the training length must be known when planning
    moe_needs_sp: bool  # a MoE model with tp > 1 trains only with sequence parallelism
    # The experts split over the tensor-parallel group like the dense MLP (etp = tp), and the
    # expert-parallel groups are data-parallel ranks only; else they are carved from tp x cp x dp.
    experts_like_mlp: bool

    def __str__(self) -> str:
        return self.name

    @property
    def reads_megatron_args(self) -> bool:
        """Whether megatron_args.txt is its program's command line (else a record of the model)."""
        return self.reads == MEGATRON_ARGS

    def engine_for(self, training: TrainingSpec) -> Engine:
        """The engine with the spec's options applied (the megatron runtime's tp_comm_overlap)."""
        return self.engine

    # -- layouts: what the solver enumerates and check_layout explains ----------------------------
    def zero_stages(
        self, pp: int, precision: str, grad_accum_steps: int, pinned: int | None = None, fp8_param_gather=False
    ) -> list[int]:
        """The ZeRO stages the runtime can run a layout with; ``pinned`` is the stage asked for, if any."""
        raise NotImplementedError

    def zero_refusal(self, zero_stage: int, pp: int, grad_accum_steps: int, fp8_param_gather: bool) -> str:
        """Why ``zero_stage`` is not among ``zero_stages`` (called only then), with the fix."""
        raise NotImplementedError

    def zero_simplicity(self, zero_stage) -> np.ndarray:
        """Each ZeRO stage's place in ``zero_simplest_first`` (0 the simplest; arrays over layouts):
        what the search's tie-break reads instead of the stage's number."""
        rank = np.full(max(self.zero_simplest_first) + 1, len(self.zero_simplest_first), dtype=np.int64)
        rank[list(self.zero_simplest_first)] = np.arange(len(self.zero_simplest_first))
        return rank[np.asarray(zero_stage)]

    def uses_fsdp(self, zero_stage: int) -> bool:
        """Whether a layout at this ZeRO stage runs on Megatron-FSDP (``fsdp_zero_stage``)."""
        return self.fsdp_zero_stage is not None and zero_stage == self.fsdp_zero_stage

    def expert_mesh(self, tp: int, cp: int, dp: int) -> int:
        """The ranks of one pipeline stage the expert-parallel groups are carved from."""
        return dp if self.experts_like_mlp else tp * cp * dp

    def expert_zero_ok(self, ep: int, zero_stage: int) -> bool:
        """Whether expert parallelism ``ep`` runs at this ZeRO stage."""
        return True

    def model_problems(self, model: ModelSpec) -> list[str]:
        """What the runtime cannot build of the architecture."""
        return []

    # -- memory: bytes per parameter (costmodel/memory.py applies the sharding) ----------------
    def state_bytes(self, precision: str, zero_stage, grad_reduce_in_fp32: bool = True):
        """(weights, gradients, optimizer) bytes per parameter before sharding; arrays over layouts."""
        raise NotImplementedError

    def step_transient_bytes(self, precision: str, grad_reduce_in_fp32: bool = True) -> float:
        """Bytes per parameter, sharded like the optimizer states, that exist only in the optimizer
        step, after the step's activations are freed."""
        return 0.0

    # -- the cost model: data-parallel reduction and checkpoints -----------------------------------
    def dp_bucket_elements(self, group):
        """Elements per data-parallel reduction bucket for a reduction over ``group`` ranks (arrays
        or scalars); only the count of collectives (latency) depends on it."""
        raise NotImplementedError

    def whole_grad_allreduce(self, precision: str, zero_stage) -> np.ndarray:
        """Where the optimizer all-reduces its whole gradient buffer after the last micro-batch, not
        overlapped, then all-gathers the updated weights, instead of reducing as its ZeRO stage says."""
        return np.zeros(np.shape(zero_stage), dtype=bool)

    def saves_fp32_master(self, precision: str, zero_stage: int) -> bool:
        """Whether a checkpoint holds an fp32 master copy of the weights beside them: mixed precision
        keeps one; fp32 training's weights are the master (costmodel/checkpoint.py)."""
        return precision != "fp32"

    # -- calibration --------------------------------------------------------------------------
    def calibration_engine(self, zero_stage, pp=1) -> np.ndarray:
        """The calibration engine of each layout (an array of names from ``calibration_engines``)."""
        z = np.asarray(zero_stage)
        return np.full(z.shape, self.calibration_engines[0], dtype=object)
