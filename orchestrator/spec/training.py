"""How to train a model (TrainingSpec): sequence, batch, length, precision, the optimizer, data and
tokenizer, checkpoints and logging; the ``training:`` section of a model spec file (spec/model.py
``SpecFile``). Frozen pydantic models with ``extra="forbid"``, so that a typo is an error rather
than a silently ignored key."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from orchestrator.spec.yamlio import FROZEN


class OptimizerSpec(BaseModel):
    """AdamW hyper-parameters; written into ds_config.json and the Megatron flags."""

    model_config = FROZEN

    # Peak learning rate, reached at the end of the warmup (Megatron-LM --lr; ds_config's optimizer lr).
    lr: float = Field(default=3.0e-4, gt=0, le=10)
    # Learning rate the decay ends at, at most lr (Megatron-LM --min-lr).
    min_lr: float = Field(default=3.0e-5, ge=0, le=10)
    # AdamW's beta1 and beta2, each in [0, 1) (Megatron-LM --adam-beta1, --adam-beta2).
    betas: tuple[float, float] = (0.9, 0.95)
    # AdamW's epsilon (Megatron-LM --adam-eps).
    eps: float = Field(default=1.0e-8, gt=0, le=1)
    # AdamW's decoupled weight decay (Megatron-LM --weight-decay).
    weight_decay: float = Field(default=0.1, ge=0, le=10)
    # Steps of linear warmup up to lr (Megatron-LM --lr-warmup-iters); fewer than the training steps.
    warmup_steps: int = Field(default=2000, ge=0, le=1_000_000_000)
    # Gradients are clipped to this global L2 norm (Megatron-LM --clip-grad, ds_config's
    # gradient_clipping); 0: no clipping.
    grad_clip: float = Field(default=1.0, ge=0)
    # Megatron-LM's --lr-decay-style after the linear warmup (train/loop/lr_schedule.py has the
    # formulas, both runtimes use them). None: cosine when the spec gives a training length, else
    # constant (there is no length to decay over).
    decay_style: Literal["cosine", "linear", "WSD", "constant"] | None = None
    # WSD (warmup-stable-decay, Hu et al. 2024 "MiniCPM"): the rate stays at lr until the last
    # wsd_decay_steps steps, which anneal it to min_lr (--lr-wsd-decay-iters, --lr-wsd-decay-style).
    wsd_decay_steps: int | None = Field(default=None, gt=0, le=1_000_000_000)
    # Shape of WSD's final anneal (Megatron-LM --lr-wsd-decay-style); read with decay_style WSD only.
    wsd_decay_style: Literal["exponential", "linear", "cosine", "minus_sqrt"] = "exponential"

    @model_validator(mode="after")
    def _consistent(self) -> OptimizerSpec:
        # Megatron-LM asserts max_lr >= min_lr (training/optimizer_param_scheduler.py); AdamW
        # needs 0 <= beta < 1 (torch.optim.AdamW).
        if self.min_lr > self.lr:
            raise ValueError(
                f"min_lr {self.min_lr} is above lr {self.lr}; the schedule decays from lr to min_lr, "
                f"so make min_lr <= lr"
            )
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas {list(self.betas)} must each be in [0, 1) (AdamW's momentum coefficients)")
        return self


# A value that megatron_args.txt carries and `pretrain_gpt.py $(cat megatron_args.txt)` splits on
# whitespace: one word, no control characters.
_ONE_WORD = r"^[^\s\x00-\x1f\x7f]+$"

# Megatron-LM's tokenizers that read a model file or hub name (--tokenizer-model); NullTokenizer
# needs none (megatron/core/tokenizers/utils/build_tokenizer.py).
TOKENIZERS_WITH_MODEL = (
    "HuggingFaceTokenizer",
    "SentencePieceTokenizer",
    "GPTSentencePieceTokenizer",
    "Llama2Tokenizer",
    "TikTokenizer",
)


class TokenizerSpec(BaseModel):
    """Megatron-LM's --tokenizer-type and --tokenizer-model. NullTokenizer (token ids are the
    data) needs no files and goes with mock data or pre-tokenized data; a real run names its
    tokenizer, e.g. HuggingFaceTokenizer with a path or hub name."""

    model_config = FROZEN

    # Megatron-LM --tokenizer-type; every type but NullTokenizer needs model.
    type: Literal[
        "NullTokenizer",
        "HuggingFaceTokenizer",
        "SentencePieceTokenizer",
        "GPTSentencePieceTokenizer",
        "Llama2Tokenizer",
        "TikTokenizer",
    ] = "NullTokenizer"
    model: str | None = Field(default=None, pattern=_ONE_WORD, description="--tokenizer-model: path or hub name")

    @model_validator(mode="after")
    def _model_when_needed(self) -> TokenizerSpec:
        if self.type in TOKENIZERS_WITH_MODEL and self.model is None:
            raise ValueError(
                f"tokenizer type {self.type} reads its vocabulary from a file: set tokenizer.model to its "
                f"path (or hub name)"
            )
        if self.type == "NullTokenizer" and self.model is not None:
            raise ValueError("NullTokenizer reads no file: remove tokenizer.model, or name the tokenizer type")
        return self


class DataSpec(BaseModel):
    """Training data for Megatron-LM (--data-path, --split) and its tokenizer. Without a path,
    --mock-data: synthetic tokens, for a first run and for benchmarks. The bundled entrypoint
    trains on the same (orchestrator/train/data/fingerprint.py run_data); `--data` overrides it per run."""

    model_config = FROZEN

    path: tuple[str, ...] | None = Field(
        default=None,
        min_length=1,
        description="--data-path: indexed-dataset prefixes, each optionally preceded by its weight",
    )
    split: str = Field(
        default="969,30,1",
        pattern=r"^\d+(\.\d+)?(,\d+(\.\d+)?){0,2}$",
        description="--split: train,valid,test proportions",
    )
    # The tokenizer (Megatron-LM --tokenizer-type, --tokenizer-model).
    tokenizer: TokenizerSpec = TokenizerSpec()
    # Validation: Megatron-LM needs --eval-interval to size its datasets (its default became None;
    # get_train_valid_test_num_samples in megatron/training/training.py divides by it).
    eval_interval: int = Field(default=1000, gt=0, le=1_000_000_000, description="--eval-interval, in steps")
    eval_iters: int = Field(default=100, ge=0, le=1_000_000_000, description="--eval-iters, batches per evaluation")

    @model_validator(mode="after")
    def _words(self) -> DataSpec:
        import re

        for i, item in enumerate(self.path or ()):
            if not re.fullmatch(_ONE_WORD, item):
                raise ValueError(
                    f"data.path[{i}] {item!r} has whitespace or control characters; Megatron-LM's "
                    f"command line cannot carry it: rename or link the file"
                )
        self.blend()  # a list Megatron-LM would misread is refused at load
        return self

    def blend(self) -> list[tuple[float | None, str]]:
        """path as Megatron-LM reads --data-path: (weight, prefix) pairs, weight None when unweighted;
        empty without a path (``parse_blend``)."""
        return parse_blend(self.path or ())


def parse_blend(items, where: str = "training.data.path") -> list[tuple[float | None, str]]:
    """Megatron-LM's --data-path list as (weight, prefix) pairs, weights as given (not normalized).

    megatron/core/datasets/utils.py get_blend_from_list: an even-length list whose every other item
    (from the first) is a number is weights and prefixes; otherwise every item is a prefix, weight
    None. A list that mixes the two ("0.3 a b c"), or a weight that is not positive, is refused:
    Megatron would read the numbers as file names, or divide by a zero total (normalize)."""
    items = [str(item).strip() for item in items]
    numbers: list[float | None] = []
    for raw in items[0::2] if len(items) % 2 == 0 else ():
        try:
            numbers.append(float(raw))
        except ValueError:
            numbers.append(None)
    if not numbers or all(w is None for w in numbers):
        if any(_is_number(item) for item in items):
            raise ValueError(_blend_fix(items, where))
        return [(None, item) for item in items]
    if not all(w is not None and w > 0 and math.isfinite(w) for w in numbers):
        raise ValueError(_blend_fix(items, where))
    return [(w, prefix) for w, prefix in zip(numbers, items[1::2], strict=True)]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _blend_fix(items: list[str], where: str) -> str:
    return (
        f"{where} {' '.join(items)!r}: give either prefixes only, or weight prefix pairs with every weight "
        f"a positive number ('0.3 a 0.7 b'), as Megatron-LM's --data-path takes them"
    )


class CheckpointSpec(BaseModel):
    """Where Megatron-LM saves and resumes (--save/--load) and how often (--save-interval). A job
    `dsorch submit` starts saves into its run directory's checkpoints instead (plandir/rundir.py)."""

    model_config = FROZEN

    dir: str = Field(
        default="checkpoints", pattern=_ONE_WORD, description="relative paths are relative to the plan directory"
    )
    # auto: Young/Daly's interval from the plan's step time, the checkpoint's write time and the
    # cluster's failure rate, capped by the allocation's time limit (costmodel/checkpoint.py).
    interval: int | Literal["auto"] = Field(
        default="auto", description="--save-interval, in steps, or auto (chosen with the plan)"
    )

    @field_validator("interval", mode="before")
    @classmethod
    def _steps_or_auto(cls, v: object) -> object:
        # One message for both arms of the union (pydantic would name each arm apart).
        if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 1_000_000_000):
            return v
        raise ValueError("give a number of steps from 1 to 1000000000, or auto")


class WandbSpec(BaseModel):
    """Weights & Biases (Megatron-LM --wandb-project, --wandb-exp-name, --wandb-save-dir; the
    optional extra ``dsorch[wandb]``). offline writes the run under ``dir`` with no network, for
    `wandb sync` later; mode reaches wandb as WANDB_MODE."""

    model_config = FROZEN

    # W&B project (Megatron-LM --wandb-project).
    project: str = Field(min_length=1, pattern=_ONE_WORD)
    name: str | None = Field(default=None, pattern=_ONE_WORD, description="run name (default: the spec's name)")
    # offline: no network, the run is written under dir for `wandb sync`. The bundled entrypoint passes it to
    # wandb; Megatron-LM gets no mode and reads WANDB_MODE from the job's environment.
    mode: Literal["online", "offline"] = "offline"
    dir: str = Field(default="wandb", pattern=_ONE_WORD, description="relative to the run directory")


class LoggingSpec(BaseModel):
    """Where metrics go besides the run directory's step records (plandir/rundir.py RunDir.metrics)
    and the log: TensorBoard event files (``dsorch[tensorboard]``; --tensorboard-dir for Megatron-LM)
    and Weights & Biases. Both carry what the step records carry: loss, lr, grad norm, step time,
    memory, eval loss and perplexity."""

    model_config = FROZEN

    # Write TensorBoard event files (the optional extra dsorch[tensorboard]; Megatron-LM --tensorboard-dir).
    tensorboard: bool = False
    tensorboard_dir: str = Field(default="tensorboard", pattern=_ONE_WORD, description="relative to the run directory")
    # Log to Weights & Biases; None: off.
    wandb: WandbSpec | None = None


class TrainingSpec(BaseModel):
    """How to train: sequence length, global batch, length, precision, optimizer, data."""

    model_config = FROZEN

    # Tokens per training sequence (Megatron-LM --seq-length).
    seq_length: int = Field(gt=0, le=100_000_000)
    global_batch_size: int = Field(gt=0, le=100_000_000, description="sequences per optimizer step")
    # Mixed precision bf16 or fp16 (Megatron-LM --bf16 / --fp16, ds_config's bf16 / fp16), or plain fp32;
    # also which gpu.peak_tflops the cost model and MFU use.
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    # Training length in tokens (or steps, not both): steps = train_tokens / (global_batch_size x
    # seq_length), rounded (Megatron-LM --train-iters).
    train_tokens: float | None = Field(default=None, gt=0)
    # Or the length in optimizer steps (Megatron-LM's --train-iters); one of the two is needed by
    # Megatron-LM's pretrain ("either train-iters or train-samples should be provided").
    steps: int | None = Field(default=None, gt=0, le=1_000_000_000_000)
    # FlashAttention (Dao et al. 2022) keeps no s x s score matrix for the backward pass.
    flash_attention: bool = True
    # Dropout probability on the hidden states: embedding, attention and MLP outputs (Megatron-LM
    # --hidden-dropout); 0: none.
    hidden_dropout: float = Field(default=0.0, ge=0, lt=1)
    # Dropout probability on the attention probabilities (Megatron-LM --attention-dropout); 0: none.
    attention_dropout: float = Field(default=0.0, ge=0, lt=1)
    seed: int = Field(default=1234, ge=0, lt=2**63)  # torch.manual_seed takes a 64-bit integer
    # FP8 GEMMs on top of bf16 (Transformer Engine, Megatron-LM --fp8-format): "hybrid" is E4M3
    # forward and E5M2 gradients (Micikevicius et al. 2022, "FP8 Formats for Deep Learning").
    # Megatron-LM runtime only, on GPUs whose profile states a peak_tflops.fp8.
    fp8: Literal["hybrid", "e4m3"] | None = None
    # How Transformer Engine scales the FP8 tensors (Megatron-LM --fp8-recipe, default delayed):
    # delayed (amax history, scale from past steps), tensorwise (current scaling: one scale per
    # tensor from its own amax), blockwise (1x128/128x128 blocks) or mxfp8 (MXFP8BlockScaling: 32
    # values per E8M0 scale; Blackwell tensor cores). Read only with fp8.
    fp8_recipe: Literal["delayed", "tensorwise", "blockwise", "mxfp8"] = "delayed"
    # Megatron-LM engine options (megatron runtime only). tp_comm_overlap: --tp-comm-overlap,
    # Transformer Engine's userbuffers hide the TP collectives behind the GEMMs; it applies to the
    # layouts with tp > 1 and sequence parallelism (validate_args refuses it elsewhere).
    tp_comm_overlap: bool = False
    # The interleaved schedule overlaps its sends with compute by default; false emits
    # --no-overlap-p2p-communication.
    overlap_p2p_comm: bool = True
    # bf16: accumulate and reduce the gradients in an fp32 buffer (4 bytes per parameter, whole on
    # every rank), the default of Megatron-LM (validate_args sets accumulate_allreduce_grads_in_fp32
    # for bf16 unless --grad-reduce-in-bf16) and of NeMo's bf16_mixed (grad_reduce_in_fp32=True);
    # false: a bf16 buffer (2 bytes), --grad-reduce-in-bf16, as Megatron-Core's own
    # DistributedDataParallelConfig defaults to.
    grad_reduce_in_fp32: bool = True
    # FP8 weights only (Megatron-LM --fp8-param-gather): Transformer Engine keeps each FP8 layer's
    # weight as an FP8 tensor (and its transpose), with no bf16 copy; the distributed optimizer casts
    # its fp32 main weights straight into it and all-gathers FP8 (megatron/core/fp8_utils.py). 2 bytes
    # per FP8 weight instead of 4 (bf16 + FP8 cache). Needs fp8 and the distributed optimizer or
    # Megatron-FSDP (validate_args); Megatron-Bridge's FP8 presets set it (training/mixed_precision.py
    # bf16_with_fp8_current_scaling_mixed, bf16_with_mxfp8_mixed).
    fp8_param_gather: bool = False
    # How context parallelism (cp > 1) exchanges the sequence (Megatron-LM --cp-comm-type, default
    # p2p; Transformer Engine attention/dot_product_attention/context_parallel.py): p2p passes K and
    # V around the cp ring, each step overlapped with one block of attention (AttnFuncWithCPAndKVP2P);
    # a2a scatters heads and gathers the sequence with all-to-alls, as DeepSpeed-Ulysses
    # (AttnFuncWithCPAndQKVOA2A; needs the heads of every tp rank divisible by cp); all_gather gathers
    # the whole K and V before attention, not overlapped (AttnFuncWithCPAndKVAllGather); a2a+p2p runs
    # a2a among the cp ranks of one NVLink domain and the p2p ring across domains (hierarchical CP).
    cp_comm_type: Literal["p2p", "a2a", "all_gather", "a2a+p2p"] = "p2p"
    # Mixture-of-experts engine options (MoE models only). The token dispatcher
    # (--moe-token-dispatcher-type): alltoall, allgather, or flex with DeepEP (the profile's
    # features.deepep says whether the cluster has it); None picks flex where DeepEP is available,
    # else alltoall. Grouped GEMM runs a rank's local experts as one kernel (--moe-grouped-gemm).
    moe_dispatcher: Literal["alltoall", "allgather", "flex"] | None = None
    # Megatron-LM --moe-grouped-gemm: a rank's local experts as one grouped GEMM.
    moe_grouped_gemm: bool = True
    # The dispatch and combine all-to-alls overlapped with another micro-batch's compute
    # (Megatron-LM --overlap-moe-expert-parallel-comm, 1F1B A2A overlap).
    moe_overlap_ep_comm: bool = False
    # Tokens on the busiest expert rank over the balanced share. 1.0 is balanced routing, what the
    # published MoE benchmarks force (Megatron-Bridge: moe_router_force_load_balancing); a real
    # router early in training is less even: raise it to plan for that.
    moe_load_imbalance: float = Field(default=1.0, ge=1.0, le=100.0)
    # AdamW and its learning-rate schedule.
    optimizer: OptimizerSpec = OptimizerSpec()
    # Training data, validation and tokenizer.
    data: DataSpec = DataSpec()
    # Where checkpoints are saved and how often.
    checkpoint: CheckpointSpec = CheckpointSpec()
    # A local Hugging Face model directory (config.json and *.safetensors) whose weights the bundled
    # entrypoint loads before the first step (orchestrator/train/model/hf_weights.py). Llama, Mistral and
    # Qwen2 families; the megatron runtime does not read it (its plans say so).
    init_from: str | None = Field(
        default=None, pattern=_ONE_WORD, description="Hugging Face directory the deepspeed runtime starts from"
    )
    # Metrics sinks beside the run directory: TensorBoard, Weights & Biases.
    logging: LoggingSpec = LoggingSpec()

    @property
    def train_steps(self) -> int | None:
        if self.steps is not None:
            return self.steps
        if self.train_tokens is None:
            return None
        return max(1, int(round(self.train_tokens / (self.global_batch_size * self.seq_length))))

    @property
    def lr_decay_style(self) -> str:
        """optimizer.decay_style, or its default: cosine over the planned steps, constant without any."""
        style = self.optimizer.decay_style
        if style is not None:
            return style
        return "cosine" if self.train_steps is not None else "constant"

    @property
    def tokens(self) -> float | None:
        """Tokens trained on: train_tokens, or steps x global batch x sequence."""
        if self.train_tokens is not None:
            return self.train_tokens
        return None if self.steps is None else float(self.steps * self.global_batch_size * self.seq_length)

    @model_validator(mode="after")
    def _warmup_fits(self) -> TrainingSpec:
        if self.fp8 is not None and self.precision != "bf16":
            raise ValueError(
                f"training.fp8 {self.fp8!r} runs FP8 GEMMs on a bf16 model (Megatron-LM --bf16 "
                f"--fp8-format); set training.precision to bf16 or drop training.fp8"
            )
        if self.steps is not None and self.train_tokens is not None:
            raise ValueError("training.steps and training.train_tokens both give the training length; keep one")
        steps = self.train_steps
        if steps is not None and self.optimizer.warmup_steps >= steps:
            # Megatron-LM asserts lr_warmup_steps < lr_decay_steps (optimizer_param_scheduler.py).
            raise ValueError(
                f"optimizer.warmup_steps {self.optimizer.warmup_steps} is not below the {steps} training "
                f"steps; shorten the warmup or train longer"
            )
        self._schedule_fits(steps)
        return self

    def _schedule_fits(self, steps: int | None) -> None:
        opt = self.optimizer
        style = self.lr_decay_style
        if steps is None and style != "constant":
            raise ValueError(
                f"optimizer.decay_style {style} decays over the training length, and the spec gives none: "
                f"set training.steps or training.train_tokens, or use decay_style constant"
            )
        if style != "WSD":
            if opt.wsd_decay_steps is not None:
                raise ValueError(
                    f"optimizer.wsd_decay_steps applies to decay_style WSD, not {style}: drop it or set decay_style WSD"
                )
            return
        if opt.wsd_decay_steps is None:
            # Megatron-LM asserts wsd_decay_steps is set with WSD (optimizer_param_scheduler.py).
            raise ValueError("optimizer.decay_style WSD needs optimizer.wsd_decay_steps, the steps of its final anneal")
        if steps is not None and opt.wsd_decay_steps > steps - opt.warmup_steps:
            raise ValueError(
                f"optimizer.wsd_decay_steps {opt.wsd_decay_steps} does not fit after the {opt.warmup_steps} warmup "
                f"steps of the {steps} training steps; make it at most {steps - opt.warmup_steps}"
            )
