#!/usr/bin/env python3
"""Throughput of dsorch's entrypoint against a plain DeepSpeed PipelineModule loop, their steps
interleaved in the same processes.

    python scripts/bench_train.py                            # pp2 x dp2 ZeRO-1, 4 CPU ranks, 60 rounds
    python scripts/bench_train.py --rounds 20 --steps 5 --pins --tp 1 --pp 4 --dp 1

Both sides train the same model (the plan's spec: RMSNorm, GQA attention with RoPE, SwiGLU,
untied output) with the same ds_config.json, layout and batches: the baseline assembles its
micro-batches each step with dsorch's own data code (``train.data.micro_batches``), as the
entrypoint does. The baseline is what one would write by hand with DeepSpeed alone: nn.Linear /
nn.Embedding layers in a PipelineModule, F.cross_entropy, a bare ``engine.train_batch`` loop. It
has no tensor parallelism, so only layouts with tp = 1 compare like with like.

One torchrun job builds both: the entrypoint's own loop (``train.entry.Trainer``, the code
``python -m orchestrator.train`` runs, its memory all-reduce, metrics.jsonl line and log line
included) and the baseline engine. After a warm-up of each, a round runs a block of --steps steps
of one side and then of the other, the order alternating, each block between two barriers; rank 0
times it by the wall clock and by its own CPU seconds. The ratio (plain / entrypoint time) is
reported per round, then as the median over the rounds with a bootstrap 95 % interval and the
spread (min-max). ``--self-check`` runs the plain loop against a second copy of itself: the
ratio the noise alone gives, whose median should be 1 (60 rounds measured 0.984, interval
0.954-1.003, spread 0.80-1.28).

Why in one job: on this machine's 2 shared cores the same work takes 50 to 70 ms of CPU per step
from one minute to the next (measured within single runs), so comparing whole runs one after
the other measured that drift (ratios 0.84-1.20 over 7 rounds); adjacent blocks of a few steps
see the same machine. Figures only, no assertions.
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

def plain_engine(plan):
    """The baseline: the plan's model written with torch.nn alone in a PipelineModule, under the
    plan's ds_config.json."""
    import deepspeed
    import torch
    import torch.nn.functional as F
    from deepspeed.pipe import LayerSpec, PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    from torch import nn

    from orchestrator.train.loop.entry import ds_config_for

    m, t, lay = plan.spec.model, plan.spec.training, plan.layout
    d, heads, kv = m.head_dim, m.num_attention_heads, m.kv_heads
    inv = 1.0 / (m.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.outer(torch.arange(t.seq_length, dtype=torch.float32), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rope(x):  # [b, heads, s, d], rotate-half (Llama)
        x1, x2 = x.chunk(2, -1)
        return x * cos[: x.shape[2]] + torch.cat([-x2, x1], -1) * sin[: x.shape[2]]

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
            self.qkv = nn.Linear(m.hidden_size, (heads + 2 * kv) * d, bias=False)
            self.o = nn.Linear(heads * d, m.hidden_size, bias=False)
            self.up = nn.Linear(m.hidden_size, 2 * m.ffn_hidden_size, bias=False)
            self.down = nn.Linear(m.ffn_hidden_size, m.hidden_size, bias=False)

        def forward(self, x):  # [b, s, h]
            b, s, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).split([heads * d, kv * d, kv * d], -1)
            q = rope(q.view(b, s, heads, d).transpose(1, 2))
            k = rope(k.view(b, s, kv, d).transpose(1, 2))
            v = v.view(b, s, kv, d).transpose(1, 2)
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
    return engine


def worker(plan_dir: str, rounds: int, steps: int, warmup: int, out: str, self_check: bool) -> None:
    """Runs under torchrun: both sides in this process, their steps in alternating blocks; rank 0
    writes each block's wall and CPU seconds to ``out``."""
    import torch.distributed as dist

    from orchestrator.train.data.datasets import micro_batches, open_dataset
    from orchestrator.train.loop import launch
    from orchestrator.train.loop.config import load_plan
    from orchestrator.train.loop.entry import Trainer, parse_args

    plan = load_plan(plan_dir)
    lay, t = plan.layout, plan.spec.training
    denv = launch.read_env()
    device = launch.init(denv, plan.doc.cluster.backend)
    total = warmup + rounds * steps
    dataset = open_dataset(None, plan.spec.model.vocab_size, t.seq_length, t.seed)

    def plain(engine):  # the bare loop: a step's micro-batches, then DeepSpeed's train_batch
        dp_rank = engine.grid.get_data_parallel_rank()
        return lambda step: engine.train_batch(data_iter=iter(list(micro_batches(
            dataset, step, lay.global_batch_size, lay.micro_batch_size, lay.dp, dp_rank))))

    if self_check:  # the baseline against a second one of itself: what the rounds' noise alone gives
        steppers = {"ours": plain(plain_engine(plan))}
    else:
        steppers = {"ours": Trainer(plan, parse_args(["--plan", plan_dir, "--steps", str(total), "--no-save",
                                                      "--run-dir", str(Path(out).parent / "run")]),
                                    denv, device).step}
    steppers["theirs"] = plain(plain_engine(plan))
    done = {"ours": 0, "theirs": 0}

    def run(side: str, n: int) -> tuple[float, float]:
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            steppers[side](done[side])
            done[side] += 1
        dist.barrier()
        return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n

    run("ours", warmup)
    run("theirs", warmup)
    blocks = []
    for i in range(rounds):
        order = ("ours", "theirs") if i % 2 == 0 else ("theirs", "ours")
        got = {side: run(side, steps) for side in order}
        blocks.append({"first": order[0], **{f"{side}_{k}": v for side in order
                                              for k, v in zip(("wall_s", "cpu_s"), got[side])}})
    if denv.rank == 0:
        Path(out).write_text(json.dumps(blocks))
    launch.teardown(True)


# --------------------------------------------------------------------------- driver

# Each rank on one core (local rank modulo the cores), for both sides alike: left to the scheduler,
# 4 ranks on 2 cores land differently from one run, or one minute, to the next.
PINNED = """import os, runpy, sys
os.sched_setaffinity(0, {int(os.environ["LOCAL_RANK"]) % len(os.sched_getaffinity(0))})
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def torchrun(nproc: int, args: list[str], env: dict, pin: Path | None = None) -> None:
    """torchrun SCRIPT ARGS, each rank pinned to a core by ``pin``."""
    if pin is not None:
        args = [str(pin), *args]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(nproc), *args]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=60, help="rounds of a block of each side, the order alternating")
    p.add_argument("--steps", type=int, default=5, help="steps in a block")
    p.add_argument("--warmup", type=int, default=5, help="steps of each side before the rounds, left out")
    p.add_argument("--pins", nargs=argparse.REMAINDER, default=["--tp", "1", "--pp", "2", "--dp", "2", "--zero", "1"],
                   help="dsorch plan pins for examples/tiny.yaml on --cluster local (last option)")
    p.add_argument("--no-pin", action="store_true", help="leave the ranks to the scheduler instead of one core each")
    p.add_argument("--self-check", action="store_true",
                   help="time the plain loop against a second copy of itself instead of the entrypoint: the "
                        "ratio the machine's noise alone gives (its median should be 1)")
    p.add_argument("--_worker", nargs=6, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._worker:
        plan_dir, rounds, steps, warmup, out, self_check = args._worker
        worker(plan_dir, int(rounds), int(steps), int(warmup), out, self_check == "1")
        return
    if args.rounds < 1 or args.steps < 1 or args.warmup < 1:
        sys.exit("--rounds, --steps and --warmup must be at least 1")

    from click.testing import CliRunner

    from orchestrator.cli.main import main as cli
    from orchestrator.train.loop.config import load_plan

    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        plan_dir = tmp / "plan"
        pin = None
        if not args.no_pin:
            pin = tmp / "pinned.py"
            pin.write_text(PINNED)
        r = CliRunner().invoke(cli, ["plan", str(ROOT / "examples/tiny.yaml"), "--cluster", "local",
                                     "--out", str(plan_dir), *args.pins])
        if r.exit_code:
            sys.exit(r.output)
        plan = load_plan(plan_dir)
        lay = plan.layout
        if lay.tp != 1:
            sys.exit("the plain-DeepSpeed baseline has no tensor parallelism: pin --tp 1")
        out = tmp / "blocks.json"
        torchrun(lay.world_size, [str(Path(__file__).resolve()), "--_worker", str(plan_dir), str(args.rounds),
                                  str(args.steps), str(args.warmup), str(out), "1" if args.self_check else "0"], env, pin)
        blocks = json.loads(out.read_text())

    tokens = lay.global_batch_size * plan.spec.training.seq_length
    first = "plain DeepSpeed (copy)" if args.self_check else "dsorch entrypoint"
    for i, b in enumerate(blocks):
        print(f"round {i + 1:2d} ({b['first']} first): {first} {b['ours_wall_s'] * 1e3:6.1f} ms/step, plain "
              f"DeepSpeed {b['theirs_wall_s'] * 1e3:6.1f} ms/step, ratio {b['theirs_wall_s'] / b['ours_wall_s']:.3f}; "
              f"rank 0 CPU {b['ours_cpu_s'] * 1e3:5.1f} vs {b['theirs_cpu_s'] * 1e3:5.1f} ms/step, ratio "
              f"{b['theirs_cpu_s'] / b['ours_cpu_s']:.3f}")
    ours = [b["ours_wall_s"] for b in blocks]
    theirs = [b["theirs_wall_s"] for b in blocks]
    print(f"layout: tp {lay.tp} x pp {lay.pp} x dp {lay.dp}, ZeRO-{lay.zero_stage}, mbs {lay.micro_batch_size} x "
          f"gas {lay.grad_accum_steps}; {tokens} tokens/step; after {args.warmup} warm-up steps of each, "
          f"{args.rounds} rounds of {args.steps} steps of each side, order alternating, in one torchrun job"
          + (", ranks pinned to cores" if pin else ""))
    print(f"  {first:<22} median {tokens / statistics.median(ours):9,.0f} tokens/s "
          f"({min(ours) * 1e3:.1f}-{max(ours) * 1e3:.1f} ms/step)")
    print(f"  {'plain DeepSpeed':<22} median {tokens / statistics.median(theirs):9,.0f} tokens/s "
          f"({min(theirs) * 1e3:.1f}-{max(theirs) * 1e3:.1f} ms/step)")
    # Wall time also counts the waits for a core of 4 ranks on 2; rank 0's CPU seconds count the
    # work it does (DeepSpeed's, and the entrypoint's own on top).
    what = "copy" if args.self_check else "entrypoint"
    for label, key in ((f"ratio (plain / {what} time)", "wall_s"), ("ratio of rank 0's CPU time", "cpu_s")):
        r = [b[f"theirs_{key}"] / b[f"ours_{key}"] for b in blocks]
        lo, hi = median_interval(r)
        print(f"  {label:<32} median {statistics.median(r):.3f} (95% interval {lo:.3f}-{hi:.3f}), "
              f"spread {min(r):.3f}-{max(r):.3f} over {len(r)} rounds" + ("" if args.self_check else " (target >= 0.95)"))


def median_interval(values: list[float], level: float = 0.95, draws: int = 10_000) -> tuple[float, float]:
    """A percentile-bootstrap interval for the median of the rounds (Efron & Tibshirani 1993,
    ch. 13): where the median would fall if the rounds were drawn again from the same machine.
    The spread says how much one round swings; this, how sure the median is."""
    import numpy as np

    v = np.asarray(values)
    medians = np.median(np.random.default_rng(0).choice(v, size=(draws, v.size)), axis=1)
    return tuple(float(x) for x in np.quantile(medians, [(1 - level) / 2, (1 + level) / 2]))


if __name__ == "__main__":
    main()
