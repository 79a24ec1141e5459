"""Legality rules of a layout for a model, a cluster and a runtime.

Each rule returns a reason that names the conflict and the fix. The solver enumerates only what
``tp_degrees``, ``stage_split``, ``dispatcher_problem`` and the runtime's ``zero_stages`` allow, and
counts what they rule out (``orchestrator.plan.solver``); ``check_layout`` explains a pinned layout
that breaks a rule, from the same helpers, so the two cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.costmodel.evaluate import cp_a2a_size
from orchestrator.plan.layout import Layout
from orchestrator.runtimes import Runtime, runtime_named
from orchestrator.spec.cluster import ClusterProfile
from orchestrator.spec.model import ModelSpec
from orchestrator.spec.training import TrainingSpec


@dataclass(frozen=True)
class StageSplit:
    """Transformer layers per pipeline stage: first, any middle stage, last."""

    first: int
    middle: int
    last: int
    kind: str  # "even", "edge-light" or "loss-chunk"


def stage_split(num_layers: int, pp: int, mtp: int = 0) -> StageSplit | None:
    """How ``num_layers`` split over ``pp`` stages, or None when they cannot.

    Even splits are the rule. Otherwise, when ``num_layers + 2`` divides by ``pp`` the first and
    last stages take one layer fewer, because they also hold the embedding and the output layer
    and loss: Llama 3 405B (126 layers) trains with pp=16 this way (Llama 3 paper, Sec. 3.3.2),
    and Megatron-LM expresses it with --decoder-first/last-pipeline-num-layers. Failing both, when
    ``num_layers + 3`` divides the last stage takes two fewer, the loss a chunk of its own
    ("loss-chunk"): Megatron-Bridge's layout for 61-layer DeepSeek-V3 and Kimi-K2 without MTP at
    pp 8 x vpp 4, Et|(tt|)*30L (7 layers on the first stage, 8 on the middle ones, 6 on the last).

    ``mtp`` multi-token-prediction modules (DeepSeek-V3) sit on the last stage after its decoder
    layers (Megatron-Core builds them with the output layer), each counted as a layer there; the
    embedding and the loss then count as a slot each first: DeepSeek-V3's 61 layers + 1 MTP +
    embedding + loss are 64 slots, 8 per stage at pp=8 (7 layers on the first stage, 6 and the MTP
    module on the last), Megatron-Bridge's Et|(tt|)*30mL at vpp 4, and 32 per stage at pp 2.
    """
    if pp == 1:
        return StageSplit(num_layers, num_layers, num_layers, "even")
    slots = num_layers + mtp
    if pp > slots:
        return None

    def lighter(first: int, last: int, kind: str) -> StageSplit | None:
        n, rest = divmod(slots + first + last, pp)
        if rest == 0 and n - first >= 1 and n - last - mtp >= 1:
            return StageSplit(n - first, n, n - last - mtp, kind)
        return None

    if mtp and (split := lighter(1, 1, "edge-light")) is not None:
        return split
    if slots % pp == 0 and slots // pp > mtp:
        n = slots // pp
        return StageSplit(n, n, n - mtp, "even")
    if pp > 2 and (split := lighter(1, 1, "edge-light")) is not None:
        return split
    return lighter(1, 2, "loss-chunk")


def vpp_degrees(runtime: Runtime, num_layers: int, pp: int, p2p_overlap: bool = True, mtp: int = 0) -> list[int]:
    """Virtual stages per rank the interleaved schedule can use: only Megatron-LM has it, only with
    pp > 1, and vpp must divide each rank's share of the split. An edge-light split (one layer fewer
    on the first and last stage) is Megatron's --account-for-embedding/loss-in-pipeline-split:
    (layers + 2) / pp per rank, the embedding and the loss counted as one layer each, so vpp divides
    that (TransformerConfig.__post_init__; the first chunk of the first rank and the last chunk of
    the last rank are one layer short, as Llama 3 405B trained: Llama 3 paper, Sec. 3.3.2)."""
    from orchestrator.plan.layout import divisors

    split = stage_split(num_layers, pp, mtp)
    # Without p2p overlap validate_args asks for pp > 2 ("pipeline-model-parallel size should be
    # greater than 2 with interleaved schedule").
    if not runtime.interleaved_schedule or pp == 1 or split is None or (not p2p_overlap and pp <= 2):
        return [1]
    return divisors(split.middle)


def recompute_layer_options(
    model: ModelSpec, runtime: Runtime, split: StageSplit | None, vpp: int, pinned: int | None = None
) -> list[int]:
    """recompute_layers values to search under full recomputation: 0 (every layer) and, on
    Megatron-LM, a quarter, half and three quarters of a virtual stage's layers (Megatron's block
    method, --recompute-num-layers N of each TransformerBlock). Memory and time are linear in N, so
    these bracket the best N within a quarter stage and keep the search small; a pin gives any N."""
    chunk = split.middle // vpp if split is not None else 0
    if pinned is not None:
        return [pinned] if pinned == 0 or _recompute_layers_problem(pinned, model, runtime, chunk) is None else []
    if _recompute_layers_problem(1, model, runtime, chunk) is not None:
        return [0]
    return [0, *sorted({n for n in (round(chunk * q / 4) for q in (1, 2, 3)) if 1 <= n < chunk})]


def _recompute_layers_problem(n: int, model: ModelSpec, runtime: Runtime, chunk: int) -> str | None:
    """Why full recomputation of only ``n`` layers per virtual stage of ``chunk`` layers cannot run."""
    if not runtime.partial_recompute:
        return (
            f"recompute_layers={n}: the bundled DeepSpeed entrypoint checkpoints every decoder layer under "
            f"full recomputation (PipelineModule activation_checkpoint_interval); use recompute_layers 0 or "
            f"--runtime megatron"
        )
    if model.mtp_layers:
        return (
            f"recompute_layers={n}: Megatron-LM's block method skips the MTP modules' recomputation "
            f"(multi_token_prediction.py: \"recompute_method == 'block' is not supported for MTP yet\"); "
            f"use recompute_layers 0"
        )
    if n >= chunk:
        return (
            f"recompute_layers={n} is not below the {chunk} layers of a (virtual) pipeline stage: that "
            f"recomputes every layer, which is recompute_layers 0"
        )
    return None


def cp_degrees(runtime: Runtime, training: TrainingSpec, n: int, model: ModelSpec, tp: int, domain: int) -> list[int]:
    """Context-parallel degrees among the divisors of ``n`` (GPUs left after tp): Megatron-LM only
    (the bundled entrypoint has no ring attention), its fused attention only (the local attention
    asserts context_parallel_size == 1: core/transformer/dot_product_attention.py), and the
    sequence must split into 2 x cp chunks for the load-balanced causal split (validate_args:
    "seq-length should be a multiple of 2 * context-parallel-size"); and the exchange's own needs
    (``cp_exchange_problem``)."""
    from orchestrator.plan.layout import divisors

    if not runtime.context_parallel or not training.flash_attention:
        return [1]
    return [
        c
        for c in divisors(n)
        if c == 1
        or (_splits_for_cp(training.seq_length, c) and cp_exchange_problem(model, training, tp, c, domain) is None)
    ]


def _splits_for_cp(seq_length: int, cp: int) -> bool:
    return seq_length % (2 * cp) == 0


def cp_exchange_problem(model: ModelSpec, training: TrainingSpec, tp: int, cp: int, domain: int) -> str | None:
    """Why training.cp_comm_type cannot run at this tp and cp, or None. a2a scatters each tp rank's
    heads over the cp ranks (a2a+p2p over its inner level): Transformer Engine asserts num_heads %
    cp_size == 0 for Q and for K, V (context_parallel.py AttnFuncWithCPAndQKVOA2A.forward). a2a+p2p
    is hierarchical: both levels must have more than one rank (costmodel cp_a2a_size), else it is
    plain a2a or p2p."""
    kind = training.cp_comm_type
    if cp == 1 or kind not in ("a2a", "a2a+p2p"):
        return None
    group = cp if kind == "a2a" else int(cp_a2a_size(domain, tp, cp))
    if kind == "a2a+p2p" and group in (1, cp):
        return (
            f"cp={cp} with training.cp_comm_type a2a+p2p needs the cp ranks to span NVLink domains with more than "
            f"one in each (tp={tp} leaves {group} in a domain of {domain}): use cp_comm_type "
            f"{'a2a or p2p' if group == cp else 'p2p'}"
        )
    q_heads, kv_heads = model.num_attention_heads // tp, max(1, model.kv_heads // tp)
    if q_heads % group or kv_heads % group:
        return (
            f"cp={cp} with training.cp_comm_type {kind} scatters each tp rank's heads over {group} ranks, but "
            f"tp={tp} leaves {q_heads} query and {kv_heads} key/value heads per rank, not multiples of {group} "
            f"(Transformer Engine's a2a asserts it): choose a cp dividing them or set cp_comm_type p2p"
        )
    return None


def uses_tp_overlap(runtime: Runtime, training: TrainingSpec, layout: Layout) -> bool:
    """Whether --tp-comm-overlap applies to a layout: asked for by the spec, on the megatron runtime,
    with tp > 1 and sequence parallelism (validate_args refuses it otherwise)."""
    # Not with Megatron-FSDP: TE's overlap wants CUDA_DEVICE_MAX_CONNECTIONS=1, which Megatron-FSDP
    # refuses (validate_args: "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset").
    return (
        runtime.tp_comm_overlap
        and training.tp_comm_overlap
        and layout.tp > 1
        and layout.sequence_parallel
        and not runtime.uses_fsdp(layout.zero_stage)
    )


def sp_options(tp: int, cp: int, seq_length: int) -> list[bool]:
    """Sequence parallelism needs tp > 1 and each rank's tokens (s/cp) to split over the tp ranks
    (Megatron's scatter_to_sequence_parallel_region asserts the first dimension divides by tp; the
    bundled entrypoint splits the same way)."""
    return [False, True] if tp > 1 and (seq_length // cp) % tp == 0 else [False]


def interleaving_fits(vpp: int, pp: int, grad_accum_steps: int) -> bool:
    """The interleaved schedule needs the micro-batch count to be a multiple of pp
    (Narayanan et al. 2021, Sec. 2.2.2)."""
    return vpp == 1 or grad_accum_steps % pp == 0


def tp_placeable(tp: int, profile: ClusterProfile) -> bool:
    """Tensor parallelism stays inside one NVLink domain (Narayanan et al. 2021, Sec. 3.3): a divisor
    of a node's GPUs, or whole nodes of an NVLink domain larger than a node (GB200 NVL72)."""
    g, d = profile.gpus_per_node, profile.nvlink_domain
    return d % tp == 0 and (g % tp == 0 if tp <= g else tp % g == 0)


def tp_degrees(model: ModelSpec, profile: ClusterProfile) -> list[int]:
    from orchestrator.plan.layout import divisors

    return [
        t
        for t in divisors(profile.nvlink_domain)
        if tp_placeable(t, profile) and model.num_attention_heads % t == 0 and model.kv_heads % t == 0
    ]


def ep_degrees(model: ModelSpec, runtime: Runtime, tp: int, cp: int, dp: int) -> list[int]:
    """Expert-parallel degrees: 1 for a dense model; else divisors of the routed experts that fit the
    runtime's expert mesh (``Runtime.expert_mesh``)."""
    from orchestrator.plan.layout import divisors

    if model.moe is None:
        return [1]
    mesh = runtime.expert_mesh(tp, cp, dp)
    return [e for e in divisors(mesh) if model.moe.num_experts % e == 0]


def etp_degrees(
    model: ModelSpec, runtime: Runtime, tp: int, cp: int, dp: int, ep: int, pinned: int | None = None
) -> list[int]:
    """Expert tensor-parallel degrees searched: 1 for a dense model; tp on dsorch's entrypoint
    (experts split like its dense MLP); on Megatron-Core 1 (whole experts, the usual choice for
    fine-grained experts) or tp (Megatron-LM's default, --expert-tensor-parallel-size unset), where
    etp x ep divides tp x cp x dp; any such value when ``pinned``. Experts with biases (GPT-OSS) only at
    etp 1 (TransformerConfig: "Bias in Moe is only supported when ETP==1")."""
    if model.moe is None:
        return [1]
    if runtime.experts_like_mlp:
        return [tp] if tp == 1 or not model.bias else []
    searched = {1, tp} if pinned is None else {pinned}
    return [t for t in sorted(searched) if (tp * cp * dp) % (ep * t) == 0 and (t == 1 or not model.bias)]


def dispatcher_problem(training: TrainingSpec, runtime: Runtime, ep: int, etp: int) -> str | None:
    """Why the spec's token dispatcher cannot run at expert-TP x EP = ``etp`` x ``ep``, None where it
    can. Megatron-Core's flex dispatcher (DeepEP) sends tokens over that group and refuses one rank
    (core/transformer/moe/token_dispatcher.py MoEFlexTokenDispatcher.__init__: "DeepEP dispatcher
    requires TPxEP > 1"; validate/megatron_moe.py _dispatcher_checks). The dispatcher is a flag of
    the runtime whose program reads megatron_args.txt (render/megatron.py _moe_flags); a spec that
    leaves it unset gets alltoall there (costmodel/comm_ep.py token_dispatcher). The search and
    ``check_layout`` both ask this, so the search never chooses a layout the rules refuse."""
    if training.moe_dispatcher != "flex" or not runtime.reads_megatron_args or ep * etp > 1:
        return None
    return (
        f"ep={ep} etp={etp}: training.moe_dispatcher flex (DeepEP) sends tokens over the expert-TP x EP "
        f'group, here {ep * etp} rank, and Megatron-Core refuses that ("DeepEP dispatcher requires TPxEP > 1"); '
        f"use ep or etp above 1, or training.moe_dispatcher alltoall"
    )


def check_layout(
    layout: Layout, model: ModelSpec, training: TrainingSpec, profile: ClusterProfile, runtime: Runtime | str
) -> list[str]:
    """Every rule ``layout`` breaks, as sentences with a fix (empty when legal), axis by axis in the
    order of the steps below: the world size, cp, tp, pp and vpp, the global batch, ZeRO, sp."""
    runtime = runtime_named(runtime)
    return [
        *_world_rules(layout, profile),
        *_cp_rules(layout, model, training, runtime, profile.nvlink_domain),
        *_tp_rules(layout, model, profile),
        *_ep_rules(layout, model, training, runtime),
        *_pipeline_rules(layout, model, training, runtime),
        *_recompute_rules(layout, model, runtime),
        *_batch_rules(layout, training),
        *_zero_rules(layout, training, runtime),
        *_sp_rules(layout, training),
    ]


def _world_rules(L: Layout, profile: ClusterProfile) -> list[str]:
    """The degrees' product against the cluster's GPUs."""
    world = profile.world_size
    if L.world_size == world:
        return []
    return [
        f"tp*cp*pp*dp = {L.tp}*{L.cp}*{L.pp}*{L.dp} = {L.world_size} but the cluster has {world} GPUs "
        f"({profile.nodes} x {profile.gpus_per_node}); choose degrees whose product is {world}"
    ]


def _cp_rules(L: Layout, model: ModelSpec, training: TrainingSpec, runtime: Runtime, domain: int) -> list[str]:
    """Context parallelism: the runtime and attention that have it, the sequence's 2 x cp chunks,
    and the heads a2a scatters."""
    if L.cp <= 1:
        return []
    r: list[str] = []
    if not runtime.context_parallel:
        r.append(
            f"cp={L.cp}: context parallelism (ring attention) is a Megatron-LM feature; the bundled "
            f"DeepSpeed entrypoint has none (nor DeepSpeed-Ulysses); use cp=1 or --runtime megatron"
        )
    elif not training.flash_attention:
        r.append(
            f"cp={L.cp} needs Megatron-LM's fused attention (Transformer Engine); the unfused attention "
            f"refuses context parallelism: set training.flash_attention true or use cp=1"
        )
    if not _splits_for_cp(training.seq_length, L.cp):
        r.append(
            f"seq_length {training.seq_length} is not a multiple of 2 x cp = {2 * L.cp} (Megatron-LM "
            f"splits each sequence into 2 x cp chunks); choose a cp that fits"
        )
    exchange = cp_exchange_problem(model, training, L.tp, L.cp, domain)
    return r + ([exchange] if exchange else [])


def _tp_rules(L: Layout, model: ModelSpec, profile: ClusterProfile) -> list[str]:
    """Tensor parallelism: inside one node, and a divisor of the query and key/value heads."""
    r: list[str] = []
    if not tp_placeable(L.tp, profile):
        domain = profile.nvlink_domain
        where = (
            f"divide gpus_per_node={profile.gpus_per_node}"
            if domain == profile.gpus_per_node
            else f"divide gpus_per_node={profile.gpus_per_node} or be whole nodes of the {domain}-GPU NVLink domain"
        )
        r.append(
            f"tp={L.tp} must {where}: tensor parallelism stays inside one NVLink domain "
            f"(Narayanan et al. 2021, Sec. 3.3)"
        )
    if model.num_attention_heads % L.tp:
        r.append(
            f"tp={L.tp} does not divide num_attention_heads={model.num_attention_heads}; "
            f"use a tp that divides the head count"
        )
    if model.kv_heads % L.tp:
        r.append(
            f"tp={L.tp} does not divide num_kv_heads={model.kv_heads}; Megatron-LM shards whole key/value "
            f"groups, so use tp <= {model.kv_heads} dividing it"
        )
    return r


def _ep_rules(L: Layout, model: ModelSpec, training: TrainingSpec, runtime: Runtime) -> list[str]:
    """Expert parallelism: MoE models only; ep divides the experts; the expert mesh (etp x ep) fits in
    the ranks it is carved from; what each runtime builds; the token dispatcher's group."""
    if model.moe is None:
        if L.ep > 1 or L.etp > 1:
            return [
                f"ep={L.ep} etp={L.etp}: expert parallelism splits the experts of a mixture-of-experts model, "
                f"and this model is dense (model.moe is not set); use ep=1 etp=1"
            ]
        return []
    E = model.moe.num_experts
    dispatch = dispatcher_problem(training, runtime, L.ep, L.etp)
    r: list[str] = [dispatch] if dispatch else []
    if model.bias and L.etp > 1:
        # TransformerConfig.__post_init__: "Bias in Moe is only supported when ETP==1".
        fix = "use tp=1 (the entrypoint splits experts over tp)" if runtime.experts_like_mlp else "use --etp 1"
        r.append(f"etp={L.etp}: experts with biases (model.bias, GPT-OSS) split over no more than one rank; {fix}")
    if E % L.ep:
        r.append(f"ep={L.ep} does not divide the {E} routed experts (model.moe.num_experts); choose an ep dividing {E}")
    if runtime.experts_like_mlp:
        if L.etp != L.tp:
            r.append(
                f"etp={L.etp}: dsorch's DeepSpeed entrypoint splits each expert over the tensor-parallel group "
                f"like its dense MLP, so etp equals tp={L.tp}; use --etp {L.tp} or --runtime megatron"
            )
        if L.dp % L.ep:
            r.append(
                f"ep={L.ep} must divide dp={L.dp}: the entrypoint's expert groups are data-parallel ranks; "
                f"choose an ep dividing {L.dp}"
            )
        if not runtime.expert_zero_ok(L.ep, L.zero_stage):
            r.append(
                f"zero_stage={L.zero_stage} with ep={L.ep}: DeepSpeed runs expert parallelism at ZeRO-1 and 2 "
                f"only (it refuses MoE layers at ZeRO-3, and clips the experts' gradients wrongly at ZeRO-0); "
                f"use --zero 1 or 2, or ep=1"
            )
        return r
    mesh = L.tp * L.cp * L.dp
    if mesh % (L.ep * L.etp):
        # Megatron-LM says "decoder world_size (...) is not divisible by
        # expert_tensor_model_pipeline_parallel size (...)" (core/parallel_state.py).
        r.append(
            f"etp*ep = {L.etp}*{L.ep} = {L.etp * L.ep} does not divide tp*cp*dp = {L.tp}*{L.cp}*{L.dp} = {mesh}: "
            f"Megatron-Core carves the expert mesh from the GPUs of one pipeline stage, so choose etp and ep "
            f"whose product divides {mesh}"
        )
    if runtime.moe_needs_sp and L.tp > 1 and not L.sequence_parallel:
        r.append(
            f"a mixture-of-experts model with tp={L.tp} needs sequence parallelism on Megatron-LM (its MoE layer "
            f"refuses to train with tensor parallelism without it): use --sp or tp=1"
        )
    return r


def _pipeline_rules(L: Layout, model: ModelSpec, training: TrainingSpec, runtime: Runtime) -> list[str]:
    """Pipeline parallelism: the layers split into stages, then the interleaved schedule (vpp) on
    that split."""
    r: list[str] = []
    split = stage_split(model.num_layers, L.pp, model.mtp_layers)
    if split is None:
        r.append(
            f"pp={L.pp} cannot split num_layers={model.num_layers} into stages: use a pp that divides "
            f"{model.num_layers} (or {model.num_layers + 2}, with one layer fewer on the first and last stage)"
        )
    if L.vpp > 1:
        r += _vpp_rules(L, split, training, runtime)
    return r


def _recompute_rules(L: Layout, model: ModelSpec, runtime: Runtime) -> list[str]:
    """Partial recomputation (recompute_layers): full recomputation only, where the runtime has it."""
    if L.recompute_layers == 0:
        return []
    if not runtime.partial_recompute:
        return [_recompute_layers_problem(L.recompute_layers, model, runtime, 0) or ""]
    if L.recompute != "full":
        return [
            f"recompute_layers={L.recompute_layers} picks the layers full recomputation reruns (Megatron's "
            f"--recompute-method block needs --recompute-granularity full); use --recompute full or recompute_layers 0"
        ]
    split = stage_split(model.num_layers, L.pp, model.mtp_layers)
    chunk = split.middle // L.vpp if split is not None and L.vpp else 0
    problem = _recompute_layers_problem(L.recompute_layers, model, runtime, chunk)
    return [problem] if problem else []


def _vpp_rules(L: Layout, split: StageSplit | None, training: TrainingSpec, runtime: Runtime) -> list[str]:
    """The first rule an interleaved schedule (vpp > 1) breaks, if any (each one presumes those before it hold)."""
    if not runtime.interleaved_schedule:
        return [
            f"vpp={L.vpp}: DeepSpeed's pipeline engine runs plain 1F1B with no interleaved schedule; "
            f"use vpp=1 or --runtime megatron"
        ]
    if L.pp == 1:
        return [f"vpp={L.vpp} needs pp > 1 (virtual stages interleave pipeline stages); use vpp=1"]
    if L.pp == 2 and not training.overlap_p2p_comm:
        return [
            f"vpp={L.vpp} with training.overlap_p2p_comm false needs pp > 2 (Megatron-LM's validate_args); "
            f"use vpp=1, pp > 2, or overlap the sends"
        ]
    if split is not None and split.middle % L.vpp:
        return [
            f"vpp={L.vpp} must divide the {split.middle} layers per pipeline rank (pp={L.pp}"
            + (
                ", the first and last counting the embedding and the loss as a layer each"
                if split.kind != "even"
                else ""
            )
            + "); choose a vpp dividing them"
        ]
    if not interleaving_fits(L.vpp, L.pp, L.grad_accum_steps):
        return [
            f"the interleaved schedule needs the number of micro-batches ({L.grad_accum_steps}) to be a "
            f"multiple of pp={L.pp} (Narayanan et al. 2021, Sec. 2.2.2); change the micro-batch size"
        ]
    return []


def _batch_rules(L: Layout, training: TrainingSpec) -> list[str]:
    """micro-batch x accumulation x dp against the spec's global batch."""
    if L.global_batch_size == training.global_batch_size:
        return []
    return [
        f"micro_batch_size*grad_accum_steps*dp = {L.micro_batch_size}*{L.grad_accum_steps}*{L.dp} = "
        f"{L.global_batch_size} but global_batch_size is {training.global_batch_size}; choose a micro-batch "
        f"size that divides global_batch_size/dp"
    ]


def _zero_rules(L: Layout, training: TrainingSpec, runtime: Runtime) -> list[str]:
    """Why the ZeRO stage is not one the runtime's ``zero_stages`` offers (one reason)."""
    fp8_gather = training.fp8_param_gather
    if L.zero_stage in runtime.zero_stages(L.pp, training.precision, L.grad_accum_steps, L.zero_stage, fp8_gather):
        return []
    return [runtime.zero_refusal(L.zero_stage, L.pp, L.grad_accum_steps, fp8_gather)]


def _sp_rules(L: Layout, training: TrainingSpec) -> list[str]:
    """Sequence parallelism: tp > 1, and tp dividing each rank's tokens."""
    if not L.sequence_parallel:
        return []
    if L.tp == 1:
        return [
            "sequence parallelism splits the tensor-parallel region's activations and needs tp > 1; "
            "use --no-sp or tp > 1"
        ]
    if True not in sp_options(L.tp, L.cp, training.seq_length):
        return [
            f"sequence parallelism splits each rank's {training.seq_length // L.cp} tokens over tp={L.tp}, "
            f"which does not divide them; use --no-sp or a tp dividing {training.seq_length // L.cp}"
        ]
    return []


def check_model(model: ModelSpec, runtime: Runtime | str) -> list[str]:
    """What the runtime cannot build of the architecture (``Runtime.model_problems``)."""
    return runtime_named(runtime).model_problems(model)


# The compute capabilities Transformer Engine runs each FP8 recipe on (pytorch/quantization.py
# _compute_mxfp8_support, _compute_fp8_block_scaling_support @ d0067d0): MXFP8 from Blackwell (10.0)
# and not yet on 12.0+, 1x128/128x128 block scaling from Hopper (9.0). Delayed and per-tensor
# scaling run wherever FP8 does (the profile's fp8 peak says so).
_FP8_RECIPE_CC = {
    "mxfp8": ((10, 0), (12, 0), "Transformer Engine runs MXFP8 on compute capability 10.0 up to (not incl.) 12.0"),
    "blockwise": ((9, 0), None, "Transformer Engine's FP8 block scaling needs compute capability 9.0 or higher"),
}


def _fp8_recipe_unsupported(recipe: str, compute_capability: str | None) -> str | None:
    """Why Transformer Engine refuses ``recipe`` on a GPU of this compute capability (None: it runs,
    or the profile does not say)."""
    if compute_capability is None or recipe not in _FP8_RECIPE_CC:
        return None
    cc = tuple(int(v) for v in compute_capability.split("."))
    low, high, why = _FP8_RECIPE_CC[recipe]
    return why if cc < low or (high is not None and cc >= high) else None


def check_training(training: TrainingSpec, profile: ClusterProfile, runtime: Runtime | str) -> list[str]:
    """What the runtime refuses about the training settings, whatever the layout."""
    runtime = runtime_named(runtime)
    problems = []
    if profile.backend == "gloo" and training.precision == "fp16":
        problems.append(
            f"precision fp16 is refused by DeepSpeed on CPU (profile '{profile.name}' uses gloo); "
            f"set training.precision to bf16 or fp32"
        )
    if training.fp8 is not None:
        if not runtime.fp8:
            problems.append(
                f"training.fp8 {training.fp8!r}: FP8 GEMMs come from Transformer Engine under Megatron-LM; "
                f"the bundled DeepSpeed entrypoint has none: use --runtime megatron or drop training.fp8"
            )
        elif profile.gpu.peak_tflops.fp8 is None:
            problems.append(
                f"training.fp8 {training.fp8!r}: profile '{profile.name}' states no FP8 peak for "
                f"{profile.gpu.name} (gpu.peak_tflops.fp8; FP8 tensor cores start with Hopper and Ada): "
                f"add it to the profile or drop training.fp8"
            )
        elif (why := _fp8_recipe_unsupported(training.fp8_recipe, profile.gpu.compute_capability)) is not None:
            problems.append(
                f"training.fp8_recipe {training.fp8_recipe!r} on {profile.gpu.name} (profile '{profile.name}', "
                f"gpu.compute_capability {profile.gpu.compute_capability}): {why}; pick another recipe "
                f"(tensorwise or delayed run on every FP8 GPU)"
            )
    if training.fp8_param_gather and (not runtime.fp8 or training.fp8 is None):
        problems.append(
            "training.fp8_param_gather is Megatron-LM's --fp8-param-gather: it keeps FP8 weights, so it needs "
            "training.fp8 and the megatron runtime; set both, or leave it out"
        )
    if not runtime.tp_comm_overlap and training.tp_comm_overlap:
        problems.append(
            "training.tp_comm_overlap is Megatron-LM's --tp-comm-overlap (Transformer Engine userbuffers); "
            "the deepspeed runtime does not overlap TP collectives: use --runtime megatron or set it false"
        )
    if not training.grad_reduce_in_fp32 and (not runtime.grad_reduce_in_bf16 or training.precision != "bf16"):
        problems.append(
            "training.grad_reduce_in_fp32 false is Megatron-LM's --grad-reduce-in-bf16 and applies to bf16 "
            "under the megatron runtime only (the deepspeed runtime accumulates in fp32 from ZeRO-1): use "
            "--runtime megatron with precision bf16, or leave it out"
        )
    if runtime.needs_train_steps and training.train_steps is None:
        problems.append(
            "the megatron runtime needs the training length (Megatron-LM's --train-iters): set "
            "training.steps or training.train_tokens (dsorch import-hf --train-tokens writes it)"
        )
    return problems
