"""What every part of the cost model reads, built once per evaluation: the layouts (``Candidates``,
one entry per layout), their float arrays, the model's shape per pipeline stage, the bytes per
parameter, the efficiencies and the engine (``_Inputs``, made by ``_inputs``).

Names with a leading underscore are the cost model's own: the other costmodel modules read them,
nothing outside costmodel does (costmodel/evaluate.py is its front door).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from types import SimpleNamespace

import numpy as np

from orchestrator.costmodel.calibration import FIELDS
from orchestrator.costmodel.memory import DTYPE_BYTES
from orchestrator.runtimes import Engine, Runtime, runtime_named
from orchestrator.spec.cluster import ClusterProfile, bytes_per_s
from orchestrator.spec.model import ModelSpec
from orchestrator.spec.training import TrainingSpec

RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}
# Not a level dsorch plans: torchtitan's per-op selective checkpointing, which published FSDP runs
# used (torchtitan activation_checkpoint.py, op SAC: "Saves output of all compute ops, except every
# second mm"); calibration rows evaluate it so that those runs are modelled as they ran.
RC_TORCHTITAN_OP = 3


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
class _Inputs:
    """What every part of the model reads: the layouts as float arrays, the model's shape, the
    bytes per parameter, the efficiencies and the engine. Built once by ``_inputs``."""

    model: ModelSpec
    training: TrainingSpec
    profile: ClusterProfile
    runtime: Runtime
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
    def hbm(self) -> np.ndarray:
        """Bytes/s of the GPU's memory at the fitted efficiency (``hbm``)."""
        return bytes_per_s(self.profile.gpu.hbm_bandwidth_gbps) * self.eff.hbm

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
    # LanguageModelEmbedding and final layernorm; train/model/decoder.py). Measured: train/loop/census.py.
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
    runtime: str | Runtime,
    c: Candidates,
    eff: SimpleNamespace,
    eng: Engine,
) -> _Inputs:
    runtime = runtime_named(runtime)
    f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    tp, pp, zero = f64(c.tp), f64(c.pp), np.asarray(c.zero_stage)
    weight_b, grad_b, opt_b = runtime.state_bytes(training.precision, zero, training.grad_reduce_in_fp32)
    # Bytes per gradient element on the wire and in the reduce buckets (the runtime's
    # ``grads_reduced_in_weight_dtype``: DeepSpeed reduces in the 16-bit type even where it accumulates
    # in fp32, Megatron-LM its fp32 main grads as they are).
    comm_grad_b = np.minimum(grad_b, weight_b) if runtime.grads_reduced_in_weight_dtype else grad_b
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
        act_bytes=DTYPE_BYTES[training.precision],
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
