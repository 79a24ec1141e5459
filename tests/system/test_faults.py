"""Faults in the middle of a run, on real CPU ranks: a rank killed mid-step ends the job FAILED,
`dsorch status` names the rank and the signal, and `dsorch submit --resume` continues from the
newest intact checkpoint with every step exactly once. (The SLURM controller being unreachable
during a submit is in tests/system/test_slurm.py, against a real sbatch.)"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from ..conftest import EXAMPLES, load_script
from .harness import dsorch

# Paced steps (the entrypoint's test hook), so mostly waiting: scripts/test.sh runs it beside the rest.
pytestmark = pytest.mark.jobs

STEPS = 60
# The rank process finder of the soak under faults (the ranks are processes of this machine).
rank_pid = load_script("bench_chaos").rank_pid


# Paced so that the kill lands mid-run on any machine (the entrypoint's test hook).
PACED = {"DSORCH_TEST_MIN_STEP_SECONDS": "0.3"}


def _dsorch(cwd, *args):
    return dsorch(cwd, *args, env=PACED)


def _steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:  # the line rank 0 is writing right now
            break
        if "kind" not in rec:  # a step's record, not an evaluation's
            steps.append(rec["step"])
    return steps


def test_a_rank_killed_mid_step_fails_the_job_and_resume_continues(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text((EXAMPLES / "tiny.yaml").read_text().replace("train_tokens: 30720", f"steps: {STEPS}"))
    _dsorch(tmp_path, "plan", spec, "--cluster", "local", "--out", "plans/t", "--tp", "1", "--pp", "1",
            "--zero", "1", "--mbs", "4", "--recompute", "none", "--no-sp")
    r = _dsorch(tmp_path, "submit", "plans/t", "--save-interval", "4")
    job = next(line for line in r.stdout.splitlines() if line.startswith("submitted job ")).split()[2]
    run_dir = Path(json.loads(_dsorch(tmp_path, "status", "--json").stdout)[0]["run_dir"])

    deadline = time.monotonic() + 300
    pid = None
    while time.monotonic() < deadline:
        pid = rank_pid(run_dir, 2)
        if pid is not None and len(_steps(run_dir)) >= 9:
            break
        time.sleep(0.2)
    assert pid is not None and len(_steps(run_dir)) >= 9, (
        f"the run did not get going: rank 2 pid {pid}, steps {_steps(run_dir)[-3:]}, run dir {run_dir}")
    os.kill(pid, signal.SIGKILL)

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        rec = json.loads(_dsorch(tmp_path, "status", "--json").stdout)[0]
        if rec["state"] not in ("RUNNING", "PENDING", "SUBMITTED"):
            break
        time.sleep(1)
    assert rec["state"] == "FAILED", rec
    assert "rank 2:" in rec["error"] and "was killed by SIGKILL" in rec["error"], rec["error"][:2000]
    text = _dsorch(tmp_path, "status").stdout
    assert "FAILED" in text and "rank 2" in text

    done_before = _steps(run_dir)[-1]
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").glob("step*"))
    assert checkpoints and checkpoints[-1] <= f"step{done_before:08d}"
    r = _dsorch(tmp_path, "submit", "plans/t", "--resume", "--save-interval", "4", "--wait")
    assert "COMPLETED" in r.stdout, r.stdout + r.stderr
    assert _steps(run_dir) == list(range(1, STEPS + 1))  # nothing lost, nothing repeated
    recs = json.loads(_dsorch(tmp_path, "status", "--json").stdout)
    assert [x["state"] for x in recs] == ["FAILED", "COMPLETED"] and recs[1]["run_dir"] == str(run_dir)
    assert job == recs[0]["job_id"]
