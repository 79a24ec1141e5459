"""The three inputs, kept apart: what hardware (ClusterProfile), what model (ModelSpec) and how
to train it (TrainingSpec). All are frozen pydantic models with ``extra="forbid"`` so that a
typo is an error rather than a silently ignored key.

YAML loading lives here too, because error messages must name the file and the line of the
offending key; pydantic only knows the key path, so the loader records the line of every key.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import ProfileNotFound, SpecError
from .resources import shipped_profiles_dir

# extra="forbid": a typo is an error, not a silently ignored key. allow_inf_nan=False: ".inf" and
# ".nan" are valid YAML floats but never a valid size, rate or bandwidth.
_FROZEN = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# --------------------------------------------------------------------------------------------
# Model spec
# --------------------------------------------------------------------------------------------


class ModelSpec(BaseModel):
    """Decoder-only transformer architecture (Llama / GPT family)."""

    model_config = _FROZEN

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
    def _shapes(self) -> "ModelSpec":
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

    model_config = _FROZEN

    lr: float = Field(default=3.0e-4, gt=0, le=10)
    min_lr: float = Field(default=3.0e-5, ge=0, le=10)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(default=1.0e-8, gt=0, le=1)
    weight_decay: float = Field(default=0.1, ge=0, le=10)
    warmup_steps: int = Field(default=2000, ge=0, le=1_000_000_000)
    grad_clip: float = Field(default=1.0, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> "OptimizerSpec":
        # Megatron-LM asserts max_lr >= min_lr (training/optimizer_param_scheduler.py); AdamW
        # needs 0 <= beta < 1 (torch.optim.AdamW).
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr {self.min_lr} is above lr {self.lr}; the schedule decays from lr to min_lr, "
                             f"so make min_lr <= lr")
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas {list(self.betas)} must each be in [0, 1) (AdamW's momentum coefficients)")
        return self


# A value that megatron_args.txt carries and `pretrain_gpt.py $(cat megatron_args.txt)` splits on
# whitespace: one word, no control characters.
_ONE_WORD = r"^[^\s\x00-\x1f\x7f]+$"

# Megatron-LM's tokenizers that read a model file or hub name (--tokenizer-model); NullTokenizer
# needs none (megatron/core/tokenizers/utils/build_tokenizer.py).
TOKENIZERS_WITH_MODEL = ("HuggingFaceTokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer",
                         "Llama2Tokenizer", "TikTokenizer")


class TokenizerSpec(BaseModel):
    """Megatron-LM's --tokenizer-type and --tokenizer-model. NullTokenizer (token ids are the
    data) needs no files and goes with mock data or pre-tokenized data; a real run names its
    tokenizer, e.g. HuggingFaceTokenizer with a path or hub name."""

    model_config = _FROZEN

    type: Literal["NullTokenizer", "HuggingFaceTokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer",
                  "Llama2Tokenizer", "TikTokenizer"] = "NullTokenizer"
    model: str | None = Field(default=None, pattern=_ONE_WORD, description="--tokenizer-model: path or hub name")

    @model_validator(mode="after")
    def _model_when_needed(self) -> "TokenizerSpec":
        if self.type in TOKENIZERS_WITH_MODEL and self.model is None:
            raise ValueError(f"tokenizer type {self.type} reads its vocabulary from a file: set tokenizer.model to its "
                             f"path (or hub name)")
        if self.type == "NullTokenizer" and self.model is not None:
            raise ValueError("NullTokenizer reads no file: remove tokenizer.model, or name the tokenizer type")
        return self


class DataSpec(BaseModel):
    """Training data for Megatron-LM (--data-path, --split) and its tokenizer. Without a path,
    --mock-data: synthetic tokens, for a first run and for benchmarks. The bundled entrypoint
    takes its data from `dsorch submit --data` instead."""

    model_config = _FROZEN

    path: tuple[str, ...] | None = Field(
        default=None, min_length=1,
        description="--data-path: indexed-dataset prefixes, each optionally preceded by its weight")
    split: str = Field(default="969,30,1", pattern=r"^\d+(\.\d+)?(,\d+(\.\d+)?){0,2}$",
                       description="--split: train,valid,test proportions")
    tokenizer: TokenizerSpec = TokenizerSpec()
    # Validation: Megatron-LM needs --eval-interval to size its datasets (its default became None;
    # get_train_valid_test_num_samples in megatron/training/training.py divides by it).
    eval_interval: int = Field(default=1000, gt=0, le=1_000_000_000, description="--eval-interval, in steps")
    eval_iters: int = Field(default=100, ge=0, le=1_000_000_000, description="--eval-iters, batches per evaluation")

    @model_validator(mode="after")
    def _words(self) -> "DataSpec":
        import re

        for i, item in enumerate(self.path or ()):
            if not re.fullmatch(_ONE_WORD, item):
                raise ValueError(f"data.path[{i}] {item!r} has whitespace or control characters; Megatron-LM's "
                                 f"command line cannot carry it: rename or link the file")
        return self


class CheckpointSpec(BaseModel):
    """Where Megatron-LM saves and resumes (--save/--load) and how often (--save-interval)."""

    model_config = _FROZEN

    dir: str = Field(default="checkpoints", pattern=_ONE_WORD,
                     description="relative paths are relative to the plan directory")
    interval: int = Field(default=1000, gt=0, le=1_000_000_000, description="--save-interval, in steps")


class TrainingSpec(BaseModel):
    """How to train: sequence length, global batch, length, precision, optimizer, data."""

    model_config = _FROZEN

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
    def _warmup_fits(self) -> "TrainingSpec":
        if self.fp8 is not None and self.precision != "bf16":
            raise ValueError(f"training.fp8 {self.fp8!r} runs FP8 GEMMs on a bf16 model (Megatron-LM --bf16 "
                             f"--fp8-format); set training.precision to bf16 or drop training.fp8")
        if self.steps is not None and self.train_tokens is not None:
            raise ValueError("training.steps and training.train_tokens both give the training length; keep one")
        steps = self.train_steps
        if steps is not None and self.optimizer.warmup_steps >= steps:
            # Megatron-LM asserts lr_warmup_steps < lr_decay_steps (optimizer_param_scheduler.py).
            raise ValueError(f"optimizer.warmup_steps {self.optimizer.warmup_steps} is not below the {steps} training "
                             f"steps; shorten the warmup or train longer")
        return self


class SpecFile(BaseModel):
    """A model spec file: name, source, architecture and training settings."""

    model_config = _FROZEN

    # The name reaches job names and script headers: one line, no control characters.
    name: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
    source: str = Field(min_length=1, description="paper or config.json the numbers come from")
    model: ModelSpec
    training: TrainingSpec

    @model_validator(mode="after")
    def _positions_cover_sequence(self) -> "SpecFile":
        mpe = self.model.max_position_embeddings
        if mpe is not None and mpe < self.training.seq_length:
            # Megatron-LM's validate_args: seq_length <= max_position_embeddings.
            raise ValueError(f"training.seq_length {self.training.seq_length} exceeds model.max_position_embeddings "
                             f"{mpe}; raise max_position_embeddings or shorten the sequence")
        return self


# --------------------------------------------------------------------------------------------
# Cluster profile
# --------------------------------------------------------------------------------------------


class PeakTflops(BaseModel):
    model_config = _FROZEN
    bf16: float = Field(gt=0)
    fp16: float = Field(gt=0)
    fp32: float = Field(gt=0)
    # Dense FP8 tensor-core peak; None on GPUs without FP8 (before Hopper/Ada).
    fp8: float | None = Field(default=None, gt=0)


class GpuSpec(BaseModel):
    model_config = _FROZEN
    name: str
    memory_gib: float = Field(gt=0, le=1_000_000)
    # Dense (no 2:4 sparsity) peak, TFLOP/s, per device.
    peak_tflops: PeakTflops
    hbm_bandwidth_gbps: float = Field(default=2000.0, gt=0, description="GB/s")


class IntraNode(BaseModel):
    model_config = _FROZEN
    kind: str = "nvlink"
    # Total bidirectional GB/s per GPU as vendors quote it (H100 NVLink 4: 900 GB/s); the cost
    # model uses half of it per direction.
    bandwidth_gbps: float = Field(gt=0)
    latency_us: float = Field(default=5.0, ge=0)


class InterNode(BaseModel):
    model_config = _FROZEN
    kind: str = "infiniband"
    bandwidth_gbps: float = Field(gt=0, description="Gb/s per NIC, per direction")
    nics_per_node: int = Field(default=1, gt=0, le=1024)
    latency_us: float = Field(default=10.0, ge=0)


_NO_LINE_BREAKS = r"^[^\n\r\x00]*$"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class SlurmSpec(BaseModel):
    """SLURM settings. Values end up in #SBATCH lines and shell scripts: they may not contain line
    breaks (a line break would start a new, unquoted shell line), and env names must be valid
    shell variable names. Values are shell-quoted where they reach a shell; `setup` lines are
    shell commands by design and are run as written."""

    model_config = _FROZEN
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = "24:00:00"
    constraint: str | None = None
    exclusive: bool = True
    cpus_per_task: int = Field(default=8, gt=0, le=100_000)
    mem: str | None = None
    setup: tuple[str, ...] = ()
    env: dict[str, str] = {}
    extra: dict[str, str] = Field(default={}, description="extra #SBATCH --key=value pairs")
    # SLURM signals this long before the time limit (and on preemption with a grace time) so that
    # every rank checkpoints before the kill: leave time for one step plus one checkpoint save.
    # SLURM may send it up to a minute early (sbatch(1), --signal).
    signal_delay_s: int = Field(default=90, ge=30, le=65_535)

    @model_validator(mode="after")
    def _safe(self) -> "SlurmSpec":
        import re

        for key in ("partition", "account", "qos", "time", "constraint", "mem"):
            value = getattr(self, key)
            if value is not None and not re.fullmatch(_NO_LINE_BREAKS, value):
                raise ValueError(f"slurm.{key} contains a line break; write it on one line")
        from .errors import DsorchError
        from .slurm import parse_slurm_time  # the one reader of sbatch's --time formats

        try:
            parse_slurm_time(self.time)
        except DsorchError:
            raise ValueError(f"slurm.time {self.time!r} is not a SLURM time limit; write HH:MM:SS or D-HH:MM:SS")
        for i, line in enumerate(self.setup):
            if not re.fullmatch(_NO_LINE_BREAKS, line):
                raise ValueError(f"slurm.setup[{i}] contains a line break; give each command its own list item")
        for k, v in self.env.items():
            if not re.fullmatch(_ENV_NAME, k):
                raise ValueError(f"slurm.env key {k!r} is not a valid environment variable name "
                                 f"(letters, digits, underscore; not starting with a digit)")
        for k, v in self.extra.items():
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]*", k) or not re.fullmatch(_NO_LINE_BREAKS, v):
                raise ValueError(f"slurm.extra {k!r}: keys are sbatch option names (letters, digits, '-') and "
                                 f"values may not contain line breaks")
        return self


class Efficiency(BaseModel):
    """Free parameters of the time model, physical fractions in [0, 1] (and one stall time).

    A value left out (None) comes from dsorch's calibration table for the profile's GPU and
    interconnect (``orchestrator/costmodel/calibration.yaml``, fitted to published Megatron-LM
    runs by ``scripts/fit_calibration.py``); a value given here overrides it. A profile that
    ``extends`` another inherits the values that one states, like any other key.
    """

    model_config = _FROZEN
    # Fraction of dense peak that large GEMMs reach; smaller shapes lose more to their operand
    # traffic (the cost model adds it at the HBM bandwidth below).
    gemm: float | None = Field(default=None, gt=0, le=1)
    # Fraction of dense peak that fused attention kernels (FlashAttention) reach: below large
    # GEMMs, and far below on Hopper for FlashAttention-2 (Shah et al. 2024, FlashAttention-3, Sec. 1:
    # "only 35% utilization" on H100).
    attention: float | None = Field(default=None, gt=0, le=1)
    # Fraction of HBM bandwidth that memory-bound kernels (norms, activations, softmax, optimizer)
    # and GEMM operand traffic reach.
    hbm: float | None = Field(default=None, gt=0, le=1)
    # Fraction of link bandwidth that NCCL collectives reach (bus bandwidth / link bandwidth).
    intra_node_comm: float | None = Field(default=None, gt=0, le=1)
    inter_node_comm: float | None = Field(default=None, gt=0, le=1)
    # Fraction of the data-parallel reduction that overlaps compute where the engine overlaps it
    # (DeepSpeed overlap_comm without pipelining, Megatron --overlap-grad-reduce).
    dp_overlap: float | None = Field(default=None, ge=0, le=1)
    # Fraction of tensor-parallel collectives hidden behind GEMMs where the engine overlaps them
    # (Megatron-Core --tp-comm-overlap); 0 elsewhere.
    tp_overlap: float | None = Field(default=None, ge=0, le=1)
    # Not a fraction: microseconds each ZeRO-3 per-layer collective stalls the step beyond its
    # transfer time (launch and stream waits between layers), fitted per engine.
    zero3_stall_us: float | None = Field(default=None, ge=0, le=1_000_000)


class ClusterProfile(BaseModel):
    model_config = _FROZEN

    # The file's stem. It reaches script headers and directory names: one safe word.
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=200)
    description: str = ""
    extends: str | None = None
    # How `dsorch submit` runs a job: through SLURM (sbatch), or as processes on this machine
    # (submitit's LocalExecutor; the shipped `local` profile).
    executor: Literal["slurm", "local"] = "slurm"
    nodes: int = Field(gt=0, le=1_000_000)
    gpus_per_node: int = Field(gt=0, le=1024)
    gpu: GpuSpec
    intra_node: IntraNode
    inter_node: InterNode
    # torch.distributed backend: nccl on GPUs, gloo for CPU processes (the `local` profile).
    backend: Literal["nccl", "gloo"] = "nccl"
    # CUDA context, NCCL buffers, allocator fragmentation, per GPU.
    memory_overhead_gib: float = Field(default=3.0, ge=0, le=1_000_000)
    efficiency: Efficiency = Efficiency()
    slurm: SlurmSpec = SlurmSpec()

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def resized(self, nodes: int | None = None, gpus_per_node: int | None = None) -> "ClusterProfile":
        """The same hardware with another node count or fewer GPUs per node (--nodes, --gpus-per-node)."""
        update = {k: v for k, v in (("nodes", nodes), ("gpus_per_node", gpus_per_node)) if v is not None}
        return self.model_copy(update=update) if update else self


# --------------------------------------------------------------------------------------------
# YAML loading with line numbers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    """A parsed YAML document with the line number (1-based) of every key path."""

    data: Any
    lines: dict[tuple, int]
    path: Path
    sha256: str


def _compose_lines(node: yaml.Node, prefix: tuple, out: dict[tuple, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = (*prefix, key_node.value)
            out[key] = key_node.start_mark.line + 1
            _compose_lines(value_node, key, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[(*prefix, i)] = item.start_mark.line + 1
            _compose_lines(item, (*prefix, i), out)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML's last-wins hides typos)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(None, None, "a mapping key must be a plain value",
                                                        key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' appears twice (first on line {seen[key] + 1}); keep one",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


# A spec, profile or dsorch.yaml is a page of YAML. Limits that stop hostile or broken input before
# it costs time or memory: the file's size (read no further: /dev/zero has no end), and the nodes
# its aliases expand to ("billion laughs": nine aliases of nine make 10^9 nodes from 1 KB).
MAX_YAML_BYTES = 1 << 20
MAX_YAML_NODES = 100_000


def _read_input(path: Path) -> bytes:
    """The bytes of a regular file of at most MAX_YAML_BYTES; never blocks on a FIFO or a device."""
    import stat

    try:
        st = path.stat()
        if stat.S_ISDIR(st.st_mode):
            raise SpecError(f"{path}: is a directory; pass a YAML file.")
        if not stat.S_ISREG(st.st_mode):
            raise SpecError(f"{path}: not a regular file (a pipe or a device); pass a YAML file.")
        if st.st_size > MAX_YAML_BYTES:
            raise SpecError(f"{path}: {st.st_size:,} bytes; a spec or profile is at most {MAX_YAML_BYTES:,}. "
                            f"Pass the YAML file itself.")
        with open(path, "rb") as fh:
            raw = fh.read(MAX_YAML_BYTES + 1)
        if len(raw) > MAX_YAML_BYTES:  # it grew while we looked
            raise SpecError(f"{path}: more than {MAX_YAML_BYTES:,} bytes; a spec or profile is smaller.")
        return raw
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file. Check the path (it is read relative to the current directory).")
    except OSError as e:
        raise SpecError(f"{path}: cannot be read ({e.strerror or e}).")


def _count_nodes(node: yaml.Node, path: Path, budget: list[int]) -> None:
    """Refuse documents whose aliases expand to more than MAX_YAML_NODES nodes."""
    stack = [node]
    while stack:
        n = stack.pop()
        budget[0] -= 1
        if budget[0] < 0:
            raise SpecError(f"{path}: more than {MAX_YAML_NODES:,} YAML values (counting what anchors and aliases "
                            f"repeat); a spec or profile has a few hundred. Pass the right file, or write aliases out.")
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                stack.extend((k, v))
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)


def load_yaml(path: Path, empty_ok: bool = False) -> Loaded:
    """Parse a YAML mapping; ``empty_ok``: a file with no content (or only comments) is ``{}``."""
    raw = _read_input(path)  # turns every OSError into a SpecError with the path
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8.")
    loader = None
    try:
        loader = _UniqueKeyLoader(text)  # its reader refuses control characters here already
        # One parse: the node tree gives the line numbers, the same tree gives the data.
        node = loader.get_single_node()
        if node is not None:
            _count_nodes(node, path, [MAX_YAML_NODES])
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(f"{where}: malformed YAML ({problem}). Fix the syntax at that line.")
    except (ValueError, OverflowError, RecursionError, AttributeError, TypeError) as e:
        # e.g. a date like 2024-02-30, or an explicit tag (!!timestamp, !!binary) on a value that is not one
        raise SpecError(f"{path}: a value cannot be read ({' '.join(str(e).split())[:200]}); quote it if it is "
                        f"meant as a string, and drop explicit !!tags.")
    finally:
        if loader is not None:
            loader.dispose()
    if data is None and empty_ok:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a YAML mapping (key: value lines) at the top level, got {type(data).__name__}.")
    lines: dict[tuple, int] = {}
    if node is not None:
        _compose_lines(node, (), lines)
    return Loaded(data, lines, path, hashlib.sha256(raw).hexdigest())


def _valid_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names accepted at ``loc`` (a pydantic error location) of ``model``."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int) or not (isinstance(current, type) and issubclass(current, BaseModel)):
            continue
        field = current.model_fields.get(part)
        if field is None:
            return []
        ann = field.annotation
        current = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


MAX_ERRORS = 20


def _format_validation(e: ValidationError, loaded: Loaded | list[Loaded], model: type[BaseModel], what: str) -> str:
    """One line per error: file:line, key, what is wrong, the fix. With a profile's ``extends``
    chain (most derived first), each error names the file that sets the key, not the child."""
    chain = loaded if isinstance(loaded, list) else [loaded]
    msgs = []
    errors = e.errors()
    if len(errors) > MAX_ERRORS:
        # One line per problem up to a page; a file with thousands of unknown keys is summarised.
        msgs.append(f"{chain[0].path}: {len(errors):,} problems; the first {MAX_ERRORS}:")
        errors = errors[:MAX_ERRORS]
    for err in errors:
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "(top level)"
        where = str(chain[0].path)
        found = False
        for n in range(len(loc), 0, -1):
            for ld in chain:
                line = ld.lines.get(loc[:n])
                if line:
                    where, found = f"{ld.path}:{line}", True
                    break
            if found:
                break
        if err["type"] == "extra_forbidden":
            valid = _valid_keys(model, loc)
            hint = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            fix = f"did you mean '{hint[0]}'? " if hint else ""
            msgs.append(f"{where}: unknown key '{key}' in the {what}; {fix}valid keys here: {', '.join(valid)}.")
        elif err["type"] == "missing":
            msgs.append(f"{where}: missing required key '{key}' in the {what}; add it.")
        else:
            got = err.get("input")
            got_s = f" (got {got!r})" if got is not None and not isinstance(got, dict) else ""
            msgs.append(f"{where}: key '{key}': {err['msg']}{got_s}.")
    return "\n".join(msgs)


def load_spec(path: str | Path) -> tuple[SpecFile, Loaded]:
    """Read and validate a model spec file."""
    loaded = load_yaml(Path(path))
    try:
        spec = SpecFile.model_validate(loaded.data)
    except ValidationError as e:
        raise SpecError(_format_validation(e, loaded, SpecFile, "model spec"))
    return spec, loaded


# --------------------------------------------------------------------------------------------
# Cluster profiles: shipped ones, user directories, `extends`
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileSource:
    name: str
    path: Path
    origin: str  # "shipped" or "user"


def discover_profiles(profiles_dir: str | Path | None) -> dict[str, ProfileSource]:
    """Every profile by name; a user's profile of the same name wins over a shipped one."""
    found: dict[str, ProfileSource] = {}
    dirs = [(shipped_profiles_dir(), "shipped")]
    if profiles_dir:
        d = Path(profiles_dir)
        if not d.is_dir():
            raise SpecError(f"profiles directory {d} does not exist; pass an existing directory to --profiles-dir "
                            f"(or DSORCH_PROFILES_DIR).")
        dirs.append((d, "user"))
    for d, origin in dirs:
        for p in sorted(d.glob("*.yaml")):
            found[p.stem] = ProfileSource(p.stem, p, origin)
    return found


def _deep_merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for k, v in override.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@dataclass(frozen=True)
class LoadedProfile:
    profile: ClusterProfile
    source: ProfileSource
    sha256: str  # of the profile file and every file it extends, in order


def load_profile(name: str, profiles_dir: str | Path | None = None) -> LoadedProfile:
    known = discover_profiles(profiles_dir)
    if name not in known:
        close = difflib.get_close_matches(name, list(known), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ProfileNotFound(
            f"unknown cluster profile '{name}'.{hint} Known profiles: {', '.join(sorted(known))}. "
            f"Add your own as NAME.yaml in a directory passed with --profiles-dir or DSORCH_PROFILES_DIR."
        )
    chain: list[Loaded] = []
    seen: list[Path] = []
    src = known[name]
    while True:
        if src.path in seen:
            names = " -> ".join(p.stem for p in [*seen, src.path])
            raise SpecError(f"{known[name].path}: 'extends' forms a cycle: {names}; remove one link.")
        seen.append(src.path)
        loaded = load_yaml(src.path)
        chain.append(loaded)
        parent = loaded.data.get("extends")
        if parent is None:
            break
        if not isinstance(parent, str):
            raise SpecError(f"{src.path}:{loaded.lines.get(('extends',), '?')}: key 'extends' must name one profile "
                            f"(a string), got {type(parent).__name__}.")
        shipped = shipped_profiles_dir() / f"{parent}.yaml"
        if parent == src.name and src.origin == "user" and shipped.exists():
            # A user's profile may extend the shipped profile it overrides (same name).
            src = ProfileSource(parent, shipped, "shipped")
        elif parent in known:
            src = known[parent]
        else:
            raise SpecError(
                f"{src.path}:{loaded.lines.get(('extends',), '?')}: key 'extends' names unknown profile '{parent}'; "
                f"known profiles: {', '.join(sorted(known))}."
            )
    merged: dict = {}
    for loaded in reversed(chain):
        merged = _deep_merge(merged, loaded.data)
    merged["name"] = name
    try:
        profile = ClusterProfile.model_validate(merged)
    except ValidationError as e:
        raise SpecError(_format_validation(e, chain, ClusterProfile, "cluster profile"))
    digest = hashlib.sha256("".join(ld.sha256 for ld in chain).encode()).hexdigest() if len(chain) > 1 else chain[0].sha256
    return LoadedProfile(profile, known[name], digest)
