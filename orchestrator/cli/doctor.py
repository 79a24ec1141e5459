"""`dsorch doctor`: measure the cluster against its profile."""

from __future__ import annotations

import sys

import click

from orchestrator.cli.common import (
    cluster_option,
    cwd_project,
    display_path,
    load_cluster,
    make_console,
    poll,
    profiles_dir_option,
    resolve_profiles_dir,
    status_line,
)


@click.command(
    epilog="""\b
Examples:
  dsorch doctor --cluster dgx16 --nodes 2          # two nodes are enough to see the fabric
  dsorch doctor --cluster dgx16 --nodes 2 --write  # store the figures in profiles/dgx16-doctor.yaml
"""
)
@cluster_option(
    "Cluster profile; default $DSORCH_CLUSTER, then cluster in dsorch.yaml.",
)
@click.option(
    "--nodes",
    type=click.IntRange(1, 1_000_000),
    default=None,
    help="Nodes to check (default the profile's); two show the inter-node fabric.",
)
@click.option(
    "--max-size",
    type=click.IntRange(1, 16384),
    default=None,
    metavar="MIB",
    help="Largest message in MiB (default 256 on GPUs, 16 on CPU ranks).",
)
@click.option(
    "--iters",
    type=click.IntRange(1, 10_000),
    default=None,
    help="Timed repetitions per size (default 20 on GPUs, 5 on CPU ranks).",
)
@click.option(
    "--timeout",
    type=click.IntRange(1, 100_000),
    default=20,
    show_default=True,
    metavar="MIN",
    help="Time limit of the job, queueing included; the job is cancelled past it.",
)
@click.option(
    "--write",
    is_flag=True,
    help="Store the measured bandwidths and latencies in PROFILES/<cluster>-doctor.yaml (extends the profile).",
)
@click.option("--name", default=None, help="Name of the written profile (default <cluster>-doctor).")
@profiles_dir_option
def doctor(cluster, nodes, max_size, iters, timeout, write, name, profiles_dir):
    """Check that every rank reaches every other and measure all-reduce / all-gather bus bandwidth
    inside and across nodes (nccl-tests style), against the profile's figures. Submits one short
    job (SLURM, or this machine with a local profile) and waits for it."""
    from orchestrator.cli.console import doctor_report
    from orchestrator.run.doctor import (
        check_state,
        checks_result,
        expected,
        healthy,
        submit_checks,
        write_measured_profile,
    )
    from orchestrator.run.remote import not_over_ssh_yet

    project = cwd_project()
    pdir = resolve_profiles_dir(project, profiles_dir)
    lp = load_cluster(project, project.cluster(cluster), pdir)
    not_over_ssh_yet(lp.profile.name, lp.profile.login, "doctor")
    sub = submit_checks(project.root, lp.profile, nodes=nodes, max_size_mib=max_size, iters=iters, timeout_min=timeout)
    profile = sub.profile
    click.echo(
        f"submitted doctor job {sub.job_id} ({profile.world_size} ranks on {profile.nodes} node(s) of "
        f"{profile.name}); files in {display_path(sub.folder)}",
        err=True,
    )
    state = None

    def read_state():
        nonlocal state
        state = check_state(sub, state)
        return state

    with status_line(f"doctor job {sub.job_id}: PENDING") as show:
        for now in poll(read_state, every_s=1):
            show(f"doctor job {sub.job_id}: {now.state}")
            if not now.waiting:
                break
    data = checks_result(sub, now, display_path(sub.folder))
    make_console().print(doctor_report(data, profile, expected(profile)))
    if write:
        path = write_measured_profile(project, pdir, lp.profile, data, sub.job_id, name)
        click.echo(f"wrote {display_path(path)}: plan with --cluster {path.stem}")
    if not healthy(data):
        sys.exit(1)
