"""What the system tests share to run dsorch and the entrypoint as processes: the environment they
start from and the `dsorch` console script. One home, so that every test's processes see the same
machine (issue 36: five copies of `_dsorch` and three of `_env` had drifted apart)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# The console script installed next to this interpreter: the one a user's `pip install` makes.
DSORCH = str(Path(sys.executable).with_name("dsorch"))

# What a rank, a SLURM task or a dsorch command would take from whatever ran the tests: the rank
# environment (torch.distributed's env:// and SLURM's), a plan directory or cluster chosen by the
# caller (DSORCH_PLAN_DIR, DSORCH_CLUSTER) and a user's profiles (DSORCH_PROFILES_DIR).
INHERITED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS",
             "DSORCH_PLAN_DIR", "DSORCH_CLUSTER", "DSORCH_PROFILES_DIR")


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without INHERITED, for processes on this CPU machine: DeepSpeed on the CPU, one
    OpenMP thread per process (the ranks share two cores), unbuffered output, and `torchrun` (which
    launch.sh calls by name) the one next to this interpreter; then ``extra``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", PYTHONUNBUFFERED="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for k in INHERITED:
        env.pop(k, None)
    return env | extra


def dsorch(cwd, *args, env: dict[str, str] | None = None, check: bool = True,
           timeout: float = 900) -> subprocess.CompletedProcess:
    """`dsorch ARGS...` in ``cwd`` with clean_env() plus ``env``; with ``check``, exit 0 or the
    test fails showing the command and both streams."""
    r = subprocess.run([DSORCH, *map(str, args)], cwd=cwd, env=clean_env(**(env or {})), capture_output=True,
                       text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"dsorch {' '.join(map(str, args))}:\n{r.stdout}\n{r.stderr}"
    return r
