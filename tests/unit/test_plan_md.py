"""plan.md (orchestrator/render/plan_md.py): the decision in prose, the stacks, the inputs, with the
plan's numbers; deterministic and hash-checked like the other files."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.costmodel.stacks import MEMORY_KEYS, TIME_PARTS

from .test_report import _doc, _ranked, run


def test_plan_md_states_the_decision_with_the_plans_numbers(runner, in_tmp):
    out = in_tmp / "p"
    assert run(runner, "plan", "examples/llama3-70b.yaml", "--cluster", "dgx16", "--out", out).exit_code == 0
    md = (out / "plan.md").read_text()
    doc = _doc(out)
    chosen = doc["explain"]["layouts"][0]
    runner_up = doc["explain"]["layouts"][1]
    assert chosen["chosen"] and md.startswith(f"# llama3-70b on dgx16: `{chosen['layout']}`")
    assert f"{doc['predicted']['step_time_s']:.4g} s per step" in md
    cap = doc["explain"]["capacity_gib"]  # 80 GiB less the default memory margin
    assert cap < 80.0 and f"{doc['memory_gib_per_gpu']['total']:.1f} GiB of {cap:.1f} GiB per GPU" in md
    assert f"**Runner-up:** `{runner_up['layout']}`" in md
    # plan.yaml rounds the gap to 4 digits, plan.md prints it to 0.1 %: the same number up to rounding,
    # and the same in the prose and in the time table.
    gap = re.search(r"\*\*Runner-up:\*\* `[^`]+`, [^(]+ per step \(([+-][0-9.]+) %\)", md)
    assert gap and abs(float(gap.group(1)) - 100 * runner_up["vs_chosen"]) <= 0.06, md
    row = next(line for line in md.splitlines() if line.startswith(f"| {runner_up['layout']} |")
               and line.endswith(" % |"))
    assert row.endswith(f"| {gap.group(1)} % |"), row
    # Every family the search found has its line; plain data parallelism cannot hold 70B's states on
    # 80 GB, and the line says by how much.
    for words in ("Data parallelism", "ZeRO-3 / FSDP", "Tensor parallelism", "Pipeline parallelism"):
        assert f"- **{words}" in md
    dp_line = next(line for line in md.splitlines() if line.startswith("- **Data parallelism"))
    need = float(re.search(rf"needs ([\d.]+) GiB of {cap:.1f} GiB", dp_line).group(1))
    assert need > cap and f"{need - cap:.1f} GiB over" in dp_line
    # The stacks: one table row per ranked layout, with the plan.yaml numbers.
    for L, s in zip(doc["explain"]["layouts"], _ranked(doc), strict=True):
        name = f"**{L['layout']}**" if L["chosen"] else L["layout"]
        mem_row = "| " + " | ".join([name, *[f"{s['memory_gib_per_gpu'][k]:.1f}" for k in MEMORY_KEYS]]) + " |"
        assert mem_row in md
        assert f"| {name} | " + " | ".join(f"{s['time_breakdown_s'][k]:.3f}" for k in TIME_PARTS) in md
    # The inputs and the other files, with the hashes plan.yaml records.
    assert doc["inputs"]["model_spec"]["sha256"] in md and doc["inputs"]["cluster_profile"]["sha256"] in md
    for name, digest in doc["files"].items():
        if name != "plan.md":
            assert f"- `{name}` `{digest}`" in md
    assert "plan.md" in doc["files"]


def test_plan_md_is_deterministic_and_checked(runner, in_tmp):
    a, b = in_tmp / "a", in_tmp / "b"
    for out in (a, b):
        assert run(runner, "plan", "examples/tiny.yaml", "--cluster", "local", "--out", out).exit_code == 0
    assert (a / "plan.md").read_bytes() == (b / "plan.md").read_bytes()
    (a / "plan.md").write_text((a / "plan.md").read_text().replace("Runner-up", "Second"))
    r = run(runner, "plan", "examples/tiny.yaml", "--cluster", "local", "--out", a, "--check")
    assert r.exit_code == 1 and "plan.md" in r.output
    r = run(runner, "validate", a)
    assert r.exit_code == 2 and "plan.md" in r.output


def test_plan_md_names_the_data_both_runtimes_train_on(runner, in_tmp):
    from orchestrator.cli.main import main

    spec = (Path("examples/tiny.yaml").read_text()
            + "  data:\n    path: ['30', data/a, '70', data/b]\n    split: 90,10,0\n")
    assert "\n  data:" not in Path("examples/tiny.yaml").read_text() and "\ntraining:" in spec
    Path("tiny-data.yaml").write_text(spec)
    for runtime in ("deepspeed", "megatron"):
        r = runner.invoke(main, ["plan", "tiny-data.yaml", "--cluster", "local", "--runtime", runtime,
                                 "--out", f"p-{runtime}"])
        assert r.exit_code == 0, r.output
        md = Path(f"p-{runtime}/plan.md").read_text()
        assert "- data: `data/a` (weight 30), `data/b` (weight 70); split 90,10,0; tokenizer NullTokenizer" in md
    args = Path("p-megatron/megatron_args.txt").read_text()
    assert "--data-path" in args and "data/a" in args and "--split 90,10,0" in " ".join(args.split())
