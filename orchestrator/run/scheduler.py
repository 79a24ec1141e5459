"""The one seam to submitit and SLURM on the login side: executors, submission (one job or a job
array), job states, logs and cancellation.

A job is submitit's: ``SlurmExecutor`` on a cluster, ``LocalExecutor`` for ``--cluster local``.
What each task runs on the nodes is in run/jobs.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import submitit
from submitit.core.core import PicklingExecutor
from submitit.core.utils import JobPaths

from orchestrator.errors import JobError
from orchestrator.ports import local_master_port, slurm_master_port_lines
from orchestrator.resources import templates_dir
from orchestrator.run.jobs import (
    HOST_MASTER_ADDR,
    REQUEUE_REQUEST,
    DoctorJob,
    LocalArray,
    TrainingJob,
    state_from_result,
)
from orchestrator.run.megatron_job import MegatronJob
from orchestrator.run.procs import descendants
from orchestrator.spec.cluster import ClusterProfile, SlurmSpec
from orchestrator.spec.container import ContainerSpec, bind_list, container_argv, env_exports, python_command
from orchestrator.spec.sbatch import parse_slurm_time, rank_env, sbatch_parameters

# --------------------------------------------------------------------------------------------
# Executors
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class JobSpec:
    """Everything a submission needs, resolved from a profile (``JobSpec.of``): one task per GPU on
    every node, the profile's own SLURM settings as they are in ``slurm``."""

    kind: str  # "slurm" | "local": the profile's executor
    name: str
    nodes: int
    tasks_per_node: int
    use_gpus: bool
    gpus_per_node: int  # = tasks_per_node, unless one task starts the node's ranks (per_node)
    time_min: int  # slurm.time, unless the job sets its own (a trial, the doctor)
    env: tuple[tuple[str, str], ...]  # every rank's environment: spec/sbatch.py rank_env
    slurm: SlurmSpec
    container: ContainerSpec | None = None

    @classmethod
    def of(cls, profile: ClusterProfile, name: str, time_min: int | None = None, per_node: bool = False) -> JobSpec:
        """The job for a profile; ``time_min`` overrides its time limit. ``per_node``: one task per
        node that starts the node's ranks itself (a Megatron-LM job's launch.sh and torchrun), with
        all of the node's GPUs and CPUs, as job.sbatch's megatron branch asks for them."""
        return cls(
            kind=profile.executor,
            name=name,
            nodes=profile.nodes,
            tasks_per_node=1 if per_node else profile.gpus_per_node,
            use_gpus=profile.backend == "nccl",
            gpus_per_node=profile.gpus_per_node,
            time_min=time_min if time_min is not None else parse_slurm_time(profile.slurm.time),
            env=tuple(rank_env(profile).items()),
            slurm=profile.slurm,
            container=profile.container,
        )


def _setup_lines(spec: JobSpec) -> list[str]:
    lines = list(spec.slurm.setup)
    lines += [f"export {k}={shlex.quote(v)}" for k, v in spec.env]
    return lines


def _script_only_executor(folder: Path, python: str | None = None) -> submitit.SlurmExecutor:
    """submitit's SlurmExecutor for writing the sbatch script where SLURM is not installed (a laptop
    running ``submit --dry-run``): its constructor refuses when ``srun`` is not on PATH
    (``SlurmExecutor.affinity``), although rendering the script needs no SLURM at all. The script
    comes from the same ``_make_submission_file_text`` the real submission uses."""

    class ScriptOnlySlurmExecutor(submitit.SlurmExecutor):
        @classmethod
        def affinity(cls) -> int:
            return 2

    return ScriptOnlySlurmExecutor(folder=str(folder), max_num_timeout=3, python=python)


def _container_dirs(folder: Path, jobs: Sequence[object]) -> list[str]:
    """What a containerised task must see at its own path: submitit's folder (the pickles and logs)
    and each job's plan, run and data directories, or the doctor's output."""
    dirs = [str(folder)]
    for job in jobs:
        if isinstance(job, TrainingJob):
            dirs += [job.plan_dir, job.run_dir]
            if job.data is not None:
                dirs.append(str(Path(job.data).parent))
        elif isinstance(job, DoctorJob):
            dirs.append(str(Path(job.out).parent))
    return list(dict.fromkeys(dirs))


def _container_parameters(spec: JobSpec, folder: Path, jobs: Sequence[object]) -> tuple[str | None, dict]:
    """(submitit's ``python``, executor parameters) that run each task in the profile's container.
    The batch script stays on the host (spec/container.py): it makes the bound directories, passes
    env in, and requeues when rank 0 left REQUEUE_REQUEST (TrainingJob.host_requeue)."""
    c = spec.container
    if c is None:
        return None, {}
    dirs = _container_dirs(folder, jobs)
    bad = [d for d in dirs if "," in d or ":" in d]
    if bad:
        raise JobError(
            f"{bad[0]} has a ',' or ':', which container mount lists read as separators; the container "
            f"needs it bound at the same path. Move it (or the experiment directory) to a path without them."
        )
    binds = bind_list(c, dirs)
    setup = [f"mkdir -p {' '.join(shlex.quote(d) for d in dirs)}", *env_exports(c)]
    # The first node's address, found here with scontrol as job.sbatch finds it (one shell source).
    setup += [ln for ln in (templates_dir() / "master_addr.sh.j2").read_text().splitlines() if not ln.startswith("#")]
    setup.append(f'export {HOST_MASTER_ADDR}="$MASTER_ADDR"')
    teardown: list[str] = []
    job = jobs[0] if len(jobs) == 1 else None  # a job array (trials) saves nothing and is not requeued
    if isinstance(job, TrainingJob) and job.save:
        marker = shlex.quote(str(Path(job.run_dir) / REQUEUE_REQUEST))
        setup.append(f"rm -f {marker}")
        teardown = [f'if [[ -f {marker} ]]; then rm -f {marker}; scontrol requeue "$SLURM_JOB_ID"; fi']
    srun, _ = container_argv(c, spec.use_gpus, binds, lambda w: w)  # submitit quotes srun_args
    params: dict = {"setup": setup, "teardown": teardown}
    if srun:
        params["srun_args"] = srun
    return python_command(c, spec.use_gpus, binds), params


def make_executor(
    spec: JobSpec, folder: Path, script_only: bool = False, jobs: Sequence[object] = ()
) -> PicklingExecutor:
    """submitit's executor for the job; both kinds pickle the job and write the script sbatch_script
    shows (``PicklingExecutor``). ``jobs`` name the directories a container must see; a local job
    takes one master port for each (one per LocalArray element)."""
    if spec.kind == "local":
        local = submitit.LocalExecutor(folder=str(folder))
        local.update_parameters(
            tasks_per_node=spec.tasks_per_node,
            nodes=1,
            timeout_min=spec.time_min,
            gpus_per_node=spec.gpus_per_node if spec.use_gpus else 0,
            # A free port outside the ephemeral range rather than submitit's (orchestrator/ports.py says why).
            setup=[*_setup_lines(spec), f"export MASTER_PORT={local_master_port(max(1, len(jobs)))}"],
        )
        return local
    python, container = _container_parameters(spec, folder, jobs)
    ex = (
        _script_only_executor(folder, python)
        if script_only
        else submitit.SlurmExecutor(folder=str(folder), max_num_timeout=3, python=python)
    )
    sbatch = sbatch_parameters(spec.slurm)
    # The profile's options that submitit has a keyword for go in as keywords; slurm.extra goes in as
    # additional_parameters, which _make_sbatch_string (submitit/slurm/slurm.py) writes as given.
    params = dict(
        job_name=spec.name,
        nodes=spec.nodes,
        ntasks_per_node=spec.tasks_per_node,
        cpus_per_task=spec.slurm.cpus_per_task * spec.gpus_per_node // spec.tasks_per_node,
        time=spec.time_min,
        signal_delay_s=spec.slurm.signal_delay_s,
        setup=_setup_lines(spec) + slurm_master_port_lines() + container.pop("setup", []),
        additional_parameters=dict(sbatch.extra),
        **dict(sbatch.options),
        **container,
    )
    if spec.use_gpus:
        params["gpus_per_node"] = spec.gpus_per_node
    ex.update_parameters(**params)
    return ex


def sbatch_script(spec: JobSpec, folder: Path, job: object = None) -> str:
    """The sbatch script submitit would submit for this job (for --dry-run), byte for byte: the
    same executor parameters and the same (quoted) command line; needs no SLURM installed."""
    ex = make_executor(spec, folder, script_only=True, jobs=[job] if job is not None else [])
    return ex._make_submission_file_text(ex._submitit_command_str, "DRY_RUN")


# What submitting needs: sbatch queues, srun starts the tasks inside the job (submitit checks for
# it), sacct reports states afterwards.
SUBMIT_TOOLS = ("sbatch", "srun")


def check_scheduler(kind: str, dry_run: str | None = None) -> None:
    """Refuse to submit without SLURM's client tools; ``dry_run`` says what the command's --dry-run
    does instead, where it has one."""
    if kind != "slurm":
        return
    missing = [t for t in SUBMIT_TOOLS if shutil.which(t) is None]
    if missing:
        raise JobError(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on PATH, so there is "
            f"no SLURM cluster to submit to from here. Run dsorch on a SLURM login node (or put SLURM's "
            f"client tools on PATH)"
            + (f"; `--dry-run` {dry_run} without SLURM" if dry_run else "")
            + ", and `--cluster local` runs on this machine."
        )


# --------------------------------------------------------------------------------------------
# Submission
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _detached_stdio(detach: bool):
    """For the local executor: submitit starts its controller as a child that inherits this
    process's stdout and stderr, so `dsorch submit ... | tee log` (or a test capturing the output)
    would wait for the whole job before the pipe closes. The controller writes its own logs into
    the job folder; it gets /dev/null instead."""
    if not detach:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def submit(spec: JobSpec, folder: Path, job: TrainingJob | MegatronJob | DoctorJob) -> str:
    """Queue ``job``, which every task runs; returns its job id."""
    if spec.container is not None and isinstance(job, TrainingJob):
        job = dataclasses.replace(job, host_requeue=True)
    ex = make_executor(spec, folder, jobs=[job])
    try:
        with _detached_stdio(spec.kind == "local"):
            submitted = ex.submit(job)
    except Exception as e:  # submitit raises FailedJobError / subprocess errors with sbatch's stderr
        raise JobError(f"the scheduler refused the job: {' '.join(str(e).split())[:2000]}") from e
    if spec.kind == "local":
        # The local controller outlives this process; do not let submitit cancel it at exit.
        submitted._cancel_at_deletion = False
    return str(submitted.job_id)


def submit_array(spec: JobSpec, folder: Path, jobs: list[TrainingJob], timeout_s: float) -> list[str]:
    """``jobs`` as one job array; returns the element ids ("JOB_i"). On SLURM one element runs at a
    time (``--array=0-N%1``): each element is planned for the whole allocation and a measurement
    must not share nodes with its siblings. The local executor has no arrays (LocalArray)."""
    ex = make_executor(spec, folder, jobs=jobs)
    try:
        with _detached_stdio(spec.kind == "local"):
            if spec.kind == "local":
                job = ex.submit(LocalArray(list(jobs), timeout_s))
                job._cancel_at_deletion = False  # the controller outlives this process
                return [f"{job.job_id}_{i}" for i in range(len(jobs))]
            ex.update_parameters(array_parallelism=1)
            with ex.batch():
                submitted = [ex.submit(j) for j in jobs]
    except Exception as e:  # as in submit()
        raise JobError(f"the scheduler refused the job array: {' '.join(str(e).split())[:2000]}") from e
    return [str(j.job_id) for j in submitted]


# --------------------------------------------------------------------------------------------
# States, logs, cancellation
# --------------------------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not running (the controller's parent, dsorch, may have exited without reaping).
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _result(folder: Path, job_id: str, task: int = 0) -> tuple[str, object] | None:
    path = JobPaths(folder, job_id=job_id, task_id=task).result_pickle
    if not path.exists():
        return None
    try:
        with open(path, "rb") as fh:
            return pickle.load(fh)
    except Exception:  # a half-written pickle: treat as not yet there
        return None


def _first_failure(folder: Path, job_id: str) -> str | None:
    """The error that explains a failed job: the rank that was killed or exited first in its own
    words, rather than its peers' "connection reset" that task 0 reports when another rank dies."""
    errors = []
    for task in range(4096):
        result = _result(folder, job_id, task)
        if result is None:
            if task > 0 and not any(folder.glob(f"{job_id}_{task}_*")):
                break
            continue
        if result[0] == "error":
            errors.append(str(result[1]))
    if not errors:
        return None
    killed = [e for e in errors if "was killed by" in e]
    return (killed or errors)[0]


def job_state(kind: str, folder: Path, job_id: str, last_known: str) -> tuple[str, str | None]:
    """(state, error text) of a job, in SLURM's state names."""
    result = _result(folder, job_id)
    error = _first_failure(folder, job_id) if result is not None and result[0] == "error" else None
    if kind == "local":
        return _local_state(folder, job_id, last_known, result, error)
    if shutil.which("sacct") is None:
        # No SLURM client here (e.g. a laptop with a copy of the experiment directory): the last
        # state seen stays; `dsorch status` says so.
        return (state_from_result(result) if result is not None else last_known), error
    job: submitit.SlurmJob[object] = submitit.SlurmJob(folder=str(folder), job_id=job_id)
    try:
        state = job.get_info(mode="force").get("State", "UNKNOWN") or "UNKNOWN"
    except Exception:
        state = "UNKNOWN"
    state = state.split()[0].rstrip("+")  # "CANCELLED by 0" -> CANCELLED
    if state == "UNKNOWN":
        if result is not None:
            state = state_from_result(result)
        elif last_known in ("SUBMITTED", "PENDING", "RUNNING", "REQUEUED"):
            # sacct learns of a job a few seconds after sbatch returns: keep the last known state.
            state = last_known
    return state, error


def _local_state(
    folder: Path, job_id: str, last_known: str, result: tuple[str, object] | None, error: str | None
) -> tuple[str, str | None]:
    """job_state of a job of the local executor, which has no sacct: its result file, else whether
    its controller process is alive."""
    if last_known == "CANCELLED":
        return "CANCELLED", error
    pid, element = _local_id(job_id)
    if pid is None:
        return "UNKNOWN", f"job id {job_id!r} is not a local process id; the registry row is damaged"
    if result is not None:
        return state_from_result(result), error
    if _pid_alive(pid):
        if element is not None and not log_paths(folder, job_id, 0)[0].exists():
            return "PENDING", None  # an earlier element of its LocalArray still runs
        return "RUNNING", error
    return "FAILED", "the local job ended without a result (killed?)"


def _local_id(job_id: str) -> tuple[int | None, int | None]:
    """(controller pid, element) of a local job id: "PID", or "PID_i" for a LocalArray element."""
    pid, sep, element = job_id.partition("_")
    if not pid.isdigit() or (sep and not element.isdigit()):
        return None, None
    return int(pid), int(element) if sep else None


def cancel(kind: str, job_id: str) -> None:
    if kind == "local":
        pid, _ = _local_id(job_id)
        if pid is None:
            raise JobError(
                f"job id {job_id!r} is not a local process id; the registry row is damaged, nothing to cancel."
            )
        # As scancel does, every process of the job gets SIGTERM: the ranks checkpoint at the next
        # step and exit (orchestrator/train/stop.py). The job id is the pid of the shell submitit
        # starts its controller under (`sh -c "SETUP && python -m submitit.local._local ..."`,
        # submitit/local/local.py start_controller), which passes no signal on; the controller,
        # signalled alone (SIGINT, as LocalJob.cancel does), would kill its tasks and orphan their
        # ranks, which train on. An element of a LocalArray has no process of its own: the whole
        # array stops.
        for target in (*descendants(pid), pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, signal.SIGTERM)
        return
    if shutil.which("scancel") is None:
        raise JobError(
            f"cancelling SLURM job {job_id} needs scancel, which is not on PATH here; run `dsorch cancel "
            f"{job_id}` (or `scancel {job_id}`) on the cluster's login node."
        )
    r = subprocess.run(["scancel", job_id], capture_output=True, text=True)
    if r.returncode != 0:
        raise JobError(f"scancel {job_id} failed: {r.stderr.strip()}")


def log_paths(folder: Path, job_id: str, rank: int) -> tuple[Path, Path]:
    p = JobPaths(folder, job_id=job_id, task_id=rank)
    return p.stdout, p.stderr
