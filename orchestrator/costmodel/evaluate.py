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
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from types import SimpleNamespace

import numpy as np

from orchestrator.costmodel.calibration import FIELDS, Resolved, per_layout
from orchestrator.costmodel.flops import model_flops_per_step, window_fraction
from orchestrator.costmodel.memory import (
    GIB,
    activation_bytes_per_layer,
    entrypoint_extra_bytes_per_layer,
    in_flight_micro_batches,
    model_state_bytes,
    moe_activation_bytes_per_layer,
    moe_mlp_activation_bytes,
    state_bytes,
    step_transient_bytes,
)
from orchestrator.costmodel.pipe_schedule import exposed_transfers, partition_gathers
from orchestrator.costmodel.stacks import MEMORY_PARTS, TIME_PARTS, MemoryStack, TimeStack
from orchestrator.runtimes import RUNTIMES, Engine, runtime_named
from orchestrator.spec.cluster import ClusterProfile
from orchestrator.spec.model import ModelSpec, TrainingSpec

RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}
# Not a level dsorch plans: torchtitan's per-op selective checkpointing, which published FSDP runs
# used (torchtitan activation_checkpoint.py, op SAC: "Saves output of all compute ops, except every
# second mm"); calibration rows evaluate it so that those runs are modelled as they ran.
RC_TORCHTITAN_OP = 3

# DeepSpeed ZeRO-1/2 communication buckets, in elements; dsorch writes these into ds_config.json.
# (DeepSpeed's default is 5e8 elements, 1 GB each in bf16; 2e8 keeps the buffers at 400 MB.)
ZERO_BUCKET_ELEMENTS = 200_000_000
# DeepSpeed ZeRO-3 keeps at most this many gathered parameters alive (stage3_max_live_parameters).
ZERO3_MAX_LIVE_PARAMETERS = 1_000_000_000
# Megatron-LM's DDP bucket (core/distributed/distributed_data_parallel.py: bucket_size default
# max(40M, 1M x dp) elements, "so that the per-rank chunk is large enough"); only its count of
# collectives (latency) matters here.
MEGATRON_BUCKET_ELEMENTS = 40_000_000
MEGATRON_BUCKET_PER_DP = 1_000_000
# Adam step per parameter: read fp32 master, momentum, variance, fp32 gradient (16 B), write the
# first three (12 B) and the 16-bit weight copy (2 B); plus the gradient norm and unscale reads.
OPTIMIZER_BYTES_PER_PARAM = 34.0


# The engines' overlap settings are each runtime's ``engine`` (orchestrator.runtimes); calibration
# rows pass the settings of the published run.
ENGINES = {name: rt.engine for name, rt in RUNTIMES.items()}


def runtime_engine(runtime, training: TrainingSpec) -> Engine:
    """The runtime's engine with the spec's options applied (``Runtime.engine_for``)."""
    return runtime_named(runtime).engine_for(training)


def _take(obj, idx):
    """A dataclass of arrays (nested ones included) cut down to the entries ``idx``."""
    return type(obj)(
        **{
            f.name: _take(v, idx) if is_dataclass(v := getattr(obj, f.name)) else np.asarray(v)[idx]
            for f in fields(obj)
        }
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidates:
    """One entry per layout: a column per axis the cost model reads, named as the ``Layout`` field
    (the solver fills them from ``orchestrator.plan.layout.AXES``, coded by ``Axis.code``), and the
    decoder layers per stage from ``rules.stage_split``."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    vpp: np.ndarray
    zero_stage: np.ndarray
    micro_batch_size: np.ndarray
    grad_accum_steps: np.ndarray
    recompute: np.ndarray  # RECOMPUTE_CODES
    sequence_parallel: np.ndarray  # bool
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    recompute_layers: np.ndarray  # full recomputation's layers per (virtual) stage; 0: every layer
    layers_first: np.ndarray
    layers_middle: np.ndarray
    layers_last: np.ndarray

    def __len__(self) -> int:
        return int(np.asarray(self.tp).size)

    def take(self, idx) -> Candidates:
        return _take(self, idx)


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


def _peak_flops(profile: ClusterProfile, precision: str) -> float:
    """Dense peak of the training precision, FLOP/s: what MFU divides by (for FP8 GEMMs too: the
    model is bf16, MFU against the bf16 peak)."""
    return getattr(profile.gpu.peak_tflops, precision) * 1e12


def fp8_peak_flops(profile: ClusterProfile) -> float | None:
    fp8 = profile.gpu.peak_tflops.fp8
    return None if fp8 is None else fp8 * 1e12


def _ring_time(nbytes, n, bw, latency, factor):
    """Ring collective over n ranks: ``factor * (n-1)/n * bytes / bw`` plus one latency per ring
    step (factor = 2 for an all-reduce: reduce-scatter then all-gather, n-1 steps each)."""
    n = np.asarray(n, dtype=np.float64)
    return np.where(n > 1, factor * (n - 1) / n * nbytes / bw + factor * (n - 1) * latency, 0.0)


def _hierarchical_time(nbytes, d, k, bw_intra, lat_intra, bw_inter, lat_inter, factor):
    """A collective over d ranks, k of them per node: ring over NVLink inside the node, then a ring
    across the d/k nodes where each member carries 1/k of the bytes over its own NIC share
    (NCCL's multi-channel rings and 2D all-reduce give this bus bandwidth)."""
    d = np.asarray(d, dtype=np.float64)
    k = np.minimum(np.asarray(k, dtype=np.float64), d)
    nodes = np.maximum(1.0, np.ceil(d / k))
    inside = _ring_time(nbytes, k, bw_intra, lat_intra, factor)
    across = _ring_time(nbytes / k, nodes, bw_inter, lat_inter, factor)
    return inside + across


@dataclass(frozen=True, kw_only=True, slots=True)
class _Inputs:
    """What every part of the model reads: the layouts as float arrays, the model's shape, the
    bytes per parameter, the efficiencies and the engine. Built once by ``_inputs``."""

    model: ModelSpec
    training: TrainingSpec
    profile: ClusterProfile
    runtime: str
    eff: SimpleNamespace  # _rates
    eng: Engine
    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    vpp: np.ndarray
    micro_batch_size: np.ndarray
    grad_accum_steps: np.ndarray
    zero_stage: np.ndarray
    recompute: np.ndarray
    recompute_layers: np.ndarray
    sequence_parallel: np.ndarray
    lf: np.ndarray  # decoder layers on the first, a middle and the last stage
    lm: np.ndarray
    ll: np.ndarray
    act_bytes: int
    weight_b: np.ndarray
    grad_b: np.ndarray
    opt_b: np.ndarray
    comm_grad_b: np.ndarray
    cp: np.ndarray
    s_local: np.ndarray  # tokens of a sequence on one rank: s / cp
    dpc: np.ndarray  # dp x cp: the gradient-reduction and optimizer-sharding group
    layer_params_local: np.ndarray  # parameters of one decoder layer on one GPU
    first_params: np.ndarray  # parameters each stage holds on one GPU (the experts' apart)
    middle_params: np.ndarray
    last_params: np.ndarray
    params_stage: np.ndarray  # of the largest stage (the experts' apart)
    # Mixture of experts (all zero for a dense model). The routed experts' parameters each stage
    # holds on one GPU, reduced and sharded over the expert data-parallel group (edp ranks), not dp x cp.
    ep: np.ndarray
    etp: np.ndarray
    edp: np.ndarray  # tp x cp x dp / (ep x etp)
    moe_first: np.ndarray  # MoE layers on the first, a middle and the last stage (MTP modules apart)
    moe_middle: np.ndarray
    moe_last: np.ndarray
    expert_first: np.ndarray
    expert_middle: np.ndarray
    expert_last: np.ndarray
    expert_stage: np.ndarray  # of the stage params_stage is of
    mtp: float  # multi-token-prediction modules, on the last stage
    routed: np.ndarray  # _routed_copies: routed token copies per GPU, MoE layer and micro-batch
    router_tokens: np.ndarray  # ... and the tokens that enter one GPU's router

    @property
    def stage_layers(self) -> np.ndarray:
        """Decoder layers of the largest stage."""
        return np.maximum(np.maximum(self.lf, self.lm), self.ll)

    def full_recompute_share(self, layers) -> np.ndarray:
        """Of a stage's ``layers``, the share that full recomputation reruns: all of them, or with
        recompute_layers N the first N of each of its vpp virtual stages (Megatron-LM's block method:
        core/recompute.py checkpoints layer_idx < recompute_num_layers of each TransformerBlock, one
        per virtual stage); 0 without full recomputation."""
        n = self.recompute_layers
        part = np.where(n > 0, np.minimum(n * self.vpp, layers) / np.maximum(layers, 1.0), 1.0)
        return np.where(self.recompute == RECOMPUTE_CODES["full"], part, 0.0)


def _moe_layers_per_stage(model: ModelSpec, lf, lm, ll):
    """MoE layers on the first stage, the middle stage with the most of them, and the last stage, for
    each layout's stage split (decoder layers in order: the first stage holds layers [0, lf), the
    last the final ll). Zeros for a dense model."""
    if model.moe is None:
        zero = np.zeros_like(lf)
        return zero, zero, zero
    L = model.num_layers
    cum = np.concatenate([[0], np.cumsum([model.is_moe_layer(i) for i in range(L)])])
    splits, inverse = np.unique(np.stack([lf, lm, ll]).astype(np.int64), axis=1, return_inverse=True)
    per_split = np.zeros((3, splits.shape[1]))
    for j, (f, m, la) in enumerate(splits.T.tolist()):
        starts = range(f, max(f, L - la - m) + 1, max(m, 1))
        middle = max((cum[min(a + m, L)] - cum[a] for a in starts), default=0) if L - la > f else 0
        per_split[:, j] = (cum[min(f, L)], middle, cum[L] - cum[max(L - la, 0)])
    first, middle, last = per_split[:, inverse.ravel()]
    return first, middle, last


def _rates(values) -> SimpleNamespace:
    """The efficiencies (``calibration.FIELDS``) of every layout as attributes: floats when one
    Resolved applies to all, arrays over layouts when the runtime mixes engines (DeepSpeed's ZeRO-3
    and below)."""
    return SimpleNamespace(**{f: values[f] for f in FIELDS})


@dataclass(frozen=True, kw_only=True, slots=True)
class _StageParams:
    """Parameters one GPU of each pipeline stage holds (the experts' apart), and the stage that binds."""

    layer_params_local: np.ndarray
    first: np.ndarray
    middle: np.ndarray
    last: np.ndarray
    binding: np.ndarray
    expert_first: np.ndarray
    expert_middle: np.ndarray
    expert_last: np.ndarray
    expert_binding: np.ndarray
    moe_first: np.ndarray
    moe_middle: np.ndarray
    moe_last: np.ndarray


def _stage_params(model: ModelSpec, c: Candidates, tp: np.ndarray, pp: np.ndarray) -> _StageParams:
    f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    h = float(model.hidden_size)
    norm = float(model.norm_params)  # one norm's weight (and bias)
    norms = 2 * norm
    layer_params_local = (model.params_per_layer - norms) / tp + norms
    # A MoE layer on one GPU: attention and shared experts split over tp like a dense layer, the
    # router replicated (Megatron-Core TopKRouter weight; the entrypoint's likewise), and E/ep routed
    # experts, each split over etp ranks (Megatron-Core's expert mesh, core/transformer/moe/experts.py).
    moe_dense_local = (model.attention_params + model.shared_expert_params) / tp + model.router_params + norms
    ep, etp = f64(c.ep), f64(c.etp)
    n_exp = float(model.moe.num_experts) if model.moe is not None else 0.0
    moe_expert_local = n_exp / ep * model.expert_params / etp
    # The word embedding and the output projection are split over tp (vocab-parallel); learned
    # position embeddings and the final norm are replicated on every tp rank (Megatron-LM's
    # LanguageModelEmbedding and final layernorm; train/model.py). Measured: train/census.py.
    positions = model.embedding_params - model.vocab_size * h
    emb_local = model.vocab_size * h / tp + positions
    out_local = (model.output_params - norm) / tp + norm
    # With tied embeddings and pp > 1 the last stage keeps its own copy of the embedding matrix
    # for the output layer, synchronized by an extra all-reduce (Megatron-LM, Shoeybi 2019).
    tied_copy = np.where((pp > 1) & model.tied_embeddings, model.vocab_size * h / tp, 0.0)
    lf, lm, ll = f64(c.layers_first), f64(c.layers_middle), f64(c.layers_last)
    mf, mm, ml = _moe_layers_per_stage(model, lf, lm, ll)
    # MTP modules on the last stage: a layer of the model's kind, the 2h -> h projection (column
    # parallel) and three norms (DeepSeek-V3 Sec. 2.2; Megatron-Core multi_token_prediction.py).
    mtp = float(model.mtp_layers)
    mtp_dense = mtp * ((moe_dense_local if model.moe is not None else layer_params_local) + 2 * h * h / tp + 3 * norm)
    mtp_expert = mtp * (moe_expert_local if model.moe is not None else 0.0)

    def stage(layers, moe_layers):
        return (layers - moe_layers) * layer_params_local + moe_layers * moe_dense_local, moe_layers * moe_expert_local

    first, e_first = stage(lf, mf)
    middle, e_middle = stage(lm, mm)
    last, e_last = stage(ll, ml)
    first_params = first + emb_local + np.where(pp == 1, out_local + mtp_dense, 0.0)
    e_first = e_first + np.where(pp == 1, mtp_expert, 0.0)
    middle_params = middle
    last_params = last + out_local + tied_copy + mtp_dense
    e_last = e_last + mtp_expert
    totals = np.stack([first_params + e_first, middle_params + e_middle, np.where(pp > 1, last_params + e_last, 0.0)])
    which = np.argmax(totals, axis=0)
    params_stage = np.choose(which, [first_params, middle_params, last_params])
    expert_stage = np.choose(which, [e_first, e_middle, e_last])
    return _StageParams(
        layer_params_local=layer_params_local,
        first=first_params,
        middle=middle_params,
        last=last_params,
        binding=params_stage,
        expert_first=e_first,
        expert_middle=e_middle,
        expert_last=e_last,
        expert_binding=expert_stage,
        moe_first=mf,
        moe_middle=mm,
        moe_last=ml,
    )


def _inputs(
    model: ModelSpec,
    training: TrainingSpec,
    profile: ClusterProfile,
    runtime: str,
    c: Candidates,
    eff: SimpleNamespace,
    eng: Engine,
) -> _Inputs:
    f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    tp, pp, zero = f64(c.tp), f64(c.pp), np.asarray(c.zero_stage)
    weight_b, grad_b, opt_b = state_bytes(runtime, training.precision, zero, training.grad_reduce_in_fp32)
    # Bytes per gradient element on the wire and in DeepSpeed's reduce buckets: DeepSpeed reduces in
    # the model's 16-bit type (communication_data_type defaults to it, engine.py; the ZeRO buckets
    # stay bf16, stage_1_and_2.py _gradient_reduction_buffer_dtype) even where it accumulates in
    # fp32; Megatron-LM reduces its fp32 main grads as they are.
    comm_grad_b = np.minimum(grad_b, weight_b) if runtime == "deepspeed" else grad_b
    sp_ = _stage_params(model, c, tp, pp)
    routed, router_tokens = _routed_copies(model, training, c, tp)
    ep, etp = f64(c.ep), f64(c.etp)
    cp = f64(c.cp)
    return _Inputs(
        model=model,
        training=training,
        profile=profile,
        runtime=runtime,
        eff=eff,
        eng=eng,
        tp=tp,
        pp=pp,
        dp=f64(c.dp),
        vpp=f64(c.vpp),
        micro_batch_size=f64(c.micro_batch_size),
        grad_accum_steps=f64(c.grad_accum_steps),
        zero_stage=zero,
        recompute=np.asarray(c.recompute),
        recompute_layers=f64(c.recompute_layers),
        sequence_parallel=np.asarray(c.sequence_parallel, dtype=bool),
        lf=f64(c.layers_first),
        lm=f64(c.layers_middle),
        ll=f64(c.layers_last),
        act_bytes=4 if training.precision == "fp32" else 2,
        weight_b=weight_b,
        grad_b=grad_b,
        opt_b=opt_b,
        comm_grad_b=comm_grad_b,
        cp=cp,
        s_local=float(training.seq_length) / cp,
        dpc=f64(c.dp) * cp,
        layer_params_local=sp_.layer_params_local,
        first_params=sp_.first,
        middle_params=sp_.middle,
        last_params=sp_.last,
        params_stage=sp_.binding,
        ep=ep,
        etp=etp,
        edp=f64(c.dp) * cp * tp / (ep * etp),
        moe_first=sp_.moe_first,
        moe_middle=sp_.moe_middle,
        moe_last=sp_.moe_last,
        expert_first=sp_.expert_first,
        expert_middle=sp_.expert_middle,
        expert_last=sp_.expert_last,
        expert_stage=sp_.expert_binding,
        mtp=float(model.mtp_layers),
        routed=routed,
        router_tokens=router_tokens,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _LayerActivations:
    """Activation bytes of one decoder layer and micro-batch on one GPU."""

    saved: np.ndarray  # what a dense layer's forward keeps for the backward, at the layout's recompute level
    saved_moe: np.ndarray  # ... a MoE layer's (equal to ``saved`` for a dense model)
    # What a layer that full recomputation leaves out (recompute_layers) keeps: its whole activations.
    saved_none: np.ndarray
    saved_moe_none: np.ndarray
    working: np.ndarray  # the backward's working set of the layer being back-propagated
    saved_entrypoint: np.ndarray  # of ``saved`` and ``working``, what only dsorch's entrypoint keeps
    working_entrypoint: np.ndarray


def attention_widths(model: ModelSpec) -> tuple[tuple[float, float, float, float] | None, float]:
    """(Q, K, V, output widths as multiples of h, or None for the standard h, kv/a, kv/a, h; the MLA
    latents' width in h) for ``activation_bytes_per_layer``."""
    h, a = float(model.hidden_size), float(model.num_attention_heads)
    if model.mla is not None:
        m = model.mla
        dq, dv = float(m.qk_head_dim), float(m.v_head_dim)
        # Every head has its own K and V after the up-projection (kv = a). The latents: the query's
        # q_lora_rank (its norm's input and output) and the key/value latent with the shared rotary key.
        latent = ((m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_rope_head_dim) / h
        return (a * dq / h, a * dq / h, a * dv / h, a * dv / h), latent
    d = float(model.head_dim)
    if a * d == h:
        return None, 0.0
    kv = float(model.kv_heads)
    return (a * d / h, kv * d / h, kv * d / h, a * d / h), 0.0


def _routed_copies(model: ModelSpec, training: TrainingSpec, c: Candidates, tp) -> tuple[np.ndarray, np.ndarray]:
    """(routed token copies one GPU's experts process per MoE layer and micro-batch, counted at full
    expert width; tokens that enter one GPU's router). Megatron-Core routes each rank's sequence shard
    (sequence parallelism with tp > 1), the entrypoint every token on every tp rank, its experts split
    over tp; either way the routed work of a GPU is top_k x tokens / tp, times the imbalance of the
    busiest rank (training.moe_load_imbalance; 1 = balanced, as the published benchmarks force)."""
    T = (
        float(training.seq_length)
        / np.asarray(c.cp, dtype=np.float64)
        * np.asarray(c.micro_batch_size, dtype=np.float64)
    )
    if model.moe is None:
        return np.zeros_like(tp), np.zeros_like(tp)
    k = float(model.moe.top_k) * training.moe_load_imbalance
    t_in = np.where(np.asarray(c.sequence_parallel, dtype=bool), T / tp, T)
    return T * k / tp, t_in


def _moe_layer_activations(x: _Inputs, formula, level) -> np.ndarray:
    """Activation bytes of one MoE layer and micro-batch at recompute ``level``: the dense formula
    without its MLP, the shared experts as a dense MLP of their size, and the routed part, as
    Megatron-Core keeps it (memory.moe_mlp_activation_bytes) or as dsorch's entrypoint keeps it
    (train/moe.py; memory.moe_activation_bytes_per_layer, counted to the byte by its census)."""
    model, training = x.model, x.training
    moe = model.moe
    assert moe is not None
    s, mbs, h = x.s_local, x.micro_batch_size, float(model.hidden_size)
    if x.runtime == "deepspeed":
        k = float(moe.top_k)
        return formula(level, 0.0) + moe_activation_bytes_per_layer(
            s,
            mbs,
            h,
            x.tp,
            x.sequence_parallel,
            level,
            num_experts=float(moe.num_experts),
            top_k=k,
            expert_ffn=float(moe.ffn_hidden_size),
            shared_ffn=float(moe.shared_ffn),
            shared_gate=moe.shared_expert_gate,
            swiglu=model.gated,
            router=moe.router,
            norm_top_k=moe.norm_top_k,
            load_balancing=moe.load_balancing if moe.aux_loss_coeff > 0 else "none",
            sent=s * mbs * k,
            received=s * mbs * k * training.moe_load_imbalance,
            act_bytes=x.act_bytes,
        )
    r, t_in = x.routed, x.router_tokens
    routed = moe_mlp_activation_bytes(
        r,
        t_in,
        h,
        float(moe.ffn_hidden_size),
        float(moe.num_experts),
        x.etp,
        level,
        gated=model.gated,
        act_bytes=x.act_bytes,
        fp8=training.fp8 is not None,
    )
    return formula(level, float(moe.shared_ffn)) + routed


def _layer_activations(x: _Inputs) -> _LayerActivations:
    model, training, tp, rc = x.model, x.training, x.tp, x.recompute
    s, mbs, sp = x.s_local, x.micro_batch_size, x.sequence_parallel  # with cp, each rank holds s/cp of every sequence
    h, f, a, kv = (
        float(model.hidden_size),
        float(model.ffn_hidden_size),
        float(model.num_attention_heads),
        float(model.kv_heads),
    )
    act_bytes = x.act_bytes
    fp8 = training.fp8 is not None
    qkvo, latent = attention_widths(model)

    def formula(level, ffn):
        return activation_bytes_per_layer(
            s,
            mbs,
            h,
            ffn,
            a,
            kv,
            tp,
            sp,
            level,
            swiglu=model.gated,
            flash=training.flash_attention,
            hidden_dropout=training.hidden_dropout > 0,
            attention_dropout=training.attention_dropout > 0,
            act_bytes=act_bytes,
            fp8=fp8,
            qkvo=qkvo,
            latent=latent,
        )

    act_layer = formula(rc, f)
    # Backward working set: the layer being back-propagated holds gradient buffers about the size
    # of its full activations (and, under recomputation, its rematerialized activations). Counted
    # once per stage, the same for every recompute level, so recompute never looks worse than none.
    working_layer = formula(np.zeros_like(rc), f)
    act_moe, none_layer, none_moe = act_layer, working_layer, working_layer
    if model.moe is not None:
        r = x.routed
        act_moe = _moe_layer_activations(x, formula, rc)
        none_moe = _moe_layer_activations(x, formula, np.zeros_like(rc))
        # The dispatcher's send and receive buffers of the layer in flight (permuted tokens, h wide).
        working_layer = np.maximum(working_layer, none_moe + 2 * r * h * act_bytes)
    # The deepspeed runtime is dsorch's own entrypoint, whose layer keeps RoPE's cast tables and the
    # norms' 1/rms beside what the formula counts (memory.entrypoint_extra_bytes_per_layer, measured).
    if x.runtime == "deepspeed":

        def extra(level):
            return entrypoint_extra_bytes_per_layer(
                s,
                mbs,
                float(model.head_dim),
                tp,
                sp,
                level,
                rmsnorm=model.normalization == "rmsnorm",
                rope=model.position_embedding == "rope",
                act_bytes=act_bytes,
            )

        layer_extra, working_extra = extra(rc), extra(np.zeros_like(rc))
    else:
        layer_extra = working_extra = np.zeros_like(tp)
    return _LayerActivations(
        saved=act_layer + layer_extra,
        saved_moe=act_moe + layer_extra,
        saved_none=none_layer + working_extra,
        saved_moe_none=none_moe + working_extra,
        working=working_layer + working_extra,
        saved_entrypoint=layer_extra,
        working_entrypoint=working_extra,
    )


def _comm_buffers(x: _Inputs) -> np.ndarray:
    """Communication buffers. Megatron's DDP and distributed optimizer reduce in place in their grad
    buffer; DeepSpeed and Megatron-FSDP have buffers of their own."""
    zero = x.zero_stage
    if x.runtime == "deepspeed":
        bucket = np.minimum(ZERO_BUCKET_ELEMENTS, x.params_stage) * x.comm_grad_b
        # ZeRO-1/2 keep two reduce buckets (overlap_comm's double buffering); bf16 ZeRO-1 runs in
        # BF16_Optimizer, which reduces its flat buffer in place and keeps none.
        has_buckets = (zero == 2) | ((zero == 1) & (x.training.precision != "bf16"))
        buffers = np.where(has_buckets, 2 * bucket, 0.0)
        # ZeRO-3 gathers one layer ahead (prefetch) besides the one in use, and with
        # contiguous_gradients allocates its reduce bucket whole at start, whatever the model's size
        # (stage3.py: ipg bucket.buffer = torch.empty(reduce_bucket_size, dtype=grad dtype);
        # measured by train/census.py: 2e8 fp32 elements, 800 MB, on the tiny model).
        gathered = np.minimum(ZERO3_MAX_LIVE_PARAMETERS, 2 * x.layer_params_local) * x.weight_b
        zero3_bucket = ZERO_BUCKET_ELEMENTS * x.weight_b
        return buffers + np.where(zero == 3, gathered + zero3_bucket, 0.0)
    # Megatron-FSDP optim_grads (zero 2): autograd writes each layer's gradient full size in the
    # weights' dtype, which is reduce-scattered into the sharded fp32 main gradient and released
    # after that layer's backward (mfsdp_design.md, "During backward" / "Post-backward"); with
    # the next layer's gradient computed while one is reduced, two layers' worth are live.
    return np.where(zero == 2, 2 * x.layer_params_local * x.weight_b, 0.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class _StageMemory:
    """Bytes per GPU of one pipeline stage (first, a middle one, last), before the buffers and the
    framework, which every stage has alike."""

    params: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    entrypoint_activations: np.ndarray  # of the activations, what only dsorch's entrypoint keeps


@dataclass(frozen=True, kw_only=True, slots=True)
class _Memory:
    stack: MemoryStack
    entrypoint_activations: np.ndarray


def _loss_and_pipe_buffers(x: _Inputs) -> tuple[np.ndarray, np.ndarray]:
    """(Bytes of the loss's working set on the last stage, bytes of one micro-batch's stage output
    a pipeline stage keeps) per GPU."""
    model, pp, tp = x.model, x.pp, x.tp
    s, mbs, sp = x.s_local, x.micro_batch_size, x.sequence_parallel
    h, V = float(model.hidden_size), float(model.vocab_size)
    act_bytes = x.act_bytes
    # Loss working set per logit element on the last stage. Megatron-LM's vocab-parallel
    # cross-entropy works in place (core/tensor_parallel/cross_entropy.py: the fp32 copy of the
    # logits becomes exp, then softmax, then the gradient), so the 16-bit output plus one fp32
    # tensor: 2 + 4. PyTorch-side losses (dsorch's entrypoint, train/tensor_parallel.py
    # _VocabParallelCrossEntropy; torch's F.cross_entropy on upcast logits as FSDP runs use it)
    # hold the 16-bit logits, the fp32 copy, the shifted logits and exp at once: 2 + 3 x 4. The
    # published torchtitan peaks (Llama 3.1 8B, 2 x 8K tokens, 128K vocabulary) are matched by it.
    loss_bytes = (act_bytes + 4) if x.runtime == "megatron" else (act_bytes + 3 * 4)
    logits = s * mbs * V / tp * loss_bytes
    # Pipeline stage outputs: Megatron-LM frees each sent output and keeps only its autograd node
    # (deallocate_pipeline_outputs, always set for GPT: training/argument_utils.py), so nothing
    # beyond the layers' own saved tensors. DeepSpeed's pipeline engine keeps the output of every
    # in-flight micro-batch in its pipe buffers until that micro-batch's backward (pipe/engine.py
    # _exec_forward_pass: pipe_buffers['outputs']), 1/tp of it with pipe_partitioned.
    out_elems = np.where(sp | (x.runtime == "deepspeed"), s * mbs * h / tp, s * mbs * h)
    out_buf = np.where((x.runtime == "deepspeed") & (pp > 1), out_elems * act_bytes, 0.0)
    return logits, out_buf


def _memory(x: _Inputs) -> _Memory:
    """Bytes per GPU on the binding pipeline stage: the stage whose states and activations are
    largest."""
    model, training, tp, pp, vpp, gas, zero = x.model, x.training, x.tp, x.pp, x.vpp, x.grad_accum_steps, x.zero_stage
    layer = _layer_activations(x)
    logits, out_buf = _loss_and_pipe_buffers(x)

    # Transformer Engine keeps an FP8 copy of each layer weight and of its transpose across the
    # micro-batches of a step (Megatron passes is_first_microbatch, so the casts are cached).
    # With --fp8-param-gather that FP8 weight and its transpose are the only copy (the weight_b bytes
    # already counted): nothing on top.
    fp8_weights = 2.0 * x.layer_params_local if training.fp8 is not None and not training.fp8_param_gather else 0.0
    step_b = step_transient_bytes(x.runtime, training.precision, training.grad_reduce_in_fp32)

    def stage_memory(layers, moe_layers, params_local, experts_local, stage_index, extra_act, outputs=True):
        # The routed experts' states shard over the expert data-parallel group (Megatron's distributed
        # optimizer keeps an expert-dp buffer of its own: core/distributed/distributed_data_parallel.py
        # expert_data_parallel_group; DeepSpeed likewise for MoE parameters).
        w, g, o = model_state_bytes(params_local, x.dpc, zero, x.weight_b, x.grad_b, x.opt_b)
        ew, eg, eo = model_state_bytes(experts_local, x.edp, zero, x.weight_b, x.grad_b, x.opt_b)
        inflight = in_flight_micro_batches(pp, vpp, gas, stage_index)
        # Full recomputation of some layers only (recompute_layers): the others keep everything.
        full, rerun = x.recompute == RECOMPUTE_CODES["full"], x.full_recompute_share(layers)
        dense_kept = np.where(full, rerun * layer.saved + (1 - rerun) * layer.saved_none, layer.saved)
        moe_kept = np.where(full, rerun * layer.saved_moe + (1 - rerun) * layer.saved_moe_none, layer.saved_moe)
        kept = (layers - moe_layers) * dense_kept + moe_layers * moe_kept
        act = kept * inflight + layer.working + extra_act + (out_buf * inflight if outputs else 0.0)
        # The optimizer step's fp32 main-grad copy (runtimes/megatron.MAIN_GRAD_COPY), sharded like the
        # optimizer states, exists once the activations are freed: only what exceeds them adds.
        step = model_state_bytes(params_local, x.dpc, zero, 0.0, 0.0, step_b)[2]
        step = step + model_state_bytes(experts_local, x.edp, zero, 0.0, 0.0, step_b)[2]
        return _StageMemory(
            params=w + ew + layers * fp8_weights,
            grads=g + eg,
            optimizer=o + eo + np.maximum(0.0, step - act),
            activations=act,
            entrypoint_activations=layers * layer.saved_entrypoint * inflight + layer.working_entrypoint,
        )

    # The MTP modules on the last stage: a layer each, and the logits of their own predictions.
    mtp_layers = x.mtp
    mtp_moe = mtp_layers if model.moe is not None else 0.0
    last_logits = logits * (1.0 + mtp_layers) if mtp_layers else logits
    stages = (
        stage_memory(
            x.lf + np.where(pp == 1, mtp_layers, 0.0),
            x.moe_first + np.where(pp == 1, mtp_moe, 0.0),
            x.first_params,
            x.expert_first,
            0.0,
            np.where(pp == 1, last_logits, 0.0),
        ),
        stage_memory(x.lm, x.moe_middle, x.middle_params, x.expert_middle, np.minimum(1.0, pp - 1), 0.0),
        stage_memory(
            x.ll + mtp_layers, x.moe_last + mtp_moe, x.last_params, x.expert_last, pp - 1, last_logits, outputs=False
        ),
    )
    buffers = _comm_buffers(x)
    framework = np.full_like(tp, x.profile.memory_overhead_gib * GIB)

    totals = [st.params + st.grads + st.optimizer + st.activations for st in stages]
    which = np.argmax(np.stack(totals), axis=0)
    pick = lambda name: np.choose(which, [getattr(st, name) for st in stages])  # noqa: E731
    params_b, grads_b, opt_bytes, act_b = pick("params"), pick("grads"), pick("optimizer"), pick("activations")
    total = params_b + grads_b + opt_bytes + act_b + (framework + buffers)
    return _Memory(
        stack=MemoryStack(
            params=params_b,
            grads=grads_b,
            optimizer=opt_bytes,
            activations=act_b,
            comm_buffers=buffers,
            framework=framework,
            total=total,
        ),
        entrypoint_activations=pick("entrypoint_activations"),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _Work:
    """Seconds and FLOPs of some GEMMs (of one micro-batch on one GPU)."""

    seconds: np.ndarray
    flops: np.ndarray

    def __add__(self, other: _Work) -> _Work:
        return _Work(seconds=self.seconds + other.seconds, flops=self.flops + other.flops)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Roofline:
    """The rates a layout's work runs at: GEMM FLOPs at the peak of their precision x ``gemm``,
    bytes at HBM bandwidth x ``hbm``."""

    peak: float  # dense FLOP/s of the training precision
    flop_rate: np.ndarray  # 16-bit GEMMs
    layer_rate: np.ndarray  # the layers' linear GEMMs: FP8 where the training asks for it
    hbm: np.ndarray  # bytes/s
    act_bytes: float  # bytes of a 16-bit (or fp32) activation element
    fp8: bool
    grouped_rate: np.ndarray  # the experts' grouped GEMMs (FP8 where the layers' linears are)

    def gemm(self, m, n, k, count=1.0, *, linear: bool = False, grouped: bool = False) -> _Work:
        """``count`` GEMMs (m x k) @ (k x n): FLOPs at the GEMM rate plus operand and result bytes at
        the HBM rate. Symmetric in m, n, k, so the two backward GEMMs of a linear layer (dgrad,
        wgrad: the same three dimensions permuted) cost what its forward does. ``linear``: a
        layer's linear GEMM, in FP8 (1-byte operands) with training.fp8."""
        rate = self.grouped_rate if grouped else self.layer_rate if linear else self.flop_rate
        operand_bytes = 1.0 if (linear or grouped) and self.fp8 else self.act_bytes
        flops = 2.0 * m * n * k * count
        return _Work(seconds=flops / rate + (m * k + k * n + m * n) * operand_bytes * count / self.hbm, flops=flops)


def _roofline(x: _Inputs) -> _Roofline:
    peak = _peak_flops(x.profile, x.training.precision)
    flop_rate = peak * x.eff.gemm
    fp8 = x.training.fp8 is not None
    # The layers' linear GEMMs in FP8 (Transformer Engine's Linear modules, and the experts' grouped
    # GEMMs); attention (DotProductAttention without fp8_dpa), the output layer (Megatron-Core builds
    # it as a tensor-parallel linear outside the fp8 autocast of the layers) and the router stay in
    # bf16. An FP8 GEMM reaches ``fp8_gemm`` of the bf16 GEMM's fraction of peak.
    fp8_peak = fp8_peak_flops(x.profile)
    if fp8 and fp8_peak is None:  # rules.check_training refuses this before planning
        raise ValueError(f"training.fp8 needs gpu.peak_tflops.fp8 in profile '{x.profile.name}'")
    return _Roofline(
        peak=peak,
        flop_rate=flop_rate,
        layer_rate=fp8_peak * x.eff.gemm * x.eff.fp8_gemm if fp8 else flop_rate,
        hbm=x.profile.gpu.hbm_bandwidth_gbps * 1e9 * x.eff.hbm,
        act_bytes=float(x.act_bytes),
        fp8=fp8,
        grouped_rate=(fp8_peak * x.eff.fp8_gemm if fp8 else peak) * x.eff.grouped_gemm,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _Attention:
    """One layer's attention scores (QK^T, softmax, PV) per micro-batch."""

    forward: _Work
    backward: _Work
    # Seconds of the forward's memory-bound work on the scores; a scalar 0.0 with FlashAttention, which
    # keeps the scores on chip (it broadcasts against the other terms' arrays).
    elementwise: np.ndarray | float


def _attention(x: _Inputs, roof: _Roofline) -> _Attention:
    model, training = x.model, x.training
    s, s_local, mbs, e = float(training.seq_length), x.s_local, x.micro_batch_size, roof.act_bytes
    h, kv_dim, d_head = float(model.hidden_size), float(model.kv_heads) * float(model.head_dim), float(model.head_dim)
    heads_local = float(model.num_attention_heads) / x.tp
    if training.flash_attention:
        # FlashAttention: QK^T and PV of the causal half on chip; only Q, K, V, O cross HBM.
        # Backward recomputes S and runs 5 GEMMs to the forward's 2 (Dao 2023, Sec. 3.1.2).
        # With cp, each rank's s/cp queries against the whole sequence, the causal half of it on
        # every rank (the 2 x cp chunk assignment balances it).
        if model.mla is None and model.sliding_window is None:
            sc_flops_f = 0.5 * 4.0 * mbs * heads_local * s_local * s * d_head
        else:
            # QK^T over the query/key head width, PV over the value head width (MLA: 192 and 128 on
            # DeepSeek-V3); sliding-window layers see at most the window (window_fraction).
            dq, dv = float(model.head_dim), float(model.v_head_dim)
            sc_flops_f = 0.5 * 2.0 * mbs * heads_local * s_local * s * (dq + dv) * window_fraction(model, s)
        sc_bytes_f = s_local * mbs * (2 * h + 2 * kv_dim) / x.tp * e
        score_f = sc_flops_f / (roof.peak * x.eff.attention) + sc_bytes_f / roof.hbm
        return _Attention(
            forward=_Work(seconds=score_f, flops=sc_flops_f),
            backward=_Work(seconds=2.5 * score_f, flops=2.5 * sc_flops_f),
            elementwise=0.0,
        )
    # Batched per head: (s x d) @ (d x s) and (s x s) @ (s x d), full s x s computed.
    forward = roof.gemm(s, s, d_head, mbs * heads_local) + roof.gemm(s, d_head, s, mbs * heads_local)
    # Fused scale-mask-softmax reads and writes the scores; attention dropout reads them,
    # writes its output and a 1-byte mask (Korthikanti et al. 2022, Sec. 4.1).
    drop = (2 * e + 1) if training.attention_dropout > 0 else 0.0
    return _Attention(
        forward=forward,
        backward=_Work(seconds=2 * forward.seconds, flops=2 * forward.flops),
        elementwise=mbs * heads_local * s * s * (2 * e + drop) / roof.hbm,
    )


def _elementwise_forward(x: _Inputs, roof: _Roofline, f: float | np.ndarray | None = None) -> np.ndarray:
    """Seconds of a layer's forward element-wise work per micro-batch, at HBM bandwidth: bytes per
    token of two norms (read + write h), two residual adds (read 2h, write h), rotary on Q and K,
    the activation (GeLU reads and writes f, SwiGLU reads 2f and writes f), dropout masks. Norms and
    residuals are sharded by SP only. ``f``: the activation's width per token (a MoE layer's is
    top_k x the expert's plus the shared experts'), the model's ffn_hidden_size by default."""
    model, training, tp, e = x.model, x.training, x.tp, roof.act_bytes
    h = float(model.hidden_size)
    f = float(model.ffn_hidden_size) if f is None else f
    kv_dim = float(model.kv_heads) * float(model.head_dim)
    swiglu = model.gated
    replicated = (2 * 2 * h + 2 * 3 * h) * e + (2 * h if training.hidden_dropout > 0 else 0.0)
    rotary = 2 * (h + kv_dim) * e if model.position_embedding == "rope" else 0.0
    sharded = ((3 * f if swiglu else 2 * f) * e + rotary) / tp
    T = x.s_local * x.micro_batch_size
    return T * (np.where(x.sequence_parallel, replicated / tp, replicated) + sharded) / roof.hbm


# Bytes per element of Transformer Engine's FP8 quantization of a 16-bit tensor, per recipe: read it
# and write the row-wise and the column-wise (transposed, for dgrad and wgrad) FP8 copies, 2 + 1 + 1
# (Hopper's FP8 GEMMs take only TN operands; MXFP8's scales run along K, so both copies there too);
# current scaling ("tensorwise") first reads the tensor once more for its amax, since the scale must
# be known before any element is cast. Delayed scaling takes its scale from past steps and fuses
# the amax into the cast. Block scales (blockwise, mxfp8) are local to the block: one pass.
FP8_CAST_BYTES = {"delayed": 4.0, "tensorwise": 6.0, "blockwise": 4.0, "mxfp8": 4.0}
# ... of a LayerNorm/RMSNorm output that feeds a linear layer (TE LayerNormLinear): delayed scaling
# quantizes inside the norm kernel (csrc/extensions/normalization.cpp: Impl::FULLY_FUSED for
# Float8Quantizer), current scaling computes the amax in the norm and then casts
# (FUSED_NORM_AMAX_FP8), MXFP8 norms then casts (UNFUSED unless NVTE_NORM_FWD_USE_CUDNN).
FP8_NORM_CAST_BYTES = {"delayed": 0.0, "tensorwise": 4.0, "blockwise": 4.0, "mxfp8": 4.0}


def _fp8_casts(x: _Inputs, roof: _Roofline, norm_fed, cast) -> np.ndarray:
    """Seconds of one layer's FP8 quantizations per micro-batch, forward and backward, as a third
    (the layer charges its forward element-wise work three times: forward, twice backward).
    ``norm_fed``: widths per token of the linear inputs a norm produces; ``cast``: of the other
    quantized tensors (the remaining linear inputs forward, the output gradients backward)."""
    recipe = x.training.fp8_recipe
    per_token = norm_fed * FP8_NORM_CAST_BYTES[recipe] + cast * FP8_CAST_BYTES[recipe]
    return x.s_local * x.micro_batch_size * per_token / 3.0 / roof.hbm


def _fp8_layer_casts(x: _Inputs, roof: _Roofline) -> tuple[np.ndarray, np.ndarray]:
    """A dense layer's and a MoE layer's FP8 quantizations (``_fp8_casts``), on the widths Megatron-
    Core's TE layers quantize per token: the QKV and FC1 inputs from their fused norms (sequence-
    sharded with SP, before the FP8 all-gather), the output projection's and FC2's inputs, and the
    four output gradients (column-parallel ones head-sharded, row-parallel ones sequence-sharded).
    A MoE layer's pre-MLP norm is its own module (TENorm): its experts quantize the dispatched token
    copies (top_k per token), their FC2 inputs and both output gradients."""
    if x.training.fp8 is None:
        return 0.0 * x.tp, 0.0 * x.tp
    model, tp = x.model, x.tp
    h, f = float(model.hidden_size), float(model.ffn_hidden_size)
    q_dim = float(model.num_attention_heads) * float(model.head_dim)
    kv_dim = float(model.kv_heads) * float(model.head_dim)
    h_in = np.where(x.sequence_parallel, h / tp, h)
    attention = q_dim / tp + (q_dim + 2 * kv_dim) / tp + h_in
    fc1_out = 2 * f if model.gated else f
    dense = _fp8_casts(x, roof, 2 * h_in, attention + f / tp + fc1_out / tp + h_in)
    moe = model.moe
    if moe is None:
        return dense, dense
    k = float(moe.top_k) * x.training.moe_load_imbalance
    f_e = float(moe.ffn_hidden_size) / x.etp
    experts = k * (2 * h + f_e + (2 * f_e if model.gated else f_e))
    shared = float(moe.shared_ffn) / tp
    shared_casts = h_in + shared + (2 * shared if model.gated else shared) + h_in if moe.shared_experts else 0.0
    return dense, _fp8_casts(x, roof, h_in, attention + experts + shared_casts)


def _attention_gemms(x: _Inputs, roof: _Roofline, T) -> tuple[_Work, _Work]:
    """One layer's attention projections per micro-batch: the column-parallel ones (QKV; MLA's down
    and up projections) and the row-parallel output projection, the two GEMMs of its TP block."""
    model, tp = x.model, x.tp
    h = float(model.hidden_size)
    a = float(model.num_attention_heads)
    if model.mla is not None:
        # DeepSeek-V2 Sec. 2.1: down-projections to the latents (replicated over tp in Megatron-Core's
        # MLASelfAttention), up-projections to the heads (column parallel), output (row parallel).
        m = model.mla
        dq, dv = float(m.qk_head_dim), float(m.v_head_dim)
        work = roof.gemm(T, m.kv_lora_rank + m.qk_rope_head_dim, h, linear=True)
        work = work + roof.gemm(T, a * (m.qk_nope_head_dim + dv) / tp, m.kv_lora_rank, linear=True)
        if m.q_lora_rank is None:
            work = work + roof.gemm(T, a * dq / tp, h, linear=True)
        else:
            work = work + roof.gemm(T, m.q_lora_rank, h, linear=True)
            work = work + roof.gemm(T, a * dq / tp, m.q_lora_rank, linear=True)
        return work, roof.gemm(T, h, a * dv / tp, linear=True)
    kv_dim = float(model.kv_heads) * float(model.head_dim)
    q_dim = a * float(model.head_dim)
    return roof.gemm(T, (q_dim + 2 * kv_dim) / tp, h, linear=True), roof.gemm(T, h, q_dim / tp, linear=True)


def _mlp_gemms(x: _Inputs, roof: _Roofline, T, f: float) -> tuple[_Work, _Work]:
    """A (gated) MLP of intermediate size f split over tp: up (+gate) column parallel, down row parallel."""
    h = float(x.model.hidden_size)
    return roof.gemm(T, (2 * f if x.model.gated else f) / x.tp, h, linear=True), roof.gemm(T, h, f / x.tp, linear=True)


# cuBLAS launch and tail per GEMM when a rank's experts run one after another (Megatron-Core's
# SequentialMLP, without --moe-grouped-gemm): 3 GEMMs per expert forward, 6 backward.
SEQUENTIAL_GEMM_OVERHEAD_S = 5e-6


def _moe_work(x: _Inputs, roof: _Roofline, T) -> tuple[_Work, np.ndarray]:
    """One MoE layer's feed-forward per micro-batch on one GPU (forward GEMMs; element-wise seconds):
    the router (h x E, on the tokens that enter this GPU), the shared experts as a dense MLP, and the
    E/ep local experts on their routed tokens as one grouped GEMM (Megatron-Core --moe-grouped-gemm;
    Shazeer et al. 2017's experts, tokens permuted so each expert's are contiguous) at the grouped
    rate. Expert FLOPs follow the active parameters: top_k experts per token."""
    model, training = x.model, x.training
    moe = model.moe
    assert moe is not None
    h, e = float(model.hidden_size), roof.act_bytes
    r, t_in = x.routed, x.router_tokens
    local = float(moe.num_experts) / x.ep
    per_expert = r * x.etp / local  # tokens each local expert processes (etp ranks gather theirs)
    f_e = float(moe.ffn_hidden_size) / x.etp
    experts = roof.gemm(per_expert, 2 * f_e if model.gated else f_e, h, local, grouped=True)
    experts = experts + roof.gemm(per_expert, h, f_e, local, grouped=True)
    if not training.moe_grouped_gemm:
        experts = _Work(seconds=experts.seconds + 3 * local * SEQUENTIAL_GEMM_OVERHEAD_S, flops=experts.flops)
    work = roof.gemm(t_in, float(moe.num_experts), h) + experts
    if moe.shared_experts:
        up, down = _mlp_gemms(x, roof, T, float(moe.shared_ffn))
        work = work + up + down
    # Permute into expert order and back, and the weighted combine: read and write h per copy, twice.
    permute = 4.0 * r * x.etp * h * e / roof.hbm
    f_act = float(moe.top_k) * training.moe_load_imbalance * float(moe.ffn_hidden_size) + float(moe.shared_ffn)
    return work, _elementwise_forward(x, roof, f_act) + permute


@dataclass(frozen=True, kw_only=True, slots=True)
class _Compute:
    per_micro_batch: np.ndarray  # seconds of the slowest stage
    per_step: np.ndarray
    flops_step: np.ndarray  # FLOPs of that stage per step, for the at-peak bound
    attention_forward_mb: np.ndarray  # seconds of one layer's attention per micro-batch, forward
    attention_backward_mb: np.ndarray  # ... and backward
    moe_layer_mb: np.ndarray  # seconds of one MoE layer per micro-batch, forward and backward (0: dense)
    moe_layers_stage: np.ndarray  # MoE layers of the slowest stage (MTP modules included)
    # A layer's TP blocks (attention; MLP, or a MoE layer's shared experts): the forward seconds of
    # each block's column-parallel and row-parallel GEMMs, which its TP collectives pair with.
    tp_blocks: tuple[tuple[np.ndarray, np.ndarray], ...]
    tp_blocks_moe: tuple[tuple[np.ndarray, np.ndarray], ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class _LayerTime:
    seconds: np.ndarray  # forward, backward and recomputation of one layer and micro-batch
    flops: np.ndarray


def _layer_time(
    x: _Inputs, roof: _Roofline, att: _Attention, gemms: _Work, elem_f, op: _Work | None, rc=None
) -> _LayerTime:
    """A layer's forward, backward (twice the forward's GEMMs and element-wise traffic) and what its
    recompute level (the layout's, or ``rc``) runs again."""
    rc = x.recompute if rc is None else rc
    layer_f = gemms.seconds + att.forward.seconds + elem_f
    layer_b = 2 * gemms.seconds + att.backward.seconds + 2 * elem_f
    full_rc, sel_rc, op_rc = rc == 2, rc == 1, rc == RC_TORCHTITAN_OP
    op_s = op.seconds + elem_f if op is not None else layer_f
    op_flops = op.flops if op is not None else gemms.flops + att.forward.flops
    layer_rc = np.where(
        full_rc,
        layer_f,
        np.where(sel_rc, att.forward.seconds + att.elementwise, np.where(op_rc, op_s, 0.0)),
    )
    sc_flops_f = att.forward.flops
    flops = (
        3 * gemms.flops
        + sc_flops_f
        + att.backward.flops
        + np.where(full_rc, gemms.flops + sc_flops_f, np.where(sel_rc, sc_flops_f, np.where(op_rc, op_flops, 0.0)))
    )
    return _LayerTime(seconds=layer_f + layer_b + layer_rc, flops=flops)


def _tp_blocks(x: _Inputs, roof: _Roofline, T, attn: tuple[_Work, _Work], mlp: tuple[_Work, _Work]):
    """The (column-parallel, row-parallel) GEMM pairs of a dense layer and of a MoE layer, in seconds,
    that Transformer Engine's userbuffers pair TP collectives with (``_ub_exposed``): attention's and
    the MLP's; a MoE layer's routed experts need no TP collective, its shared experts do."""
    blocks = ((attn[0].seconds, attn[1].seconds), (mlp[0].seconds, mlp[1].seconds))
    moe_blocks: tuple[tuple[np.ndarray, np.ndarray], ...] = blocks[:1]
    if x.model.moe is not None and x.model.moe.shared_experts:
        s_up, s_down = _mlp_gemms(x, roof, T, float(x.model.moe.shared_ffn))
        moe_blocks = (blocks[0], (s_up.seconds, s_down.seconds))
    return blocks, moe_blocks


def _compute(x: _Inputs) -> _Compute:
    """GEMMs, attention and element-wise work of the slowest stage."""
    model, tp, gas = x.model, x.tp, x.grad_accum_steps
    h, f, V = float(model.hidden_size), float(model.ffn_hidden_size), float(model.vocab_size)
    kv_dim = float(model.kv_heads) * float(model.head_dim)
    roof = _roofline(x)
    T = x.s_local * x.micro_batch_size  # tokens per micro-batch on this rank
    attn_pair = _attention_gemms(x, roof, T)  # (column-parallel, row-parallel)
    attn = attn_pair[0] + attn_pair[1]
    att = _attention(x, roof)
    fp8_dense, fp8_moe = _fp8_layer_casts(x, roof)
    elem_f = _elementwise_forward(x, roof) + att.elementwise + fp8_dense
    # torchtitan's op SAC counts the mms of each layer and recomputes every second one (wk, wo and
    # the MLP's w3 in Llama's order wq, wk, wv, wo, w1, w3, w2) and every non-mm op; attention
    # (SDPA) is saved.
    op = roof.gemm(T, kv_dim / tp, h) + roof.gemm(T, h, h / tp, linear=True) + roof.gemm(T, f / tp, h)
    up, down = _mlp_gemms(x, roof, T, f)
    kept = np.zeros_like(x.recompute)  # the layers full recomputation leaves out (recompute_layers)
    dense = _layer_time(x, roof, att, attn + up + down, elem_f, op)
    dense_kept = _layer_time(x, roof, att, attn + up + down, elem_f, op, kept)
    blocks, moe_blocks = _tp_blocks(x, roof, T, attn_pair, (up, down))
    if model.moe is not None:
        moe_gemms, moe_elem = _moe_work(x, roof, T)
        moe_elem = moe_elem + att.elementwise + fp8_moe
        moe = _layer_time(x, roof, att, attn + moe_gemms, moe_elem, None)
        moe_kept = _layer_time(x, roof, att, attn + moe_gemms, moe_elem, None, kept)
        host = 0.0 if x.eng.moe_cuda_graphs else x.eff.moe_layer_us * 1e-6
        moe = _LayerTime(seconds=moe.seconds + host, flops=moe.flops)
        moe_kept = _LayerTime(seconds=moe_kept.seconds + host, flops=moe_kept.flops)
    else:
        moe = moe_kept = _LayerTime(seconds=np.zeros_like(tp), flops=np.zeros_like(tp))
    # Logits on the last stage (vocab-parallel): one GEMM three times, and the fused cross-entropy
    # reading the 16-bit logits and writing fp32 softmax and its gradient.
    logit = roof.gemm(T, V / tp, h)
    logit_time_mb = 3 * logit.seconds + T * V / tp * (roof.act_bytes + 3 * 4) / roof.hbm
    # The MTP modules (last stage): a layer of the model's kind, the 2h -> h projection, and logits.
    kind = moe if model.moe is not None else dense
    proj = roof.gemm(T, h / tp, 2 * h, linear=True)
    mtp_s = x.mtp * (kind.seconds + 3 * proj.seconds + logit_time_mb)
    mtp_flops = x.mtp * (kind.flops + 3 * proj.flops + 3 * logit.flops)

    def stage(layers, moe_layers):
        # Full recomputation of the first recompute_layers of each virtual stage only: the rest run
        # as without recomputation.
        rerun = np.where(x.recompute == RECOMPUTE_CODES["full"], x.full_recompute_share(layers), 1.0)
        d_s, d_fl = (
            rerun * a + (1 - rerun) * b
            for a, b in ((dense.seconds, dense_kept.seconds), (dense.flops, dense_kept.flops))
        )
        m_s, m_fl = (
            rerun * a + (1 - rerun) * b for a, b in ((moe.seconds, moe_kept.seconds), (moe.flops, moe_kept.flops))
        )
        return (layers - moe_layers) * d_s + moe_layers * m_s, (layers - moe_layers) * d_fl + moe_layers * m_fl

    (f_s, f_fl), (m_s, m_fl), (l_s, l_fl) = (
        stage(x.lf, x.moe_first),
        stage(x.lm, x.moe_middle),
        stage(x.ll, x.moe_last),
    )
    pp1 = x.pp == 1
    if model.mtp_layers:
        f_s, f_fl = f_s + np.where(pp1, mtp_s, 0.0), f_fl + np.where(pp1, mtp_flops, 0.0)
        l_s, l_fl = l_s + mtp_s, l_fl + mtp_flops
    compute_mb = np.maximum(m_s, np.maximum(f_s, l_s + logit_time_mb))
    flops_step = gas * np.maximum(np.maximum(m_fl, f_fl), l_fl + 3 * logit.flops)
    slowest = np.argmax(np.stack([f_s, m_s, l_s + logit_time_mb]), axis=0)
    mtp_moe = x.mtp if model.moe is not None else 0.0
    moe_stage = np.choose(slowest, [x.moe_first + np.where(pp1, mtp_moe, 0.0), x.moe_middle, x.moe_last + mtp_moe])
    return _Compute(
        per_micro_batch=compute_mb,
        per_step=gas * compute_mb,
        flops_step=flops_step,
        attention_forward_mb=att.forward.seconds,
        attention_backward_mb=att.backward.seconds,
        moe_layer_mb=moe.seconds,
        moe_layers_stage=moe_stage,
        tp_blocks=blocks,
        tp_blocks_moe=moe_blocks,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _Links:
    """One GPU's share of the two fabrics: bytes/s in one direction, and seconds of latency."""

    nvlink: np.ndarray
    nvlink_latency: float
    ib: np.ndarray  # its share of the node's NICs
    ib_latency: float


def _links(x: _Inputs) -> _Links:
    profile, eff = x.profile, x.eff
    g = profile.gpus_per_node
    return _Links(
        nvlink=profile.intra_node.bandwidth_gbps * 1e9 / 2 * eff.intra_node_comm,  # one direction
        nvlink_latency=profile.intra_node.latency_us * 1e-6,
        ib=(profile.inter_node.bandwidth_gbps / 8 * 1e9 * profile.inter_node.nics_per_node / g * eff.inter_node_comm),
        ib_latency=profile.inter_node.latency_us * 1e-6,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _Overlapped:
    exposed: np.ndarray  # what the step waits for
    total: np.ndarray  # before the engine overlaps any of it with compute


def _tp_comm_mb(x: _Inputs, links: _Links, comp: _Compute) -> _Overlapped:
    """Tensor-parallel collectives of the largest stage, per micro-batch. A MoE layer keeps the
    attention's two (forward and backward) and the shared experts' two; its routed experts need none
    on Megatron-Core (the all-to-all moves their tokens: ``_ep_comm``), while dsorch's entrypoint,
    whose experts are split over tp like its dense MLP, all-reduces their output, top_k copies per token."""
    T = x.s_local * x.micro_batch_size
    rerun = x.full_recompute_share(x.stage_layers)  # full recomputation's share of the stage's layers
    n_coll = 4 + 2 * rerun
    one = _ring_time(T * float(x.model.hidden_size) * float(x.act_bytes), x.tp, links.nvlink, links.nvlink_latency, 2.0)
    tp_layer_mb = n_coll * one
    tp_total_mb = x.stage_layers * tp_layer_mb
    moe = x.model.moe
    moe_layers = comp.moe_layers_stage if moe is not None else 0.0
    if moe is not None:
        per_pass = 1.0 + (1.0 if moe.shared_experts else 0.0)
        if x.runtime == "deepspeed":
            per_pass = per_pass + float(moe.top_k) * x.training.moe_load_imbalance
        moe_layer_mb = 2 * per_pass * (1.0 + rerun / 2.0) * one
        tp_total_mb = (x.stage_layers - moe_layers) * tp_layer_mb + moe_layers * moe_layer_mb
    # --tp-comm-overlap needs sequence parallelism (validate_args): only there do the userbuffers run.
    ub = x.sequence_parallel & x.eng.tp_overlap & (x.tp > 1)
    overlapped = (x.stage_layers - moe_layers) * _ub_exposed(x, links, comp.tp_blocks)
    overlapped = overlapped + moe_layers * _ub_exposed(x, links, comp.tp_blocks_moe)
    return _Overlapped(exposed=np.where(ub, overlapped, tp_total_mb), total=tp_total_mb)


def _ub_exposed(x: _Inputs, links: _Links, blocks) -> np.ndarray:
    """Exposed seconds of one layer's TP collectives per micro-batch under Transformer Engine's
    userbuffers, each paired with the GEMM TE overlaps it with (module/base.py initialize_ub, its
    default methods @ TE d0067d0). Per TP block (column-parallel GEMM, then row-parallel GEMM):
      forward   all-gather of the input by ring exchange, chunk by chunk inside the column GEMM
                (qkv_fprop, fc1_fprop: num_splits = tp, the local chunk's GEMM runs last uncovered);
                reduce-scatter of the output pipelined with the row GEMM in 4 splits (proj_fprop,
                fc2_fprop "pipeline": the last split's reduce-scatter follows the GEMM);
      backward  all-gather of the output gradient by ring exchange inside the row dgrad GEMM
                (proj_dgrad, fc2_dgrad; the row wgrad reuses it, "external"); all-gather of the saved
                input shard behind the column dgrad GEMM and reduce-scatter of the input gradient
                behind the column wgrad GEMM (qkv/fc1 dgrad and wgrad, "bulk").
    All-gather buffers are FP8 under an FP8 recipe (fp8_buf: layers_all_gather_overlap), the
    reduce-scatters 16-bit. A collective is exposed by what exceeds ``tp_overlap`` x its GEMM's
    time (the GEMM loses the 16 SMs pipeline and bulk overlaps take, num_sm, and a chunk's copy
    waits for its GEMM); each ring step keeps its latency. Full recompute repeats the forward."""
    T, h, tp, eta = x.s_local * x.micro_batch_size, float(x.model.hidden_size), x.tp, x.eff.tp_overlap
    ag_bytes = 1.0 if x.training.fp8 is not None else float(x.act_bytes)
    ag = _ring_time(T * h * ag_bytes, tp, links.nvlink, links.nvlink_latency, 1.0)
    rs = _ring_time(T * h * float(x.act_bytes), tp, links.nvlink, links.nvlink_latency, 1.0)
    ring_part = (tp - 1) / tp
    out = np.zeros_like(tp)
    for col, row in blocks:
        forward = np.maximum(0.0, ag - eta * ring_part * col) + rs / 4 + 0.75 * np.maximum(0.0, rs - eta * row)
        backward = (
            np.maximum(0.0, ag - eta * ring_part * row)
            + np.maximum(0.0, ag - eta * col)
            + np.maximum(0.0, rs - eta * col)
        )
        out = out + forward * (1.0 + x.full_recompute_share(x.stage_layers)) + backward
    return out


def _pp_comm(x: _Inputs, links: _Links) -> np.ndarray:
    """Pipeline point-to-point: neighbouring stages are tp*cp*dp ranks apart (Megatron's rank order
    tp-cp-dp-pp, parallel_state.py), so they sit on different nodes once that reaches a node."""
    profile, eng, tp, pp, vpp = x.profile, x.eng, x.tp, x.pp, x.vpp
    T, h, e = x.s_local * x.micro_batch_size, float(x.model.hidden_size), float(x.act_bytes)
    domain = profile.nvlink_domain
    cross = (tp * x.dpc >= domain) & (profile.world_size > domain)
    p2p_bw = np.where(cross, links.ib, links.nvlink)
    p2p_lat = np.where(cross, links.ib_latency, links.nvlink_latency)
    p2p_bytes = np.where(x.sequence_parallel | eng.p2p_scatter_gather, T * h / tp, T * h) * e
    if x.runtime == "deepspeed":
        return np.where(pp > 1, _deepspeed_pipe(x, links, p2p_bytes, p2p_bw, p2p_lat), 0.0)
    # Overlapped sends (interleaved schedule) hide behind the other direction's chunks in the steady
    # 1F1B phase only. In the warm-up (forward chunks only) and the cool-down (backward only) a chunk's
    # input comes back round the pp stages a lap later, after pp sends, while the stage has just pp
    # chunks of work: one send per chunk waits. Warm-up chunks of the first stage (Megatron-Core
    # schedules.py get_pp_rank_microbatches): 2 (pp - 1) + (vpp - 1) x pp, at most all gas x vpp.
    warmup = np.minimum(x.grad_accum_steps * vpp, 2 * (pp - 1) + (vpp - 1) * pp)
    sends = np.where(eng.p2p_overlap & (vpp > 1), warmup, x.grad_accum_steps * vpp + pp - 1)
    return np.where(pp > 1, 2 * sends * (p2p_bytes / p2p_bw + p2p_lat), 0.0)


def _deepspeed_pipe(x: _Inputs, links: _Links, p2p_bytes, p2p_bw, p2p_lat) -> np.ndarray:
    """What DeepSpeed's PipelineEngine adds to the compute and the bubble per step, as its
    TrainSchedule runs (costmodel/pipe_schedule.py, DeepSpeed 0.19 runtime/pipe/engine.py):

    * blocking point-to-point: ``exposed_transfers(pp, m)`` transfers on the critical path, each
      the message (b*s*h/t: pipe_partitioned sends each tp rank's slice, SP's output is already
      one; a small meta tensor goes first with pipe_partitioned: _exec_send_activations sends every
      element of the tuple) and one latency per message;
    * per micro-batch on the busiest stage (so ``m + pp - 1`` times, like the compute): the TP
      all-gathers that rebuild partitioned activations and gradients (``partition_gathers``) over
      NVLink, and the two copies of the received activation (_exec_recv_activations clones the
      buffer, _exec_forward_pass clones its inputs), read and written at HBM bandwidth;
    * after the flush: the tied embedding's gradient all-reduced between the first and the last
      stage (_exec_reduce_tied_grads; fp32 under the BF16 optimizer, whose ``_hp_grad`` it reduces),
      and the three scalar collectives every stage waits for: the gradient norm over the
      model-parallel group (the ZeRO optimizer's ``_model_parallel_all_reduce``), the loss over the
      data-parallel group and its broadcast over the pipe (_aggregate_total_loss), latency only.

    The data-parallel reduction after the flush is ``_dp_comm``'s (not overlapped: ReduceGrads is
    an instruction of its own after the last backward, the engine's ``dp_overlap_with_pp`` false)."""
    tp, pp, m = x.tp, x.pp, x.grad_accum_steps
    T, h, e = x.s_local * x.micro_batch_size, float(x.model.hidden_size), float(x.act_bytes)
    partitioned = (tp > 1) & ~x.sequence_parallel
    transfer = p2p_bytes / p2p_bw + np.where(partitioned, 2.0, 1.0) * p2p_lat
    hbm = x.profile.gpu.hbm_bandwidth_gbps * 1e9 * x.eff.hbm
    gather = _ring_time(T * h * e, tp, links.nvlink, links.nvlink_latency, 1.0)
    per_mb = np.where(partitioned, partition_gathers(pp) * gather, 0.0) + 2 * 2 * p2p_bytes / hbm
    domain = x.profile.nvlink_domain
    far = (tp * x.dpc * (pp - 1) >= domain) & (x.profile.world_size > domain)
    tied = 0.0
    if x.model.tied_embeddings:
        grad_b = np.where(_bf16_optimizer(x), x.grad_b, x.comm_grad_b)
        nbytes = float(x.model.vocab_size) * h / tp * grad_b
        tied = _ring_time(
            nbytes,
            2.0,
            np.where(far, links.ib, links.nvlink),
            np.where(far, links.ib_latency, links.nvlink_latency),
            2.0,
        )
    hops = lambda n: np.ceil(np.log2(np.maximum(n, 1.0)))  # noqa: E731  (a tree of scalars)
    scalars = (2 * hops(pp * tp) + 2 * hops(x.dpc) + hops(pp)) * np.where(far, links.ib_latency, links.nvlink_latency)
    return exposed_transfers(pp, m) * transfer + (m + pp - 1) * per_mb + tied + scalars


def _sharded_collectives(x: _Inputs, links: _Links, params, group, stride) -> np.ndarray:
    """Seconds per step of the data-parallel collectives of ``params`` parameters (per GPU) reduced
    over ``group`` ranks that stand ``stride`` ranks apart, as the layout's ZeRO stage runs them. The
    group's members in one NVLink domain (a node, or an NVL72 rack) talk over NVLink, the rest across
    domains (hierarchical collective, see _hierarchical_time)."""
    profile, gas, zero = x.profile, x.grad_accum_steps, x.zero_stage
    g = profile.nvlink_domain
    per_node = np.maximum(1.0, np.floor(g / stride))
    in_node = np.minimum(group, per_node)
    one_node = (profile.world_size == g) | (stride * group <= g)
    k = np.where(one_node, group, in_node)

    def coll(nbytes, factor, buckets):
        t = _hierarchical_time(nbytes, group, k, links.nvlink, links.nvlink_latency, links.ib, links.ib_latency, factor)
        # One latency chain per bucket (DeepSpeed reduce_bucket_size, Megatron's DDP buckets).
        lat = np.where(one_node, links.nvlink_latency, links.ib_latency) * factor * np.maximum(group - 1, 0.0)
        return t + np.maximum(buckets - 1, 0.0) * np.where(group > 1, lat, 0.0)

    # Megatron sizes its buckets by the dp-cp group (training.py resolve_ddp_bucket_size).
    bucket_elems = (
        ZERO_BUCKET_ELEMENTS
        if x.runtime == "deepspeed"
        else np.maximum(MEGATRON_BUCKET_ELEMENTS, MEGATRON_BUCKET_PER_DP * group)
    )
    buckets = np.ceil(params / bucket_elems)
    grad_bytes = params * x.comm_grad_b
    weight_bytes = params * x.weight_b
    allreduce = coll(grad_bytes, 2.0, buckets)
    rs = coll(grad_bytes, 1.0, buckets)
    ag = coll(weight_bytes, 1.0, buckets)
    # ZeRO-1/2 (and Megatron's distributed optimizer): reduce-scatter gradients, all-gather updated
    # 16-bit weights. DeepSpeed's ZeRO-2 reduces every micro-batch (the gradients are partitioned
    # during each backward pass). ZeRO-3 gathers weights for forward and backward and
    # reduce-scatters gradients, every micro-batch.
    zero3_per_mb = 2 * ag + rs
    return np.select(
        [zero == 0, _bf16_optimizer(x), zero == 1, zero == 2, zero == 3],
        [allreduce, allreduce + ag, rs + ag, gas * rs + ag, gas * zero3_per_mb],
    )


def _bf16_optimizer(x: _Inputs) -> np.ndarray:
    """DeepSpeed's BF16_Optimizer (bf16 with fp32 accumulation at ZeRO-1) all-reduces its whole
    gradient buffer after the last micro-batch (engine.py buffered_allreduce_fallback), not
    overlapped, then all-gathers the updated bf16 weights (bf16_optimizer.py)."""
    return (x.runtime == "deepspeed") & (x.training.precision == "bf16") & (x.zero_stage == 1)


def _dp_comm(x: _Inputs, links: _Links, comp: _Compute) -> _Overlapped:
    """Data-parallel collectives per step. A DP group strides over tp ranks; with cp the group is
    dp x cp ranks (the weights are replicated over the cp ranks), still strided by tp. The routed
    experts' gradients reduce over their expert data-parallel group instead, edp ranks etp x ep apart
    (Megatron-Core's expert rank order etp-ep-edp-pp; the entrypoint's expert groups likewise), in
    the same way and with the same overlap."""
    eff, eng = x.eff, x.eng
    pp, gas, zero = x.pp, x.grad_accum_steps, x.zero_stage
    dp_total = _sharded_collectives(x, links, x.params_stage, x.dpc, x.tp)
    if x.model.moe is not None:
        experts = _sharded_collectives(x, links, x.expert_stage, x.edp, x.ep * x.etp)
        dp_total = dp_total + np.where(x.expert_stage > 0, experts, 0.0)
    # What can hide it: the gradient reduction overlaps the last micro-batch's backward (2/3 of its
    # compute: DeepSpeed overlap_comm, Megatron --overlap-grad-reduce, which reduces only on the
    # last micro-batch); the weight all-gather overlaps the first forward (1/3) with Megatron's
    # --overlap-param-gather; DeepSpeed's ZeRO-2 reduces during every backward pass and ZeRO-3
    # prefetches over the whole step.
    compute, compute_mb = comp.per_step, comp.per_micro_batch
    can_overlap = eng.dp_overlap & ((pp == 1) | eng.dp_overlap_with_pp) & ~_bf16_optimizer(x)
    window = np.where(
        zero == 3,
        compute,
        np.where(
            zero == 2,
            compute * 2.0 / 3.0,
            compute_mb * (2.0 / 3.0 + np.where((zero == 1) & eng.param_gather_overlap, 1.0 / 3.0, 0.0)),
        ),
    )
    hide = np.where(can_overlap, window * eff.dp_overlap, 0.0)
    # ZeRO-3 / FSDP: every layer's weight all-gather (forward, backward) and gradient reduce-scatter
    # is its own collective per micro-batch, issued from the host between layers; what no bandwidth
    # term gives (launch, stream waits, FSDP's rate limiter) is a fitted stall per collective
    # (calibration.yaml, engine deepspeed-zero3, fitted to the published FSDP runs).
    stall = np.where(zero == 3, gas * x.stage_layers * 3.0 * eff.zero3_stall_us * 1e-6, 0.0)
    return _Overlapped(exposed=np.maximum(0.0, dp_total - hide) + stall, total=dp_total + stall)


# Host work of one step of Transformer Engine's context-parallel attention beyond the attention
# kernel itself: the step's correction kernel (softmax LSE and output), batch_isend_irecv's NCCL
# group launch and the wait on the other stream's event (context_parallel.py
# AttnFuncWithCPAndKVP2P.forward: two flash_attn_streams alternate, each step waits for the
# previous step's receive). Three launches at the per-kernel cost of SEQUENTIAL_GEMM_OVERHEAD_S;
# not fitted (the allowed published runs hold no bf16 dense run with cp > 1).
CP_STEP_OVERHEAD_S = 3 * SEQUENTIAL_GEMM_OVERHEAD_S


@dataclass(frozen=True, kw_only=True, slots=True)
class _CpPass:
    """Exposed seconds of one layer's context-parallel exchange per micro-batch: each forward pass of
    the attention (run again by recomputation) and the backward pass."""

    forward: np.ndarray
    backward: np.ndarray


def _cp_p2p(x: _Inputs, comp: _Compute, cp, kv_b, q_b, o_b, one_way, hbm) -> _CpPass:
    """cp_comm_type p2p (AttnFuncWithCPAndKVP2P): cp steps each way, every step the attention of this
    rank's queries against one rank's K and V chunk. The load-balanced causal split (each rank holds
    chunks i and 2cp-1-i of 2cp: get_batch_on_this_cp_rank) gives every step the same work (the
    diagonal step, and half of Q or of KV on the others), so a step is 1/cp of the layer's attention.
    Forward: steps 0..cp-2 send this KV chunk on while the step computes; the next step waits for it.
    Backward: step 0 sends KV, the middle steps KV and the dK/dV accumulated so far, the last dK/dV
    only, each overlapped with that step's backward block. Exposed: what a step's transfer takes
    beyond its block, the step's launches (CP_STEP_OVERHEAD_S), and the traffic the split adds at HBM
    bandwidth: every further step reads Q and writes a partial output (forward; Q, O, dO read and a
    partial dQ written backward), which the fp32 output correction reads back into its accumulator
    (read partial, read and write fp32 accumulator per step), and dQ, dK, dV accumulate per step.
    ``cp``: the ring's ranks (all of cp, or the outer level of a2a+p2p)."""
    block_f, block_b = comp.attention_forward_mb / cp, comp.attention_backward_mb / cp
    o_elems = o_b / float(x.act_bytes)
    forward = (
        (cp - 1) * np.maximum(0.0, one_way(kv_b) - block_f)
        + cp * CP_STEP_OVERHEAD_S
        + ((cp - 1) * (q_b + o_b) + cp * o_elems * (x.act_bytes + 8.0)) / hbm
    )
    backward = (
        2 * np.maximum(0.0, one_way(kv_b) - block_b)
        + np.maximum(cp - 2, 0.0) * np.maximum(0.0, one_way(2 * kv_b) - block_b)
        + cp * CP_STEP_OVERHEAD_S
        + ((cp - 1) * (2 * q_b + 2 * o_b) + cp * 3 * (q_b + kv_b)) / hbm
    )
    return _CpPass(forward=forward, backward=backward)


def _cp_a2a(n, kv_b, q_b, o_b, bw, lat, hbm) -> _CpPass:
    """cp_comm_type a2a (AttnFuncWithCPAndQKVOA2A, DeepSpeed-Ulysses): all-to-alls of Q, K and V
    before the attention (heads scattered, the sequence gathered) and of the output after it;
    backward, of dO before and of dQ, dK, dV after (flash_attn_a2a_communicate). Each rank keeps
    1/cp of what it holds and sends the rest; nothing overlaps the attention, which runs once on the
    whole sequence with a/cp heads (no shorter blocks). Each all-to-all's input is reordered into and
    out of the chunk order (reorder_seq_chunks_for_a2a_*: read and write at HBM). ``n``: the group's
    ranks (all of cp, or the inner level of a2a+p2p)."""
    share = (n - 1) / n
    moved = q_b + kv_b + o_b
    one_pass = share * moved / bw + 4 * lat + 2 * moved / hbm
    return _CpPass(forward=one_pass, backward=one_pass)


def _cp_all_gather(x: _Inputs, kv_b, bw, lat, hbm) -> _CpPass:
    """cp_comm_type all_gather (AttnFuncWithCPAndKVAllGather, Llama 3 paper Sec. 3.3.2): K and V
    all-gathered before the attention, exposed ("KV all-gather between CP ranks is exposed"), then
    reordered to sequence order (index_select: read and write the gathered K, V); the attention of
    this rank's two chunks as two steps. Backward gathers K and V again and reduce-scatters dK, dV."""
    cp = x.cp
    gather = (cp - 1) * kv_b / bw + 2 * (cp - 1) * lat
    reorder = 2 * cp * kv_b / hbm
    forward = gather + reorder + 2 * CP_STEP_OVERHEAD_S
    return _CpPass(forward=forward, backward=2 * gather + reorder + 2 * CP_STEP_OVERHEAD_S)


def cp_a2a_size(domain, tp, cp):
    """The inner (all-to-all) level of cp_comm_type a2a+p2p, arrays or scalars: the cp ranks of one
    NVLink domain (the cp group strides over tp ranks): the greatest common divisor of cp and the cp
    ranks a domain holds, so that --hierarchical-context-parallel-sizes a cp/a multiply to cp as
    Megatron's validate_args asserts."""
    fit = np.maximum(1, np.asarray(domain) // np.asarray(tp, dtype=np.int64))
    return np.gcd(np.asarray(cp, dtype=np.int64), fit)[()]


def _attention_forward_passes(x: _Inputs) -> np.ndarray:
    """Forward passes of a layer's attention per micro-batch: recomputation (selective recomputes
    the core attention, full the whole layer) runs it, and its context-parallel exchange, again."""
    selective = x.recompute == RECOMPUTE_CODES["selective"]
    return 1.0 + np.where(selective, 1.0, x.full_recompute_share(x.stage_layers))


def _cp_comm(x: _Inputs, links: _Links, comp: _Compute) -> np.ndarray:
    """Context parallelism, exposed seconds per step (training.cp_comm_type; Transformer Engine's
    context_parallel.py, as Megatron-LM's TEDotProductAttention calls it). The cp group spans tp*cp
    consecutive ranks (stride tp), inside the NVLink domain while that fits in it. Per layer and
    micro-batch, this rank's K and V chunk (s/cp tokens of its kv heads, 1/tp of them), Q and output
    likewise."""
    profile, tp, cp = x.profile, x.tp, x.cp
    T, e = x.s_local * x.micro_batch_size, float(x.act_bytes)
    m = x.model
    qkvo, _ = attention_widths(m)  # in multiples of h
    q_w, k_w, v_w, o_w = qkvo or (1.0, m.kv_heads / m.num_attention_heads, m.kv_heads / m.num_attention_heads, 1.0)
    width = T * float(m.hidden_size) / tp * e
    kv_b, q_b, o_b = (k_w + v_w) * width, q_w * width, o_w * width
    domain = profile.nvlink_domain
    cp_inside = (tp * cp <= domain) | (profile.world_size == domain)
    bw = np.where(cp_inside, links.nvlink, links.ib)
    lat = np.where(cp_inside, links.nvlink_latency, links.ib_latency)
    hbm = profile.gpu.hbm_bandwidth_gbps * 1e9 * x.eff.hbm
    kind = x.training.cp_comm_type
    if kind == "a2a":
        per = _cp_a2a(cp, kv_b, q_b, o_b, bw, lat, hbm)
    elif kind == "all_gather":
        per = _cp_all_gather(x, kv_b, bw, lat, hbm)
    elif kind == "a2a+p2p":
        # Hierarchical (TE's a2a+p2p, Megatron --hierarchical-context-parallel-sizes a r): all-to-alls
        # over the a cp ranks of one NVLink domain, then the p2p ring over the r = cp/a domains on the
        # NICs; after the all-to-all a rank holds a x s/cp tokens of 1/a of its heads, so its K, V,
        # Q and output chunks have the bytes they had, and a ring step is 1/r of the attention.
        a = cp_a2a_size(domain, tp, cp)
        r = cp / a
        inner = _cp_a2a(a, kv_b, q_b, o_b, links.nvlink, links.nvlink_latency, hbm)
        ring = _cp_p2p(x, comp, r, kv_b, q_b, o_b, lambda nbytes: nbytes / links.ib + links.ib_latency, hbm)
        per = _CpPass(forward=inner.forward + ring.forward, backward=inner.backward + ring.backward)
    else:
        per = _cp_p2p(x, comp, cp, kv_b, q_b, o_b, lambda nbytes: nbytes / bw + lat, hbm)
    layer = _attention_forward_passes(x) * per.forward + per.backward
    return np.where(cp > 1, x.grad_accum_steps * x.stage_layers * layer, 0.0)


def token_dispatcher(training: TrainingSpec, profile: ClusterProfile, ep, etp):
    """Megatron-Core's token dispatcher (--moe-token-dispatcher-type) for MoE layouts (arrays or
    scalars): the spec's training.moe_dispatcher, else flex (DeepEP) where the profile says the
    cluster has DeepEP, else alltoall. Flex needs expert-TP x EP > 1 (MoEFlexTokenDispatcher asserts
    "DeepEP dispatcher requires TPxEP > 1", core/transformer/moe/token_dispatcher.py), so a layout
    that keeps every expert on every rank has no dispatch to hand to DeepEP and takes alltoall."""
    if training.moe_dispatcher is not None:
        return np.full(np.shape(ep), training.moe_dispatcher, dtype=object)[()]
    flex = profile.features.deepep & (np.asarray(ep) * np.asarray(etp) > 1)
    return np.where(flex, "flex", "alltoall").astype(object)[()]


def ep_overlap_applies(model: ModelSpec, training: TrainingSpec, profile: ClusterProfile, ep, etp, recompute, pp, vpp):
    """Where --overlap-moe-expert-parallel-comm applies (arrays or scalars): asked for by the spec and
    accepted by TransformerConfig.__post_init__: expert parallelism, the alltoall or flex dispatcher,
    no full recomputation, bf16/fp16, at most one MTP layer, and the interleaved schedule whenever
    there is a pipeline."""
    if model.moe is None or not training.moe_overlap_ep_comm or training.precision == "fp32" or model.mtp_layers > 1:
        return np.zeros(np.shape(ep), dtype=bool)[()]
    dispatcher = token_dispatcher(training, profile, ep, etp)
    pp, vpp = np.asarray(pp), np.asarray(vpp)
    return (
        (np.asarray(ep) > 1)
        & (dispatcher != "allgather")
        & (np.asarray(recompute) != RECOMPUTE_CODES["full"])
        & ((pp == 1) | (vpp > 1))
    )


def _ep_comm(x: _Inputs, links: _Links, comp: _Compute) -> _Overlapped:
    """Expert parallelism, seconds per step of the slowest stage: per MoE layer and micro-batch the
    token dispatcher sends every routed copy to the rank of its expert and back (dispatch and combine
    all-to-all forward, and both again backward: Megatron-Core MoEAlltoAllTokenDispatcher; Megatron-
    Core's MoE paper, Sec. 3), each copy h wide, the (ep - 1)/ep of them whose expert is elsewhere.
    The ep group spans ep x etp consecutive ranks: peers inside the NVLink domain are reached over
    NVLink, the rest over the GPU's share of the node's NICs, both at once (the slower one binds).
    DeepEP (the flex dispatcher) sends a token once per remote domain, not once per expert there
    (DeepSeek-V3 Sec. 3.2.2's node-limited routing: at most group_top_k groups). The allgather
    dispatcher gathers every token of the group instead. With etp > 1 the copies are also gathered
    and reduce-scattered over the etp ranks (NVLink). Full recomputation runs the forward pair again.
    Overlapped with another micro-batch's compute (--overlap-moe-expert-parallel-comm), ``ep_overlap``
    of it hides behind the layer's compute."""
    moe, training = x.model.moe, x.training
    if moe is None:
        zero = np.zeros_like(x.tp)
        return _Overlapped(exposed=zero, total=zero)
    h, e = float(x.model.hidden_size), float(x.act_bytes)
    r, t_in = x.routed, x.router_tokens
    ep, etp = x.ep, x.etp
    domain = float(x.profile.nvlink_domain)
    k_in = np.minimum(ep, np.maximum(1.0, np.floor(domain / etp)))
    copy_bytes = r * x.tp * h * e / np.where(x.sequence_parallel, x.tp, 1.0)  # this GPU's routed copies
    local = copy_bytes * (k_in - 1) / ep
    remote = copy_bytes * (ep - k_in) / ep
    dispatcher = token_dispatcher(training, x.profile, ep, etp)
    flex = dispatcher == "flex"
    if np.any(flex):
        domains = np.maximum(1.0, ep / k_in)
        copies_per_remote = float(moe.top_k) * (domains - 1) / domains
        reach = float(moe.group_top_k) if moe.group_top_k else float(moe.top_k)
        distinct = (domains - 1) * (1 - (1 - 1 / domains) ** min(reach, float(moe.top_k)))
        dedup = np.where(copies_per_remote > 0, distinct / np.maximum(copies_per_remote, 1e-9), 1.0)
        remote = remote * np.where(flex, dedup, 1.0)
    one = np.maximum(local / links.nvlink, remote / links.ib) + np.where(
        remote > 0, links.ib_latency, links.nvlink_latency
    )
    if training.moe_dispatcher == "allgather":
        gather = t_in * h * e
        one = _hierarchical_time(
            gather,
            ep * etp,
            np.minimum(ep * etp, domain),
            links.nvlink,
            links.nvlink_latency,
            links.ib,
            links.ib_latency,
            1.0,
        )
    one = np.where(ep > 1, one, 0.0)
    etp_coll = _ring_time(copy_bytes * etp, etp, links.nvlink, links.nvlink_latency, 1.0)
    passes = 4.0 + 2.0 * x.full_recompute_share(x.stage_layers)
    per_layer = passes * (one + etp_coll)
    overlap = ep_overlap_applies(x.model, training, x.profile, ep, etp, x.recompute, x.pp, x.vpp)
    hidden = np.where(overlap, x.eff.ep_overlap * np.minimum(per_layer, comp.moe_layer_mb), 0.0)
    layers = comp.moe_layers_stage
    return _Overlapped(exposed=layers * (per_layer - hidden), total=layers * per_layer)


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
    runtime: str,
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
    hbm = profile.gpu.hbm_bandwidth_gbps * 1e9 * eff.hbm
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
