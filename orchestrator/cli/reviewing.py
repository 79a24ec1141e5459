"""`dsorch plot`, `diff`, `validate`: what a reviewer runs on written plan directories: a plan
drawn, two plans compared, a plan validated again with DeepSpeed's and Megatron-LM's own checks."""

from __future__ import annotations

import json
from pathlib import Path

import click

from orchestrator.cli.common import UserError, check_out_path, cwd_project, display_path, ds_env, open_registry
from orchestrator.plandir.rundir import METRICS_FILE, RunDir


def draw_plots(plan_dir: Path, out: Path, runs: list[Path]) -> None:
    """The pictures of the plan in ``plan_dir`` into ``out`` (and of ``runs`` when given), each file said."""
    from orchestrator.cli.plots import draw_all
    from orchestrator.plandir.reader import load_plan_dir

    pd = load_plan_dir(plan_dir)
    for path in draw_all(pd, out, runs):
        click.echo(f"wrote {display_path(path)}")


@click.command(
    epilog="""\b
Examples:
  dsorch plot plans/llama3-70b-dgx16                 # plots/ in the plan directory
  dsorch plot plans/tiny-local --run runs/tiny-local-1   # with a run's measured steps
"""
)
@click.argument("plan_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--out",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory for the SVG files; default PLAN_DIR/plots/.",
)
@click.option(
    "--run",
    "runs",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help=f"A run directory (with {METRICS_FILE}) to draw against the prediction; repeatable. Default: "
    "the runs of this plan in the job registry.",
)
def plot(plan_dir, out, runs):
    """Draw a plan: memory per GPU and time per step of the chosen layout and the alternatives, the
    chosen layout's pipeline schedule, and, when runs exist, measured step time and loss per step
    against the prediction. SVG, byte-identical for the same plan and runs."""
    if out is not None:
        check_out_path(out, "--out")
    runs = list(runs)
    missing = [r for r in runs if not RunDir(r).has_metrics()]
    if missing:
        raise UserError(
            f"--run {missing[0]}: no {METRICS_FILE} there; give a run directory the training "
            f"entrypoint wrote (`dsorch status` shows each job's run directory)."
        )
    if not runs:
        here = plan_dir.resolve()
        for job in open_registry().all() if (cwd_project().root / ".dsorch").is_dir() else []:
            if Path(job.plan_dir).resolve() == here and Path(job.run_dir) not in runs:
                runs.append(Path(job.run_dir))
    draw_plots(plan_dir, out if out is not None else plan_dir / "plots", sorted(runs))


@click.command(
    epilog="""\b
Examples:
  dsorch diff plans/llama3-70b-dgx16 plans/llama3-70b-dgx16-32n
  git worktree add /tmp/base main && dsorch diff /tmp/base/plans/x plans/x   # what a pull request changes
"""
)
@click.argument("plan_a", type=click.Path(file_okay=False, path_type=Path))
@click.argument("plan_b", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def diff(plan_a, plan_b, as_json):
    """What changed from plan directory PLAN_A to PLAN_B: inputs, layout, memory per GPU, predicted
    step time and MFU, the Megatron-LM flags and ds_config.json keys, and the other files that differ."""
    from orchestrator.plandir.diff import diff_plans, diff_text
    from orchestrator.plandir.reader import load_plan_dir

    d = diff_plans(load_plan_dir(plan_a), load_plan_dir(plan_b))
    if as_json:
        click.echo(json.dumps(d.as_dict(), indent=2))
        return
    click.echo(diff_text(d, display_path(plan_a), display_path(plan_b)), nl=False)


@click.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--dp",
    type=click.IntRange(1, 1_000_000_000),
    default=None,
    help="Data-parallel size to check a single ds_config.json at (a plan directory records its own).",
)
def validate(path, dp):
    """Re-validate a plan directory (or one ds_config.json) with DeepSpeed's own config classes and
    Megatron-LM's argument definitions."""
    from orchestrator.validate.plan_dir import validate_path

    ds_env()
    notes: list[str] = []
    errors = validate_path(path, dp, notes)
    if errors:
        raise UserError(f"{path}: {len(errors)} problem(s):\n  " + "\n  ".join(errors))
    click.echo(f"{path}: valid" + "".join(f"\n  note: {n}" for n in notes))
