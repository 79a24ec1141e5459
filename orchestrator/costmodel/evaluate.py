"""Memory and step time of many layouts at once (numpy), for one model, training and cluster.

Pure: arrays in, arrays out. ``Candidates`` holds one entry per layout; ``evaluate`` returns the
memory stack (bytes per GPU on the most loaded pipeline stage) and the time stack (seconds per
step) of every one of them. The efficiencies come from the profile, completed by the fitted
calibration table (``calibration.resolve_efficiency``); all of them are physical fractions.

Time model (per optimizer step, on the slowest pipeline stage):
  compute       every GEMM of a layer (QKV, output projection, MLP, logits; fwd, dgrad, wgrad) costs
                its FLOPs at peak x ``gemm`` plus its operand and result bytes at HBM bandwidth x
                ``hbm`` (an additive roofline: small hidden sizes and micro-batches have little
                reuse per byte and run far below peak); attention scores likewise (without
                FlashAttention the s x s matrices go through HBM and softmax/dropout over them are
                memory-bound; FlashAttention keeps them on chip, skips the causal half and
                recomputes S in its backward, 2.5x the forward FLOPs: Dao 2023, Sec. 3.1, at
                peak x ``attention``);
                element-wise work (norms, residual adds, activation, rotary, dropout,
                cross-entropy) at HBM bandwidth; recomputation adds forward passes;
  tp_comm       4 ring all-reduces (or reduce-scatter + all-gather with SP, same volume) of
                b*s*h per layer and micro-batch, 6 with full recompute (Narayanan et al. 2021,
                Sec. 4: 8bsh(t-1)/t bytes per layer per device), over NVLink with latency; with
                Megatron-Core's --tp-comm-overlap each collective hides behind the GEMM Transformer
                Engine's userbuffers pair it with, and only what exceeds that GEMM, the pipelined
                reduce-scatter's last split and ring latency stay exposed (``_ub_exposed``);
  bubble        (pp-1)/vpp micro-batch times (Narayanan et al. 2021, Sec. 2.2: bubble fraction
                (pp-1)/(m*vpp) of m micro-batch times);
  pp_comm       point-to-point activations b*s*h (b*s*h/t with SP or Megatron's scatter/gather)
                per micro-batch and chunk, forward and backward, over InfiniBand when
                neighbouring stages sit on other nodes; DeepSpeed's pipeline engine as its
                TrainSchedule runs (costmodel/pipe_schedule.py): blocking transfers on the critical
                path, the TP all-gathers of partitioned activations, the tied-embedding all-reduce;
  dp_comm       gradient reduction, hierarchical when the group spans nodes: ring inside the node
                over NVLink, then across nodes over each GPU's share of the node's NICs carrying
                1/k of the bytes (k = group members per node); ZeRO-3 gathers weights each
                micro-batch (3(d-1)/d, ZeRO paper Sec. 7); minus the part hidden behind compute
                where the engine overlaps it (``dp_overlap``);
  cp_comm       context parallelism as Transformer Engine runs it (training.cp_comm_type): the
                p2p ring (Megatron-LM's default) passes each rank's K and V chunk on, cp - 1 steps
                forward and K, V and their gradients backward, each step's transfer exposed only
                beyond one block (1/cp) of the attention; a2a's all-to-alls and all_gather's gathers
                are exposed; every ring step adds its launches and the partial outputs' correction
                traffic; recomputation runs the forward exchange again;
  optimizer     Adam reads and writes ~34 bytes per local parameter at HBM bandwidth x ``hbm``.

Context parallelism (cp) splits every sequence over cp ranks: per rank, s/cp tokens of every
activation, GEMM and message, the attention of its s/cp queries against the whole (causal,
load-balanced) sequence, and the weights replicated, so gradients reduce and the distributed
optimizer shards over dp x cp (Megatron's dp-cp group: core/distributed/distributed_data_parallel.py).
FP8 (training.fp8) runs the transformer layers' linear and expert GEMMs at the profile's FP8 peak x
the bf16 GEMM efficiency x ``fp8_gemm`` (Transformer Engine; attention, the router and the output
layer stay bf16), adds the quantizations' HBM traffic per recipe (training.fp8_recipe:
``FP8_CAST_BYTES``) and all-gathers TP activations in FP8 under userbuffers.

The parts live by stack: ``inputs`` (Candidates and what every part reads), ``peak_memory`` (the
memory stack, from the per-layer formulas of ``memory``), ``compute``, ``links`` (the fabrics and
the ring collectives), ``comm`` (tp, pp, dp), ``comm_cp`` and ``comm_ep``; this module puts them
together and is the cost model's front door: the names other packages import are importable here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.costmodel.calibration import Resolved, per_layout
from orchestrator.costmodel.comm import _dp_comm, _pp_comm, _tp_comm_mb
from orchestrator.costmodel.comm_cp import _cp_comm, cp_a2a_size
from orchestrator.costmodel.comm_ep import _ep_comm, ep_overlap_applies, token_dispatcher
from orchestrator.costmodel.compute import _Compute, _compute, _peak_flops, fp8_peak_flops
from orchestrator.costmodel.engines import ENGINES, OPTIMIZER_BYTES_PER_PARAM, runtime_engine
from orchestrator.costmodel.flops import model_flops_per_step
from orchestrator.costmodel.inputs import RC_TORCHTITAN_OP, RECOMPUTE_CODES, Candidates, _Inputs, _inputs, _rates, _take
from orchestrator.costmodel.links import _links
from orchestrator.costmodel.peak_memory import _memory
from orchestrator.costmodel.stacks import MEMORY_PARTS, TIME_PARTS, MemoryStack, TimeStack
from orchestrator.runtimes import Engine, Runtime, runtime_named
from orchestrator.runtimes.deepspeed import ZERO_BUCKET_ELEMENTS
from orchestrator.spec.cluster import ClusterProfile
from orchestrator.spec.model import ModelSpec
from orchestrator.spec.training import TrainingSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class Evaluation:
    """The stacks of every layout, and what is derived from them or explains them."""

    memory: MemoryStack  # bytes per GPU on the binding stage
    time: TimeStack  # seconds per step
    tokens_per_s: np.ndarray
    mfu: np.ndarray
    compute_at_peak: np.ndarray  # FLOPs the binding stage executes (recompute included) at 100% of peak
    tp_comm_total: np.ndarray  # before overlap; time.tp_comm is what stays exposed
    dp_comm_total: np.ndarray  # before overlap
    # Of the activations, what only dsorch's bundled entrypoint keeps (its plain-PyTorch layer;
    # memory.entrypoint_extra_bytes_per_layer); 0 on Megatron-LM. Published runs of other PyTorch
    # engines (FSDP) are compared without it (calibrate/rows.py predicted_peak_gib).
    entrypoint_activations: np.ndarray

    def take(self, idx) -> Evaluation:
        return _take(self, idx)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Communication:
    tp_comm_mb: np.ndarray  # exposed, per micro-batch: the bubble's micro-batch time holds it
    tp_comm_total: np.ndarray  # per step, before overlap
    pp_comm: np.ndarray
    dp_comm: np.ndarray  # exposed
    dp_comm_total: np.ndarray  # before overlap
    cp_comm: np.ndarray  # exposed
    ep_comm_mb: np.ndarray  # exposed, per micro-batch


def _communication(x: _Inputs, comp: _Compute) -> _Communication:
    """Seconds per step of tensor-parallel, pipeline, data-parallel and context-parallel
    communication."""
    links = _links(x)
    tp = _tp_comm_mb(x, links, comp)
    dp = _dp_comm(x, links, comp)
    return _Communication(
        tp_comm_mb=tp.exposed,
        tp_comm_total=x.grad_accum_steps * tp.total,
        pp_comm=_pp_comm(x, links),
        dp_comm=dp.exposed,
        dp_comm_total=dp.total,
        cp_comm=_cp_comm(x, links, comp),
        ep_comm_mb=_ep_comm(x, links, comp).exposed,
    )


def evaluate(
    model: ModelSpec,
    training: TrainingSpec,
    profile: ClusterProfile,
    runtime: str | Runtime,
    c: Candidates,
    *,
    efficiency: Resolved | None = None,
    engine: Engine | None = None,
) -> Evaluation:
    """Memory and time stacks of every layout in ``c``: ``_memory``, ``_compute`` and
    ``_communication`` on the same inputs, put together.

    ``efficiency`` overrides the profile's resolved efficiencies and ``engine`` the runtime's
    overlap settings (calibration uses both); plain callers pass neither.
    """
    runtime = runtime_named(runtime)
    eff = _rates(per_layout(profile, runtime, c.zero_stage, c.pp)[0] if efficiency is None else efficiency.values())
    eng = runtime_engine(runtime, training) if engine is None else engine
    x = _inputs(model, training, profile, runtime, c, eff, eng)
    mem = _memory(x)
    comp = _compute(x)
    comm = _communication(x, comp)
    tp_comm = x.grad_accum_steps * comm.tp_comm_mb
    ep_comm = x.grad_accum_steps * comm.ep_comm_mb
    bubble = (x.pp - 1) / x.vpp * (comp.per_micro_batch + comm.tp_comm_mb + comm.cp_comm / x.grad_accum_steps)
    if model.moe is not None:
        bubble = bubble + (x.pp - 1) / x.vpp * comm.ep_comm_mb
    hbm = x.hbm
    opt_params = x.params_stage / np.where(x.zero_stage >= 1, x.dpc, 1.0)
    if model.moe is not None:
        opt_params = opt_params + x.expert_stage / np.where(x.zero_stage >= 1, x.edp, 1.0)
    optimizer_step = opt_params * OPTIMIZER_BYTES_PER_PARAM / hbm

    step = comp.per_step + tp_comm + bubble + comm.pp_comm + comm.dp_comm + comm.cp_comm + optimizer_step
    if model.moe is not None:
        step = step + ep_comm
    tokens = training.global_batch_size * float(training.seq_length)
    mflops = model_flops_per_step(model, training.seq_length, training.global_batch_size)
    peak = _peak_flops(profile, training.precision)
    mfu = mflops / (step * (x.tp * x.cp * x.pp * x.dp) * peak)
    # The at-peak bound: the stage's FLOPs at the fastest rate any of them runs at.
    best_peak = max(peak, fp8_peak_flops(profile) or 0.0) if training.fp8 else peak
    time = TimeStack(
        compute=comp.per_step,
        tp_comm=tp_comm,
        bubble=bubble,
        pp_comm=comm.pp_comm,
        dp_comm=comm.dp_comm,
        cp_comm=comm.cp_comm,
        ep_comm=ep_comm,
        optimizer=optimizer_step,
        step=step,
    )
    return Evaluation(
        memory=mem.stack,
        time=time,
        tokens_per_s=tokens / step,
        mfu=mfu,
        compute_at_peak=comp.flops_step / best_peak,
        tp_comm_total=comm.tp_comm_total,
        dp_comm_total=comm.dp_comm_total,
        entrypoint_activations=mem.entrypoint_activations,
    )


def invariant_violations(c: Candidates, ev: Evaluation) -> list[str]:
    """Facts every evaluation must satisfy; a violation is a bug in the cost model, not bad input.

    Checked by the solver after each evaluation (cheap: a few array comparisons).
    """
    bad: list[str] = []
    mem, time = ev.memory, ev.time
    tp = np.asarray(c.tp)
    if np.any(time.tp_comm[tp == 1] != 0):
        bad.append("tensor-parallel traffic with tp = 1")
    if np.any(time.cp_comm[np.asarray(c.cp) == 1] != 0):
        bad.append("context-parallel traffic with cp = 1")
    if np.any(time.ep_comm[(np.asarray(c.ep) == 1) & (np.asarray(c.etp) == 1)] != 0):
        bad.append("expert-parallel traffic with ep = etp = 1")
    if np.any(mem.total < mem.params):
        bad.append("total memory below the local parameter shard")
    parts = [(f"memory {k}", getattr(mem, k)) for k in MEMORY_PARTS] + [
        (f"time {k}", getattr(time, k)) for k in TIME_PARTS
    ]
    for name, arr in parts:
        if np.any(~np.isfinite(arr)) or np.any(arr < 0):
            bad.append(f"{name} negative or not finite")
    if np.any(time.step < ev.compute_at_peak * (1 - 1e-9)):
        bad.append("step time below compute at peak")
    return bad


# The names other packages import from here (the cost model's front door); each has its home above.
__all__ = [
    "ENGINES",
    "RC_TORCHTITAN_OP",
    "RECOMPUTE_CODES",
    "ZERO_BUCKET_ELEMENTS",
    "Candidates",
    "Engine",
    "Evaluation",
    "cp_a2a_size",
    "ep_overlap_applies",
    "evaluate",
    "invariant_violations",
    "runtime_engine",
    "token_dispatcher",
]
