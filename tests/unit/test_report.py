"""What a reviewer reads: plan.md (the decision in prose, the stacks, the inputs) and the pictures
(`dsorch plot`, `plan --plot`), checked for content: the bars and rows exist and encode the plan's
numbers, the pipeline schedule obeys the 1F1B rules and its bubble is the paper's."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.main import main
from orchestrator.costmodel.stacks import MEMORY_KEYS, MEMORY_PARTS, TIME_PARTS
from orchestrator.cli.plot_schedule import schedule
from orchestrator.plan.layout import Layout

from ..conftest import PROFILES

SVG = "{http://www.w3.org/2000/svg}"


def run(runner, *args):
    return runner.invoke(main, [*map(str, args)], catch_exceptions=False)


def _doc(plan_dir: Path) -> dict:
    return yaml.safe_load((plan_dir / "plan.yaml").read_text())


def _ranked(doc: dict) -> list[dict]:
    """plan.yaml's ranked layouts with their stacks: the chosen one (the top level), then the alternatives."""
    return [doc, *doc["alternatives"]]


# ---- plan.md ---------------------------------------------------------------------------------


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


def test_plan_yaml_states_each_stack_once(runner, in_tmp):
    """The chosen section and the alternatives carry the stacks; explain.layouts names the same
    layouts in the same order with what only it says (chosen, vs_chosen), and no stack again."""
    out = in_tmp / "p"
    assert run(runner, "plan", "examples/llama3-70b.yaml", "--cluster", "dgx16", "--out", out).exit_code == 0
    doc = _doc(out)
    text = (out / "plan.yaml").read_text()
    assert text.count("memory_gib_per_gpu:") == text.count("time_breakdown_s:") == len(_ranked(doc))
    for L, s in zip(doc["explain"]["layouts"], _ranked(doc), strict=True):
        assert set(L) == {"layout", "chosen", "vs_chosen"}
        assert L["layout"] == Layout(**s["layout"]).short() and L["chosen"] == (s is doc)
        assert L["vs_chosen"] == pytest.approx(s["predicted"]["step_time_s"] / doc["predicted"]["step_time_s"] - 1,
                                               abs=1e-4)


def test_plot_of_a_plan_from_before_the_stacks_were_stated_once_says_to_regenerate(runner, in_tmp):
    out = in_tmp / "p"
    assert run(runner, "plan", "examples/tiny.yaml", "--cluster", "local", "--out", out).exit_code == 0
    text = (out / "plan.yaml").read_text()
    old = re.sub(r"comm_buffers: [\d.]+\n *framework: ", "overhead: ", text)  # the memory section of 0.1
    assert old != text
    (out / "plan.yaml").write_text(old)
    assert run(runner, "validate", out).exit_code == 0  # every other reader still takes it
    r = run(runner, "plot", out)
    assert r.exit_code == 2 and "have no comm_buffers, framework (an older dsorch wrote it); regenerate" in r.output


def test_plot_of_a_plan_without_a_predicted_step_time_says_to_regenerate(runner, in_tmp):
    out = in_tmp / "p"
    assert run(runner, "plan", "examples/tiny.yaml", "--cluster", "local", "--out", out).exit_code == 0
    text = (out / "plan.yaml").read_text()
    edited = re.sub(r"(?m)^(  step_time_s: )[\d.e-]+$", r"\1null", text, count=1)
    assert edited != text
    (out / "plan.yaml").write_text(edited)
    r = run(runner, "plot", out)
    assert r.exit_code == 2 and "predicted.step_time_s is empty; regenerate it with `dsorch plan`" in r.output
    assert "Traceback" not in r.output


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


# ---- the pipeline schedule -------------------------------------------------------------------


@pytest.mark.parametrize("pp, v, k", [(p, v, k) for p, v, k in itertools.product([2, 3, 4, 8], [1, 2, 4], [1, 2, 3])])
def test_schedule_bubble_is_the_papers(pp, v, k):
    """Without send time, the simulated 1F1B / interleaved schedule takes (m v + pp - 1) chunk
    passes: the bubble fraction (pp - 1) / (m v) of Narayanan et al. 2021, eq. (1) and sec. 2.2.2."""
    m = pp * k
    blocks = schedule(pp, m, v, 1.0, 2.0, 0.0)
    end = max(b.end for b in blocks)
    assert end == pytest.approx((m * v + pp - 1) * 3.0)
    # Each stage runs the forward and the backward of every (micro-batch, chunk) exactly once.
    for s in range(pp):
        mine = sorted((b.kind, b.micro_batch, b.chunk) for b in blocks if b.stage == s)
        assert mine == sorted(itertools.product("BF", range(m), range(v)))


def test_schedule_respects_every_dependency_and_the_send_time():
    pp, m, v, send = 4, 8, 2, 0.25
    blocks = schedule(pp, m, v, 1.0, 2.0, send)
    at = {(b.kind, b.stage, b.micro_batch, b.chunk): b for b in blocks}
    for b in blocks:
        if b.kind == "F" and (b.stage > 0 or b.chunk > 0):
            dep = at[("F", b.stage - 1, b.micro_batch, b.chunk)] if b.stage else at[("F", pp - 1, b.micro_batch, b.chunk - 1)]
            assert b.start >= dep.end + send - 1e-12
        if b.kind == "B":
            assert b.start >= at[("F", b.stage, b.micro_batch, b.chunk)].end
            if b.stage < pp - 1:
                assert b.start >= at[("B", b.stage + 1, b.micro_batch, b.chunk)].end + send - 1e-12
    for s in range(pp):  # one pass at a time per stage
        mine = sorted((b.start, b.end) for b in blocks if b.stage == s)
        assert all(x[1] <= y[0] + 1e-12 for x, y in zip(mine, mine[1:]))


# ---- the pictures ----------------------------------------------------------------------------


def _bars(svg: Path, prefix: str) -> dict[str, float]:
    """Width of every bar whose id starts with ``prefix`` (matplotlib writes a bar as a closed path)."""
    out = {}
    for g in ET.parse(svg).getroot().iter(f"{SVG}g"):
        gid = g.get("id", "")
        if gid.startswith(prefix):
            path = g.find(f"{SVG}path")
            if path is not None:
                xs = [float(x) for x in re.findall(r"[ML] ([-\d.]+) [-\d.]+", path.get("d"))]
                out[gid] = max(xs) - min(xs)
    return out


def _texts(svg: Path) -> dict[str, str]:
    root = ET.parse(svg).getroot()
    return {g.get("id"): "".join(g.find(f"{SVG}text").itertext()).strip() for g in root.iter(f"{SVG}g")
            if g.find(f"{SVG}text") is not None}


@pytest.mark.parametrize("args", [["--no-write"], ["--json"]])
def test_plot_needs_a_plan_directory_to_draw_into(runner, in_tmp, args):
    r = run(runner, "plan", "examples/tiny.yaml", "--cluster", "local", "--plot", *args)
    assert r.exit_code == 2 and "--plot draws into the plan directory" in r.output


def test_plot_draws_the_plans_stacks_and_schedule(runner, in_tmp):
    out = in_tmp / "p"
    r = run(runner, "plan", "examples/gpt3-175b.yaml", "--cluster", "dgx-a100-80gb-hdr", "--nodes", "16",
            "--runtime", "megatron", "--pp", "8", "--vpp", "2", "--out", out, "--plot")
    assert r.exit_code == 0, r.output
    doc = _doc(out)
    layouts = _ranked(doc)
    for name in ("memory.svg", "time.svg", "schedule.svg"):
        assert (out / "plots" / name).is_file()
    # Memory: one bar per part per ranked layout; the widths encode the numbers (proportional
    # within and across rows), the totals are written at the bar ends, the capacity line is drawn.
    bars = _bars(out / "plots" / "memory.svg", "memory-")
    texts = _texts(out / "plots" / "memory.svg")
    scale = None
    for i, L in enumerate(layouts):
        mem = L["memory_gib_per_gpu"]
        for k in MEMORY_PARTS:
            w = bars[f"memory-{i}-{k}"]
            scale = scale or w / mem[k] if mem[k] else scale
            if mem[k] > 0.5:
                assert w / mem[k] == pytest.approx(scale, rel=2e-3), (i, k)
        assert texts[f"memory-{i}-total"] == f"{mem['total']:.1f}"
    assert "memory-capacity" in {g.get("id") for g in ET.parse(out / "plots" / "memory.svg").getroot().iter(f"{SVG}g")}
    # Time: the same for the step's stack.
    bars = _bars(out / "plots" / "time.svg", "time-")
    texts = _texts(out / "plots" / "time.svg")
    scale = None
    for i, L in enumerate(layouts):
        t, step = L["time_breakdown_s"], L["predicted"]["step_time_s"]
        for k in TIME_PARTS:
            if t[k] > 0.01 * step:
                w = bars[f"time-{i}-{k}"]
                scale = scale or w / t[k]
                assert w / t[k] == pytest.approx(scale, rel=2e-3), (i, k)
        assert texts[f"time-{i}-total"] == format(step, ".4g")
    # The schedule: a row of forward and backward bars for every stage of the chosen layout.
    ids = {g.get("id") for g in ET.parse(out / "plots" / "schedule.svg").getroot().iter(f"{SVG}g")}
    pp = doc["layout"]["pp"]
    assert pp == 8 and doc["layout"]["vpp"] == 2
    for s in range(pp):
        assert {f"schedule-stage{s}-F0", f"schedule-stage{s}-F1", f"schedule-stage{s}-B0",
                f"schedule-stage{s}-B1"} <= ids
    assert "interleaved 1F1B: pp 8, 2 chunks per stage" in (out / "plots" / "schedule.svg").read_text()


def test_plot_is_deterministic_and_draws_measured_runs(runner, in_tmp):
    out = in_tmp / "p"
    assert run(runner, "plan", "examples/tiny.yaml", "--cluster", "local", "--out", out).exit_code == 0
    run_dir = in_tmp / "run"
    run_dir.mkdir()
    # A run's metrics.jsonl as the entrypoint writes it (the fields dsorch plot reads).
    lines = [{"step": i, "loss": 5.0 - 0.1 * i, "step_time_s": 0.2 if i > 1 else 1.5, "tokens_per_s": 5000.0,
              "peak_mem_gib": 0.4} for i in range(1, 11)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = run(runner, "plot", out, "--run", run_dir, "--out", in_tmp / "a")
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output and (in_tmp / "a" / "steps.svg").is_file()
    assert run(runner, "plot", out, "--run", run_dir, "--out", in_tmp / "b").exit_code == 0
    for name in ("memory.svg", "time.svg", "schedule.svg", "steps.svg"):
        assert (in_tmp / "a" / name).read_bytes() == (in_tmp / "b" / name).read_bytes(), name
    ids = {g.get("id") for g in ET.parse(in_tmp / "a" / "steps.svg").getroot().iter(f"{SVG}g")}
    assert {"steps-loss-0", "steps-time-0", "steps-predicted"} <= ids
    # The measured line passes through the measured points: 10 steps, 10 vertices.
    g = next(g for g in ET.parse(in_tmp / "a" / "steps.svg").getroot().iter(f"{SVG}g") if g.get("id") == "steps-time-0")
    assert len(re.findall(r"[ML] ", g.find(f"{SVG}path").get("d"))) == 10
    r = run(runner, "plot", out, "--run", in_tmp / "nowhere")
    assert r.exit_code == 2 and "no metrics.jsonl" in r.output and "Traceback" not in r.output


# ---- dsorch diff, plan --check on changed inputs -----------------------------------------------


def test_diff_says_what_changed_in_the_users_terms(runner, in_tmp):
    a, b = in_tmp / "a", in_tmp / "b"
    assert run(runner, "plan", "examples/llama3-70b.yaml", "--cluster", "dgx16", "--runtime", "megatron",
               "--out", a).exit_code == 0
    assert run(runner, "plan", "examples/llama3-70b.yaml", "--cluster", "dgx16", "--runtime", "megatron",
               "--tp", "8", "--out", b).exit_code == 0
    da, db = _doc(a), _doc(b)
    r = run(runner, "diff", a, b)
    assert r.exit_code == 0, r.output
    assert f"  tp: {da['layout']['tp']} -> 8" in r.output
    assert "  pinned: nothing -> tp=8" in r.output
    sa, sb = da["predicted"]["step_time_s"], db["predicted"]["step_time_s"]
    assert f"  step_time_s: {sa:g} -> {sb:g} ({100 * (sb / sa - 1):+.1f} %)" in r.output
    assert f"  --tensor-model-parallel-size: {da['layout']['tp']} -> 8" in r.output
    j = json.loads(run(runner, "diff", a, b, "--json").output)
    assert {"flag": "--tensor-model-parallel-size", "before": str(da["layout"]["tp"]), "after": "8"} in j["megatron_flags"]
    assert run(runner, "diff", a, a).output.endswith("no differences.\n")
    # A deepspeed plan against a megatron one: ds_config.json keys appear as added.
    c = in_tmp / "c"
    assert run(runner, "plan", "examples/llama3-70b.yaml", "--cluster", "dgx16", "--out", c).exit_code == 0
    out = run(runner, "diff", a, c).output
    assert "  runtime: megatron -> deepspeed" in out and "  train_batch_size: (absent) -> 512" in out


def test_check_names_the_profile_fields_that_changed_and_the_new_best(runner, in_tmp):
    prof = in_tmp / "prof"
    prof.mkdir()
    shipped = (Path(__file__).parents[2] / "cluster_profiles" / "dgx16.yaml").read_text()
    (prof / "dgx16.yaml").write_text(shipped)
    args = ["plan", "examples/llama3-70b.yaml", "--cluster", "dgx16", "--profiles-dir", prof, "--out", in_tmp / "p"]
    assert run(runner, *args).exit_code == 0
    before = _doc(in_tmp / "p")["layout"]
    (prof / "dgx16.yaml").write_text(shipped.replace("memory_gib: 80", "memory_gib: 96"))
    r = run(runner, *args, "--check")
    assert r.exit_code == 1
    assert "the cluster profile dgx16 changed since this plan was made: gpu.memory_gib 80 -> 96." in r.output
    assert run(runner, *args).exit_code == 0
    after = _doc(in_tmp / "p")["layout"]
    if after != before:
        from orchestrator.plan.layout import Layout

        assert f"the best layout now: {Layout(**after).short()}" in r.output
    else:
        assert "the best layout is unchanged" in r.output


def test_diff_names_the_profile_and_spec_fields_that_changed(runner, in_tmp):
    # A user profile and a copy of the spec, each changed between plan a and plan b.
    prof = in_tmp / "prof"
    prof.mkdir()
    # As a SLURM cluster's profile, which may grow: the local executor runs one node only.
    shipped = (PROFILES / "local.yaml").read_text().replace("executor: local", "executor: slurm")
    (prof / "local.yaml").write_text(shipped)
    spec = in_tmp / "tiny.yaml"
    spec.write_text((in_tmp / "examples" / "tiny.yaml").read_text())
    args = ["plan", spec, "--cluster", "local", "--profiles-dir", prof]
    assert run(runner, *args, "--out", in_tmp / "a").exit_code == 0
    (prof / "local.yaml").write_text(shipped.replace("memory_gib: 4", "memory_gib: 6"))
    spec.write_text(spec.read_text().replace("global_batch_size: 16", "global_batch_size: 32"))
    assert run(runner, *args, "--out", in_tmp / "b").exit_code == 0
    r = run(runner, "diff", in_tmp / "a", in_tmp / "b")
    assert r.exit_code == 0, r.output
    assert "cluster profile fields:\n  gpu.memory_gib: 4 -> 6\n" in r.output
    assert "model spec fields:\n  training.global_batch_size: 16 -> 32\n" in r.output
    j = json.loads(run(runner, "diff", in_tmp / "a", in_tmp / "b", "--json").output)
    assert j["cluster_profile"] == [{"name": "gpu.memory_gib", "before": 4, "after": 6}]
    assert j["model_spec"] == [{"name": "training.global_batch_size", "before": 16, "after": 32}]
    # Nothing changed in either: no such sections.
    assert "fields" not in run(runner, "diff", in_tmp / "a", in_tmp / "a").output


# ---- plan --check of plan directories and their pictures --------------------------------------


def test_check_compares_the_pictures_when_the_plan_directory_has_plots(runner, in_tmp):
    out = in_tmp / "p"
    args = ["plan", "examples/tiny.yaml", "--cluster", "local", "--out", out]
    assert run(runner, *args, "--plot").exit_code == 0
    r = run(runner, *args, "--check")
    assert r.exit_code == 0 and "up to date (9 files)" in r.output, r.output  # 6 files and 3 pictures
    old = {p.name: p.read_text() for p in (out / "plots").iterdir()}
    # Re-planned with another layout: `plan` redraws the pictures already there (so that they do not
    # show the plan before), and --check agrees.
    assert run(runner, *args, "--tp", "2").exit_code == 0
    assert (out / "plots" / "memory.svg").read_text() != old["memory.svg"]
    assert run(runner, *args, "--tp", "2", "--check").exit_code == 0
    # The pictures of the plan before, committed beside the new plan: stale, named, no SVG dumped.
    for name, text in old.items():
        (out / "plots" / name).write_text(text)
    r = run(runner, *args, "--tp", "2", "--check")
    assert r.exit_code == 1
    for name in ("memory.svg", "time.svg", "schedule.svg"):
        assert f"plots/{name} differs from the picture of the regenerated plan" in r.output
    assert "<svg" not in r.output and "plan.yaml" not in r.stdout
    (out / "plots" / "time.svg").unlink()
    assert "plots/time.svg is missing from the picture" in run(runner, *args, "--tp", "2", "--check").output
    # The measured runs' picture depends on runs, not on the plan: not compared. No plots/: no pictures.
    run(runner, "plot", out)
    (out / "plots" / "steps.svg").write_text("<svg/>\n")
    assert run(runner, *args, "--tp", "2", "--check").exit_code == 0
    shutil.rmtree(out / "plots")
    assert "up to date (6 files)" in run(runner, *args, "--tp", "2", "--check").output


def test_check_replans_plan_directories_from_what_they_recorded(runner, in_tmp, monkeypatch):
    plans = in_tmp / "plans"
    # The local profile's hardware as a SLURM cluster's: the local executor runs one node only.
    (in_tmp / "profiles").mkdir()
    (in_tmp / "profiles" / "cpus.yaml").write_text("extends: local\nexecutor: slurm\n")
    monkeypatch.setenv("DSORCH_PROFILES_DIR", str(in_tmp / "profiles"))
    made = {
        "default": ["examples/tiny.yaml", "--cluster", "local"],
        # every recorded input away from its default: nodes, GPUs per node, runtime, pins, margin, --top
        "resized": ["examples/tiny.yaml", "--cluster", "cpus", "--nodes", "2", "--gpus-per-node", "2",
                    "--runtime", "megatron", "--tp", "2", "--no-sp", "--memory-margin", "1", "--top", "12"],
    }
    for name, args in made.items():
        assert run(runner, "plan", *args, "--out", plans / name, "--plot").exit_code == 0
    r = run(runner, "plan", "--check", plans / "default", plans / "resized")
    assert r.exit_code == 0, r.output
    assert "plans/default: up to date (9 files)." in r.output and "plans/resized: up to date (8 files)." in r.output
    # The spec is found relative to the plan directory, from anywhere; a SPEC may come along.
    (in_tmp / "sub").mkdir()
    monkeypatch.chdir(in_tmp / "sub")
    r = run(runner, "plan", "--check", "../plans/resized/", "../examples/tiny.yaml", "--cluster", "local", "--out",
            "../plans/default")
    assert r.exit_code == 0, r.output
    monkeypatch.chdir(in_tmp)
    # Stale: the diff, which directory, and the command that updates it.
    (plans / "resized" / "launch.sh").write_text("#!/bin/sh\n")
    r = run(runner, "plan", "--check", "plans/default", "plans/resized")
    assert r.exit_code == 1
    assert "+++ plans/resized/launch.sh (regenerated)" in r.stdout
    assert ("plans/resized differs from what dsorch 0.1.0 generates for its recorded inputs; run `dsorch plan "
            "plans/resized` to update it.") in r.stderr
    assert "1 of 2 stale: plans/resized" in r.stderr
    # That command: the plan directory planned again in place, from its record.
    assert run(runner, "plan", plans / "resized").exit_code == 0
    assert run(runner, "plan", "--check", plans / "resized").exit_code == 0


def test_check_of_a_plan_directory_reports_a_changed_profile(runner, in_tmp, monkeypatch):
    """The profile is looked up by name as `--cluster` would; what changed in it since is the report."""
    prof = in_tmp / "prof"
    prof.mkdir()
    # As a SLURM cluster's profile, which may grow: the local executor runs one node only.
    shipped = (PROFILES / "local.yaml").read_text().replace("executor: local", "executor: slurm")
    (prof / "local.yaml").write_text(shipped)
    monkeypatch.setenv("DSORCH_PROFILES_DIR", str(prof))
    for name, extra in (("follows", []), ("pinned", ["--nodes", "1"])):
        assert run(runner, "plan", "examples/tiny.yaml", "--cluster", "local", "--out", in_tmp / name,
                   *extra).exit_code == 0
    assert run(runner, "plan", "--check", in_tmp / "follows", in_tmp / "pinned").exit_code == 0
    # The cluster grows: a plan made without --nodes follows the profile, one made with it keeps its count.
    (prof / "local.yaml").write_text(shipped.replace("nodes: 1", "nodes: 2"))
    r = run(runner, "plan", "--check", in_tmp / "follows")
    assert r.exit_code == 1
    assert "the cluster profile local changed since this plan was made: nodes 1 -> 2." in r.stderr
    assert "-  nodes: 1\n+  nodes: 2\n" in r.stdout
    r = run(runner, "plan", "--check", in_tmp / "pinned")
    assert r.exit_code == 1 and "world_size" not in r.stdout  # still 1 node: only the profile's hash differs
    assert "changed since this plan was made: only what --nodes/--gpus-per-node override here" in r.stderr
    # Without its profiles directory the name finds the shipped profile: said so, with the fix.
    monkeypatch.delenv("DSORCH_PROFILES_DIR")
    (prof / "local.yaml").write_text(shipped.replace("memory_gib: 4", "memory_gib: 6"))
    assert run(runner, "plan", "--check", in_tmp / "follows", "--profiles-dir", prof).exit_code == 1
    r = run(runner, "plan", "--check", in_tmp / "pinned")
    assert "the cluster profile local was a user profile when planned and is a shipped one now" in r.stderr
    assert "--profiles-dir" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--cluster", "local"], "--cluster: a PLAN_DIR is planned again from the inputs its plan.yaml recorded"),
    (["--tp", "2", "--memory-margin", "1"], "--tp, --memory-margin: a PLAN_DIR is planned again"),
    (["--out", "elsewhere"], "--out: a PLAN_DIR is planned again"),
])
def test_flags_that_set_inputs_are_refused_with_only_plan_directories(runner, in_tmp, args, message):
    assert run(runner, "plan", "examples/tiny.yaml", "--cluster", "local", "--out", "p").exit_code == 0
    for cmd in (["plan", "p", *args], ["plan", "--check", "p", *args]):
        r = run(runner, *cmd)
        assert r.exit_code == 2 and message in r.output, r.output


def test_check_of_plan_directories_that_cannot_be_replanned(runner, in_tmp):
    spec = in_tmp / "tiny.yaml"
    spec.write_text((in_tmp / "examples" / "tiny.yaml").read_text())
    for name in ("moved", "ok", "trial"):
        assert run(runner, "plan", spec if name == "moved" else "examples/tiny.yaml", "--cluster", "local", "--out",
                   in_tmp / name).exit_code == 0
    spec.unlink()
    # plan.yaml is not hash-checked: a `dsorch trial` plan differs only by its evidence section.
    doc = (in_tmp / "trial" / "plan.yaml").read_text()
    (in_tmp / "trial" / "plan.yaml").write_text(doc + "evidence:\n  trials: ../trials\n")
    r = run(runner, "plan", "--check", "moved")
    assert r.exit_code == 2
    assert "moved/plan.yaml records the model spec ../tiny.yaml (relative to the plan directory), and tiny.yaml is " \
           "not a file" in r.output
    r = run(runner, "plan", "--check", "trial")
    assert r.exit_code == 2 and "chosen by `dsorch trial` from measured runs" in r.output
    # Several: each is still checked, and the summary names those that could not be.
    r = run(runner, "plan", "--check", "moved", "ok", "trial", "examples")
    assert r.exit_code == 2
    assert "ok: up to date" in r.stdout
    assert "3 of 4 could not be checked: moved, trial, examples" in r.stderr
    assert "examples has no plan.yaml file, so it is not a plan directory" in r.stderr
    r = run(runner, "plan", "ok", "moved")
    assert r.exit_code == 2 and "plan one at a time; several are for --check" in r.output
    r = run(runner, "plan", "--check", "examples/tiny.yaml", "examples/llama3-8b.yaml", "--cluster", "local", "--out",
            "ok")
    assert r.exit_code == 2 and "--out names one plan directory and 2 SPECs were given" in r.output


def test_the_regenerate_line_of_a_plan_made_with_top_writes_the_same_directory(runner, in_tmp):
    """--top lists more alternatives in plan.yaml and plan.md; a regenerate line without it wrote
    another directory, and `plan --check` with the line's flags failed."""
    import shlex

    out = in_tmp / "p"
    assert run(runner, "plan", "examples/tiny.yaml", "--cluster", "local", "--top", "12", "--out", out).exit_code == 0
    command = _doc_header(out).split("Regenerate (model spec path relative to this directory): ", 1)[1]
    assert command.endswith(" --top 12")
    words = shlex.split(command.replace("<this dir>", shlex.quote(str(out))))[2:]
    words[0] = str(out / words[0])  # the spec path is relative to the plan directory
    r = run(runner, "plan", *words, "--check")
    assert r.exit_code == 0, r.output
    # The default lists as many as --top up to 8: the line leaves --top out.
    assert run(runner, "plan", "examples/tiny.yaml", "--cluster", "local", "--top", "3", "--out", out).exit_code == 0
    assert "--top" not in _doc_header(out)


def _doc_header(plan_dir: Path) -> str:
    return (plan_dir / "plan.yaml").read_text().splitlines()[1]
