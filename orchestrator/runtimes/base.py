"""What a training runtime is to dsorch: one object per runtime (``orchestrator.runtimes``) carries
every fact that differs between runtimes, so rules, the cost model, renderers, calibration and run/
ask the object instead of testing its name. A third runtime is one module beside ``deepspeed.py``
and ``megatron.py`` and one entry in ``RUNTIMES``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.spec.model import TrainingSpec


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


@dataclass(frozen=True)
class Runtime:
    """One training runtime. Subclasses override the methods whose answer depends on the layout;
    plain facts are fields. ``name`` is how the CLI, specs, plan.yaml and records spell it."""

    name: str
    label: str  # in prose: "DeepSpeed", "Megatron-LM"
    engine: Engine  # overlap settings as dsorch's generated files set them
    # dsorch's bundled entrypoint (python -m orchestrator.train) trains its plans; otherwise the
    # runtime's own program does (Megatron-LM's pretrain_gpt.py from $MEGATRON_LM).
    bundled_trainer: bool
    # The calibration entries (costmodel/calibration.yaml engines) this runtime's layouts use.
    calibration_engines: tuple[str, ...]

    def __str__(self) -> str:
        return self.name

    def engine_for(self, training: TrainingSpec) -> Engine:
        """The engine with the spec's options applied (the megatron runtime's tp_comm_overlap)."""
        return self.engine

    # -- memory: bytes per parameter (costmodel/memory.py applies the sharding) ----------------
    def state_bytes(self, precision: str, zero_stage, grad_reduce_in_fp32: bool = True):
        """(weights, gradients, optimizer) bytes per parameter before sharding; arrays over layouts."""
        raise NotImplementedError

    def step_transient_bytes(self, precision: str, grad_reduce_in_fp32: bool = True) -> float:
        """Bytes per parameter, sharded like the optimizer states, that exist only in the optimizer
        step, after the step's activations are freed."""
        return 0.0

    # -- calibration --------------------------------------------------------------------------
    def calibration_engine(self, zero_stage, pp=1) -> np.ndarray:
        """The calibration engine of each layout (an array of names from ``calibration_engines``)."""
        z = np.asarray(zero_stage)
        return np.full(z.shape, self.calibration_engines[0], dtype=object)
