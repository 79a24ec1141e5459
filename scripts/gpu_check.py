#!/usr/bin/env python3
"""One GPU, one run: dsorch's entrypoint on a ~1B Llama-shaped model, measured against dsorch's
predictions for the same layouts. Needs nothing from the network (synthetic tokens).

    scripts/gpu_check.sh                       # on a machine with one CUDA GPU (H200 profile)
    scripts/gpu_check.sh --dry-run             # everything but the GPU: a small model on CPU ranks
    scripts/gpu_check.py --shape llama3-70b-2l # two layers at Llama 3 70B's width: the GEMMs a 70B plan runs

For each layout one GPU allows (micro-batch 1/2/4, recompute none/selective/full, ZeRO 0/1):
``dsorch plan`` with the layout pinned on a one-GPU profile, the entrypoint for a few steps, then
the steady step time (median after the warm-up), MFU, peak allocated and reserved memory, next to
the plan's predictions. Writes a records file in `dsorch calibrate`'s format (records:, one per
layout, with the spec inline) and prints a table. The GPU tests (`pytest -m gpu`) run first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from orchestrator.plandir.rundir import RunDir

ROOT = Path(__file__).resolve().parent.parent

# ~0.9B parameters, Llama-shaped (RMSNorm, GQA, SwiGLU, RoPE, untied): 16 x 2048, ffn 5632,
# 16 heads over 8 kv heads, a 32000 vocabulary (Llama 2's), 2048 tokens.
GPU_MODEL = {"num_layers": 16, "hidden_size": 2048, "ffn_hidden_size": 5632, "num_attention_heads": 16,
             "num_kv_heads": 8, "vocab_size": 32000, "activation": "swiglu", "tied_embeddings": False,
             "max_position_embeddings": 2048}
GPU_SEQ = 2048
# The dry run's stand-in: the same shape family, small enough for a CPU rank in seconds.
CPU_MODEL = {**GPU_MODEL, "num_layers": 2, "hidden_size": 128, "ffn_hidden_size": 352, "num_attention_heads": 4,
             "num_kv_heads": 2, "vocab_size": 512, "max_position_embeddings": 128}
CPU_SEQ = 128

# (micro-batch, recompute, ZeRO stage): the micro-batch sweep at ZeRO-1 without recomputation,
# the recompute levels at the largest micro-batch, and ZeRO-0 (bf16 ZeRO-0 takes one micro-batch
# per step: DeepSpeed refuses fp32 accumulation there, rules.zero_stages).
LAYOUTS = [(1, "none", 1), (2, "none", 1), (4, "none", 1), (4, "selective", 1), (4, "full", 1), (4, "none", 0)]
GLOBAL_BATCH = 8  # sequences per step at ZeRO-1; ZeRO-0 runs one micro-batch per step

# --shape llama3-70b-2l: two layers of Llama 3 70B at its width (hidden 8192, ffn 28672, 64 heads
# over 8 kv heads, 128K vocabulary, 4K tokens; "The Llama 3 Herd of Models" Table 3): the GEMM
# shapes a 70B plan runs, on one GPU (3.7B parameters, ~67 GB of ZeRO-1 states at dp 1).
SHAPES = {
    "1b": (GPU_MODEL, GPU_SEQ, LAYOUTS, GLOBAL_BATCH),
    "llama3-70b-2l": (
        {**GPU_MODEL, "num_layers": 2, "hidden_size": 8192, "ffn_hidden_size": 28672, "num_attention_heads": 64,
         "num_kv_heads": 8, "vocab_size": 128256, "max_position_embeddings": 4096},
        4096, [(1, "none", 1), (1, "full", 1), (2, "none", 1)], 4),
}


def one_gpu_profile(dry_run: bool) -> str:
    if dry_run:
        return "extends: local\nname: gpu-check-cpu\nnodes: 1\ngpus_per_node: 1\n"
    return "extends: hgx-h200-ndr\nname: gpu-check-h200\nnodes: 1\ngpus_per_node: 1\n"


def spec_text(dry_run: bool, mbs: int, zero: int, shape: str = "1b") -> str:
    model, seq, _, global_batch = SHAPES[shape]
    model, seq = (CPU_MODEL, CPU_SEQ) if dry_run else (model, seq)
    doc = {"name": f"gpu-check-{'cpu' if dry_run else shape}",
           "source": "scripts/gpu_check.py: a Llama-shaped model sized for one GPU",
           "model": model,
           "training": {"seq_length": seq, "global_batch_size": mbs if zero == 0 else global_batch,
                        "precision": "bf16", "steps": 1000, "flash_attention": True,
                        "optimizer": {"warmup_steps": 10}}}
    return yaml.safe_dump(doc, sort_keys=False)


def plan(work: Path, profiles: Path, dry_run: bool, mbs: int, rc: str, zero: int, shape: str = "1b") -> Path:
    from click.testing import CliRunner

    from orchestrator.cli.main import main

    spec = work / f"spec-mbs{mbs}-z{zero}.yaml"
    spec.write_text(spec_text(dry_run, mbs, zero, shape))
    out = work / f"plan-mbs{mbs}-{rc}-z{zero}"
    r = CliRunner().invoke(main, ["plan", str(spec), "--cluster", "gpu-check-cpu" if dry_run else "gpu-check-h200",
                                  "--profiles-dir", str(profiles), "--out", str(out), "--tp", "1", "--pp", "1",
                                  "--dp", "1", "--mbs", str(mbs), "--recompute", rc, "--zero", str(zero), "--no-sp"])
    if r.exit_code:
        raise SystemExit(f"dsorch plan failed for mbs {mbs} {rc} ZeRO-{zero}:\n{r.output}")
    return out


def train(plan_dir: Path, run_dir: Path, steps: int, dry_run: bool, timeout: float) -> tuple[int, str]:
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + os.getpid() % 300))
    if dry_run:
        env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    else:
        env.pop("DS_ACCELERATOR", None)
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    cmd = [sys.executable, "-m", "orchestrator.train", "--plan", str(plan_dir), "--steps", str(steps),
           "--no-save", "--run-dir", str(run_dir)]
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s"
    return p.returncode, (p.stdout + p.stderr)[-2000:]


def measure(plan_dir: Path, run_dir: Path, warmup: int) -> dict:
    from orchestrator.calibrate.records import read_steps, run_record
    from orchestrator.plandir.reader import load_plan_dir

    recs = read_steps(RunDir(run_dir).metrics)
    steady = recs[warmup:] or recs
    pd = load_plan_dir(plan_dir)
    record = run_record(RunDir(run_dir).metrics, plan_dir)
    return {
        "layout": pd.layout.short(),
        "measured_step_s": statistics.median(r["step_time_s"] for r in steady),
        "predicted_step_s": float(pd.doc.predicted["step_time_s"]),
        "measured_mfu": statistics.median(r["mfu"] for r in steady) if steady[0].get("mfu") is not None else None,
        "predicted_mfu": float(pd.doc.predicted["mfu"]),
        "peak_allocated_gib": max(r["peak_mem_gib"] for r in recs),
        "peak_reserved_gib": max((r.get("peak_reserved_gib") or 0.0) for r in recs) or None,
        "predicted_gib": float(pd.doc.memory_gib_per_gpu["total"]),
        "mem_kind": recs[-1].get("mem_kind"),
        "record": record.model_dump(mode="json", exclude_none=True),
    }


def table(rows: list[dict]) -> str:
    head = f"{'layout':44s} {'step s':>8s} {'pred s':>8s} {'err':>7s} {'MFU':>6s} {'pred':>6s} " \
           f"{'alloc':>7s} {'resv':>7s} {'pred GiB':>8s}"
    out = [head]
    for r in rows:
        if "failure" in r:
            out.append(f"{r['layout']:44s} {r['failure']}")
            continue
        err = r["predicted_step_s"] / r["measured_step_s"] - 1
        mfu = "-" if r["measured_mfu"] is None else f"{100 * r['measured_mfu']:.1f}%"
        resv = "-" if r["peak_reserved_gib"] is None else f"{r['peak_reserved_gib']:.2f}"
        out.append(f"{r['layout']:44s} {r['measured_step_s']:8.4f} {r['predicted_step_s']:8.4f} {100 * err:+6.1f}% "
                   f"{mfu:>6s} {100 * r['predicted_mfu']:5.1f}% {r['peak_allocated_gib']:7.2f} {resv:>7s} "
                   f"{r['predicted_gib']:8.2f}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="no GPU: a small model on one CPU rank, 3 steps")
    ap.add_argument("--steps", type=int, default=None, help="steps per layout (default 12 on GPU, 3 dry)")
    ap.add_argument("--out", type=Path, default=None,
                    help="records file (default docs/measurements/gpu-check-<gpu>-<date>.yaml; dry run: a temp file)")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for all layouts; the rest are skipped")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b",
                    help="the model and its layouts: 1b (default, six layouts) or llama3-70b-2l (70B's width)")
    a = ap.parse_args()
    steps = a.steps or (3 if a.dry_run else 12)
    warmup = 1 if a.dry_run else 4
    if not a.dry_run:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA GPU here; run with --dry-run to check everything but the GPU")
        gpu = torch.cuda.get_device_name(0)
    else:
        gpu = "cpu (dry run)"
    t_start = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory() as name:
        work = Path(name)
        profiles = work / "profiles"
        profiles.mkdir()
        (profiles / ("gpu-check-cpu.yaml" if a.dry_run else "gpu-check-h200.yaml")).write_text(one_gpu_profile(a.dry_run))
        for mbs, rc, zero in SHAPES[a.shape][2]:
            label = f"mbs {mbs} recompute {rc} ZeRO-{zero}"
            left = a.budget - (time.monotonic() - t_start)
            if left < 30:
                rows.append({"layout": label, "failure": "skipped: the time budget is spent"})
                continue
            plan_dir = plan(work, profiles, a.dry_run, mbs, rc, zero, a.shape)
            run_dir = work / f"run-{plan_dir.name}"
            rc_code, tail = train(plan_dir, run_dir, steps, a.dry_run, timeout=left)
            if rc_code != 0 or not RunDir(run_dir).has_metrics():
                failure = "out of memory" if "OutOfMemoryError" in tail or "out of memory" in tail else \
                    f"failed ({rc_code}): {' '.join(tail.split())[-300:]}"
                rows.append({"layout": label, "failure": failure})
                continue
            rows.append(measure(plan_dir, run_dir, warmup))
            print(f"{label}: {rows[-1]['measured_step_s']:.4f} s/step measured, {rows[-1]['predicted_step_s']:.4f} "
                  f"predicted", flush=True)
        records = [r["record"] for r in rows if "record" in r]
        stamp = time.strftime("%Y-%m-%d", time.gmtime())
        doc = {"records": records}
        header = (f"# scripts/gpu_check.py on {gpu}, {stamp}: the bundled entrypoint, {steps} steps per layout, "
                  f"the first {warmup} left out.\n# dsorch calibrate format (orchestrator/calibrate/__init__.py); "
                  f"predicted next to measured:\n" + "".join(f"#   {line}\n" for line in table(rows).splitlines()))
        out = a.out
        if out is None:
            out = (work / "gpu-check-dry-run.yaml" if a.dry_run else
                   ROOT / "docs" / "measurements" / f"gpu-check-{gpu.replace(' ', '-')}-{stamp}.yaml")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(header + yaml.safe_dump(doc, sort_keys=False))
        print(table(rows))
        print(f"wrote {out} ({len(records)} records) in {time.monotonic() - t_start:.0f} s")
        if a.dry_run:
            # The record must be one `dsorch calibrate` reads: check it here, with the same profile.
            from orchestrator.calibrate.records import load_records
            from orchestrator.spec.cluster import load_profile

            rows_read = load_records([out], load_profile("gpu-check-cpu", profiles).profile)
            print(f"dry run: the records file reads back as {len(rows_read)} calibration rows")
        print(json.dumps({"records": len(records), "failures": [r for r in rows if "failure" in r]}))


if __name__ == "__main__":
    main()
