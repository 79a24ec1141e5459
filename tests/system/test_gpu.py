"""GPU smoke test: the bundled entrypoint on CUDA with NCCL and bf16. Marked `gpu`; it runs only
where a CUDA device exists and never replaces the CPU tests in test_train.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator.cli.main import main

from ..conftest import EXAMPLES

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
    records = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if "kind" not in r]
    assert records[-1]["mem_kind"] == "cuda_max_allocated"
    assert records[-1]["loss"] < records[0]["loss"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_rms_norm_on_cuda_matches_the_cpu_math(dtype):
    """On CUDA the entrypoint's RMSNorm runs torch's fused kernels (model._FUSED_RMS_NORM); the same
    values and gradients as the element-wise math CPU ranks run, within the dtype's rounding."""
    from orchestrator.train.model.decoder import _FUSED_RMS_NORM, NORM_EPS, _RMSNorm

    assert _FUSED_RMS_NORM, "this torch has no fused RMSNorm: the GPU path falls back to the math"
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    x, w, up = (torch.randn(shape, generator=g).to(dt) for shape in ((128, 2, 512), (512,), (128, 2, 512)))
    got, want = {}, {}
    for device, out in (("cuda", got), ("cpu", want)):
        xd, wd = x.to(device).requires_grad_(), w.to(device).requires_grad_()
        y = _RMSNorm.apply(xd, wd, NORM_EPS)
        (y.float() * up.to(device).float()).sum().backward()
        out.update(y=y.detach().cpu().float(), dx=xd.grad.cpu().float(), dw=wd.grad.cpu().float())
    tol = 1e-5 if dtype == "float32" else 2e-2
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=tol, atol=tol * (16 if k == "dw" else 1))
