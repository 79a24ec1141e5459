"""A user's measured runs: records files (YAML/JSONL, format in ``orchestrator.calibrate``) and
run directories (their step records, plandir/rundir.py RunDir.metrics, beside the plan directory
they trained), as typed records and Rows."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.calibrate.rows import Row
from orchestrator.errors import SpecError
from orchestrator.plan.layout import (
    PINNABLE,
    WORLD_PRODUCT,
    LayoutDoc,
    Pins,
    layout_schema,
    world_of,
)
from orchestrator.plan.rules import check_model, check_training, stage_split
from orchestrator.plandir.rundir import METRICS_FILE, RunDir
from orchestrator.runtimes import DEFAULT, RUNTIME_NAMES, runtime_named
from orchestrator.spec.cluster import ClusterProfile
from orchestrator.spec.model import ModelSpec, load_spec
from orchestrator.spec.training import TrainingSpec


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
        values = values[max(1, len(values) // 5) :]
    return statistics.median(values)


def is_step(rec: dict) -> bool:
    """A step record of a run's metrics file, not an evaluation's ("kind": "eval", train/loop/metrics.py)."""
    return rec.get("kind", "step") == "step"


def last_records(metrics: Path) -> tuple[dict | None, dict | None]:
    """The newest step record and the newest evaluation record of a run's metrics file (a line cut
    by a crash is skipped)."""
    step = evaluation = None
    for line in reversed(metrics.read_bytes().splitlines()):
        if step is not None and evaluation is not None:
            break
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        if is_step(rec):
            step = step or rec
        else:
            evaluation = evaluation or rec
    return step, evaluation


def read_steps(metrics: Path) -> list[dict]:
    """The step records of a run's metrics file, one per step in step order (a resumed run repeats steps:
    the last record of a step wins); evaluations' records ("kind": "eval") are left out."""
    steps: dict[int, dict] = {}
    for line in metrics.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rec = json.loads(line)
            if is_step(rec):
                steps[int(rec["step"])] = rec
    return [steps[k] for k in sorted(steps)]


def run_record(metrics: Path, plan_dir: Path) -> CalibrationRecord:
    """One record from a training run's metrics file and the plan directory it trained."""
    from orchestrator.plandir.reader import load_plan_dir

    pd = load_plan_dir(plan_dir)
    model, training = pd.spec.model, pd.spec.training
    recs = read_steps(metrics)
    if not recs:
        raise SpecError(f"{metrics}: no step records.")
    times = [
        r["step_time_s"]
        if r.get("step_time_s")
        else training.global_batch_size * training.seq_length / r["tokens_per_s"]
        for r in recs
    ]
    mems = [r["peak_mem_gib"] for r in recs if r.get("peak_mem_gib") is not None]
    return CalibrationRecord(
        id=str(metrics),
        model=model,
        training=training,
        runtime=pd.runtime.name,
        layout=RecordLayout(**pd.layout.as_dict()),
        step_time_s=_steady(times),
        peak_mem_gib=max(mems) if mems else None,
        mem_kind=recs[-1].get("mem_kind"),
        nodes=pd.doc.cluster.nodes,
        gpus_per_node=pd.doc.cluster.gpus_per_node,
    )


# How far past the device memory an out-of-memory proves the peak went, when the run recorded no
# larger peak of its own: a GPU run that dies of torch.OutOfMemoryError records nothing, but its
# peak passed the device's memory; the smallest step this takes is the allocation that failed,
# unknown, so a token 10 MiB (one that keeps the calibrated prediction strictly over the limit).
OOM_MARGIN_GIB = 10 / 1024


def oom_record(plan_dir: Path, metrics: Path | None) -> CalibrationRecord:
    """A memory-only record of a run that ran out of memory: its peak is at least the plan's device
    memory (plus OOM_MARGIN_GIB), or the largest peak it recorded before dying. Its step time is
    the plan's prediction, a placeholder that no time fit may use (calibrate's memory_only)."""
    from orchestrator.plandir.reader import load_plan_dir, predicted_step_s

    pd = load_plan_dir(plan_dir)
    predicted_s = predicted_step_s(pd.path, pd.doc.predicted)
    peak = pd.doc.cluster.gpu_memory_gib + OOM_MARGIN_GIB
    if metrics is not None and metrics.is_file():
        try:
            recorded = run_record(metrics, plan_dir).peak_mem_gib
        except SpecError:
            recorded = None
        if recorded is not None:
            peak = max(peak, recorded)
    return CalibrationRecord(
        id=f"{plan_dir} (out of memory)",
        model=pd.spec.model,
        training=pd.spec.training,
        runtime=pd.runtime.name,
        layout=RecordLayout(**pd.layout.as_dict()),
        step_time_s=predicted_s,
        peak_mem_gib=peak,
        mem_kind="out_of_memory",
        nodes=pd.doc.cluster.nodes,
        gpus_per_node=pd.doc.cluster.gpus_per_node,
    )


def record_rows(records: list[CalibrationRecord], profile: ClusterProfile) -> list[Row]:
    return [_record_row(r, Path("."), profile, i) for i, r in enumerate(records)]


# The layout a measured run used: the keys of plan.yaml's layout section (orchestrator.plan.layout.AXES);
# an axis at its neutral value may be left out, grad_accum_steps follows from the batch.
if TYPE_CHECKING:
    RecordLayout = LayoutDoc
else:
    RecordLayout = layout_schema("RecordLayout", record=True)


class CalibrationRecord(BaseModel):
    """One measured run in a records file (format in this module's docstring). extra="forbid": a
    misspelt key (``runtme``, ``peak_mem_gb``) is an error, not a silently ignored value."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    id: str | None = None
    model: str | ModelSpec
    training: dict[str, Any] | TrainingSpec | None = None
    runtime: Literal[RUNTIME_NAMES] = DEFAULT.name  # type: ignore[valid-type]
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
        training = (
            rec.training if isinstance(rec.training, TrainingSpec) else TrainingSpec.model_validate(rec.training or {})
        )
    L = rec.layout
    world = world_of(L.model_dump())
    gpn = rec.gpus_per_node or min(profile.gpus_per_node, world)
    nodes = rec.nodes or max(1, world // gpn)
    prof = profile.resized(nodes=nodes, gpus_per_node=gpn)
    if prof.world_size != world:
        raise SpecError(
            f"record {index}: {WORLD_PRODUCT} = {world} GPUs but {nodes} nodes x {gpn} GPUs = {prof.world_size}."
        )
    pins = Pins(**{a.name: getattr(L, a.name) for a in PINNABLE})
    if stage_split(model.num_layers, L.pp, model.mtp_layers) is None:
        raise SpecError(f"record {index}: pp={L.pp} cannot split {model.num_layers} layers.")
    runtime = runtime_named(rec.runtime)
    problems = check_model(model, runtime) + check_training(training, prof, runtime)
    if problems:
        raise SpecError(f"record {index}: " + "; ".join(problems) + ".")
    return Row(
        rec.id or f"record {index}",
        model,
        training,
        prof,
        runtime,
        pins,
        rec.step_time_s,
        measured_peak_gib=rec.peak_mem_gib,
        note=rec.mem_kind or "",
    )


def _parse_record(raw: object, path: Path, index: int) -> CalibrationRecord:
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: record {index} must be a mapping, got {type(raw).__name__}.")
    try:
        return CalibrationRecord.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(record)'}: {err['msg']}" for err in e.errors()[:6]
        )
        valid = ", ".join(CalibrationRecord.model_fields)
        raise SpecError(
            f"{path}: record {index}: {problems}. Valid keys: {valid}; the format is in "
            f"orchestrator/calibrate/__init__.py."
        ) from e


def load_records(
    metrics_paths: list[Path],
    profile: ClusterProfile,
    plan_dir: Path | None = None,
    plans_by_run: Mapping[Path, Path] | None = None,
) -> list[Row]:
    """Rows from run directories, their metrics files (with their plan directory) or records files.
    ``plans_by_run``: the plan directory of each submitted run directory (resolved paths, from the
    job registry), for a run directory that is not inside its plan's."""
    rows: list[Row] = []
    for path in map(Path, metrics_paths):
        try:
            _load_one(path, profile, plan_dir, plans_by_run or {}, rows)
        except SpecError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, OSError, yaml.YAMLError) as e:
            # json.JSONDecodeError and pydantic's ValidationError are ValueErrors.
            raise SpecError(
                f"{path}: cannot read a measurement from it ({type(e).__name__}: "
                f"{' '.join(str(e).split())[:300]}). Each record needs layout, model and step_time_s; "
                f"see the format in orchestrator/calibrate/__init__.py."
            ) from e
    if not rows:
        raise SpecError("no measurements to calibrate from.")
    return rows


def _load_one(
    path: Path, profile: ClusterProfile, plan_dir: Path | None, plans_by_run: Mapping[Path, Path], rows: list[Row]
) -> None:
    if path.is_dir():
        path = RunDir(path).metrics
    if path.name == METRICS_FILE:
        registered = plans_by_run.get(path.parent.resolve())
        candidates = [plan_dir] if plan_dir else [path.parent, path.parent.parent, registered]
        pdir = next((d for d in candidates if d is not None and (d / "plan.yaml").exists()), None)
        if pdir is None:
            raise SpecError(
                f"{path}: no plan.yaml next to it or one level up, and no job in this experiment's registry "
                f"ran there; pass the plan directory it was trained from (--plan DIR)."
            )
        rows.append(_record_row(run_record(path, pdir), path.parent, profile, len(rows)))
        return
    for i, raw in enumerate(_read_records(path)):
        rows.append(_record_row(_parse_record(raw, path, i), path.parent, profile, len(rows)))
