"""dsorch as a new user meets it: the console script and the README's quick start run as processes
on a machine without SLURM (its binaries hidden from PATH)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ..conftest import ROOT

# SLURM's client commands and daemons, and munge's: what a machine without SLURM lacks.
_SLURM_TOOL = re.compile(r"s(batch|run|control|acct|cancel|queue|info|alloc|acctmgr|attach|bcast|crontab|diag|prio"
                         r"|report|share|stat|trigger|view)|slurm.*|munge.*|unmunge")


def path_without_slurm(tmp_path: Path) -> str:
    """A PATH with every program of the current PATH except SLURM's and munge's: one directory of
    symlinks, so that /usr/bin's python and coreutils stay while its sbatch goes."""
    bin_dir = tmp_path / "no-slurm-bin"
    bin_dir.mkdir()
    dirs = [str(Path(sys.executable).parent), *os.environ.get("PATH", "").split(os.pathsep)]
    for d in dirs + ["/usr/sbin", "/sbin"]:
        if not d or not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            link = bin_dir / entry.name
            try:
                if _SLURM_TOOL.fullmatch(entry.name) or link.is_symlink():
                    continue
                if entry.is_file() and os.access(entry.path, os.X_OK):
                    link.symlink_to(entry.path)
            except OSError:  # a dangling or looping link (Debian's /usr/bin/X11 can loop): not a program
                continue
    path = str(bin_dir)
    for tool in ("sbatch", "srun", "sacct", "scancel", "scontrol"):
        assert shutil.which(tool, path=path) is None, tool
    return path


def _run(cmd, env, cwd, timeout=900):
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_without_slurm_everything_but_submitting_works(tmp_path):
    """A machine with no SLURM binaries: plan, submit --dry-run, validate, status, logs work;
    submitting to a SLURM profile and cancelling a SLURM job say what is missing, exit 2."""
    env = dict(os.environ, PATH=path_without_slurm(tmp_path), DS_ACCELERATOR="cpu")
    env.pop("DSORCH_CLUSTER", None)
    env.pop("DSORCH_PROFILES_DIR", None)
    dsorch = [str(Path(sys.executable).with_name("dsorch"))]
    exp = tmp_path / "exp"
    exp.mkdir()
    assert _run([*dsorch, "init", "--cluster", "dgx16"], env, exp).returncode == 0
    r = _run([*dsorch, "plan", str(ROOT / "examples" / "llama3-8b.yaml"), "--nodes", "2"], env, exp)
    assert r.returncode == 0, r.stderr
    r = _run([*dsorch, "submit", "--dry-run"], env, exp)
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --nodes=2" in r.stdout and "srun --unbuffered" in r.stdout
    assert _run([*dsorch, "validate", "plans/llama3-8b-dgx16-2n"], env, exp).returncode == 0
    r = _run([*dsorch, "submit"], env, exp)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    msg = " ".join(r.stderr.split())
    assert "sbatch and srun are not on PATH" in msg and "--dry-run" in msg and "--cluster local" in msg
    # doctor has no --dry-run, so its message names none.
    r = _run([*dsorch, "doctor", "--nodes", "2"], env, exp)
    msg = " ".join(r.stderr.split())
    assert r.returncode == 2 and "sbatch and srun are not on PATH" in msg and "--dry-run" not in msg, r.stderr
    # A SLURM job recorded elsewhere (the experiment directory copied from a login node).
    from orchestrator.run.registry import Registry, now_utc

    reg = Registry(exp)
    with reg.reserve("plans/llama3-8b-dgx16", False) as (insert, update):
        insert(job_id="4242", executor="slurm", cluster="dgx16", plan_dir="plans/llama3-8b-dgx16", plan_sha256="x",
               submitted_at=now_utc(), state="RUNNING", run_dir=str(exp / "runs" / "r"), log_dir=str(exp / "logs"))
    r = _run([*dsorch, "status", "--json"], env, exp)
    assert r.returncode == 0 and json.loads(r.stdout)[0]["state"] == "RUNNING"
    r = _run([*dsorch, "status"], env, exp)
    assert r.returncode == 0 and "sacct is not on PATH here" in " ".join(r.stdout.split())
    r = _run([*dsorch, "logs", "4242"], env, exp)
    assert r.returncode == 2 and "no log for rank 0" in r.stderr and "Traceback" not in r.stderr
    r = _run([*dsorch, "cancel", "4242"], env, exp)
    assert r.returncode == 2 and "needs scancel, which is not on PATH" in r.stderr and "Traceback" not in r.stderr


def test_quickstart_runs_on_a_machine_without_slurm(tmp_path):
    """The README's first quick-start command, verbatim, with SLURM's binaries hidden from PATH."""
    env = {"HOME": os.environ.get("HOME", str(tmp_path)), "PATH": path_without_slurm(tmp_path),
           "DSORCH_QUICKSTART_DIR": str(tmp_path / "quickstart"), "LANG": "C.UTF-8"}
    for key in ("TORCH_EXTENSIONS_DIR", "TMPDIR"):
        if key in os.environ:
            env[key] = os.environ[key]
    r = _run(["bash", str(ROOT / "scripts" / "quickstart.sh")], env, tmp_path)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "#SBATCH --nodes=16" in r.stdout
    assert re.search(r"job \d+: COMPLETED at step 30", r.stdout), r.stdout[-2000:]
    assert re.search(r"^step +30 \| loss", r.stdout, re.M)
    assert (tmp_path / "quickstart" / "plans" / "llama3-70b-dgx16" / "job.sbatch").is_file()
