"""What a cluster profile says to SLURM, for job.sbatch (render/scripts.py) and for the job
``dsorch submit`` queues alike: time limits, the sbatch options, the job name, the ranks'
environment."""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.errors import DsorchError

_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def parse_slurm_time(text: str) -> int:
    """SLURM time limits ("MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS") in minutes."""
    # sbatch(1) --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not m:
        raise DsorchError(f"slurm.time '{text}' is not a SLURM time limit; write HH:MM:SS or D-HH:MM:SS.")
    days, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:
        hours, minutes, seconds = (parts + [0, 0, 0])[:3]
        return int(days) * 1440 + hours * 60 + minutes + (1 if seconds else 0)
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 2:
        return parts[0] + (1 if parts[1] else 0)
    return parts[0] * 60 + parts[1] + (1 if parts[2] else 0)


# The profile's slurm settings that become `#SBATCH --KEY=VALUE` lines as they are, in job.sbatch
# (render/scripts.py) and in the script submitit writes (run/backends/slurm.py SlurmBackend.executor_for).
SBATCH_KEYS = ("partition", "account", "qos", "constraint", "mem")


@dataclass(frozen=True, kw_only=True, slots=True)
class SbatchParameters:
    """The sbatch options a profile's slurm section asks for, beyond what dsorch derives itself
    (job name, nodes, tasks, CPUs, GPUs, time, signal).

    ``options`` holds the keys that submitit's ``_make_sbatch_string`` (submitit/slurm/slurm.py)
    names in its keyword signature: the SBATCH_KEYS that are set, in that order, then
    ``("exclusive", True)`` for a bare ``--exclusive``. ``extra`` is slurm.extra sorted by key;
    submitit takes it as ``additional_parameters``, which it applies after its own keys."""

    options: tuple[tuple[str, str | bool], ...]
    extra: tuple[tuple[str, str], ...]

    def items(self) -> tuple[tuple[str, str | bool], ...]:
        """Every option, in job.sbatch's order: ``options``, then ``extra``."""
        return self.options + self.extra


def sbatch_parameters(slurm) -> SbatchParameters:
    """The sbatch parameters of a profile's ``slurm`` section (a ``SlurmSpec``, spec/cluster.py,
    which imports this module): one source for job.sbatch's #SBATCH lines and for submitit's
    executor parameters."""
    options: list[tuple[str, str | bool]] = [
        (key, getattr(slurm, key)) for key in SBATCH_KEYS if getattr(slurm, key) is not None
    ]
    if slurm.exclusive:
        options.append(("exclusive", True))
    return SbatchParameters(options=tuple(options), extra=tuple(sorted(slurm.extra.items())))


def rank_env(profile) -> dict[str, str]:
    """Environment of every rank, for launch.sh and for `dsorch submit` alike: the profile's
    slurm.env, plus one OpenMP thread per rank unless set (ranks share the node's cores; without a
    cap each starts one thread per core and they thrash, which is why torchrun sets 1), plus
    DS_ACCELERATOR=cpu for CPU (gloo) profiles so that DeepSpeed does not look for a GPU."""
    env = dict(profile.slurm.env)
    env.setdefault("OMP_NUM_THREADS", str(profile.slurm.cpus_per_task if profile.backend == "nccl" else 1))
    if profile.backend == "gloo":
        env.setdefault("DS_ACCELERATOR", "cpu")
    return dict(sorted(env.items()))


def job_name(spec_name: str) -> str:
    """SLURM job names go into #SBATCH lines: keep them to a safe alphabet."""
    return _SAFE_NAME.sub("-", f"dsorch-{spec_name}")[:100]
