"""`dsorch calibrate`, `replan`: a cluster profile fitted to measured runs, and a run re-planned for
another number of nodes (cli/trial.py measures and calibrates in one command)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from orchestrator.cli.common import (
    UserError,
    cluster_option,
    cwd_project,
    display_path,
    ds_env,
    load_cluster,
    pin_options,
    profiles_dir_option,
    resolve_profiles_dir,
)


@click.command(
    epilog="""\b
Examples:
  dsorch replan runs/llama3-8b-dgx16-3 --nodes 12      # a run dir
  dsorch replan 41234 --nodes 12                         # or the job that wrote it
  dsorch submit plans/llama3-8b-dgx16-12n --resume-from runs/llama3-8b-dgx16-3
"""
)
@click.argument("run", metavar="RUN_DIR|JOB")
@click.option("--nodes", type=click.IntRange(1, 1_000_000), default=None, help="Nodes to go on with.")
@click.option(
    "--gpus-per-node",
    type=click.IntRange(1, 1024),
    default=None,
    help="GPUs (processes) per node to go on with (default: as planned).",
)
@click.option(
    "--out",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The new plan directory (default: the old one's name plus -<N>n).",
)
@pin_options(
    "tp",
    "pp",
    "dp",
    "zero_stage",
    "micro_batch_size",
    zero_stage=dict(low=1, high=2, help="Pin the ZeRO stage (1 or 2: what converts)."),
    micro_batch_size=dict(help="Pin the micro-batch size."),
)
@profiles_dir_option
def replan(run, nodes, gpus_per_node, out, pins, profiles_dir):
    """Re-plan a run for another number of nodes and convert its newest checkpoint to the new layout.

    The same spec and global batch, planned for the new world; the fastest layout DeepSpeed's
    universal checkpoint can convert to (ZeRO-1/2) is chosen; the newest intact checkpoint is
    converted beside it (checkpoints/universal_stepN). Continue with `dsorch submit NEW_PLAN
    --resume-from RUN_DIR`: step, LR schedule and optimizer state carry over, metrics.jsonl goes on.
    """
    from orchestrator.run.replan import find_run
    from orchestrator.run.replan import replan as do_replan

    ds_env()
    if nodes is None and gpus_per_node is None:
        raise UserError("pass --nodes N (and/or --gpus-per-node G): the world to go on with.")
    project = cwd_project()
    run_dir = find_run(project, run)
    r = do_replan(project, run_dir, nodes, gpus_per_node, pins, out, resolve_profiles_dir(project, profiles_dir))
    p = r.plan
    click.echo(f"{display_path(run_dir)}: checkpoint of step {r.step}, layout {r.source.short()}")
    click.echo(
        f"re-planned for {p.profile.nodes} x {p.profile.gpus_per_node} of {p.profile.name}: {p.layout.short()}, "
        f"{p.chosen.memory_gib['total']:.1f} GiB per GPU, predicted {p.chosen.step_time_s:.3g} s/step "
        f"(global batch {p.layout.global_batch_size} kept)"
    )
    click.echo(
        f"wrote {display_path(r.out)}/; converted the checkpoint to {display_path(r.universal)}/ (DeepSpeed universal)"
    )
    click.echo(f"  continue: dsorch submit {display_path(r.out)} --resume-from {display_path(run_dir)}")


@click.command(
    epilog="""\b
Examples:
  dsorch calibrate runs/tiny-1 --cluster local --out my-local.yaml
  dsorch calibrate measured.jsonl --cluster dgx16 --name dgx16-calibrated --out profiles/dgx16-calibrated.yaml
"""
)
@click.argument("metrics", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@cluster_option(
    "Profile whose efficiencies to fit; default $DSORCH_CLUSTER, then cluster in dsorch.yaml.",
)
@click.option(
    "--plan",
    "plan_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Plan directory the runs used (default: found next to each metrics.jsonl).",
)
@click.option("--name", default=None, help="Name of the calibrated profile (default: NAME-calibrated).")
@click.option(
    "--out",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the calibrated profile here (default: print it).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the fit report as JSON.")
@profiles_dir_option
def calibrate(metrics, cluster, plan_dir, name, out, as_json, profiles_dir):
    """Fit a profile's efficiencies to measured step times and write a calibrated profile.

    METRICS are run directories or metrics.jsonl files written by the training entrypoint, or
    record files (YAML/JSONL of {layout, model, step_time_s, peak_mem_gib}; see
    orchestrator/calibrate/__init__.py).
    """
    from orchestrator.calibrate import calibrate as fit
    from orchestrator.calibrate import calibrated_profile_yaml

    project = cwd_project()
    lp = load_cluster(project, project.cluster(cluster), resolve_profiles_dir(project, profiles_dir))
    calibrated, report = fit(list(metrics), lp.profile, plan_dir=plan_dir)
    text = calibrated_profile_yaml(calibrated, report, name=name)
    if out is not None:
        from orchestrator.plandir.writer import write_text_atomic

        write_text_atomic(out, text)
    doc = report.as_dict()
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    elif out is None:
        click.echo(text, nl=False)
    if not as_json:
        from orchestrator.cli.console import calibration_summary

        click.echo(calibration_summary(doc, out), err=out is None)
