"""Trials: which layouts to measure on the user's own cluster, and what measuring them costs.

The first part of `dsorch trial` (issue 12): the selection and its price, before anything is
submitted. The top K layouts by prediction are measured, and besides them the best layout of
every other family the search found (ZeRO-3 data parallelism, pipelining, TP-heavy, plain data
parallelism, context parallelism), so that a measurement can overturn the model's ranking of the
families and not only reorder near-equals. Pure: a SearchResult in, picks and figures out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .layout import Layout
from .solver import Pins, Scored

# Families, in the order a tie between them is reported.
FAMILIES = ("context-parallel", "pipeline", "zero3", "tp-heavy", "data-parallel")


def family(layout: Layout) -> str:
    """The family of a layout: what dominates its communication."""
    if layout.cp > 1:
        return "context-parallel"
    if layout.pp > 1:
        return "pipeline"
    if layout.zero_stage == 3:
        return "zero3"
    if layout.tp > 1:
        return "tp-heavy"
    return "data-parallel"


@dataclass(frozen=True)
class TrialPick:
    scored: Scored
    family: str
    why: str  # "rank 2 by prediction" or "best pipeline layout (rank 14)"


def select_trials(ranked: list[Scored], top: int) -> list[TrialPick]:
    """The top ``top`` of ``ranked`` (fastest first, as the search ranks them), then the best of each
    family not among them, each once, in rank order. ``ranked`` should be long enough to hold every
    family's best (search with a large ``keep``)."""
    picks: list[TrialPick] = []
    seen: set[Layout] = set()
    for i, s in enumerate(ranked[:top]):
        picks.append(TrialPick(s, family(s.layout), f"rank {i + 1} by prediction"))
        seen.add(s.layout)
    covered = {p.family for p in picks}
    for i, s in enumerate(ranked):
        fam = family(s.layout)
        if fam not in covered and s.layout not in seen:
            picks.append(TrialPick(s, fam, f"best {fam} layout (rank {i + 1})"))
            covered.add(fam)
            seen.add(s.layout)
    return picks


def pins_of(layout: Layout) -> Pins:
    """Every field pinned: a trial's plan is exactly its layout."""
    return Pins(tp=layout.tp, pp=layout.pp, dp=layout.dp, vpp=layout.vpp, zero_stage=layout.zero_stage,
                micro_batch_size=layout.micro_batch_size, recompute=layout.recompute,
                sequence_parallel=layout.sequence_parallel, cp=layout.cp)


@dataclass(frozen=True)
class TrialCost:
    gpu_hours: float  # predicted, the whole array
    seconds: float  # predicted compute time, the trials one after another (each takes the whole cluster)
    gpus: int


def trial_cost(picks: list[TrialPick], steps: int, world_size: int) -> TrialCost:
    """What the trials cost by the model's own predictions: ``steps`` steps each (warm-up included)
    on all ``world_size`` GPUs. Start-up (scheduling, imports, process groups) is not in it."""
    seconds = sum(steps * p.scored.step_time_s for p in picks)
    return TrialCost(gpu_hours=seconds * world_size / 3600.0, seconds=seconds, gpus=world_size)


def trial_dir_name(index: int, pick: TrialPick) -> str:
    """The plan directory of a trial inside the trial's folder: ``01-zero3``; its run goes in ``run/``."""
    return f"{index + 1:02d}-{pick.family}"


# How a trial that did not finish failed, from the scheduler's state and the ranks' logs. An
# out-of-memory is evidence against the memory model, the others are not.
# PyTorch raises torch.OutOfMemoryError ("CUDA out of memory. Tried to allocate ..."); cuBLAS
# reports a failed workspace allocation as CUBLAS_STATUS_ALLOC_FAILED.
_OOM = ("CUDA out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED")
# sacct's states for a job the time limit ended (DEADLINE: its --deadline passed).
_TIMEOUT_STATES = ("TIMEOUT", "DEADLINE")


def classify_failure(state: str, log_text: str) -> str:
    """"oom", "timeout" or "error"."""
    if any(s in log_text for s in _OOM):
        return "oom"
    if state and state.upper().split()[0] in _TIMEOUT_STATES:
        return "timeout"
    return "error"


@dataclass(frozen=True)
class TrialResult:
    pick: TrialPick
    plan_dir: str
    measured_step_s: float | None  # steady state: the warm-up fifth of the steps dropped
    peak_mem_gib: float | None
    failure: str | None = None  # "oom" | "timeout" | "error"
    detail: str = ""

    @property
    def error(self) -> float | None:
        """Predicted over measured step time, minus one."""
        if self.measured_step_s is None:
            return None
        return self.pick.scored.step_time_s / self.measured_step_s - 1.0


def measure(pick: TrialPick, plan_dir, run_dir, state: str = "", log_text: str = "") -> TrialResult:
    """The result of one trial from its run directory (metrics.jsonl, as calibrate reads it) or, when
    it has no steps, its failure from the scheduler's state and the logs."""
    from .calibrate.records import run_record
    from .errors import SpecError

    metrics = Path(run_dir) / "metrics.jsonl"
    if metrics.is_file():
        try:
            rec = run_record(metrics, Path(plan_dir))
        except SpecError:
            rec = None
        if rec is not None:
            return TrialResult(pick, str(plan_dir), rec.step_time_s, rec.peak_mem_gib)
    return TrialResult(pick, str(plan_dir), None, None, classify_failure(state, log_text),
                       " ".join(log_text.split()[-40:]))


def trial_plans(spec, spec_file, spec_sha256: str, loaded, runtime: str, picks: list[TrialPick], folder, *,
                nodes: int | None = None, gpus_per_node: int | None = None) -> list[tuple[object, dict[str, str]]]:
    """Each pick's plan directory (``folder/NN-family``) and its files: its layout pinned whole, then
    searched, rendered and validated as `dsorch plan` does, so that every trial is an ordinary plan
    directory (`dsorch submit` runs one, `dsorch calibrate` reads its run)."""
    from .pipeline import plan_files
    from .writer import spec_path_in

    out = []
    for i, pick in enumerate(picks):
        d = Path(folder) / trial_dir_name(i, pick)
        _, files = plan_files(spec, spec_path_in(Path(spec_file), d), spec_sha256, loaded, runtime,
                              pins_of(pick.scored.layout), nodes=nodes, gpus_per_node=gpus_per_node,
                              memory_margin_gib=0.0, keep=1, shown_path=str(spec_file))
        out.append((d, files))
    return out
