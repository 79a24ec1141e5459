"""A `--runtime megatron` plan through `dsorch submit --cluster local`: one task runs the plan's
launch.sh, whose torchrun starts 2 ranks of a FAKE pretrain_gpt.py (tests/fakes/megatron: Megatron-LM
needs CUDA; the fake prints Megatron-LM's own iteration and memory lines and keeps its tracker file).
SIGTERM (preemption) stops it with a checkpoint, `submit --resume` continues from Megatron-LM's tracker to
COMPLETED, and status, logs and calibrate read the run from Megatron-LM's lines: every iteration once.

Cost on 2 cores: about a minute (two starts of torchrun with 2 ranks)."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from ..conftest import EXAMPLES, ROOT
from .harness import dsorch

# A FAKE pretrain_gpt.py paced per iteration, so mostly waiting: scripts/test.sh runs it beside the rest.
pytestmark = pytest.mark.jobs

FAKE = ROOT / "tests" / "fakes" / "megatron"
PINS = ("--gpus-per-node", "2", "--tp", "1", "--pp", "1", "--dp", "2", "--zero", "1", "--mbs", "4",
        "--recompute", "none", "--no-sp")
ITERS = 30  # examples/tiny.yaml's length


ENV = {"MEGATRON_LM": str(FAKE), "FAKE_MEGATRON_ITERATION_SECONDS": "0.4",
       "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # torchrun, which launch.sh runs


def _dsorch(cwd, *args):
    return dsorch(cwd, *args, env=ENV)


def _status(cwd) -> list[dict]:
    return json.loads(_dsorch(cwd, "status", "--json").stdout)


def _pids_naming(*words: str) -> list[int]:
    """Processes whose command line has each of ``words`` as one of its arguments, or in one."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if all(any(w in a for a in args) for w in words):
            pids.append(int(proc.name))
    return pids


def _until(what, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what.__doc__ or what}")


def test_a_megatron_plan_submits_cancels_resumes_and_reports_from_megatron_lines(tmp_path):
    _dsorch(tmp_path, "plan", EXAMPLES / "tiny.yaml", "--cluster", "local", "--runtime", "megatron",
            "--out", "plans/m", *PINS)
    _dsorch(tmp_path, "submit", "plans/m")
    run = Path(_status(tmp_path)[0]["run_dir"])
    metrics = run / "metrics.jsonl"

    def some_steps():
        """the first 5 iterations in metrics.jsonl"""
        return metrics.is_file() and len(metrics.read_text().splitlines()) >= 5

    _until(some_steps)
    # Preempted: SIGTERM to the job's task, as SLURM sends it; the task turns it into Megatron-LM's
    # --exit-signal for the ranks.
    folder = tmp_path / ".dsorch" / "jobs" / "m"
    (task,) = _pids_naming("submitit.core._submit", str(folder))
    os.kill(task, signal.SIGTERM)
    _until(lambda: not _pids_naming(str(run / "checkpoints")))  # the ranks checkpoint on the passed-on SIGUSR2 and exit
    stopped_at = int((run / "checkpoints" / "latest_checkpointed_iteration.txt").read_text())
    assert 5 <= stopped_at < ITERS

    _until(lambda: not _pids_naming("submitit.core._submit", str(folder)))  # the stopped job's end

    def ended():
        """`dsorch status` to see the stopped job's end"""
        return _status(tmp_path)[0]["state"] not in ("PENDING", "RUNNING")

    _until(ended)
    job = _status(tmp_path)[0]
    assert job["last_step"] == stopped_at and job["last_loss"] == pytest.approx(10 / (1 + stopped_at / 10), abs=1e-4)

    r = _dsorch(tmp_path, "submit", "plans/m", "--resume", "--wait")
    assert f"COMPLETED at step {ITERS}, loss 2.5000" in r.stdout, r.stdout + r.stderr  # the fake's 10 / (1 + 30/10)
    jobs = _status(tmp_path)
    assert jobs[1]["state"] == "COMPLETED" and jobs[1]["run_dir"] == str(run)
    assert jobs[1]["last_step"] == ITERS and jobs[1]["last_loss"] == 2.5
    # Every iteration once, in the fake's own count and in the records made from Megatron-LM's lines.
    trained = re.findall(r"^iteration (\d+)$", (run / "checkpoints" / "iterations.log").read_text(), re.M)
    assert [int(i) for i in trained] == list(range(1, ITERS + 1))
    steps = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, ITERS + 1))
    assert all(s["step_time_s"] > 0 for s in steps) and steps[-1]["mem_kind"] == "cuda_max_allocated", steps[-1]
    # report_memory prints after the first iteration's line, in each start: the records after it carry it.
    # (The first line of a start may come before it: the ranks print the two kinds of lines.)
    assert all("peak_mem_gib" in s for s in steps[stopped_at + 1:])

    log = _dsorch(tmp_path, "logs", jobs[1]["job_id"]).stdout
    assert re.search(rf"iteration +{ITERS}/ +{ITERS} \| consumed samples: +\d+ \| elapsed time per iteration", log)
    assert "[Rank 0] (after " in log and "memory (MB) | allocated:" in log

    r = _dsorch(tmp_path, "calibrate", run, "--plan", "plans/m", "--cluster", "local")
    assert "tp1 pp1 dp2 zero1 mbs4" in r.stderr and "measured" in r.stderr and "efficiency:" in r.stdout, r.stderr
