"""The run directory: where one training run of a plan keeps its checkpoints, its step records
and its stop files, across requeues and resumes. ``RunDir`` spells each of its file names once;
the entrypoint (train/), the node-side jobs and submission (run/), calibration (calibrate/) and the
commands that read a run (cli/) all ask it.

Standard library only: ``python -m orchestrator.train`` reaches it before the torch imports.

Which directory is a run's:

- the bundled entrypoint's ``--run-dir``, else ``$DSORCH_RUN_DIR`` (job.sbatch sets it), else
  ``RunDir.default(plan_dir)``, PLAN/run (train/loop/entry.py parse_args, Trainer);
- `dsorch submit`'s ``--run-dir``, else runs/<plan>-<job key> (run/submission.py); a trial's
  is its plan's default (run/trial.py);
- a Megatron-LM job from `dsorch submit` (run/megatron_job.py) saves into this type's
  ``checkpoints`` as any other run, passing it as --save/--load; only a job.sbatch submitted by hand
  uses the plan's ``training.checkpoint.dir`` (render/megatron.py checkpoint_dir), a directory
  Megatron-LM owns, where nothing writes step records.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# The run directory of a plan when none is given: beside plan.yaml, so that a plan and its run
# travel together.
DEFAULT_NAME = "run"
# The environment variable that names the run directory for the entrypoint's ranks: job.sbatch
# exports it, so that the job script and every rank agree on where checkpoints and the stop marker
# live, across requeues (templates/job.sbatch.j2).
RUN_DIR_ENV = "DSORCH_RUN_DIR"
# One JSON object per training step (and per evaluation), rank 0's (train/loop/metrics.py MetricsLog,
# run/megatron_log.py MegatronLog): what `dsorch status`, `trial`, `calibrate` and the plots read.
METRICS_FILE = "metrics.jsonl"
# Where the entrypoint's checkpoints go, one directory per step (train/checkpoint/store.py), and a
# Megatron-LM job's --save/--load (run/megatron_job.py).
CHECKPOINTS_DIR = "checkpoints"
# A file that asks the ranks to checkpoint and stop after the current step. job.sbatch uses it
# rather than a signal: SLURM delivers a step's signal to every process of the step, and a rank's
# helper processes (a ninja build of a DeepSpeed op at start-up, say) die of it (measured on the
# loopback cluster: "ninja died with SIGUSR2", the rank crashed).
STOP_REQUEST_FILE = "stop.request"
# Written by rank 0 after every rank has saved the checkpoint of a stop request, removed when
# training starts again. A job script reads it to tell "stopped cleanly, requeue me" from a
# failure: torchrun reports any non-zero rank exit as its own exit code 1 (torch.distributed.elastic
# ChildFailedError), so the entrypoint's EXIT_STOPPED does not get through.
STOPPED_FILE = "stopped.json"
# In a container, rank 0 asks the host for the requeue with this file: the image need not have
# SLURM's scontrol, and the batch script (on the host) runs it when it finds the file
# (run/jobs.py _requeue_from_host, run/backends/slurm.py _container_parameters).
REQUEUE_REQUEST_FILE = "requeue.request"
# Rank 0 notes each start of a run here (run/jobs.py _record_start; `dsorch status`: elapsed, requeues).
STARTS_FILE = "starts.jsonl"


@dataclass(frozen=True, slots=True)
class RunDir:
    """A run directory's path and the paths of what is in it (nothing here touches the disk)."""

    path: Path

    @classmethod
    def default(cls, plan_dir: str | os.PathLike) -> RunDir:
        """The run directory of a plan when none is given: PLAN/run."""
        return cls(Path(plan_dir) / DEFAULT_NAME)

    @classmethod
    def for_plan(cls, plan_dir: str | os.PathLike, run_dir: str | os.PathLike | None = None) -> RunDir:
        """``run_dir`` when given, else the plan's default."""
        return cls.default(plan_dir) if run_dir is None or run_dir == "" else cls(Path(run_dir))

    @property
    def metrics(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    @property
    def stop_request(self) -> Path:
        return self.path / STOP_REQUEST_FILE

    @property
    def stopped(self) -> Path:
        return self.path / STOPPED_FILE

    @property
    def requeue_request(self) -> Path:
        return self.path / REQUEUE_REQUEST_FILE

    @property
    def starts(self) -> Path:
        return self.path / STARTS_FILE

    def has_metrics(self) -> bool:
        """Whether a run wrote step records here (a run directory, not just any directory)."""
        return self.metrics.is_file()

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)
