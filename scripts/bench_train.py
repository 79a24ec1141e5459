#!/usr/bin/env python3
"""Throughput of dsorch's entrypoint against a minimal plain-DeepSpeed PipelineModule loop.

    python scripts/bench_train.py                      # pp2 x dp2 ZeRO-1 on 4 local CPU ranks
    python scripts/bench_train.py --steps 40 --pins --tp 1 --pp 4 --dp 1

Both sides train the same model (shape from the plan's megatron_args.txt) with the same
ds_config.json and layout. The baseline is what one would write by hand with DeepSpeed alone:
plain nn.Linear / nn.Embedding layers in a PipelineModule, F.cross_entropy, and a bare
``engine.train_batch`` loop over pre-built tensors. It has no tensor parallelism, so only
layouts with tp = 1 compare like with like. Printed: median tokens/s of each after warm-up and
their ratio, and the per-step cost of dsorch's own code outside DeepSpeed (batch assembly,
the peak-memory all-reduce, the metrics line). Figures only, no assertions.
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

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- the baseline

def baseline(plan_dir: str, steps: int, out: str) -> None:
    """Runs under torchrun: plain DeepSpeed PipelineModule training, rank 0 writes timings."""
    import deepspeed
    import torch
    import torch.nn.functional as F
    from deepspeed.pipe import LayerSpec, PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    from torch import nn

    from orchestrator.train.config import load_plan
    from orchestrator.train.entry import ds_config_for

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    plan = load_plan(plan_dir)
    m, lay = plan.model, plan.layout
    d = m.head_dim

    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.e = nn.Embedding(m.vocab_size, m.hidden_size)

        def forward(self, ids):
            return self.e(ids)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(m.hidden_size), nn.RMSNorm(m.hidden_size)
            self.qkv = nn.Linear(m.hidden_size, (m.num_heads + 2 * m.num_kv_heads) * d, bias=False)
            self.o = nn.Linear(m.num_heads * d, m.hidden_size, bias=False)
            self.up = nn.Linear(m.hidden_size, 2 * m.ffn_hidden_size, bias=False)
            self.down = nn.Linear(m.ffn_hidden_size, m.hidden_size, bias=False)

        def forward(self, x):  # [b, s, h]; no RoPE, a hand-written loop would often skip it too
            b, s, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).split([m.num_heads * d, m.num_kv_heads * d,
                                                  m.num_kv_heads * d], -1)
            q = q.view(b, s, m.num_heads, d).transpose(1, 2)
            k = k.view(b, s, m.num_kv_heads, d).transpose(1, 2)
            v = v.view(b, s, m.num_kv_heads, d).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
            g, u = self.up(self.n2(x)).chunk(2, -1)
            return x + self.down(F.silu(g) * u)

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.n, self.p = nn.RMSNorm(m.hidden_size), nn.Linear(m.hidden_size, m.vocab_size, bias=False)

        def forward(self, x):
            return self.p(self.n(x))

    def loss_fn(logits, labels):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    topo = PipeModelDataParallelTopology(num_pp=lay.pp, num_mp=1, num_dp=lay.dp)
    specs = [LayerSpec(Embed), *[LayerSpec(Block) for _ in range(m.num_layers)], LayerSpec(Head)]
    model = PipelineModule(specs, topology=topo, loss_fn=loss_fn, partition_method="type:Block")
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=ds_config_for(plan, torch.device("cpu")))
    g = torch.Generator().manual_seed(0)
    data = [(torch.randint(0, m.vocab_size, (lay.micro_batch_size, m.seq_length), generator=g),) * 2
            for _ in range(lay.grad_accum_steps)]
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.train_batch(data_iter=iter(data))
        times.append(time.perf_counter() - t0)
    if torch.distributed.get_rank() == 0:
        Path(out).write_text(json.dumps({"step_time_s": times}))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


# --------------------------------------------------------------------------- dsorch's own overhead

def own_overhead(plan_dir: str, reps: int = 200) -> dict[str, float]:
    """Seconds per step that dsorch's loop adds around DeepSpeed, measured in a 1-rank group."""
    import torch
    import torch.distributed as dist

    from orchestrator.train.config import load_plan
    from orchestrator.train.data import micro_batches, open_dataset
    from orchestrator.train.metrics import MetricsLog, peak_memory_gib

    plan = load_plan(plan_dir)
    lay, m = plan.layout, plan.model
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29000 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        out = {}
        for name, path in (("synthetic", None), ("token file", str(ROOT / "examples/data/pydoc"))):
            ds = open_dataset(path, m.vocab_size, m.seq_length, plan.seed)
            t0 = time.perf_counter()
            for step in range(reps):
                list(micro_batches(ds, step, lay.global_batch_size, lay.micro_batch_size, lay.dp, 0))
            out[f"batches ({name})"] = (time.perf_counter() - t0) / reps
        with tempfile.TemporaryDirectory() as tmp:
            log = MetricsLog(Path(tmp), plan, lay.world_size)
            t0 = time.perf_counter()
            with open(os.devnull, "w") as devnull:
                stdout, sys.stdout = sys.stdout, devnull
                try:
                    for step in range(reps):
                        mem, kind = peak_memory_gib(torch.device("cpu"))
                        t = torch.tensor([mem])
                        dist.all_reduce(t, op=dist.ReduceOp.MAX)
                        log.record(step, 1.0, 1e-3, None, 0.1, float(t), kind)
                finally:
                    sys.stdout = stdout
            out["memory all-reduce + metrics line"] = (time.perf_counter() - t0) / reps
        return out
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- driver

def torchrun(nproc: int, args: list[str], env: dict) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(nproc), *args]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the median")
    p.add_argument("--pins", nargs=argparse.REMAINDER, default=["--tp", "1", "--pp", "2", "--dp", "2", "--zero", "1"],
                   help="dsorch plan pins for examples/tiny.yaml on --cluster local (last option)")
    p.add_argument("--_baseline", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._baseline:
        baseline(args._baseline[0], int(args._baseline[1]), args._baseline[2])
        return

    from click.testing import CliRunner

    from orchestrator.cli import main as cli
    from orchestrator.train.config import load_plan

    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        plan_dir = Path(tmp) / "plan"
        r = CliRunner().invoke(cli, ["plan", str(ROOT / "examples/tiny.yaml"), "--cluster", "local",
                                     "--out", str(plan_dir), *args.pins])
        if r.exit_code:
            sys.exit(r.output)
        plan = load_plan(plan_dir)
        lay = plan.layout
        if lay.tp != 1:
            sys.exit("the plain-DeepSpeed baseline has no tensor parallelism: pin --tp 1")
        tokens = lay.global_batch_size * plan.model.seq_length
        n = lay.world_size

        torchrun(n, ["-m", "orchestrator.train", "--plan", str(plan_dir), "--steps", str(args.steps),
                     "--no-save", "--run-dir", str(Path(tmp) / "run")], env)
        recs = [json.loads(x) for x in (Path(tmp) / "run/metrics.jsonl").read_text().splitlines()]
        ours = statistics.median(r["step_time_s"] for r in recs[args.warmup:])

        out = Path(tmp) / "baseline.json"
        torchrun(n, [str(Path(__file__).resolve()), "--_baseline", str(plan_dir), str(args.steps),
                     str(out)], env)
        theirs = statistics.median(json.loads(out.read_text())["step_time_s"][args.warmup:])
        overhead = own_overhead(str(plan_dir))

    own = sum(v for k, v in overhead.items() if not k.startswith("batches (token"))
    wall = ours + own  # the entrypoint's metrics time train_batch only; add its own per-step code
    print(f"layout: tp {lay.tp} x pp {lay.pp} x dp {lay.dp}, ZeRO-{lay.zero_stage}, mbs "
          f"{lay.micro_batch_size} x gas {lay.grad_accum_steps}; {tokens} tokens/step; median of "
          f"steps {args.warmup + 1}..{args.steps}")
    print(f"  dsorch entrypoint      {tokens / wall:10,.0f} tokens/s  ({wall * 1e3:.1f} ms/step "
          f"incl. {own * 1e3:.2f} ms of its own per-step code)")
    print(f"  plain DeepSpeed loop   {tokens / theirs:10,.0f} tokens/s  ({theirs * 1e3:.1f} ms/step)")
    print(f"  ratio                  {theirs / wall:10.3f}  (target >= 0.95)")
    for k, v in overhead.items():
        print(f"  dsorch per-step code: {k:34s} {v * 1e3:7.3f} ms")
    print(f"  dsorch per-step code outside DeepSpeed (synthetic data): {own * 1e3:.3f} ms "
          f"= {100 * own / wall:.2f}% of a step")

if __name__ == "__main__":
    main()
