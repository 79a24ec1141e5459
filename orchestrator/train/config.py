"""Read a plan directory: the model shape and layout the entrypoint trains with.

The plan directory is the single source of truth. The model shape and the tp/pp degrees,
micro-batch and global batch come from ``megatron_args.txt`` (the flags Megatron-LM would be
given), the optimizer, scheduler, ZeRO stage, precision and gradient clipping from
``ds_config.json`` (handed to DeepSpeed unchanged), the dp degree and the profile's peak from
``plan.yaml``. Where two files state the same number they are checked against each other, so a
hand-edited plan that no longer agrees with itself is refused instead of half-applied.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..errors import ValidationError
from ..validate.megatron import parse_args_lines


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    seq_length: int
    max_position_embeddings: int
    position_embedding: str  # "rope" | "learned_absolute"
    rotary_base: float
    normalization: str  # "RMSNorm" | "LayerNorm"
    swiglu: bool
    tied_embeddings: bool
    bias: bool
    init_std: float
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class TrainLayout:
    tp: int
    pp: int
    dp: int
    zero_stage: int
    micro_batch_size: int
    grad_accum_steps: int
    global_batch_size: int
    sequence_parallel: bool
    recompute: str  # "none" | "selective" | "full"
    # Decoder layers per pipeline stage (Megatron's --decoder-first/last-pipeline-num-layers).
    stage_layers: tuple[int, ...]

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class Plan:
    path: Path
    model: ModelShape
    layout: TrainLayout
    ds_config: dict
    precision: str  # "fp32" | "bf16" | "fp16"
    seed: int
    peak_tflops: float  # per device, from the cluster profile, for MFU
    backend: str  # "nccl" | "gloo"
    model_name: str
    total_steps: int | None = None  # the plan's training length (--train-iters), when it has one


def _stage_layers(num_layers: int, pp: int, first: int | None, last: int | None) -> tuple[int, ...]:
    if pp == 1:
        return (num_layers,)
    middle_stages = pp - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    if middle_stages and rest % middle_stages:
        raise ValidationError(f"{rest} decoder layers cannot be split evenly over {middle_stages} "
                              "middle pipeline stages; fix --num-layers or the first/last counts")
    each = rest // middle_stages if middle_stages else 0
    counts = [each] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return tuple(counts)


def load_plan(plan_dir: str | Path) -> Plan:
    plan_dir = Path(plan_dir)
    try:
        flags_text = (plan_dir / "megatron_args.txt").read_text(encoding="utf-8")
        ds_config = json.loads((plan_dir / "ds_config.json").read_text(encoding="utf-8"))
        plan_yaml = yaml.safe_load((plan_dir / "plan.yaml").read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ValidationError(f"{plan_dir} is not a plan directory ({e.filename} is missing); "
                              "create one with `dsorch plan SPEC --cluster NAME --out DIR`") from e

    flags = dict(parse_args_lines(flags_text))

    def num(name: str, cast=int, default=None):
        if name in flags:
            return cast(flags[name])
        if default is None:
            raise ValidationError(f"{plan_dir / 'megatron_args.txt'}: {name} is missing")
        return default

    for name in ("--hidden-dropout", "--attention-dropout"):
        if float(flags.get(name) or 0.0) != 0.0:
            raise ValidationError(
                f"{name} {flags[name]}: the bundled entrypoint trains without dropout (its tensor-"
                "parallel layers keep no per-rank RNG tracker); set dropout to 0 in the model spec "
                "or use --runtime megatron")

    heads = num("--num-attention-heads")
    model = ModelShape(
        num_layers=num("--num-layers"),
        hidden_size=num("--hidden-size"),
        ffn_hidden_size=num("--ffn-hidden-size"),
        num_heads=heads,
        num_kv_heads=num("--num-query-groups") if "--group-query-attention" in flags else heads,
        vocab_size=num("--vocab-size"),
        seq_length=num("--seq-length"),
        max_position_embeddings=num("--max-position-embeddings"),
        position_embedding=flags.get("--position-embedding-type") or "learned_absolute",
        rotary_base=num("--rotary-base", float, 10000.0),
        normalization=flags.get("--normalization") or "LayerNorm",
        swiglu="--swiglu" in flags,
        tied_embeddings="--untie-embeddings-and-output-weights" not in flags,
        bias="--disable-bias-linear" not in flags,
        init_std=num("--init-method-std", float, 0.02),
        norm_eps=num("--norm-epsilon", float, 1e-5),
    )

    lay = plan_yaml["layout"]
    tp, pp = num("--tensor-model-parallel-size"), num("--pipeline-model-parallel-size")
    mbs, gbs = num("--micro-batch-size"), num("--global-batch-size")
    dp, zero = int(lay["dp"]), int(ds_config.get("zero_optimization", {}).get("stage", 0))
    gas = int(ds_config["gradient_accumulation_steps"])
    recompute = flags.get("--recompute-granularity") or "none"
    checks = [
        ("tp", tp, lay["tp"]), ("pp", pp, lay["pp"]), ("zero stage", zero, lay["zero_stage"]),
        ("micro-batch", mbs, ds_config["train_micro_batch_size_per_gpu"]),
        ("global batch", gbs, ds_config["train_batch_size"]),
        ("global batch = mbs x gas x dp", gbs, mbs * gas * dp),
        ("recompute", recompute, lay["recompute"]),
        ("sequence parallel", "--sequence-parallel" in flags, bool(lay["sequence_parallel"])),
        ("world size", tp * pp * dp, plan_yaml["cluster"]["world_size"]),
    ]
    for what, a, b in checks:
        if a != b:
            raise ValidationError(f"{plan_dir}: {what} disagrees between the plan files ({a} vs "
                                  f"{b}); regenerate the directory with `dsorch plan`")
    if int(lay.get("vpp", 1)) != 1:
        raise ValidationError("vpp > 1 (interleaved 1F1B) is not in DeepSpeed's pipeline engine; "
                              "plan with --vpp 1 or use --runtime megatron")

    layout = TrainLayout(
        tp=tp, pp=pp, dp=dp, zero_stage=zero, micro_batch_size=mbs, grad_accum_steps=gas,
        global_batch_size=gbs, sequence_parallel="--sequence-parallel" in flags,
        recompute=recompute,
        stage_layers=_stage_layers(model.num_layers, pp,
                                   num("--decoder-first-pipeline-num-layers", int, None)
                                   if "--decoder-first-pipeline-num-layers" in flags else None,
                                   num("--decoder-last-pipeline-num-layers", int, None)
                                   if "--decoder-last-pipeline-num-layers" in flags else None),
    )
    precision = ("bf16" if ds_config.get("bf16", {}).get("enabled")
                 else "fp16" if ds_config.get("fp16", {}).get("enabled") else "fp32")
    cluster = plan_yaml["cluster"]
    return Plan(path=plan_dir, model=model, layout=layout, ds_config=ds_config,
                precision=precision, seed=num("--seed", int, 1234),
                peak_tflops=float(cluster["peak_tflops"]), backend=str(cluster["backend"]),
                model_name=str(plan_yaml["model"]["name"]),
                total_steps=num("--train-iters", int, None) if "--train-iters" in flags else None)
