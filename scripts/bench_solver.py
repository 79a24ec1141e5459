"""Solver throughput: candidates evaluated, candidates per second and solver wall time for a few
model / cluster sizes, against a plain per-candidate Python loop over the same cost model.

    python scripts/bench_solver.py [--repeat 5] [--loop-limit 2000]

The loop calls ``evaluate`` once per candidate (a 1-element Candidates), which is what a
non-vectorized planner would do; the ratio is loop time / vectorized evaluate time on the same
candidates. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CASES = [  # (spec, profile, nodes)
    ("llama3-8b", "dgx16", 1),
    ("llama3-70b", "dgx16", 16),
    ("gpt3-175b", "dgx-a100-80gb-hdr", 48),
    ("llama3-405b", "dgx16", 2048),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--loop-limit", type=int, default=2000, help="candidates timed in the Python loop (extrapolated)")
    args = ap.parse_args()

    from orchestrator.costmodel import evaluate
    from orchestrator.plan.solver import enumerate_layouts, search
    from orchestrator.spec.cluster import load_profile
    from orchestrator.spec.model import load_spec

    print(f"{'case':44s} {'runtime':9s} {'candidates':>10s} {'search ms':>9s} {'cand/s':>10s} "
          f"{'evaluate ms':>11s} {'loop ms':>9s} {'loop/vec':>8s}")
    for name, prof, nodes in CASES:
        spec, _ = load_spec(ROOT / "examples" / f"{name}.yaml")
        profile = load_profile(prof).profile.resized(nodes=nodes)
        for runtime in ("deepspeed", "megatron"):
            m, t = spec.model, spec.training
            search(m, t, profile, runtime)  # warm caches (calibration table)
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                res = search(m, t, profile, runtime)
                times.append(time.perf_counter() - t0)
            solver = statistics.median(times)
            cand, _ = enumerate_layouts(m, t, profile, runtime)
            ev_times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                evaluate(m, t, profile, runtime, cand)
                ev_times.append(time.perf_counter() - t0)
            vec = statistics.median(ev_times)
            n_loop = min(len(cand), args.loop_limit)
            t0 = time.perf_counter()
            for i in range(n_loop):
                evaluate(m, t, profile, runtime, cand.take(slice(i, i + 1)))
            loop = (time.perf_counter() - t0) * len(cand) / max(n_loop, 1)
            case = f"{name} on {profile.world_size} x {profile.gpu.name}"
            print(f"{case:44s} {runtime:9s} {res.evaluated:10d} {solver * 1e3:9.1f} {res.evaluated / solver:10.0f} "
                  f"{vec * 1e3:11.2f} {loop * 1e3:9.0f} {loop / vec:8.0f}x", flush=True)


if __name__ == "__main__":
    main()
