"""The fitted efficiencies of the time model, as data, per engine and hardware, and the rule that
picks them for a profile and an engine.

The values live in ``calibration.yaml`` next to this file (package data, parsed once: it is a
constant of the package, like a table in code, but written by ``scripts/fit_calibration.py``
rather than by hand). Every entry is one *engine* on one kind of hardware, fitted only to runs of
that engine on that hardware:

* ``megatron``: Megatron-LM / Megatron-Core (the megatron runtime);
* ``deepspeed-zero3``: sharded data parallelism, DeepSpeed ZeRO-3 and PyTorch FSDP FULL_SHARD
  (the deepspeed runtime at zero_stage 3);
* ``deepspeed``: DeepSpeed's ZeRO-0/1/2 without a pipeline (the deepspeed runtime below ZeRO-3);
* ``deepspeed-pipeline``: DeepSpeed's PipelineEngine (the deepspeed runtime with pp > 1), fitted on
  published runs of that engine (Megatron-DeepSpeed with Megatron-style TP).

Resolution, field by field, first hit wins:

1. the profile's own ``efficiency`` section (after ``extends`` merging);
2. the entry of this engine whose ``gpus`` list contains the profile's ``gpu.name``
   (case-insensitive) and whose ``inter_node`` kind matches the profile's, else one matching the
   GPU alone;
3. an entry of the engine this engine borrows from (``BORROWS``) for the GPU: the prediction is
   then outside the fitted domain and says so;
4. the table's ``default`` entry (outside the fitted domain too).

What the calibration data measured, run by run (``published_mfu.yaml``: each published run's GPU,
precision, kind and measured MFU, written from calibrate/__init__.py ``measured_runs``), says two
more things of a plan: whether its GEMM rate comes from runs of another precision or another GPU
(``Resolved.transfer``), and the best MFU any run measured on its hardware in its precision
(``best_measured_mfu``).

Nothing here reads the environment or writes anything.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from importlib import resources

import numpy as np
import yaml

from orchestrator.runtimes import RUNTIMES, Runtime, runtime_named
from orchestrator.spec.cluster import ClusterProfile
from orchestrator.spec.model import ModelSpec

FIELDS = (
    "gemm",
    "attention",
    "hbm",
    "intra_node_comm",
    "inter_node_comm",
    "dp_overlap",
    "tp_overlap",
    "zero3_stall_us",
    "grouped_gemm",
    "ep_overlap",
    "moe_layer_us",
    "fp8_gemm",
)
TABLE_FILE = "calibration.yaml"
# One line per published run of the calibration files (written by scripts/fit_calibration.py --runs
# from calibrate/__init__.py measured_runs; tests/unit/test_measured_runs.py keeps it in step).
RUNS_FILE = "published_mfu.yaml"
# The calibration engines: the runtimes' ``calibration_engines``, in the order the runtimes list them.
ENGINE_NAMES = tuple(dict.fromkeys(e for rt in RUNTIMES.values() for e in rt.calibration_engines))
# Where an engine without data of its own takes its kernel efficiencies from: DeepSpeed below
# ZeRO-3 runs the same PyTorch kernels (dsorch's entrypoint) as its ZeRO-3, and ZeRO-3/FSDP the
# same GEMMs as Megatron-LM on a GPU neither has been measured on.
BORROWS = {
    "deepspeed": ("deepspeed-zero3", "megatron"),
    # The pipeline engine on a GPU none of its runs used: the entrypoint's kernels, as below ZeRO-3.
    "deepspeed-pipeline": ("deepspeed-zero3", "megatron"),
    "deepspeed-zero3": ("megatron",),
    "megatron": ("deepspeed-zero3",),
}


# Model features that change which kernels a layer runs and that no fitted published run has: the
# one run with them (GPT-OSS 120B on GB300) is scored but not fitted (scripts/fit_calibration.py
# ENTRIES `unfitted`), so an entry vouches for a feature only where one of its fitted runs had it
# (``covers``) and a plan whose model has another is outside the fitted domain. The keys are covers'.
MODEL_FEATURES = {
    # Megatron-LM --softmax-type learnable: Transformer Engine's fused attention with a softmax
    # offset (cuDNN 9.13.1+; FlashAttention refuses it: attention/dot_product_attention/utils.py
    # get_attention_backend, "Filter: Softmax type").
    "attention_sinks": "attention sinks (a learned softmax offset per head)",
    # Only where the window is shorter than the sequence does the mask change the kernel's work.
    "sliding_window": "sliding-window attention shorter than the sequence",
    "quick_geglu": "the quick-GEGLU activation",
}


def model_features(model: ModelSpec, seq_length: int) -> tuple[str, ...]:
    """The MODEL_FEATURES keys a model has at this sequence length."""
    found = {
        "attention_sinks": model.attention_sinks,
        "sliding_window": model.sliding_window is not None and model.sliding_window < seq_length,
        "quick_geglu": model.activation == "quick_geglu",
    }
    return tuple(k for k in MODEL_FEATURES if found[k])


def engine_of(runtime, zero_stage, pp=1) -> np.ndarray:
    """The calibration engine of each layout (an array of names): ``Runtime.calibration_engine``."""
    return runtime_named(runtime).calibration_engine(zero_stage, pp)


PRECISION_WORDS = {"bf16": "BF16", "fp16": "FP16", "fp8": "FP8", "fp32": "FP32"}


def precision_class(precision: str, fp8: bool = False) -> str:
    """The precision a GEMM rate belongs to: "fp8" for FP8 GEMMs, "bf16" for BF16 and FP16 alike (one
    tensor-core rate: every shipped profile's peak_tflops states the same figure for both; the SC21
    A100 runs are FP16), else the precision itself."""
    if fp8 or precision == "fp8":
        return "fp8"
    return "bf16" if precision in ("bf16", "fp16") else precision


@dataclass(frozen=True)
class Run:
    """One published run of the calibration files as published_mfu.yaml records it."""

    id: str
    entry: str | None  # the calibration entry its hardware and engine belong to
    gpu: str
    precision: str  # "fp8" where it ran FP8 GEMMs, else training.precision
    moe: bool
    mfu: float  # measured: model FLOPs (costmodel/flops.py) / (step time x GPUs x dense peak)


@dataclass(frozen=True)
class Transfer:
    """A GEMM rate carried to a plan from runs of another precision or GPU (``Resolved.transfer``)."""

    entry: str  # the entry whose runs vouch for the rate
    own: bool  # they are the plan's entry's own runs (else those that fitted the entry's gemm value)
    gemm: float  # the rate, a fraction of the dense peak
    precision: str  # the plan's precision class ("bf16" | "fp8")
    gpu: str  # the plan's GPU
    runs: tuple[Run, ...]
    other_precision: bool  # none of the runs ran the plan's precision
    other_gpu: bool  # none ran on the plan's GPU

    def runs_text(self) -> str:
        """The runs in words: how many, which kind, their precision and GPUs."""
        n = len(self.runs)
        kinds = {r.moe for r in self.runs}
        kind = "" if len(kinds) > 1 else ("MoE " if self.runs[0].moe else "dense ")
        # The runs' own precisions (SC21's FP16 runs read FP16), not their class.
        classes = [r.precision for r in self.runs]
        counts = {c: classes.count(c) for c in sorted(set(classes))}
        if len(counts) == 1:
            what = PRECISION_WORDS.get(classes[0], classes[0])
            precision = f"all {what}" if n > 1 else what
        else:
            precision = ", ".join(f"{k} {PRECISION_WORDS.get(c, c)}" for c, k in counts.items())
        gpus = ", ".join(sorted({r.gpu for r in self.runs}))
        return f"{n} {kind}run{'s' if n > 1 else ''} ({precision}, on {gpus})"

    @property
    def target(self) -> str:
        """What the rate is carried to, in words: "BF16 on GB200", "GB200" or "BF16"."""
        words = PRECISION_WORDS[self.precision]
        if self.other_precision and self.other_gpu:
            return f"{words} on {self.gpu}"
        return words if self.other_precision else self.gpu

    def clause(self) -> str:
        """The transfer as a clause of ``Resolved.beyond``."""
        return f"its GEMM rate {self.gemm:.2f} carried to {self.target} from {self.entry}'s {self.runs_text()}"


@dataclass(frozen=True)
class Resolved:
    """Efficiencies the cost model uses for one profile and engine, and where each came from."""

    gemm: float
    attention: float
    hbm: float
    intra_node_comm: float
    inter_node_comm: float
    dp_overlap: float
    tp_overlap: float
    zero3_stall_us: float
    grouped_gemm: float
    ep_overlap: float
    moe_layer_us: float
    fp8_gemm: float
    sources: tuple[tuple[str, str], ...]  # (field, "profile" | "calibration:<entry id>" | "default")
    entry: str | None  # the calibration entry used for the GPU, if any
    # Step-time error of the model on the entry's calibration set (fractions), for "within error".
    mean_rel_error: float | None
    max_rel_error: float | None
    engine: str = "megatron"
    rows: int | None = None  # runs the entry was fitted on
    # The layouts the entry's runs covered (calibration.yaml `covers`): largest tp, pp and cp, and
    # whether any ran FP8 GEMMs or overlapped TP / DP communication. Beyond them a prediction is
    # outside the fitted domain.
    covers: tuple[tuple[str, int], ...] = ()
    # "fitted": this engine's entry, fitted on runs on this GPU and fabric; "borrowed": another
    # engine's entry, or one fitted on another GPU or fabric; "default": no entry for the GPU;
    # "profile" / "adjusted": the profile states all / some of the values. Only "fitted" has an
    # interval; ``reason`` says why the others have none.
    domain: str = "fitted"
    reason: str = ""
    # Largest error on a run left out of the fit (leave-one-out over the entry's runs), and the mean
    # of their sizes.
    held_out_max: float | None = None
    held_out_mean: float | None = None
    # Runs of the entry's GPU that it scores but was not fitted on (calibration.yaml
    # scored_not_fitted): (id, relative step-time error, MODEL_FEATURES keys of its model).
    scored: tuple[tuple[str, float, tuple[str, ...]], ...] = ()
    # The profile's GPU, and the runs that vouch for the GEMM rate (``_gemm_evidence``): the entry's
    # own fitted runs, and those that fitted its ``gemm`` value where another entry's value is used.
    gpu: str = ""
    own_runs: tuple[Run, ...] = ()
    gemm_from: str | None = None
    gemm_runs: tuple[Run, ...] = ()

    def values(self) -> dict[str, float]:
        return {f: getattr(self, f) for f in FIELDS}

    @property
    def interval(self) -> float | None:
        """Half-width of the step-time interval, as a fraction: the largest error of the entry on a
        run of its own that was left out of the fit (leave-one-out; a few runs fit themselves more
        closely than they predict another). None outside the fitted domain, where no error says
        anything."""
        if self.domain != "fitted":
            return None
        return self.held_out_max if self.held_out_max is not None else self.max_rel_error

    @property
    def tie_band(self) -> float:
        """How close two layouts' predicted step times must be for the model not to tell them apart,
        as a fraction: the entry's mean |error| on a run held out of its fit (its mean on its own runs
        where it has no held-out figure; the default entry has only that). Not the interval's max:
        the max is the worst single run (a 32B weak-scaling run for megatron/h100-sxm5-ndr, 11 %),
        and two layouts of one model on one cluster share the model, the cluster and its fitted
        efficiencies, so the error of their *ratio* is typically no larger than one prediction's
        typical error. Also the band outside the fitted domain (the borrowed entry's figure): there
        the model's error is unknown and no tighter band is more honest."""
        for v in (self.held_out_mean, self.mean_rel_error):
            if v is not None:
                return float(v)
        return 0.0

    @property
    def tie_band_basis(self) -> str:
        """Where ``tie_band`` comes from, in words."""
        name = self.entry or "the default efficiencies"
        if self.held_out_mean is not None:
            return f"mean error of {name} on runs held out of its fit"
        return f"mean error of {name} on its own runs"

    def beyond(
        self,
        tp: int,
        pp: int,
        cp: int,
        fp8: bool,
        tp_overlap: bool = False,
        dp_overlap: bool = False,
        megatron_fsdp: bool = False,
        ep: int = 1,
        moe: bool = False,
        features: tuple[str, ...] = (),
    ) -> str | None:
        """What of a layout lies beyond the runs the entry was fitted on, in words; None if nothing."""
        if self.domain != "fitted" or not self.covers:
            return None
        c = dict(self.covers)
        out = [
            f"{name} {v} (its runs: up to {c.get(name, 1)})"
            for name, v in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep))
            if v > c.get(name, 1)
        ]
        for used, key, what in (
            (moe, "moe", "a mixture of experts"),
            (fp8, "fp8", "FP8 GEMMs"),
            (tp_overlap, "tp_overlap", "TP communication overlap"),
            (dp_overlap, "dp_overlap", "overlapped DP reduction"),
            (megatron_fsdp, "megatron_fsdp", "Megatron-FSDP's sharded gradients"),
        ):
            if used and not c.get(key):
                out.append(f"{what} (none of its runs)")
        moved = self.transfer(fp8, moe)
        if moved is not None and not (fp8 and moved.other_precision and not c.get("fp8") and not moved.other_gpu):
            # (an FP8 plan on an entry without FP8 runs already reads "FP8 GEMMs (none of its runs)")
            out.append(moved.clause())
        missing = [key for key in features if not c.get(key)]
        if missing:
            seen = [f"{rid}, {100 * err:+.0f} %" for rid, err, fs in self.scored if set(missing) & set(fs)]
            evidence = f"; scored, not fitted: {'; '.join(seen)}" if seen else ""
            out.append(f"{', '.join(MODEL_FEATURES[k] for k in missing)} (none of its fitted runs{evidence})")
        return ", ".join(out) or None

    def transfer(self, fp8: bool, moe: bool) -> Transfer | None:
        """Whether the GEMM rate a plan of this precision and kind (dense or MoE) runs at comes only
        from runs of another precision (BF16 vs FP8) or on another GPU; None where a run like the plan
        vouches for it, or where no run does (the profile states the rate, or the default entry).

        The runs that vouch: the entry's own fitted runs of the plan's kind (they were predicted with
        every value the entry uses, borrowed ones included, so their held-out errors cover them); where
        it has none of that kind, the runs that fitted its ``gemm`` value (of the plan's kind, where
        there are any). A dense BF16 plan on GB200 has neither kind of own run: its rate is
        megatron/gb300-nvl72's, whose dense runs were all FP8 (issue 37 point 3)."""
        if self.domain in ("default", "profile") or dict(self.sources).get("gemm") == "profile":
            return None
        own = [r for r in self.own_runs if r.moe == moe]
        if own:
            entry, runs = self.entry, own
        else:
            entry, runs = self.gemm_from, [r for r in self.gemm_runs if r.moe == moe] or list(self.gemm_runs)
        if entry is None or not runs:
            return None
        precision = "fp8" if fp8 else "bf16"
        other_precision = all(precision_class(r.precision) != precision for r in runs)
        other_gpu = all(r.gpu.lower() != self.gpu.lower() for r in runs)
        if not (other_precision or other_gpu):
            return None
        return Transfer(
            entry=entry,
            own=bool(own),
            gemm=self.gemm,
            precision=precision,
            gpu=self.gpu,
            runs=tuple(runs),
            other_precision=other_precision,
            other_gpu=other_gpu,
        )

    def describe(self) -> str:
        """How sure a prediction made with these efficiencies is, in words."""
        if self.interval is not None:
            return f"±{100 * self.interval:.0f} %, {self.entry}, n={self.rows}"
        return f"outside the fitted domain: {self.reason}; no interval"


@functools.lru_cache(maxsize=1)
def calibration_table() -> dict:
    """The parsed calibration.yaml (cached; it is package data and never changes at run time)."""
    text = resources.files(__package__).joinpath(TABLE_FILE).read_text(encoding="utf-8")
    return yaml.safe_load(text)


@functools.lru_cache(maxsize=1)
def published_runs() -> dict[str, Run]:
    """The parsed published_mfu.yaml, by run id (cached package data)."""
    text = resources.files(__package__).joinpath(RUNS_FILE).read_text(encoding="utf-8")
    return {rid: Run(id=rid, **fields) for rid, fields in (yaml.safe_load(text)["runs"] or {}).items()}


def hardware_gpus(gpu: str, table: dict | None = None) -> set[str]:
    """The GPU names (lower case) of the hardware ``gpu`` belongs to: every entry's ``gpus`` list that
    names it (H200 is H100's hardware: the same Hopper compute and dense peak, calibrate/published.py
    HARDWARE), or the name alone."""
    table = calibration_table() if table is None else table
    names = {gpu.lower()}
    for entry in table.get("entries", []):
        group = {n.lower() for n in entry.get("gpus", [])}
        if gpu.lower() in group:
            names |= group
    return names


def best_measured_mfu(gpu: str, precision: str, fp8: bool = False) -> Run | None:
    """The published run of the calibration files with the highest measured MFU on ``gpu``'s hardware
    (``hardware_gpus``) in the precision class of ``precision`` / ``fp8`` (``precision_class``); None
    where no run measured that. MFU as the plan states it (model FLOPs over the dense peak of the
    training precision, FP8 GEMMs included), so the figures compare."""
    names, want = hardware_gpus(gpu), precision_class(precision, fp8)
    runs = [r for r in published_runs().values() if r.gpu.lower() in names and precision_class(r.precision) == want]
    return max(runs, key=lambda r: (r.mfu, r.id), default=None)


def _fitted_runs(entry: dict) -> tuple[Run, ...]:
    """The runs an entry was fitted on (its held_out_errors: one per fitted run), as published_mfu.yaml
    records them."""
    runs = published_runs()
    return tuple(runs[rid] for rid in (entry.get("held_out_errors") or {}) if rid in runs)


def _gemm_evidence(entry: dict | None, table: dict) -> tuple[str | None, tuple[Run, ...]]:
    """The entry whose runs fitted ``entry``'s gemm value (itself, or one it borrows from, following
    ``borrowed_from``) and those runs: the rows of the stages that fitted it (scripts/fit_calibration.py
    ``stages``: "dense", "moe" or "all"). (None, ()) where no run fitted it (the default entry)."""
    by_id = {e["id"]: e for e in table.get("entries", [])}
    seen: set[str] = set()
    while entry is not None and entry["id"] not in seen:
        seen.add(entry["id"])
        if "gemm" in (entry.get("fitted") or ()):
            runs = _fitted_runs(entry)
            kinds = {st["rows"] for st in entry.get("stages") or () if "gemm" in st.get("fitted", ())}
            if kinds and "all" not in kinds:
                runs = tuple(r for r in runs if ("moe" if r.moe else "dense") in kinds)
            return entry["id"], runs
        entry = by_id.get(entry.get("borrowed_from") or "")
    return None, ()


def memory_error() -> dict:
    """How far published peaks went beyond the memory model: {rows, largest_under, largest_over}."""
    return calibration_table().get("memory_error") or {"rows": 0, "largest_under": 0.0, "largest_over": 0.0}


def default_memory_margin(gpu_memory_gib: float) -> tuple[float, str]:
    """The headroom a plan keeps free on every GPU unless --memory-margin says otherwise (GiB, rounded
    up to 0.1), and where it comes from in words.

    The memory model's own error: the largest amount by which a published peak went beyond the
    prediction (``memory_error().largest_under``, a fraction of the peak), taken of the whole GPU,
    since a layout that fits ends within it of the capacity. Nothing is added for the CUDA context,
    NCCL's buffers or the caching allocator's fragmentation: the prediction counts them in the
    profile's ``memory_overhead_gib``, and the published peaks it is compared with are torchtitan's
    benchmark memory (published_runs_fsdp.yaml measured_memory_gib; torchtitan's metrics log the
    allocator's max reserved memory, fragmentation included), so whatever that term misses is
    already in the error. The memory census
    (tests/system/test_census.py) matches the tensors to the byte and records no error of its own."""
    err = memory_error()
    under = float(err.get("largest_under") or 0.0)
    margin = math.ceil(under * gpu_memory_gib * 10 - 1e-9) / 10
    origin = (
        f"the memory model's largest under-prediction of a published peak, {100 * under:.1f} % of "
        f"{gpu_memory_gib:g} GiB ({err.get('rows', 0)} runs; calibration.yaml memory_error)"
    )
    return margin, origin


def _matches(entry: dict, profile: ClusterProfile, with_fabric: bool) -> bool:
    names = {n.lower() for n in entry.get("gpus", [])}
    if profile.gpu.name.lower() not in names:
        return False
    return not with_fabric or entry.get("inter_node") == profile.inter_node.kind


def hardware_entry(
    profile: ClusterProfile, engine: str = "megatron", table: dict | None = None
) -> tuple[dict | None, str, str]:
    """The entry for ``engine`` on the profile's hardware, its domain ("fitted" only when it is the
    engine's own, fitted on runs on this GPU and fabric) and, outside it, why."""
    table = calibration_table() if table is None else table
    gpu, fabric = profile.gpu.name, profile.inter_node.kind
    for name in (engine, *BORROWS.get(engine, ())):
        for with_fabric in (True, False):
            for entry in table.get("entries", []):
                if entry.get("engine") != name or not _matches(entry, profile, with_fabric):
                    continue
                if name != engine:
                    return entry, "borrowed", f"no {engine} runs on {gpu} (efficiencies of {entry['id']})"
                if not with_fabric:
                    return entry, "borrowed", (f"{entry['id']} was fitted on {entry.get('inter_node')}, not {fabric}")
                measured = {g.lower() for g in entry.get("measured_gpus", [gpu])}
                if gpu.lower() not in measured:
                    return (
                        entry,
                        "borrowed",
                        (f"{entry['id']} has no runs on {gpu} (its runs: {', '.join(entry['measured_gpus'])})"),
                    )
                return entry, "fitted", ""
    return None, "default", f"no calibration for {gpu} and {engine}"


def pipeline_gemm_ratio(table: dict) -> tuple[float, str] | None:
    """The pipeline engine's GEMM rate over ZeRO-3's where both were fitted on one GPU (the
    deepspeed-pipeline entry and the deepspeed-zero3 entry it borrows from), and where it comes from.
    On A100 the pipeline engine's fitted rate is ~0.70 of ZeRO-3's: its one fitted value also carries
    what the engine adds per instruction (blocking sends, the activation copies, the host's schedule
    walk: costmodel/pipe_schedule.py), which a ZeRO-3 run on the same kernels does not pay."""
    entries = {e["id"]: e for e in table.get("entries", [])}
    for e in table.get("entries", []):
        base = entries.get(e.get("borrowed_from") or "")
        if e.get("engine") == "deepspeed-pipeline" and base is not None and base.get("engine") == "deepspeed-zero3":
            ratio = float(e["efficiency"]["gemm"]) / float(base["efficiency"]["gemm"])
            return ratio, f"{e['id']} gemm / {base['id']} gemm"
    return None


def resolve_efficiency(profile: ClusterProfile, engine: str = "megatron", table: dict | None = None) -> Resolved:
    table = calibration_table() if table is None else table
    entry, domain, reason = hardware_entry(profile, engine, table)
    default = table["default"]["efficiency"]
    values: dict[str, float] = {}
    sources = []
    for f in FIELDS:
        explicit = getattr(profile.efficiency, f)
        if explicit is not None:
            values[f], src = float(explicit), "profile"
        elif entry is not None and f in entry["efficiency"]:
            values[f], src = float(entry["efficiency"][f]), f"calibration:{entry['id']}"
        else:
            values[f], src = float(default[f]), "default"
        sources.append((f, src))
    # The pipeline engine on a GPU none of its runs used borrows ZeRO-3's kernels there, at the GEMM
    # rate its own runs measured against ZeRO-3's on theirs (pipeline_gemm_ratio), not ZeRO-3's whole.
    ratio = pipeline_gemm_ratio(table) if engine == "deepspeed-pipeline" else None
    if ratio is not None and entry is not None and entry["engine"] != engine and profile.efficiency.gemm is None:
        values["gemm"] *= ratio[0]
        sources = [(f, f"{src} x {ratio[0]:.3f} ({ratio[1]})" if f == "gemm" else src) for f, src in sources]
        reason = f"{reason}; its GEMM rate x {ratio[0]:.2f} ({ratio[1]})"
    stated = [f for f, src in sources if src == "profile"]
    if len(stated) == len(FIELDS):
        domain, reason = "profile", "the profile states every efficiency"
    elif stated:
        domain, reason = "adjusted", f"the profile states {', '.join(stated)}"
    err = (entry or {}).get("step_time_error") or table["default"].get("step_time_error") or {}
    covers = tuple(sorted((k, int(v)) for k, v in ((entry or {}).get("covers") or {}).items()))
    scored = tuple(
        (rid, float(run["error"]), tuple(run.get("features") or ()))
        for rid, run in ((entry or {}).get("scored_not_fitted") or {}).items()
    )
    gemm_from, gemm_runs = _gemm_evidence(entry, table)
    return Resolved(
        **values,
        sources=tuple(sources),
        entry=None if entry is None else entry["id"],
        mean_rel_error=err.get("mean"),
        max_rel_error=err.get("max"),
        engine=engine,
        rows=err.get("rows"),
        domain=domain,
        covers=covers,
        reason=reason,
        held_out_max=err.get("held_out_max"),
        held_out_mean=err.get("held_out_mean"),
        scored=scored,
        gpu=profile.gpu.name,
        own_runs=() if entry is None else _fitted_runs(entry),
        gemm_from=gemm_from,
        gemm_runs=gemm_runs,
    )


def per_layout(
    profile: ClusterProfile, runtime: str | Runtime, zero_stage, pp=None
) -> tuple[dict[str, np.ndarray], dict[str, Resolved]]:
    """The efficiencies of each layout (arrays over layouts, for the vectorized model) and the
    Resolved of each engine present: the deepspeed runtime mixes three engines (ZeRO-3, the
    pipeline engine, and ZeRO-0/1/2 without a pipeline). Without ``pp`` every engine a layout of
    the runtime at those ZeRO stages may use is resolved (a caller then picks with ``engine_of``)."""
    runtime = runtime_named(runtime)
    z = np.asarray(zero_stage)
    names = engine_of(runtime, z, 1 if pp is None else pp)
    present = set(names.ravel().tolist()) or {str(engine_of(runtime, 0).item())}
    if pp is None:  # ... and the engines the same stages run with a pipeline
        present |= set(engine_of(runtime, z if z.size else 0, 2).ravel().tolist())
    resolved = {e: resolve_efficiency(profile, e) for e in sorted(present)}
    arrays = {}
    for f in FIELDS:
        values = np.zeros(z.shape, dtype=np.float64)
        for e in resolved:
            values[names == e] = getattr(resolved[e], f)
        arrays[f] = values
    return arrays, resolved
