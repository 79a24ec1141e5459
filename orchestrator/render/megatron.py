"""Megatron-LM launch flags for the chosen layout, one flag per line in a fixed order.

The flag names are Megatron-LM's (megatron/training/arguments.py); they are checked against the
argument table extracted from the real file (orchestrator/validate/megatron.py). The file has no
comment lines so that ``pretrain_gpt.py $(cat megatron_args.txt)`` works as it is; its provenance
is in plan.yaml.
"""

from __future__ import annotations

from collections.abc import Iterator

from orchestrator.plan.make import Plan
from orchestrator.plan.rules import stage_split, uses_megatron_fsdp, uses_tp_overlap


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


def _parallelism_flags(plan: Plan) -> _Flags:
    """The parallel degrees, the pipeline's layer split, and what tensor/context parallelism need."""
    L, t = plan.layout, plan.spec.training
    yield "--tensor-model-parallel-size", L.tp
    yield "--pipeline-model-parallel-size", L.pp
    if L.cp > 1:
        # Ring attention over cp ranks (cp_comm_type p2p, Megatron's default, as the cost model has it).
        yield "--context-parallel-size", L.cp
        yield "--cp-comm-type", "p2p"
    split = stage_split(plan.spec.model.num_layers, L.pp, plan.spec.model.mtp_layers)
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
        yield "--sequence-parallel", None
    tp_overlap = uses_tp_overlap(plan.runtime, t, L)
    if plan.runtime == "megatron" and (L.cp > 1 or t.fp8 is not None or tp_overlap):
        # Context parallelism, FP8 and TP overlap live in Transformer Engine's modules (Megatron's
        # default implementation; stated so that a reviewer sees what the plan needs installed).
        yield "--transformer-impl", "transformer_engine"
    if tp_overlap:
        yield "--tp-comm-overlap", None


def _data_parallel_flags(plan: Plan) -> _Flags:
    """Megatron's data-parallel overlap and sharding: distributed optimizer, Megatron-FSDP."""
    if plan.runtime != "megatron":
        return
    # The cost model assumes Megatron overlaps the data-parallel reduction with the backward
    # pass (and the distributed optimizer's parameter all-gather with the next forward).
    yield "--overlap-grad-reduce", None
    zero_stage = plan.layout.zero_stage
    if zero_stage >= 1:
        yield "--use-distributed-optimizer", None
        yield "--overlap-param-gather", None
    if uses_megatron_fsdp(plan.runtime, zero_stage):
        # Gradients sharded as well (rules.MEGATRON_FSDP_ZERO). Megatron-FSDP v1 runs on the
        # distributed optimizer and saves only in the fsdp_dtensor format (validate_args).
        yield "--use-megatron-fsdp", None
        yield "--data-parallel-sharding-strategy", "optim_grads"
        yield "--ckpt-format", "fsdp_dtensor"


def _batch_and_recompute_flags(plan: Plan) -> _Flags:
    L = plan.layout
    yield "--micro-batch-size", L.micro_batch_size
    yield "--global-batch-size", plan.spec.training.global_batch_size
    if L.recompute == "selective":
        yield "--recompute-granularity", "selective"
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
    if m.gqa:
        yield "--group-query-attention", None
        yield "--num-query-groups", m.kv_heads
    yield "--seq-length", t.seq_length
    yield "--max-position-embeddings", m.max_position_embeddings or t.seq_length
    yield "--vocab-size", m.vocab_size
    yield "--make-vocab-size-divisible-by", vocab_divisor(m.vocab_size, plan.layout.tp)
    if m.position_embedding == "rope":
        yield "--position-embedding-type", "rope"
        yield "--rotary-base", int(m.rope_theta) if m.rope_theta == int(m.rope_theta) else m.rope_theta
    else:
        yield "--position-embedding-type", "learned_absolute"
    yield "--normalization", "RMSNorm" if m.normalization == "rmsnorm" else "LayerNorm"
    if m.activation == "swiglu":
        yield "--swiglu", None
    if not m.tied_embeddings:
        yield "--untie-embeddings-and-output-weights", None
    if not m.bias:
        yield "--disable-bias-linear", None
    if m.qkv_bias:
        yield "--add-qkv-bias", None
    yield "--init-method-std", m.init_method_std
    yield "--attention-dropout", t.attention_dropout
    yield "--hidden-dropout", t.hidden_dropout
    # Megatron-LM chooses the attention kernel with --attention-backend (--use-flash-attn is read by
    # nothing in current Megatron-LM). "unfused" materialises the s x s scores, as the cost model
    # assumes for flash_attention: false.
    yield "--attention-backend", "flash" if t.flash_attention else "unfused"


def _precision_flags(plan: Plan) -> _Flags:
    t = plan.spec.training
    if t.precision == "bf16":
        yield "--bf16", None
    elif t.precision == "fp16":
        yield "--fp16", None
    if t.fp8 is not None and plan.runtime == "megatron":
        # Delayed scaling over a 1024-step amax history, as Megatron-LM's own Llama/GPT examples
        # (examples/llama, examples/gpt3) run FP8.
        yield "--fp8-format", t.fp8
        yield "--fp8-amax-history-len", 1024
        yield "--fp8-amax-compute-algo", "max"


def _optimizer_flags(plan: Plan) -> _Flags:
    """Adam, its learning-rate schedule over the plan's steps, and the seed."""
    t = plan.spec.training
    opt = t.optimizer
    yield "--optimizer", "adam"
    yield "--lr", opt.lr
    yield "--min-lr", opt.min_lr
    # Cosine decay to --min-lr over the plan's steps; without train_tokens there is no length to
    # decay over, so the rate stays constant after warmup (ds_config's WarmupLR does the same).
    yield "--lr-decay-style", "cosine" if t.train_steps is not None else "constant"
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
    """What only pretrain_gpt.py reads: data, checkpoints, stopping. (The bundled entrypoint takes
    its data from `dsorch submit --data`, its checkpoint directory from --run-dir, and stops on
    SIGUSR2 by itself.)"""
    if plan.runtime != "megatron":
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
    yield "--save-interval", t.checkpoint.interval
    # Checkpoint and exit on EXIT_SIGNAL (megatron/training/training.py, DistributedSignalHandler);
    # job.sbatch then requeues the job, and --load resumes it.
    yield "--exit-signal-handler", None
    yield "--exit-signal", EXIT_SIGNAL


# The sections in the order their flags appear in megatron_args.txt.
_SECTIONS = (
    _parallelism_flags,
    _data_parallel_flags,
    _batch_and_recompute_flags,
    _model_flags,
    _precision_flags,
    _optimizer_flags,
    _tokenizer_flags,
    _pretrain_gpt_flags,
)


def megatron_flags(plan: Plan) -> list[tuple[str, str | None]]:
    """(flag, value) in megatron_args.txt's order; value None for a switch."""
    return [(flag, None if value is None else _fmt(value)) for section in _SECTIONS for flag, value in section(plan)]


def render_megatron_args(plan: Plan) -> str:
    return "".join(f"{k} {v}\n" if v is not None else f"{k}\n" for k, v in megatron_flags(plan))
