"""Wall time of a full layout search for Llama-3 405B on a 2048-node H100 profile and for
DeepSeek-V3 (a mixture of experts, the expert axes ep and etp searched) on 2,048 H100, and of the
whole `dsorch plan` commands (Python start-up and DeepSpeed validation included) against a bare
`python -c "import deepspeed"`.

    python scripts/bench_plan.py [--repeat 5]

Prints figures; asserts nothing (targets live here, not in timed tests). The target of issue 24:
the whole `dsorch plan` of DeepSeek-V3 on 2,048 H100 stays within 1 s of a bare `import deepspeed`.
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

    cases = (("llama3-405b", args.nodes), ("deepseek-v3", 256))  # 256 x 8 = 2,048 H100 for DeepSeek-V3
    for name, nodes in cases:
        spec, _ = load_spec(ROOT / "examples" / f"{name}.yaml")
        profile = load_profile("dgx16").profile.resized(nodes=nodes)
        for runtime in ("deepspeed", "megatron"):
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                res = search(spec.model, spec.training, profile, runtime)
                times.append(time.perf_counter() - t0)
            print(f"search  {name} on {profile.world_size} H100 ({runtime:9s}): {res.evaluated:7d} layouts "
                  f"evaluated, {res.feasible} fit; median {statistics.median(times) * 1e3:.1f} ms, "
                  f"min {min(times) * 1e3:.1f} ms over {args.repeat} runs")

    env = dict(os.environ, DS_ACCELERATOR="cpu")
    bare = _median_run([sys.executable, "-c", "import deepspeed"], env, args.repeat)
    print(f"command python -c 'import deepspeed': median {bare:.2f} s over {args.repeat} runs")
    dsorch = Path(sys.executable).with_name("dsorch")
    with tempfile.TemporaryDirectory() as tmp:
        for name, nodes in cases:
            for runtime in ("deepspeed", "megatron"):
                cmd = [str(dsorch), "plan", str(ROOT / "examples" / f"{name}.yaml"), "--cluster", "dgx16",
                       "--nodes", str(nodes), "--runtime", runtime, "--out", f"{tmp}/p-{name}-{runtime}"]
                t = _median_run(cmd, env, args.repeat)
                print(f"command dsorch plan {name} --nodes {nodes} --runtime {runtime}: median {t:.2f} s, "
                      f"{t - bare:+.2f} s over the bare import (start-up, search, render, DeepSpeed validation, "
                      f"write)")


def _median_run(cmd: list[str], env: dict, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


if __name__ == "__main__":
    main()
