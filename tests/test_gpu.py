"""GPU smoke test: the bundled entrypoint on CUDA with NCCL and bf16. Marked `gpu`; it runs only
where a CUDA device exists and never replaces the CPU tests in test_train.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator.cli import main

from .conftest import EXAMPLES

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (GPU-only smoke test)")]


def test_tiny_model_trains_on_one_gpu_in_bf16(runner, tmp_path):
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "one-gpu.yaml").write_text("extends: hgx-h200-ndr\nnodes: 1\ngpus_per_node: 1\n")
    spec = tmp_path / "tiny-bf16.yaml"
    spec.write_text((EXAMPLES / "tiny.yaml").read_text().replace("precision: fp32", "precision: bf16"))
    out = tmp_path / "plan"
    r = runner.invoke(main, ["plan", str(spec), "--cluster", "one-gpu", "--profiles-dir", str(tmp_path / "profiles"),
                             "--out", str(out)])
    assert r.exit_code == 0, r.output
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
    env.pop("DS_ACCELERATOR", None)
    res = subprocess.run([sys.executable, "-m", "orchestrator.train", "--plan", str(out), "--steps", "20",
                          "--run-dir", str(tmp_path / "run"), "--data", str(EXAMPLES / "data" / "pydoc")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["mem_kind"] == "cuda_max_allocated"
    assert records[-1]["loss"] < records[0]["loss"]
