"""`dsorch submit`, `status`, `logs`, `cancel`: a plan directory run as a job, and the job followed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from orchestrator.cli.common import (
    UserError,
    complete_cluster,
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
@click.option(
    "--cluster",
    "-c",
    default=None,
    metavar="NAME",
    shell_complete=complete_cluster,
    help="Cluster to run on; default: the one the plan was made for. Without PLAN_DIR it picks the plan: "
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
    "--data",
    type=click.Path(dir_okay=False),
    default=None,
    help="Token file NAME (NAME.bin + NAME.json) to train on (default: deterministic synthetic tokens).",
)
@click.option(
    "--save-interval",
    type=click.IntRange(0, 1_000_000_000_000),
    default=0,
    show_default=True,
    help="Checkpoint every N steps (0: only at the end and when preempted).",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where checkpoints and metrics.jsonl go; default runs/<plan>-<key>.",
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
    data,
    run_dir,
    save_interval,
    resume,
    resume_from,
    dry_run,
    force,
    wait,
    profiles_dir,
):
    """Submit PLAN_DIR as a job running dsorch's training entrypoint (SLURM through submitit, or local)."""
    from orchestrator.cli.project import find_plan
    from orchestrator.run import scheduler
    from orchestrator.run.registry import Registry
    from orchestrator.run.submission import prepare_submission, record_submission

    ds_env()
    project = cwd_project()
    if plan_dir is None:
        plan_dir = find_plan(project, Path.cwd(), project.cluster(cluster))
        click.echo(f"plan: {display_path(plan_dir)}", err=True)
    reg = Registry(project.root)
    if resume and run_dir is not None:
        raise UserError("--resume continues the newest run of the plan and --run-dir names one; pass one of them.")
    if resume_from is not None:
        if resume or run_dir is not None:
            raise UserError("--resume-from names the run to continue; pass it without --resume or --run-dir.")
        if not (resume_from / "checkpoints").is_dir():
            raise UserError(
                f"--resume-from {resume_from}: no checkpoints/ in it, so there is nothing to resume from; "
                f"name the run directory of the job to continue (`dsorch status` shows them)."
            )
        run_dir = resume_from
    sub = prepare_submission(
        plan_dir,
        cluster,
        nodes,
        steps,
        data,
        run_dir,
        resolve_profiles_dir(project, profiles_dir),
        project.root,
        save_interval,
        runs_dir=project.runs_dir,
    )
    if resume:
        from dataclasses import replace

        earlier = [r for r in reg.all() if r.plan_dir == sub.plan_display and r.run_dir]
        if not earlier:
            raise UserError(
                f"--resume: no earlier job of {sub.plan_display} in this experiment directory; submit without --resume."
            )
        previous = earlier[-1].run_dir
        sub = replace(sub, run_dir=Path(previous), job=replace(sub.job, run_dir=previous))
        click.echo(f"resuming job {earlier[-1].job_id}'s run: {previous}", err=True)
    if dry_run:
        if sub.spec.kind == "local":
            click.echo(
                f"# --cluster local: {sub.spec.tasks_per_node} processes on this machine through "
                f"submitit's LocalExecutor (no sbatch script).",
                err=True,
            )
        else:
            click.echo(scheduler.sbatch_script(sub.spec, sub.folder), nl=False)
        return
    scheduler.check_scheduler(sub.spec.kind, dry_run="prints the sbatch script")
    record = record_submission(reg, sub, force)
    click.echo(
        f"submitted job {record.job_id} ({record.executor}, cluster {record.cluster}): plan {record.plan_dir}, "
        f"run dir {record.run_dir}"
    )
    click.echo(f"  logs: dsorch logs {record.job_id} [--rank N] [--follow]    status: dsorch status")
    if wait:
        from orchestrator.plandir.reader import load_plan_dir

        # The entrypoint trains to --steps, else the plan's length, else 20 (orchestrator/train/entry.py).
        _wait_for(record.key, steps or load_plan_dir(sub.plan_dir).spec.training.train_steps or 20)


def _wait_for(key: int, total_steps: int | None = None) -> None:
    """Poll the job until it ends. On a terminal: a progress bar of steps (the entrypoint's
    metrics.jsonl) against ``total_steps``; elsewhere a line per change of state."""

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


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--all", "show_all", is_flag=True, help="Also show the traceback tail of every failed job.")
@click.option(
    "--repair",
    is_flag=True,
    help="Repair a damaged job registry: keep it aside as jobs.sqlite.damaged-<time>, copy every row that "
    "still reads into a new one.",
)
def status(as_json, show_all, repair):
    """Jobs submitted from this experiment directory: id, plan, state, elapsed, requeues, last step/loss."""
    from orchestrator.run.submission import refresh

    reg = open_registry()
    if repair:
        kept, lost, backup = reg.repair()
        if backup is None:
            click.echo(f"{reg.path}: intact ({kept} job(s)); nothing to repair.")
        else:
            click.echo(f"{reg.path}: repaired; {kept} job(s) kept, {lost} unreadable; the damaged file is {backup}.")
        return
    records = [refresh(reg, r) for r in reg.all()]
    if as_json:
        from dataclasses import asdict

        click.echo(json.dumps([asdict(r) for r in records], indent=2))
        return
    if not records:
        click.echo("no jobs submitted from this experiment directory yet (dsorch submit [PLAN_DIR])")
        return
    from orchestrator.cli.console import job_table

    con = make_console()
    con.print(job_table(records))
    import shutil

    if any(r.executor == "slurm" and r.active for r in records) and shutil.which("sacct") is None:
        con.print(
            "note: sacct is not on PATH here, so SLURM jobs show the state last seen; run `dsorch status` on "
            "the cluster's login node for the current one.",
            markup=False,
        )
    for r in records:
        if r.state not in ("COMPLETED", "CANCELLED") and r.error and (show_all or r is records[-1] or not r.active):
            con.print(f"\njob {r.job_id} {r.state}: last lines of the error (full log: {r.log_dir}):", markup=False)
            con.print(tail_lines(r.error, 8), markup=False, highlight=False)


@click.command()
@click.argument("job")
@click.option("--rank", type=click.IntRange(0, 10_000_000), default=0, show_default=True, help="Which task's log.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the job ends.")
def logs(job, rank, follow):
    """Print a job's log (stdout, then stderr) for one rank."""
    import shutil

    from orchestrator.run import scheduler
    from orchestrator.run.submission import refresh

    reg = open_registry()
    rec = reg.get(job)
    out, err = scheduler.log_paths(Path(rec.log_dir), rec.job_id, rank)
    if not follow:
        if not out.exists() and not err.exists():
            raise UserError(
                f"no log for rank {rank} of job {rec.job_id} yet in {rec.log_dir} (state {rec.state}); "
                f"a pending job has none, and ranks go from 0 to world size - 1."
            )
        for path in (out, err):
            if path.exists():
                click.echo(f"==> {path} <==")
                click.echo(path.read_text(errors="replace"), nl=False)
        return
    offsets = {out: 0, err: 0}

    def print_new_lines_then_refresh():
        for path in (out, err):
            if path.exists():
                with open(path, errors="replace") as fh:
                    fh.seek(offsets[path])
                    chunk = fh.read()
                    offsets[path] = fh.tell()
                if chunk:
                    click.echo(chunk, nl=False)
        return refresh(reg, reg.get(job))

    for rec in poll(print_new_lines_then_refresh, every_s=1):
        if not rec.active:
            break
        if rec.executor == "slurm" and shutil.which("sacct") is None:
            click.echo(
                f"dsorch logs: sacct is not on PATH here, so the end of job {rec.job_id} cannot be seen; "
                f"stopped following (the job goes on).",
                err=True,
            )
            break


@click.command()
@click.argument("job")
def cancel(job):
    """Cancel a pending or running job."""
    from orchestrator.run import scheduler

    reg = open_registry()
    rec = reg.get(job)
    if not rec.active:
        raise UserError(f"job {rec.job_id} is already {rec.state}; nothing to cancel.")
    if rec.job_id != "pending":  # a row whose submission never reached the scheduler
        scheduler.cancel(rec.executor, rec.job_id)
    reg.update(rec.key, state="CANCELLED")
    click.echo(f"cancelled job {rec.job_id}")
