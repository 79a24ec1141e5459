"""Latencies of dsorch's SLURM path on the loopback test cluster (scripts/slurm-test-cluster.sh).

    python scripts/bench_slurm.py [--cold]

Prints: cluster start time (cold with --cold: stop first), submit-to-running latency (dsorch
submit returns -> sacct reports RUNNING -> first training step logged), and requeue-to-resume
latency (scontrol requeue -> RUNNING again -> first step after the resume logged). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.plandir.rundir import RunDir

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "slurm-test-cluster.sh"
DSORCH = str(Path(sys.executable).with_name("dsorch"))


def sh(*args, env=None, cwd=None) -> str:
    return subprocess.run(list(map(str, args)), env=env, cwd=cwd, capture_output=True, text=True, check=True).stdout


def sacct_state(job: str, env) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-j", job, "-o", "State"], env=env, capture_output=True,
                         text=True).stdout.split()
    return out[0].rstrip("+") if out else "UNKNOWN"


def last_step(run_dir: Path) -> int:
    f = RunDir(run_dir).metrics
    if not f.exists():
        return 0
    lines = [x for x in f.read_text().splitlines() if x.strip()]
    return json.loads(lines[-1])["step"] if lines else 0


def wait(pred, timeout=600, poll=0.5):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic()
        time.sleep(poll)
    raise SystemExit("timed out")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cold", action="store_true", help="stop the cluster first and time a cold start")
    args = ap.parse_args()
    if args.cold:
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True)
    t0 = time.monotonic()
    sh("bash", SCRIPT, "start")
    print(f"cluster start ({'cold' if args.cold else 'warm'}): {time.monotonic() - t0:.1f} s")
    conf = sh("bash", SCRIPT, "env").strip().split("=", 1)[1].strip("'\"")
    env = dict(os.environ, SLURM_CONF=conf, DSORCH_PROFILES_DIR=str(ROOT / "tests" / "profiles"),
               DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as exp:
        sh(DSORCH, "plan", ROOT / "examples" / "tiny.yaml", "--cluster", "loopback", "--out", "plans/p", "--tp", "2",
           "--pp", "2", "--mbs", "4", env=env, cwd=exp)
        t_submit = time.monotonic()
        out = sh(DSORCH, "submit", "plans/p", "--steps", "400", "--extend-schedule", "--save-interval", "20", env=env, cwd=exp)
        t_returned = time.monotonic()
        job = out.split()[2]
        rec = json.loads(sh(DSORCH, "status", "--json", env=env, cwd=exp))[-1]
        run_dir = Path(rec["run_dir"])
        t_running = wait(lambda: sacct_state(job, env) == "RUNNING")
        t_step = wait(lambda: last_step(run_dir) >= 1)
        print(f"submit: dsorch submit returned in {t_returned - t_submit:.1f} s; RUNNING in sacct after "
              f"{t_running - t_returned:.1f} s; first training step after {t_step - t_returned:.1f} s "
              f"(4 CPU ranks: DeepSpeed start-up dominates)")
        wait(lambda: last_step(run_dir) >= 25)
        before = last_step(run_dir)
        t_req = time.monotonic()
        sh("scontrol", "requeue", job, env=env)
        wait(lambda: sacct_state(job, env) != "RUNNING", poll=0.2)
        t_running2 = wait(lambda: sacct_state(job, env) == "RUNNING")
        t_start2 = wait(lambda: len(RunDir(run_dir).starts.read_text().splitlines()) >= 2, poll=0.1)
        at_restart = last_step(run_dir)
        t_step2 = wait(lambda: last_step(run_dir) > at_restart, poll=0.1)
        print(f"requeue: {before} steps done; RUNNING again {t_running2 - t_req:.1f} s after scontrol requeue, job "
              f"restarted at {t_start2 - t_req:.1f} s, first new step (resumed from the checkpoint) at "
              f"{t_step2 - t_req:.1f} s. SLURM waits cred_expire (10 s here) plus a scheduler pass before "
              f"restarting a requeued job")
        sh(DSORCH, "cancel", job, env=env, cwd=exp)


if __name__ == "__main__":
    main()
