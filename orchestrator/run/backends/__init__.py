"""Scheduler backends behind one interface (``Backend``, run/backends/base.py): one module per
executor of spec/cluster.py ``EXECUTORS`` and one entry in ``BACKENDS``. The CLI, run/submission.py,
the doctor and trials ask ``backend_for(...)`` and never test an executor's name.

- ``slurm``: submitit's SlurmExecutor on a login node (sbatch, srun, sacct, scancel).
- ``local``: submitit's LocalExecutor, the ranks as processes on this machine.
- ``remote``: a SLURM profile's job from a laptop, submitted on its login node over SSH.

A new backend is one module here and one line in ``BACKENDS``, and its name in spec/cluster.py
``ProfileExecutor`` where a profile names it.
"""

from __future__ import annotations

from orchestrator.errors import JobError
from orchestrator.run.backends.base import Backend, Relay
from orchestrator.run.backends.local import LocalBackend
from orchestrator.run.backends.remote import RemoteBackend, remote_of
from orchestrator.run.backends.slurm import SlurmBackend
from orchestrator.run.registry import JobRecord
from orchestrator.run.scheduler import JobSpec
from orchestrator.spec.cluster import EXECUTORS

__all__ = ["BACKENDS", "Backend", "JobSpec", "Relay", "backend_for"]

BACKENDS: dict[str, type[Backend]] = {b.executor: b for b in (SlurmBackend, LocalBackend, RemoteBackend)}


def backend_for(job: str | JobSpec | JobRecord) -> Backend:
    """The backend of an executor named by a profile, of a job about to be submitted (with the
    login node it goes through, if any), or of a job in the registry (the same, as recorded)."""
    executor: str
    if isinstance(job, JobSpec):
        executor, remote = job.executor, job.remote
    elif isinstance(job, JobRecord):
        executor, remote = job.executor, remote_of(job)
    else:
        executor, remote = job, None
    backend = BACKENDS.get(executor)
    if backend is None:
        raise JobError(
            f"executor {executor!r} is not one dsorch knows ({', '.join(EXECUTORS)}); "
            + (
                f"job {job.job_id}'s registry row is damaged."
                if isinstance(job, JobRecord)
                else "set the profile's executor to one of them."
            )
        )
    return backend.at(remote)
