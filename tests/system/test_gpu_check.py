"""scripts/gpu_check.sh, the one prepared GPU run: its --dry-run here on CPU does everything but the
GPU (plans pinned per layout, the entrypoint, measurement, the records file `dsorch calibrate`
reads, the table). The GPU run itself is marked `gpu` and skipped without one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(tmp_path, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    """scripts/gpu_check.sh --dry-run, 2 steps a layout, as a clean environment runs it."""
    out = tmp_path / "records.yaml"
    p = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--steps", "2", "--out", str(out),
                        *extra],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHON": sys.executable,
                            "HOME": str(tmp_path)})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p, out


def test_gpu_check_dry_run_measures_every_layout_and_writes_calibrate_records(tmp_path):
    p, out = _dry_run(tmp_path)
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary == {"records": 6, "failures": []}
    assert "the records file reads back as 6 calibration rows" in p.stdout
    doc = yaml.safe_load(out.read_text())
    layouts = {(r["layout"]["micro_batch_size"], r["layout"]["recompute"], r["layout"]["zero_stage"])
               for r in doc["records"]}
    assert layouts == {(1, "none", 1), (2, "none", 1), (4, "none", 1), (4, "selective", 1), (4, "full", 1),
                       (4, "none", 0)}
    assert all(r["step_time_s"] > 0 and r["peak_mem_gib"] > 0 for r in doc["records"])
    assert "predicted next to measured" in out.read_text()


def test_gpu_check_70b_width_shape_dry_run(tmp_path):
    """--shape llama3-70b-2l, the check prepared for the next GPU (two layers at Llama 3 70B's width):
    its three layouts and global batch, end to end on a CPU rank."""
    p, out = _dry_run(tmp_path, "--shape", "llama3-70b-2l")
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"records": 3, "failures": []}
    records = yaml.safe_load(out.read_text())["records"]
    assert {(r["layout"]["micro_batch_size"], r["layout"]["recompute"], r["layout"]["zero_stage"]) for r in records} == \
        {(1, "none", 1), (1, "full", 1), (2, "none", 1)}
    assert {r["training"]["global_batch_size"] for r in records} == {4}


torch = pytest.importorskip("torch")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (GPU-only check)")
def test_gpu_check_on_the_gpu(tmp_path):
    out = tmp_path / "records.yaml"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--steps", "6", "--out", str(out),
                        "--budget", "300"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    recs = yaml.safe_load(out.read_text())["records"]
    assert recs and all(r["mem_kind"] == "cuda_max_allocated" for r in recs)
