"""What model (ModelSpec) and how to train it (TrainingSpec): a model spec file. Frozen pydantic
models with ``extra="forbid"``, so that a typo is an error rather than a silently ignored key."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from orchestrator.errors import SpecError
from orchestrator.spec.yamlio import FROZEN, Loaded, format_validation, load_yaml

# --------------------------------------------------------------------------------------------
# Model spec
# --------------------------------------------------------------------------------------------


class ModelSpec(BaseModel):
    """Decoder-only transformer architecture (Llama / GPT family)."""

    model_config = FROZEN

    num_layers: int = Field(gt=0, le=100_000)
    hidden_size: int = Field(gt=0, le=10_000_000)
    ffn_hidden_size: int = Field(gt=0, le=100_000_000)
    num_attention_heads: int = Field(gt=0, le=1_000_000)
    # GQA (Ainslie et al. 2023): equal to num_attention_heads (plain MHA) when omitted.
    num_kv_heads: int | None = Field(default=None, gt=0, le=1_000_000)
    vocab_size: int = Field(gt=0, le=100_000_000)
    # swiglu (Shazeer 2020; Llama) and geglu (Gemma) are gated: three MLP matrices; gelu two.
    activation: Literal["swiglu", "geglu", "gelu"] = "swiglu"
    tied_embeddings: bool = False
    normalization: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    position_embedding: Literal["rope", "learned"] = "rope"
    # Biases on the linear layers (GPT-2/3 style); Llama has none.
    bias: bool = False
    # Biases on the query, key and value projections only (Qwen2; Megatron-LM --add-qkv-bias).
    qkv_bias: bool = False
    # Attention and MLP read the same input, each through its own norm, and both add to the
    # residual (GPT-J, GPT-NeoX/Pythia, Falcon 40B/180B). Same parameters and FLOPs as the
    # sequential block; the megatron runtime has no such block and refuses it.
    parallel_residual: bool = False
    max_position_embeddings: int | None = Field(default=None, gt=0, le=100_000_000)
    rope_theta: float = Field(default=10000.0, gt=0)
    init_method_std: float = Field(default=0.02, gt=0)

    @model_validator(mode="after")
    def _shapes(self) -> ModelSpec:
        a, kv = self.num_attention_heads, self.kv_heads
        if self.hidden_size % a:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {a}; "
                f"choose heads that divide the hidden size (head_dim = hidden_size / heads)"
            )
        if self.bias and self.qkv_bias:
            raise ValueError("bias: true already puts biases on the query, key and value projections; drop qkv_bias")
        if a % kv:
            raise ValueError(
                f"num_attention_heads {a} is not divisible by num_kv_heads {kv}; "
                f"GQA needs every key/value head shared by the same number of query heads"
            )
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads if self.num_kv_heads is not None else self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def gated(self) -> bool:
        """A gated MLP (gate, up and down matrices)."""
        return self.activation in ("swiglu", "geglu")

    @property
    def gqa(self) -> bool:
        return self.kv_heads != self.num_attention_heads

    # ---- parameter counts (exact for the architecture as described) ----

    @property
    def params_per_layer(self) -> int:
        h, f = self.hidden_size, self.ffn_hidden_size
        kv_dim = self.kv_heads * self.head_dim
        attn = h * h + 2 * h * kv_dim + h * h  # Q, K, V, output projection
        mlp = (3 if self.gated else 2) * h * f  # gate+up+down / up+down
        norms = (2 if self.normalization == "layernorm" else 1) * 2 * h  # two norms per layer
        qkv_bias = h + 2 * kv_dim
        bias = (qkv_bias + h + (2 * f if self.gated else f) + h) if self.bias else qkv_bias if self.qkv_bias else 0
        return attn + mlp + norms + bias

    @property
    def embedding_params(self) -> int:
        pos = (self.max_position_embeddings or 0) * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    @property
    def output_params(self) -> int:
        """Output projection (0 when tied to the input embedding) plus the final norm."""
        final_norm = (2 if self.normalization == "layernorm" else 1) * self.hidden_size
        return (0 if self.tied_embeddings else self.vocab_size * self.hidden_size) + final_norm

    @property
    def num_params(self) -> int:
        return self.num_layers * self.params_per_layer + self.embedding_params + self.output_params


class OptimizerSpec(BaseModel):
    """AdamW hyper-parameters; written into ds_config.json and the Megatron flags."""

    model_config = FROZEN

    lr: float = Field(default=3.0e-4, gt=0, le=10)
    min_lr: float = Field(default=3.0e-5, ge=0, le=10)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(default=1.0e-8, gt=0, le=1)
    weight_decay: float = Field(default=0.1, ge=0, le=10)
    warmup_steps: int = Field(default=2000, ge=0, le=1_000_000_000)
    grad_clip: float = Field(default=1.0, ge=0)

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
    takes its data from `dsorch submit --data` instead."""

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
        return self


class CheckpointSpec(BaseModel):
    """Where Megatron-LM saves and resumes (--save/--load) and how often (--save-interval)."""

    model_config = FROZEN

    dir: str = Field(
        default="checkpoints", pattern=_ONE_WORD, description="relative paths are relative to the plan directory"
    )
    interval: int = Field(default=1000, gt=0, le=1_000_000_000, description="--save-interval, in steps")


class TrainingSpec(BaseModel):
    """How to train: sequence length, global batch, length, precision, optimizer, data."""

    model_config = FROZEN

    seq_length: int = Field(gt=0, le=100_000_000)
    global_batch_size: int = Field(gt=0, le=100_000_000, description="sequences per optimizer step")
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    train_tokens: float | None = Field(default=None, gt=0)
    # Or the length in optimizer steps (Megatron-LM's --train-iters); one of the two is needed by
    # Megatron-LM's pretrain ("either train-iters or train-samples should be provided").
    steps: int | None = Field(default=None, gt=0, le=1_000_000_000_000)
    # FlashAttention (Dao et al. 2022) keeps no s x s score matrix for the backward pass.
    flash_attention: bool = True
    hidden_dropout: float = Field(default=0.0, ge=0, lt=1)
    attention_dropout: float = Field(default=0.0, ge=0, lt=1)
    seed: int = Field(default=1234, ge=0, lt=2**63)  # torch.manual_seed takes a 64-bit integer
    # FP8 GEMMs on top of bf16 (Transformer Engine, Megatron-LM --fp8-format): "hybrid" is E4M3
    # forward and E5M2 gradients (Micikevicius et al. 2022, "FP8 Formats for Deep Learning").
    # Megatron-LM runtime only, on GPUs whose profile states a peak_tflops.fp8.
    fp8: Literal["hybrid", "e4m3"] | None = None
    # Megatron-LM engine options (megatron runtime only). tp_comm_overlap: --tp-comm-overlap,
    # Transformer Engine's userbuffers hide the TP collectives behind the GEMMs; it applies to the
    # layouts with tp > 1 and sequence parallelism (validate_args refuses it elsewhere).
    tp_comm_overlap: bool = False
    # The interleaved schedule overlaps its sends with compute by default; false emits
    # --no-overlap-p2p-communication.
    overlap_p2p_comm: bool = True
    optimizer: OptimizerSpec = OptimizerSpec()
    data: DataSpec = DataSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()

    @property
    def train_steps(self) -> int | None:
        if self.steps is not None:
            return self.steps
        if self.train_tokens is None:
            return None
        return max(1, int(round(self.train_tokens / (self.global_batch_size * self.seq_length))))

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
        return self


class SpecFile(BaseModel):
    """A model spec file: name, source, architecture and training settings."""

    model_config = FROZEN

    # The name reaches job names and script headers: one line, no control characters.
    name: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
    source: str = Field(min_length=1, description="paper or config.json the numbers come from")
    model: ModelSpec
    training: TrainingSpec

    @model_validator(mode="after")
    def _positions_cover_sequence(self) -> SpecFile:
        mpe = self.model.max_position_embeddings
        if mpe is not None and mpe < self.training.seq_length:
            # Megatron-LM's validate_args: seq_length <= max_position_embeddings.
            raise ValueError(
                f"training.seq_length {self.training.seq_length} exceeds model.max_position_embeddings "
                f"{mpe}; raise max_position_embeddings or shorten the sequence"
            )
        return self


def load_spec(path: str | Path) -> tuple[SpecFile, Loaded]:
    """Read and validate a model spec file."""
    loaded = load_yaml(Path(path))
    try:
        spec = SpecFile.model_validate(loaded.data)
    except ValidationError as e:
        raise SpecError(format_validation(e, loaded, SpecFile, "model spec")) from e
    return spec, loaded
