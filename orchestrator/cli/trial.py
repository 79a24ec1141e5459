"""`dsorch trial`: the top layouts of a spec measured on the user's own cluster as one job array,
then compared with the predictions, the profile calibrated from them and the spec re-planned."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.common import (
    UserError,
    check_out_path,
    cluster_option,
    cwd_project,
    display_path,
    ds_env,
    load_cluster,
    make_console,
    open_registry,
    poll,
    profiles_dir_option,
    resolve_profiles_dir,
    status_line,
)
from orchestrator.plan.request import TRIAL_STEPS


@click.command(
    epilog="""\b
Examples:
  dsorch trial examples/tiny.yaml --cluster local --top 2 --wait
  dsorch trial examples/llama3-8b.yaml --cluster dgx16 --nodes 2 --steps 30     # submit and return
  dsorch trial --status trials/llama3-8b-dgx16-2n
  dsorch trial --collect trials/llama3-8b-dgx16-2n [--wait]
"""
)
@click.argument("target", metavar="SPEC_OR_TRIAL_DIR", type=click.Path(path_type=Path))
@cluster_option(
    "Cluster profile to measure on; default $DSORCH_CLUSTER, then cluster in dsorch.yaml.",
)
@click.option(
    "--top",
    type=click.IntRange(1, 100),
    default=3,
    show_default=True,
    help="Layouts measured by rank; the best layout of every other family is measured besides.",
)
@click.option(
    "--steps",
    type=click.IntRange(5, 100_000),
    default=TRIAL_STEPS,
    show_default=True,
    help="Steps per trial; the first fifth is warm-up and not measured.",
)
@click.option("--nodes", type=click.IntRange(1, 1_000_000), default=None, help="Override the profile's node count.")
@click.option(
    "--gpus-per-node",
    type=click.IntRange(1, 1024),
    default=None,
    help="Override the profile's GPUs (processes) per node.",
)
@click.option(
    "--out",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Trial directory to write (default trials/<spec>-<cluster>/).",
)
@click.option("--dry-run", is_flag=True, help="Show the trials and their cost; write and submit nothing.")
@click.option("--wait", is_flag=True, help="Wait for every trial (progress on stderr), then collect.")
@click.option("--status", "show_status", is_flag=True, help="SPEC_OR_TRIAL_DIR is a trial directory: show its trials.")
@click.option(
    "--collect",
    is_flag=True,
    help="SPEC_OR_TRIAL_DIR is a trial directory whose trials ended: compare, calibrate, re-plan.",
)
@click.option("--name", default=None, help="Name of the calibrated profile (default: <cluster>-measured).")
@profiles_dir_option
def trial(
    target, cluster, top, steps, nodes, gpus_per_node, out, dry_run, wait, show_status, collect, name, profiles_dir
):
    """Measure the top layouts of SPEC on the cluster, calibrate its profile from them, re-plan.

    The top layouts by prediction, and the best of every other family (ZeRO-3, pipeline, TP-heavy,
    data parallel), run as one job array of short runs of the bundled entrypoint on synthetic
    tokens. Once they end (--wait, or later --collect), predicted and measured step time and
    memory are compared, the profile is calibrated from them (PROFILES/<cluster>-measured.yaml,
    extending the original) and the spec re-planned with it into PLANS_DIR, with the trials as
    evidence in plan.yaml. A trial that runs out of memory, hangs or fails is reported as such.
    """
    from orchestrator.cli.console import (
        trial_cost_text,
        trial_proposal_table,
        trial_state_table,
    )
    from orchestrator.run import trial as trials

    ds_env()
    if show_status and collect:
        raise UserError("--status shows the trials and --collect finishes them; pass one of them.")
    if name is not None:
        trials.check_profile_name(name)  # before anything is submitted
    project = cwd_project()
    pdir = resolve_profiles_dir(project, profiles_dir)
    reg = open_registry()
    con = make_console()
    if show_status or collect:
        for flag, given in (("--cluster", cluster), ("--out", out), ("--nodes", nodes), ("--dry-run", dry_run)):
            if given:
                raise UserError(f"{flag} belongs to starting trials; --status/--collect take only the trial directory.")
        manifest = trials.load_manifest(target)
        if show_status:
            records = trials.states(reg, manifest)
            con.print(trial_state_table(manifest, records))
            if not any(r.active for r in records):
                click.echo(
                    f"all {len(records)} trials ended; finish with: dsorch trial --collect {display_path(target)}"
                )
            return
        _finish_trials(project, reg, target, manifest, pdir, name, wait)
        return
    from orchestrator.run.remote import not_over_ssh_yet
    from orchestrator.runtimes import DEEPSPEED
    from orchestrator.spec.model import load_spec

    spec_file, loaded_spec = load_spec(target)
    lp = load_cluster(project, project.cluster(cluster), pdir)
    not_over_ssh_yet(lp.profile.name, lp.profile.login, "trial")
    proposal = trials.propose(spec_file, lp, top, steps, nodes, gpus_per_node)
    if out is None:
        out = (
            project.root
            / "trials"
            / project.default_plan_dir(spec_file.name, lp.profile.name, DEEPSPEED, nodes, gpus_per_node).name
        )
    check_out_path(out, "--out")
    con.print(f"trials of {spec_file.name} on {lp.profile.name} ({proposal.world_size} GPUs), {steps} steps each:")
    con.print(trial_proposal_table(proposal))
    click.echo(trial_cost_text(proposal, steps))
    if dry_run:
        return
    manifest = trials.start(
        project, target, spec_file, loaded_spec.sha256, lp, proposal, out, steps, top, nodes, gpus_per_node, pdir
    )
    ids = ", ".join(t.job_id for t in manifest.trials)
    click.echo(
        f"submitted {len(manifest.trials)} trials as one job array ({manifest.executor}): {ids}; "
        f"trial directory {display_path(out)}"
    )
    if not wait:
        click.echo(
            f"  progress: dsorch trial --status {display_path(out)}    "
            f"when done: dsorch trial --collect {display_path(out)}"
        )
        return
    _finish_trials(project, reg, out, manifest, pdir, name, wait=True)


def _finish_trials(project, reg, trial_dir: Path, manifest, profiles_dir, name, wait: bool) -> None:
    from orchestrator.cli.console import trial_results_table, trial_summary
    from orchestrator.run import trial as trials

    records = _wait_trials(reg, manifest) if wait else trials.states(reg, manifest)
    active = [r for r in records if r.active]
    if active:
        raise UserError(
            f"{len(active)} of {len(records)} trials in {display_path(trial_dir)} are still queued or running "
            f"({', '.join(r.job_id for r in active)}); pass --wait, or see `dsorch trial --status "
            f"{display_path(trial_dir)}`."
        )
    results = trials.results_of(Path(trial_dir), manifest, records)
    con = make_console()
    con.print(trial_results_table(results))
    collected = trials.collect(project, Path(trial_dir), results, manifest, profiles_dir, name)
    click.echo(trial_summary(collected, display_path))


def _wait_trials(reg, manifest):
    """Poll until every trial ended; progress on stderr (``status_line``)."""
    from orchestrator.run import trial as trials

    def line(records) -> str:
        running = sum(r.state == "RUNNING" for r in records)
        done = [r for r in records if not r.active]
        failed = sum(r.state != "COMPLETED" for r in done)
        now = next(
            (
                f"; {t.dir} at step {r.last_step or 0}/{manifest.steps}"
                for t, r in zip(manifest.trials, records, strict=True)  # one row per trial, in order
                if r.state == "RUNNING"
            ),
            "",
        )
        return (
            f"trials: {len(records) - running - len(done)} queued, {running} running, {len(done)} done"
            + (f" ({failed} failed)" if failed else "")
            + now
        )

    with status_line("trials: submitted") as show:
        for records in poll(lambda: trials.states(reg, manifest), every_s=2):
            show(line(records))
            if not any(r.active for r in records):
                return records
