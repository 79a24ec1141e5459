"""`dsorch trial`: measure the top layouts on the user's own cluster and close the loop into the plan.

1. Selection and price (pure): the top K layouts by prediction, and besides them the best layout
   of every other family the search found (ZeRO-3 data parallelism, pipelining, TP-heavy, plain
   data parallelism, context parallelism), so that a measurement can overturn the model's ranking
   of the families and not only reorder near-equals; priced in GPU-hours from the predictions.
2. Start (``start``): each pick becomes an ordinary plan directory (``TRIAL/NN-family/``, its
   run in ``run/``), and all of them one job array (the backend's submit_array, run/backends/: SLURM's
   ``--array=0-N%1``, or a LocalArray for ``--cluster local``), each a short run of the bundled
   entrypoint on synthetic tokens without checkpoints; one registry row per trial, so `dsorch
   status` shows them. ``TRIAL/trial.yaml`` (MANIFEST) records what was submitted.
3. Collect (``collect``), once every element has ended: each trial's steady step time and peak
   memory (its run directory's step records, the warm-up fifth of the steps dropped, as calibrate
   reads them) or its failure (oom / timeout / error; an out-of-memory is evidence against the memory model: its
   peak passed the device's memory); ``dsorch calibrate``'s fit over them writes
   ``PROFILES/<cluster>-measured.yaml`` (it extends the original); the spec is re-planned with
   it and the winner's plan directory written with the evidence in its plan.yaml; everything
   also in ``TRIAL/results.yaml``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.calibrate import calibrate, calibrated_profile_yaml
from orchestrator.calibrate.records import oom_record, run_record
from orchestrator.compose import checked_files, plan_files
from orchestrator.costmodel.flops import model_flops_per_step
from orchestrator.errors import InvalidFile, JobError, NoFeasibleLayout, OutputError, SpecError
from orchestrator.plan.layout import Layout, Pins
from orchestrator.plan.make import make_plan
from orchestrator.plan.request import PlanRequest
from orchestrator.plan.solver import Scored, search
from orchestrator.plandir.reader import load_plan_dir
from orchestrator.plandir.rundir import RunDir
from orchestrator.plandir.writer import spec_path_in, write_plan_dir
from orchestrator.run.backends import backend_for
from orchestrator.run.registry import Registry
from orchestrator.run.submission import prepare_submission, record_array, refresh
from orchestrator.runtimes import DEEPSPEED, Runtime
from orchestrator.spec.cluster import Executor, check_local_nodes, load_profile
from orchestrator.spec.model import load_spec
from orchestrator.spec.sbatch import parse_slurm_time
from orchestrator.train.stop import OOM_MARK


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
        picks.append(TrialPick(s, s.layout.family, f"rank {i + 1} by prediction"))
        seen.add(s.layout)
    covered = {p.family for p in picks}
    for i, s in enumerate(ranked):
        fam = s.layout.family
        if fam not in covered and s.layout not in seen:
            picks.append(TrialPick(s, fam, f"best {fam} layout (rank {i + 1})"))
            covered.add(fam)
            seen.add(s.layout)
    return picks


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
# On a CPU (gloo) run the entrypoint's stand-in says OOM_MARK (orchestrator/train/stop.py).
_OOM = ("CUDA out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED", OOM_MARK)
# sacct's states for a job the time limit ended (DEADLINE: its --deadline passed).
_TIMEOUT_STATES = ("TIMEOUT", "DEADLINE")


def classify_failure(state: str, log_text: str) -> str:
    """ "oom", "timeout", "cancelled" or "error"."""
    if any(s in log_text for s in _OOM):
        return "oom"
    first = state.upper().split()[0] if state and state.split() else ""
    if first in _TIMEOUT_STATES:
        return "timeout"
    if first == "CANCELLED":
        return "cancelled"
    return "error"


class TrialEntry(BaseModel):
    """One trial in the manifest: its plan directory, why it was picked, what was predicted."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    dir: str
    family: str
    why: str
    layout: str  # Layout.short()
    predicted_step_s: float
    predicted_peak_gib: float
    job_id: str


class Manifest(BaseModel):
    """TRIAL/trial.yaml: what `dsorch trial` submitted; `--status` and `--collect` read it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    version: int = 1
    spec: str  # relative to the trial directory
    spec_sha256: str
    cluster: str
    nodes: int | None = None
    gpus_per_node: int | None = None
    world_size: int = Field(gt=0)
    steps: int = Field(gt=0)
    top: int = Field(gt=0)
    executor: Executor  # whose backend ran the array (run/backends/)
    log_dir: str  # submitit's folder of the array
    time_limit_s: float
    trials: list[TrialEntry]


MANIFEST = "trial.yaml"
RESULTS = "results.yaml"


def entry_of(index: int, pick: TrialPick, job_id: str) -> TrialEntry:
    s = pick.scored
    return TrialEntry(
        dir=trial_dir_name(index, pick),
        family=pick.family,
        why=pick.why,
        layout=s.layout.short(),
        predicted_step_s=round(s.step_time_s, 6),
        predicted_peak_gib=round(s.memory_gib["total"], 4),
        job_id=job_id,
    )


def load_manifest(trial_dir: Path) -> Manifest:
    path = Path(trial_dir) / MANIFEST
    if not path.is_file():
        raise InvalidFile(
            f"{trial_dir} is not a trial directory (no {MANIFEST}); start one with `dsorch trial SPEC --cluster NAME`."
        )
    try:
        return Manifest.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (ValidationError, yaml.YAMLError) as e:
        raise InvalidFile(
            f"{path}: not a manifest dsorch trial wrote ({' '.join(str(e).split())[:300]}); "
            f"start the trials again into a new directory."
        ) from e


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def trial_time_limit_s(picks: list[TrialPick], steps: int, profile_limit_min: int) -> float:
    """The time limit of each element: start-up is not in the predictions (imports, process
    groups, DeepSpeed's op builds on first use), so 10 minutes of it, plus 5x the slowest trial's
    predicted steps, within the profile's own limit. A hang ends as TIMEOUT, not as a lost day."""
    slowest = max(steps * p.scored.step_time_s for p in picks)
    return float(min(600.0 + 5.0 * slowest, profile_limit_min * 60.0))


@dataclass(frozen=True)
class TrialResult:
    entry: TrialEntry
    plan_dir: str
    state: str
    measured_step_s: float | None  # steady state: the warm-up fifth of the steps dropped
    peak_mem_gib: float | None
    tokens_per_s: float | None = None
    mfu: float | None = None  # model FLOPs (no recomputation) over the cluster's dense peak, as the entrypoint logs it
    failure: str | None = None  # "oom" | "timeout" | "cancelled" | "error"
    detail: str = ""

    @property
    def error(self) -> float | None:
        """Predicted over measured step time, minus one."""
        if self.measured_step_s is None:
            return None
        return self.entry.predicted_step_s / self.measured_step_s - 1.0


def measure(entry: TrialEntry, plan_dir, run_dir, state: str, log_text: str = "") -> TrialResult:
    """The result of one trial: a COMPLETED element's steady step time and peak memory from its
    run directory (its step records, as calibrate reads them); any other end is a failure with its cause
    from the state and the ranks' logs, keeping the peak it recorded before failing."""
    metrics = RunDir(Path(run_dir)).metrics
    rec = None
    if metrics.is_file():
        try:
            rec = run_record(metrics, Path(plan_dir))
        except SpecError:
            rec = None
    if state == "COMPLETED" and rec is not None:
        # The plan directory's spec and cluster: the record's model and training are that spec's
        # (run_record reads them from the same directory).
        pd = load_plan_dir(Path(plan_dir))
        t, cluster = pd.spec.training, pd.doc.cluster
        flops = model_flops_per_step(pd.spec.model, t.seq_length, t.global_batch_size)
        mfu = flops / rec.step_time_s / cluster.world_size / (cluster.peak_tflops * 1e12)
        return TrialResult(
            entry,
            str(plan_dir),
            state,
            rec.step_time_s,
            rec.peak_mem_gib,
            t.global_batch_size * t.seq_length / rec.step_time_s,
            mfu,
        )
    detail = " ".join(log_text.split()[-40:])
    return TrialResult(
        entry,
        str(plan_dir),
        state,
        None,
        rec.peak_mem_gib if rec else None,
        failure=classify_failure(state, log_text),
        detail=detail,
    )


def trial_plans(
    spec,
    spec_file,
    spec_sha256: str,
    loaded,
    runtime: Runtime,
    picks: list[TrialPick],
    folder,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
) -> list[tuple[Path, dict[str, str]]]:
    """Each pick's plan directory (``folder/NN-family``) and its files: its layout pinned whole, then
    searched, rendered and validated as `dsorch plan` does, so that every trial is an ordinary plan
    directory (`dsorch submit` runs one, `dsorch calibrate` reads its run)."""
    out: list[tuple[Path, dict[str, str]]] = []
    for i, pick in enumerate(picks):
        d = Path(folder) / trial_dir_name(i, pick)
        _, files = plan_files(
            PlanRequest(
                spec=spec,
                spec_path=spec_path_in(Path(spec_file), d),
                spec_sha256=spec_sha256,
                profile=loaded,
                runtime=runtime,
                pins=Pins.of(pick.scored.layout),
                nodes=nodes,
                gpus_per_node=gpus_per_node,
                memory_margin_gib=0.0,
                keep=1,
                shown_path=str(spec_file),
            )
        )
        out.append((d, files))
    return out


# --------------------------------------------------------------------------------------------
# Start: plan directories, one job array, registry rows, the manifest
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proposal:
    """What `dsorch trial` would submit, priced: shown before anything is written."""

    picks: list[TrialPick]
    cost: TrialCost
    time_limit_s: float
    world_size: int


def propose(spec, loaded, top: int, steps: int, nodes: int | None, gpus_per_node: int | None) -> Proposal:
    check_local_nodes(loaded.profile, nodes)
    profile = loaded.profile.resized(nodes, gpus_per_node)
    # keep: every feasible layout, so that each family's best is in the list.
    ranked = search(spec.model, spec.training, profile, DEEPSPEED, keep=1_000_000).ranked
    if not ranked:
        raise NoFeasibleLayout(
            f"no layout of {spec.name} fits on {profile.name} ({profile.nodes} x {profile.gpus_per_node}); "
            f"`dsorch plan` says why. Nothing to measure."
        )
    picks = select_trials(ranked, top)
    limit = trial_time_limit_s(picks, steps, parse_slurm_time(profile.slurm.time))
    return Proposal(picks, trial_cost(picks, steps, profile.world_size), limit, profile.world_size)


def start(
    project,
    spec_path: Path,
    spec,
    spec_sha256: str,
    loaded,
    proposal: Proposal,
    out: Path,
    steps: int,
    top: int,
    nodes: int | None,
    gpus_per_node: int | None,
    profiles_dir: str | None,
) -> Manifest:
    """Write every trial's plan directory, submit them as one array, record rows and the manifest."""
    if (out / MANIFEST).exists():
        raise OutputError(
            f"{out} already holds trials ({MANIFEST}); see them with `dsorch trial --status {out}`, "
            f"or pass --out NEW_DIR for new ones."
        )
    if out.exists() and any(out.iterdir()):
        raise OutputError(
            f"{out} exists and is not empty; pass --out NEW_DIR (dsorch trial writes a directory of its own)."
        )
    backend_for(loaded.profile.executor).check(dry_run="shows the trials and their cost")
    plans = trial_plans(
        spec, spec_path, spec_sha256, loaded, DEEPSPEED, proposal.picks, out, nodes=nodes, gpus_per_node=gpus_per_node
    )
    try:
        for d, files in plans:
            write_plan_dir(d, files)
        subs = [
            prepare_submission(
                d, loaded.profile.name, None, steps, None, RunDir.default(d).path, profiles_dir, project.root
            )
            for d, _ in plans
        ]
        folder = (project.root / ".dsorch" / "jobs" / f"trial-{out.resolve().name}").resolve()
        records = record_array(
            Registry(project.root), subs, folder, math.ceil(proposal.time_limit_s / 60), proposal.time_limit_s
        )
    except BaseException:
        # Nothing half-written: a refused array leaves no trial directory behind.
        shutil.rmtree(out, ignore_errors=True)
        raise
    manifest = Manifest(
        spec=os.path.relpath(spec_path.resolve(), out.resolve()),
        spec_sha256=spec_sha256,
        cluster=loaded.profile.name,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        world_size=proposal.world_size,
        steps=steps,
        top=top,
        executor=loaded.profile.executor,
        log_dir=str(folder),
        time_limit_s=proposal.time_limit_s,
        trials=[entry_of(i, p, r.job_id) for i, (p, r) in enumerate(zip(proposal.picks, records, strict=True))],
    )
    _write_atomic(
        out / MANIFEST,
        "# Written by `dsorch trial`; `dsorch trial --status/--collect DIR` read it.\n"
        + yaml.safe_dump(manifest.model_dump(mode="json"), sort_keys=False, width=100),
    )
    return manifest


# --------------------------------------------------------------------------------------------
# Status and collection
# --------------------------------------------------------------------------------------------


def states(reg, manifest: Manifest) -> list:
    """Each trial's registry row, refreshed from the scheduler."""
    return [refresh(reg, reg.get(t.job_id)) for t in manifest.trials]


def _logs(manifest: Manifest, job_id: str) -> str:
    parts = []
    backend = backend_for(manifest.executor)
    for rank in range(manifest.world_size):
        for path in backend.log_paths(Path(manifest.log_dir), job_id, rank):
            try:
                parts.append(path.read_text(errors="replace"))
            except OSError:
                pass
    return "\n".join(parts)


@dataclass(frozen=True)
class Collected:
    results: list[TrialResult]
    report: Any  # calibrate.CalibrationReport
    profile_path: Path
    profile_name: str
    plan: Any  # plan.Plan: the re-planned winner
    plan_dir: Path
    measured_winner: TrialResult | None  # the trial of the winner's layout, when it was one


def results_of(trial_dir: Path, manifest: Manifest, records) -> list[TrialResult]:
    out = []
    for t, rec in zip(manifest.trials, records, strict=True):  # one registry row per trial (states)
        log = _logs(manifest, t.job_id) + "\n" + (rec.error or "")
        out.append(measure(t, trial_dir / t.dir, RunDir.default(trial_dir / t.dir).path, rec.state, log))
    return out


PROFILE_HEADER = "# Calibrated by `dsorch"


def write_profile(project, profiles_dir: str | None, name: str, text: str) -> Path:
    """Write a profile dsorch made (``text`` starts with PROFILE_HEADER) into the profiles directory
    in use, else ``profiles/`` of the experiment; never over a profile a person wrote."""
    pdir = Path(profiles_dir) if profiles_dir else project.root / "profiles"
    pdir.mkdir(parents=True, exist_ok=True)
    path = pdir / f"{name}.yaml"
    if path.exists() and not path.read_text(encoding="utf-8").startswith(PROFILE_HEADER):
        raise OutputError(
            f"{path} exists and was not written by dsorch; pass --name NEW_NAME for the measured profile."
        )
    _write_atomic(path, text)
    return path


# plan.yaml's cluster.name pattern (orchestrator/plandir/reader.py PlanCluster).
PROFILE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def collect(
    project, trial_dir: Path, results: list[TrialResult], manifest: Manifest, profiles_dir: str | None, name: str | None
) -> Collected:
    """Calibrate the profile from the finished trials, write it, re-plan, write the winner."""
    ok = [r for r in results if r.failure is None]
    if not ok:
        causes = "; ".join(f"{r.entry.dir}: {r.failure} ({r.state})" for r in results)
        raise JobError(
            f"none of the {len(results)} trials in {trial_dir} finished ({causes}); there is nothing "
            f"to calibrate from. `dsorch logs JOB_ID --rank 0` shows why each ended."
        )
    spec_path = (trial_dir / manifest.spec).resolve()
    spec, loaded_spec = load_spec(spec_path)
    if loaded_spec.sha256 != manifest.spec_sha256:
        raise SpecError(
            f"{spec_path} changed since the trials ran (sha256 differs from {trial_dir / MANIFEST}); "
            f"the measurements are of the old spec. Start new trials."
        )
    original = load_profile(manifest.cluster, profiles_dir)
    ooms = [
        oom_record(trial_dir / r.entry.dir, RunDir.default(trial_dir / r.entry.dir).metrics)
        for r in results
        if r.failure == "oom"
    ]
    calibrated, report = calibrate(
        [RunDir.default(trial_dir / r.entry.dir).path for r in ok], original.profile, memory_only=ooms
    )
    name = name or f"{manifest.cluster}-measured"
    check_profile_name(name)
    text = calibrated_profile_yaml(calibrated, report, name=name)
    shown_dir = _rel(trial_dir, project.root)
    text = text.replace("\n", f"\n# From the trials in {shown_dir} (`dsorch trial --collect {shown_dir}`).\n", 1)
    profile_path = write_profile(project, profiles_dir, name, text)
    pdir = profile_path.parent

    loaded = load_profile(name, pdir)
    out = project.default_plan_dir(spec.name, name, DEEPSPEED, manifest.nodes, manifest.gpus_per_node)
    # What the trials measured overrules the memory model for their own layouts: the calibrated
    # overhead is one constant over every layout, raised to cover the largest shortfall, so it may
    # predict a measured-to-fit layout out (measured on the loopback cluster: a pipeline trial at
    # 0.40 GiB of 0.5 next to TP/ZeRO trials that ran out of memory).
    measured_fit = {
        load_plan_dir(trial_dir / r.entry.dir).layout: r.failure is None for r in results if r.failure in (None, "oom")
    }
    chosen = make_plan(
        PlanRequest(
            spec=spec,
            spec_path=spec_path_in(spec_path, out),
            spec_sha256=loaded_spec.sha256,
            profile=loaded,
            runtime=DEEPSPEED,
            nodes=manifest.nodes,
            gpus_per_node=manifest.gpus_per_node,
            memory_margin_gib=0.0,
            shown_path=str(spec_path),
            measured_fit=measured_fit,
        )
    )
    winner = next((r for r in ok if r.entry.layout == chosen.layout.short()), None)
    evidence = {
        "trials": _rel(trial_dir, out),
        "calibrated_profile": name,
        "steps_per_trial": manifest.steps,
        "warmup_steps_dropped": max(1, manifest.steps // 5),
        "chosen_layout_measured": winner is not None,
        "measured": [_evidence_row(r) for r in results],
    }
    the_plan = dataclasses.replace(chosen, evidence=evidence)
    write_plan_dir(out, checked_files(the_plan))
    collected = Collected(results, report, profile_path, name, the_plan, out, winner)
    _write_atomic(trial_dir / RESULTS, results_yaml(collected, project.root))
    return collected


def check_profile_name(name: str, given_as: str | None = None) -> None:
    """``given_as``: the option the name came from, where not --name (calibrate's --out FILE)."""
    if not PROFILE_NAME.fullmatch(name):
        raise OutputError(
            f"{given_as or '--name'} {name!r}: a profile name is letters, digits, '.', '_' and '-' (it names a file "
            f"and goes into plan.yaml); choose another."
        )


def _rel(p: Path, base: Path) -> str:
    return os.path.relpath(Path(p).resolve(), Path(base).resolve())


def _evidence_row(r: TrialResult) -> dict:
    row = {
        "trial": r.entry.dir,
        "family": r.entry.family,
        "layout": r.entry.layout,
        "predicted_step_s": r.entry.predicted_step_s,
        "predicted_peak_gib": r.entry.predicted_peak_gib,
        "outcome": r.failure or "ok",
    }
    # measure() gives a completed trial all three, a failed one none.
    if r.measured_step_s is not None:
        row["measured_step_s"] = round(r.measured_step_s, 6)
    if r.tokens_per_s is not None:
        row["measured_tokens_per_s"] = round(r.tokens_per_s, 1)
    if r.mfu is not None:
        row["measured_mfu"] = round(r.mfu, 4)
    if r.peak_mem_gib is not None:
        row["measured_peak_gib"] = round(r.peak_mem_gib, 4)
    return row


def results_yaml(c: Collected, root: Path) -> str:
    winner = c.measured_winner
    doc = {
        "trials": [_evidence_row(r) for r in c.results],
        "calibration": c.report.as_dict(),
        "calibrated_profile": _rel(c.profile_path, root),
        "winner": {
            "plan_dir": _rel(c.plan_dir, root),
            "layout": c.plan.layout.short(),
            "predicted_step_s": round(c.plan.chosen.step_time_s, 6),
            "measured_step_s": (
                round(winner.measured_step_s, 6) if winner and winner.measured_step_s is not None else None
            ),
        },
    }
    return (
        "# Written by `dsorch trial --collect`: predicted vs measured per trial, the calibration, the winner.\n"
        + yaml.safe_dump(doc, sort_keys=False, width=100)
    )
