"""Rows of the calibration: one layout (or a pinned family of layouts) with a measured step time,
the model's prediction for it, and the errors. Shared by the published set and a user's runs."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestrator.costmodel import Candidates, evaluate
from orchestrator.costmodel.calibration import FIELDS, Resolved, engine_of, resolve_efficiency
from orchestrator.costmodel.evaluate import RC_TORCHTITAN_OP
from orchestrator.errors import SpecError
from orchestrator.plan.layout import AXES, AXIS, Pins, short_text
from orchestrator.plan.solver import GIB, enumerate_layouts
from orchestrator.runtimes import Engine, Runtime
from orchestrator.spec.cluster import ClusterProfile
from orchestrator.spec.model import ModelSpec
from orchestrator.spec.training import TrainingSpec

# Physical bounds of the fitted fractions: no kernel reaches 100% of peak or of a link, and
# an overlap fraction is a fraction.
# HBM's floor is lower: unfused eager element-wise kernels (FSDP runs without torch.compile) reach
# about a third of H100's HBM peak (the deepspeed-zero3/h100 fit lands there).
BOUNDS = {
    "gemm": (0.3, 0.95),
    "attention": (0.2, 0.95),
    "hbm": (0.3, 0.95),
    "intra_node_comm": (0.5, 0.95),
    "inter_node_comm": (0.5, 0.95),
    "dp_overlap": (0.0, 1.0),
    "tp_overlap": (0.0, 1.0),
    "zero3_stall_us": (0.0, 20000.0),
    # A rank's local experts as one grouped GEMM: small per-expert shapes (Qwen3-30B-A3B's are
    # 2048 x 768) sit well below a large dense GEMM, hence the lower floor.
    "grouped_gemm": (0.1, 0.95),
    "moe_layer_us": (0.0, 20_000.0),
    "ep_overlap": (0.0, 1.0),
    "fp8_gemm": (0.3, 1.0),
}
# CPU ranks (gloo profiles such as `local`) sit far below datacenter-GPU figures against their
# stated peak: still fractions in (0, 1], with a floor low enough for them.
CPU_BOUNDS = {k: (min(lo, 0.02), hi) for k, (lo, hi) in BOUNDS.items()}


@dataclass(frozen=True)
class Row:
    id: str
    model: ModelSpec
    training: TrainingSpec
    profile: ClusterProfile
    runtime: Runtime
    pins: Pins
    measured_step_s: float
    engine: Engine | None = None
    measured_peak_gib: float | None = None
    hardware: str | None = None  # calibration entry id (published rows)
    note: str = ""

    @property
    def fp8_recipe(self) -> str | None:
        """Transformer Engine's FP8 scaling recipe where the run used FP8 GEMMs (training.fp8_recipe)."""
        return self.training.fp8_recipe if self.training.fp8 is not None else None


def predicted_peak_gib(row: Row) -> float:
    """The model's per-GPU memory for a row's layout, as the engine that ran it allocates: a
    PyTorch FSDP run (``note == "fsdp"``) has neither DeepSpeed's ZeRO-3 reduce bucket, which the
    prediction for DeepSpeed holds whole, nor what dsorch's own entrypoint layer keeps beyond
    Megatron's (costmodel/evaluate.py: Evaluation.entrypoint_activations)."""
    from orchestrator.runtimes.deepspeed import ZERO_BUCKET_ELEMENTS

    ev = evaluate(row.model, row.training, row.profile, row.runtime, prepare_row(row).cand)
    total = float(ev.memory.total[0])
    if row.note == "fsdp":
        total -= ZERO_BUCKET_ELEMENTS * row.runtime.state_bytes(row.training.precision, 3)[0]
        total -= float(ev.entrypoint_activations[0])
    return float(total / GIB)


def row_engine(row: Row) -> str:
    """The calibration engine of a row (its layout is pinned to one ZeRO stage or runtime)."""
    return str(engine_of(row.runtime, row.pins.zero_stage or 0, row.pins.pp or 1).item())


@dataclass
class PreparedRow:
    row: Row
    cand: Candidates
    fits: np.ndarray


def prepare_row(row: Row) -> PreparedRow:
    op_sac = row.pins.recompute == "op"  # torchtitan's per-op SAC: enumerated as selective, evaluated as itself
    pins = row.pins.replaced(recompute="selective") if op_sac else row.pins
    if pins.recompute_layers is None:
        # A published run that recomputes fully reran every layer (Megatron's uniform method, DeepSpeed's
        # checkpoint interval 1) unless its record names the layers.
        pins = pins.replaced(recompute_layers=0)
    cand, _ = enumerate_layouts(row.model, row.training, row.profile, row.runtime, pins)
    if len(cand) == 0:
        raise SpecError(f"calibration row {row.id}: no legal layout with {row.pins}")
    if op_sac:
        cand = dataclasses.replace(cand, recompute=np.full_like(cand.recompute, RC_TORCHTITAN_OP))
    ev = evaluate(row.model, row.training, row.profile, row.runtime, cand, engine=row.engine)
    fits = ev.memory.total / GIB <= row.profile.gpu.memory_gib
    if not fits.any():  # a published run did fit: keep the smallest rather than nothing
        fits = ev.memory.total == ev.memory.total.min()
    return PreparedRow(row, cand.take(np.flatnonzero(fits)), fits)


def predict_row(p: PreparedRow, eff: Resolved) -> tuple[float, int]:
    ev = evaluate(
        p.row.model, p.row.training, p.row.profile, p.row.runtime, p.cand, efficiency=eff, engine=p.row.engine
    )
    i = int(np.argmin(ev.time.step))
    return float(ev.time.step[i]), i


def resolved_with(values: dict[str, float], like: Resolved | None = None) -> Resolved:
    # Typed Any: a type checker cannot tell that FIELDS names exactly Resolved's float fields, and
    # would match the floats against every other keyword too.
    efficiencies: dict[str, Any] = {f: float(values[f]) for f in FIELDS}
    return Resolved(
        **efficiencies,
        sources=tuple((f, "fit") for f in FIELDS),
        entry=None if like is None else like.entry,
        mean_rel_error=None if like is None else like.mean_rel_error,
        max_rel_error=None if like is None else like.max_rel_error,
    )


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


def layout_text(cand: Candidates, i: int) -> str:
    """A row's layout in one line (``short_text``); torchtitan's op-level recompute reads "rc=op"."""
    values = {a.name: a.decode(getattr(cand, a.name)[i]) for a in AXES if a.name != "recompute"}
    values["recompute"] = (
        "op" if int(cand.recompute[i]) == RC_TORCHTITAN_OP else AXIS["recompute"].decode(cand.recompute[i])
    )
    return short_text(values)


def row_errors(rows: list[Row], efficiency_for=None) -> list[RowError]:
    """Predicted vs measured step time of each row; ``efficiency_for(row)`` gives the efficiencies
    (default: what the row's profile resolves to, i.e. the shipped calibration)."""
    out = []
    for row in rows:
        p = prepare_row(row)
        eff = resolve_efficiency(row.profile, row_engine(row)) if efficiency_for is None else efficiency_for(row)
        t, i = predict_row(p, eff)
        out.append(RowError(row.id, row.hardware, row.measured_step_s, t, layout_text(p.cand, i)))
    return out


def error_summary(errors: list[RowError]) -> dict:
    rel = [abs(e.rel_error) for e in errors]
    return {"rows": len(rel), "mean": statistics.fmean(rel) if rel else 0.0, "max": max(rel) if rel else 0.0}


def error_table(errors: list[RowError], scored: set[str] | frozenset[str] = frozenset()) -> str:
    """Each row's error, then the mean and max per entry and over all rows. ``scored``: runs an entry
    scores but was not fitted on (calibration.yaml scored_not_fitted), marked and summed apart."""
    lines = [f"{'run':48s} {'layout (pinned + searched)':44s} {'measured s':>10s} {'predicted s':>11s} {'error':>7s}"]
    for e in errors:
        mark = "  scored, not fitted" if e.id in scored else ""
        lines.append(
            f"{e.id:48s} {e.layout:44s} {e.measured_s:10.3f} {e.predicted_s:11.3f} {100 * e.rel_error:+6.1f}%{mark}"
        )
    fitted = [e for e in errors if e.id not in scored]
    groups: dict[str | None, list[RowError]] = {}
    for e in fitted:
        groups.setdefault(e.hardware, []).append(e)
    apart = [("scored, not fitted", [e for e in errors if e.id in scored])] if scored else []
    for hw, errs in [*groups.items(), ("all", fitted), *apart]:
        s = error_summary(errs)
        lines.append(f"{hw}: {s['rows']} rows, mean |error| {100 * s['mean']:.2f}%, max |error| {100 * s['max']:.2f}%")
    return "\n".join(lines)
