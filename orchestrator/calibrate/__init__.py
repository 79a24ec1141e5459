"""Calibration of the time model: against published runs, and against a user's own runs.

Two uses, one fitter:

* ``published_rows`` turns the published Megatron-LM runs (``costmodel/published_runs.yaml``,
  evaluated as ``costmodel/calibration_sets.yaml`` says) into rows with a measured step time;
  ``scripts/fit_calibration.py`` fits each hardware entry's efficiencies to them and writes
  ``costmodel/calibration.yaml``; ``published_errors`` is the table the tests assert on;
  ``measured_runs`` is what each run measured (its GPU, precision, kind and MFU), which
  ``scripts/fit_calibration.py --runs`` writes to ``costmodel/published_mfu.yaml`` for the plans
  (costmodel/calibration.py best_measured_mfu, Resolved.transfer; nothing in it is fitted).
* ``calibrate`` reads a user's measured step times (the step records of the training
  entrypoint's run directory, plandir/rundir.py RunDir.metrics, next to its plan directory, or a
  records file, format below), fits the profile's efficiencies
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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from orchestrator.calibrate.fit import FitResult, fit
from orchestrator.calibrate.published import (
    all_published_rows,
    published_errors,
    published_rows,
    step_time_from_tflops,
)
from orchestrator.calibrate.records import CalibrationRecord, load_records, record_rows
from orchestrator.calibrate.rows import (
    BOUNDS,
    CPU_BOUNDS,
    Row,
    RowError,
    error_summary,
    error_table,
    prepare_row,
    resolved_with,
    row_engine,
    row_errors,
)
from orchestrator.costmodel import evaluate
from orchestrator.costmodel.calibration import FIELDS, Resolved, resolve_efficiency
from orchestrator.costmodel.compute import _peak_flops
from orchestrator.costmodel.flops import model_flops_per_step
from orchestrator.plan.solver import GIB
from orchestrator.spec.cluster import ClusterProfile, Efficiency


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


def calibrate(
    metrics_paths: list[Path],
    profile: ClusterProfile,
    *,
    plan_dir: Path | None = None,
    plans_by_run: Mapping[Path, Path] | None = None,
    free: tuple[str, ...] | None = None,
    prior_weight: float = 0.02,
    memory_only: Sequence[CalibrationRecord] = (),
) -> tuple[ClusterProfile, CalibrationReport]:
    """Fit ``profile``'s efficiencies to measured step times; returns the calibrated profile (all
    efficiencies explicit) and a report of errors before and after.

    Memory: where the measured peak is ``torch.cuda.max_memory_allocated`` it excludes the CUDA
    context and NCCL's own buffers, so it is compared with the predicted total minus the
    profile's framework overhead; a record without ``mem_kind`` is taken as the device total, and
    ``memory_overhead_gib`` grows to cover the largest shortfall (never shrinks).
    ``memory_only`` records (runs that ran out of memory: records.oom_record) count for memory and
    not for time. ``plans_by_run``: load_records.
    """
    rows = load_records(metrics_paths, profile, plan_dir, plans_by_run)
    memory_rows = record_rows(list(memory_only), profile)
    # Start from the engine most runs used (the fitted values then apply to the profile as a whole).
    engines = [row_engine(r) for r in rows]
    start = resolve_efficiency(profile, max(sorted(set(engines)), key=engines.count))
    if free is None:
        free = _exercised(rows)  # fit only what the runs exercise
    before = row_errors(rows, lambda row: start)
    # A user's handful of runs makes a cheap objective: more restarts buy a better optimum.
    result = fit(
        rows,
        start.values(),
        free,
        prior_weight=prior_weight,
        restarts=4,
        iters=800,
        bounds=CPU_BOUNDS if profile.backend == "gloo" else BOUNDS,
    )
    after = result.errors
    fitted = resolved_with(result.values)

    overhead = profile.memory_overhead_gib
    new_overhead = overhead
    records: list[dict] = []
    notes = [f"fitted {', '.join(free)} to {len(rows)} run(s); other efficiencies kept"]
    # The timed rows with their errors before and after (one each: the fit predicts the rows it
    # was given), then the memory-only rows, which have none.
    entries: list[tuple[Row, tuple[RowError, RowError] | None]] = [
        (row, (b, a)) for row, b, a in zip(rows, before, after, strict=True)
    ]
    entries += [(row, None) for row in memory_rows]
    for row, errors in entries:
        item, needed = _record_item(row, errors, fitted, overhead)
        records.append(item)
        new_overhead = max(new_overhead, needed)
    if new_overhead != overhead:
        notes.append(
            f"memory_overhead_gib raised from {overhead:g} to {_ceil_cent(new_overhead):.2f} to cover the "
            f"measured peaks" + (" and the out-of-memory runs" if memory_rows else "")
        )
    eff = Efficiency(**{f: round(result.values[f], 4) for f in FIELDS})
    calibrated = profile.model_copy(update={"efficiency": eff, "memory_overhead_gib": _ceil_cent(new_overhead)})
    report = CalibrationReport(
        profile.name,
        records,
        error_summary(before),
        error_summary(after),
        start.values(),
        result.values,
        (overhead, new_overhead),
        notes,
    )
    return calibrated, report


def _exercised(rows: list[Row]) -> tuple[str, ...]:
    """The efficiencies the runs exercise, in FIELDS order: only those are fitted (a parameter no
    run depends on would drift freely). Which overlaps exist is the runtime's
    (costmodel.evaluate.ENGINES): DeepSpeed overlaps the DP reduction only without pipelining, and
    neither runtime as dsorch launches it overlaps TP."""
    found = {"gemm", "hbm"}
    for r in rows:
        tp, pp = r.pins.tp or 1, r.pins.pp or 1
        dp = r.profile.world_size // (tp * pp)  # the gradient reduction's group: every replica of a weight
        if r.training.flash_attention:
            found.add("attention")
        if tp > 1 or (dp > 1 and r.profile.gpus_per_node > 1):
            found.add("intra_node_comm")
        if r.profile.nodes > 1:
            found.add("inter_node_comm")
        if dp > 1 and r.runtime.engine.overlaps_dp(pp):
            found.add("dp_overlap")
        if row_engine(r) == "deepspeed-zero3" and dp > 1:
            found.add("zero3_stall_us")
        if r.runtime.engine_for(r.training).tp_overlap and tp > 1 and r.pins.sequence_parallel:
            found.add("tp_overlap")
    return tuple(f for f in FIELDS if f in found)


def _record_item(
    row: Row, errors: tuple[RowError, RowError] | None, fitted: Resolved, overhead: float
) -> tuple[dict[str, object], float]:
    """A row's entry in the report: its step times before and after the fit (``errors``), or that
    it ran out of memory (``None``: a memory-only row), then its peak memory as the fitted profile
    predicts it. Also the framework overhead the row's peak needs (``overhead`` when it needs no
    more): a device-total peak above the predicted total raises it."""
    item: dict[str, object] = {"id": row.id}
    if errors is not None:
        b, a = errors
        item.update(
            {
                "layout": a.layout,
                "measured_step_s": round(row.measured_step_s, 4),
                "predicted_before_s": round(b.predicted_s, 4),
                "predicted_after_s": round(a.predicted_s, 4),
            }
        )
    else:
        item["out_of_memory"] = True
    if row.measured_peak_gib is None:
        return item, overhead
    p = prepare_row(row)
    ev = evaluate(row.model, row.training, row.profile, row.runtime, p.cand, efficiency=fitted)
    total = float(ev.memory.total[0]) / GIB
    allocator_only = row.note == "cuda_max_allocated"
    predicted = total - overhead if allocator_only else total
    kind = (
        "allocator (no CUDA context / NCCL)"
        if allocator_only
        else "device total, at least (ran out of memory)"
        if errors is None
        else "device total"
    )
    item.update(
        {
            "measured_peak_gib": round(row.measured_peak_gib, 3),
            "predicted_peak_gib": round(predicted, 3),
            "peak_kind": kind,
        }
    )
    if not allocator_only and row.measured_peak_gib > total:
        return item, overhead + row.measured_peak_gib - total
    return item, overhead


def _ceil_cent(x: float) -> float:
    """Rounded up to 0.01 GiB: an overhead raised to cover a measured peak must still cover it."""
    import math

    return math.ceil(round(x * 100, 6)) / 100


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
    doc = {
        "name": name or f"{report.profile}-calibrated",
        "extends": report.profile,
        "memory_overhead_gib": calibrated.memory_overhead_gib,
        "efficiency": {f: getattr(calibrated.efficiency, f) for f in FIELDS},
    }
    return "\n".join(header) + "\n" + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


__all__ = [
    "Row",
    "RowError",
    "FitResult",
    "CalibrationReport",
    "CalibrationRecord",
    "published_rows",
    "published_errors",
    "row_errors",
    "error_summary",
    "error_table",
    "fit",
    "calibrate",
    "calibrated_profile_yaml",
    "load_records",
    "step_time_from_tflops",
    "BOUNDS",
    "CPU_BOUNDS",
]


def measured_mfu(row: Row) -> float:
    """A row's measured MFU as a plan states its predicted one (costmodel/evaluate.py): the model's
    FLOPs per step (costmodel/flops.py, Megatron-LM's count) over the measured step time, the GPUs
    and the dense peak of the training precision (FP8 GEMMs too: the model is bf16)."""
    flops = model_flops_per_step(row.model, row.training.seq_length, row.training.global_batch_size)
    return flops / (row.measured_step_s * row.profile.world_size * _peak_flops(row.profile, row.training.precision))


def measured_runs(rows: list[Row] | None = None) -> dict[str, dict]:
    """costmodel/published_mfu.yaml's ``runs``: each published row's calibration entry, GPU, precision
    ("fp8" where it ran FP8 GEMMs), kind and measured MFU, in the files' order. What a plan reads of
    the calibration data without the rows (costmodel/calibration.py best_measured_mfu and
    Resolved.transfer); scripts/fit_calibration.py --runs writes it."""
    out = {}
    for row in all_published_rows() if rows is None else rows:
        if math.isnan(row.measured_step_s):
            continue
        t = row.training
        out[row.id] = {
            "entry": row.hardware,
            "gpu": row.profile.gpu.name,
            "precision": "fp8" if t.fp8 is not None else t.precision,
            "moe": row.model.moe is not None,
            "mfu": round(measured_mfu(row), 4),
        }
    return out
