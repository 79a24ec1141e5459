"""What runs on the nodes: the task every rank of a dsorch job runs.

submitit pickles one of these callables on the login node (run/backends/) and calls it in
every task of the job; each starts a child process with torch.distributed's variables, which it
takes from SLURM (or from the local executor) through submitit's ``JobEnvironment``:

- ``TrainingJob`` runs dsorch's training entrypoint, ``python -m orchestrator.train``. It is
  submitit-``Checkpointable``: on SIGUSR2 (SLURM's warning before a time limit or preemption,
  ``--signal=USR2@90``) every rank stops at the same step and takes part in the DeepSpeed
  checkpoint, then rank 0 hands over to submitit, which requeues the job; the requeued job resumes
  from that checkpoint.
- ``DoctorJob`` runs the collectives of `dsorch doctor`, ``python -m orchestrator.run.collectives``.
- ``LocalArray`` runs TrainingJobs one after another, a job array for the local executor.

The names of these classes are what submitit's pickles hold: moving one needs an alias in
``orchestrator.MOVED_MODULES`` for the jobs already queued.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import submitit
from submitit.core.utils import JobPaths
from submitit.helpers import TorchDistributedEnvironment

from orchestrator.plandir.rundir import RunDir
from orchestrator.train.loop.hosts import node_address
from orchestrator.train.stop import EXIT_STOPPED

# In a container, the ranks find the first node's NodeAddr in this variable: the batch script sets it
# on the host (templates/master_addr.sh.j2), as it runs the requeue rank 0 asks for with
# RunDir.requeue_request.
HOST_MASTER_ADDR = "DSORCH_MASTER_ADDR"
# What rank 0 of the doctor job writes into its folder (run/collectives.py); run/doctor.py reads it.
DOCTOR_RESULT = "doctor.json"
# How LocalArray marks an element it killed at its time limit (SLURM's TIMEOUT state).
TIMEOUT_MARK = "TIMEOUT: the element ran past its time limit"
# Lines of a failed rank's stderr that its error quotes.
TAIL_LINES = 30


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
    # `dsorch submit --data`, overriding the plan's training.data; None: the plan's. A requeue
    # (checkpoint below) is this same object, so it trains on the same data.
    data: str | None = None
    use_gpus: bool = False
    save_interval: int = 0
    save: bool = True  # False for trials: a measurement needs no checkpoint
    # --switch-data: resume from a checkpoint trained on other data, on purpose (train/data/fingerprint.py).
    # Jobs pickled before this field unpickle with the class default.
    switch_data: bool = False
    extend_schedule: bool = False  # --steps past the plan's: stretch the LR decay (train/loop/lr_schedule.py)
    # In a container (the profile's `container`): the batch script on the host requeues the job when
    # rank 0 leaves RunDir.requeue_request (run/backends/slurm.py), instead of submitit running scontrol here.
    host_requeue: bool = False

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
        if self.switch_data:
            cmd += ["--switch-data"]
        if self.extend_schedule:
            cmd += ["--extend-schedule"]
        return cmd

    def __call__(self) -> dict:
        env = submitit.JobEnvironment()
        child_env = _rank_env(env, self.use_gpus)
        _record_start(env, Path(self.run_dir), env.job_id)
        submitit_usr2 = signal.getsignal(signal.SIGUSR2)
        rc, received = _run_rank_child(self.command(), child_env, (signal.SIGUSR2, signal.SIGTERM))
        if rc == EXIT_STOPPED and signal.SIGUSR2 in received:
            if env.global_rank == 0 and callable(submitit_usr2):
                # Every rank has saved its part of the checkpoint; submitit's own handler calls
                # self.checkpoint(), requeues the job with scontrol and exits.
                if self.host_requeue:
                    _requeue_from_host(submitit_usr2, Path(self.run_dir))
                submitit_usr2(signal.SIGUSR2, None)
            return {"stopped": True, "rank": env.global_rank}
        if rc == EXIT_STOPPED:
            return {"stopped": True, "rank": env.global_rank}
        if rc != 0:
            how = (
                f"was killed by {signal.Signals(-rc).name}"
                if rc < 0 and -rc in signal.valid_signals()
                else f"exited with code {rc}"
            )
            raise RuntimeError(_failure(env.global_rank, f"`{' '.join(self.command())}` {how}", env.paths.stderr))
        return {"stopped": False, "rank": env.global_rank, "run_dir": self.run_dir}

    def checkpoint(self, *args, **kwargs):
        """submitit's Checkpointable hook: resubmit the same job; it resumes from the run directory.
        A job that saves no checkpoint (a trial) is not requeued: it would start again from step 0."""
        if not self.save:
            return None

        return submitit.helpers.DelayedSubmission(dataclasses.replace(self))


@dataclass
class DoctorJob:
    """What every task of the doctor job runs (picklable, like TrainingJob): the collectives of
    ``python -m orchestrator.run.collectives`` as a child, SIGTERM (scancel) forwarded to it."""

    out: str
    max_bytes: int
    iters: int
    use_gpus: bool

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-u",
            "-m",
            "orchestrator.run.collectives",
            "--out",
            self.out,
            "--max-bytes",
            str(self.max_bytes),
            "--iters",
            str(self.iters),
        ]

    def __call__(self) -> dict:
        env = submitit.JobEnvironment()
        child_env = dict(_rank_env(env, self.use_gpus), DSORCH_DOCTOR_GPU="1" if self.use_gpus else "0")
        rc, _ = _run_rank_child(self.command(), child_env, (signal.SIGTERM,))
        if rc != 0:
            raise RuntimeError(
                _failure(env.global_rank, f"the doctor's collectives exited with code {rc}", env.paths.stderr)
            )
        return {"rank": env.global_rank}


@dataclass
class LocalArray:
    """A job array for the local executor, which has none: submitit's LocalExecutor starts every
    job of a batch at once, and trials must not share this machine's cores (each measures the
    whole "cluster"). One local job runs the elements in turn; element ``i`` of job ``PID`` is
    ``PID_i``, as SLURM names array tasks, with submitit's per-task log and result files, so that
    `dsorch status/logs/cancel` treat it as they treat a SLURM array task (run/backends/local.py state). An
    element that runs past ``timeout_s`` is killed and ends TIMEOUT, as SLURM's time limit would."""

    jobs: list[TrainingJob]
    timeout_s: float

    def __call__(self) -> list[str]:
        env = submitit.JobEnvironment()
        states = []
        for i, job in enumerate(self.jobs):
            paths = JobPaths(env.paths.folder, job_id=f"{env.job_id}_{i}", task_id=env.global_rank)
            # A port per element: the previous element's store may linger in TIME_WAIT.
            child_env = _rank_env(env, job.use_gpus, port_offset=i)
            _record_start(env, Path(job.run_dir), f"{env.job_id}_{i}")
            result = self._run_element(env, job, child_env, paths)
            tmp = paths.result_pickle.with_suffix(".tmp")
            with open(tmp, "wb") as fh:
                pickle.dump(result, fh)
            os.replace(tmp, paths.result_pickle)
            states.append(state_from_result(result))
        return states

    def _run_element(self, env, job: TrainingJob, child_env: dict[str, str], paths: JobPaths) -> tuple[str, object]:
        """One element to its end, its output in its own log files; submitit's (outcome, value)
        result pair."""
        with open(paths.stdout, "w") as out, open(paths.stderr, "w") as err:
            child = subprocess.Popen(job.command(), env=child_env, stdout=out, stderr=err)
            try:
                rc = child.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
                return "error", f"{TIMEOUT_MARK} after {self.timeout_s:.0f} s (rank {env.global_rank})"
        if rc == 0:
            return "success", {"rank": env.global_rank, "run_dir": job.run_dir}
        return "error", _failure(env.global_rank, f"`{' '.join(job.command())}` exited with code {rc}", paths.stderr)


def state_from_result(result: tuple[str, object]) -> str:
    """SLURM's name for how a task ended, from submitit's (outcome, value) result pair."""
    if result[0] != "error":
        return "COMPLETED"
    return "TIMEOUT" if str(result[1]).startswith(TIMEOUT_MARK) else "FAILED"


# --------------------------------------------------------------------------------------------
# One rank's child process
# --------------------------------------------------------------------------------------------


def _rank_env(env, use_gpus: bool, port_offset: int = 0) -> dict[str, str]:
    """The environment of a rank's child: torch.distributed's variables from submitit's view of
    SLURM (or of the local executor), the master being the first node's NodeAddr (node names need
    not resolve: train/loop/hosts.py)."""
    dist_env = TorchDistributedEnvironment().export(set_cuda_visible_devices=use_gpus, overwrite=True)
    # In a container, which need not have scontrol, the batch script found it on the host.
    master = (
        (os.environ.get(HOST_MASTER_ADDR) or node_address(dist_env.master_addr)) if env.num_nodes > 1 else "127.0.0.1"
    )
    return dict(os.environ, MASTER_ADDR=master, MASTER_PORT=str(dist_env.master_port + port_offset))


def _run_rank_child(
    command: list[str], child_env: dict[str, str], forwarded: tuple[signal.Signals, ...]
) -> tuple[int, list[int]]:
    """Run a rank's child to its end, passing on the ``forwarded`` signals that reach this task
    (SLURM signals the task, submitit's process, not its child). Returns the child's exit code and
    the forwarded signals that arrived."""
    received: list[int] = []
    children: list[subprocess.Popen] = []

    def forward(signum, frame):
        received.append(signum)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    # Handlers first, child second: a signal in between is recorded and forwarded below.
    for signum in forwarded:
        signal.signal(signum, forward)
    child = subprocess.Popen(command, env=child_env)
    if received:
        # The training child installs its handlers first thing (orchestrator/train/__main__.py);
        # give the interpreter a moment to get there before passing on an early signal.
        time.sleep(1.0)
        for early in sorted(set(received)):
            child.send_signal(early)
    children.append(child)
    return child.wait(), received


def _requeue_from_host(handler, run_dir: Path) -> None:
    """Make submitit's USR2 handler (``SignalHandler.checkpoint_and_try_requeue``, bound method,
    submitit/core/job_environment.py) leave RunDir.requeue_request instead of running ``scontrol requeue``
    (``SlurmJobEnvironment._requeue``): the rest of it (the checkpoint pickle, the exit) stays submitit's."""
    owner = getattr(handler, "__self__", None)
    if owner is None or not hasattr(owner, "env"):
        return
    owner.env._requeue = lambda countdown: RunDir(run_dir).requeue_request.touch()


def _record_start(env, run_dir: Path, job_id: str) -> None:
    """Rank 0 notes each start of a run in its run directory (RunDir.starts; `dsorch status`: elapsed, requeues)."""
    if env.global_rank != 0:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(RunDir(run_dir).starts, "a") as fh:
        fh.write(
            json.dumps(
                {
                    "job_id": job_id,
                    "restart": int(os.environ.get("SLURM_RESTART_COUNT", 0)),
                    "time": time.time(),
                    "world_size": env.num_tasks,
                }
            )
            + "\n"
        )


def _failure(rank: int, what: str, stderr: Path) -> str:
    """A failed rank's error: what its child did, then the last lines of the child's stderr."""
    return f"rank {rank}: {what}:\n" + _tail_file(stderr, TAIL_LINES)


def _tail_file(path: Path, n: int) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").rstrip().splitlines()[-n:])
    except OSError:
        return "(no log)"
