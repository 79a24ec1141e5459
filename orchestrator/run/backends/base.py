"""The one interface every scheduler backend implements, after submitit's ``Executor`` (one
subclass per cluster kind, submitit/core/core.py) and SkyPilot's ``Backend`` (one class per way
of running, sky/backends/backend.py): the CLI and run/submission.py ask a backend object and never
test an executor's name. run/backends/__init__.py registers one backend per value of
spec/cluster.py ``EXECUTORS``.

``SubmititBackend`` is what the backends that keep submitit's job folder share: its per-task
result pickles and log files (``submitit.core.utils.JobPaths``).
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from submitit.core.utils import JobPaths

from orchestrator.errors import JobError
from orchestrator.run.jobs import TrainingJob
from orchestrator.run.registry import JobRecord
from orchestrator.run.remote import Remote
from orchestrator.run.scheduler import JobSpec, NodeJob


@dataclass(frozen=True, kw_only=True, slots=True)
class Relay:
    """What a submission that another dsorch takes on (the login node's: the remote backend) carries
    beyond the job: where the experiment is here, where the plan goes there, the profiles
    directory in use, and the options of that dsorch's ``submit``."""

    experiment_dir: Path
    remote_plan: str  # the plan directory's path under login.remote_dir
    profiles_dir: str | None
    args: tuple[str, ...]
    force: bool = False


class Backend(ABC):
    """One scheduler: how a job is checked for, shown (--dry-run), queued alone or as an array,
    watched, cancelled, where its logs are and what sets every rank's environment.

    The class facts below are what callers ask instead of an executor's name."""

    executor: ClassVar[str]  # its value in spec/cluster.py EXECUTORS and the registry's executor column
    queues: ClassVar[bool]  # a submitted job waits in a queue (PENDING) rather than starts at once (RUNNING)
    has_script: ClassVar[bool]  # --dry-run prints a batch script (stdout), else one comment line (stderr)
    runs_here: ClassVar[bool]  # the ranks run on this machine: paths they will read can be checked here
    # The submission goes on to another dsorch, which takes command-line options (``relay``).
    relays: ClassVar[bool] = False

    @classmethod
    def at(cls, remote: Remote | None) -> Backend:
        """The backend for one job; ``remote``: the login node it goes through, where it does."""
        return cls()

    @abstractmethod
    def check(self, dry_run: str | None = None) -> None:
        """Refuse to submit where this scheduler cannot be reached from here; ``dry_run`` says
        what the command's --dry-run does instead, where it has one."""

    @abstractmethod
    def script(self, spec: JobSpec, folder: Path, job: NodeJob) -> str:
        """What ``submit --dry-run`` prints: the batch script the scheduler would run, byte for
        byte, or where there is none, a comment line saying what would start."""

    @abstractmethod
    def submit(self, spec: JobSpec, folder: Path, job: NodeJob) -> str:
        """Queue ``job``, which every task runs; its job id."""

    @abstractmethod
    def submit_array(self, spec: JobSpec, folder: Path, jobs: list[TrainingJob], timeout_s: float) -> list[str]:
        """``jobs`` as one job array, one element at a time (each is planned for the whole
        allocation); the element ids ("JOB_i"). An element past ``timeout_s`` ends TIMEOUT."""

    @abstractmethod
    def state(self, folder: Path, job_id: str, last_known: str) -> tuple[str, str | None]:
        """(state, error text) of a job, in SLURM's state names."""

    @abstractmethod
    def cancel(self, job_id: str) -> None:
        """Stop the job: every rank gets SIGTERM, checkpoints at its next step and exits."""

    @abstractmethod
    def log_paths(self, folder: Path, job_id: str, rank: int) -> tuple[Path, Path]:
        """(stdout, stderr) of one rank, on this machine."""

    @abstractmethod
    def rank_setup(self, spec: JobSpec, jobs: Sequence[object]) -> list[str]:
        """The shell lines that set every rank's environment before the tasks start (the profile's
        setup and env, the master port); ``jobs``: one master port each where a job takes its own."""

    # What most backends do alike; a backend whose scheduler differs overrides these.

    def blind(self) -> str | None:
        """Why this machine cannot see its jobs' current state (the registry keeps the last one
        seen), or None where it can."""
        return None

    def seen(self, rec: JobRecord) -> dict[str, object]:
        """The registry columns of an active job that the scheduler knows now: its state, and its
        error once it failed (run/submission.py refresh reads its progress from the run directory;
        a scheduler that keeps the whole row elsewhere returns it here)."""
        state, error = self.state(Path(rec.log_dir), rec.job_id, rec.state)
        return {"state": state, **({"error": error} if error else {})}

    def stream_logs(self, job_id: str, rank: int, follow: bool) -> bool:
        """Print a rank's log where the scheduler keeps it away from this machine; False where it is
        here, at ``log_paths``."""
        return False

    def relay(self, relay: Relay) -> Backend:
        """This backend with what another dsorch needs to take the submission on (``relays``)."""
        return self


def refused(what: str, e: Exception) -> JobError:
    """The scheduler's refusal in one paragraph: submitit raises FailedJobError or a subprocess
    error carrying sbatch's stderr."""
    return JobError(f"the scheduler refused {what}: {' '.join(str(e).split())[:2000]}")


class SubmititBackend(Backend):
    """A backend whose jobs keep submitit's folder: a result pickle and a log pair per task."""

    def log_paths(self, folder: Path, job_id: str, rank: int) -> tuple[Path, Path]:
        p = JobPaths(folder, job_id=job_id, task_id=rank)
        return p.stdout, p.stderr

    @staticmethod
    def result(folder: Path, job_id: str, task: int = 0) -> tuple[str, object] | None:
        """submitit's (outcome, value) pair of one task, None before it is (wholly) written."""
        path = JobPaths(folder, job_id=job_id, task_id=task).result_pickle
        if not path.exists():
            return None
        try:
            with open(path, "rb") as fh:
                return pickle.load(fh)
        except Exception:  # a half-written pickle: treat as not yet there
            return None

    @classmethod
    def outcome(cls, folder: Path, job_id: str) -> tuple[tuple[str, object] | None, str | None]:
        """(task 0's result, the error that explains a failed job)."""
        result = cls.result(folder, job_id)
        return result, cls.first_failure(folder, job_id) if result is not None and result[0] == "error" else None

    @classmethod
    def first_failure(cls, folder: Path, job_id: str) -> str | None:
        """The error that explains a failed job: the rank that was killed or exited first in its own
        words, rather than its peers' "connection reset" that task 0 reports when another rank dies."""
        errors = []
        for task in range(4096):
            result = cls.result(folder, job_id, task)
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
