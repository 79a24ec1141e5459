"""The remote backend: a SLURM profile's job submitted from a laptop on the login node its ``login``
section names, over SSH (run/remote.py ``Remote`` is the transport). The login node's dsorch
submits, watches and cancels the job with its own SLURM backend and keeps it in its own registry;
the local registry keeps the job as executor remote with the login section it went through, and
its run directory (without checkpoints) and logs come back here once it ended."""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import JobError
from orchestrator.plandir.rundir import CHECKPOINTS_DIR
from orchestrator.run.backends.base import Backend, Relay, SubmititBackend
from orchestrator.run.backends.slurm import SlurmBackend
from orchestrator.run.jobs import DoctorJob, TrainingJob
from orchestrator.run.registry import ACTIVE_STATES, JobRecord
from orchestrator.run.remote import REMOTE_PROFILES, Remote
from orchestrator.run.scheduler import JobSpec, NodeJob
from orchestrator.spec.cluster import LoginSpec

# The registry row's columns that the login node's registry keeps for a remote job.
_MIRRORED = ("state", "last_step", "last_loss", "requeues", "elapsed_s", "error")


@dataclass(frozen=True)
class RemoteBackend(SubmititBackend):
    """The login node ``via`` leads to; ``shipment``: what its dsorch needs to take a submission on
    (``relay``), absent for a job already submitted."""

    executor = "remote"
    queues = True
    has_script = True
    runs_here = False
    relays = True

    via: Remote
    shipment: Relay | None = None

    @classmethod
    def at(cls, remote: Remote | None) -> Backend:
        if remote is None:
            raise JobError(
                "a remote job needs the login section it goes through (the profile's `login:`, or the "
                "registry row's login column); the registry row is damaged, or the profile lost its section."
            )
        return cls(remote)

    def relay(self, relay: Relay) -> Backend:
        return RemoteBackend(self.via, relay)

    def check(self, dry_run: str | None = None) -> None:
        if shutil.which("ssh") is None:
            raise self.via.no_ssh()

    def rank_setup(self, spec: JobSpec, jobs: Sequence[object]) -> list[str]:
        # The login node's dsorch submits the job through its SLURM backend.
        return SlurmBackend().rank_setup(spec, jobs)

    def _shipped(self, job: NodeJob) -> tuple[Relay, list[str]]:
        """The plan directory and code in login.remote_dir; the login node's `dsorch submit` arguments."""
        s = self.shipment
        if s is None or isinstance(job, DoctorJob):
            raise JobError(f"{type(job).__name__}: only a plan directory's job is submitted on the login node.")
        self.via.ship(s.experiment_dir, Path(job.plan_dir), s.remote_plan, s.profiles_dir)
        profiles = ["--profiles-dir", REMOTE_PROFILES] if s.profiles_dir else []
        return s, [s.remote_plan, *profiles, *s.args]

    def script(self, spec: JobSpec, folder: Path, job: NodeJob) -> str:
        """The sbatch script the login node's dsorch would submit."""
        _, args = self._shipped(job)
        return self.via.dsorch("submit", *args, "--dry-run").stdout.decode(errors="replace")

    def submit(self, spec: JobSpec, folder: Path, job: NodeJob) -> str:
        s, args = self._shipped(job)
        return self.via.submit([*args, *(["--force"] if s.force else [])])

    def submit_array(self, spec: JobSpec, folder: Path, jobs: list[TrainingJob], timeout_s: float) -> list[str]:
        raise JobError(
            f"job arrays (`dsorch trial`) do not run over SSH yet, and profile {self.via.cluster} has a login "
            f"section ({self.via.login.host}); run them on the login node itself, where the login section is "
            f"ignored (DSORCH_LOGIN_NODE=1)."
        )

    def state(self, folder: Path, job_id: str, last_known: str) -> tuple[str, str | None]:
        row = self.via.job(job_id)
        return row.get("state") or last_known, row.get("error")

    def seen(self, rec: JobRecord) -> dict[str, object]:
        """The login node's row of the job; once it ended, its run directory (without checkpoints)
        and its logs come back into the local ones."""
        row = self.via.job(rec.job_id)
        values = {k: row.get(k) for k in _MIRRORED}
        if values["state"] not in ACTIVE_STATES:
            if row.get("run_dir"):
                self.via.bring_back(row["run_dir"], Path(rec.run_dir), exclude=CHECKPOINTS_DIR)
            if row.get("log_dir") and re.fullmatch(r"[0-9_]+", rec.job_id):
                self.via.bring_back(row["log_dir"], Path(rec.log_dir), only=f"{rec.job_id}_*")
        return values

    def stream_logs(self, job_id: str, rank: int, follow: bool) -> bool:
        """The login node's dsorch prints them, as it sees them."""
        self.via.dsorch("logs", job_id, "--rank", str(rank), *(["--follow"] * follow), stream=True)
        return True

    def cancel(self, job_id: str) -> None:
        self.via.dsorch("cancel", job_id)


def remote_of(rec: JobRecord) -> Remote | None:
    """The login node a job went through, as the registry recorded it at submit time; None for a
    job that did not go through one."""
    if rec.login is None:
        return None
    return Remote(rec.cluster, LoginSpec.model_validate_json(rec.login))
