"""The pictures of a plan, drawn into a directory (``draw_all``), and the one drawn from measured
runs (``draw_steps``: step time and loss per step against the prediction). The memory and time
stacks are in cli/plot_stacks.py, the pipeline schedule in cli/plot_schedule.py, the deterministic
SVG figure they are drawn on in cli/plot_figure.py.

Drawn from plan.yaml alone (the stacks the search computed: the chosen layout and the alternatives), so that
``dsorch plot`` needs no search and draws what the plan says.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchestrator.calibrate.records import read_steps
from orchestrator.cli.plot_figure import figure, svg_text
from orchestrator.cli.plot_schedule import draw_schedule
from orchestrator.cli.plot_stacks import draw_memory, draw_time
from orchestrator.plandir.reader import PlanDir, predicted_step_s
from orchestrator.plandir.rundir import RunDir


def draw_steps(pd: PlanDir, runs: list[Path]) -> str:
    """Measured loss and step time per step of each run, against the predicted step time and its interval."""
    fig = figure(9.0, 5.0)
    loss_ax, time_ax = fig.subplots(2, 1, sharex=True)
    predicted = predicted_step_s(pd.path, pd.doc.predicted)
    interval = pd.doc.predicted.get("step_time_interval")
    for i, run in enumerate(runs):
        recs = read_steps(RunDir(run).metrics)
        steps = [r["step"] for r in recs]
        loss_ax.plot(steps, [r["loss"] for r in recs], label=run.name, gid=f"steps-loss-{i}")
        time_ax.plot(
            steps, [r["step_time_s"] for r in recs], marker=".", linewidth=0.8, label=run.name, gid=f"steps-time-{i}"
        )
    time_ax.axhline(
        predicted, color="#D55E00", linestyle="--", gid="steps-predicted", label=f"predicted {predicted:.4g} s"
    )
    if isinstance(interval, float):
        time_ax.axhspan(
            predicted * (1 - interval), predicted * (1 + interval), color="#D55E00", alpha=0.12, gid="steps-interval"
        )
    loss_ax.set_ylabel("loss")
    time_ax.set_ylabel("step time (s)")
    time_ax.set_xlabel("step")
    loss_ax.set_title(f"{pd.doc.model.name} on {pd.doc.cluster.name}: measured per step", loc="left")
    time_ax.legend(fontsize=8, frameon=False)
    return svg_text(fig)


# The pictures of the plan alone, as plan.md embeds them: what `plan --check` redraws and compares
# when the plan directory has plots/. steps.svg is not one of them: it draws measured runs.
PICTURES = {"memory.svg": draw_memory, "time.svg": draw_time, "schedule.svg": draw_schedule}


def pictures(pd: PlanDir) -> dict[str, str]:
    """The plan's pictures as SVG text, by file name (in memory: `plan --check` compares them)."""
    return {name: draw(pd) for name, draw in PICTURES.items()}


def draw_all(pd: PlanDir, out: Path, runs: Sequence[Path] = ()) -> list[Path]:
    """Every picture of the plan into ``out``; the measured one only when runs are given."""
    from orchestrator.plandir.writer import write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    made = []
    for name, svg in pictures(pd).items():
        write_text_atomic(out / name, svg)
        made.append(out / name)
    measured = [r for r in runs if RunDir(r).has_metrics()]
    if measured:
        write_text_atomic(out / "steps.svg", draw_steps(pd, measured))
        made.append(out / "steps.svg")
    return made
