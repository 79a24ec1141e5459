"""The local backend: submitit's ``LocalExecutor``, every rank a process on this machine (the
shipped ``local`` profile). There is no queue and no sacct: a job's state is its result file, else
whether its controller process lives; its id is the controller shell's pid, "PID_i" for an element
of a ``LocalArray`` (run/jobs.py), the job array this executor lacks."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import submitit

from orchestrator.errors import JobError
from orchestrator.ports import local_master_port
from orchestrator.run.backends.base import SubmititBackend, refused
from orchestrator.run.jobs import LocalArray, TrainingJob, state_from_result
from orchestrator.run.procs import descendants
from orchestrator.run.scheduler import JobSpec, NodeJob


class LocalBackend(SubmititBackend):
    executor = "local"
    queues = False
    has_script = False
    runs_here = True

    def check(self, dry_run: str | None = None) -> None:
        """This machine is always there."""

    def rank_setup(self, spec: JobSpec, jobs: Sequence[object]) -> list[str]:
        # A free port outside the ephemeral range rather than submitit's (orchestrator/ports.py says
        # why); one for each job, as every LocalArray element takes its own.
        return [*spec.setup_lines(), f"export MASTER_PORT={local_master_port(max(1, len(jobs)))}"]

    def executor_for(self, spec: JobSpec, folder: Path, jobs: Sequence[object]) -> submitit.LocalExecutor:
        """submitit's executor for the job: one node, a task per rank."""
        local = submitit.LocalExecutor(folder=str(folder))
        local.update_parameters(
            tasks_per_node=spec.tasks_per_node,
            nodes=1,
            timeout_min=spec.time_min,
            gpus_per_node=spec.gpus_per_node if spec.use_gpus else 0,
            setup=self.rank_setup(spec, jobs),
        )
        return local

    def script(self, spec: JobSpec, folder: Path, job: NodeJob) -> str:
        what = f"{spec.tasks_per_node} processes"
        if spec.tasks_per_node != spec.gpus_per_node:  # a Megatron-LM plan: launch.sh starts torchrun
            what = f"`{' '.join(job.command())}` (torchrun: {spec.gpus_per_node} ranks)"
        return f"# --cluster local: {what} on this machine through submitit's LocalExecutor (no sbatch script).\n"

    def submit(self, spec: JobSpec, folder: Path, job: NodeJob) -> str:
        ex = self.executor_for(spec, folder, [job])
        try:
            with _detached_stdio():
                submitted = ex.submit(job)
        except Exception as e:
            raise refused("the job", e) from e
        # The local controller outlives this process; do not let submitit cancel it at exit.
        submitted._cancel_at_deletion = False
        return str(submitted.job_id)

    def submit_array(self, spec: JobSpec, folder: Path, jobs: list[TrainingJob], timeout_s: float) -> list[str]:
        # submitit's LocalExecutor starts every job of a batch at once; one LocalArray runs them in turn.
        ex = self.executor_for(spec, folder, jobs)
        try:
            with _detached_stdio():
                job = ex.submit(LocalArray(list(jobs), timeout_s))
        except Exception as e:
            raise refused("the job array", e) from e
        job._cancel_at_deletion = False  # the controller outlives this process
        return [f"{job.job_id}_{i}" for i in range(len(jobs))]

    def state(self, folder: Path, job_id: str, last_known: str) -> tuple[str, str | None]:
        result, error = self.outcome(folder, job_id)
        if last_known == "CANCELLED":
            return "CANCELLED", error
        pid, element = _local_id(job_id)
        if pid is None:
            return "UNKNOWN", f"job id {job_id!r} is not a local process id; the registry row is damaged"
        if result is not None:
            return state_from_result(result), error
        if _pid_alive(pid):
            if element is not None and not self.log_paths(folder, job_id, 0)[0].exists():
                return "PENDING", None  # an earlier element of its LocalArray still runs
            return "RUNNING", error
        return "FAILED", "the local job ended without a result (killed?)"

    def cancel(self, job_id: str) -> None:
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


@contextlib.contextmanager
def _detached_stdio():
    """submitit starts its controller as a child that inherits this process's stdout and stderr,
    so `dsorch submit ... | tee log` (or a test capturing the output) would wait for the whole job
    before the pipe closes. The controller writes its own logs into the job folder; it gets
    /dev/null instead."""
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


def _local_id(job_id: str) -> tuple[int | None, int | None]:
    """(controller pid, element) of a local job id: "PID", or "PID_i" for a LocalArray element."""
    pid, sep, element = job_id.partition("_")
    if not pid.isdigit() or (sep and not element.isdigit()):
        return None, None
    return int(pid), int(element) if sep else None
