"""From a plan directory to a registered job, and from a registered job to its current state.

The CLI calls these; the job's backend (``orchestrator.run.backends``) talks to its scheduler;
``orchestrator.run.registry`` stores.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import JobError
from orchestrator.plandir.reader import GENERATED, PlanDir, load_plan_dir
from orchestrator.plandir.rundir import RunDir
from orchestrator.run import scheduler
from orchestrator.run.backends import Backend, Relay, backend_for
from orchestrator.run.jobs import TrainingJob
from orchestrator.run.megatron_job import DEFAULT_ITERS, MegatronJob
from orchestrator.run.registry import ACTIVE_STATES, JobRecord, Registry, now_utc
from orchestrator.spec.cluster import ClusterProfile, load_profile
from orchestrator.spec.sbatch import job_name
from orchestrator.train.loop.config import check_trainable
from orchestrator.validate.plan_dir import validate_files


@dataclass(frozen=True)
class Submission:
    spec: scheduler.JobSpec
    plan_dir: Path  # absolute
    plan_display: str
    plan_sha256: str
    cluster: str
    folder: Path  # submitit's folder: pickles and logs
    run_dir: Path
    job: TrainingJob | MegatronJob


def plan_hash(plan_dir: Path) -> str:
    """One digest of a plan directory's generated files, for the registry."""
    h = hashlib.sha256()
    for name in GENERATED:
        p = plan_dir / name
        if p.is_file():
            h.update(name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def prepare_submission(
    plan_dir: Path,
    cluster: str | None,
    nodes: int | None,
    steps: int | None,
    data: str | None,
    run_dir: Path | None,
    profiles_dir: str | None,
    experiment_dir: Path,
    save_interval: int | None = None,
    runs_dir: Path | None = None,
    switch_data: bool = False,
    extend_schedule: bool = False,
) -> Submission:
    """A checked submission of ``plan_dir``. ``data``: a dataset prefix that overrides the plan's
    training.data (None: the plan's); ``switch_data``: resume on other data than the checkpoint's;
    ``save_interval`` None: the plan's checkpoint interval."""
    plan_dir = Path(plan_dir)
    pd = load_plan_dir(plan_dir)  # schema, hashes, consistency: a tampered plan stops here
    planned = pd.doc.cluster
    cluster = cluster or planned.name
    loaded = load_profile(cluster, profiles_dir)  # an unknown name fails here, listing the known ones
    if cluster != planned.name:
        raise JobError(
            f"{plan_dir} was planned for cluster '{planned.name}' ({planned.nodes} x {planned.gpus_per_node}), "
            f"not '{cluster}'; layouts do not carry over between clusters. Re-plan: dsorch plan "
            f"{pd.doc.inputs.model_spec.path or 'SPEC'} --cluster {cluster} --out DIR."
        )
    if nodes is not None and nodes != planned.nodes:
        raise JobError(f"{plan_dir} was planned for {planned.nodes} nodes, not {nodes}; re-plan with --nodes {nodes}.")
    profile = loaded.profile.resized(planned.nodes, planned.gpus_per_node)
    # A plan whose program reads megatron_args.txt runs Megatron-LM from its checkout (MegatronJob).
    megatron = pd.runtime.reads_megatron_args
    if megatron:
        _check_megatron(plan_dir, profile, data, switch_data)
    errors = validate_files(
        pd.texts, dp=pd.layout.dp, world_size=planned.world_size, runtime=pd.runtime, overrides=pd.spec.overrides
    )
    if errors:
        raise JobError(f"{plan_dir} does not validate; fix or regenerate it:\n  " + "\n  ".join(errors))
    if pd.runtime.bundled_trainer:
        check_trainable(pd)  # what the entrypoint refuses (dropout, vpp > 1) fails here, before queueing
    from orchestrator.train.loop.lr_schedule import steps_past_plan

    problem = steps_past_plan(pd.spec.training, plan_dir, steps, extend_schedule)
    if problem:  # the entrypoint refuses it too; here it fails before queueing
        raise JobError(problem.replace("add --extend-schedule", "submit with --extend-schedule"))
    if data is not None and not (Path(data).exists() or Path(f"{data}.bin").exists()):
        raise JobError(
            f"--data {data}: no such dataset (NAME.bin with NAME.idx or NAME.json); make one with "
            f"`dsorch data prepare` or `python -m orchestrator.train.data.token_file`."
        )
    spec = scheduler.JobSpec.of(profile, job_name(pd.spec.name), per_node=pd.runtime.launch_per_node)
    plan_abs = plan_dir.resolve()
    folder = (experiment_dir / ".dsorch" / "jobs" / plan_abs.name).resolve()
    for p in (plan_abs, folder):
        if "\n" in str(p) or "\r" in str(p):
            raise JobError(f"{p!r}: a path with a line break cannot go into an sbatch script; rename it.")
    run = run_dir or (runs_dir or experiment_dir / "runs") / f"{plan_abs.name}-{{key}}"
    job: TrainingJob | MegatronJob = TrainingJob(
        str(plan_abs),
        str(run),
        steps,
        _data_path(data),
        spec.use_gpus,
        pd.checkpoint_interval if save_interval is None else save_interval,
        switch_data=switch_data,
        extend_schedule=extend_schedule,
    )
    if megatron:
        job = megatron_job(pd, str(plan_abs), str(run), steps, save_interval, extend_schedule)
    return Submission(
        spec, plan_abs, _display(plan_dir, experiment_dir), plan_hash(plan_abs), cluster, folder, Path(str(run)), job
    )


def _check_megatron(plan_dir: Path, profile: ClusterProfile, data: str | None, switch_data: bool) -> None:
    """What a Megatron-LM plan's job needs before it is queued: the checkout launch.sh runs
    pretrain_gpt.py from ($MEGATRON_LM: the profile's slurm.env, which launch.sh exports, else the
    submitting shell's, which the job inherits), and no --data (its data is megatron_args.txt's)."""
    if data is not None or switch_data:
        raise JobError(
            f"{plan_dir} runs Megatron-LM, which trains on the --data-path (or --mock-data) in its "
            f"megatron_args.txt; --data and --switch-data are for the bundled entrypoint. Set training.data "
            f"in the spec and re-plan."
        )
    where = profile.slurm.env.get("MEGATRON_LM") or os.environ.get("MEGATRON_LM")
    if not where:
        raise JobError(
            f"{plan_dir} runs Megatron-LM's pretrain_gpt.py, and neither the profile '{profile.name}' "
            f"(slurm.env.MEGATRON_LM) nor this shell ($MEGATRON_LM) names a Megatron-LM checkout. Add "
            f"`slurm: {{env: {{MEGATRON_LM: /path/to/Megatron-LM}}}}` to the profile and re-plan, or export "
            f"MEGATRON_LM=/path/to/Megatron-LM before `dsorch submit`."
        )
    # On this machine the path can be checked; on a cluster it is the compute nodes' (or a container's).
    if backend_for(profile.executor).runs_here and not (Path(where) / "pretrain_gpt.py").is_file():
        raise JobError(
            f"MEGATRON_LM={where}: no pretrain_gpt.py there; point it at a Megatron-LM checkout "
            f"(git clone https://github.com/NVIDIA/Megatron-LM)."
        )


def megatron_job(
    pd: PlanDir, plan_dir: str, run_dir: str, steps: int | None, save_interval: int | None, extend_schedule: bool
) -> MegatronJob:
    """The node-side job of a Megatron-LM plan. With --steps short of the plan's length (or past it
    without --extend-schedule, which steps_past_plan refused already) the learning rate keeps the
    plan's schedule; a plan that names its own --log-interval keeps it, else every iteration is
    logged (the records status, trial and calibrate read come from those lines)."""
    planned = pd.spec.training.train_steps
    iters = steps or planned or DEFAULT_ITERS
    keep_schedule = planned is not None and iters != planned and not extend_schedule
    own_interval = "--log-interval" in pd.texts.get("megatron_args.txt", "").split()
    return MegatronJob(
        plan_dir,
        run_dir,
        iters,
        lr_decay_iters=planned if keep_schedule else None,
        save_interval=save_interval or 0,  # None or 0: megatron_args.txt's own --save-interval
        log_interval=None if own_interval else 1,
    )


def _data_path(data: str | None) -> str | None:
    return None if data is None else str(Path(data).resolve())


def _display(p: Path, base: Path) -> str:
    try:
        return str(p.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(p.resolve())


def _refresh_active(reg: Registry, plans: list[str]) -> None:
    """Ask the scheduler about the plans' jobs the registry still holds as active: a row is only
    updated when someone runs `dsorch status`, so a job that failed since would otherwise refuse
    the `submit --resume` that continues it ("already has a job pending or running: N (PENDING)",
    met by scripts/bench_chaos.py after a killed rank)."""
    for rec in reg.all():
        if rec.plan_dir in plans and rec.active:
            refresh(reg, rec)


def _new_row(sub: Submission, executor: str, **values) -> dict:
    """The registry row of ``sub`` before the scheduler took it ("pending"); ``values`` add to it."""
    return {
        "job_id": "pending",
        "executor": executor,
        "cluster": sub.cluster,
        "plan_dir": sub.plan_display,
        "plan_sha256": sub.plan_sha256,
        "submitted_at": now_utc(),
        "state": "SUBMITTED",
        "run_dir": "",
        "log_dir": str(sub.folder),
        "data": sub.job.data,
        **values,
    }


def record_submission(reg: Registry, sub: Submission, force: bool, backend: Backend | None = None) -> JobRecord:
    """``sub`` submitted through ``backend`` (default: its executor's) with its registry row, in one
    transaction; a job that went through a login node keeps its login section in the row."""
    backend = backend or backend_for(sub.spec)
    _refresh_active(reg, [sub.plan_display])
    via = sub.spec.remote
    with reg.reserve(sub.plan_display, force) as (insert, update):
        # The run directory is named after dsorch's own key, known only once the row exists; the
        # row and the submission are one transaction, so a refused submission leaves no row.
        key = insert(**_new_row(sub, backend.executor, login=None if via is None else via.login.model_dump_json()))
        run_dir = Path(str(sub.run_dir).replace("{key}", str(key))).resolve()
        job = dataclasses.replace(sub.job, run_dir=str(run_dir))
        with _no_leftovers(sub.folder):
            job_id = backend.submit(sub.spec, sub.folder, job)
        update(key, job_id=job_id, state="PENDING" if backend.queues else "RUNNING", run_dir=str(run_dir))
    return reg.get(str(key))


def record_array(
    reg: Registry, subs: list[Submission], folder: Path, time_min: int, timeout_s: float
) -> list[JobRecord]:
    """``subs`` (plan directories of one cluster) as one job array of ``time_min`` minutes per
    element, one registry row each, in one transaction with the array's submission (as
    record_submission): refused while any of the plans has an active job."""
    first = subs[0]
    megatron = [sub.plan_display for sub in subs if not isinstance(sub.job, TrainingJob)]
    if megatron:  # LocalArray runs the entrypoint's ranks; a Megatron-LM node job is not one
        raise JobError(f"{', '.join(megatron)}: job arrays (trials) run the bundled entrypoint's plans only.")
    spec = dataclasses.replace(first.spec, time_min=time_min)
    backend = backend_for(spec)
    _refresh_active(reg, [sub.plan_display for sub in subs])
    with reg.reserve([sub.plan_display for sub in subs], force=False) as (insert, update):
        keys, jobs = [], []
        for sub in subs:
            assert isinstance(sub.job, TrainingJob)  # checked above
            run_dir = str(sub.run_dir.resolve())
            key = insert(**_new_row(sub, backend.executor, run_dir=run_dir, log_dir=str(folder)))
            keys.append(key)
            jobs.append(dataclasses.replace(sub.job, run_dir=run_dir, save=False))
        with _no_leftovers(folder):
            ids = backend.submit_array(spec, folder, jobs, timeout_s)
        for key, job_id in zip(keys, ids, strict=True):  # submit_array: one id per job
            update(key, job_id=job_id, state="PENDING")
    return [reg.get(str(k)) for k in keys]


def remote_args(
    cluster: str, local_only: dict[str, object], steps: int | None, extend_schedule: bool, save_interval: int
) -> list[str]:
    """The login node's `dsorch submit` options for this one's; refused: those that name files or
    runs on this machine (``local_only``, flag -> value)."""
    named = [flag for flag, value in local_only.items() if value]
    if named:
        raise JobError(
            f"{', '.join(named)}: not over SSH yet (profile {cluster} has a login section, so the job is "
            f"submitted on the login node); run `dsorch submit` there for these."
        )
    args = ["--steps", str(steps)] if steps else []
    args += ["--extend-schedule"] if extend_schedule else []
    return args + (["--save-interval", str(save_interval)] if save_interval else [])


def _remote_plan(sub: Submission) -> str:
    """Where the plan directory goes under login.remote_dir: where it is in the experiment directory."""
    return sub.plan_display if not Path(sub.plan_display).is_absolute() else f"plans/{sub.plan_dir.name}"


def relay_of(sub: Submission, experiment_dir: Path, profiles_dir: str | None, args: list[str], force: bool) -> Relay:
    """What the login node's dsorch needs to take ``sub`` on (a backend that relays): the plan
    directory where it is in the experiment directory, the profiles directory, ``args`` (remote_args)."""
    return Relay(
        experiment_dir=experiment_dir, remote_plan=_remote_plan(sub), profiles_dir=profiles_dir, args=tuple(args),
        force=force,
    )  # fmt: skip


@contextlib.contextmanager
def _no_leftovers(folder: Path):
    """A refused submission leaves no submitit files behind. Runs under the registry's write lock:
    the folder is shared by every submission of a plan, and a snapshot taken before the lock would
    count a concurrent winner's files as ours and delete them (its job then fails to start)."""
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    before = set(folder.iterdir())
    try:
        yield
    except BaseException:
        for p in set(folder.iterdir()) - before:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def _progress(run_dir: Path, finished: bool = False) -> tuple[int | None, float | None, int, float | None]:
    """(last step, last loss, requeues, elapsed seconds) from the run directory's files; a
    finished job's elapsed time ends at its last metrics record, not at the time of asking."""
    step = loss = None
    requeues = 0
    elapsed = None
    metrics = RunDir(run_dir).metrics
    if metrics.exists():
        from orchestrator.calibrate.records import last_records

        last, _ = last_records(metrics)
        if last is not None:
            step, loss = last.get("step"), last.get("loss")
    starts = RunDir(run_dir).starts
    if starts.exists():
        lines = [json.loads(x) for x in starts.read_text().splitlines() if x.strip()]
        if lines:
            requeues = max(len(lines) - 1, max(int(x.get("restart", 0)) for x in lines))
            end = metrics.stat().st_mtime if finished and metrics.exists() else time.time()
            elapsed = max(0.0, end - float(lines[0]["time"]))
    return step, loss, requeues, elapsed


def latest_eval(run_dir: Path) -> dict | None:
    """The newest evaluation record of a run (train/loop/metrics.py record_eval), None before the first."""
    metrics = RunDir(run_dir).metrics
    if not metrics.is_file():
        return None
    from orchestrator.calibrate.records import last_records

    return last_records(metrics)[1]


def eval_text(rec: dict | None) -> str:
    """An evaluation record as `status` and `logs` show it: loss (perplexity) @ step."""
    if rec is None:
        return ""
    return f"{rec['eval_loss']:.4f} ({rec['eval_ppl']:.4g}) @ {rec['step']}"


def refresh(reg: Registry, rec: JobRecord) -> JobRecord:
    """Ask the scheduler for an active job's state, read its progress, store and return it."""
    if not rec.active or rec.job_id == "pending":
        return rec
    try:
        backend = backend_for(rec)
    except JobError as e:  # a damaged executor column: said on the row, not a failing `dsorch status`
        reg.update(rec.key, state="UNKNOWN", error=str(e))
        return reg.get(str(rec.key))
    # The scheduler's view first: a remote job's run directory comes back once it ended, and what
    # the scheduler knows (a remote job: the login node's whole row) wins over the run directory.
    seen = backend.seen(rec)
    step, loss, requeues, elapsed = _progress(Path(rec.run_dir), finished=seen["state"] not in ACTIVE_STATES)
    values: dict[str, object] = dict(last_step=step, last_loss=loss, requeues=requeues)
    if elapsed is not None:
        values["elapsed_s"] = elapsed
    reg.update(rec.key, **{**values, **seen})
    return reg.get(str(rec.key))
