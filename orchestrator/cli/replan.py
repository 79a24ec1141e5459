"""`dsorch replan`: a run re-planned for another number of nodes, its checkpoint converted."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.common import (
    UserError,
    cwd_project,
    display_path,
    ds_env,
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
    --resume-from RUN_DIR`: step, LR schedule and optimizer state carry over, the step records go on.
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
