"""Megatron-LM launch flags for the chosen layout, one flag per line in a fixed order.

The flag names are Megatron-LM's (megatron/training/arguments.py); they are checked against the
argument table extracted from the real file (orchestrator/validate/megatron.py). The file has no
comment lines so that ``pretrain_gpt.py $(cat megatron_args.txt)`` works as it is; its provenance
is in plan.yaml.
"""

from __future__ import annotations

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


def megatron_flags(plan: Plan) -> list[tuple[str, str | None]]:
    L = plan.layout
    m = plan.spec.model
    t = plan.spec.training
    opt = t.optimizer
    f: list[tuple[str, str | None]] = []
    add = lambda flag, value=None: f.append((flag, None if value is None else _fmt(value)))  # noqa: E731

    # --- layout ---
    add("--tensor-model-parallel-size", L.tp)
    add("--pipeline-model-parallel-size", L.pp)
    if L.cp > 1:
        # Ring attention over cp ranks (cp_comm_type p2p, Megatron's default, as the cost model has it).
        add("--context-parallel-size", L.cp)
        add("--cp-comm-type", "p2p")
    split = stage_split(m.num_layers, L.pp)
    if split is not None and split.kind == "edge-light":
        # First and last stages hold the embedding and the output layer and loss, so one layer
        # fewer each: Megatron counts them as a layer of the split, which also works with the
        # interleaved schedule (the first chunk of the first rank and the last chunk of the last
        # rank are one layer short; TransformerConfig.__post_init__, transformer_block.py).
        add("--account-for-embedding-in-pipeline-split")
        add("--account-for-loss-in-pipeline-split")
    if L.vpp > 1 and split is not None:
        add("--num-layers-per-virtual-pipeline-stage", split.middle // L.vpp)
        if not t.overlap_p2p_comm:
            add("--no-overlap-p2p-communication")
    if L.sequence_parallel:
        add("--sequence-parallel")
    tp_overlap = uses_tp_overlap(plan.runtime, t, L)
    if plan.runtime == "megatron" and (L.cp > 1 or t.fp8 is not None or tp_overlap):
        # Context parallelism, FP8 and TP overlap live in Transformer Engine's modules (Megatron's
        # default implementation; stated so that a reviewer sees what the plan needs installed).
        add("--transformer-impl", "transformer_engine")
    if tp_overlap:
        add("--tp-comm-overlap")
    if plan.runtime == "megatron":
        # The cost model assumes Megatron overlaps the data-parallel reduction with the backward
        # pass (and the distributed optimizer's parameter all-gather with the next forward).
        add("--overlap-grad-reduce")
        if L.zero_stage >= 1:
            add("--use-distributed-optimizer")
            add("--overlap-param-gather")
        if uses_megatron_fsdp(plan.runtime, L.zero_stage):
            # Gradients sharded as well (rules.MEGATRON_FSDP_ZERO). Megatron-FSDP v1 runs on the
            # distributed optimizer and saves only in the fsdp_dtensor format (validate_args).
            add("--use-megatron-fsdp")
            add("--data-parallel-sharding-strategy", "optim_grads")
            add("--ckpt-format", "fsdp_dtensor")
    add("--micro-batch-size", L.micro_batch_size)
    add("--global-batch-size", t.global_batch_size)
    if L.recompute == "selective":
        add("--recompute-granularity", "selective")
    elif L.recompute == "full":
        add("--recompute-granularity", "full")
        add("--recompute-method", "uniform")
        add("--recompute-num-layers", 1)

    # --- model ---
    add("--num-layers", m.num_layers)
    add("--hidden-size", m.hidden_size)
    add("--ffn-hidden-size", m.ffn_hidden_size)
    add("--num-attention-heads", m.num_attention_heads)
    if m.gqa:
        add("--group-query-attention")
        add("--num-query-groups", m.kv_heads)
    add("--seq-length", t.seq_length)
    add("--max-position-embeddings", m.max_position_embeddings or t.seq_length)
    add("--vocab-size", m.vocab_size)
    add("--make-vocab-size-divisible-by", vocab_divisor(m.vocab_size, L.tp))
    if m.position_embedding == "rope":
        add("--position-embedding-type", "rope")
        add("--rotary-base", int(m.rope_theta) if m.rope_theta == int(m.rope_theta) else m.rope_theta)
    else:
        add("--position-embedding-type", "learned_absolute")
    add("--normalization", "RMSNorm" if m.normalization == "rmsnorm" else "LayerNorm")
    if m.activation == "swiglu":
        add("--swiglu")
    if not m.tied_embeddings:
        add("--untie-embeddings-and-output-weights")
    if not m.bias:
        add("--disable-bias-linear")
    if m.qkv_bias:
        add("--add-qkv-bias")
    add("--init-method-std", m.init_method_std)
    add("--attention-dropout", t.attention_dropout)
    add("--hidden-dropout", t.hidden_dropout)
    # Megatron-LM chooses the attention kernel with --attention-backend (--use-flash-attn is read by
    # nothing in current Megatron-LM). "unfused" materialises the s x s scores, as the cost model
    # assumes for flash_attention: false.
    add("--attention-backend", "flash" if t.flash_attention else "unfused")

    # --- precision and optimizer ---
    if t.precision == "bf16":
        add("--bf16")
    elif t.precision == "fp16":
        add("--fp16")
    if t.fp8 is not None and plan.runtime == "megatron":
        # Delayed scaling over a 1024-step amax history, as Megatron-LM's own Llama/GPT examples
        # (examples/llama, examples/gpt3) run FP8.
        add("--fp8-format", t.fp8)
        add("--fp8-amax-history-len", 1024)
        add("--fp8-amax-compute-algo", "max")
    add("--optimizer", "adam")
    add("--lr", opt.lr)
    add("--min-lr", opt.min_lr)
    # Cosine decay to --min-lr over the plan's steps; without train_tokens there is no length to
    # decay over, so the rate stays constant after warmup (ds_config's WarmupLR does the same).
    add("--lr-decay-style", "cosine" if t.train_steps is not None else "constant")
    add("--lr-warmup-iters", opt.warmup_steps)
    if t.train_steps is not None:
        add("--train-iters", t.train_steps)
    add("--weight-decay", opt.weight_decay)
    add("--clip-grad", opt.grad_clip)
    add("--adam-beta1", opt.betas[0])
    add("--adam-beta2", opt.betas[1])
    add("--adam-eps", opt.eps)
    add("--seed", t.seed)

    # --- tokenizer: the model's vocabulary (both runtimes) ---
    tok = t.data.tokenizer
    add("--tokenizer-type", tok.type)
    if tok.model is not None:
        add("--tokenizer-model", tok.model)
    if plan.runtime == "megatron":
        # --- what only pretrain_gpt.py reads: data, checkpoints, stopping ---
        # (The bundled entrypoint takes its data from `dsorch submit --data`, its checkpoint
        # directory from --run-dir, and stops on SIGUSR2 by itself.)
        if t.data.path is None:
            add("--mock-data")
        else:
            add("--data-path", " ".join(t.data.path))
            add("--split", t.data.split)
        add("--eval-interval", t.data.eval_interval)
        add("--eval-iters", t.data.eval_iters)
        add("--save", checkpoint_dir(plan))
        add("--load", checkpoint_dir(plan))
        add("--save-interval", t.checkpoint.interval)
        # Checkpoint and exit on EXIT_SIGNAL (megatron/training/training.py, DistributedSignalHandler);
        # job.sbatch then requeues the job, and --load resumes it.
        add("--exit-signal-handler")
        add("--exit-signal", EXIT_SIGNAL)
    return f


def render_megatron_args(plan: Plan) -> str:
    return "".join(f"{k} {v}\n" if v is not None else f"{k}\n" for k, v in megatron_flags(plan))
