"""The pictures (`dsorch plot`, `plan --plot`; orchestrator/cli/plots.py), checked for content: the bars
and rows exist and encode the plan's numbers; an old or incomplete plan.yaml says to regenerate."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from orchestrator.costmodel.stacks import MEMORY_PARTS, TIME_PARTS

from .test_report import _doc, _ranked, run

SVG = "{http://www.w3.org/2000/svg}"


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
