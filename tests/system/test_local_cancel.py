"""`dsorch cancel` of a job of the local executor stops its ranks: the job id is the pid of the
shell submitit starts its controller under, and the cancel must reach the controller below it."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from ..conftest import EXAMPLES
from .harness import dsorch

# A paced run, so mostly waiting: scripts/test.sh runs it beside the rest.
pytestmark = pytest.mark.jobs

PINS = ("--gpus-per-node", "2", "--tp", "1", "--pp", "1", "--dp", "2", "--zero", "1", "--mbs", "4",
        "--recompute", "none", "--no-sp")
STEPS = 300  # at a second a step (below), minutes more than the test waits


# Each step paced to a second (the entrypoint's test hook): the job is still training when cancelled.
PACED = {"DSORCH_TEST_MIN_STEP_SECONDS": "1"}


def _dsorch(cwd, *args) -> subprocess.CompletedProcess:
    return dsorch(cwd, *args, env=PACED)


def _training(run_dir: Path) -> list[int]:
    """The entrypoint processes training into ``run_dir``."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"orchestrator.train" in words and str(run_dir).encode() in words:
            pids.append(int(cmdline.parent.name))
    return pids


def test_cancel_stops_a_local_jobs_ranks(tmp_path):
    _dsorch(tmp_path, "plan", EXAMPLES / "tiny.yaml", "--cluster", "local", "--out", "plans/t", *PINS)
    r = _dsorch(tmp_path, "submit", "plans/t", "--steps", STEPS, "--extend-schedule")
    job = next(ln for ln in r.stdout.splitlines() if ln.startswith("submitted job ")).split()[2]

    def record() -> dict:
        return next(x for x in json.loads(_dsorch(tmp_path, "status", "--json").stdout) if x["job_id"] == job)

    deadline = time.monotonic() + 300
    while (record()["last_step"] or 0) < 1:
        assert time.monotonic() < deadline, f"job {job} never trained a step: {record()}"
        time.sleep(1)
    run_dir = Path(record()["run_dir"])
    assert len(_training(run_dir)) == 2
    assert f"cancelled job {job}" in _dsorch(tmp_path, "cancel", job).stdout
    deadline = time.monotonic() + 20
    while _training(run_dir):
        assert time.monotonic() < deadline, f"ranks {_training(run_dir)} still train after the cancel"
        time.sleep(0.5)
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert record()["state"] == "CANCELLED" and max(steps) < STEPS, steps
