"""The one seam to submitit and SLURM: executors, the job that runs on the nodes, job states,
logs and cancellation.

A job is submitit's: ``SlurmExecutor`` on a cluster, ``LocalExecutor`` for ``--cluster local``.
Each task (one per GPU, or one per CPU process for ``local``) runs ``TrainingJob``, which takes
rank, world size and master address from SLURM through submitit's ``JobEnvironment`` and runs
dsorch's training entrypoint in-process. ``TrainingJob`` is submitit-``Checkpointable``: on
SIGUSR2 (SLURM's warning before a time limit or preemption, ``--signal=USR2@90``) every rank
stops at the same step and takes part in the DeepSpeed checkpoint, then rank 0 hands over to
submitit, which requeues the job; the requeued job resumes from that checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import DsorchError
from orchestrator.train.hosts import node_address
from orchestrator.spec.cluster import ClusterProfile, SlurmSpec
from orchestrator.spec.sbatch import parse_slurm_time, rank_env, sbatch_parameters
from orchestrator.train.stop import EXIT_STOPPED

STARTS_FILE = "starts.jsonl"


# --------------------------------------------------------------------------------------------
# The job that runs on the nodes
# --------------------------------------------------------------------------------------------




@dataclass
class TrainingJob:
    """What every task of a dsorch job runs (picklable; submitit sends it to the nodes).

    The task starts ``python -m orchestrator.train`` as a child process with the torch.distributed
    variables that submitit derives from SLURM, and forwards SIGUSR2/SIGTERM to it. The child
    checkpoints on either signal (every rank, at the same step) and exits with EXIT_STOPPED; on
    SIGUSR2 rank 0 then lets submitit requeue the job. A child process rather than a call keeps
    the entrypoint's clean exit (it leaves with os._exit after tearing down gloo) and keeps a
    crashed rank from taking submitit's result bookkeeping down with it.
    """

    plan_dir: str
    run_dir: str
    steps: int | None = None
    data: str | None = None
    use_gpus: bool = False
    save_interval: int = 0
    save: bool = True  # False for trials: a measurement needs no checkpoint

    def command(self) -> list[str]:
        cmd = [sys.executable, "-u", "-m", "orchestrator.train", "--plan", self.plan_dir, "--run-dir", self.run_dir]
        if self.steps is not None:
            cmd += ["--steps", str(self.steps)]
        if self.data is not None:
            cmd += ["--data", self.data]
        if self.save_interval:
            cmd += ["--save-interval", str(self.save_interval)]
        if not self.save:
            cmd += ["--no-save"]
        return cmd

    def __call__(self) -> dict:
        import submitit

        env = submitit.JobEnvironment()
        child_env = _rank_env(env, self.use_gpus)
        _record_start(env, Path(self.run_dir), env.job_id)
        received: list[int] = []
        submitit_usr2 = signal.getsignal(signal.SIGUSR2)
        children: list[subprocess.Popen] = []

        def forward(signum, frame):
            received.append(signum)
            for child in children:
                try:
                    child.send_signal(signum)
                except ProcessLookupError:
                    pass

        # Handlers first, child second: a signal in between is recorded and forwarded below.
        signal.signal(signal.SIGUSR2, forward)
        signal.signal(signal.SIGTERM, forward)
        child = subprocess.Popen(self.command(), env=child_env)
        if received:
            # The child installs its handlers first thing (orchestrator/train/__main__.py); give
            # the interpreter a moment to get there before passing on an early signal.
            time.sleep(1.0)
            for signum in sorted(set(received)):
                child.send_signal(signum)
        children.append(child)
        rc = child.wait()
        if rc == EXIT_STOPPED and signal.SIGUSR2 in received:
            if env.global_rank == 0 and callable(submitit_usr2):
                # Every rank has saved its part of the checkpoint; submitit's own handler calls
                # self.checkpoint(), requeues the job with scontrol and exits.
                submitit_usr2(signal.SIGUSR2, None)
            return {"stopped": True, "rank": env.global_rank}
        if rc == EXIT_STOPPED:
            return {"stopped": True, "rank": env.global_rank}
        if rc != 0:
            how = (f"was killed by {signal.Signals(-rc).name}" if rc < 0 and -rc in signal.valid_signals()
                   else f"exited with code {rc}")
            raise RuntimeError(f"rank {env.global_rank}: `{' '.join(self.command())}` {how}:\n"
                               + _tail_file(env.paths.stderr, 30))
        return {"stopped": False, "rank": env.global_rank, "run_dir": self.run_dir}

    def checkpoint(self, *args, **kwargs):
        """submitit's Checkpointable hook: resubmit the same job; it resumes from the run directory.
        A job that saves no checkpoint (a trial) is not requeued: it would start again from step 0."""
        import submitit

        if not self.save:
            return None

        return submitit.helpers.DelayedSubmission(dataclasses.replace(self))


def _record_start(env, run_dir: Path, job_id: str) -> None:
    """Rank 0 notes each start of a run in RUN_DIR/starts.jsonl (`dsorch status`: elapsed, requeues)."""
    if env.global_rank != 0:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / STARTS_FILE, "a") as fh:
        fh.write(json.dumps({"job_id": job_id, "restart": int(os.environ.get("SLURM_RESTART_COUNT", 0)),
                             "time": time.time(), "world_size": env.num_tasks}) + "\n")


def _rank_env(env, use_gpus: bool, port_offset: int = 0) -> dict[str, str]:
    """The environment of a rank's child: torch.distributed's variables from submitit's view of
    SLURM (or of the local executor), the master being the first node's NodeAddr (node names need
    not resolve: train/hosts.py)."""
    from submitit.helpers import TorchDistributedEnvironment

    dist_env = TorchDistributedEnvironment().export(set_cuda_visible_devices=use_gpus, overwrite=True)
    master = node_address(dist_env.master_addr) if env.num_nodes > 1 else "127.0.0.1"
    return dict(os.environ, MASTER_ADDR=master, MASTER_PORT=str(dist_env.master_port + port_offset))


@dataclass
class LocalArray:
    """A job array for the local executor, which has none: submitit's LocalExecutor starts every
    job of a batch at once, and trials must not share this machine's cores (each measures the
    whole "cluster"). One local job runs the elements in turn; element ``i`` of job ``PID`` is
    ``PID_i``, as SLURM names array tasks, with submitit's per-task log and result files, so that
    `dsorch status/logs/cancel` treat it as they treat a SLURM array task (job_state below). An
    element that runs past ``timeout_s`` is killed and ends TIMEOUT, as SLURM's time limit would."""

    jobs: list[TrainingJob]
    timeout_s: float

    def __call__(self) -> list[str]:
        import submitit
        from submitit.core.utils import JobPaths

        env = submitit.JobEnvironment()
        states = []
        for i, job in enumerate(self.jobs):
            paths = JobPaths(env.paths.folder, job_id=f"{env.job_id}_{i}", task_id=env.global_rank)
            # A port per element: the previous element's store may linger in TIME_WAIT.
            child_env = _rank_env(env, job.use_gpus, port_offset=i)
            _record_start(env, Path(job.run_dir), f"{env.job_id}_{i}")
            with open(paths.stdout, "w") as out, open(paths.stderr, "w") as err:
                child = subprocess.Popen(job.command(), env=child_env, stdout=out, stderr=err)
                try:
                    rc = child.wait(timeout=self.timeout_s)
                    result = ("success", {"rank": env.global_rank, "run_dir": job.run_dir}) if rc == 0 else \
                        ("error", f"rank {env.global_rank}: `{' '.join(job.command())}` exited with code {rc}:\n"
                                  + _tail_file(paths.stderr, 30))
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                    result = ("error", f"{TIMEOUT_MARK} after {self.timeout_s:.0f} s (rank {env.global_rank})")
            tmp = paths.result_pickle.with_suffix(".tmp")
            with open(tmp, "wb") as fh:
                pickle.dump(result, fh)
            os.replace(tmp, paths.result_pickle)
            states.append(state_from_result(result))
        return states


# How LocalArray marks an element it killed at its time limit (SLURM's TIMEOUT state).
TIMEOUT_MARK = "TIMEOUT: the element ran past its time limit"


def _tail_file(path: Path, n: int) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").rstrip().splitlines()[-n:])
    except OSError:
        return "(no log)"


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
    time_min: int  # slurm.time, unless the job sets its own (a trial, the doctor)
    env: tuple[tuple[str, str], ...]  # every rank's environment: spec/sbatch.py rank_env
    slurm: SlurmSpec

    @classmethod
    def of(cls, profile: ClusterProfile, name: str, time_min: int | None = None) -> JobSpec:
        """The job for a profile; ``time_min`` overrides its time limit."""
        return cls(kind=profile.executor, name=name, nodes=profile.nodes, tasks_per_node=profile.gpus_per_node,
                   use_gpus=profile.backend == "nccl",
                   time_min=time_min if time_min is not None else parse_slurm_time(profile.slurm.time),
                   env=tuple(rank_env(profile).items()), slurm=profile.slurm)


def _setup_lines(spec: JobSpec) -> list[str]:
    import shlex

    lines = list(spec.slurm.setup)
    lines += [f"export {k}={shlex.quote(v)}" for k, v in spec.env]
    return lines


def _script_only_executor(folder: Path):
    """submitit's SlurmExecutor for writing the sbatch script where SLURM is not installed (a laptop
    running ``submit --dry-run``): its constructor refuses when ``srun`` is not on PATH
    (``SlurmExecutor.affinity``), although rendering the script needs no SLURM at all. The script
    comes from the same ``_make_submission_file_text`` the real submission uses."""
    import submitit

    class ScriptOnlySlurmExecutor(submitit.SlurmExecutor):
        @classmethod
        def affinity(cls) -> int:
            return 2

    return ScriptOnlySlurmExecutor(folder=str(folder), max_num_timeout=3)


def make_executor(spec: JobSpec, folder: Path, script_only: bool = False):
    import submitit

    if spec.kind == "local":
        ex = submitit.LocalExecutor(folder=str(folder))
        ex.update_parameters(tasks_per_node=spec.tasks_per_node, nodes=1, timeout_min=spec.time_min,
                             gpus_per_node=spec.tasks_per_node if spec.use_gpus else 0,
                             setup=_setup_lines(spec))
        return ex
    ex = (_script_only_executor(folder) if script_only else
          submitit.SlurmExecutor(folder=str(folder), max_num_timeout=3))
    sbatch = sbatch_parameters(spec.slurm)
    # The profile's options that submitit has a keyword for go in as keywords; slurm.extra goes in as
    # additional_parameters, which _make_sbatch_string (submitit/slurm/slurm.py) writes as given.
    params = dict(job_name=spec.name, nodes=spec.nodes, ntasks_per_node=spec.tasks_per_node,
                  cpus_per_task=spec.slurm.cpus_per_task, time=spec.time_min,
                  signal_delay_s=spec.slurm.signal_delay_s, setup=_setup_lines(spec),
                  additional_parameters=dict(sbatch.extra), **dict(sbatch.options))
    if spec.use_gpus:
        params["gpus_per_node"] = spec.tasks_per_node
    ex.update_parameters(**params)
    return ex


def sbatch_script(spec: JobSpec, folder: Path) -> str:
    """The sbatch script submitit would submit for this job (for --dry-run), byte for byte: the
    same executor parameters and the same (quoted) command line; needs no SLURM installed."""
    ex = make_executor(spec, folder, script_only=True)
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
        raise DsorchError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on PATH, so there is "
                          f"no SLURM cluster to submit to from here. Run dsorch on a SLURM login node (or put SLURM's "
                          f"client tools on PATH)" + (f"; `--dry-run` {dry_run} without SLURM" if dry_run else "")
                          + ", and `--cluster local` runs on this machine.")


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


def submit(spec: JobSpec, folder: Path, job: TrainingJob) -> str:
    ex = make_executor(spec, folder)
    try:
        with _detached_stdio(spec.kind == "local"):
            submitted = ex.submit(job)
    except Exception as e:  # submitit raises FailedJobError / subprocess errors with sbatch's stderr
        raise DsorchError(f"the scheduler refused the job: {' '.join(str(e).split())[:2000]}")
    if spec.kind == "local":
        # The local controller outlives this process; do not let submitit cancel it at exit.
        submitted._cancel_at_deletion = False
    return str(submitted.job_id)


def submit_array(spec: JobSpec, folder: Path, jobs: list[TrainingJob], timeout_s: float) -> list[str]:
    """``jobs`` as one job array; returns the element ids ("JOB_i"). On SLURM one element runs at a
    time (``--array=0-N%1``): each element is planned for the whole allocation and a measurement
    must not share nodes with its siblings. The local executor has no arrays (LocalArray)."""
    ex = make_executor(spec, folder)
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
        raise DsorchError(f"the scheduler refused the job array: {' '.join(str(e).split())[:2000]}")
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
    from submitit.core.utils import JobPaths

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


def state_from_result(result: tuple[str, object]) -> str:
    if result[0] != "error":
        return "COMPLETED"
    return "TIMEOUT" if str(result[1]).startswith(TIMEOUT_MARK) else "FAILED"


def job_state(kind: str, folder: Path, job_id: str, last_known: str) -> tuple[str, str | None]:
    """(state, error text) of a job, in SLURM's state names."""
    result = _result(folder, job_id)
    error = _first_failure(folder, job_id) if result is not None and result[0] == "error" else None
    if kind == "local":
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
    if shutil.which("sacct") is None:
        # No SLURM client here (e.g. a laptop with a copy of the experiment directory): the last
        # state seen stays; `dsorch status` says so.
        return (state_from_result(result) if result is not None else last_known), error
    import submitit

    job = submitit.SlurmJob(folder=str(folder), job_id=job_id)
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
            raise DsorchError(f"job id {job_id!r} is not a local process id; the registry row is damaged, nothing "
                              f"to cancel.")
        try:
            # submitit's local controller kills its tasks on SIGINT (LocalJob.cancel does the same).
            # An element of a LocalArray has no process of its own: the whole array stops.
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        return
    if shutil.which("scancel") is None:
        raise DsorchError(f"cancelling SLURM job {job_id} needs scancel, which is not on PATH here; run `dsorch cancel "
                          f"{job_id}` (or `scancel {job_id}`) on the cluster's login node.")
    r = subprocess.run(["scancel", job_id], capture_output=True, text=True)
    if r.returncode != 0:
        raise DsorchError(f"scancel {job_id} failed: {r.stderr.strip()}")


def log_paths(folder: Path, job_id: str, rank: int) -> tuple[Path, Path]:
    from submitit.core.utils import JobPaths

    p = JobPaths(folder, job_id=job_id, task_id=rank)
    return p.stdout, p.stderr
