"""The data a run trains on is part of the run, on real CPU ranks (DeepSpeed over gloo, 2 ranks):
each checkpoint's manifest records the data's fingerprint, a resume on other data is refused in one
paragraph with exit code 2 and continues only with --switch-data (recorded in the next manifest),
and `dsorch submit --resume` trains on the first job's --data again.

Cost on 2 cores: about a minute and a half (five short runs of the tiny model)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import EXAMPLES, ROOT
from .harness import clean_env, dsorch

CORPUS = EXAMPLES / "data" / "pydoc"
PINS = ("--gpus-per-node", "2", "--tp", "1", "--pp", "1", "--dp", "2", "--zero", "1", "--mbs", "4",
        "--recompute", "none", "--no-sp")


def _ranks(plan_dir: Path, run_dir: Path, *args: str) -> tuple[list[int], str, str]:
    """Both ranks of the entrypoint started by hand (torchrun would turn a rank's exit code 2 into
    its own 1): their exit codes, rank 0's stdout and both ranks' stderr."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "orchestrator.train", "--plan", str(plan_dir), "--run-dir", str(run_dir), *args]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=clean_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                                                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
             for r in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    return [p.returncode for p in procs], outs[0][0], outs[0][1] + outs[1][1]


def _manifest(run_dir: Path, step: int) -> dict:
    return json.loads((run_dir / "checkpoints" / f"step{step:08d}" / "dsorch_manifest.json").read_text())


@pytest.fixture
def plan_dir(tmp_path) -> Path:
    dsorch(tmp_path, "plan", EXAMPLES / "tiny.yaml", "--cluster", "local", "--out", "plans/t", *PINS)
    return tmp_path / "plans" / "t"


def test_a_resume_on_other_data_is_refused_unless_switched(tmp_path, plan_dir):
    run = tmp_path / "run"
    rcs, out, err = _ranks(plan_dir, run, "--steps", "2", "--data", str(CORPUS))
    assert rcs == [0, 0], out + err
    assert f"data: {CORPUS} (" in out and "(from --data)" in out
    data = _manifest(run, 2)["data"]
    assert data["kind"] == "files" and [d["prefix"] for d in data["datasets"]] == [str(CORPUS)]
    assert data["datasets"][0]["bin_bytes"] == CORPUS.with_suffix(".bin").stat().st_size

    # The plan names no training.data: without --data this start would train on synthetic tokens.
    rcs, out, err = _ranks(plan_dir, run, "--steps", "4")
    assert rcs == [2, 2], out + err
    paragraph = next(line for line in err.splitlines() if line.startswith("orchestrator.train: "))
    assert f"{run / 'checkpoints' / 'step00000002'} was trained on {CORPUS}; split 969,30,1" in paragraph
    assert "this start would train on synthetic tokens (vocab 256, seed" in paragraph
    assert "pass --switch-data" in paragraph and "Traceback" not in err
    assert sorted(p.name for p in (run / "checkpoints").glob("step*")) == ["step00000002"]

    rcs, out, err = _ranks(plan_dir, run, "--steps", "4", "--switch-data")
    assert rcs == [0, 0], out + err
    assert "switching data on purpose (--switch-data) at step 2:" in out
    man = _manifest(run, 4)
    assert man["data"]["kind"] == "synthetic" and man["data_switched"]["from"] == data
    assert man["data_switched"]["at_step"] == 2
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "kind" not in r]
    assert steps == [1, 2, 3, 4]


def test_submit_resume_trains_on_the_first_job_s_data(tmp_path, plan_dir):
    r = dsorch(tmp_path, "submit", "plans/t", "--steps", "2", "--data", CORPUS, "--wait")
    assert "COMPLETED" in r.stdout, r.stdout + r.stderr
    r = dsorch(tmp_path, "submit", "plans/t", "--resume", "--steps", "4", "--wait", check=False)
    assert r.returncode == 0 and "COMPLETED" in r.stdout, r.stdout + r.stderr
    assert f"data: {CORPUS} (job " in r.stderr
    jobs = json.loads(dsorch(tmp_path, "status", "--json").stdout)
    run = Path(jobs[-1]["run_dir"])
    assert [j["state"] for j in jobs] == ["COMPLETED", "COMPLETED"] and jobs[0]["run_dir"] == str(run)
    assert [j["data"] for j in jobs] == [str(CORPUS), str(CORPUS)]  # the registry keeps it for requeues too
    data = _manifest(run, 4)["data"]
    assert data["kind"] == "files" and data["datasets"][0]["prefix"] == str(CORPUS)
    assert "data_switched" not in _manifest(run, 4)
