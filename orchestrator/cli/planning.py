"""`dsorch plan`, `plot`, `diff`, `validate`: plan directories made, drawn, compared and checked."""

from __future__ import annotations

import functools
import json
import math
import sys
from pathlib import Path

import click

from orchestrator.cli.common import (
    EPILOG,
    UserError,
    check_out_path,
    complete_cluster,
    cwd_project,
    display_path,
    ds_env,
    load_cluster,
    make_console,
    open_registry,
    pin_options,
    profiles_dir_option,
    resolve_profiles_dir,
)
from orchestrator.plan.layout import PINNABLE, RUNTIMES


@click.command(epilog=EPILOG)
@click.argument("spec", nargs=-1, required=True, metavar="SPEC|PLAN_DIR...", type=click.Path(path_type=Path))
@click.option(
    "--cluster",
    "-c",
    default=None,
    metavar="NAME",
    shell_complete=complete_cluster,
    help="Cluster profile name (see `dsorch profiles`); default $DSORCH_CLUSTER, then cluster in dsorch.yaml.",
)
@click.option(
    "--out",
    "-o",
    type=click.Path(path_type=Path),
    default=None,
    help="Plan directory to write (ds_config.json, megatron_args.txt, launch.sh, job.sbatch, plan.yaml); "
    "default PLANS_DIR/<spec>-<cluster>/ (plans_dir in dsorch.yaml, else plans/).",
)
@click.option("--no-write", is_flag=True, help="Print the plan only; write no files.")
@click.option(
    "--plot",
    is_flag=True,
    help="Also draw the plan's pictures into PLAN_DIR/plots/ (as `dsorch plot` does; a plan directory "
    "that has plots/ gets them redrawn without it).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Regenerate in memory and compare with the files in the plan directory, and its pictures when "
    "it has plots/ (not the measured steps.svg); exit 1 with a diff if they differ. Takes several "
    "SPECs and PLAN_DIRs: `dsorch plan --check plans/*/` checks every committed plan.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the plan as JSON on stdout (no table); writes the plan directory only with --out.",
)
@click.option(
    "--explain",
    is_flag=True,
    help="Also show, for the chosen layout and each alternative, the memory and time stacks, the layouts "
    "memory rejected and by how much, and whether the top two are within the model's error.",
)
@click.option(
    "--runtime",
    type=click.Choice(RUNTIMES),
    default="deepspeed",
    show_default=True,
    help="deepspeed: dsorch's bundled entrypoint on DeepSpeed's pipeline engine (1F1B, ZeRO 0-3). "
    "megatron: Megatron-LM's pretrain_gpt.py (interleaved 1F1B, distributed optimizer).",
)
@click.option("--nodes", type=click.IntRange(1, 1_000_000), default=None, help="Override the profile's node count.")
@click.option(
    "--gpus-per-node",
    type=click.IntRange(1, 1024),
    default=None,
    help="Override the profile's GPUs (processes) per node, e.g. to plan for part of a node.",
)
@pin_options()
@click.option(
    "--memory-margin",
    type=click.FloatRange(0, 1_000_000),
    default=0.0,
    show_default=True,
    metavar="GIB",
    help="Headroom to keep free on every GPU, in GiB.",
)
@click.option("--top", type=click.IntRange(1, 10_000), default=8, show_default=True, help="Rows in the table.")
@profiles_dir_option
def plan(
    spec,
    cluster,
    out,
    no_write,
    plot,
    check,
    as_json,
    explain,
    runtime,
    nodes,
    gpus_per_node,
    pins,
    memory_margin,
    top,
    profiles_dir,
):
    """Search every legal layout for SPEC on a cluster, show the best, write the plan directory.

    Any part of the layout can be pinned (--tp 8 --pp 4 ...); the rest is searched. With every
    part pinned, exactly that layout is evaluated, and if it does not fit you are told by how much.

    A PLAN_DIR in place of SPEC is planned again from what its plan.yaml recorded (the model spec,
    relative to it; the cluster profile by name; runtime, nodes, GPUs per node, pins, memory margin)
    and written in place, or with --check compared.
    """
    from orchestrator.compose import plan_files, replan
    from orchestrator.plandir.writer import spec_path_in, write_plan_dir
    from orchestrator.spec.model import load_spec

    ds_env()
    if not math.isfinite(memory_margin):  # click's FloatRange lets nan through (nan < 0 is false)
        raise UserError(f"--memory-margin {memory_margin}: give a number of GiB, e.g. 2.")
    if out is not None:
        check_out_path(out, "--out")
    if check and no_write:
        raise UserError("--check compares with the plan directory and --no-write writes none; pass one of them.")
    if no_write and out is not None:
        raise UserError("--no-write writes no plan directory and --out names one; pass one of them.")
    if plot and (no_write or check or (as_json and out is None)):
        raise UserError(
            "--plot draws into the plan directory it writes; drop --no-write/--check, give --json an "
            "--out, or run `dsorch plot PLAN_DIR` on a written plan."
        )
    if len(spec) > 1 and not check:
        raise UserError(f"{len(spec)} SPECs or PLAN_DIRs: plan one at a time; several are for --check.")
    _recorded_only(click.get_current_context(), spec)
    project = cwd_project()
    setting = project.cluster(cluster)

    def planned(path: Path):
        """The plan of one SPEC (with the flags) or PLAN_DIR (as recorded), its files, its directory."""
        if path.is_dir():
            return (*replan(path, resolve_profiles_dir(project, profiles_dir)), None if no_write else path)
        spec_file, loaded = load_spec(path)
        lp = load_cluster(project, setting, resolve_profiles_dir(project, profiles_dir))
        to = out
        if to is None and (check or not (no_write or as_json)):
            to = project.default_plan_dir(spec_file.name, lp.profile.name, runtime, nodes, gpus_per_node)
        return (
            *plan_files(
                spec_file,
                spec_path_in(path, to),
                loaded.sha256,
                lp,
                runtime,
                pins,
                nodes=nodes,
                gpus_per_node=gpus_per_node,
                memory_margin_gib=memory_margin,
                keep=max(top, 8),
                shown_path=str(path),
            ),
            to,
        )

    if check:
        from orchestrator.cli.check import check as check_targets

        sys.exit(check_targets([(p, functools.partial(planned, p)) for p in spec], display_path))
    default_out = out is None and not spec[0].is_dir()
    the_plan, files, out = planned(spec[0])
    shown = display_path(out) if out is not None else None
    if out is not None:
        write_plan_dir(out, files)
        # Pictures already there would show the plan before this one (and fail --check).
        if plot or (out / "plots").is_dir():
            _draw(out, out / "plots", [])

    if as_json:
        from orchestrator.render.report import render_json

        click.echo(render_json(the_plan), nl=False)
        return
    from orchestrator.cli.plan_table import print_plan

    print_plan(
        make_console(),
        the_plan,
        top,
        shown,
        files,
        cluster_note=None if setting.origin == "--cluster" or spec[0].is_dir() else setting,
        default_out=default_out,
    )
    if explain:
        from orchestrator.render.explain import explain_text

        click.echo()
        click.echo(explain_text(the_plan), nl=False)


def _recorded_only(ctx: click.Context, paths: tuple[Path, ...]) -> None:
    """A PLAN_DIR is planned from what it recorded; the flags that set inputs are for SPECs, and
    with no SPEC to apply to they are refused rather than ignored. One --out is for one SPEC."""
    from click.core import ParameterSource

    specs = [p for p in paths if not p.is_dir()]
    if len(specs) > 1 and ctx.params.get("out") is not None:
        raise UserError(
            f"--out names one plan directory and {len(specs)} SPECs were given; check each SPEC with "
            f"its own --out, or check the plan directories themselves (`dsorch plan --check DIR...`)."
        )
    if specs:
        return
    given = [
        p.opts[0]
        for p in ctx.command.params
        if p.name
        in ("cluster", "out", "runtime", "nodes", "gpus_per_node", "memory_margin", *(a.name for a in PINNABLE))
        and ctx.get_parameter_source(p.name) not in (None, ParameterSource.DEFAULT)
    ]
    if given:
        raise UserError(
            f"{', '.join(given)}: a PLAN_DIR is planned again from the inputs its plan.yaml recorded; "
            f"drop {'them' if len(given) > 1 else 'it'}, or plan a SPEC with them "
            f"(`dsorch plan SPEC ... --out {display_path(paths[0])}`)."
        )


def _draw(plan_dir: Path, out: Path, runs: list[Path]) -> None:
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
    help="A run directory (with metrics.jsonl) to draw against the prediction; repeatable. Default: "
    "the runs of this plan in the job registry.",
)
def plot(plan_dir, out, runs):
    """Draw a plan: memory per GPU and time per step of the chosen layout and the alternatives, the
    chosen layout's pipeline schedule, and, when runs exist, measured step time and loss per step
    against the prediction. SVG, byte-identical for the same plan and runs."""
    if out is not None:
        check_out_path(out, "--out")
    runs = list(runs)
    missing = [r for r in runs if not (r / "metrics.jsonl").is_file()]
    if missing:
        raise UserError(
            f"--run {missing[0]}: no metrics.jsonl there; give a run directory the training "
            f"entrypoint wrote (`dsorch status` shows each job's run directory)."
        )
    if not runs:
        here = plan_dir.resolve()
        for job in open_registry().all() if (cwd_project().root / ".dsorch").is_dir() else []:
            if Path(job.plan_dir).resolve() == here and Path(job.run_dir) not in runs:
                runs.append(Path(job.run_dir))
    _draw(plan_dir, out if out is not None else plan_dir / "plots", sorted(runs))


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
    errors = validate_path(path, dp)
    if errors:
        raise UserError(f"{path}: {len(errors)} problem(s):\n  " + "\n  ".join(errors))
    click.echo(f"{path}: valid")
