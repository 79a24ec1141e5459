"""Calibration of the time model: against published runs, and against a user's own runs.

Two uses, one fitter:

* ``published_rows`` turns the published Megatron-LM runs (``costmodel/published_runs.yaml``,
  evaluated as ``costmodel/calibration_sets.yaml`` says) into rows with a measured step time;
  ``scripts/fit_calibration.py`` fits each hardware entry's efficiencies to them and writes
  ``costmodel/calibration.yaml``; ``published_errors`` is the table the tests assert on.
* ``calibrate`` reads a user's measured step times (the training entrypoint's ``metrics.jsonl``
  next to its plan directory, or a records file, format below), fits the profile's efficiencies
  to them and returns a calibrated profile; ``calibrated_profile_yaml`` renders it.

Records file (YAML with a top-level ``records:`` list, or JSONL with one record per line)::

    records:
      - model: examples/llama3-8b.yaml        # a spec file (path relative to the records file)
        # or inline: model: {num_layers: 32, hidden_size: 4096, ...}  plus  training: {...}
        training: {global_batch_size: 512}    # optional; overrides the spec file's training keys
        runtime: deepspeed                    # optional, default deepspeed
        layout: {tp: 2, pp: 1, dp: 8, zero_stage: 1, micro_batch_size: 2,
                 recompute: none, sequence_parallel: false, vpp: 1}
        step_time_s: 1.234                    # measured, steady state
        peak_mem_gib: 61.2                    # optional: torch.cuda.max_memory_allocated
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .costmodel import RECOMPUTE_CODES, Candidates, evaluate
from .costmodel.calibration import FIELDS, Resolved, resolve_efficiency
from .costmodel.evaluate import Engine
from .errors import SpecError
from .layout import RECOMPUTE_LEVELS, RUNTIMES
from .rules import stage_split
from .solver import GIB, Pins, enumerate_layouts
from .specs import ClusterProfile, Efficiency, ModelSpec, TrainingSpec, load_profile, load_spec

# Physical bounds of the fitted fractions: no kernel reaches 100% of peak or of a link, and
# an overlap fraction is a fraction.
BOUNDS = {"gemm": (0.3, 0.95), "attention": (0.2, 0.95), "hbm": (0.5, 0.95), "intra_node_comm": (0.5, 0.95),
          "inter_node_comm": (0.5, 0.95), "dp_overlap": (0.0, 1.0), "tp_overlap": (0.0, 1.0)}
# CPU ranks (gloo profiles such as `local`) sit far below datacenter-GPU figures against their
# stated peak: still fractions in (0, 1], with a floor low enough for them.
CPU_BOUNDS = {k: (min(lo, 0.02), hi) for k, (lo, hi) in BOUNDS.items()}


# --------------------------------------------------------------------------------------------
# Rows: one layout (or a pinned family of layouts) with a measured step time
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    id: str
    model: ModelSpec
    training: TrainingSpec
    profile: ClusterProfile
    runtime: str
    pins: Pins
    measured_step_s: float
    engine: Engine | None = None
    measured_peak_gib: float | None = None
    hardware: str | None = None  # calibration entry id (published rows)
    note: str = ""


@dataclass
class _Prepared:
    row: Row
    cand: Candidates
    fits: np.ndarray


def _prepare(row: Row) -> _Prepared:
    cand, _ = enumerate_layouts(row.model, row.training, row.profile, row.runtime, row.pins)
    if len(cand) == 0:
        raise SpecError(f"calibration row {row.id}: no legal layout with {row.pins}")
    ev = evaluate(row.model, row.training, row.profile, row.runtime, cand, engine=row.engine)
    fits = ev.total / GIB <= row.profile.gpu.memory_gib
    if not fits.any():  # a published run did fit: keep the smallest rather than nothing
        fits = ev.total == ev.total.min()
    return _Prepared(row, cand.take(np.flatnonzero(fits)), fits)


def _predict(p: _Prepared, eff: Resolved) -> tuple[float, int]:
    ev = evaluate(p.row.model, p.row.training, p.row.profile, p.row.runtime, p.cand, efficiency=eff,
                  engine=p.row.engine)
    i = int(np.argmin(ev.step_time))
    return float(ev.step_time[i]), i


def _resolved(values: dict[str, float], like: Resolved | None = None) -> Resolved:
    return Resolved(**{f: float(values[f]) for f in FIELDS}, sources=tuple((f, "fit") for f in FIELDS),
                    entry=None if like is None else like.entry,
                    mean_rel_error=None if like is None else like.mean_rel_error,
                    max_rel_error=None if like is None else like.max_rel_error)


# --------------------------------------------------------------------------------------------
# The published calibration set
# --------------------------------------------------------------------------------------------


def _data(name: str) -> dict:
    return yaml.safe_load(resources.files("orchestrator.costmodel").joinpath(name).read_text(encoding="utf-8"))


def step_time_from_tflops(formula: str, B: int, s: int, layers: int, h: int, V: int, gpus: int,
                          tflops_per_gpu: float) -> float:
    """Published TFLOP/s per GPU back to seconds per step with the source's own FLOP count."""
    if formula.startswith("F = 96"):  # Narayanan et al. 2021, Eq. 3 (with the recompute forward)
        F = 96 * B * s * layers * h**2 * (1 + s / (6 * h) + V / (16 * layers * h))
    elif formula.startswith("F = 72"):  # Megatron-LM r0.8 num_floating_point_operations, 4h GeLU, MHA
        F = 72 * B * s * layers * h**2 * (1 + s / (6 * h) + V / (12 * h * layers))
    else:
        raise ValueError(f"unknown FLOPs formula {formula!r}")
    return F / (gpus * tflops_per_gpu * 1e12)


def published_rows(profile_loader=load_profile) -> list[Row]:
    """Every published run as a Row, evaluated as calibration_sets.yaml describes."""
    runs = _data("published_runs.yaml")["runs"]
    out: list[Row] = []
    for cs in _data("calibration_sets.yaml")["sets"]:
        base_profile = profile_loader(cs["profile"]).profile
        eng = Engine(**cs["engine"])
        mcfg, tcfg, lcfg = cs["model"], cs["training"], cs["layout"]
        for run in runs:
            if not run["id"].startswith(cs["runs_prefix"]):
                continue
            entries = run.get("rows") or [run]
            for r in entries:
                m = r.get("model") if isinstance(r.get("model"), dict) else r
                h, layers, heads = int(m["hidden"]), int(m["layers"]), int(m["heads"])
                rid = run["id"] if "rows" not in run else f"{run['id']}_{r['model']}"
                tp, pp = int(r["tp"]), int(r["pp"])
                dp = int(r.get("dp") or r.get("derived_dp"))
                gpus = int(r["gpus"])
                B = int(r["global_batch"])
                tflops = float(r["tflops_per_gpu"] if "tflops_per_gpu" in r else r["reported"]["tflops_per_gpu"])
                model = ModelSpec(num_layers=layers, hidden_size=h, ffn_hidden_size=mcfg["ffn_multiplier"] * h,
                                  num_attention_heads=heads, vocab_size=cs["vocab"], activation=mcfg["activation"],
                                  tied_embeddings=mcfg["tied_embeddings"], normalization=mcfg["normalization"],
                                  position_embedding=mcfg["position_embedding"], bias=mcfg["bias"],
                                  max_position_embeddings=tcfg["seq_length"])
                training = TrainingSpec(global_batch_size=B, **tcfg)
                mbs = r.get("micro_batch_sc21_script")
                per_virtual = r.get("vpp_layers_per_virtual_stage_sc21_script")
                vpp = None
                if "micro_batch_sc21_script" in r:
                    vpp = 1 if per_virtual is None else layers // pp // int(per_virtual)
                pins = Pins(tp=tp, pp=pp, dp=dp, vpp=vpp, micro_batch_size=mbs, zero_stage=lcfg.get("zero_stage"),
                            recompute=lcfg.get("recompute"), sequence_parallel=lcfg.get("sequence_parallel"))
                step = step_time_from_tflops(cs["flops_formula"], B, training.seq_length, layers, h, cs["vocab"], gpus,
                                             tflops)
                out.append(Row(rid, model, training, base_profile.resized(nodes=gpus // base_profile.gpus_per_node),
                               cs["runtime"], pins, step, eng, hardware=cs["hardware"]))
    return out


@dataclass(frozen=True)
class RowError:
    id: str
    hardware: str | None
    measured_s: float
    predicted_s: float
    layout: str

    @property
    def rel_error(self) -> float:
        return self.predicted_s / self.measured_s - 1.0


def _layout_text(cand: Candidates, i: int) -> str:
    rc = {v: k for k, v in RECOMPUTE_CODES.items()}[int(cand.rc[i])]
    return (f"tp{int(cand.tp[i])} pp{int(cand.pp[i])} vpp{int(cand.vpp[i])} dp{int(cand.dp[i])} "
            f"zero{int(cand.zero[i])} mbs{int(cand.mbs[i])} rc={rc}{' sp' if cand.sp[i] else ''}")


def row_errors(rows: list[Row], efficiency_for=None) -> list[RowError]:
    """Predicted vs measured step time of each row; ``efficiency_for(row)`` gives the efficiencies
    (default: what the row's profile resolves to, i.e. the shipped calibration)."""
    out = []
    for row in rows:
        p = _prepare(row)
        eff = resolve_efficiency(row.profile) if efficiency_for is None else efficiency_for(row)
        t, i = _predict(p, eff)
        out.append(RowError(row.id, row.hardware, row.measured_step_s, t, _layout_text(p.cand, i)))
    return out


def published_errors() -> list[RowError]:
    """The model with the shipped calibration against every published run."""
    return row_errors(published_rows())


def error_summary(errors: list[RowError]) -> dict:
    rel = [abs(e.rel_error) for e in errors]
    return {"rows": len(rel), "mean": statistics.fmean(rel) if rel else 0.0, "max": max(rel) if rel else 0.0}


def error_table(errors: list[RowError]) -> str:
    lines = [f"{'run':48s} {'layout (pinned + searched)':44s} {'measured s':>10s} {'predicted s':>11s} {'error':>7s}"]
    for e in errors:
        lines.append(f"{e.id:48s} {e.layout:44s} {e.measured_s:10.3f} {e.predicted_s:11.3f} {100 * e.rel_error:+6.1f}%")
    groups: dict[str | None, list[RowError]] = {}
    for e in errors:
        groups.setdefault(e.hardware, []).append(e)
    for hw, errs in [*groups.items(), ("all", errors)]:
        s = error_summary(errs)
        lines.append(f"{hw}: {s['rows']} rows, mean |error| {100 * s['mean']:.2f}%, max |error| {100 * s['max']:.2f}%")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The fitter: bounded Nelder-Mead on a logistic transform (numpy only)
# --------------------------------------------------------------------------------------------


def _to_unit(x: float, lo: float, hi: float) -> float:
    u = min(max((x - lo) / (hi - lo), 1e-4), 1 - 1e-4)
    return math.log(u / (1 - u))


def _from_unit(z: float, lo: float, hi: float) -> float:
    return lo + (hi - lo) / (1 + math.exp(-z))


def _nelder_mead(fun, x0: np.ndarray, step: float = 0.6, iters: int = 400, tol: float = 1e-7) -> np.ndarray:
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [fun(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(vals)
        simplex = [simplex[i] for i in order]
        vals = [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        xr = centroid + (centroid - simplex[-1])
        fr = fun(xr)
        if fr < vals[0]:
            xe = centroid + 2 * (centroid - simplex[-1])
            fe = fun(xe)
            simplex[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (simplex[-1] - centroid)
            fc = fun(xc)
            if fc < vals[-1]:
                simplex[-1], vals[-1] = xc, fc
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                vals = [vals[0]] + [fun(x) for x in simplex[1:]]
    return simplex[int(np.argmin(vals))]


@dataclass(frozen=True)
class FitResult:
    values: dict[str, float]
    errors: list[RowError]
    objective: float
    free: tuple[str, ...]


def fit(rows: list[Row], start: dict[str, float], free: tuple[str, ...], *, prior_weight: float = 0.0,
        restarts: int = 2, iters: int = 400, bounds: dict = BOUNDS) -> FitResult:
    """Efficiencies ``free`` that minimize mean + max relative step-time error over ``rows``.

    ``prior_weight`` > 0 pulls each fraction towards ``start`` (in logistic units), so that a
    handful of user runs moves only what they can tell apart.
    """
    prepared = [_prepare(r) for r in rows]
    measured = np.array([r.measured_step_s for r in rows])
    z0 = np.array([_to_unit(min(max(start[f], bounds[f][0]), bounds[f][1]), *bounds[f]) for f in free])

    def values_of(z) -> dict[str, float]:
        v = dict(start)
        v.update({f: _from_unit(float(zi), *bounds[f]) for f, zi in zip(free, z)})
        return v

    def objective(z) -> float:
        eff = _resolved(values_of(z))
        pred = np.array([_predict(p, eff)[0] for p in prepared])
        rel = np.abs(pred / measured - 1)
        return float(rel.mean() + rel.max() + prior_weight * np.sum((z - z0) ** 2))

    best = z0
    best_val = objective(z0)
    for k in range(restarts):
        z = _nelder_mead(objective, best if k else z0, step=0.8 / (k + 1), iters=iters)
        v = objective(z)
        if v < best_val:
            best, best_val = z, v
    values = values_of(best)
    eff = _resolved(values)
    errors = []
    for p in prepared:
        t, i = _predict(p, eff)
        errors.append(RowError(p.row.id, p.row.hardware, p.row.measured_step_s, t, _layout_text(p.cand, i)))
    return FitResult(values, errors, best_val, free)


# --------------------------------------------------------------------------------------------
# A user's own runs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationReport:
    profile: str
    records: list[dict]  # per record: id, measured, predicted before / after, memory
    before: dict
    after: dict
    values_before: dict[str, float]
    values_after: dict[str, float]
    memory_overhead_gib: tuple[float, float]
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        r = lambda x: round(float(x), 4)  # noqa: E731
        return {
            "profile": self.profile,
            "records": self.records,
            "step_time_error_before": {k: r(v) if isinstance(v, float) else v for k, v in self.before.items()},
            "step_time_error_after": {k: r(v) if isinstance(v, float) else v for k, v in self.after.items()},
            "efficiency_before": {k: r(v) for k, v in self.values_before.items()},
            "efficiency_after": {k: r(v) for k, v in self.values_after.items()},
            "memory_overhead_gib": {"before": r(self.memory_overhead_gib[0]), "after": r(self.memory_overhead_gib[1])},
            "notes": list(self.notes),
        }


def _read_records(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = yaml.safe_load(text)
    if isinstance(data, dict) and "records" in data:
        return list(data["records"])
    if isinstance(data, list):
        return data
    raise SpecError(f"{path}: expected a 'records:' list (see `dsorch calibrate --help`).")


def _steady(values: list[float]) -> float:
    """Median of the steps after warm-up (the first fifth, at least one step, is dropped)."""
    if len(values) > 1:
        values = values[max(1, len(values) // 5):]
    return statistics.median(values)


def _plan_dir_records(metrics: Path, plan_dir: Path) -> CalibrationRecord:
    """One record from a training run's metrics.jsonl and the plan directory it trained."""
    from .plandir import load_plan_dir

    pd = load_plan_dir(plan_dir)
    model, training = pd.spec.model, pd.spec.training
    steps: dict[int, dict] = {}
    for line in metrics.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rec = json.loads(line)
            steps[int(rec["step"])] = rec  # a resumed run repeats steps: keep the last record
    recs = [steps[k] for k in sorted(steps)]
    if not recs:
        raise SpecError(f"{metrics}: no step records.")
    times = [r["step_time_s"] if r.get("step_time_s") else
             training.global_batch_size * training.seq_length / r["tokens_per_s"] for r in recs]
    mems = [r["peak_mem_gib"] for r in recs if r.get("peak_mem_gib") is not None]
    return CalibrationRecord(id=str(metrics), model=model, training=training, runtime=pd.runtime,
                             layout=RecordLayout(**pd.layout.as_dict()), step_time_s=_steady(times),
                             peak_mem_gib=max(mems) if mems else None, mem_kind=recs[-1].get("mem_kind"),
                             nodes=pd.doc.cluster.nodes, gpus_per_node=pd.doc.cluster.gpus_per_node)


class RecordLayout(BaseModel):
    """The layout a measured run used (the keys of plan.yaml's layout section)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tp: int = Field(default=1, gt=0)
    pp: int = Field(default=1, gt=0)
    dp: int = Field(gt=0)
    vpp: int = Field(default=1, gt=0)
    zero_stage: int = Field(default=0, ge=0, le=3)
    micro_batch_size: int = Field(gt=0)
    grad_accum_steps: int | None = Field(default=None, gt=0)  # implied by the batch; accepted as plan.yaml has it
    recompute: Literal[RECOMPUTE_LEVELS] = "none"  # type: ignore[valid-type]
    sequence_parallel: bool = False


class CalibrationRecord(BaseModel):
    """One measured run in a records file (format in this module's docstring). extra="forbid": a
    misspelt key (``runtme``, ``peak_mem_gb``) is an error, not a silently ignored value."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    id: str | None = None
    model: str | ModelSpec
    training: dict[str, Any] | TrainingSpec | None = None
    runtime: Literal[RUNTIMES] = "deepspeed"  # type: ignore[valid-type]
    layout: RecordLayout
    step_time_s: float = Field(gt=0, allow_inf_nan=False)
    peak_mem_gib: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    mem_kind: str | None = None
    nodes: int | None = Field(default=None, gt=0)
    gpus_per_node: int | None = Field(default=None, gt=0)


def _record_row(rec: CalibrationRecord, base: Path, profile: ClusterProfile, index: int) -> Row:
    if isinstance(rec.model, str):
        spec, _ = load_spec(base / rec.model)
        model, training = spec.model, spec.training
        if isinstance(rec.training, dict):
            training = TrainingSpec.model_validate({**training.model_dump(), **rec.training})
    else:
        model = rec.model
        training = rec.training if isinstance(rec.training, TrainingSpec) else \
            TrainingSpec.model_validate(rec.training or {})
    L = rec.layout
    world = L.tp * L.pp * L.dp
    gpn = rec.gpus_per_node or min(profile.gpus_per_node, world)
    nodes = rec.nodes or max(1, world // gpn)
    prof = profile.resized(nodes=nodes, gpus_per_node=gpn)
    if prof.world_size != world:
        raise SpecError(f"record {index}: tp*pp*dp = {world} GPUs but {nodes} nodes x {gpn} GPUs = {prof.world_size}.")
    pins = Pins(tp=L.tp, pp=L.pp, dp=L.dp, vpp=L.vpp, zero_stage=L.zero_stage, micro_batch_size=L.micro_batch_size,
                recompute=L.recompute, sequence_parallel=L.sequence_parallel)
    if stage_split(model.num_layers, L.pp) is None:
        raise SpecError(f"record {index}: pp={L.pp} cannot split {model.num_layers} layers.")
    return Row(rec.id or f"record {index}", model, training, prof, rec.runtime, pins, rec.step_time_s,
               measured_peak_gib=rec.peak_mem_gib, note=rec.mem_kind or "")


def _parse_record(raw: object, path: Path, index: int) -> CalibrationRecord:
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: record {index} must be a mapping, got {type(raw).__name__}.")
    try:
        return CalibrationRecord.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(record)'}: {err['msg']}"
                             for err in e.errors()[:6])
        valid = ", ".join(CalibrationRecord.model_fields)
        raise SpecError(f"{path}: record {index}: {problems}. Valid keys: {valid}; the format is in "
                        f"orchestrator/calibrate.py.")


def load_records(metrics_paths: list[Path], profile: ClusterProfile, plan_dir: Path | None = None) -> list[Row]:
    """Rows from run directories, metrics.jsonl files (with their plan directory) or records files."""
    rows: list[Row] = []
    for path in map(Path, metrics_paths):
        try:
            _load_one(path, profile, plan_dir, rows)
        except SpecError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, OSError, yaml.YAMLError) as e:
            # json.JSONDecodeError and pydantic's ValidationError are ValueErrors.
            raise SpecError(f"{path}: cannot read a measurement from it ({type(e).__name__}: "
                            f"{' '.join(str(e).split())[:300]}). Each record needs layout, model and step_time_s; "
                            f"see the format in orchestrator/calibrate.py.")
    if not rows:
        raise SpecError("no measurements to calibrate from.")
    return rows


def _load_one(path: Path, profile: ClusterProfile, plan_dir: Path | None, rows: list[Row]) -> None:
    if path.is_dir():
        path = path / "metrics.jsonl"
    if path.name == "metrics.jsonl":
        candidates = [plan_dir] if plan_dir else [path.parent, path.parent.parent]
        pdir = next((d for d in candidates if d is not None and (d / "plan.yaml").exists()), None)
        if pdir is None:
            raise SpecError(f"{path}: no plan.yaml next to it or one level up; pass the plan directory "
                            f"it was trained from (--plan DIR).")
        rows.append(_record_row(_plan_dir_records(path, pdir), path.parent, profile, len(rows)))
        return
    for i, raw in enumerate(_read_records(path)):
        rows.append(_record_row(_parse_record(raw, path, i), path.parent, profile, len(rows)))


def calibrate(metrics_paths: list[Path], profile: ClusterProfile, *, plan_dir: Path | None = None,
              free: tuple[str, ...] | None = None, prior_weight: float = 0.02) -> tuple[ClusterProfile, CalibrationReport]:
    """Fit ``profile``'s efficiencies to measured step times; returns the calibrated profile (all
    efficiencies explicit) and a report of errors before and after.

    Memory: where the measured peak is ``torch.cuda.max_memory_allocated`` it excludes the CUDA
    context and NCCL's own buffers, so it is compared with the predicted total minus the
    profile's framework overhead; a record without ``mem_kind`` is taken as the device total, and
    ``memory_overhead_gib`` grows to cover the largest shortfall (never shrinks).
    """
    rows = load_records(metrics_paths, profile, plan_dir)
    start = resolve_efficiency(profile)
    # Fit only what the runs exercise (a parameter no run depends on would drift freely); which
    # overlaps exist is the runtime's (costmodel.evaluate.ENGINES): DeepSpeed overlaps the DP
    # reduction only without pipelining, and neither runtime as dsorch launches it overlaps TP.
    if free is None:
        exercised = {"gemm", "hbm"}
        for r in rows:
            tp, pp, dp = r.pins.tp or 1, r.pins.pp or 1, r.pins.dp or 1
            if r.training.flash_attention:
                exercised.add("attention")
            if tp > 1 or (dp > 1 and r.profile.gpus_per_node > 1):
                exercised.add("intra_node_comm")
            if r.profile.nodes > 1:
                exercised.add("inter_node_comm")
            if dp > 1 and (r.runtime == "megatron" or pp == 1):
                exercised.add("dp_overlap")
        free = tuple(f for f in FIELDS if f in exercised)
    before = row_errors(rows, lambda row: start)
    # A user's handful of runs makes a cheap objective: more restarts buy a better optimum.
    result = fit(rows, start.values(), free, prior_weight=prior_weight, restarts=4, iters=800,
                 bounds=CPU_BOUNDS if profile.backend == "gloo" else BOUNDS)
    after = result.errors
    fitted = _resolved(result.values)

    overhead = profile.memory_overhead_gib
    new_overhead = overhead
    records = []
    notes = [f"fitted {', '.join(free)} to {len(rows)} run(s); other efficiencies kept"]
    for row, b, a in zip(rows, before, after):
        item = {"id": row.id, "layout": a.layout, "measured_step_s": round(row.measured_step_s, 4),
                "predicted_before_s": round(b.predicted_s, 4), "predicted_after_s": round(a.predicted_s, 4)}
        if row.measured_peak_gib is not None:
            p = _prepare(row)
            ev = evaluate(row.model, row.training, row.profile, row.runtime, p.cand, efficiency=fitted)
            total = float(ev.total[0]) / GIB
            allocator_only = row.note == "cuda_max_allocated"
            predicted = total - overhead if allocator_only else total
            item.update({"measured_peak_gib": round(row.measured_peak_gib, 3), "predicted_peak_gib": round(predicted, 3),
                         "peak_kind": "allocator (no CUDA context / NCCL)" if allocator_only else "device total"})
            if not allocator_only and row.measured_peak_gib > total:
                new_overhead = max(new_overhead, overhead + row.measured_peak_gib - total)
        records.append(item)
    if new_overhead != overhead:
        notes.append(f"memory_overhead_gib raised from {overhead:g} to {new_overhead:.2f} to cover the measured peaks")
    eff = Efficiency(**{f: round(result.values[f], 4) for f in FIELDS})
    calibrated = profile.model_copy(update={"efficiency": eff, "memory_overhead_gib": round(new_overhead, 2)})
    report = CalibrationReport(profile.name, records, error_summary(before), error_summary(after), start.values(),
                               result.values, (overhead, new_overhead), notes)
    return calibrated, report


def calibrated_profile_yaml(calibrated: ClusterProfile, report: CalibrationReport, *, name: str | None = None) -> str:
    """A profile file that extends the original and states the fitted values (deterministic)."""
    d = report.as_dict()
    before, after = d["step_time_error_before"], d["step_time_error_after"]
    header = [
        f"# Calibrated by `dsorch calibrate` from {len(report.records)} measured run(s) of profile '{report.profile}'.",
        f"# Step-time error: mean {100 * before['mean']:.1f}% / max {100 * before['max']:.1f}% before, "
        f"mean {100 * after['mean']:.1f}% / max {100 * after['max']:.1f}% after.",
        *[f"# {n}" for n in report.notes],
    ]
    doc = {"name": name or f"{report.profile}-calibrated", "extends": report.profile,
           "memory_overhead_gib": calibrated.memory_overhead_gib,
           "efficiency": {f: getattr(calibrated.efficiency, f) for f in FIELDS}}
    return "\n".join(header) + "\n" + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


__all__ = ["Row", "RowError", "FitResult", "CalibrationReport", "published_rows", "published_errors", "row_errors",
           "error_summary", "error_table", "fit", "calibrate", "calibrated_profile_yaml", "load_records",
           "step_time_from_tflops"]
