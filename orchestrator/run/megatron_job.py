"""What a `--runtime megatron` job runs on each node: the plan's launch.sh, which starts torchrun
with Megatron-LM's pretrain_gpt.py and the plan's megatron_args.txt.

One submitit task per node (not per rank, as TrainingJob): launch.sh's torchrun starts the node's
ranks, as job.sbatch's megatron branch does with ``srun --ntasks-per-node=1 bash launch.sh``. The
task adds what the submission decides to launch.sh's arguments (Megatron-LM's argparse keeps the
last value of a repeated flag): the run directory's checkpoints as --save/--load, --train-iters,
--save-interval, --log-interval. It reads the node's output line by line, passes it on to its own
log, and turns Megatron-LM's iteration and memory lines into the run directory's step records
(run/megatron_log.py; plandir/rundir.py RunDir.metrics), what `dsorch status`, `trial` and `calibrate` read.

Stopping follows job.sbatch's megatron branch: SIGUSR2 (SLURM's warning before the time limit) and
SIGTERM (scancel, preemption) reach this task; it sends SIGUSR2 to the node's process group, where
launch.sh and torchrun ignore it and Megatron-LM's ranks (--exit-signal-handler --exit-signal
SIGUSR2) checkpoint and exit. After a time-limit warning the job is requeued (submitit's
Checkpointable) when Megatron-LM's tracker file, latest_checkpointed_iteration.txt, has advanced in
this allocation and is short of the last iteration: a job that cannot reach a checkpoint does not loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import submitit

from orchestrator.plandir.rundir import RunDir
from orchestrator.run.jobs import _failure, _rank_env, _record_start
from orchestrator.run.megatron_log import MegatronLog
from orchestrator.run.procs import descendants

# Megatron-LM's tracker file in its --save directory (megatron/training/checkpointing.py
# get_checkpoint_tracker_filename): the newest complete checkpoint's iteration, or "release".
TRACKER = "latest_checkpointed_iteration.txt"
# What the entrypoint trains without a length (orchestrator/train/loop/entry.py main); Megatron-LM
# needs one (--train-iters or --train-samples).
DEFAULT_ITERS = 20


def tracker_iteration(save_dir: Path) -> int:
    """The iteration of the newest complete checkpoint in ``save_dir``; 0 without one (or "release")."""
    try:
        text = (save_dir / TRACKER).read_text().strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


@dataclass
class MegatronJob:
    """What every node of a Megatron-LM job runs (picklable; submitit sends it to the nodes)."""

    plan_dir: str
    run_dir: str
    train_iters: int  # --train-iters: --steps, else the plan's length, else DEFAULT_ITERS
    # The plan's --train-iters, where --steps differs from it without --extend-schedule: passed as
    # --lr-decay-iters so that the learning rate follows the plan's schedule (Megatron-LM decays
    # over --train-iters unless --lr-decay-iters is given: arguments.py, OptimizerParamScheduler).
    lr_decay_iters: int | None = None
    save_interval: int = 0  # 0: the plan's --save-interval
    log_interval: int | None = 1  # None: the plan's own (its megatron_args.txt names one)
    # False for trials: no requeue. They still save: Megatron-LM's --exit-signal-handler needs --save.
    save: bool = True

    @property
    def data(self) -> None:
        """No --data: Megatron-LM trains on megatron_args.txt's data (the registry's data column)."""
        return None

    @property
    def save_dir(self) -> Path:
        """--save/--load: the run directory's checkpoints, as the entrypoint's (not the plan's
        training.checkpoint.dir, which only a job.sbatch submitted by hand uses)."""
        return RunDir(Path(self.run_dir)).checkpoints

    def megatron_args(self) -> list[str]:
        """launch.sh's extra arguments, after megatron_args.txt's (the last value of a flag wins)."""
        args = ["--save", str(self.save_dir), "--load", str(self.save_dir), "--train-iters", str(self.train_iters)]
        if self.lr_decay_iters is not None:
            args += ["--lr-decay-iters", str(self.lr_decay_iters)]
        if self.save_interval:
            args += ["--save-interval", str(self.save_interval)]
        if self.log_interval is not None:
            args += ["--log-interval", str(self.log_interval)]
        return args

    def command(self) -> list[str]:
        return ["bash", str(Path(self.plan_dir) / "launch.sh"), *self.megatron_args()]

    def __call__(self) -> dict:
        env = submitit.JobEnvironment()
        rundir = RunDir(Path(self.run_dir))
        run_dir = rundir.path
        run_dir.mkdir(parents=True, exist_ok=True)
        start = tracker_iteration(self.save_dir)
        if env.global_rank == 0:
            from orchestrator.train.loop.metrics import MetricsLog

            # Iterations logged after the checkpoint resumed from are trained again: drop their
            # records, so that the step records are one trajectory (as the entrypoint does).
            MetricsLog.truncate(rundir, start)
        _record_start(env, run_dir, env.job_id)
        submitit_usr2 = signal.getsignal(signal.SIGUSR2)
        peaks = [run_dir / f"megatron-peak-node{n}.json" for n in range(env.num_nodes)]
        log = MegatronLog(rundir.metrics, peaks, own=peaks[env.global_rank])
        rc, received = _run_node(self.command(), self._node_env(env), log)
        if rc != 0:
            how = f"was killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc}"
            raise RuntimeError(_failure(env.global_rank, f"`{' '.join(self.command())}` {how}", env.paths.stderr))
        done = tracker_iteration(self.save_dir)
        if signal.SIGUSR2 in received and start < done < self.train_iters:
            if env.global_rank == 0 and callable(submitit_usr2) and self.save:
                # submitit's own handler calls self.checkpoint(), requeues the job and exits.
                submitit_usr2(signal.SIGUSR2, None)
            return {"stopped": True, "rank": env.global_rank, "iteration": done}
        return {"stopped": bool(received), "rank": env.global_rank, "run_dir": self.run_dir, "iteration": done}

    def _node_env(self, env) -> dict[str, str]:
        """launch.sh's environment: torchrun's rendezvous for this node. CUDA_VISIBLE_DEVICES stays
        as SLURM set it: torchrun's ranks share the node's GPUs (use_gpus=False keeps submitit
        from narrowing it to one)."""
        base = _rank_env(env, use_gpus=False)
        return dict(base, NNODES=str(env.num_nodes), NODE_RANK=str(env.node), DSORCH_PLAN_DIR=self.plan_dir)

    def checkpoint(self, *args, **kwargs):
        """submitit's Checkpointable hook: the same job again; --load resumes it from the tracker."""
        if not self.save:
            return None
        return submitit.helpers.DelayedSubmission(dataclasses.replace(self))


def _run_node(command: list[str], child_env: dict[str, str], log: MegatronLog) -> tuple[int, list[int]]:
    """Run launch.sh to its end, its stdout passed on line by line and fed to ``log``. SIGUSR2,
    SIGTERM and SIGINT that reach this task become SIGUSR2 to launch.sh and every process below it
    (the ranks' --exit-signal; job.sbatch's stop_step does the same through srun). Returns its exit code and the
    signals that arrived."""
    received: list[int] = []
    root: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        for pid in [*root, *(descendants(root[0]) if root else [])]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR2)

    # SIGINT: submitit's local controller cancels with it, then SIGKILLs this task a second later;
    # the ranks, in sessions of their own, finish the checkpoint.
    for signum in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    child = subprocess.Popen(command, env=child_env, stdout=subprocess.PIPE, text=True, errors="replace")
    root.append(child.pid)
    if received:
        # A signal before the group existed: give launch.sh a moment to reach its `trap '' USR2
        # TERM` (USR2 would kill bash before it), then pass it on.
        time.sleep(1.0)
        forward(received.pop(), None)
    assert child.stdout is not None
    for line in child.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        log.feed(line)
    return child.wait(), received
