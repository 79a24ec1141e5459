"""`dsorch status`, `logs`, `cancel`: the jobs of this experiment directory followed (cli/submit.py
submits them)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from orchestrator.cli.common import UserError, make_console, open_registry, poll, tail_lines


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
    """Jobs submitted from this experiment directory: id, plan, state, elapsed, requeues, last step/loss,
    latest validation loss and perplexity."""
    from orchestrator.run.backends import backend_for
    from orchestrator.run.submission import eval_text, latest_eval, refresh

    reg = open_registry()
    if repair:
        kept, lost, backup = reg.repair()
        if backup is None:
            click.echo(f"{reg.path}: intact ({kept} job(s)); nothing to repair.")
        else:
            click.echo(f"{reg.path}: repaired; {kept} job(s) kept, {lost} unreadable; the damaged file is {backup}.")
        return
    records = [refresh(reg, r) for r in reg.all()]
    evals = [latest_eval(Path(r.run_dir)) for r in records]
    if as_json:
        from dataclasses import asdict

        click.echo(json.dumps([{**asdict(r), "last_eval": ev} for r, ev in zip(records, evals, strict=True)], indent=2))
        return
    if not records:
        click.echo("no jobs submitted from this experiment directory yet (dsorch submit [PLAN_DIR])")
        return
    from orchestrator.cli.console import job_table

    con = make_console()
    con.print(job_table(records, [eval_text(ev) for ev in evals]))
    # Whose states this machine cannot see (SLURM's without sacct here): the last seen stays.
    blind = {(b.executor, why) for b in (backend_for(r) for r in records if r.active) if (why := b.blind())}
    for executor, why in sorted(blind):
        con.print(
            f"note: {why}, so {executor} jobs show the state last seen; run `dsorch status` on "
            f"the cluster's login node for the current one.",
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
    from orchestrator.run.backends import backend_for
    from orchestrator.run.submission import eval_text, latest_eval, refresh

    reg = open_registry()
    rec = reg.get(job)
    backend = backend_for(rec)
    if backend.stream_logs(rec.job_id, rank, follow):  # kept elsewhere (a login node): printed from there
        return
    out, err = backend.log_paths(Path(rec.log_dir), rec.job_id, rank)
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
        ev = latest_eval(Path(rec.run_dir))
        if ev is not None:
            click.echo(f"==> latest evaluation (validation loss (perplexity) @ step): {eval_text(ev)}")
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
        why = backend.blind()
        if why:
            click.echo(
                f"dsorch logs: {why}, so the end of job {rec.job_id} cannot be seen; "
                f"stopped following (the job goes on).",
                err=True,
            )
            break


@click.command()
@click.argument("job")
def cancel(job):
    """Cancel a pending or running job."""
    from orchestrator.run.backends import backend_for

    reg = open_registry()
    rec = reg.get(job)
    if not rec.active:
        raise UserError(f"job {rec.job_id} is already {rec.state}; nothing to cancel.")
    if rec.job_id != "pending":  # a row whose submission never reached the scheduler
        backend_for(rec).cancel(rec.job_id)
    reg.update(rec.key, state="CANCELLED")
    click.echo(f"cancelled job {rec.job_id}")
