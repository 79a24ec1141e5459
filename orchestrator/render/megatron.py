"""Megatron-LM launch flags for the chosen layout, one flag per line in a fixed order.

The flag names are Megatron-LM's (megatron/training/arguments.py); they are checked against the
argument table extracted from the real file (orchestrator/validate/megatron.py). The file has no
comment lines so that ``pretrain_gpt.py $(cat megatron_args.txt)`` works as it is; its provenance
is in plan.yaml.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from orchestrator.plan.layout import AXIS
from orchestrator.plan.make import Plan
from orchestrator.plan.rules import stage_split, uses_tp_overlap
from orchestrator.render.overrides import merge_flags
from orchestrator.spec.model import ModelSpec


def _fmt(v) -> str:
    if isinstance(v, float):
        return repr(v) if v != int(v) or abs(v) >= 1e16 else f"{v:.1f}"
    return str(v)


# The signal that asks Megatron-LM to checkpoint and exit (--exit-signal-handler): SIGUSR2, which
# job.sbatch passes on before the time limit and torchrun ignores (launch.sh starts it so).
EXIT_SIGNAL = "SIGUSR2"


def vocab_divisor(vocab_size: int, tp: int) -> int:
    """--make-vocab-size-divisible-by: Megatron-LM pads the vocabulary up to a multiple of this
    times tp (vocab_size_with_padding in megatron/core/tokenizers/utils/build_tokenizer.py). The
    largest power of two up to its default 128 that leaves the spec's vocabulary unpadded, so
    the model Megatron builds is the one dsorch counted and planned. Where tp itself does not
    divide the vocabulary the divisor is 1 and Megatron still adds up to tp - 1 rows, a rounding
    the plan does not count (at most tp x hidden parameters)."""
    d = 128
    while d > 1 and vocab_size % (d * tp):
        d //= 2
    return d


def checkpoint_dir(plan: Plan) -> str:
    return plan.spec.training.checkpoint.dir


# A section of the flags: (flag, value) pairs in emission order, value None for a switch;
# megatron_flags formats the values.
_Flags = Iterator[tuple[str, object]]


def _axis_flag(axis: str) -> str:
    """The Megatron-LM flag of a layout axis, from its row (plan/layout.py AXES), the one home
    render/overrides.py FLAG_OWNERS reads too."""
    flag = AXIS[axis].megatron_flag
    assert flag is not None, f"layout axis {axis} has no Megatron-LM flag"
    return flag


def pipeline_layout(num_layers: int, mtp: int, pp: int, vpp: int, kind: str) -> str:
    """--pipeline-model-parallel-layout for the split ``stage_split`` gives with ``mtp`` MTP modules:
    the embedding (E), the decoder layers (t), the MTP modules (m) and the loss (L) in order, cut
    into pp x vpp equal virtual stages in Megatron's order (the first chunk of every rank, then the
    second, ...: core/transformer/pipeline_parallel_layer_layout.py). An edge-light split counts E
    and L as a slot each; an even one puts them beside the layers. DeepSeek-V3 at pp 8 x vpp 4 is
    Et|(tt|)*30mL, Megatron-Bridge's own layout for it. Repeats are written as Megatron's parser
    unrolls them ((tt|)*30, t*8): one word without spaces."""
    body = ["t"] * num_layers + ["m"] * mtp
    # A loss-chunk split gives the loss two slots (an otherwise empty last chunk at pp 8 x vpp 4).
    slots = ["E", *body, "L"] if kind == "edge-light" else ["E", *body, "L", ""] if kind == "loss-chunk" else body
    n = len(slots) // (pp * vpp)
    chunks = ["".join(slots[i * n : (i + 1) * n]) for i in range(pp * vpp)]
    if kind == "even":
        chunks[0], chunks[-1] = "E" + chunks[0], chunks[-1] + "L"
    runs: list[list] = []
    for c in chunks:
        if runs and runs[-1][0] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    parts = []
    for i, (c, k) in enumerate(runs):
        short = re.sub(r"(t{3,})", lambda r: f"t*{len(r.group(1))}", c)
        last = i == len(runs) - 1
        if k == 1:
            parts.append(short + ("" if last else "|"))
        else:
            parts.append(f"({short}|)*{k - 1 if last else k}" + (short if last else ""))
    return "".join(parts)


def moe_layer_freq(model: ModelSpec) -> int | str:
    """--moe-layer-freq for the spec's MoE layers (ModelSpec.is_moe_layer): the plain frequency, or,
    after dense leading layers, the list expression Megatron-LM evaluates (arguments.py
    moe_freq_type: digits, brackets, parentheses, + and *; one entry per layer, 1 = MoE), e.g.
    DeepSeek-V3's [0]*3+[1]*58. One word without spaces, as megatron_args.txt needs."""
    moe = model.moe
    assert moe is not None  # callers render MoE models only
    k, n = moe.dense_leading_layers, moe.layer_freq
    if k == 0:
        return n
    q, r = divmod(model.num_layers - k, n)
    period = "[1]" if n == 1 else f"([1]+[0]*{n - 1})"
    parts = [f"[0]*{k}", f"{period}*{q}" if q else ""]
    if r:
        parts.append("[1]" + (f"+[0]*{r - 1}" if r > 1 else ""))
    return "+".join(p for p in parts if p)


def _parallelism_flags(plan: Plan) -> _Flags:
    """The parallel degrees, the pipeline's layer split, and what tensor/context parallelism need."""
    L, t = plan.layout, plan.spec.training
    yield _axis_flag("tp"), L.tp
    yield _axis_flag("pp"), L.pp
    if L.cp > 1:
        # The spec's exchange (training.cp_comm_type; Megatron's default p2p is the ring), as the
        # cost model charges it (costmodel/comm_cp.py _cp_comm; the a2a level: plan.decisions).
        yield _axis_flag("cp"), L.cp
        yield "--cp-comm-type", t.cp_comm_type
        if t.cp_comm_type == "a2a+p2p":
            inner = plan.decisions.cp_a2a_size
            assert inner is not None  # plan.decisions.decide sizes it for every a2a+p2p layout
            yield "--hierarchical-context-parallel-sizes", f"{inner} {L.cp // inner}"
    if plan.spec.model.moe is not None:
        # Megatron-Core carves the expert mesh (etp x ep x expert-dp) out of the attention's
        # tp x cp x dp ranks (core/parallel_state.py); its etp defaults to tp, dsorch's to 1, so
        # both are stated.
        yield _axis_flag("ep"), L.ep
        yield _axis_flag("etp"), L.etp
    m = plan.spec.model
    split = stage_split(m.num_layers, L.pp, m.mtp_layers)
    if split is not None and (m.mtp_layers or split.kind == "loss-chunk") and L.pp > 1:
        # Megatron's layer split counts neither MTP modules nor (without the account-for flags)
        # the embedding and loss, nor a last stage two layers short, so such a split is given layer
        # by layer.
        yield "--pipeline-model-parallel-layout", pipeline_layout(m.num_layers, m.mtp_layers, L.pp, L.vpp, split.kind)
        if L.vpp > 1 and not t.overlap_p2p_comm:
            yield "--no-overlap-p2p-communication", None
        split = None
    if split is not None and split.kind == "edge-light":
        # First and last stages hold the embedding and the output layer and loss, so one layer
        # fewer each: Megatron counts them as a layer of the split, which also works with the
        # interleaved schedule (the first chunk of the first rank and the last chunk of the last
        # rank are one layer short; TransformerConfig.__post_init__, transformer_block.py).
        yield "--account-for-embedding-in-pipeline-split", None
        yield "--account-for-loss-in-pipeline-split", None
    if L.vpp > 1 and split is not None:
        yield "--num-layers-per-virtual-pipeline-stage", split.middle // L.vpp
        if not t.overlap_p2p_comm:
            yield "--no-overlap-p2p-communication", None
    if L.sequence_parallel:
        yield _axis_flag("sequence_parallel"), None
    tp_overlap = uses_tp_overlap(plan.runtime, t, L)
    grouped_gemm = plan.spec.model.moe is not None and t.moe_grouped_gemm
    if plan.runtime.reads_megatron_args and (L.cp > 1 or t.fp8 is not None or tp_overlap or grouped_gemm):
        # Context parallelism, FP8, TP overlap and the experts' grouped GEMM (TEGroupedMLP) live in
        # Transformer Engine's modules (Megatron's default implementation; stated so that a
        # reviewer sees what the plan needs installed).
        yield "--transformer-impl", "transformer_engine"
    if tp_overlap:
        yield "--tp-comm-overlap", None


def _data_parallel_flags(plan: Plan) -> _Flags:
    """Megatron's data-parallel overlap and sharding: distributed optimizer, Megatron-FSDP."""
    if not plan.runtime.reads_megatron_args:
        return
    # The cost model assumes Megatron overlaps the data-parallel reduction with the backward
    # pass (and the distributed optimizer's parameter all-gather with the next forward).
    yield "--overlap-grad-reduce", None
    if plan.spec.training.precision == "bf16" and not plan.spec.training.grad_reduce_in_fp32:
        yield "--grad-reduce-in-bf16", None
    zero_stage = plan.layout.zero_stage
    if zero_stage >= 1:
        yield "--use-distributed-optimizer", None
        yield "--overlap-param-gather", None
    if plan.runtime.uses_fsdp(zero_stage):
        # Gradients sharded as well (runtimes/megatron.py MEGATRON_FSDP_ZERO). Megatron-FSDP v1 runs on the
        # distributed optimizer and saves only in the fsdp_dtensor format (validate_args).
        yield "--use-megatron-fsdp", None
        yield "--data-parallel-sharding-strategy", "optim_grads"
        yield "--ckpt-format", "fsdp_dtensor"


def _batch_and_recompute_flags(plan: Plan) -> _Flags:
    L = plan.layout
    yield _axis_flag("micro_batch_size"), L.micro_batch_size
    yield "--global-batch-size", plan.spec.training.global_batch_size
    if L.recompute == "selective":
        yield "--recompute-granularity", "selective"
    elif L.recompute == "full" and L.recompute_layers:
        # Partial recomputation: the first N layers of each (virtual) pipeline stage rerun, the rest
        # keep their activations (core/recompute.py, recompute_method 'block').
        yield "--recompute-granularity", "full"
        yield "--recompute-method", "block"
        yield "--recompute-num-layers", L.recompute_layers
    elif L.recompute == "full":
        yield "--recompute-granularity", "full"
        yield "--recompute-method", "uniform"
        yield "--recompute-num-layers", 1


def _model_flags(plan: Plan) -> _Flags:
    """The model's shape, vocabulary, positions and layers, its dropouts and attention kernel."""
    m, t = plan.spec.model, plan.spec.training
    yield "--num-layers", m.num_layers
    yield "--hidden-size", m.hidden_size
    yield "--ffn-hidden-size", m.ffn_hidden_size
    yield "--num-attention-heads", m.num_attention_heads
    yield from _attention_shape_flags(m)
    yield "--seq-length", t.seq_length
    yield "--max-position-embeddings", m.max_position_embeddings or t.seq_length
    yield "--vocab-size", m.vocab_size
    yield "--make-vocab-size-divisible-by", vocab_divisor(m.vocab_size, plan.layout.tp)
    if m.position_embedding == "rope":
        # With multi-latent attention MLA applies the rotary embedding itself, to the
        # qk-pos-emb part of each head (GPTModel skips its own for MLA). MLATransformerConfig's
        # rope_type defaults to yarn, which at --rotary-scaling-factor 1 (Megatron's default) is
        # plain RoPE: YarnRotaryEmbedding's interpolated and extrapolated frequencies coincide and
        # _yarn_get_mscale(1) is 1 (core/models/common/embeddings/yarn_rotary_pos_embedding.py);
        # --rope-type rope instead would need --no-rope-fusion (MLATransformerConfig.__post_init__).
        yield "--position-embedding-type", "rope"
        yield "--rotary-base", int(m.rope_theta) if m.rope_theta == int(m.rope_theta) else m.rope_theta
    else:
        yield "--position-embedding-type", "learned_absolute"
    yield from _window_flags(m)
    yield "--normalization", "RMSNorm" if m.normalization == "rmsnorm" else "LayerNorm"
    if m.norm_epsilon != 1e-5:  # Megatron-LM's default (TransformerConfig.layernorm_epsilon): stated when it differs
        yield "--norm-epsilon", m.norm_epsilon
    yield from _activation_flags(m)
    if not m.tied_embeddings:
        yield "--untie-embeddings-and-output-weights", None
    if not m.bias:
        yield "--disable-bias-linear", None
    if m.qkv_bias:
        yield "--add-qkv-bias", None
    if m.mtp_layers:
        # DeepSeek-V3's multi-token prediction modules (Sec. 2.2); their loss weight stays at
        # Megatron's --mtp-loss-scaling-factor 0.1, DeepSeek-V3's value after its first 10T tokens
        # (Sec. 4.2).
        yield "--mtp-num-layers", m.mtp_layers
    yield "--init-method-std", m.init_method_std
    yield "--attention-dropout", t.attention_dropout
    yield "--hidden-dropout", t.hidden_dropout
    if m.attention_sinks:
        # GPT-OSS's attention sinks: a learned logit per head in the softmax's denominator
        # (TransformerConfig.softmax_type; DotProductAttention's softmax_offset parameter).
        yield "--softmax-type", "learnable"
    # Megatron-LM chooses the attention kernel with --attention-backend (--use-flash-attn is read by
    # nothing in current Megatron-LM). "unfused" materialises the s x s scores, as the cost model
    # assumes for flash_attention: false.
    yield "--attention-backend", "flash" if t.flash_attention else "unfused"


def _attention_shape_flags(m: ModelSpec) -> _Flags:
    """Query groups, the head width, multi-latent attention and QK-norm."""
    if m.gqa:
        yield "--group-query-attention", None
        yield "--num-query-groups", m.kv_heads
    if m.kv_channels is not None:
        yield "--kv-channels", m.kv_channels
    if m.mla is not None:
        a = m.mla
        yield "--multi-latent-attention", None
        if a.q_lora_rank is not None:
            yield "--q-lora-rank", a.q_lora_rank
        yield "--kv-lora-rank", a.kv_lora_rank
        # Megatron's qk-head-dim is the part without position embedding (q_head_dim = qk_head_dim
        # + qk_pos_emb_head_dim: MLATransformerConfig).
        yield "--qk-head-dim", a.qk_nope_head_dim
        yield "--qk-pos-emb-head-dim", a.qk_rope_head_dim
        yield "--v-head-dim", a.v_head_dim
        if m.hidden_size % m.num_attention_heads:
            # validate_args derives kv_channels as hidden / heads and asserts it divides; MLA's
            # attention takes its widths from the flags above and never reads it.
            yield "--kv-channels", a.qk_head_dim
    if m.qk_norm or m.mla is not None:
        # With MLA the same switch builds the RMSNorms on the query and key-value latents that
        # DeepSeek-V2/V3 have (gpt_layer_specs.py: linear_q/kv_up_proj become LayerNormLinear).
        yield "--qk-layernorm", None


def _window_flags(m: ModelSpec) -> _Flags:
    """Sliding-window attention: a query sees itself and the sliding_window - 1 tokens before it,
    Megatron's (left, right) window (127,0 for GPT-OSS's 128, examples/gptoss/02_train.sh); every
    global_attention_every-th layer sees the whole sequence (core/transformer/utils.py
    is_layer_window_attention: layer_number % freq == 0 is full)."""
    if m.sliding_window is None:
        return
    yield "--window-size", f"{m.sliding_window - 1},0"
    if m.global_attention_every is not None:
        yield "--window-attn-skip-freq", m.global_attention_every


def _has_dense_mlp(m: ModelSpec) -> bool:
    return m.moe is None or m.num_dense_layers > 0 or m.moe.shared_experts > 0


def _activation_flags(m: ModelSpec) -> _Flags:
    """The MLP's activation; GPT-OSS's clamped GLU with its +1 on the linear half."""
    if m.activation == "swiglu":
        yield "--swiglu", None
    elif m.activation == "quick_geglu":
        yield "--quick-geglu", None
        if _has_dense_mlp(m):
            # The fused bias-activation path of a dense MLP (and of the shared experts) knows
            # gelu and swiglu only (MLP.forward: "Only support fusion of gelu and swiglu");
            # the experts' grouped MLP fuses quick-GeGLU.
            yield "--no-bias-gelu-fusion", None
    if m.activation_clamp is not None:
        yield "--activation-func-clamp-value", m.activation_clamp
    if m.glu_linear_offset:
        yield "--glu-linear-offset", m.glu_linear_offset


def _moe_flags(plan: Plan) -> _Flags:
    """The experts and their router (the model, for both runtimes), then how Megatron-Core runs
    them: token dispatcher, grouped GEMM, all-to-all overlap (megatron runtime)."""
    m = plan.spec.model
    moe = m.moe
    if moe is None:
        return
    yield "--num-experts", moe.num_experts
    yield "--moe-layer-freq", moe_layer_freq(m)
    yield "--moe-ffn-hidden-size", moe.ffn_hidden_size
    if moe.shared_experts:
        yield "--moe-shared-expert-intermediate-size", moe.shared_ffn
        if moe.shared_expert_gate:
            yield "--moe-shared-expert-gate", None
    yield from _router_flags(m)
    if moe.capacity_factor is not None:
        # Tokens beyond an expert's capacity are dropped (lowest probability first, Megatron's
        # --moe-token-drop-policy probs), not padded: the experts compute what they receive.
        yield "--moe-expert-capacity-factor", moe.capacity_factor
    if not plan.runtime.reads_megatron_args:
        return
    t = plan.spec.training
    # The router's logits, softmax/sigmoid and top-k in fp32, as Megatron-LM's own DeepSeek-V3 and
    # GPT-OSS scripts run them (TransformerConfig warns without it from 32 experts on); an h x E
    # GEMM, nothing beside the experts.
    yield "--moe-router-dtype", "fp32"
    dispatcher = plan.decisions.dispatcher
    yield "--moe-token-dispatcher-type", dispatcher
    if dispatcher == "flex":
        # DeepEP: --moe-enable-deepep is deprecated for this (TransformerConfig.__post_init__).
        yield "--moe-flex-dispatcher-backend", "deepep"
    if t.moe_grouped_gemm:
        yield "--moe-grouped-gemm", None
    if plan.decisions.ep_overlap:
        yield "--overlap-moe-expert-parallel-comm", None


def _router_flags(m: ModelSpec) -> _Flags:
    """Top-k routing and load balancing (core/transformer/moe/moe_utils.py
    topk_routing_with_score_function, router.py)."""
    moe = m.moe
    assert moe is not None  # _moe_flags renders MoE models only
    yield "--moe-router-topk", moe.top_k
    yield "--moe-router-score-function", moe.router
    if moe.router == "softmax" and not moe.norm_top_k:
        # Softmax over all experts, then the top k as they are; without the switch Megatron takes
        # the top k logits and softmaxes those, which is the renormalized top-k (norm_topk_prob).
        # Sigmoid scores are always renormalized over the top k (check_model refuses the rest).
        yield "--moe-router-pre-softmax", None
    if moe.groups is not None:
        yield "--moe-router-num-groups", moe.groups
        yield "--moe-router-group-topk", moe.group_top_k
    if moe.scale != 1.0:
        yield "--moe-router-topk-scaling-factor", moe.scale
    yield "--moe-router-load-balancing-type", moe.load_balancing
    if moe.load_balancing != "none":
        yield "--moe-aux-loss-coeff", moe.aux_loss_coeff
    if moe.expert_bias:
        # Auxiliary-loss-free balancing (Wang et al. 2024); the bias moves by Megatron's default
        # --moe-router-bias-update-rate 1e-3, DeepSeek-V3's gamma (Sec. 4.2).
        yield "--moe-router-enable-expert-bias", None


def _precision_flags(plan: Plan) -> _Flags:
    t = plan.spec.training
    if t.precision == "bf16":
        yield "--bf16", None
    elif t.precision == "fp16":
        yield "--fp16", None
    if t.fp8 is not None and plan.runtime.reads_megatron_args:
        yield "--fp8-format", t.fp8
        if t.fp8_param_gather:
            yield "--fp8-param-gather", None
        if t.fp8_recipe != "delayed":
            yield "--fp8-recipe", t.fp8_recipe
            return
        # Delayed scaling over a 1024-step amax history, as Megatron-LM's own Llama/GPT examples
        # (examples/llama, examples/gpt3) run FP8.
        yield "--fp8-amax-history-len", 1024
        yield "--fp8-amax-compute-algo", "max"


def _optimizer_flags(plan: Plan) -> _Flags:
    """Adam, its learning-rate schedule over the plan's steps, and the seed."""
    t = plan.spec.training
    opt = t.optimizer
    yield "--optimizer", "adam"
    yield "--lr", opt.lr
    yield "--min-lr", opt.min_lr
    # The schedule over the plan's steps (train/loop/lr_schedule.py: the bundled entrypoint follows
    # the same formula); without a training length it is constant after warmup.
    style = t.lr_decay_style
    yield "--lr-decay-style", style
    if style == "WSD":
        yield "--lr-wsd-decay-style", opt.wsd_decay_style
        yield "--lr-wsd-decay-iters", opt.wsd_decay_steps
    yield "--lr-warmup-iters", opt.warmup_steps
    if t.train_steps is not None:
        yield "--train-iters", t.train_steps
    yield "--weight-decay", opt.weight_decay
    yield "--clip-grad", opt.grad_clip
    yield "--adam-beta1", opt.betas[0]
    yield "--adam-beta2", opt.betas[1]
    yield "--adam-eps", opt.eps
    yield "--seed", t.seed


def _tokenizer_flags(plan: Plan) -> _Flags:
    """The model's vocabulary (both runtimes)."""
    tok = plan.spec.training.data.tokenizer
    yield "--tokenizer-type", tok.type
    if tok.model is not None:
        yield "--tokenizer-model", tok.model


def _pretrain_gpt_flags(plan: Plan) -> _Flags:
    """What only pretrain_gpt.py reads: data, checkpoints, stopping. (The bundled entrypoint reads
    the same training.data from plan.yaml, its checkpoint directory from --run-dir, and stops on
    SIGUSR2 by itself.)"""
    if not plan.runtime.reads_megatron_args:
        return
    t = plan.spec.training
    if t.data.path is None:
        yield "--mock-data", None
    else:
        yield "--data-path", " ".join(t.data.path)
        yield "--split", t.data.split
    yield "--eval-interval", t.data.eval_interval
    yield "--eval-iters", t.data.eval_iters
    yield "--save", checkpoint_dir(plan)
    yield "--load", checkpoint_dir(plan)
    yield "--save-interval", plan.checkpoint.steps
    # Checkpoint and exit on EXIT_SIGNAL (megatron/training/training.py, DistributedSignalHandler);
    # job.sbatch then requeues the job, and --load resumes it.
    yield "--exit-signal-handler", None
    yield "--exit-signal", EXIT_SIGNAL
    yield from _logging_flags(plan)


def _logging_flags(plan: Plan) -> _Flags:
    """TensorBoard and Weights & Biases (training.logging), beside the checkpoints: Megatron-LM
    writes them from its last rank (megatron/training/global_vars.py _set_tensorboard_writer,
    _set_wandb_writer). Megatron-LM passes wandb no mode: its run reads WANDB_MODE from the job's
    environment (sbatch exports the submitting shell's), while the entrypoint passes logging.wandb.mode."""
    log, ckpt = plan.spec.training.logging, checkpoint_dir(plan)
    if log.tensorboard:
        yield "--tensorboard-dir", f"{ckpt}/{log.tensorboard_dir}"
        # The validation perplexity beside the loss, as the entrypoint's event files carry it.
        yield "--log-validation-ppl-to-tensorboard", None
    if log.wandb is not None:
        yield "--wandb-project", log.wandb.project
        yield "--wandb-exp-name", log.wandb.name or wandb_run_name(plan.spec.name)
        yield "--wandb-save-dir", f"{ckpt}/{log.wandb.dir}"


def wandb_run_name(spec_name: str) -> str:
    """A W&B run name from the spec's name: one word (Megatron-LM's command line splits on spaces)."""
    return "-".join(spec_name.split()) or "dsorch"


# The sections in the order their flags appear in megatron_args.txt.
_SECTIONS = (
    _parallelism_flags,
    _data_parallel_flags,
    _batch_and_recompute_flags,
    _model_flags,
    _moe_flags,
    _precision_flags,
    _optimizer_flags,
    _tokenizer_flags,
    _pretrain_gpt_flags,
)


def megatron_flags(plan: Plan) -> list[tuple[str, str | None]]:
    """(flag, value) in megatron_args.txt's order; value None for a switch."""
    return [(flag, None if value is None else _fmt(value)) for section in _SECTIONS for flag, value in section(plan)]


def render_megatron_args(plan: Plan) -> str:
    """megatron_args.txt: dsorch's flags with the spec's overrides merged in."""
    flags = merge_flags(megatron_flags(plan), plan.spec.overrides)
    return "".join(f"{k} {v}\n" if v is not None else f"{k}\n" for k, v in flags)
