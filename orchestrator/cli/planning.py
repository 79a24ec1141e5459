"""`dsorch plan`: a plan directory made from a model spec and a cluster profile, or checked against
what it would be now (`--check`, cli/check.py)."""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.cli.common import (
    EPILOG,
    UserError,
    check_out_path,
    cluster_option,
    cwd_project,
    display_path,
    ds_env,
    load_cluster,
    make_console,
    pin_options,
    profiles_dir_option,
    resolve_profiles_dir,
)
from orchestrator.plan.layout import PINNABLE
from orchestrator.plan.request import KEEP
from orchestrator.runtimes import DEFAULT, RUNTIME_NAMES, Runtime, runtime_named

if TYPE_CHECKING:  # the commands import these when they run, so that `dsorch --help` stays fast
    from orchestrator.cli.project import Project, Setting
    from orchestrator.plan.layout import Pins
    from orchestrator.plan.make import Plan


@click.command(epilog=EPILOG)
@click.argument("spec", nargs=-1, required=True, metavar="SPEC|PLAN_DIR...", type=click.Path(path_type=Path))
@cluster_option(
    "Cluster profile name (see `dsorch profiles`); default $DSORCH_CLUSTER, then cluster in dsorch.yaml.",
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
    type=click.Choice(RUNTIME_NAMES),
    default=DEFAULT.name,
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
    default=None,
    metavar="GIB",
    help="Headroom to keep free on every GPU, in GiB. Default: the memory model's own largest error "
    "on published peaks, as a share of the GPU's memory (the plan says how much).",
)
@click.option("--top", type=click.IntRange(1, 10_000), default=KEEP, show_default=True, help="Rows in the table.")
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
    ds_env()
    _check_flags(spec, out, no_write=no_write, plot=plot, check=check, as_json=as_json, memory_margin=memory_margin)
    _recorded_only(click.get_current_context(), spec)
    project = cwd_project()
    setting = project.cluster(cluster)
    planned = functools.partial(
        _plan_one,
        project=project,
        setting=setting,
        profiles_dir=profiles_dir,
        out=out,
        write=not no_write,
        default_dir=check or not (no_write or as_json),
        runtime=runtime_named(runtime),
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        pins=pins,
        memory_margin=memory_margin,
        top=top,
    )
    if check:
        from orchestrator.cli.check import check as check_targets

        sys.exit(check_targets([(p, functools.partial(planned, p)) for p in spec], display_path))
    default_out = out is None and not spec[0].is_dir()
    the_plan, files, out = planned(spec[0])
    if out is not None:
        _write(out, files, plot)
    if as_json:
        from orchestrator.render.report import render_json

        click.echo(render_json(the_plan), nl=False)
        return
    from orchestrator.cli.plan_table import print_plan

    print_plan(
        make_console(),
        the_plan,
        top,
        display_path(out) if out is not None else None,
        files,
        cluster_note=None if setting.origin == "--cluster" or spec[0].is_dir() else setting,
        default_out=default_out,
    )
    if explain:
        from orchestrator.render.explain import explain_text

        click.echo()
        click.echo(explain_text(the_plan), nl=False)


def _check_flags(
    spec: tuple[Path, ...],
    out: Path | None,
    *,
    no_write: bool,
    plot: bool,
    check: bool,
    as_json: bool,
    memory_margin: float | None,
) -> None:
    """The flag combinations `dsorch plan` refuses, each with the one to drop."""
    if memory_margin is not None and not math.isfinite(
        memory_margin
    ):  # click's FloatRange lets nan through (nan < 0 is false)
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


def _plan_one(
    path: Path,
    *,
    project: Project,
    setting: Setting,
    profiles_dir: str | None,
    out: Path | None,
    write: bool,
    default_dir: bool,
    runtime: Runtime,
    nodes: int | None,
    gpus_per_node: int | None,
    pins: Pins,
    memory_margin: float | None,
    top: int,
) -> tuple[Plan, dict[str, str], Path | None]:
    """The plan of one SPEC (with the flags) or PLAN_DIR (as recorded), its files, and its directory:
    ``out``, else the default plan directory when ``default_dir``, else none."""
    from orchestrator.compose import plan_files, replan
    from orchestrator.plan.request import PlanRequest
    from orchestrator.plandir.writer import spec_path_in
    from orchestrator.spec.model import load_spec

    if path.is_dir():
        return (*replan(path, resolve_profiles_dir(project, profiles_dir)), path if write else None)
    spec_file, loaded = load_spec(path)
    lp = load_cluster(project, setting, resolve_profiles_dir(project, profiles_dir))
    to = out
    if to is None and default_dir:
        to = project.default_plan_dir(spec_file.name, lp.profile.name, runtime, nodes, gpus_per_node)
    request = PlanRequest(
        spec=spec_file,
        spec_path=spec_path_in(path, to),
        spec_sha256=loaded.sha256,
        profile=lp,
        runtime=runtime,
        pins=pins,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        memory_margin_gib=memory_margin,
        keep=max(top, KEEP),
        shown_path=str(path),
    )
    return (*plan_files(request), to)


def _write(out: Path, files: dict[str, str], plot: bool) -> None:
    """The plan directory, and its pictures when asked for or already there."""
    from orchestrator.cli.reviewing import draw_plots
    from orchestrator.plandir.writer import write_plan_dir

    write_plan_dir(out, files)
    # Pictures already there would show the plan before this one (and fail --check).
    if plot or (out / "plots").is_dir():
        draw_plots(out, out / "plots", [])


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
