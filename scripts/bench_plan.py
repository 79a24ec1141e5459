"""Wall time of a full layout search for Llama-3 405B on a 2048-node H100 profile, and of the
whole `dsorch plan` command (Python start-up and DeepSpeed validation included).

    python scripts/bench_plan.py [--repeat 5]

Prints figures; asserts nothing (targets live here, not in timed tests).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=2048)
    args = ap.parse_args()

    from orchestrator.plan.solver import search
    from orchestrator.spec.cluster import load_profile
    from orchestrator.spec.model import load_spec

    spec, _ = load_spec(ROOT / "examples" / "llama3-405b.yaml")
    profile = load_profile("dgx16").profile.resized(nodes=args.nodes)
    for runtime in ("deepspeed", "megatron"):
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            res = search(spec.model, spec.training, profile, runtime)
            times.append(time.perf_counter() - t0)
        print(f"search  llama3-405b on {profile.world_size} H100 ({runtime:9s}): {res.evaluated:6d} layouts "
              f"evaluated, {res.feasible} fit; median {statistics.median(times) * 1e3:.1f} ms, "
              f"min {min(times) * 1e3:.1f} ms over {args.repeat} runs")

    dsorch = Path(sys.executable).with_name("dsorch")
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            subprocess.run([str(dsorch), "plan", str(ROOT / "examples" / "llama3-405b.yaml"), "--cluster", "dgx16",
                            "--nodes", str(args.nodes), "--out", f"{tmp}/p"], check=True, env=env,
                           stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - t0)
    print(f"command dsorch plan llama3-405b --nodes {args.nodes} --out ...: median {statistics.median(times):.2f} s, "
          f"min {min(times):.2f} s over {args.repeat} runs (start-up, search, render, DeepSpeed validation, write)")


if __name__ == "__main__":
    main()
