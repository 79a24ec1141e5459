"""`dsorch submit`: a plan directory run as a job through its profile's scheduler backend (SLURM,
local, or SLURM on the login node over SSH: run/backends/), and with --wait followed to its end."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.cli.common import (
    UserError,
    cluster_option,
    cwd_project,
    display_path,
    ds_env,
    make_console,
    open_registry,
    poll,
    profiles_dir_option,
    resolve_profiles_dir,
    tail_lines,
)
from orchestrator.plandir.rundir import CHECKPOINTS_DIR, METRICS_FILE, RunDir

if TYPE_CHECKING:  # the command imports these when it runs, so that `dsorch --help` stays fast
    from orchestrator.run.registry import Registry
    from orchestrator.run.submission import Submission


@click.command(
    epilog="""\b
Examples:
  dsorch submit plans/llama3-70b-dgx16          # to the cluster the plan was made for
  dsorch submit --cluster dgx16                 # the one plan for dgx16 in plans/ (or this plan directory)
  dsorch submit plans/llama3-70b-dgx16 --dry-run   # print the sbatch script, submit nothing
  dsorch submit plans/tiny-local --wait         # a plan for `local` runs on this machine
"""
)
@click.argument("plan_dir", type=click.Path(path_type=Path), required=False)
@cluster_option(
    "Cluster to run on; default: the one the plan was made for. Without PLAN_DIR it picks the plan: "
    "this directory if it is one, else the one plan for the cluster (--cluster, $DSORCH_CLUSTER or "
    "dsorch.yaml) in the plans directory. `local` runs on this machine.",
)
@click.option(
    "--nodes",
    type=click.IntRange(1, 1_000_000),
    default=None,
    help="Node count you expect; refused when the plan was made for another.",
)
@click.option(
    "--steps", type=click.IntRange(1, 1_000_000_000_000), default=None, help="Training steps (default: the plan's)."
)
@click.option(
    "--extend-schedule",
    is_flag=True,
    help="With --steps past the plan's steps: stretch the learning-rate decay to --steps (default: refused).",
)
@click.option(
    "--data",
    type=click.Path(dir_okay=False),
    default=None,
    help="Dataset NAME to train on instead of the plan's training.data: NAME.bin with NAME.idx (Megatron-LM's "
    "indexed dataset) or NAME.json (a token file). Kept in the job registry: --resume and requeues train on it "
    "again. Default: the plan's training.data, else synthetic tokens.",
)
@click.option(
    "--switch-data",
    is_flag=True,
    help="Resume on other data than the checkpoint was trained on, on purpose (the entrypoint refuses it "
    "otherwise); recorded in the next checkpoint's manifest.",
)
@click.option(
    "--save-interval",
    type=click.IntRange(0, 1_000_000_000_000),
    default=None,
    help="Checkpoint every N steps (0: only at the end and when preempted). Default: the plan's interval, "
    "chosen for the cluster's failure rate (plan.md says how).",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help=f"Where checkpoints and {METRICS_FILE} go; default runs/<plan>-<key>.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the newest job of this plan: its run directory, from its newest intact checkpoint "
    "(after a failure or a cancel).",
)
@click.option(
    "--resume-from",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    metavar="RUN_DIR",
    help="Continue the run in RUN_DIR with this plan, from its newest checkpoint: one this plan's layout "
    "wrote, or the conversion `dsorch replan RUN_DIR` made for it.",
)
@click.option("--dry-run", is_flag=True, help="Print the sbatch script submitit would submit; submit nothing.")
@click.option("--force", is_flag=True, help="Submit even if a job of this plan is pending or running.")
@click.option("--wait", is_flag=True, help="Wait for the job to finish and print its final state.")
@profiles_dir_option
def submit(
    plan_dir,
    cluster,
    nodes,
    steps,
    extend_schedule,
    data,
    run_dir,
    save_interval,
    switch_data,
    resume,
    resume_from,
    dry_run,
    force,
    wait,
    profiles_dir,
):
    """Submit PLAN_DIR as a job running dsorch's training entrypoint, or for a --runtime megatron plan
    Megatron-LM's pretrain_gpt.py through the plan's launch.sh (SLURM through submitit, or local)."""
    from orchestrator.cli.project import find_plan
    from orchestrator.run.backends import backend_for
    from orchestrator.run.registry import Registry
    from orchestrator.run.submission import prepare_submission, record_submission, relay_of, remote_args

    ds_env()
    project = cwd_project()
    if plan_dir is None:
        plan_dir = find_plan(project, Path.cwd(), project.cluster(cluster))
        click.echo(f"plan: {display_path(plan_dir)}", err=True)
    reg = Registry(project.root)
    run_dir = _run_dir(run_dir, resume, resume_from)
    pdir = resolve_profiles_dir(project, profiles_dir)
    sub = prepare_submission(
        plan_dir,
        cluster,
        nodes,
        steps,
        data,
        run_dir,
        pdir,
        project.root,
        save_interval,
        runs_dir=project.runs_dir,
        switch_data=switch_data,
        extend_schedule=extend_schedule,
    )
    backend = backend_for(sub.spec)
    if backend.relays:  # the profile's login section: the login node's dsorch submits, with these options
        local_only = {"--data": data, "--run-dir": run_dir, "--resume": resume, "--resume-from": resume_from}
        args = remote_args(sub.cluster, local_only, steps, extend_schedule, save_interval)
        backend = backend.relay(relay_of(sub, project.root, pdir, args, force))
    elif resume:
        sub = _resumed(reg, sub)
    elif resume_from is not None:
        sub = _same_data(reg, sub, str(resume_from.resolve()))
    if dry_run:  # the batch script, or a comment line where there is none
        click.echo(backend.script(sub.spec, sub.folder, sub.job), nl=False, err=not backend.has_script)
        return
    backend.check(dry_run="prints the sbatch script")
    record = record_submission(reg, sub, force, backend)
    click.echo(
        f"submitted job {record.job_id} ({record.executor}, cluster {record.cluster}): plan {record.plan_dir}, "
        f"run dir {record.run_dir}"
    )
    click.echo(f"  logs: dsorch logs {record.job_id} [--rank N] [--follow]    status: dsorch status")
    if wait:
        from orchestrator.plandir.reader import load_plan_dir
        from orchestrator.train.loop.lr_schedule import steps_to_train

        # The step the entrypoint trains to (orchestrator/train/loop/entry.py).
        _wait_for(record.key, steps_to_train(load_plan_dir(sub.plan_dir).spec.training, steps))


def _run_dir(run_dir: Path | None, resume: bool, resume_from: Path | None) -> Path | None:
    """The run directory --run-dir or --resume-from names (--resume finds its own once the plan is
    known); the flags name one run at most."""
    if resume and run_dir is not None:
        raise UserError("--resume continues the newest run of the plan and --run-dir names one; pass one of them.")
    if resume_from is None:
        return run_dir
    if resume or run_dir is not None:
        raise UserError("--resume-from names the run to continue; pass it without --resume or --run-dir.")
    if not RunDir(resume_from).checkpoints.is_dir():
        raise UserError(
            f"--resume-from {resume_from}: no {CHECKPOINTS_DIR}/ in it, so there is nothing to resume from; "
            f"name the run directory of the job to continue (`dsorch status` shows them)."
        )
    return resume_from


def _resumed(reg: Registry, sub: Submission) -> Submission:
    """--resume: the submission moved into the run directory of the plan's newest job."""
    from dataclasses import replace

    earlier = [r for r in reg.all() if r.plan_dir == sub.plan_display and r.run_dir]
    if not earlier:
        raise UserError(
            f"--resume: no earlier job of {sub.plan_display} in this experiment directory; submit without --resume."
        )
    previous = earlier[-1].run_dir
    click.echo(f"resuming job {earlier[-1].job_id}'s run: {previous}", err=True)
    return _same_data(reg, replace(sub, run_dir=Path(previous), job=replace(sub.job, run_dir=previous)), previous)


def _same_data(reg: Registry, sub: Submission, run_dir: str) -> Submission:
    """A resumed run trains on what its newest job trained on: that job's --data (the registry keeps
    it) unless this submission names other data, which the entrypoint then checks against the
    checkpoint's fingerprint (it refuses other data without --switch-data)."""
    from dataclasses import replace

    from orchestrator.run.jobs import TrainingJob

    jobs = [r for r in reg.all() if r.run_dir == run_dir]
    if not isinstance(sub.job, TrainingJob) or sub.job.data is not None or not jobs or jobs[-1].data is None:
        return sub
    click.echo(f"data: {jobs[-1].data} (job {jobs[-1].job_id}'s --data)", err=True)
    return replace(sub, job=replace(sub.job, data=jobs[-1].data))


def _wait_for(key: int, total_steps: int | None = None) -> None:
    """Poll the job until it ends. On a terminal: a progress bar of steps (the entrypoint's
    step records) against ``total_steps``; elsewhere a line per change of state."""

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from orchestrator.run.submission import refresh

    reg = open_registry()
    con = make_console(stderr=True)
    last = None
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=con,
        disable=not con.is_terminal,
        transient=True,
    ) as bar:
        task = bar.add_task("queued", total=total_steps)
        for rec in poll(lambda: refresh(reg, reg.get(str(key))), every_s=2):
            loss = f", loss {rec.last_loss:.4f}" if rec.last_loss is not None else ""
            bar.update(task, completed=rec.last_step or 0, description=f"job {rec.job_id}: {rec.state}{loss}")
            if not con.is_terminal and rec.state != last:
                click.echo(f"job {rec.job_id}: {rec.state}", err=True)
            last = rec.state
            if not rec.active:
                break
    click.echo(
        f"job {rec.job_id}: {rec.state}"
        + (f" at step {rec.last_step}, loss {rec.last_loss:.4f}" if rec.last_step is not None else "")
    )
    if rec.state != "COMPLETED":
        if rec.error:
            click.echo(tail_lines(rec.error, 15), err=True)
        sys.exit(1)
