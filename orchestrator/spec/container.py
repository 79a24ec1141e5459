"""A profile's ``container`` section (ContainerSpec) and what it says to srun, for job.sbatch
(render/scripts.py) and for the job ``dsorch submit`` queues (run/backends/slurm.py) alike.

Which command runs where, in both: the batch script (its traps, the stop file it touches,
``scontrol requeue``, finding MASTER_ADDR with ``scontrol``) runs on the HOST, where SLURM's
client tools are; each task of the job step (launch.sh and torchrun for job.sbatch, submitit's
task and its rank for ``dsorch submit``) runs INSIDE the container. The plan directory, the run
directory (checkpoints, metrics, the stop marker) and, for ``dsorch submit``, submitit's job folder
are bound into the container at the same path, so both sides name the same files.

Flag spellings follow the tools' own documentation:
- Pyxis (NVIDIA/pyxis README.md @ 1075199, ``srun --help``):
  ``--container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH``,
  ``--container-mounts=SRC:DST[:FLAGS][,SRC:DST...]`` ("Mount flags are separated with "+", e.g.
  "ro+rprivate""), ``--container-workdir=PATH``, ``--no-container-mount-home``,
  ``--container-env=NAME[,NAME...]`` ("names of environment variables to override with the host
  environment").
- Apptainer (apptainer-exec(1)): ``apptainer exec [exec options...] <container> <command>``;
  ``-B, --bind=[] ... src[:dest[:opts]] ... Multiple bind paths can be given by a comma separated
  list``; ``--nv`` (NVIDIA GPU support); ``--pwd`` (initial working directory); ``--no-home``.
  The host's environment is passed in by default; ``APPTAINERENV_NAME`` (``SINGULARITYENV_`` for
  the singularity command) sets NAME inside, over the image's own value (Apptainer user docs,
  environment_and_metadata.rst).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, field_validator, model_validator

from orchestrator.spec.yamlio import FROZEN

# A path or image word: no whitespace, quotes, shell metacharacters or control characters; and no
# ',' (both tools' mount lists are comma separated) or ':' in paths (SRC:DST separators).
_PATH = re.compile(r"/[A-Za-z0-9_./+@%=-]*")
_IMAGE = re.compile(r"[A-Za-z0-9_./:@#%+=-]+")
_MOUNT_FLAGS = re.compile(r"[a-z]+(\+[a-z]+)*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PYTHON = re.compile(r"[A-Za-z0-9_./+-]+")

_PATH_RULE = (
    "an absolute path of letters, digits and _ . / + @ % = - (no spaces, quotes, ',' or ':', "
    "which the container tools read as separators)"
)


class ContainerSpec(BaseModel):
    """Where the job step runs: a Pyxis/enroot container (``srun --container-image``) or an
    Apptainer/Singularity one (``srun apptainer exec IMAGE``). Every value reaches srun's command
    line: each is checked against a small alphabet here and shell-quoted where it is written."""

    model_config = FROZEN
    # pyxis: srun --container-image (Pyxis/enroot); apptainer: srun apptainer exec IMAGE (or singularity).
    runtime: Literal["pyxis", "apptainer"]
    # Pyxis: an enroot image URI ("nvcr.io#nvidia/pytorch:24.05-py3") or a .sqsh path;
    # Apptainer: a .sif path (or a docker:// / oras:// URI that apptainer pulls itself).
    image: str
    # Apptainer's command: "singularity" where the cluster has SingularityCE (the same exec CLI).
    command: Literal["apptainer", "singularity"] = "apptainer"
    # SRC:DST or SRC:DST:FLAGS, paths absolute; FLAGS as the tool takes them ("ro", Pyxis "ro+rprivate").
    mounts: tuple[str, ...] = ()
    # Working directory inside the container, an absolute path (Pyxis --container-workdir, Apptainer --pwd);
    # None: the tool's default.
    workdir: str | None = None
    # Names of host variables set inside over the image's values (their values stay on the host).
    env: tuple[str, ...] = ()
    # False: Pyxis --no-container-mount-home, Apptainer --no-home.
    mount_home: bool = True
    # The Python inside the image that runs `dsorch submit`'s tasks (submitit and dsorch installed).
    python: str = "python3"

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if not _IMAGE.fullmatch(v):
            raise ValueError(
                f"image {v!r} has characters an image name or path cannot have here; write an enroot "
                f"URI (nvcr.io#nvidia/pytorch:24.05-py3), a registry URI (docker://...) or a path "
                f"(letters, digits, _ . / : @ # % + = -)"
            )
        return v

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for i, m in enumerate(v):
            parts = m.split(":")
            if not (
                len(parts) in (2, 3)
                and all(_PATH.fullmatch(p) for p in parts[:2])
                and (len(parts) == 2 or _MOUNT_FLAGS.fullmatch(parts[2]))
            ):
                raise ValueError(
                    f"mounts[{i}] {m!r} is not SRC:DST or SRC:DST:FLAGS; SRC and DST are each {_PATH_RULE}, "
                    f"FLAGS lower-case words joined by '+' (ro, ro+rprivate)"
                )
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        if v is not None and not _PATH.fullmatch(v):
            raise ValueError(f"workdir {v!r} is not {_PATH_RULE}")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for name in v:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(
                    f"env entry {name!r} is not an environment variable name (letters, digits, underscore; "
                    f"not starting with a digit); list the NAMES of host variables, not NAME=value"
                )
        return v

    @field_validator("python")
    @classmethod
    def _python(cls, v: str) -> str:
        if not _PYTHON.fullmatch(v):
            raise ValueError(f"python {v!r} is not a command name or path (letters, digits, _ . / + -)")
        return v

    @model_validator(mode="after")
    def _runtime(self) -> ContainerSpec:
        if self.runtime == "pyxis" and self.command != "apptainer":
            raise ValueError(
                f"command {self.command!r} is Apptainer's command name; Pyxis runs through srun: leave "
                f"`command` out, or set runtime: apptainer"
            )
        return self


def bind_list(c: ContainerSpec, dirs: Sequence[str]) -> str:
    """The profile's mounts and each of ``dirs`` at its own path, comma separated (both tools'
    list form)."""
    return ",".join([*c.mounts, *(f"{d}:{d}" for d in dirs)])


def container_argv(
    c: ContainerSpec, gpus: bool, binds: str, quote: Callable[[str], str]
) -> tuple[list[str], list[str]]:
    """(srun options, command prefix) that run a job step's command in the container. ``binds``
    is the mount list as the caller writes it (a literal, or "$VARIABLE" in job.sbatch); every
    other value goes through ``quote`` (shlex.quote where the words reach a shell as they are,
    identity where submitit quotes them)."""
    if c.runtime == "pyxis":
        srun = [quote(f"--container-image={c.image}"), f"--container-mounts={binds}"]
        if c.workdir:
            srun.append(quote(f"--container-workdir={c.workdir}"))
        if not c.mount_home:
            srun.append("--no-container-mount-home")
        if c.env:
            srun.append(quote(f"--container-env={','.join(c.env)}"))
        return srun, []
    prefix = [c.command, "exec"]
    if gpus:  # --nv binds the host's NVIDIA driver libraries and devices; nothing to bind on CPU profiles
        prefix.append("--nv")
    if not c.mount_home:
        prefix.append("--no-home")
    prefix += ["--bind", binds]
    if c.workdir:
        prefix += ["--pwd", quote(c.workdir)]
    return [], [*prefix, quote(c.image)]


def env_exports(c: ContainerSpec) -> list[str]:
    """Host shell lines that pass ``env`` into an Apptainer container over the image's values
    (Pyxis takes the names as --container-env instead); a variable unset on the host stays unset."""
    if c.runtime == "pyxis":
        return []
    prefix = "SINGULARITYENV_" if c.command == "singularity" else "APPTAINERENV_"
    return [f'if [[ -n "${{{n}+set}}" ]]; then export {prefix}{n}="${n}"; fi' for n in c.env]


def python_command(c: ContainerSpec, gpus: bool, binds: str) -> str:
    """submitit's ``python`` (a shell command it does not quote, SlurmExecutor docstring) for a
    ``dsorch submit`` task: the image's Python, behind ``apptainer exec`` for Apptainer."""
    _, prefix = container_argv(c, gpus, shlex.quote(binds), shlex.quote)
    return " ".join([*prefix, shlex.quote(c.python)])
