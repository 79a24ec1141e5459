"""The SLURM backend: submitit's ``SlurmExecutor`` on a login node. sbatch queues the job, srun
starts its tasks, sacct reports its state, scancel stops it; a profile's ``container`` runs each
task in its image while the batch script stays on the host (spec/container.py)."""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import submitit

from orchestrator.errors import JobError
from orchestrator.plandir.rundir import RunDir
from orchestrator.ports import slurm_master_port_lines
from orchestrator.resources import templates_dir
from orchestrator.run.backends.base import SubmititBackend, refused
from orchestrator.run.jobs import HOST_MASTER_ADDR, DoctorJob, TrainingJob, state_from_result
from orchestrator.run.scheduler import JobSpec, NodeJob
from orchestrator.spec.container import bind_list, container_argv, env_exports, python_command
from orchestrator.spec.sbatch import sbatch_parameters

# What submitting needs: sbatch queues, srun starts the tasks inside the job (submitit checks for
# it), sacct reports states afterwards.
SUBMIT_TOOLS = ("sbatch", "srun")


class SlurmBackend(SubmititBackend):
    executor = "slurm"
    queues = True
    has_script = True
    runs_here = False

    def check(self, dry_run: str | None = None) -> None:
        missing = [t for t in SUBMIT_TOOLS if shutil.which(t) is None]
        if missing:
            raise JobError(
                f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on PATH, so there is "
                f"no SLURM cluster to submit to from here. Run dsorch on a SLURM login node (or put SLURM's "
                f"client tools on PATH)"
                + (f"; `--dry-run` {dry_run} without SLURM" if dry_run else "")
                + ", and `--cluster local` runs on this machine."
            )

    def rank_setup(self, spec: JobSpec, jobs: Sequence[object]) -> list[str]:
        # One master port per allocation, which the batch script derives from the job id (ports.py).
        return spec.setup_lines() + slurm_master_port_lines()

    def executor_for(
        self, spec: JobSpec, folder: Path, jobs: Sequence[object], script_only: bool = False
    ) -> submitit.SlurmExecutor:
        """submitit's executor for the job, which pickles it and writes the script ``script`` shows.
        ``jobs`` name the directories a container must see."""
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
            setup=self.rank_setup(spec, jobs) + container.pop("setup", []),
            additional_parameters=dict(sbatch.extra),
            **dict(sbatch.options),
            **container,
        )
        if spec.use_gpus:
            params["gpus_per_node"] = spec.gpus_per_node
        ex.update_parameters(**params)
        return ex

    def script(self, spec: JobSpec, folder: Path, job: NodeJob | None) -> str:
        """The sbatch script submitit would submit, byte for byte: the same executor parameters and
        the same (quoted) command line; needs no SLURM installed."""
        ex = self.executor_for(spec, folder, [job] if job is not None else [], script_only=True)
        return ex._make_submission_file_text(ex._submitit_command_str, "DRY_RUN")

    def submit(self, spec: JobSpec, folder: Path, job: NodeJob) -> str:
        if spec.container is not None and isinstance(job, TrainingJob):
            job = dataclasses.replace(job, host_requeue=True)
        ex = self.executor_for(spec, folder, [job])
        try:
            return str(ex.submit(job).job_id)
        except Exception as e:
            raise refused("the job", e) from e

    def submit_array(self, spec: JobSpec, folder: Path, jobs: list[TrainingJob], timeout_s: float) -> list[str]:
        # One element at a time (--array=0-N%1): a measurement must not share nodes with its siblings.
        # The time limit is the spec's, which the caller sets to timeout_s.
        ex = self.executor_for(spec, folder, jobs)
        try:
            ex.update_parameters(array_parallelism=1)
            with ex.batch():
                submitted = [ex.submit(j) for j in jobs]
        except Exception as e:
            raise refused("the job array", e) from e
        return [str(j.job_id) for j in submitted]

    def blind(self) -> str | None:
        return "sacct is not on PATH here" if shutil.which("sacct") is None else None

    def state(self, folder: Path, job_id: str, last_known: str) -> tuple[str, str | None]:
        result, error = self.outcome(folder, job_id)
        if self.blind():
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

    def cancel(self, job_id: str) -> None:
        if shutil.which("scancel") is None:
            raise JobError(
                f"cancelling SLURM job {job_id} needs scancel, which is not on PATH here; run `dsorch cancel "
                f"{job_id}` (or `scancel {job_id}`) on the cluster's login node."
            )
        r = subprocess.run(["scancel", job_id], capture_output=True, text=True)
        if r.returncode != 0:
            raise JobError(f"scancel {job_id} failed: {r.stderr.strip()}")


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
    env in, and requeues when rank 0 left RunDir.requeue_request (TrainingJob.host_requeue)."""
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
        marker = shlex.quote(str(RunDir(Path(job.run_dir)).requeue_request))
        setup.append(f"rm -f {marker}")
        teardown = [f'if [[ -f {marker} ]]; then rm -f {marker}; scontrol requeue "$SLURM_JOB_ID"; fi']
    srun, _ = container_argv(c, spec.use_gpus, binds, lambda w: w)  # submitit quotes srun_args
    params: dict = {"setup": setup, "teardown": teardown}
    if srun:
        params["srun_args"] = srun
    return python_command(c, spec.use_gpus, binds), params
