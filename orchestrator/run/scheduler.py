"""A job as every scheduler backend takes it (run/backends/): ``JobSpec``, resolved once from a
profile, naming the executor whose backend runs it.

What each task runs on the nodes is in run/jobs.py; how a backend queues, watches and cancels it,
in run/backends/.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from orchestrator.run.jobs import DoctorJob, TrainingJob
from orchestrator.run.megatron_job import MegatronJob
from orchestrator.run.remote import Remote, login_of
from orchestrator.spec.cluster import ClusterProfile, Executor, SlurmSpec
from orchestrator.spec.container import ContainerSpec
from orchestrator.spec.sbatch import parse_slurm_time, rank_env

# What a backend submits: the callable every task runs (submitit pickles it).
NodeJob = TrainingJob | MegatronJob | DoctorJob


@dataclass(frozen=True, kw_only=True, slots=True)
class JobSpec:
    """Everything a submission needs, resolved from a profile (``JobSpec.of``): one task per GPU on
    every node, the profile's own SLURM settings as they are in ``slurm``."""

    # The profile's executor, or remote where its login section applies (``remote`` says where to).
    executor: Executor
    name: str
    nodes: int
    tasks_per_node: int
    use_gpus: bool
    gpus_per_node: int  # = tasks_per_node, unless one task starts the node's ranks (per_node)
    time_min: int  # slurm.time, unless the job sets its own (a trial, the doctor)
    env: tuple[tuple[str, str], ...]  # every rank's environment: spec/sbatch.py rank_env
    slurm: SlurmSpec
    container: ContainerSpec | None = None
    remote: Remote | None = None  # executor remote: the login node the job is submitted on

    @classmethod
    def of(cls, profile: ClusterProfile, name: str, time_min: int | None = None, per_node: bool = False) -> JobSpec:
        """The job for a profile; ``time_min`` overrides its time limit. ``per_node``: one task per
        node that starts the node's ranks itself (a Megatron-LM job's launch.sh and torchrun), with
        all of the node's GPUs and CPUs, as job.sbatch's megatron branch asks for them."""
        login = login_of(profile.login)
        return cls(
            executor="remote" if login is not None else profile.executor,
            name=name,
            nodes=profile.nodes,
            tasks_per_node=1 if per_node else profile.gpus_per_node,
            use_gpus=profile.backend == "nccl",
            gpus_per_node=profile.gpus_per_node,
            time_min=time_min if time_min is not None else parse_slurm_time(profile.slurm.time),
            env=tuple(rank_env(profile).items()),
            slurm=profile.slurm,
            container=profile.container,
            remote=None if login is None else Remote(profile.name, login),
        )

    def setup_lines(self) -> list[str]:
        """What the job's script runs before the tasks start: the profile's slurm.setup, then every
        rank's environment."""
        return [*self.slurm.setup, *(f"export {k}={shlex.quote(v)}" for k, v in self.env)]
